# The scheduler with a real store and a fake executor driven by the test.
gj_test(test_sched SOURCES test_sched.c LIBS gpujobd_core)
