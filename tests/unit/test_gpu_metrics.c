/* The GPU gauges (daemon/gpu_metrics.c) without a GPU: the sampler with a fake memory fallback,
 * the Prometheus rendering, a prompt stop, and backend_gpu_metrics_start on a fake executor.
 *
 * The devices have UUIDs that no GPU has, so NVML, where it is installed, finds none of them:
 * every reading then comes from the fallback, on any machine. */
#include <check.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "daemon/exec/executor.h"

#define GIB (UINT64_C(1) << 30)

static const gpu_metrics_device_t fake_devices[] = {
    {.index = 3, .uuid = "GPU-00000000-fake-0000-0000-000000000003"},
    {.index = 7, .uuid = "GPU-00000000-fake-0000-0000-000000000007"},
};

typedef struct fallback_log {
    atomic_int calls;
    atomic_int last_index;
    int err; /* what the fallback returns; 0 for the readings below */
} fallback_log_t;

/* Device d has 2d GiB in all, d GiB of it free. */
static int fake_fallback(int index, uint64_t *ret_free, uint64_t *ret_total, void *ud)
{
    fallback_log_t *log = ud;
    atomic_fetch_add(&log->calls, 1);
    atomic_store(&log->last_index, index);
    if (log->err) return log->err;
    *ret_free = (uint64_t)index * GIB;
    *ret_total = 2 * (uint64_t)index * GIB;
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Waits up to 5 s for the first sample; returns the number of devices it holds. */
static int wait_for_sample(gpu_metrics_t *m, gpu_sample_t *out, int max)
{
    for (double end = now_s() + 5; now_s() < end; usleep(2000)) {
        int n = gpu_metrics_snapshot(m, out, max);
        if (n > 0) return n;
    }
    return 0;
}

START_TEST(test_devices_nvml_lacks_get_memory_from_the_fallback_and_nothing_else)
{
    fallback_log_t log = {0};
    gpu_metrics_t *m = NULL;
    ck_assert_int_eq(gpu_metrics_start(fake_devices, 2, 100, fake_fallback, &log, &m), 0);
    ck_assert_int_eq(gpu_metrics_device_count(m), 2);
    gpu_sample_t s[4];
    ck_assert_int_eq(wait_for_sample(m, s, 4), 2);
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(s[i].index, fake_devices[i].index);
        ck_assert_str_eq(s[i].uuid, fake_devices[i].uuid);
        ck_assert_str_eq(s[i].source, "cuda");
        ck_assert_uint_eq(s[i].valid, GPU_SAMPLE_MEMORY);
        ck_assert_uint_eq(s[i].memory_total, 2 * (uint64_t)s[i].index * GIB);
        ck_assert_uint_eq(s[i].memory_used, (uint64_t)s[i].index * GIB);
    }
    /* It keeps sampling every interval. */
    int calls = atomic_load(&log.calls);
    for (double end = now_s() + 5; atomic_load(&log.calls) < calls + 2 && now_s() < end;)
        usleep(10000);
    ck_assert_int_ge(atomic_load(&log.calls), calls + 2);
    gpu_metrics_stop(m);
}
END_TEST

START_TEST(test_rendering_has_the_memory_gauges_with_labels_and_no_missing_gauge)
{
    fallback_log_t log = {0};
    gpu_metrics_t *m = NULL;
    ck_assert_int_eq(gpu_metrics_start(fake_devices, 2, 100, fake_fallback, &log, &m), 0);
    gpu_sample_t s[2];
    int n = wait_for_sample(m, s, 2);
    ck_assert_int_eq(n, 2);
    gpu_metrics_stop(m);
    char *text = gpu_metrics_format_prometheus(s, n);
    ck_assert_ptr_nonnull(text);
    ck_assert_ptr_nonnull(
        strstr(text, "# HELP gpujobd_gpu_memory_used_bytes Device memory not free, by any process, "
                     "the driver's reserve included.\n"
                     "# TYPE gpujobd_gpu_memory_used_bytes gauge\n"
                     "gpujobd_gpu_memory_used_bytes{device=\"3\",uuid=\"GPU-00000000-fake-0000-"
                     "0000-000000000003\"} 3221225472\n"
                     "gpujobd_gpu_memory_used_bytes{device=\"7\",uuid=\"GPU-00000000-fake-0000-"
                     "0000-000000000007\"} 7516192768\n"));
    ck_assert_ptr_nonnull(strstr(text, "# TYPE gpujobd_gpu_memory_total_bytes gauge\n"
                                       "gpujobd_gpu_memory_total_bytes{device=\"3\",uuid=\"GPU-"
                                       "00000000-fake-0000-0000-000000000003\"} 6442450944\n"));
    ck_assert_ptr_nonnull(strstr(text, "gpujobd_gpu_memory_total_bytes{device=\"7\",uuid=\"GPU-"
                                       "00000000-fake-0000-0000-000000000007\"} 15032385536\n"));
    /* The header of each gauge comes once. */
    const char *first = strstr(text, "# TYPE gpujobd_gpu_memory_total_bytes");
    ck_assert_ptr_null(strstr(first + 1, "# TYPE gpujobd_gpu_memory_total_bytes"));
    ck_assert_ptr_null(strstr(text, "temperature"));
    ck_assert_ptr_null(strstr(text, "gpujobd_gpu_power_watts"));
    ck_assert_ptr_null(strstr(text, "gpujobd_gpu_utilization_ratio"));
    free(text);
}
END_TEST

START_TEST(test_rendering_of_nvml_readings_and_escaped_labels)
{
    gpu_sample_t s[2] = {
        {.index = 0,
         .uuid = "GPU-1",
         .source = "nvml",
         .valid =
             GPU_SAMPLE_UTILIZATION | GPU_SAMPLE_MEMORY | GPU_SAMPLE_TEMPERATURE | GPU_SAMPLE_POWER,
         .utilization_pct = 37,
         .memory_used = 1024,
         .memory_total = 4096,
         .temperature_c = 41,
         .power_w = 123.456},
        {.index = 1,
         .uuid = "odd\"one\\",
         .source = "none",
         .valid = GPU_SAMPLE_POWER,
         .power_w = 70},
    };
    char *text = gpu_metrics_format_prometheus(s, 2);
    ck_assert_ptr_nonnull(text);
    ck_assert_ptr_nonnull(strstr(text, "# TYPE gpujobd_gpu_utilization_ratio gauge\n"
                                       "gpujobd_gpu_utilization_ratio{device=\"0\",uuid=\"GPU-1\"} "
                                       "0.37\n# HELP gpujobd_gpu_memory_used_bytes"));
    ck_assert_ptr_nonnull(
        strstr(text, "gpujobd_gpu_memory_used_bytes{device=\"0\",uuid=\"GPU-1\"} 1024\n"));
    ck_assert_ptr_nonnull(
        strstr(text, "gpujobd_gpu_memory_total_bytes{device=\"0\",uuid=\"GPU-1\"} 4096\n"));
    ck_assert_ptr_nonnull(
        strstr(text, "# TYPE gpujobd_gpu_temperature_celsius gauge\n"
                     "gpujobd_gpu_temperature_celsius{device=\"0\",uuid=\"GPU-1\"} 41\n"));
    ck_assert_ptr_nonnull(strstr(text,
                                 "# TYPE gpujobd_gpu_power_watts gauge\n"
                                 "gpujobd_gpu_power_watts{device=\"0\",uuid=\"GPU-1\"} "
                                 "123.456\n"
                                 "gpujobd_gpu_power_watts{device=\"1\",uuid=\"odd\\\"one\\\\\"}"
                                 " 70.000\n"));
    /* Device 1 has only its power. */
    const char *one = strstr(text, "{device=\"1\"");
    ck_assert_ptr_nonnull(one);
    ck_assert_ptr_null(strstr(one + 1, "{device=\"1\""));
    free(text);

    text = gpu_metrics_format_prometheus(s, 0);
    ck_assert_str_eq(text, "");
    free(text);
}
END_TEST

START_TEST(test_a_failing_fallback_leaves_memory_unavailable)
{
    fallback_log_t log = {.err = -EIO};
    gpu_metrics_t *m = NULL;
    ck_assert_int_eq(gpu_metrics_start(fake_devices, 1, 100, fake_fallback, &log, &m), 0);
    gpu_sample_t s[1];
    ck_assert_int_eq(wait_for_sample(m, s, 1), 1);
    gpu_metrics_stop(m);
    ck_assert_uint_eq(s[0].valid, 0);
    ck_assert_str_eq(s[0].source, "none");
    ck_assert_int_eq(atomic_load(&log.last_index), 3);
    char *text = gpu_metrics_format_prometheus(s, 1);
    ck_assert_str_eq(text, "");
    free(text);
}
END_TEST

START_TEST(test_stop_is_prompt_with_a_long_interval)
{
    fallback_log_t log = {0};
    gpu_metrics_t *m = NULL;
    ck_assert_int_eq(gpu_metrics_start(fake_devices, 2, 60000, fake_fallback, &log, &m), 0);
    gpu_sample_t s[2];
    ck_assert_int_eq(wait_for_sample(m, s, 2), 2);
    double start = now_s();
    gpu_metrics_stop(m);
    double took = now_s() - start;
    ck_assert_msg(took < 1.0, "gpu_metrics_stop took %.3f s", took);
    /* A stop before the first sample is as prompt. */
    ck_assert_int_eq(gpu_metrics_start(fake_devices, 2, 60000, fake_fallback, &log, &m), 0);
    start = now_s();
    gpu_metrics_stop(m);
    took = now_s() - start;
    ck_assert_msg(took < 1.0, "gpu_metrics_stop took %.3f s", took);
    gpu_metrics_stop(NULL);
}
END_TEST

START_TEST(test_start_refuses_no_device_and_a_bad_interval)
{
    gpu_metrics_t *m = NULL;
    ck_assert_int_eq(gpu_metrics_start(fake_devices, 0, 100, NULL, NULL, &m), -EINVAL);
    ck_assert_int_eq(gpu_metrics_start(fake_devices, 1, 0, NULL, NULL, &m), -EINVAL);
    ck_assert_ptr_null(m);
    ck_assert_int_eq(gpu_metrics_device_count(NULL), 0);
    gpu_sample_t s[1];
    ck_assert_int_eq(gpu_metrics_snapshot(NULL, s, 1), 0);
}
END_TEST

/* An executor that only describes itself, as the CUDA backend does. */
typedef struct fake_executor {
    executor_t base;
    const char *description;
} fake_executor_t;

static json_t *fake_describe(executor_t *ex)
{
    return json_loads(((fake_executor_t *)ex)->description, 0, NULL);
}

static const executor_ops_t fake_cuda_ops = {.name = "cuda", .describe = fake_describe};
static const executor_ops_t fake_cpu_ops = {.name = "cpu", .describe = fake_describe};

START_TEST(test_backend_samples_the_devices_the_cuda_executor_describes)
{
    fake_executor_t ex = {
        .base.ops = &fake_cuda_ops,
        .description = "{\"name\": \"cuda\", \"devices\": ["
                       "{\"index\": 1, \"uuid\": \"GPU-00000000-fake-0000-0000-000000000001\","
                       " \"memory_free\": 3000, \"memory_total\": 8000},"
                       "{\"index\": 4, \"uuid\": \"GPU-00000000-fake-0000-0000-000000000004\"}]}",
    };
    config_t cfg;
    config_defaults(&cfg);
    cfg.metrics_interval_ms = 100;
    gpu_metrics_t *m = (gpu_metrics_t *)&ex; /* must be overwritten */
    ck_assert_int_eq(backend_gpu_metrics_start(&cfg, &ex.base, &m), 0);
    ck_assert_ptr_nonnull(m);
    gpu_sample_t s[2];
    ck_assert_int_eq(wait_for_sample(m, s, 2), 2);
    ck_assert_int_eq(s[0].index, 1);
    ck_assert_str_eq(s[0].uuid, "GPU-00000000-fake-0000-0000-000000000001");
    ck_assert_int_eq(s[1].index, 4);
    ck_assert_str_eq(s[1].uuid, "GPU-00000000-fake-0000-0000-000000000004");
    /* NVML knows no such UUIDs: memory is what the executor describes, and nothing else is
     * claimed; a device described without memory figures has none. */
    ck_assert_uint_eq(s[0].valid, GPU_SAMPLE_MEMORY);
    ck_assert_uint_eq(s[0].memory_used, 5000);
    ck_assert_uint_eq(s[0].memory_total, 8000);
    ck_assert_uint_eq(s[1].valid, 0);
    gpu_metrics_stop(m);

    /* No gauges with the metrics off or on the CPU backend. */
    m = (gpu_metrics_t *)&ex;
    cfg.metrics_interval_ms = 0;
    ck_assert_int_eq(backend_gpu_metrics_start(&cfg, &ex.base, &m), 0);
    ck_assert_ptr_null(m);
    m = (gpu_metrics_t *)&ex;
    cfg.metrics_interval_ms = 100;
    ex.base.ops = &fake_cpu_ops;
    ck_assert_int_eq(backend_gpu_metrics_start(&cfg, &ex.base, &m), 0);
    ck_assert_ptr_null(m);
}
END_TEST

static Suite *gpu_metrics_suite(void)
{
    Suite *s = suite_create("gpu_metrics");
    TCase *tc = tcase_create("gpu_metrics");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_devices_nvml_lacks_get_memory_from_the_fallback_and_nothing_else);
    tcase_add_test(tc, test_rendering_has_the_memory_gauges_with_labels_and_no_missing_gauge);
    tcase_add_test(tc, test_rendering_of_nvml_readings_and_escaped_labels);
    tcase_add_test(tc, test_a_failing_fallback_leaves_memory_unavailable);
    tcase_add_test(tc, test_stop_is_prompt_with_a_long_interval);
    tcase_add_test(tc, test_start_refuses_no_device_and_a_bad_interval);
    tcase_add_test(tc, test_backend_samples_the_devices_the_cuda_executor_describes);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(gpu_metrics_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
