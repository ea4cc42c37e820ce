# The durable store: SQLite schema, transitions, blobs, recovery, readers.
gj_test(test_store SOURCES test_store.c LIBS gpujobd_core)
