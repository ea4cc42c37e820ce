/* daemon/auth: the token store on a real SQLite file, and the [auth] settings. */
#define _GNU_SOURCE /* memmem */
#include <check.h>
#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/auth/auth.h"

static char dir[64];

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/test_auth.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

START_TEST(test_created_token_checks_and_revoked_one_does_not)
{
    auth_store_t *st;
    ck_assert_int_eq(auth_store_open(dir, &st), 0);
    char token[AUTH_TOKEN_SIZE];
    auth_token_info_t info, got;
    ck_assert_int_eq(auth_token_create(st, "alice", "laptop", 0, &info, token), 0);
    ck_assert_int_eq(strlen(token), 80);
    int64_t now = (int64_t)time(NULL);
    ck_assert_int_eq(auth_token_check(st, token, now, &got), 0);
    ck_assert_str_eq(got.owner, "alice");
    ck_assert_str_eq(got.id, info.id);
    /* One changed secret digit, a truncated token, garbage: refused. */
    char bad[AUTH_TOKEN_SIZE];
    snprintf(bad, sizeof bad, "%s", token);
    bad[79] = bad[79] == '0' ? '1' : '0';
    ck_assert_int_eq(auth_token_check(st, bad, now, &got), -EACCES);
    bad[40] = '\0';
    ck_assert_int_eq(auth_token_check(st, bad, now, &got), -EACCES);
    ck_assert_int_eq(auth_token_check(st, "Bearer", now, &got), -EACCES);
    /* Another owner cannot revoke it; its owner can, and then it is refused. */
    ck_assert_int_eq(auth_token_revoke(st, info.id, "bob"), -ENOENT);
    ck_assert_int_eq(auth_token_revoke(st, info.id, "alice"), 0);
    ck_assert_int_eq(auth_token_check(st, token, now, &got), -EACCES);
    ck_assert_int_eq(auth_token_revoke(st, info.id, NULL), -ENOENT);
    auth_store_close(st);
}
END_TEST

START_TEST(test_expired_token_is_refused_and_last_use_is_recorded_once_a_minute)
{
    auth_store_t *st;
    ck_assert_int_eq(auth_store_open(dir, &st), 0);
    int64_t now = (int64_t)time(NULL);
    char token[AUTH_TOKEN_SIZE];
    auth_token_info_t info, got;
    ck_assert_int_eq(auth_token_create(st, "alice", "t", now - 5, &info, token), -EINVAL);
    ck_assert_int_eq(auth_token_create(st, "alice", "t", now + 100, &info, token), 0);
    ck_assert_int_eq(auth_token_check(st, token, now + 100, &got), -EKEYEXPIRED);
    ck_assert_int_eq(auth_token_check(st, token, now, &got), 0);
    ck_assert_int_eq(got.last_used, 0); /* the record before this use */
    ck_assert_int_eq(auth_token_check(st, token, now + 30, &got), 0);
    ck_assert_int_eq(got.last_used, now); /* within the minute: not written again */
    ck_assert_int_eq(auth_token_check(st, token, now + 61, &got), 0);
    ck_assert_int_eq(got.last_used, now);
    auth_token_info_t *list;
    size_t n;
    ck_assert_int_eq(auth_token_list(st, "alice", &list, &n), 0);
    ck_assert_int_eq(n, 1);
    ck_assert_int_eq(list[0].last_used, now + 61);
    free(list);
    ck_assert_int_eq(auth_token_list(st, "bob", &list, &n), 0);
    ck_assert_int_eq(n, 0);
    free(list);
    auth_store_close(st);
}
END_TEST

static bool file_holds(const char *path, const void *needle, size_t len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    return memmem(buf, n, needle, len) != NULL;
}

START_TEST(test_stored_files_never_hold_the_secret)
{
    auth_store_t *st;
    ck_assert_int_eq(auth_store_open(dir, &st), 0);
    char token[AUTH_TOKEN_SIZE];
    auth_token_info_t info;
    ck_assert_int_eq(auth_token_create(st, "alice", "laptop", 0, &info, token), 0);
    unsigned char raw[AUTH_SECRET_BYTES];
    size_t n;
    ck_assert_int_eq(sodium_hex2bin(raw, sizeof raw, token + 16, 64, NULL, &n, NULL), 0);
    auth_store_close(st); /* the WAL goes back into the file */
    char path[128];
    snprintf(path, sizeof path, "%s/auth.db", dir);
    ck_assert(file_holds(path, info.id, strlen(info.id))); /* the search works */
    ck_assert(!file_holds(path, token + 16, 64));
    ck_assert(!file_holds(path, raw, sizeof raw));
}
END_TEST

START_TEST(test_settings_refuse_open_or_clear_text_listeners_and_name_admins)
{
    config_t cfg;
    config_defaults(&cfg);
    auth_settings_t *s;
    char err[512];
    snprintf(cfg.mode, sizeof cfg.mode, "none");
    snprintf(cfg.listen, sizeof cfg.listen, "0.0.0.0:80");
    ck_assert_int_eq(auth_settings_new(&cfg, &s, err, sizeof err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "needs a loopback listener"));
    snprintf(cfg.listen, sizeof cfg.listen, "[::1]:80");
    snprintf(cfg.admins, sizeof cfg.admins, " alice , @root");
    ck_assert_int_eq(auth_settings_new(&cfg, &s, err, sizeof err), 0);
    ck_assert(auth_settings_open(s));
    ck_assert(auth_settings_is_admin(s, "alice"));
    ck_assert(auth_settings_is_admin(s, "root")); /* through the group root */
    ck_assert(!auth_settings_is_admin(s, "ali"));
    auth_settings_free(s);
    snprintf(cfg.listen, sizeof cfg.listen, "0.0.0.0:80");
    snprintf(cfg.mode, sizeof cfg.mode, "token");
    snprintf(cfg.admins, sizeof cfg.admins, "a b");
    ck_assert_int_eq(auth_settings_new(&cfg, &s, err, sizeof err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "auth.admins"));
    cfg.admins[0] = '\0';
    /* Tokens beyond loopback: only over HTTPS, or when the admin accepts the risk. */
    ck_assert_int_eq(auth_settings_new(&cfg, &s, err, sizeof err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "in the clear"));
    cfg.allow_insecure_tokens = true;
    ck_assert_int_eq(auth_settings_new(&cfg, &s, err, sizeof err), 0);
    ck_assert(auth_settings_tokens(s) && !auth_settings_peercred(s) && !auth_settings_open(s));
    auth_settings_free(s);
    cfg.allow_insecure_tokens = false;
    snprintf(cfg.tls_cert, sizeof cfg.tls_cert, "/etc/gpujobd/cert.pem");
    snprintf(cfg.tls_key, sizeof cfg.tls_key, "/etc/gpujobd/key.pem");
    ck_assert_int_eq(auth_settings_new(&cfg, &s, err, sizeof err), 0);
    auth_settings_free(s);
    snprintf(cfg.listen, sizeof cfg.listen, "127.0.0.1:80");
    cfg.tls_cert[0] = cfg.tls_key[0] = '\0';
    ck_assert_int_eq(auth_settings_new(&cfg, &s, err, sizeof err), 0);
    auth_settings_free(s);
}
END_TEST

/* The lists of admins, allow_users and allow_groups share one reading: entries between commas,
 * blanks around them dropped, empty ones skipped; a name has no blank or '@' and fits an owner,
 * and only admins take "@group". Each refusal names its key. */
START_TEST(test_name_lists_take_names_and_only_admins_take_groups)
{
    config_t cfg;
    config_defaults(&cfg);
    auth_settings_t *s;
    char err[512], longest[AUTH_USER_SIZE];
    memset(longest, 'n', sizeof longest - 1);
    longest[sizeof longest - 1] = '\0';
    snprintf(cfg.admins, sizeof cfg.admins, ",, alice ,\t@%s,", longest);
    snprintf(cfg.allow_users, sizeof cfg.allow_users, " bob,,%s ", longest);
    ck_assert_int_eq(auth_settings_new(&cfg, &s, err, sizeof err), 0);
    ck_assert(auth_settings_is_admin(s, "alice"));
    ck_assert(auth_settings_allows(s, "bob"));
    ck_assert(auth_settings_allows(s, longest));
    ck_assert(auth_settings_allows(s, "alice")); /* an admin */
    ck_assert(!auth_settings_allows(s, "carol"));
    auth_settings_free(s);
    static const struct {
        const char *admins, *allow_users, *allow_groups, *key;
    } bad[] = {
        {"@", "", "", "auth.admins: '@' is not a user name or @group"},
        {"@a@b", "", "", "auth.admins: '@a@b' is not"},
        {"al ice", "", "", "auth.admins: 'al ice' is not"},
        {"", "@staff", "", "auth.allow_users: '@staff' is not a name"},
        {"", "", "lab, @lab", "auth.allow_groups: '@lab' is not a name"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(cfg.admins, sizeof cfg.admins, "%s", bad[i].admins);
        snprintf(cfg.allow_users, sizeof cfg.allow_users, "%s", bad[i].allow_users);
        snprintf(cfg.allow_groups, sizeof cfg.allow_groups, "%s", bad[i].allow_groups);
        ck_assert_int_eq(auth_settings_new(&cfg, &s, err, sizeof err), -EINVAL);
        ck_assert_msg(strstr(err, bad[i].key), "case %zu: %s", i, err);
    }
    /* A name one byte longer than an owner's: refused in either list. */
    snprintf(cfg.allow_users, sizeof cfg.allow_users, "%sn", longest);
    cfg.admins[0] = cfg.allow_groups[0] = '\0';
    ck_assert_int_eq(auth_settings_new(&cfg, &s, err, sizeof err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "auth.allow_users"));
    snprintf(cfg.admins, sizeof cfg.admins, "@%sn", longest);
    cfg.allow_users[0] = '\0';
    ck_assert_int_eq(auth_settings_new(&cfg, &s, err, sizeof err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "auth.admins"));
}
END_TEST

/* The default identifies callers: the kernel's answer, or a token. */
START_TEST(test_default_mode_is_tokens_and_the_kernels_answer)
{
    config_t cfg;
    config_defaults(&cfg);
    auth_settings_t *s;
    char err[256];
    ck_assert_int_eq(auth_settings_new(&cfg, &s, err, sizeof err), 0);
    ck_assert(auth_settings_peercred(s) && auth_settings_tokens(s) && !auth_settings_open(s));
    ck_assert(auth_settings_allows(s, "anyone")); /* no allow list: everyone */
    auth_settings_free(s);
}
END_TEST

/* allow_users and allow_groups: either admits, admins always may, the group answers are
 * cached per user like the admins' ones, and mode = none (which identifies nobody over TCP)
 * refuses them. */
START_TEST(test_allow_lists_admit_their_users_groups_and_admins)
{
    config_t cfg;
    config_defaults(&cfg);
    snprintf(cfg.allow_users, sizeof cfg.allow_users, "alice, bob");
    snprintf(cfg.admins, sizeof cfg.admins, "carol");
    auth_settings_t *s;
    char err[256], why[256];
    ck_assert_int_eq(auth_settings_new(&cfg, &s, err, sizeof err), 0);
    ck_assert(auth_settings_allows(s, "alice") && auth_settings_allows(s, "bob"));
    ck_assert(auth_settings_allows(s, "carol"));
    ck_assert(!auth_settings_allows(s, "root") && !auth_settings_allows(s, "ali"));
    ck_assert_str_eq(auth_settings_refusal(s, "dave", why, sizeof why), "auth.allow_users");
    ck_assert_ptr_nonnull(strstr(why, "'dave' may not use this daemon"));
    ck_assert_uint_eq(auth_settings_group_lookups(s), 0);
    auth_settings_free(s);

    snprintf(cfg.allow_groups, sizeof cfg.allow_groups, "root");
    ck_assert_int_eq(auth_settings_new(&cfg, &s, err, sizeof err), 0);
    for (int i = 0; i < 3; i++) {
        ck_assert(auth_settings_allows(s, "root")); /* the group root */
        ck_assert(!auth_settings_allows(s, "nobody"));
    }
    ck_assert_uint_eq(auth_settings_group_lookups(s), 2);
    ck_assert_str_eq(auth_settings_refusal(s, "nobody", why, sizeof why), "auth.allow_users");
    ck_assert_ptr_nonnull(strstr(why, "auth.allow_groups"));
    auth_settings_free(s);

    cfg.allow_users[0] = '\0';
    ck_assert_int_eq(auth_settings_new(&cfg, &s, err, sizeof err), 0);
    ck_assert_str_eq(auth_settings_refusal(s, "nobody", why, sizeof why), "auth.allow_groups");
    auth_settings_free(s);

    snprintf(cfg.allow_groups, sizeof cfg.allow_groups, "@root");
    ck_assert_int_eq(auth_settings_new(&cfg, &s, err, sizeof err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "auth.allow_groups"));
    snprintf(cfg.allow_groups, sizeof cfg.allow_groups, "root");
    snprintf(cfg.mode, sizeof cfg.mode, "none");
    ck_assert_int_eq(auth_settings_new(&cfg, &s, err, sizeof err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "auth.allow_groups needs auth.mode"));
}
END_TEST

/* An @group admin is found through NSS once per user; later answers come from the cache and
 * agree with the first, for members and non-members alike, and users named outright cost no
 * lookup. */
START_TEST(test_group_admin_answers_are_cached_per_user_and_agree)
{
    config_t cfg;
    config_defaults(&cfg);
    snprintf(cfg.admins, sizeof cfg.admins, "alice, @root");
    auth_settings_t *s;
    char err[256];
    ck_assert_int_eq(auth_settings_new(&cfg, &s, err, sizeof err), 0);
    ck_assert(auth_settings_is_admin(s, "alice"));
    ck_assert_uint_eq(auth_settings_group_lookups(s), 0);
    for (int i = 0; i < 5; i++) {
        ck_assert(auth_settings_is_admin(s, "root"));
        ck_assert(!auth_settings_is_admin(s, "nobody"));
        ck_assert(!auth_settings_is_admin(s, "no-such-user-gj"));
    }
    ck_assert_uint_eq(auth_settings_group_lookups(s), 3);
    /* Other settings (a reload) ask again: the cache belongs to one settings object. */
    auth_settings_t *s2;
    ck_assert_int_eq(auth_settings_new(&cfg, &s2, err, sizeof err), 0);
    ck_assert(auth_settings_is_admin(s2, "root"));
    ck_assert_uint_eq(auth_settings_group_lookups(s2), 1);
    auth_settings_free(s2);
    auth_settings_free(s);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("auth");
    TCase *tc = tcase_create("tokens");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_created_token_checks_and_revoked_one_does_not);
    tcase_add_test(tc, test_expired_token_is_refused_and_last_use_is_recorded_once_a_minute);
    tcase_add_test(tc, test_stored_files_never_hold_the_secret);
    tcase_add_test(tc, test_settings_refuse_open_or_clear_text_listeners_and_name_admins);
    tcase_add_test(tc, test_name_lists_take_names_and_only_admins_take_groups);
    tcase_add_test(tc, test_group_admin_answers_are_cached_per_user_and_agree);
    tcase_add_test(tc, test_default_mode_is_tokens_and_the_kernels_answer);
    tcase_add_test(tc, test_allow_lists_admit_their_users_groups_and_admins);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
