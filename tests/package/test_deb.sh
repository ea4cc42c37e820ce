#!/usr/bin/env bash
# The Debian packages (packaging/CMakeLists.txt), built by cpack from this build tree and
# checked as an admin would meet them:
#   - each package's file list is exactly the expected one (nothing missing, nothing stray),
#     and `cmake --install --prefix /usr` into a DESTDIR places the same files;
#   - control fields: Depends (from dpkg-shlibdeps, and the declared ones), the conffile, the
#     maintainer scripts;
#   - the packages extracted into a throwaway root: the unit passes `systemd-analyze verify`
#     (ExecStart pointed at the root's binary, man pages looked up in the root), its ExecStart
#     and --config name files of the root, the binaries run, the configuration passes
#     --check-config, and libgpujob-dev builds its example against the root's gpujob.pc;
#   - the maintainer scripts with DPKG_ROOT at the root: postinst creates the user and the state
#     directory (real systemd-sysusers and systemd-tmpfiles when root, stubs otherwise) and
#     enables the unit; the start and stop happen only where systemd runs; purge keeps the
#     state unless GPUJOBD_PURGE_STATE=yes.
# Usage: test_deb.sh BUILD_DIR SOURCE_DIR VERSION CC
# Under pipefail a `grep -q` that stops reading early can fail its pipe's writer (SIGPIPE):
# greps in pipes read everything, into /dev/null.
set -euo pipefail
build=$1 src=$2 version=$3 cc=$4
work=$(mktemp -d /tmp/gj-deb-XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

(cd "$build" && cpack -G DEB -B "$work/pkg" >"$work/cpack.log" 2>&1) ||
    { cat "$work/cpack.log"; fail "cpack"; }
arch=$(dpkg --print-architecture)
daemon_deb="$work/pkg/gpujobd_${version}_${arch}.deb"
client_deb="$work/pkg/gpujob_${version}_${arch}.deb"
dev_deb="$work/pkg/libgpujob-dev_${version}_${arch}.deb"

# Files and links of a package (not directories), one path a line, sorted.
contents() { dpkg-deb -c "$1" | awk '$1 !~ /^d/ {print $6}' | sed 's|^\./|/|' | sort; }
expect_contents() {
    local deb=$1; shift
    printf '%s\n' "$@" | sort >"$work/expected"
    contents "$deb" >"$work/actual"
    diff -u "$work/expected" "$work/actual" || fail "$(basename "$deb"): file list differs"
}
expect_contents "$daemon_deb" /etc/gpujobd/gpujobd.conf /usr/sbin/gpujobd \
    /usr/lib/systemd/system/gpujobd.service /usr/lib/sysusers.d/gpujobd.conf \
    /usr/lib/tmpfiles.d/gpujobd.conf /usr/share/man/man8/gpujobd.8 \
    /usr/share/man/man5/gpujobd.conf.5 \
    /usr/share/gpujobd/openapi.yaml /usr/share/gpujobd/grafana-gpujobd.json \
    /usr/share/gpujobd/prometheus-alerts.yml
expect_contents "$client_deb" /usr/bin/gpujob /usr/lib/libgpujob.so.0 \
    "/usr/lib/libgpujob.so.$version" /usr/share/man/man1/gpujob.1
expect_contents "$dev_deb" /usr/include/gpujob.h /usr/lib/libgpujob.so /usr/lib/libgpujob.a \
    /usr/lib/pkgconfig/gpujob.pc /usr/share/doc/libgpujob-dev/examples/Makefile \
    /usr/share/doc/libgpujob-dev/examples/saxpy.c

# Control fields.
field() { dpkg-deb -f "$1" "$2"; }
for dep in init-system-helpers libc6 libuv1 libmicrohttpd12 libsqlite3-0 libjansson4; do
    field "$daemon_deb" Depends | grep "\b$dep\b" >/dev/null ||
        fail "gpujobd does not depend on $dep"
done
field "$client_deb" Depends | grep '\blibcurl4\b' >/dev/null ||
    fail "gpujob does not depend on libcurl4"
field "$dev_deb" Depends | grep -F "gpujob (= $version)" >/dev/null ||
    fail "libgpujob-dev does not depend on gpujob (= $version)"
test "$(field "$daemon_deb" Version)" = "$version" || fail "gpujobd's version"
test "$(dpkg-deb -I "$daemon_deb" conffiles)" = /etc/gpujobd/gpujobd.conf ||
    fail "gpujobd's conffiles"
dpkg-deb -I "$client_deb" shlibs | grep -F "libgpujob 0 gpujob (= $version)" >/dev/null ||
    fail "gpujob's shlibs"
dpkg-deb -e "$daemon_deb" "$work/control"
for s in postinst prerm postrm; do
    test -x "$work/control/$s" || fail "gpujobd has no executable $s"
done

# The throwaway root.
root="$work/root"
for deb in "$daemon_deb" "$client_deb" "$dev_deb"; do dpkg-deb -x "$deb" "$root"; done
if grep -rlI -e "$build" -e "$src" "$root"; then fail "build or source paths in the files above"; fi
for elf in "$root/usr/sbin/gpujobd" "$root/usr/bin/gpujob" "$root/usr/lib/libgpujob.so.$version"; do
    ! readelf -d "$elf" | grep 'RPATH\|RUNPATH' >/dev/null || fail "$elf has a run path"
done
unit="$root/usr/lib/systemd/system/gpujobd.service"
exec_start=$(sed -n 's/^ExecStart=//p' "$unit")
test "${exec_start%% *}" = /usr/sbin/gpujobd || fail "ExecStart runs ${exec_start%% *}"
conf=$(echo "$exec_start" | sed -n 's/.*--config \([^ ]*\).*/\1/p')
test -f "$root$conf" || fail "ExecStart's --config $conf is not in the package"
grep -qx 'User=gpujobd' "$unit" || fail "the unit does not run as gpujobd"
grep -q '^u gpujobd ' "$root/usr/lib/sysusers.d/gpujobd.conf" || fail "sysusers.d has no gpujobd"
# systemd-analyze verify checks that each command exists: the copy runs the root's binary.
mkdir "$work/verify"
sed "s|^ExecStart=/usr/sbin/|ExecStart=$root/usr/sbin/|" "$unit" >"$work/verify/gpujobd.service"
MANPATH="$root/usr/share/man" systemd-analyze verify "$work/verify/gpujobd.service" ||
    fail "systemd-analyze verify"

test "$("$root/usr/sbin/gpujobd" --version)" = "gpujobd $version" || fail "gpujobd --version"
"$root/usr/sbin/gpujobd" --config "$root$conf" --check-config >/dev/null ||
    fail "the packaged configuration fails --check-config"
test "$("$root/usr/bin/gpujob" --version)" = "gpujob $version" || fail "gpujob --version"
cp "$root/usr/share/doc/libgpujob-dev/examples/"* "$work/"
PKG_CONFIG_PATH="$root/usr/lib/pkgconfig" make -s -C "$work" CC="$cc" saxpy
LD_LIBRARY_PATH="$root/usr/lib" ldd "$work/saxpy" |
    grep "libgpujob.so.0 => $root/usr/lib/" >/dev/null ||
    fail "the example does not load the root's libgpujob"

# The maintainer scripts, with DPKG_ROOT at the root. deb-systemd-helper, deb-systemd-invoke
# and systemctl are stubs that log their arguments (the real ones change the host); so are
# systemd-sysusers and systemd-tmpfiles when not root (they must chown).
mkdir "$work/bin"
stubs="deb-systemd-helper deb-systemd-invoke systemctl"
[ "$(id -u)" -eq 0 ] || stubs="$stubs systemd-sysusers systemd-tmpfiles"
for s in $stubs; do
    printf '#!/bin/sh\necho "%s $*" >>"%s"\n' "$s" "$work/calls" >"$work/bin/$s"
    chmod +x "$work/bin/$s"
done
run_script() { env PATH="$work/bin:$PATH" DPKG_ROOT="$root" "$work/control/$1" "${@:2}"; }
: >"$work/calls"
run_script postinst configure
grep -qx 'deb-systemd-helper enable gpujobd.service' "$work/calls" || fail "postinst: no enable"
if [ "$(id -u)" -eq 0 ]; then
    grep -q '^gpujobd:x:[0-9]*:[0-9]*:.*:/var/lib/gpujobd:/usr/sbin/nologin$' "$root/etc/passwd" ||
        fail "postinst: no gpujobd user in the root"
    uid=$(awk -F: '$1 == "gpujobd" {print $3}' "$root/etc/passwd")
    test "$(stat -c '%a %u' "$root/var/lib/gpujobd")" = "750 $uid" ||
        fail "postinst: the state directory is not gpujobd's, mode 750"
else
    echo "not root: systemd-sysusers and systemd-tmpfiles are stubs"
    grep -qx "systemd-sysusers --root=$root gpujobd.conf" "$work/calls" || fail "postinst: sysusers"
    grep -qx "systemd-tmpfiles --root=$root --create gpujobd.conf" "$work/calls" ||
        fail "postinst: tmpfiles"
    mkdir -p "$root/var/lib/gpujobd"
fi
run_script prerm remove
if [ -d /run/systemd/system ]; then
    grep -qx 'deb-systemd-invoke start gpujobd.service' "$work/calls" || fail "postinst: no start"
    grep -qx 'deb-systemd-invoke stop gpujobd.service' "$work/calls" || fail "prerm: no stop"
else
    ! grep -q deb-systemd-invoke "$work/calls" || fail "started or stopped without systemd"
fi
run_script postrm remove
grep -qx 'deb-systemd-helper mask gpujobd.service' "$work/calls" || fail "postrm remove: no mask"
touch "$root/var/lib/gpujobd/gpujobd.db"
run_script postrm purge 2>"$work/purge.err"
test -f "$root/var/lib/gpujobd/gpujobd.db" || fail "purge removed the state unasked"
grep -q GPUJOBD_PURGE_STATE "$work/purge.err" || fail "purge did not say how to remove the state"
GPUJOBD_PURGE_STATE=yes run_script postrm purge
test ! -e "$root/var/lib/gpujobd" || fail "purge with GPUJOBD_PURGE_STATE=yes kept the state"

# cmake --install places the same files as the three packages.
for c in gpujobd gpujob_client gpujob_dev; do
    DESTDIR="$work/destdir" cmake --install "$build" --component "$c" --prefix /usr >/dev/null
done
(cd "$work/destdir" && find . ! -type d | sed 's|^\./|/|' | sort) >"$work/installed"
for deb in "$daemon_deb" "$client_deb" "$dev_deb"; do contents "$deb"; done | sort >"$work/packaged"
diff -u "$work/packaged" "$work/installed" || fail "cmake --install and the packages differ"
cmp "$work/destdir/usr/lib/systemd/system/gpujobd.service" "$unit" ||
    fail "cmake --install wrote another unit"
echo "packages: file lists, control fields, unit, binaries, maintainer scripts and install agree"
