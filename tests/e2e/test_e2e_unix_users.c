/* Two users on the Unix socket, told apart by the peer's uid (auth mode peercred): a test user
 * made here with useradd, in a forked child that drops to its uid, submits, lists and reads
 * its own job and finds root's job absent (404) and the admin routes closed (403); root, an
 * admin on the socket, sees the test user's job.
 *
 * It needs root (to create the user and to switch to it) and useradd (Debian's passwd package,
 * which scripts/deps.sh installs); otherwise it says why and exits 77 (skipped). The user is
 * removed at exit, after a failed test, and on SIGINT or SIGTERM. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client/gpujob.h"
#include "support/daemon_harness.h"
#include "support/local_accounts.h"

static e2e_daemon_t *daemon_;
static char user_name[32];
static bool user_made;
static pid_t user_maker; /* the process that made the user: only it removes it */
static uid_t user_uid;
static gid_t user_gid;
static char socket_dir[64];
static char socket_url[128];

static void user_remove(void)
{
    if (!user_made || getpid() != user_maker) return;
    user_made = false;
    char *argv[] = {"userdel", user_name, NULL};
    if (local_run_program(argv) != 0) {
        static const char msg[] = "test_e2e_unix_users: userdel failed; remove the test user\n";
        (void)!write(STDERR_FILENO, msg, sizeof msg - 1);
    }
}

static void on_signal(int sig)
{
    user_remove();
    signal(sig, SIG_DFL);
    raise(sig);
}

/* A system user without a home or a login shell, named after this process. */
static int user_create(void)
{
    snprintf(user_name, sizeof user_name, "gjtest%ld", (long)getpid());
    user_maker = getpid();
    return local_account_create(user_name, NULL, &user_made, &user_uid, &user_gid);
}

static gpujob_client_t *client_on_socket(void)
{
    gpujob_client_t *c = NULL;
    char err[256] = "";
    if (gpujob_client_new(socket_url, &c, err, sizeof err) < 0) {
        fprintf(stderr, "client: %s\n", err);
        return NULL;
    }
    return c;
}

/* Submits y = 2x + y on four floats and waits for it: 0 and the job's id, or a negative
 * error with the library's message on stderr. */
static int submit_saxpy(gpujob_client_t *c, char ret_id[64])
{
    float x[4] = {1, 2, 3, 4}, y[4] = {1, 1, 1, 1};
    int64_t n = 4;
    gpujob_tensor_t tx, ty;
    gpujob_spec_t *spec = NULL;
    gpujob_job_t *job = NULL;
    int r = gpujob_spec_new("saxpy", &spec);
    if (r == 0) r = gpujob_tensor_init(&tx, GPUJOB_F32, 1, &n, x);
    if (r == 0) r = gpujob_tensor_init(&ty, GPUJOB_F32, 1, &n, y);
    if (r == 0) r = gpujob_spec_input(spec, "x", &tx);
    if (r == 0) r = gpujob_spec_input(spec, "y", &ty);
    if (r == 0) r = gpujob_spec_param_double(spec, "a", 2.0);
    if (r == 0) r = gpujob_submit_wait(c, spec, 30, &job);
    if (r == 0 && gpujob_job_state(job) != GPUJOB_SUCCEEDED) r = -EIO;
    if (r == 0) snprintf(ret_id, 64, "%s", gpujob_job_id(job));
    if (r < 0) fprintf(stderr, "submit: %s\n", gpujob_errmsg(c));
    gpujob_job_free(job);
    gpujob_spec_free(spec);
    return r;
}

/* Fails the child: says what went wrong and exits with the step's number. */
static void child_fail(int step, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "test user, step %d: ", step);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    _exit(10 + step);
}

/* The test user's side, in a child that has dropped to its uid: its identity, its own job,
 * and root's job and the admin routes closed to it. Writes its job's id to fd. */
static void child_run(uid_t uid, gid_t gid, const char *root_job, int fd)
{
    if (setgroups(0, NULL) < 0 || setgid(gid) < 0 || setuid(uid) < 0)
        child_fail(0, "cannot switch to uid %u: %s", (unsigned)uid, strerror(errno));
    if (getuid() != uid || geteuid() != uid) child_fail(0, "still uid %u", (unsigned)getuid());
    gpujob_client_t *c = client_on_socket();
    if (!c) child_fail(1, "no client");
    gpujob_usage_t u;
    int r = gpujob_usage(c, &u);
    if (r < 0 || strcmp(u.owner, user_name) != 0)
        child_fail(1, "usage: %s, owner '%s'", gpujob_errmsg(c), r < 0 ? "" : u.owner);
    char id[64];
    if (submit_saxpy(c, id) < 0) child_fail(2, "its job did not run");
    gpujob_job_list_t *list = NULL;
    r = gpujob_list(c, NULL, &list);
    if (r < 0 || gpujob_job_list_count(list) != 1 ||
        strcmp(gpujob_job_id(gpujob_job_list_at(list, 0)), id) != 0)
        child_fail(3, "its list is not its one job: %s", gpujob_errmsg(c));
    gpujob_job_list_free(list);
    gpujob_job_t *job = NULL;
    if ((r = gpujob_get(c, id, &job)) < 0) child_fail(4, "its job: %s", gpujob_errmsg(c));
    gpujob_job_free(job);
    float out[4];
    size_t len = 0;
    r = gpujob_output_read(c, id, "out", GPUJOB_FORMAT_RAW, out, sizeof out, &len);
    if (r < 0 || len != sizeof out || out[3] != 9.0f)
        child_fail(5, "its output: %s", gpujob_errmsg(c));
    /* Root's job does not exist for this user: 404 for reading, waiting, its output and
     * cancelling, never 403. */
    job = NULL;
    if ((r = gpujob_get(c, root_job, &job)) != -ENOENT || gpujob_http_status(c) != 404)
        child_fail(6, "root's job answered %ld", gpujob_http_status(c));
    if ((r = gpujob_wait(c, root_job, 1, &job)) != -ENOENT)
        child_fail(7, "waiting on root's job answered %ld", gpujob_http_status(c));
    r = gpujob_output_read(c, root_job, "out", GPUJOB_FORMAT_RAW, out, sizeof out, &len);
    if (r != -ENOENT) child_fail(8, "root's output answered %ld", gpujob_http_status(c));
    if ((r = gpujob_cancel(c, root_job, NULL)) != -ENOENT)
        child_fail(9, "cancelling root's job answered %ld", gpujob_http_status(c));
    gpujob_token_t *tokens = NULL;
    size_t n = 0;
    if ((r = gpujob_token_list(c, "root", &tokens, &n)) != -EACCES || gpujob_http_status(c) != 403)
        child_fail(10, "root's tokens answered %ld", gpujob_http_status(c));
    gpujob_client_free(c);
    if (write(fd, id, strlen(id) + 1) != (ssize_t)strlen(id) + 1) child_fail(11, "write");
    _exit(0);
}

START_TEST(test_two_uids_on_the_unix_socket_see_only_their_own_jobs)
{
    /* The daemon's socket is open to every local user (mode 0666): the peer's uid says who
     * they are. The directory holding it must let them through, as /run/gpujobd does (0755). */
    struct stat st;
    char path[128];
    snprintf(path, sizeof path, "%s/gpujobd.sock", socket_dir);
    e2e_wait_unix_socket_ok(path);
    gpujob_client_t *root = client_on_socket();
    ck_assert_ptr_nonnull(root);
    gpujob_usage_t u;
    ck_assert_int_eq(gpujob_usage(root, &u), 0);
    ck_assert_str_eq(u.owner, "root");
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_int_eq(st.st_mode & 0777, 0666);
    char root_job[64], user_job[64] = "";
    ck_assert_int_eq(submit_saxpy(root, root_job), 0);

    int fds[2];
    ck_assert_int_eq(pipe(fds), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        close(fds[0]);
        child_run(user_uid, user_gid, root_job, fds[1]);
    }
    close(fds[1]);
    ssize_t got = read(fds[0], user_job, sizeof user_job - 1);
    close(fds[0]);
    int ws = 0;
    ck_assert_int_eq(waitpid(pid, &ws, 0), pid);
    ck_assert_msg(WIFEXITED(ws) && WEXITSTATUS(ws) == 0,
                  "the test user's side failed (exit %d; its reason is above)",
                  WIFEXITED(ws) ? WEXITSTATUS(ws) : -1);
    ck_assert_int_gt(got, 0);

    /* Root is an admin on the socket: the test user's job is visible, and its owner named. */
    gpujob_job_t *job = NULL;
    ck_assert_int_eq(gpujob_get(root, user_job, &job), 0);
    char want[64];
    snprintf(want, sizeof want, "\"owner\":\"%s\"", user_name);
    ck_assert_msg(strstr(gpujob_job_json(job), want), "%s", gpujob_job_json(job));
    gpujob_job_free(job);
    gpujob_client_free(root);
}
END_TEST

int main(void)
{
    if (geteuid() != 0) {
        printf("skipped: creating a second user on the Unix socket needs root\n");
        return 77;
    }
    char *probe[] = {"sh", "-c", "command -v useradd >/dev/null && command -v userdel >/dev/null",
                     NULL};
    if (local_run_program(probe) != 0) {
        printf("skipped: useradd/userdel are missing (Debian's passwd package)\n");
        return 77;
    }
    /* Made here, not in the test's forked process, so that this process removes it even
     * when the test dies. */
    atexit(user_remove);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    if (user_create() < 0) {
        fprintf(stderr, "useradd %s failed\n", user_name);
        return 1;
    }
    snprintf(socket_dir, sizeof socket_dir, "/tmp/gj-users-XXXXXX");
    if (!mkdtemp(socket_dir) || chmod(socket_dir, 0755) < 0) return 1;
    snprintf(socket_url, sizeof socket_url, "unix:%s/gpujobd.sock", socket_dir);
    char config[512];
    snprintf(config, sizeof config,
             "[server]\nunix_socket = %s/gpujobd.sock\n[auth]\nmode = peercred\n", socket_dir);
    if (e2e_daemon_start(config, &daemon_) < 0) {
        rmdir(socket_dir);
        return 1;
    }

    Suite *s = suite_create("unix_users");
    TCase *tc = tcase_create("peercred");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_two_uids_on_the_unix_socket_see_only_their_own_jobs);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);

    int status = 0;
    e2e_daemon_stop(daemon_, 30000, &status);
    e2e_daemon_free(daemon_);
    char sock[128];
    snprintf(sock, sizeof sock, "%s/gpujobd.sock", socket_dir);
    unlink(sock);
    rmdir(socket_dir);
    return failed ? 1 : 0;
}
