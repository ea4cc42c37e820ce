/* Per-user policy (daemon/util/policy.h) from real configuration files: the defaults, a user's
 * section over its groups' over the defaults, the first group in the file between two, groups
 * through this host's NSS (the running user's primary group), and the file's errors with
 * FILE:LINE and the section. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <stdarg.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/util/config.h"
#include "daemon/util/policy.h"

static char user[256], group[256];
static char path[] = "/tmp/test_policy_XXXXXX";

static void setup(void)
{
    struct passwd *pw = getpwuid(getuid());
    ck_assert_ptr_nonnull(pw);
    snprintf(user, sizeof user, "%s", pw->pw_name);
    struct group *gr = getgrgid(pw->pw_gid);
    ck_assert_ptr_nonnull(gr);
    snprintf(group, sizeof group, "%s", gr->gr_name);
}

/* Loads text (a printf format over user and group, in that order, each as %1$s and %2$s)
 * into cfg; returns config_load_file's result, with its message in err. */
static int load(config_t *cfg, char *err, size_t err_size, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int load(config_t *cfg, char *err, size_t err_size, const char *fmt, ...)
{
    snprintf(path, sizeof path, "/tmp/test_policy_XXXXXX");
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    FILE *f = fdopen(fd, "w");
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fclose(f);
    config_defaults(cfg);
    err[0] = '\0';
    int r = config_load_file(cfg, path, err, err_size);
    unlink(path);
    return r;
}

static void resolve(const config_t *cfg, const char *who, policy_limits_t *ret)
{
    policy_t *p = NULL;
    ck_assert_int_eq(policy_new(cfg, &p), 0);
    policy_resolve(p, who, ret);
    policy_unref(p);
}

START_TEST(test_defaults_come_from_limits_and_name_their_keys)
{
    static config_t cfg;
    char err[1024];
    ck_assert_int_eq(load(&cfg, err, sizeof err,
                          "[limits]\nmax_queued_per_user = 7\nrequests_per_s_per_user = 5\n"
                          "[scheduler]\nweight = 2\n"),
                     0);
    policy_limits_t l;
    resolve(&cfg, "anyone", &l);
    ck_assert_uint_eq(l.value[CONFIG_POLICY_MAX_QUEUED], 7);
    ck_assert_str_eq(l.source[CONFIG_POLICY_MAX_QUEUED], "limits.max_queued_per_user");
    ck_assert_uint_eq(l.value[CONFIG_POLICY_RATE], 5);
    ck_assert_uint_eq(l.value[CONFIG_POLICY_BURST], 100);
    ck_assert_uint_eq(l.value[CONFIG_POLICY_MAX_RUNNING], 1024);
    ck_assert_uint_eq(l.value[CONFIG_POLICY_WEIGHT], 2);
    ck_assert_str_eq(l.source[CONFIG_POLICY_WEIGHT], "scheduler.weight");
}
END_TEST

START_TEST(test_user_section_beats_group_beats_default)
{
    static config_t cfg;
    char err[1024];
    ck_assert_int_eq(load(&cfg, err, sizeof err,
                          "[group.%2$s]\nmax_queued = 20\nmax_running = 3\nweight = 4\n"
                          "[user.%1$s]\nmax_queued = 10\nmax_stored_bytes = 1MiB\n"
                          "[limits]\nmax_queued_per_user = 30\n",
                          user, group),
                     0);
    policy_limits_t l;
    resolve(&cfg, user, &l);
    ck_assert_uint_eq(l.value[CONFIG_POLICY_MAX_QUEUED], 10);
    char want[512];
    snprintf(want, sizeof want, "user.%s.max_queued", user);
    ck_assert_str_eq(l.source[CONFIG_POLICY_MAX_QUEUED], want);
    ck_assert_uint_eq(l.value[CONFIG_POLICY_MAX_STORED_BYTES], 1 << 20);
    ck_assert_uint_eq(l.value[CONFIG_POLICY_MAX_RUNNING], 3);
    snprintf(want, sizeof want, "group.%s.max_running", group);
    ck_assert_str_eq(l.source[CONFIG_POLICY_MAX_RUNNING], want);
    ck_assert_uint_eq(l.value[CONFIG_POLICY_WEIGHT], 4);
    ck_assert_uint_eq(l.value[CONFIG_POLICY_BURST], 100);
    ck_assert_str_eq(l.source[CONFIG_POLICY_BURST], "limits.request_burst_per_user");

    /* Someone else is in neither section (a name the host does not know is in no group). */
    resolve(&cfg, "no-such-user-gj", &l);
    ck_assert_uint_eq(l.value[CONFIG_POLICY_MAX_QUEUED], 30);
    ck_assert_uint_eq(l.value[CONFIG_POLICY_WEIGHT], 1);
}
END_TEST

START_TEST(test_first_group_in_the_file_wins_per_key)
{
    static config_t cfg;
    char err[1024];
    /* The user's primary group appears twice under two spellings: a section for a group the
     * user is not in comes first and is skipped; the first one the user is in decides. */
    ck_assert_int_eq(load(&cfg, err, sizeof err,
                          "# %1$s\n[group.no-such-group-gj]\nweight = 9\n"
                          "[group.%2$s]\nweight = 5\n"
                          "[group.%2$s]\nrate = 3\n",
                          user, group),
                     0);
    ck_assert_int_eq(cfg.n_policy_sections, 2); /* a section named twice is one section */
    policy_limits_t l;
    resolve(&cfg, user, &l);
    ck_assert_uint_eq(l.value[CONFIG_POLICY_WEIGHT], 5);
    ck_assert_uint_eq(l.value[CONFIG_POLICY_RATE], 3);
}
END_TEST

START_TEST(test_bad_policy_lines_name_file_line_and_section)
{
    static config_t cfg;
    char err[1024];
    ck_assert_int_eq(load(&cfg, err, sizeof err, "[user.alice]\nmax_queued = 1\nbogus = 2\n"),
                     -EINVAL);
    ck_assert_msg(strstr(err, ":3: [user.alice] bogus: unknown key"), "%s", err);
    ck_assert_int_eq(load(&cfg, err, sizeof err, "[group.lab]\nweight = 0\n"), -EINVAL);
    ck_assert_msg(strstr(err, ":2: [group.lab] weight:") && strstr(err, "out of range"), "%s", err);
    ck_assert_int_eq(load(&cfg, err, sizeof err, "[user.bob]\nrate = 1\nrate = 2\n"), -EINVAL);
    ck_assert_msg(strstr(err, ":3: [user.bob] rate: set twice"), "%s", err);
    ck_assert_int_eq(load(&cfg, err, sizeof err, "[user.]\nrate = 1\n"), -EINVAL);
    ck_assert_msg(strstr(err, ":2: [user.] rate: expected a user name"), "%s", err);
    ck_assert_int_eq(load(&cfg, err, sizeof err, "[users.bob]\nrate = 1\n"), -EINVAL);
    ck_assert_msg(strstr(err, ":2: [users.bob] rate: unknown section"), "%s", err);
    ck_assert_int_eq(load(&cfg, err, sizeof err, "[user.carol]\nmax_stored_bytes = 1X\n"), -EINVAL);
    ck_assert_msg(strstr(err, "bad size suffix"), "%s", err);
}
END_TEST

START_TEST(test_set_flag_reaches_a_user_section)
{
    static config_t cfg;
    char err[1024];
    char *argv[] = {
        "gpujobd", "--set", "user.alice.weight=7", "--set", "limits.max_queued_per_user=9", NULL};
    config_action_t action;
    ck_assert_msg(config_from_args(&cfg, 5, argv, &action, err, sizeof err) == 0, "%s", err);
    policy_limits_t l;
    resolve(&cfg, "alice", &l);
    ck_assert_uint_eq(l.value[CONFIG_POLICY_WEIGHT], 7);
    ck_assert_str_eq(l.source[CONFIG_POLICY_WEIGHT], "user.alice.weight");
    ck_assert_uint_eq(l.value[CONFIG_POLICY_MAX_QUEUED], 9);
}
END_TEST

START_TEST(test_a_reference_keeps_the_policy_alive)
{
    static config_t cfg;
    config_defaults(&cfg);
    policy_t *p = NULL;
    ck_assert_int_eq(policy_new(&cfg, &p), 0);
    policy_t *held = policy_ref(p);
    policy_unref(p);
    policy_limits_t l;
    policy_resolve(held, "x", &l); /* ASan finds a use after free here if the ref did not hold */
    ck_assert_uint_eq(l.value[CONFIG_POLICY_WEIGHT], 1);
    ck_assert(!policy_has_groups(held));
    policy_unref(held);
    policy_unref(NULL);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("policy");
    TCase *tc = tcase_create("policy");
    tcase_add_checked_fixture(tc, setup, NULL);
    tcase_add_test(tc, test_defaults_come_from_limits_and_name_their_keys);
    tcase_add_test(tc, test_user_section_beats_group_beats_default);
    tcase_add_test(tc, test_first_group_in_the_file_wins_per_key);
    tcase_add_test(tc, test_bad_policy_lines_name_file_line_and_section);
    tcase_add_test(tc, test_set_flag_reaches_a_user_section);
    tcase_add_test(tc, test_a_reference_keeps_the_policy_alive);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
