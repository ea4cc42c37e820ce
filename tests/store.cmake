# The durable store: SQLite schema, transitions, blobs, recovery, readers.
gj_test(test_store SOURCES test_store.c LIBS gpujobd_core)
# The op table refers to each op weakly, and a weak reference does not pull an object out of a
# static library: ask the linker for saxpy's, so that the test of a known op's round trip has one.
target_link_options(test_store PRIVATE -Wl,-u,op_saxpy)
