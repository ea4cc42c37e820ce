# Sourced by the bench scripts: start_cpu_daemon NAME [gpujobd options...] starts a fresh gpujobd
# on the CPU backend ($gpujobd) on a free port with a temporary state directory, and sets dir,
# pid and url; the daemon and the directory go when the script exits.
start_cpu_daemon() {
  local name=$1
  shift
  dir=$(mktemp -d "/tmp/gpujobd-$name-XXXXXX")
  "$gpujobd" --listen 127.0.0.1:0 --state-dir "$dir/state" --backend cpu "$@" 2>"$dir/log" &
  pid=$!
  trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
  url=
  for _ in $(seq 100); do
    url=$(grep -o "http://127.0.0.1:[0-9]*" "$dir/log" | head -1 || true)
    [ -n "$url" ] && return 0
    sleep 0.1
  done
  echo "gpujobd did not start: $(tail -3 "$dir/log")" >&2
  exit 1
}
