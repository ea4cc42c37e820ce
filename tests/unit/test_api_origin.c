/* Whether a request may come from another site's page (api/http_origin.c): the Host must name
 * loopback (a name under localhost, 127.0.0.0/8, [::1], with or without a port, and nothing
 * that merely starts or ends like one); an Origin must be the daemon's own as Host names it;
 * Sec-Fetch-Site must say same-origin or none; a request without Host is no browser's. */
#include <check.h>

#include "api/http_origin.h"
#include "support/run_suite.h"

START_TEST(test_loopback_hosts_pass_and_others_do_not)
{
    const char *loopback[] = {"localhost",      "LocalHost:8080",  "app.localhost:1", "127.0.0.1",
                              "127.0.0.1:8080", "127.5.6.7:65535", "[::1]",           "[::1]:8080"};
    for (size_t i = 0; i < sizeof loopback / sizeof loopback[0]; i++)
        ck_assert_msg(!http_cross_site(loopback[i], NULL, NULL), "%s", loopback[i]);
    const char *foreign[] = {"attacker.example",
                             "attacker.example:8080",
                             "localhost.example",
                             "notlocalhost",
                             "128.0.0.1:8080",
                             "10.0.0.1",
                             "[::2]:8080",
                             "[::1",
                             "[::1]x",
                             "127.0.0.1:",
                             "127.0.0.1:808080",
                             "127.0.0.1:80a",
                             "",
                             ":8080",
                             "0x7f.0.0.1",
                             "127.1"};
    for (size_t i = 0; i < sizeof foreign / sizeof foreign[0]; i++)
        ck_assert_msg(http_cross_site(foreign[i], NULL, NULL), "%s", foreign[i]);
    ck_assert(!http_cross_site(NULL, NULL, NULL));
}
END_TEST

START_TEST(test_an_origin_must_be_the_hosts_own)
{
    ck_assert(!http_cross_site("127.0.0.1:8080", "http://127.0.0.1:8080", NULL));
    ck_assert(!http_cross_site("localhost:8080", "HTTPS://localhost:8080", NULL));
    ck_assert(!http_cross_site("[::1]:8080", "http://[::1]:8080", NULL));
    ck_assert(http_cross_site("127.0.0.1:8080", "http://127.0.0.1:8081", NULL));
    ck_assert(http_cross_site("127.0.0.1:8080", "http://localhost:8080", NULL));
    ck_assert(http_cross_site("127.0.0.1:8080", "http://attacker.example", NULL));
    ck_assert(http_cross_site("127.0.0.1:8080", "null", NULL));
    ck_assert(http_cross_site("127.0.0.1:8080", "file://127.0.0.1:8080", NULL));
    ck_assert(http_cross_site("127.0.0.1:8080", "http://127.0.0.1:8080/", NULL));
}
END_TEST

START_TEST(test_fetch_metadata_must_say_same_origin_or_none)
{
    ck_assert(!http_cross_site("localhost", NULL, "same-origin"));
    ck_assert(!http_cross_site("localhost", NULL, "none"));
    ck_assert(http_cross_site("localhost", NULL, "same-site"));
    ck_assert(http_cross_site("localhost", NULL, "cross-site"));
    ck_assert(http_cross_site("localhost", "http://localhost", "cross-site"));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("api_origin");
    TCase *tc = tcase_create("origin");
    tcase_add_test(tc, test_loopback_hosts_pass_and_others_do_not);
    tcase_add_test(tc, test_an_origin_must_be_the_hosts_own);
    tcase_add_test(tc, test_fetch_metadata_must_say_same_origin_or_none);
    suite_add_tcase(s, tc);
    return run_suite(s);
}
