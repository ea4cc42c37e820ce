# The commit syncer: the thread that makes relaxed commits durable.
gj_test(test_commit_sync SOURCES test_commit_sync.c LIBS gpujobd_core)
