# The configuration: key table, INI file, command-line flags; one test also runs the real
# gpujobd binary with --check-config.
gj_test(test_config SOURCES test_config.c LIBS gpujobd_core)
