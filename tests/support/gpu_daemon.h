/* Helpers for the tests of the daemon on its CUDA backend (test_gpu_daemon, test_gpu_multi):
 * starting it, reading a device's description, and a saxpy checked against the computation
 * done in the test. Built on daemon_harness; Check assertions fail the calling test. */
#pragma once

#include <jansson.h>

#include "support/daemon_harness.h"

/* gpujobd on the CUDA backend with config_ini; the test is skipped without a GPU. */
e2e_daemon_t *gpu_daemon_start(const char *config_ini);
/* The device of that index as /v1/info describes it (a new reference); fails the test when the
 * daemon does not list it. */
json_t *gpu_daemon_device(e2e_daemon_t *d, int index);
/* Polls the device until its integer field key equals want; fails the test after timeout_s. */
void gpu_daemon_wait_device(e2e_daemon_t *d, int index, const char *key, long want,
                            double timeout_s);
/* An f32 tensor of n values as JSON with base64 data (a new reference). */
json_t *gpu_tensor_b64(const float *v, int n);
/* Runs a saxpy on 4096 fresh random elements (pinned to device unless it is negative), checks
 * the result against the computation here, and returns the device that ran it. */
int gpu_daemon_check_saxpy(e2e_daemon_t *d, unsigned *seed, int device);
/* A long job (debug_sleep of ms) pinned to sleeper_device, submitted and seen running, then a
 * debug_fault pinned to fault_device: its illegal address loses the device's context under
 * the long job. Returns both job ids (malloc'd). */
void gpu_daemon_fault_beside_sleeper(e2e_daemon_t *d, int ms, int sleeper_device, int fault_device,
                                     char **ret_sleeper, char **ret_faulty);
