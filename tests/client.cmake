# libgpujob and the gpujob CLI: offline unit tests, the library against the real daemon (TCP
# and Unix socket), the CLI end to end, the same library test under valgrind, and an install
# test that builds the example against the installed library through pkg-config.
gj_test(test_client_npy SOURCES test_client_npy.c LIBS gpujob_static gpujob_kernels
        PkgConfig::JANSSON PkgConfig::CURL)
target_compile_definitions(test_client_npy PRIVATE _GNU_SOURCE)
target_include_directories(test_client_npy PRIVATE ${PROJECT_SOURCE_DIR})

# The e2e harness (tests/support/daemon_harness.c) is compiled into each test that uses it.
foreach(t test_client test_client_cli)
  gj_test(${t} SOURCES ${t}.c support/daemon_harness.c
          LIBS gpujob_static PkgConfig::CURL PkgConfig::JANSSON Threads::Threads m)
  target_include_directories(${t} PRIVATE ${PROJECT_SOURCE_DIR})
  add_dependencies(${t} gpujobd gpujob_cli)
  set_property(TEST ${t} APPEND PROPERTY ENVIRONMENT "GPUJOB_CLI=$<TARGET_FILE:gpujob_cli>")
endforeach()

# The library test again under valgrind: no leaks, no invalid accesses. CK_FORK=no runs every
# test in the one valgrind'd process; the daemon it starts is not traced.
find_program(VALGRIND valgrind)
if(VALGRIND)
  add_test(NAME test_client_valgrind
           COMMAND ${VALGRIND} --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite,possible
                   --show-leak-kinds=definite,possible --track-fds=no --quiet $<TARGET_FILE:test_client>)
  set_tests_properties(test_client_valgrind PROPERTIES
    TIMEOUT 900
    SKIP_RETURN_CODE 77
    ENVIRONMENT "CK_FORK=no;GJC_TEST_QUICK=1;GPUJOBD_BIN=$<TARGET_FILE:gpujobd>;GPUJOB_CLI=$<TARGET_FILE:gpujob_cli>")
endif()

# Installs the client component into a scratch prefix and builds examples/saxpy.c against it
# with the installed gpujob.pc, shared and static, then runs both against no daemon: they must
# start (libraries found) and fail cleanly with the library's connection error.
set(GJC_INSTALL_SCRIPT [=[
set -eu
prefix=$(mktemp -d /tmp/gjc-install-XXXXXX)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$1" --component gpujob_client --prefix "$prefix" >/dev/null
test -f "$prefix/include/gpujob.h"
test -f "$prefix/share/man/man1/gpujob.1"
test -x "$prefix/bin/gpujob"
pc=$(dirname "$(find "$prefix" -name gpujob.pc)")
export PKG_CONFIG_PATH="$pc"
cp "$2/client/examples/saxpy.c" "$2/client/examples/Makefile" "$prefix/"
make -s -C "$prefix" CC="$3" saxpy
mv "$prefix/saxpy" "$prefix/saxpy-shared"
make -s -C "$prefix" CC="$3" STATIC=1 saxpy
libdir=$(cd "$(pkg-config --variable=libdir gpujob)" && pwd -P)
for exe in saxpy-shared saxpy; do
  set +e
  LD_LIBRARY_PATH="$libdir" "$prefix/$exe" http://127.0.0.1:9 >"$prefix/out" 2>&1
  rc=$?
  set -e
  test "$rc" = 2 || { cat "$prefix/out"; echo "$exe exited $rc, expected 2"; exit 1; }
  grep -q "connect" "$prefix/out" || { cat "$prefix/out"; exit 1; }
done
LD_LIBRARY_PATH="$libdir" ldd "$prefix/saxpy-shared" | grep -q "libgpujob.so.0 => $libdir/"
! ldd "$prefix/saxpy" | grep -q libgpujob.so
echo "installed library, headers, pkg-config file and CLI work"
]=])
add_test(NAME test_client_install
         COMMAND sh -c "${GJC_INSTALL_SCRIPT}" sh ${PROJECT_BINARY_DIR} ${PROJECT_SOURCE_DIR}
                 ${CMAKE_C_COMPILER})
set_tests_properties(test_client_install PROPERTIES TIMEOUT 300)
