/* bench_json_answer: the cost of serialising a job's answer whose f32 output of 1,024 elements
 * is inlined as JSON numbers, two ways: a json_t per element written by jansson's json_dumps
 * (17 significant digits), and the daemon's way, the data written straight from the typed
 * buffer into a raw node (api/tensor_codec.h) and the answer by api/json_write.h (shortest
 * round-trip numbers). Each iteration builds the answer's tree, writes it and frees both, as
 * the daemon does per answer. Prints µs per answer, wall clock and the thread's CPU time (the
 * figure to trust on a shared machine), and the answer's length for each.
 *
 *   bench_json_answer [elements] [iterations]   (defaults 1024 and 20000) */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/json_write.h"
#include "api/tensor_codec.h"

static double now_us(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* The answer of a finished saxpy job, around its output's data node (stolen). */
static json_t *answer(json_t *data, int n)
{
    return json_pack("{s:s, s:s, s:s, s:{s:f}, s:s, s:s, s:s, s:i, s:i, s:f, s:f, s:f, s:f,"
                     " s:n, s:{s:{s:s, s:[i], s:i}, s:{s:s, s:[i], s:i}},"
                     " s:{s:{s:s, s:[i], s:i, s:o}}}",
                     "id", "j00000000000300004f2a9c1d", "op", "saxpy", "state", "succeeded",
                     "params", "a", 1.3, "created_at", "2026-01-02T03:04:05.000006Z", "started_at",
                     "2026-01-02T03:04:05.000106Z", "finished_at", "2026-01-02T03:04:05.000206Z",
                     "attempts", 1, "device", 0, "queue_ms", 0.1, "run_ms", 0.1, "gpu_ms", 0.014,
                     "batch_gpu_ms", 0.014, "error", "inputs", "x", "dtype", "f32", "shape", n,
                     "bytes", 4 * n, "y", "dtype", "f32", "shape", n, "bytes", 4 * n, "outputs",
                     "out", "dtype", "f32", "shape", n, "bytes", 4 * n, "data", data);
}

/* jansson's way: a json_t per element, json_dumps. */
static size_t one_jansson(const float *out, int n)
{
    json_t *data = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(data, json_real(out[i]));
    json_t *a = answer(data, n);
    char *text = json_dumps(a, JSON_COMPACT);
    size_t len = strlen(text);
    free(text);
    json_decref(a);
    return len;
}

/* The daemon's way: the data as a raw node, json_write. */
static size_t one_writer(const float *out, int n)
{
    tensor_desc_t d = {.dtype = DTYPE_F32, .ndim = 1, .shape = {n}};
    json_t *a = answer(codec_data_to_json(&d, out), n);
    char *text;
    size_t len;
    if (json_write(a, &text, &len) < 0) abort();
    free(text);
    json_decref(a);
    return len;
}

static void run(const char *name, size_t (*one)(const float *, int), const float *out, int n,
                int iters)
{
    size_t len = 0;
    for (int i = 0; i < iters / 10 + 1; i++) /* warm-up */
        len = one(out, n);
    double t0 = now_us(CLOCK_MONOTONIC), c0 = now_us(CLOCK_THREAD_CPUTIME_ID);
    for (int i = 0; i < iters; i++)
        len = one(out, n);
    double us = (now_us(CLOCK_MONOTONIC) - t0) / iters;
    double cpu_us = (now_us(CLOCK_THREAD_CPUTIME_ID) - c0) / iters;
    printf("%-34s %8.2f us/answer (%8.2f us CPU)  %7zu bytes\n", name, us, cpu_us, len);
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 1024;
    int iters = argc > 2 ? atoi(argv[2]) : 20000;
    if (n <= 0 || iters <= 0) {
        fprintf(stderr, "usage: %s [elements] [iterations]\n", argv[0]);
        return 2;
    }
    float *out = malloc((size_t)n * sizeof *out);
    /* saxpy outputs of inputs uniform in [-1, 1): f32 values with full mantissas. */
    unsigned seed = 1;
    for (int i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        out[i] = 1.3f * ((float)(seed >> 8) / 8388608.0f - 1.0f) + 0.5f;
    }
    printf("answer with an f32 output of %d elements, %d iterations\n", n, iters);
    run("json_t per element + json_dumps", one_jansson, out, n, iters);
    run("raw data node + json_write", one_writer, out, n, iters);
    free(out);
    return 0;
}
