/* The poison-job guard (crash_guard.h): per-thread slots of the ids being run, the fatal-signal
 * handler that appends them to STATE_DIR/poisoned, and the reading of that file at start. */
#include "crash_guard.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "vec.h"

/* Large enough for the handler's own frames and write(2), whatever overflowed the stack. */
#define CRASH_GUARD_ALTSTACK_SIZE (64 * 1024)

/* A thread's jobs: max_jobs records of ID_SIZE bytes; n of them are the current run's. The
 * handler runs on the same thread as the writer (a fault is delivered to the thread that made
 * it), so a signal fence between the records and n is all the ordering it needs. */
typedef struct crash_guard_slot {
    volatile sig_atomic_t n;
    int max_jobs;
    char *ids;
    stack_t altstack;
} crash_guard_slot_t;

static const int crash_guard_signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};

/* Initial-exec TLS: reading it in a signal handler allocates nothing. */
static __thread crash_guard_slot_t *crash_guard_tls __attribute__((tls_model("initial-exec")));
static int crash_guard_fd = -1;

/* Writes "<id>\t<signo>\n" for each job of the slot, one write(2) per record (O_APPEND keeps
 * each whole). Async-signal-safe: no stdio, no allocation. */
static void crash_guard_write(const crash_guard_slot_t *slot, int signo)
{
    char line[ID_SIZE + 16];
    char digits[12];
    int nd = 0;
    for (unsigned v = (unsigned)signo; nd == 0 || v > 0; v /= 10)
        digits[nd++] = (char)('0' + v % 10);
    for (int i = 0; i < slot->n; i++) {
        const char *id = slot->ids + (size_t)i * ID_SIZE;
        size_t len = strnlen(id, ID_SIZE - 1);
        memcpy(line, id, len);
        line[len++] = '\t';
        for (int k = nd - 1; k >= 0; k--)
            line[len++] = digits[k];
        line[len++] = '\n';
        ssize_t w = write(crash_guard_fd, line, len);
        (void)w; /* nothing to do about it now */
    }
    fdatasync(crash_guard_fd);
}

static void crash_guard_on_signal(int signo, siginfo_t *info, void *uc)
{
    (void)uc;
    int saved_errno = errno;
    const crash_guard_slot_t *slot = crash_guard_tls;
    bool sent = info && (info->si_code == SI_USER || info->si_code == SI_QUEUE);
    if (slot && slot->n > 0 && crash_guard_fd >= 0 && !sent) crash_guard_write(slot, signo);
    /* The default action, at once for a signal raised here, or when the faulting instruction
     * runs again after the return. */
    struct sigaction dfl = {.sa_handler = SIG_DFL};
    sigemptyset(&dfl.sa_mask);
    sigaction(signo, &dfl, NULL);
    raise(signo);
    errno = saved_errno;
}

int crash_guard_install(const char *state_dir)
{
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/poisoned", state_dir) >= (int)sizeof path)
        return log_error_errno(-ENAMETOOLONG, "crash guard: state directory path too long");
    int fd = open(path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0) {
        int r = -errno;
        return log_error_errno(r, "Failed to open '%s': %s", path, strerror(-r));
    }
    struct sigaction sa = {.sa_sigaction = crash_guard_on_signal,
                           .sa_flags = SA_SIGINFO | SA_ONSTACK};
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof crash_guard_signals / sizeof *crash_guard_signals; i++)
        if (sigaction(crash_guard_signals[i], &sa, NULL) < 0) {
            int r = -errno;
            close(fd);
            return log_error_errno(r, "crash guard: sigaction failed: %s", strerror(-r));
        }
    if (crash_guard_fd >= 0) close(crash_guard_fd);
    crash_guard_fd = fd;
    return 0;
}

int crash_guard_thread_enter(int max_jobs)
{
    if (max_jobs < 1) max_jobs = 1;
    crash_guard_slot_t *slot = calloc(1, sizeof *slot);
    char *ids = calloc((size_t)max_jobs, ID_SIZE);
    void *stack = malloc(CRASH_GUARD_ALTSTACK_SIZE);
    if (!slot || !ids || !stack) {
        free(slot);
        free(ids);
        free(stack);
        return -ENOMEM;
    }
    slot->ids = ids;
    slot->max_jobs = max_jobs;
    slot->altstack = (stack_t){.ss_sp = stack, .ss_size = CRASH_GUARD_ALTSTACK_SIZE};
    if (sigaltstack(&slot->altstack, NULL) < 0) slot->altstack.ss_sp = NULL;
    if (!slot->altstack.ss_sp) free(stack);
    crash_guard_tls = slot;
    return 0;
}

void crash_guard_thread_leave(void)
{
    crash_guard_slot_t *slot = crash_guard_tls;
    if (!slot) return;
    crash_guard_tls = NULL;
    if (slot->altstack.ss_sp) {
        stack_t off = {.ss_flags = SS_DISABLE};
        sigaltstack(&off, NULL);
        free(slot->altstack.ss_sp);
    }
    free(slot->ids);
    free(slot);
}

void crash_guard_enter(const char *const *ids, int n)
{
    crash_guard_slot_t *slot = crash_guard_tls;
    if (!slot) return;
    slot->n = 0;
    atomic_signal_fence(memory_order_seq_cst);
    if (n > slot->max_jobs) n = slot->max_jobs;
    for (int i = 0; i < n; i++)
        snprintf(slot->ids + (size_t)i * ID_SIZE, ID_SIZE, "%s", ids[i]);
    atomic_signal_fence(memory_order_seq_cst);
    slot->n = n;
}

void crash_guard_leave(void)
{
    crash_guard_slot_t *slot = crash_guard_tls;
    if (slot) slot->n = 0;
}

/* Parses one "<id>\t<signo>" line into *v; false when it is not such a record. */
static bool crash_guard_parse(char *line, crash_guard_victim_t *v)
{
    char *tab = strchr(line, '\t');
    if (!tab || tab == line || tab - line >= ID_SIZE) return false;
    char *end;
    long signo = strtol(tab + 1, &end, 10);
    if (*end != '\0' || end == tab + 1 || signo <= 0 || signo >= 128) return false;
    memcpy(v->id, line, (size_t)(tab - line));
    v->id[tab - line] = '\0';
    v->signo = (int)signo;
    return true;
}

int crash_guard_take(crash_guard_victim_t **ret, size_t *ret_n)
{
    crash_guard_victim_t *a = NULL;
    size_t n = 0, cap = 0;
    int r = 0;
    if (crash_guard_fd >= 0) {
        int fd = dup(crash_guard_fd);
        FILE *f = fd >= 0 ? fdopen(fd, "r") : NULL;
        if (!f) {
            r = -errno;
            if (fd >= 0) close(fd);
            return log_error_errno(r, "crash guard: cannot read the poisoned list: %s",
                                   strerror(-r));
        }
        rewind(f);
        char line[256];
        while (r == 0 && fgets(line, sizeof line, f)) {
            line[strcspn(line, "\n")] = '\0';
            crash_guard_victim_t v;
            if (!crash_guard_parse(line, &v)) continue;
            r = vec_grow((void **)&a, &cap, n + 1, sizeof *a, 8);
            if (r == 0) a[n++] = v;
        }
        fclose(f);
    }
    if (r < 0) {
        free(a);
        return r;
    }
    *ret = a;
    *ret_n = n;
    return 0;
}

int crash_guard_clear(void)
{
    if (crash_guard_fd < 0) return 0;
    if (ftruncate(crash_guard_fd, 0) < 0) {
        int r = -errno;
        return log_error_errno(r, "crash guard: cannot empty the poisoned list: %s", strerror(-r));
    }
    return 0;
}
