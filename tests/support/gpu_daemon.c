#include "support/gpu_daemon.h"

#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include "support/gpu_support.h"

e2e_daemon_t *gpu_daemon_start(const char *config_ini)
{
    gpu_require_devices(1);
    setenv("GPUJOB_E2E_BACKEND", "cuda", 1);
    return e2e_daemon_start_ok(config_ini);
}

json_t *gpu_daemon_device(e2e_daemon_t *d, int index)
{
    json_t *info = e2e_json_until(d, "GET", "/v1/info", 200, e2e_now() + 30);
    json_t *devices = json_object_get(json_object_get(info, "backend"), "devices");
    json_t *found = NULL;
    for (size_t k = 0; k < json_array_size(devices) && !found; k++)
        if (json_integer_value(json_object_get(json_array_get(devices, k), "index")) == index)
            found = json_incref(json_array_get(devices, k));
    json_decref(info);
    ck_assert_msg(found != NULL, "/v1/info lists no device %d", index);
    return found;
}

void gpu_daemon_wait_device(e2e_daemon_t *d, int index, const char *key, long want,
                            double timeout_s)
{
    double until = e2e_now() + timeout_s;
    long got;
    for (;;) {
        json_t *dev = gpu_daemon_device(d, index);
        got = (long)json_integer_value(json_object_get(dev, key));
        json_decref(dev);
        if (got == want || e2e_now() > until) break;
        usleep(20000);
    }
    ck_assert_msg(got == want, "device %d %s is %ld, want %ld", index, key, got, want);
}

json_t *gpu_tensor_b64(const float *v, int n)
{
    char *b64 = e2e_base64(v, (size_t)n * sizeof *v);
    json_t *t = json_pack("{s:s, s:[i], s:s}", "dtype", "f32", "shape", n, "b64", b64);
    free(b64);
    return t;
}

int gpu_daemon_check_saxpy(e2e_daemon_t *d, unsigned *seed, int device)
{
    enum { N = 4096 };
    float x[N], y[N];
    fill_random(DTYPE_F32, x, N, -1, 1, seed);
    fill_random(DTYPE_F32, y, N, -1, 1, seed);
    json_t *job = json_pack("{s:s, s:{s:f}, s:{s:o, s:o}}", "op", "saxpy", "params", "a", 1.5,
                            "inputs", "x", gpu_tensor_b64(x, N), "y", gpu_tensor_b64(y, N));
    if (device >= 0) json_object_set_new(job, "device", json_integer(device));
    char *id = e2e_submit_ok(d, job);
    json_t *done = e2e_wait_final_ok(d, id, 60);
    ck_assert_str_eq(e2e_job_state(done), "succeeded");
    int ran_on = (int)json_integer_value(json_object_get(done, "run_device"));
    if (device >= 0) ck_assert_int_eq(ran_on, device);
    json_t *data =
        json_object_get(json_object_get(json_object_get(done, "outputs"), "out"), "data");
    ck_assert_int_eq(json_array_size(data), N);
    for (int i = 0; i < N; i++) {
        double want = 1.5f * x[i] + y[i];
        double got = json_number_value(json_array_get(data, i));
        ck_assert_msg(fabs(got - want) <= 1e-6 * (1 + fabs(want)), "saxpy [%d]: %g, want %g", i,
                      got, want);
    }
    json_decref(done);
    json_decref(job);
    free(id);
    return ran_on;
}

void gpu_daemon_fault_beside_sleeper(e2e_daemon_t *d, int ms, int sleeper_device, int fault_device,
                                     char **ret_sleeper, char **ret_faulty)
{
    json_t *long_job = e2e_long_job_new(ms);
    json_object_set_new(long_job, "device", json_integer(sleeper_device));
    *ret_sleeper = e2e_submit_ok(d, long_job);
    e2e_wait_state_ok(d, *ret_sleeper, "running", 30);
    json_t *fault = json_pack("{s:s, s:i, s:{s:{s:s, s:[i], s:[f, f, f, f]}}}", "op", "debug_fault",
                              "device", fault_device, "inputs", "x", "dtype", "f32", "shape", 4,
                              "data", 1.0, 2.0, 3.0, 4.0);
    *ret_faulty = e2e_submit_ok(d, fault);
    json_decref(fault);
    json_decref(long_job);
}
