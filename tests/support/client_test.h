/* What the suites of libgpujob against the real daemon (tests/e2e/test_client_*.c) share: the
 * one daemon a suite starts, clients of it, and the specs and jobs the tests submit.
 *
 * Every helper but client_test_main asserts with Check, so it may be called only from inside a
 * START_TEST body. */
#pragma once

#include <check.h>
#include <stdbool.h>
#include <stdint.h>

#include "client/gpujob.h"
#include "support/daemon_harness.h"

/* The suite's daemon (CPU backend whatever $GPUJOB_E2E_BACKEND says, one CPU worker so that a
 * long job holds the queue, tensors up to 4 MiB), the directory of its Unix socket and the
 * socket's address ("unix:/tmp/.../gpujobd.sock"). Tests count only jobs they made. */
extern e2e_daemon_t *client_test_daemon;
extern char client_test_socket_dir[64];
extern char client_test_socket_url[128];
/* Set by $GJC_TEST_QUICK (the valgrind runs): the heaviest loops are shorter. */
extern bool client_test_quick;

/* Starts the daemon, runs every test of s (which it frees), stops the daemon and removes its
 * socket's directory: the exit status of the test program. */
int client_test_main(Suite *s);

/* A client of address (asserting it is accepted), and one of the daemon over TCP. */
gpujob_client_t *client_test_at(const char *address);
gpujob_client_t *client_test_tcp(void);

/* n floats uniform in [lo, hi) from seed (malloc'd). */
float *client_test_random_floats(size_t n, uint32_t seed, double lo, double hi);

/* A saxpy spec (out = a * x + y) on n floats; x and y are copied into the spec. */
gpujob_spec_t *client_test_saxpy(double a, const float *x, const float *y, int64_t n);

/* Asserts that job succeeded with its output "out" inline, holding a * x + y (n floats) as the
 * daemon's f32 saxpy computes it. */
void client_test_assert_saxpy_out(const gpujob_job_t *job, double a, const float *x, const float *y,
                                  int64_t n);

/* A job that keeps the one CPU worker busy for a second or so (C = 128): conv2d f32,
 * x [1, C, 64, 64], w [C, C, 3, 3], padding 1. Its tensors are uploaded once as buffers (ids in
 * ret_buffers, for the caller to delete), so that submitting it is quick even under valgrind. */
gpujob_spec_t *client_test_long_spec(gpujob_client_t *c, int channels,
                                     gpujob_buffer_t ret_buffers[2]);

/* gpujob_submit and gpujob_wait (120 s) that must succeed. */
gpujob_job_t *client_test_submit_ok(gpujob_client_t *c, const gpujob_spec_t *spec);
gpujob_job_t *client_test_wait_ok(gpujob_client_t *c, const char *id);

/* Every job the daemon lists for c in state (NULL: any), following cursors. */
long client_test_count_jobs(gpujob_client_t *c, const char *state);

/* A listening socket on 127.0.0.1 (never accepted from here) and its port. */
int client_test_silent_listener(int *ret_port);
