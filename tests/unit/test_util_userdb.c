/* userdb_in_group against this host's own NSS: the running user's primary group, a
 * supplementary group where it has one, a group it is not in, and names the host lacks. */
#define _GNU_SOURCE
#include <check.h>
#include <grp.h>
#include <pwd.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/util/userdb.h"

static char user[256];
static gid_t primary;
static gid_t groups[1024];
static int ngroups;

static void setup(void)
{
    struct passwd *pw = getpwuid(getuid());
    ck_assert_ptr_nonnull(pw);
    snprintf(user, sizeof user, "%s", pw->pw_name);
    primary = pw->pw_gid;
    ngroups = 1024;
    ck_assert_int_ge(getgrouplist(user, primary, groups, &ngroups), 0);
}

static bool member(gid_t gid)
{
    for (int i = 0; i < ngroups; i++)
        if (groups[i] == gid) return true;
    return false;
}

START_TEST(test_primary_group)
{
    struct group *gr = getgrgid(primary);
    ck_assert_ptr_nonnull(gr);
    ck_assert(userdb_in_group(user, gr->gr_name));
}
END_TEST

START_TEST(test_every_group_of_the_host_answers_as_getgrouplist_does)
{
    int seen_in = 0, seen_out = 0;
    setgrent();
    for (struct group *gr; (gr = getgrent());) {
        bool want = member(gr->gr_gid);
        ck_assert_msg(userdb_in_group(user, gr->gr_name) == want, "%s in %s: want %d", user,
                      gr->gr_name, want);
        want ? seen_in++ : seen_out++;
    }
    endgrent();
    ck_assert_int_gt(seen_in, 0);
    ck_assert_int_gt(seen_out, 0);
}
END_TEST

START_TEST(test_unknown_names_are_in_no_group)
{
    struct group *gr = getgrgid(primary);
    ck_assert_ptr_nonnull(gr);
    ck_assert(!userdb_in_group("gpujob-no-such-user", gr->gr_name));
    ck_assert(!userdb_in_group(user, "gpujob-no-such-group"));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("util_userdb");
    TCase *tc = tcase_create("userdb");
    tcase_add_checked_fixture(tc, setup, NULL);
    tcase_add_test(tc, test_primary_group);
    tcase_add_test(tc, test_every_group_of_the_host_answers_as_getgrouplist_does);
    tcase_add_test(tc, test_unknown_names_are_in_no_group);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
