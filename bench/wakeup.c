/* bench_wakeup: the wake-up floor of a waited tiny job. With nothing to compute and no I/O, one
 * token goes round the threads a waited job crosses in the daemon, each asleep until the token
 * reaches it, through the primitive the daemon uses for that hand-off:
 *
 *   cuda chain: HTTP thread -> loop (uv_async_send, the scheduler's inbox) -> device worker
 *               (condition variable, broadcast: cuda_submit) -> stream waiter (condition
 *               variable sharing the worker's mutex, signal: cuda_slot_launch) -> loop
 *               (uv_async_send: the completion) -> HTTP thread (an eventfd that wakes
 *               epoll_wait: libmicrohttpd's MHD_resume_connection);
 *   cpu chain:  HTTP thread -> loop -> CPU worker (condition variable, signal: exec_cpu) ->
 *               loop -> HTTP thread.
 *
 * Between rounds the HTTP thread sleeps --gap-us (default 500, about a one-client round trip)
 * so that every thread falls asleep as a one-client load lets it. Each thread notes the time
 * (CLOCK_MONOTONIC) as it wakes; prints, as Markdown, the p50 and p99 of each hand-off and of
 * the whole round (--json FILE writes them too).
 *
 *   bench_wakeup [--chain cuda|cpu] [--rounds N] [--gap-us N] [--json FILE]
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#define WAKEUP_WARMUP 200
#define WAKEUP_MAX_HOPS 8

/* Who a hand-off wakes, and how. */
typedef enum hop_kind {
    HOP_LOOP,        /* the libuv loop, by uv_async_send */
    HOP_COND_BCAST,  /* a thread on a condition variable, by pthread_cond_broadcast */
    HOP_COND_SIGNAL, /* a thread on a condition variable, by pthread_cond_signal */
    HOP_HTTP,        /* the HTTP thread in epoll_wait, by a write to an eventfd */
} hop_kind_t;

typedef struct hop {
    hop_kind_t kind;
    int sleeper; /* for the condition variable kinds: which sleeper_t of the bench */
    const char *name;
} hop_t;

typedef struct chain {
    const char *name;
    int n_hops; /* the last one always wakes the HTTP thread */
    hop_t hops[WAKEUP_MAX_HOPS];
} chain_t;

static const chain_t wakeup_chains[] = {
    {"cuda",
     5,
     {{HOP_LOOP, 0, "HTTP thread -> loop (uv_async_send)"},
      {HOP_COND_BCAST, 0, "loop -> device worker (condition variable, broadcast)"},
      {HOP_COND_SIGNAL, 1, "device worker -> stream waiter (condition variable, signal)"},
      {HOP_LOOP, 0, "stream waiter -> loop (uv_async_send)"},
      {HOP_HTTP, 0, "loop -> HTTP thread (eventfd, epoll_wait)"}}},
    {"cpu",
     4,
     {{HOP_LOOP, 0, "HTTP thread -> loop (uv_async_send)"},
      {HOP_COND_SIGNAL, 0, "loop -> CPU worker (condition variable, signal)"},
      {HOP_LOOP, 0, "CPU worker -> loop (uv_async_send)"},
      {HOP_HTTP, 0, "loop -> HTTP thread (eventfd, epoll_wait)"}}},
};

/* A thread that sleeps on a condition variable until a hand-off is pending for it. All share
 * the bench's mutex, as the device worker and the stream waiters share the executor's. */
typedef struct sleeper {
    pthread_cond_t cond;
    bool pending;
    pthread_t thread;
    struct wakeup_bench *bench;
} sleeper_t;

typedef struct wakeup_bench {
    const chain_t *chain;
    pthread_mutex_t lock;
    bool quitting; /* under lock */
    sleeper_t sleepers[2];
    uv_loop_t loop;
    uv_async_t wake; /* the loop's one wake-up, as the scheduler has one for its inbox */
    uv_async_t quit;
    pthread_t loop_thread;
    bool loop_running;
    int n_sleepers; /* those started */
    int efd, epfd;
    /* The round in flight: the hop that is next, and the time each thread woke. Only the
     * thread that holds the token writes them; the hand-off publishes them to the next. */
    atomic_int next_hop;
    int64_t stamps[WAKEUP_MAX_HOPS + 1];
} wakeup_bench_t;

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Hands the token to the thread of the next hop, the calling thread's own work being done. */
static void wakeup_forward(wakeup_bench_t *b)
{
    int next = atomic_load(&b->next_hop);
    const hop_t *hop = &b->chain->hops[next];
    switch (hop->kind) {
    case HOP_LOOP:
        uv_async_send(&b->wake);
        break;
    case HOP_COND_BCAST:
    case HOP_COND_SIGNAL: {
        sleeper_t *s = &b->sleepers[hop->sleeper];
        pthread_mutex_lock(&b->lock);
        s->pending = true;
        if (hop->kind == HOP_COND_BCAST)
            pthread_cond_broadcast(&s->cond);
        else
            pthread_cond_signal(&s->cond);
        pthread_mutex_unlock(&b->lock);
        break;
    }
    case HOP_HTTP: {
        uint64_t one = 1;
        if (write(b->efd, &one, sizeof one) < 0) perror("bench_wakeup: eventfd");
        break;
    }
    }
}

/* Notes that the calling thread has just woken for the hop in flight. */
static void wakeup_arrived(wakeup_bench_t *b)
{
    int hop = atomic_load(&b->next_hop);
    b->stamps[hop + 1] = now_ns();
    atomic_store(&b->next_hop, hop + 1);
}

static void *sleeper_main(void *arg)
{
    sleeper_t *s = arg;
    wakeup_bench_t *b = s->bench;
    pthread_mutex_lock(&b->lock);
    for (;;) {
        while (!s->pending && !b->quitting)
            pthread_cond_wait(&s->cond, &b->lock);
        if (b->quitting) break;
        s->pending = false;
        pthread_mutex_unlock(&b->lock);
        wakeup_arrived(b);
        wakeup_forward(b);
        pthread_mutex_lock(&b->lock);
    }
    pthread_mutex_unlock(&b->lock);
    return NULL;
}

static void on_wake(uv_async_t *handle)
{
    wakeup_bench_t *b = handle->data;
    wakeup_arrived(b);
    wakeup_forward(b);
}

static void on_quit(uv_async_t *handle)
{
    wakeup_bench_t *b = handle->data;
    uv_close((uv_handle_t *)&b->wake, NULL);
    uv_close((uv_handle_t *)&b->quit, NULL);
}

static void *loop_main(void *arg)
{
    wakeup_bench_t *b = arg;
    uv_run(&b->loop, UV_RUN_DEFAULT);
    return NULL;
}

/* Starts the loop and the sleepers; 0 or -errno. wakeup_stop() ends what it started, either
 * way. */
static int wakeup_start(wakeup_bench_t *b, const chain_t *chain)
{
    *b = (wakeup_bench_t){.chain = chain, .efd = -1, .epfd = -1};
    pthread_mutex_init(&b->lock, NULL);
    b->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    b->epfd = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN};
    if (b->efd < 0 || b->epfd < 0 || epoll_ctl(b->epfd, EPOLL_CTL_ADD, b->efd, &ev) < 0)
        return -errno;
    int r = uv_loop_init(&b->loop);
    if (r == 0) r = uv_async_init(&b->loop, &b->wake, on_wake);
    if (r == 0) r = uv_async_init(&b->loop, &b->quit, on_quit);
    if (r < 0) return r;
    b->wake.data = b->quit.data = b;
    r = -pthread_create(&b->loop_thread, NULL, loop_main, b);
    b->loop_running = r == 0;
    while (r == 0 && b->n_sleepers < 2) {
        sleeper_t *s = &b->sleepers[b->n_sleepers];
        s->bench = b;
        pthread_cond_init(&s->cond, NULL);
        r = -pthread_create(&s->thread, NULL, sleeper_main, s);
        if (r == 0) b->n_sleepers++;
    }
    return r;
}

static void wakeup_stop(wakeup_bench_t *b)
{
    pthread_mutex_lock(&b->lock);
    b->quitting = true;
    for (int k = 0; k < b->n_sleepers; k++)
        pthread_cond_broadcast(&b->sleepers[k].cond);
    pthread_mutex_unlock(&b->lock);
    for (int k = 0; k < b->n_sleepers; k++)
        pthread_join(b->sleepers[k].thread, NULL);
    if (b->loop_running) {
        uv_async_send(&b->quit);
        pthread_join(b->loop_thread, NULL);
        uv_loop_close(&b->loop);
    }
    if (b->epfd >= 0) close(b->epfd);
    if (b->efd >= 0) close(b->efd);
}

/* One round from the HTTP thread (the caller) and back; the stamps are in b->stamps. */
static int wakeup_round(wakeup_bench_t *b)
{
    atomic_store(&b->next_hop, 0);
    b->stamps[0] = now_ns();
    wakeup_forward(b);
    for (;;) {
        struct epoll_event ev;
        int n = epoll_wait(b->epfd, &ev, 1, 10000);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return n < 0 ? -errno : -ETIMEDOUT;
        uint64_t count;
        if (read(b->efd, &count, sizeof count) < 0) return -errno;
        wakeup_arrived(b);
        return 0;
    }
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The q-quantile (0..1) of n values, in µs; sorts them. */
static double quantile_us(int64_t *v, int n, double q)
{
    qsort(v, (size_t)n, sizeof *v, cmp_i64);
    return (double)v[(int)(q * (n - 1))] / 1e3;
}

typedef struct wakeup_result {
    double p50_us[WAKEUP_MAX_HOPS + 1], p99_us[WAKEUP_MAX_HOPS + 1]; /* each hop, then the round */
} wakeup_result_t;

/* Runs rounds rounds (after a warm-up) with gap_us of sleep before each; 0 or -errno. */
static int wakeup_measure(wakeup_bench_t *b, int rounds, int gap_us, wakeup_result_t *ret_result)
{
    int hops = b->chain->n_hops;
    int64_t *spans = malloc(sizeof *spans * (size_t)rounds * (size_t)(hops + 1));
    if (!spans) return -ENOMEM;
    struct timespec gap = {.tv_sec = gap_us / 1000000, .tv_nsec = gap_us % 1000000 * 1000L};
    int r = 0;
    for (int i = -WAKEUP_WARMUP; r == 0 && i < rounds; i++) {
        if (gap_us > 0) clock_nanosleep(CLOCK_MONOTONIC, 0, &gap, NULL);
        r = wakeup_round(b);
        for (int h = 0; r == 0 && i >= 0 && h < hops; h++)
            spans[(size_t)h * (size_t)rounds + (size_t)i] = b->stamps[h + 1] - b->stamps[h];
        if (r == 0 && i >= 0)
            spans[(size_t)hops * (size_t)rounds + (size_t)i] = b->stamps[hops] - b->stamps[0];
    }
    for (int h = 0; r == 0 && h <= hops; h++) {
        int64_t *v = spans + (size_t)h * (size_t)rounds;
        ret_result->p50_us[h] = quantile_us(v, rounds, 0.50);
        ret_result->p99_us[h] = quantile_us(v, rounds, 0.99);
    }
    free(spans);
    return r;
}

static void print_markdown(const chain_t *c, int rounds, int gap_us, const wakeup_result_t *res)
{
    printf("bench_wakeup: %s chain, %d rounds, %d us asleep before each\n\n", c->name, rounds,
           gap_us);
    printf("| hand-off | p50 us | p99 us |\n|---|---:|---:|\n");
    for (int h = 0; h < c->n_hops; h++)
        printf("| %s | %.1f | %.1f |\n", c->hops[h].name, res->p50_us[h], res->p99_us[h]);
    printf("| the round: %d wake-ups | %.1f | %.1f |\n", c->n_hops, res->p50_us[c->n_hops],
           res->p99_us[c->n_hops]);
}

static int write_json(const char *path, const chain_t *c, int rounds, int gap_us,
                      const wakeup_result_t *res)
{
    FILE *f = fopen(path, "w");
    if (!f) return -errno;
    fprintf(f, "{\"chain\": \"%s\", \"rounds\": %d, \"gap_us\": %d, \"wakeups\": %d, \"hops\": [",
            c->name, rounds, gap_us, c->n_hops);
    for (int h = 0; h < c->n_hops; h++)
        fprintf(f, "%s{\"name\": \"%s\", \"p50_us\": %.2f, \"p99_us\": %.2f}", h ? ", " : "",
                c->hops[h].name, res->p50_us[h], res->p99_us[h]);
    fprintf(f, "], \"round_p50_us\": %.2f, \"round_p99_us\": %.2f}\n", res->p50_us[c->n_hops],
            res->p99_us[c->n_hops]);
    return fclose(f) == 0 ? 0 : -errno;
}

static const chain_t *chain_named(const char *name)
{
    for (size_t k = 0; k < sizeof wakeup_chains / sizeof wakeup_chains[0]; k++)
        if (strcmp(wakeup_chains[k].name, name) == 0) return &wakeup_chains[k];
    return NULL;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {{"chain", required_argument, NULL, 'c'},
                                         {"rounds", required_argument, NULL, 'n'},
                                         {"gap-us", required_argument, NULL, 'g'},
                                         {"json", required_argument, NULL, 'j'},
                                         {NULL, 0, NULL, 0}};
    const chain_t *chain = &wakeup_chains[0];
    int rounds = 20000, gap_us = 500, opt;
    const char *json = NULL;
    while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (opt) {
        case 'c':
            chain = chain_named(optarg);
            break;
        case 'n':
            rounds = atoi(optarg);
            break;
        case 'g':
            gap_us = atoi(optarg);
            break;
        case 'j':
            json = optarg;
            break;
        default:
            chain = NULL;
        }
    }
    if (!chain || rounds < 1 || gap_us < 0 || optind != argc) {
        fprintf(stderr, "usage: bench_wakeup [--chain cuda|cpu] [--rounds N] [--gap-us N] "
                        "[--json FILE]\n");
        return 2;
    }
    wakeup_bench_t b;
    wakeup_result_t res;
    int r = wakeup_start(&b, chain);
    if (r == 0) r = wakeup_measure(&b, rounds, gap_us, &res);
    wakeup_stop(&b);
    if (r == 0 && json) r = write_json(json, chain, rounds, gap_us, &res);
    if (r < 0) {
        fprintf(stderr, "bench_wakeup: %s\n", strerror(-r));
        return 1;
    }
    print_markdown(chain, rounds, gap_us, &res);
    return 0;
}
