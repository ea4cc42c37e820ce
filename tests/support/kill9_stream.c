/* A stream of add submissions cut by a kill -9, and the check of what survived it
 * (kill9_stream.h). */
#define _DEFAULT_SOURCE
#include "support/kill9_stream.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

json_t *e2e_add_job_new(int k)
{
    return json_pack("{s:s, s:{s:{s:s, s:[i], s:[i,i]}, s:{s:s, s:[i], s:[i,i]}}}", "op", "add",
                     "inputs", "x", "dtype", "i32", "shape", 2, "data", k, k + 1, "y", "dtype",
                     "i32", "shape", 2, "data", 1, 1);
}

bool e2e_add_result_ok(const json_t *job, int k, char *why, size_t size)
{
    const char *state = e2e_job_state(job);
    double out[2];
    json_t *data = json_object_get(json_object_get(json_object_get(job, "outputs"), "out"), "data");
    if (strcmp(state, "succeeded") != 0)
        snprintf(why, size, "state %s", state);
    else if (e2e_json_flatten(data, out, 2) != 2)
        snprintf(why, size, "succeeded without its output");
    else if (out[0] != k + 1 || out[1] != k + 2)
        snprintf(why, size, "out [%g, %g] for k=%d", out[0], out[1], k);
    else
        return true;
    return false;
}

/* Records resp's job when the daemon acknowledged it (201). */
static void kill9_stream_record(e2e_kill9_stream_t *st, const e2e_response_t *resp, int k)
{
    if (resp->status != 201) return;
    char why[128];
    st->ids[st->n] = strdup(json_string_value(json_object_get(resp->json, "id")));
    st->ks[st->n] = k;
    st->ended[st->n] = e2e_add_result_ok(resp->json, k, why, sizeof why);
    st->n++;
}

static void *kill9_stream_main(void *arg)
{
    e2e_kill9_stream_t *st = arg;
    static const char *const hdrs[] = {"Content-Type: application/json", NULL};
    for (int k = 0; st->refused == 0 && e2e_now() < st->until && st->n < st->cap; k++) {
        json_t *job = e2e_add_job_new(k);
        char *text = json_dumps(job, JSON_COMPACT);
        json_decref(job);
        e2e_response_t resp;
        int r = e2e_http_request(st->d, "POST", st->path, hdrs, text, strlen(text), &resp);
        free(text);
        if (r < 0) {
            st->refused++;
            continue;
        }
        kill9_stream_record(st, &resp, k);
        e2e_response_clear(&resp);
    }
    e2e_http_thread_done();
    return NULL;
}

void e2e_kill9_stream_start_ok(e2e_kill9_stream_t *st, e2e_daemon_t *d, const char *path,
                               double seconds, int cap)
{
    double now = e2e_now();
    *st = (e2e_kill9_stream_t){
        .d = d, .path = path, .started = now, .until = now + seconds, .cap = cap};
    st->ids = calloc((size_t)cap, sizeof *st->ids);
    st->ks = calloc((size_t)cap, sizeof *st->ks);
    st->ended = calloc((size_t)cap, sizeof *st->ended);
    ck_assert(st->ids && st->ks && st->ended);
    ck_assert(pthread_create(&st->thread, NULL, kill9_stream_main, st) == 0);
}

void e2e_kill9_stream_wait_ok(e2e_kill9_stream_t *st, double min_s, int min_acked)
{
    double limit = e2e_now() + 60;
    while ((e2e_now() < st->started + min_s || st->n < min_acked) && e2e_now() < limit)
        usleep(10 * 1000);
    ck_assert_msg(st->n >= min_acked, "only %d submissions to %s acknowledged in a minute",
                  (int)st->n, st->path);
}

void e2e_kill9_stream_kill_ok(e2e_kill9_stream_t *st)
{
    e2e_daemon_kill(st->d);
    pthread_join(st->thread, NULL);
    fprintf(stderr, "kill -9: %d submissions to %s acknowledged, %d refused after the kill\n",
            (int)st->n, st->path, st->refused);
    ck_assert_msg(st->n >= 20, "only %d submissions to %s acknowledged", (int)st->n, st->path);
}

int e2e_kill9_stream_verify_ok(const e2e_kill9_stream_t *st,
                               void (*check)(const json_t *job, void *arg), void *arg)
{
    int ended = 0;
    for (int i = 0; i < st->n; i++) {
        json_t *job = e2e_wait_final_ok(st->d, st->ids[i], 60);
        char why[128];
        ck_assert_msg(e2e_add_result_ok(job, st->ks[i], why, sizeof why), "job %s: %s", st->ids[i],
                      why);
        if (check) check(job, arg);
        ended += st->ended[i];
        json_decref(job);
    }
    return ended;
}

void e2e_kill9_stream_clear(e2e_kill9_stream_t *st)
{
    for (int i = 0; i < st->n; i++)
        free(st->ids[i]);
    free(st->ids);
    free(st->ks);
    free(st->ended);
    *st = (e2e_kill9_stream_t){0};
}
