/* The isolation check that tests/e2e/test_e2e_isolation.c (CPU backend) and
 * tests/gpu/test_gpu_isolation.c (CUDA backend) share: no job's output carries bytes that an
 * earlier job of another user left in memory the daemon reuses (host buffers, the device's
 * memory pool, pinned staging, resident buffers).
 *
 * Phase 1, as one user (the test's uid, over the daemon's Unix socket, through libgpujob):
 * jobs whose inputs and outputs are large and full of the marker byte ISO_MARKER_BYTE (add,
 * sort, gemm, conv2d, quantize of marker tensors, and a resident marker buffer) run to their
 * end; the buffer is then deleted, so that all of it goes back to the allocators.
 * Phase 2, as another user ("local", over TCP): every op on degenerate and partial shapes
 * (gemm with k = 0, with and without c; zero-size dims; conv2d with padding larger than the
 * input and with no input channels; sort with values and argsort over rows of many lengths;
 * quantize with empty channels; sum and dot of empty tensors; batches whose members differ in
 * size), submitted in one request so that compatible jobs run batched. Each output must have
 * its expected dtype and shape, no element whose bytes are all the marker, and every value
 * equal to the one computed in the test.
 *
 * Check assertions fail the calling test. */
#pragma once

#include <stddef.h>

#include "support/daemon_harness.h"

/* 0xA5 in every byte: an i32 of -1515870811, an f32 of about -2.87e-16, an i8 of -91. No
 * phase-2 case expects an element made of it (the helper checks its own expectations). */
#define ISO_MARKER_BYTE 0xA5

/* Where the daemon of the check listens besides TCP: a Unix socket in a temporary directory. */
typedef struct iso_env {
    char dir[64];
    char socket_url[128]; /* "unix:DIR/gpujobd.sock", for libgpujob */
    char config[1024];    /* the daemon's INI: the socket, auth mode none, extra_ini */
} iso_env_t;

/* Creates the directory and the configuration; extra_ini (may be "") is appended. */
void iso_env_init(iso_env_t *env, const char *extra_ini);
/* Removes the directory (after the daemon has stopped). */
void iso_env_done(iso_env_t *env);

/* Runs phase 1 over env's socket and phase 2 over d's TCP address, and checks every output. */
void iso_check_daemon(e2e_daemon_t *d, const iso_env_t *env);
