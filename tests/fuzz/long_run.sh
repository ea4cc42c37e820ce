#!/usr/bin/env bash
# The long fuzz run of bench/README.md: every target of a fuzz build for SECONDS each, JOBS at
# a time, from the seeds in corpus/ into a scratch corpus, continuing past crashes (-fork with
# -ignore_crashes) so that one run lists them all. Prints a Markdown row per target: executions,
# seconds, distinct crashes (reproducers under OUT/<target>/, one line of each below the table).
#
#   tests/fuzz/long_run.sh BUILD_DIR [SECONDS=300] [JOBS=2] [OUT=/tmp/gpujob-fuzz-long]
set -euo pipefail
build=$1 seconds=${2:-300} jobs=${3:-2} out=${4:-/tmp/gpujob-fuzz-long}
seeds=$(cd "$(dirname "$0")" && pwd)/corpus
targets=(job_json api_request npy base64 config op_validate)

run_one() {
  local t=$1 dir=$out/$1
  mkdir -p "$dir/corpus"
  "$build/tests/fuzz/fuzz_$t" -fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -artifact_prefix="$dir/" \
    "$dir/corpus" "$seeds/$t" >"$dir/log" 2>&1 || true
}

rm -rf "$out" && mkdir -p "$out"
for ((i = 0; i < ${#targets[@]}; i += jobs)); do
  for t in "${targets[@]:i:jobs}"; do run_one "$t" & done
  wait
done

echo "| target | executions | seconds | crashes |"
echo "|---|---:|---:|---:|"
for t in "${targets[@]}"; do
  log=$out/$t/log
  execs=$(grep -o '^#[0-9]*' "$log" | tail -1 | tr -d '#')
  crashes=$(find "$out/$t" -maxdepth 1 -name 'crash-*' | wc -l)
  echo "| fuzz_$t | ${execs:-0} | $seconds | $crashes |"
done
echo
for t in "${targets[@]}"; do
  grep -h 'SUMMARY:\|runtime error' "$out/$t/log" 2>/dev/null | sort | uniq -c | sed "s/^/fuzz_$t: /" || true
done
