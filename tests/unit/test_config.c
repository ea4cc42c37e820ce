/* The configuration: defaults, the sample file, INI errors with file, line and key, sizes and
 * other value types, command-line flags over the file, and the real binary's --check-config. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon/util/config.h"

#define KIB (UINT64_C(1) << 10)
#define MIB (UINT64_C(1) << 20)
#define GIB (UINT64_C(1) << 30)
#define TIB (UINT64_C(1) << 40)

/* Every field of config_t with its INI section and a valid value that differs from the default.
 * test_field_table_covers_config_t proves that no field is missing from this list. */
typedef struct field_case {
    const char *section, *key, *value;
    size_t offset, size;
} field_case_t;

#define FIELD(sec, f, v)                                                                           \
    {                                                                                              \
        sec, #f, v, offsetof(config_t, f), sizeof(((config_t *)0)->f)                              \
    }

static const field_case_t fields[] = {
    FIELD("server", listen, "0.0.0.0:1"),
    FIELD("server", unix_socket, "/run/gj.sock"),
    FIELD("server", unix_socket_mode, "0660"),
    FIELD("server", unix_socket_group, "gpu"),
    FIELD("server", state_dir, "/srv/gpujobd"),
    FIELD("server", backend, "cpu"),
    FIELD("server", log_level, "debug"),
    FIELD("server", log_format, "json"),
    FIELD("server", http_threads, "3"),
    FIELD("server", max_connections, "5"),
    FIELD("server", max_connections_per_ip, "4"),
    FIELD("server", idle_timeout_s, "7"),
    FIELD("server", header_timeout_s, "8"),
    FIELD("server", body_timeout_s, "9"),
    FIELD("server", drain_timeout_ms, "1"),
    FIELD("server", tls_cert, "/etc/gpujobd/cert.pem"),
    FIELD("server", tls_key, "/etc/gpujobd/key.pem"),
    FIELD("limits", max_body_bytes, "1MiB"),
    FIELD("limits", max_tensor_bytes, "1GiB"),
    FIELD("limits", max_jobs_per_request, "2"),
    FIELD("limits", max_json_tree_bytes, "2MiB"),
    FIELD("limits", large_parse_bytes, "3MiB"),
    FIELD("limits", max_large_parses, "3"),
    FIELD("limits", max_queued_per_user, "3"),
    FIELD("limits", max_running_per_user, "4"),
    FIELD("limits", max_resident_bytes_per_user, "1GiB"),
    FIELD("limits", max_stored_bytes_per_user, "2GiB"),
    FIELD("limits", requests_per_s_per_user, "12"),
    FIELD("limits", request_burst_per_user, "13"),
    FIELD("limits", max_job_cost_ms, "14"),
    FIELD("limits", default_time_limit_ms, "15"),
    FIELD("limits", max_time_limit_ms, "16"),
    FIELD("limits", device_memory_percent_per_user, "17"),
    FIELD("limits", max_inline_output_bytes, "0"),
    FIELD("limits", max_wait_ms, "5"),
    FIELD("limits", gpu_hours_per_day_per_user, "0.5"),
    FIELD("limits", gpu_hours_per_month_per_user, "100"),
    FIELD("scheduler", max_batch, "6"),
    FIELD("scheduler", max_delay_us, "7"),
    FIELD("scheduler", fair_share_half_life_s, "45"),
    FIELD("scheduler", commit_delay_us, "8"),
    FIELD("scheduler", default_deadline_ms, "9"),
    FIELD("scheduler", max_attempts, "10"),
    FIELD("scheduler", cpu_threads, "11"),
    FIELD("scheduler", cpu_memory_cap, "12MiB"),
    FIELD("scheduler", watchdog_min_ms, "1234"),
    FIELD("scheduler", watchdog_cost_factor, "13"),
    FIELD("scheduler", weight, "3"),
    FIELD("store", inline_blob_bytes, "4096"),
    FIELD("store", sync_full, "false"),
    FIELD("store", shards, "4"),
    FIELD("store", retention_s, "3600"),
    FIELD("store", checkpoint_interval_s, "12"),
    FIELD("store", gc_interval_s, "13"),
    FIELD("store", max_bytes, "1G"),
    FIELD("gpu", devices, "0,2"),
    FIELD("gpu", streams_per_device, "14"),
    FIELD("gpu", spin_us, "250"),
    FIELD("gpu", device_memory_cap, "8GiB"),
    FIELD("gpu", metrics_interval_ms, "500"),
    FIELD("auth", mode, "peercred"),
    FIELD("auth", admins, "alice, @wheel"),
    FIELD("auth", allow_insecure_tokens, "true"),
    FIELD("auth", allow_users, "alice, bob"),
    FIELD("auth", allow_groups, "lab"),
    FIELD("debug", test_ops, "true"),
};
#define FIELD_COUNT (sizeof fields / sizeof fields[0])

static char tmp_dir[64];

static void tmp_setup(void)
{
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/test_config.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmp_dir));
}

static void tmp_teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
    ck_assert_int_eq(system(cmd), 0);
}

/* Writes content to a new file in the test's directory; returns its path (static buffer). */
static const char *write_file(const char *name, const char *content)
{
    static char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", tmp_dir, name);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fputs(content, f) >= 0, 1);
    ck_assert_int_eq(fclose(f), 0);
    return path;
}

static char *read_whole_file(const char *path)
{
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    char *text = calloc(1, 1 << 20);
    size_t n = fread(text, 1, (1 << 20) - 1, f);
    text[n] = '\0';
    fclose(f);
    return text;
}

static const char *sample_config_path(void)
{
    static char path[PATH_MAX];
    const char *src = getenv("GPUJOB_SOURCE_DIR");
    ck_assert_msg(src != NULL, "GPUJOB_SOURCE_DIR is not set (run through ctest)");
    snprintf(path, sizeof path, "%s/config/gpujobd.conf", src);
    return path;
}

START_TEST(test_defaults_equal_documented_values)
{
    config_t cfg;
    config_defaults(&cfg);
    ck_assert_str_eq(cfg.listen, "127.0.0.1:8080");
    ck_assert_str_eq(cfg.unix_socket, "");
    ck_assert_str_eq(cfg.unix_socket_mode, "0666");
    ck_assert_uint_eq(config_unix_socket_mode(&cfg), 0666);
    ck_assert_str_eq(cfg.unix_socket_group, "");
    ck_assert_str_eq(cfg.mode, "token,peercred");
    ck_assert_str_eq(cfg.allow_users, "");
    ck_assert_str_eq(cfg.allow_groups, "");
    ck_assert_str_eq(cfg.state_dir, "/var/lib/gpujobd");
    ck_assert_str_eq(cfg.backend, "auto");
    ck_assert_str_eq(cfg.log_level, "info");
    ck_assert_int_eq(cfg.http_threads, 8);
    ck_assert_int_eq(cfg.max_connections, 0);
    ck_assert_int_eq(cfg.idle_timeout_s, 60);
    ck_assert_int_eq(cfg.drain_timeout_ms, 30000);
    ck_assert_str_eq(cfg.tls_cert, "");
    ck_assert_str_eq(cfg.tls_key, "");
    ck_assert_uint_eq(cfg.max_body_bytes, 256 * MIB);
    ck_assert_uint_eq(cfg.max_tensor_bytes, 4 * GIB);
    ck_assert_int_eq(cfg.max_jobs_per_request, 10000);
    ck_assert_int_eq(cfg.max_queued_per_user, 100000);
    ck_assert_int_eq(cfg.max_running_per_user, 1024);
    ck_assert_uint_eq(cfg.max_resident_bytes_per_user, 0);
    ck_assert_uint_eq(cfg.max_inline_output_bytes, 64 * KIB);
    ck_assert_int_eq(cfg.max_wait_ms, 300000);
    ck_assert_uint_eq(cfg.gpu_hours_per_day_per_user, 0);
    ck_assert_uint_eq(cfg.gpu_hours_per_month_per_user, 0);
    ck_assert_int_eq(cfg.max_batch, 256);
    ck_assert_int_eq(cfg.fair_share_half_life_s, 7 * 86400);
    ck_assert_int_eq(cfg.max_delay_us, 200);
    ck_assert_int_eq(cfg.commit_delay_us, 0);
    ck_assert_int_eq(cfg.default_deadline_ms, 0);
    ck_assert_int_eq(cfg.max_attempts, 3);
    ck_assert_int_eq(cfg.cpu_threads, 0);
    ck_assert_uint_eq(cfg.inline_blob_bytes, 65536);
    ck_assert(cfg.sync_full);
    ck_assert_int_eq(cfg.retention_s, 604800);
    ck_assert_int_eq(cfg.checkpoint_interval_s, 60);
    ck_assert_int_eq(cfg.gc_interval_s, 300);
    ck_assert_str_eq(cfg.devices, "all");
    ck_assert_int_eq(cfg.streams_per_device, 4);
    ck_assert_int_eq(cfg.spin_us, 100);
    ck_assert_uint_eq(cfg.device_memory_cap, 0);
    ck_assert_int_eq(cfg.metrics_interval_ms, 1000);
    ck_assert(!cfg.test_ops);
}
END_TEST

START_TEST(test_defaults_pass_validation)
{
    config_t cfg;
    config_defaults(&cfg);
    char err[512] = "";
    ck_assert_msg(config_validate(&cfg, err, sizeof err) == 0, "%s", err);
}
END_TEST

START_TEST(test_field_table_covers_config_t)
{
    /* The fields, in declaration order, leave no gap wider than alignment padding: so this
     * test's list names every field of config_t, and the tests using it cover them all. */
    ck_assert_uint_eq(fields[0].offset, 0);
    for (size_t i = 1; i < FIELD_COUNT; i++) {
        size_t end = fields[i - 1].offset + fields[i - 1].size;
        ck_assert_msg(fields[i].offset >= end && fields[i].offset - end < 8,
                      "a field of config_t between %s and %s is missing from this test",
                      fields[i - 1].key, fields[i].key);
    }
    /* The policy sections that end config_t are tested in test_policy.c. */
    size_t end = fields[FIELD_COUNT - 1].offset + fields[FIELD_COUNT - 1].size;
    ck_assert_msg(offsetof(config_t, n_policy_sections) - end < 8,
                  "a field after %s is missing from this test", fields[FIELD_COUNT - 1].key);
}
END_TEST

START_TEST(test_every_field_is_set_by_its_section_and_name)
{
    for (size_t i = 0; i < FIELD_COUNT; i++) {
        config_t before, after;
        config_defaults(&before);
        after = before;
        char err[512] = "";
        ck_assert_msg(config_set(&after, fields[i].section, fields[i].key, fields[i].value, err,
                                 sizeof err) == 0,
                      "%s.%s=%s: %s", fields[i].section, fields[i].key, fields[i].value, err);
        const unsigned char *b = (const unsigned char *)&before, *a = (const unsigned char *)&after;
        ck_assert_msg(memcmp(b + fields[i].offset, a + fields[i].offset, fields[i].size) != 0,
                      "%s.%s did not change its field", fields[i].section, fields[i].key);
        ck_assert_msg(memcmp(b, a, fields[i].offset) == 0 &&
                          memcmp(b + fields[i].offset + fields[i].size,
                                 a + fields[i].offset + fields[i].size,
                                 sizeof(config_t) - fields[i].offset - fields[i].size) == 0,
                      "%s.%s changed another field", fields[i].section, fields[i].key);
        /* The TLS files go in pairs: each is valid once its partner is set too. */
        if (strcmp(fields[i].key, "tls_cert") == 0) strcpy(after.tls_key, "/k.pem");
        if (strcmp(fields[i].key, "tls_key") == 0) strcpy(after.tls_cert, "/c.pem");
        ck_assert_msg(config_validate(&after, err, sizeof err) == 0, "%s", err);
    }
}
END_TEST

START_TEST(test_sample_config_loads_and_equals_defaults)
{
    /* The sample's comments say every value is the default, with no exception. */
    config_t defaults, loaded;
    config_defaults(&defaults);
    config_defaults(&loaded);
    /* Start from values that all differ, so that a key the file fails to set shows. */
    for (size_t i = 0; i < FIELD_COUNT; i++)
        ck_assert_int_eq(
            config_set(&loaded, fields[i].section, fields[i].key, fields[i].value, NULL, 0), 0);
    char err[512] = "";
    ck_assert_msg(config_load_file(&loaded, sample_config_path(), err, sizeof err) == 0, "%s", err);
    for (size_t i = 0; i < FIELD_COUNT; i++)
        ck_assert_msg(memcmp((char *)&defaults + fields[i].offset,
                             (char *)&loaded + fields[i].offset, fields[i].size) == 0,
                      "the sample's %s.%s differs from the default", fields[i].section,
                      fields[i].key);
    ck_assert_int_eq(config_validate(&loaded, err, sizeof err), 0);
}
END_TEST

START_TEST(test_sample_config_documents_every_key_in_its_section)
{
    char *text = read_whole_file(sample_config_path());
    for (size_t i = 0; i < FIELD_COUNT; i++) {
        char header[32], line[64];
        snprintf(header, sizeof header, "\n[%s]\n", fields[i].section);
        snprintf(line, sizeof line, "\n%s =", fields[i].key);
        const char *section = strstr(text, header);
        ck_assert_msg(section != NULL, "no [%s] in the sample", fields[i].section);
        const char *next_section = strstr(section + 1, "\n[");
        const char *key = strstr(section, line);
        ck_assert_msg(key && (!next_section || key < next_section), "no %s in [%s]", fields[i].key,
                      fields[i].section);
        /* The lines just above the key are its comment, and the comment gives the default. */
        const char *comment_start = key;
        while (comment_start > section) {
            const char *line_start = comment_start - 1;
            while (line_start > section && line_start[-1] != '\n')
                line_start--;
            if (line_start[0] != '#') break;
            comment_start = line_start;
        }
        char *comment = strndup(comment_start, (size_t)(key - comment_start));
        ck_assert_msg(comment[0] == '#', "%s has no comment", fields[i].key);
        ck_assert_msg(strstr(comment, "Default") != NULL, "the comment of %s gives no default",
                      fields[i].key);
        free(comment);
    }
    free(text);
}
END_TEST

/* A bad file: its content and what the error must say. */
typedef struct bad_file_case {
    const char *content;
    const char *expected; /* after "PATH:" */
} bad_file_case_t;

static char long_line[400];

static const bad_file_case_t bad_files[] = {
    {"[server]\nlisten = 127.0.0.1:1\n[bogus]\nfoo = 1\n",
     ":4: [bogus] foo: unknown section 'bogus'"},
    {"[server]\n\ncolour = blue\n", ":3: [server] colour: unknown key 'colour'"},
    {"[server]\nmax_batch = 4\n", ":2: [server] max_batch: unknown key 'max_batch' in [server] "
                                  "(it belongs in [scheduler])"},
    {"max_batch = 4\n", ":1: max_batch: key outside any section"},
    {"[scheduler]\nmax_batch = lots\n",
     ":2: [scheduler] max_batch: expected an integer, got 'lots'"},
    {"[scheduler]\n# comment\nmax_batch = 12abc\n",
     ":3: [scheduler] max_batch: expected an integer, got '12abc'"},
    {"[scheduler]\nmax_batch = 0x10\n",
     ":2: [scheduler] max_batch: expected an integer, got '0x10'"},
    {"[scheduler]\nmax_batch =\n", ":2: [scheduler] max_batch: expected an integer, got ''"},
    {"[scheduler]\nmax_batch = 65537\n",
     ":2: [scheduler] max_batch: 65537 is out of range (1..65536)"},
    {"[server]\nhttp_threads = 0\n", ":2: [server] http_threads: 0 is out of range (1..1024)"},
    {"[server]\nhttp_threads = -3\n", ":2: [server] http_threads: -3 is out of range (1..1024)"},
    {"[limits]\nmax_wait_ms = 99999999999999999999\n",
     ":2: [limits] max_wait_ms: 99999999999999999999 is out of range"},
    {"[limits]\nmax_body_bytes = 10X\n",
     ":2: [limits] max_body_bytes: bad size suffix 'X' in '10X'"},
    {"[limits]\nmax_body_bytes = 10KB\n",
     ":2: [limits] max_body_bytes: bad size suffix 'KB' in '10KB'"},
    {"[limits]\nmax_body_bytes = 1.5G\n", ":2: [limits] max_body_bytes: bad size suffix '.5G'"},
    {"[limits]\nmax_body_bytes = -1\n", ":2: [limits] max_body_bytes: expected a size in bytes"},
    {"[limits]\nmax_body_bytes = 2T\n",
     ":2: [limits] max_body_bytes: 2T is out of range (1KiB..64GiB)"},
    {"[limits]\nmax_body_bytes = 1000\n",
     ":2: [limits] max_body_bytes: 1000 is out of range (1KiB..64GiB)"},
    {"[gpu]\ndevice_memory_cap = 20000000T\n",
     ":2: [gpu] device_memory_cap: 20000000T is out of range"},
    {"[limits]\ngpu_hours_per_day_per_user = -1\n",
     ":2: [limits] gpu_hours_per_day_per_user: expected a number of hours"},
    {"[limits]\ngpu_hours_per_month_per_user = 2e9\n",
     ":2: [limits] gpu_hours_per_month_per_user: 2e9 is out of range (0..1000000000 hours)"},
    {"[user.alice]\ngpu_hours_per_month = lots\n",
     ":2: [user.alice] gpu_hours_per_month: expected a number of hours"},
    {"[server]\nbackend = gpu\n",
     ":2: [server] backend: expected one of auto, cuda, cpu, got 'gpu'"},
    {"[server]\nlog_level = verbose\n",
     ":2: [server] log_level: expected one of error, warn, info, debug, got 'verbose'"},
    {"[server]\nunix_socket_mode = 0999\n",
     ":2: [server] unix_socket_mode: expected permission bits in octal, 000 to 0777"},
    {"[server]\nunix_socket_mode = 1777\n",
     ":2: [server] unix_socket_mode: expected permission bits in octal, 000 to 0777"},
    {"[auth]\nmode = open\n",
     ":2: [auth] mode: expected one of none, token, peercred, token,peercred, got 'open'"},
    {"[limits]\nmax_queued_per_user = -1\n",
     ":2: [limits] max_queued_per_user: -1 is out of range (0..100000000)"},
    {"[store]\nshards = 3\n", ":2: [store] shards: 3 is out of range (a power of two in 1..16)"},
    {"[store]\nshards = 32\n", ":2: [store] shards: 32 is out of range (a power of two in 1..16)"},
    {"[store]\nsync_full = maybe\n",
     ":2: [store] sync_full: expected true/false, yes/no, on/off or 1/0, got 'maybe'"},
    {"[server]\nlisten = localhost\n",
     ":2: [server] listen: expected HOST:PORT (IPv6 as [::1]:8080), got 'localhost'"},
    {"[server]\nlisten = 127.0.0.1:70000\n",
     ":2: [server] listen: port '70000' in '127.0.0.1:70000' is not a number in 0..65535"},
    {"[server]\nlisten = 127.0.0.1:http\n", ":2: [server] listen: port 'http'"},
    {"[server]\nlisten = :8080\n", ":2: [server] listen: expected HOST:PORT"},
    {"[server]\nlisten = ::1:8080\n", ":2: [server] listen: expected HOST:PORT, got '::1:8080' "
                                      "(write IPv6 addresses as [::1]:8080)"},
    {"[server]\nlisten = [::1]8080\n", ":2: [server] listen: expected HOST:PORT"},
    {"[server]\nstate_dir =\n", ":2: [server] state_dir: must not be empty"},
    {"[server]\nunix_socket = "
     "/run/"
     "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
     "aaaaaaaaaaaaaaaaaaaaaaaaaa.sock\n",
     ":2: [server] unix_socket: '/run/aaa"},
    {"[gpu]\ndevices = 0,,1\n", ":2: [gpu] devices: expected 'all' or a comma-separated list"},
    {"[gpu]\ndevices = 0,2,0\n", ":2: [gpu] devices: device '0' is listed twice in '0,2,0'"},
    {"[gpu]\ndevices = first\n", ":2: [gpu] devices: expected 'all'"},
    {"[scheduler]\nmax_batch = 4\nmax_batch = 5\n",
     ":3: [scheduler] max_batch: set twice (first on line 2)"},
    {"[server\nlisten = 127.0.0.1:1\n", ":1: syntax error"},
    {"[server]\nlisten 127.0.0.1\n", ":2: syntax error"},
    /* inih also takes ':' as the separator, as Python's configparser does. */
    {"[server]\nlisten 127.0.0.1:1\n",
     ":2: [server] listen 127.0.0.1: unknown key 'listen 127.0.0.1' in [server]"},
    {NULL /* long_line, built in the test */, ":2: line longer than "},
};

START_TEST(test_bad_file_errors_name_file_line_and_key)
{
    const bad_file_case_t *c = &bad_files[_i];
    const char *content = c->content;
    if (!content) {
        memset(long_line, 0, sizeof long_line);
        strcpy(long_line, "[server]\nstate_dir = /");
        memset(long_line + strlen(long_line), 'a', 250);
        strcat(long_line, "\n");
        content = long_line;
    }
    const char *path = write_file("bad.conf", content);
    config_t cfg, before;
    config_defaults(&cfg);
    ck_assert_int_eq(config_set(&cfg, "server", "listen", "10.1.2.3:4", NULL, 0), 0);
    before = cfg;
    char err[1024] = "";
    ck_assert_int_eq(config_load_file(&cfg, path, err, sizeof err), -EINVAL);
    char expected[1024];
    snprintf(expected, sizeof expected, "%s%s", path, c->expected);
    ck_assert_msg(strncmp(err, expected, strlen(expected)) == 0,
                  "case %d: got \"%s\", expected a message starting \"%s\"", _i, err, expected);
    ck_assert_msg(memcmp(&cfg, &before, sizeof cfg) == 0,
                  "case %d: a bad file changed the configuration", _i);
}
END_TEST

START_TEST(test_file_that_cannot_be_read_is_an_errno_error)
{
    config_t cfg;
    config_defaults(&cfg);
    char err[512] = "", path[PATH_MAX];
    snprintf(path, sizeof path, "%s/missing.conf", tmp_dir);
    ck_assert_int_eq(config_load_file(&cfg, path, err, sizeof err), -ENOENT);
    ck_assert_ptr_nonnull(strstr(err, path));
    ck_assert_int_eq(config_load_file(&cfg, tmp_dir, err, sizeof err), -EISDIR);
    ck_assert_ptr_nonnull(strstr(err, tmp_dir));
}
END_TEST

START_TEST(test_file_values_comments_and_quotes)
{
    const char *path =
        write_file("good.conf", "; a comment\n"
                                "# another\n"
                                "[server]\n"
                                "listen = [::1]:9000 ; trailing comment\n"
                                "state_dir = \"/srv/with space\"\n"
                                "backend = CPU\n"
                                "\n"
                                "[store]\n"
                                "sync_full = off\n"
                                "[limits]\n"
                                "max_body_bytes = 512 KiB\n"
                                "[gpu]\n"
                                "devices = 1,GPU-5f2b1c3d-aaaa-bbbb-cccc-0123456789ab\n");
    config_t cfg;
    config_defaults(&cfg);
    char err[512] = "";
    ck_assert_msg(config_load_file(&cfg, path, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(cfg.listen, "[::1]:9000");
    ck_assert_str_eq(cfg.state_dir, "/srv/with space");
    ck_assert_str_eq(cfg.backend, "cpu");
    ck_assert(!cfg.sync_full);
    ck_assert_uint_eq(cfg.max_body_bytes, 512 * KIB);
    ck_assert_str_eq(cfg.devices, "1,GPU-5f2b1c3d-aaaa-bbbb-cccc-0123456789ab");
    /* Keys the file does not name keep their values. */
    ck_assert_int_eq(cfg.max_batch, 256);
}
END_TEST

START_TEST(test_sizes_parse_with_suffixes)
{
    static const struct {
        const char *text;
        uint64_t bytes;
    } sizes[] = {
        {"0", 0},
        {"1024", 1024},
        {"1K", KIB},
        {"1KiB", KIB},
        {"3M", 3 * MIB},
        {"2 MiB", 2 * MIB},
        {"4G", 4 * GIB},
        {"4GiB", 4 * GIB},
        {"5T", 5 * TIB},
        {"16777215TiB", 16777215 * TIB},
        {"18446744073709551615", UINT64_MAX},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        config_t cfg;
        config_defaults(&cfg);
        char err[512] = "";
        ck_assert_msg(
            config_set(&cfg, "gpu", "device_memory_cap", sizes[i].text, err, sizeof err) == 0,
            "%s: %s", sizes[i].text, err);
        ck_assert_msg(cfg.device_memory_cap == sizes[i].bytes, "%s gave %llu", sizes[i].text,
                      (unsigned long long)cfg.device_memory_cap);
    }
    config_t cfg;
    config_defaults(&cfg);
    char err[512] = "";
    ck_assert_int_eq(config_set(&cfg, "gpu", "device_memory_cap", "16777216TiB", err, sizeof err),
                     -EINVAL);
    ck_assert_str_eq(
        err, "gpu.device_memory_cap: 16777216TiB is out of range (0..18446744073709551615)");
    ck_assert_int_eq(
        config_set(&cfg, "gpu", "device_memory_cap", "18446744073709551616", err, sizeof err),
        -EINVAL);
    ck_assert_int_eq(config_set(&cfg, "gpu", "device_memory_cap", "1kib", err, sizeof err),
                     -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "bad size suffix 'kib'"));
}
END_TEST

START_TEST(test_bool_spellings)
{
    static const char *const yes[] = {"true", "yes", "on", "1", "TRUE", "Yes"};
    static const char *const no[] = {"false", "no", "off", "0", "False", "OFF"};
    for (size_t i = 0; i < 6; i++) {
        config_t cfg;
        config_defaults(&cfg);
        ck_assert_int_eq(config_set(&cfg, "store", "sync_full", no[i], NULL, 0), 0);
        ck_assert_msg(!cfg.sync_full, "%s", no[i]);
        ck_assert_int_eq(config_set(&cfg, "store", "sync_full", yes[i], NULL, 0), 0);
        ck_assert_msg(cfg.sync_full, "%s", yes[i]);
    }
}
END_TEST

START_TEST(test_config_set_errors_name_section_and_key)
{
    config_t cfg, before;
    config_defaults(&cfg);
    before = cfg;
    char err[512] = "";
    ck_assert_int_eq(config_set(&cfg, "limits", "max_body_bytes", "huge", err, sizeof err),
                     -EINVAL);
    ck_assert_str_eq(err, "limits.max_body_bytes: expected a size in bytes with an optional K, M, "
                          "G, T, KiB, MiB, GiB or TiB suffix, got 'huge'");
    ck_assert_int_eq(config_set(&cfg, "server", "nope", "1", err, sizeof err), -EINVAL);
    ck_assert_str_eq(err, "server.nope: unknown key 'nope' in [server]");
    ck_assert_int_eq(config_set(&cfg, "srv", "listen", "a:1", err, sizeof err), -EINVAL);
    ck_assert_str_eq(err, "srv.listen: unknown section 'srv' (sections: server, limits, "
                          "scheduler, store, gpu, auth, debug, user.NAME, group.NAME)");
    ck_assert_int_eq(config_set(&cfg, "scheduler", "max_attempts", "101", err, sizeof err),
                     -EINVAL);
    ck_assert_str_eq(err, "scheduler.max_attempts: 101 is out of range (1..100)");
    ck_assert_int_eq(config_set(&cfg, "server", "listen", NULL, err, sizeof err), -EINVAL);
    ck_assert_msg(memcmp(&cfg, &before, sizeof cfg) == 0, "a refused set changed the config");
}
END_TEST

START_TEST(test_metrics_interval_is_off_at_zero_or_in_its_range)
{
    config_t cfg;
    config_defaults(&cfg);
    char err[512] = "";
    ck_assert_int_eq(config_set(&cfg, "gpu", "metrics_interval_ms", "0", err, sizeof err), 0);
    ck_assert_int_eq(cfg.metrics_interval_ms, 0);
    ck_assert_int_eq(config_set(&cfg, "gpu", "metrics_interval_ms", "100", err, sizeof err), 0);
    ck_assert_int_eq(config_set(&cfg, "gpu", "metrics_interval_ms", "60000", err, sizeof err), 0);
    ck_assert_int_eq(config_set(&cfg, "gpu", "metrics_interval_ms", "99", err, sizeof err),
                     -EINVAL);
    ck_assert_str_eq(err, "gpu.metrics_interval_ms: 99 is out of range (0, or 100..60000)");
    ck_assert_int_eq(config_set(&cfg, "gpu", "metrics_interval_ms", "60001", err, sizeof err),
                     -EINVAL);
    ck_assert_str_eq(err, "gpu.metrics_interval_ms: 60001 is out of range (0, or 100..60000)");
    ck_assert_int_eq(config_set(&cfg, "gpu", "metrics_interval_ms", "-1", err, sizeof err),
                     -EINVAL);
    ck_assert_str_eq(err, "gpu.metrics_interval_ms: -1 is out of range (0, or 100..60000)");
    ck_assert_int_eq(cfg.metrics_interval_ms, 60000);
    cfg.metrics_interval_ms = 50;
    ck_assert_int_eq(config_validate(&cfg, err, sizeof err), -EINVAL);
    ck_assert_str_eq(err, "gpu.metrics_interval_ms: 50 is out of range (0, or 100..60000)");
}
END_TEST

START_TEST(test_validate_names_the_bad_field)
{
    config_t cfg;
    char err[512] = "";

    config_defaults(&cfg);
    strcpy(cfg.listen, "no-port");
    ck_assert_int_eq(config_validate(&cfg, err, sizeof err), -EINVAL);
    ck_assert_str_eq(err, "server.listen: expected HOST:PORT (IPv6 as [::1]:8080), got 'no-port'");

    config_defaults(&cfg);
    strcpy(cfg.listen, "[::1]:65536");
    ck_assert_int_eq(config_validate(&cfg, err, sizeof err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "server.listen: port '65536'"));

    config_defaults(&cfg);
    cfg.state_dir[0] = '\0';
    ck_assert_int_eq(config_validate(&cfg, err, sizeof err), -EINVAL);
    ck_assert_str_eq(err, "server.state_dir: must not be empty");

    config_defaults(&cfg);
    strcpy(cfg.backend, "gpu");
    ck_assert_int_eq(config_validate(&cfg, err, sizeof err), -EINVAL);
    ck_assert_str_eq(err, "server.backend: expected one of auto, cuda, cpu, got 'gpu'");

    config_defaults(&cfg);
    strcpy(cfg.backend, "CPU"); /* the file accepts it, but stores "cpu" */
    ck_assert_int_eq(config_validate(&cfg, err, sizeof err), -EINVAL);
    ck_assert_str_eq(err, "server.backend: expected one of auto, cuda, cpu, got 'CPU'");

    config_defaults(&cfg);
    cfg.max_batch = 0;
    ck_assert_int_eq(config_validate(&cfg, err, sizeof err), -EINVAL);
    ck_assert_str_eq(err, "scheduler.max_batch: 0 is out of range (1..65536)");

    config_defaults(&cfg);
    cfg.max_tensor_bytes = 2 * TIB;
    ck_assert_int_eq(config_validate(&cfg, err, sizeof err), -EINVAL);
    ck_assert_str_eq(err, "limits.max_tensor_bytes: 2199023255552 is out of range (1KiB..1TiB)");

    config_defaults(&cfg);
    memset(cfg.log_level, 'x', sizeof cfg.log_level);
    ck_assert_int_eq(config_validate(&cfg, err, sizeof err), -EINVAL);
    ck_assert_str_eq(err, "server.log_level: is not a terminated string");
}
END_TEST

START_TEST(test_tls_files_are_set_both_or_neither)
{
    config_t cfg;
    char err[512] = "";

    config_defaults(&cfg);
    ck_assert(!config_tls_enabled(&cfg));
    strcpy(cfg.tls_cert, "/etc/gpujobd/cert.pem");
    ck_assert_int_eq(config_validate(&cfg, err, sizeof err), -EINVAL);
    ck_assert_str_eq(err, "server.tls_key: must be set with server.tls_cert (both or neither)");

    config_defaults(&cfg);
    strcpy(cfg.tls_key, "/etc/gpujobd/key.pem");
    ck_assert_int_eq(config_validate(&cfg, err, sizeof err), -EINVAL);
    ck_assert_str_eq(err, "server.tls_cert: must be set with server.tls_key (both or neither)");

    strcpy(cfg.tls_cert, "/etc/gpujobd/cert.pem");
    ck_assert_int_eq(config_validate(&cfg, err, sizeof err), 0);
    ck_assert(config_tls_enabled(&cfg));
}
END_TEST

START_TEST(test_listen_addr_splits_host_and_port)
{
    static const struct {
        const char *listen, *host;
        int port;
    } cases[] = {
        {"127.0.0.1:8080", "127.0.0.1", 8080},   {"[::1]:9000", "::1", 9000}, {"[::]:0", "::", 0},
        {"localhost:65535", "localhost", 65535}, {"0.0.0.0:1", "0.0.0.0", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        config_t cfg;
        config_defaults(&cfg);
        ck_assert_int_eq(config_set(&cfg, "server", "listen", cases[i].listen, NULL, 0), 0);
        char host[64] = "";
        int port = -1;
        ck_assert_int_eq(config_listen_addr(&cfg, host, sizeof host, &port), 0);
        ck_assert_str_eq(host, cases[i].host);
        ck_assert_int_eq(port, cases[i].port);
    }
    /* A host that does not fit is an error, and the outputs are left alone. */
    config_t cfg;
    config_defaults(&cfg);
    char host[4] = "old";
    int port = -1;
    ck_assert_int_eq(config_listen_addr(&cfg, host, sizeof host, &port), -EINVAL);
    ck_assert_str_eq(host, "old");
    ck_assert_int_eq(port, -1);
    strcpy(cfg.listen, "nonsense");
    char big[64];
    ck_assert_int_eq(config_listen_addr(&cfg, big, sizeof big, &port), -EINVAL);
    ck_assert_int_eq(port, -1);
}
END_TEST

/* Runs config_from_args over a NULL-terminated list of arguments after "gpujobd". */
#define ARGV(...) ((char *[]){"gpujobd", __VA_ARGS__, NULL})
static int from_args(config_t *cfg, char **argv, config_action_t *action, char *err,
                     size_t err_size)
{
    int argc = 0;
    while (argv[argc])
        argc++;
    return config_from_args(cfg, argc, argv, action, err, err_size);
}

START_TEST(test_flags_override_the_file_whatever_their_order)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s",
             write_file("f.conf", "[server]\n"
                                  "listen = 10.0.0.1:1\n"
                                  "state_dir = /from/file\n"
                                  "log_level = warn\n"
                                  "[scheduler]\n"
                                  "max_batch = 7\n"));
    char *orders[][8] = {
        {"gpujobd", "--listen", "127.0.0.1:9999", "--config", path, "--state-dir", "/from/flag",
         NULL},
        {"gpujobd", "--state-dir", "/from/flag", "--listen", "127.0.0.1:9999", "--config", path,
         NULL},
        {"gpujobd", "-c", path, "--listen=127.0.0.1:9999", "--state-dir=/from/flag", NULL},
    };
    for (size_t i = 0; i < 3; i++) {
        config_t cfg;
        config_action_t action = CONFIG_ACTION_HELP;
        char err[512] = "";
        ck_assert_msg(from_args(&cfg, orders[i], &action, err, sizeof err) == 0, "%s", err);
        ck_assert_int_eq(action, CONFIG_ACTION_RUN);
        ck_assert_str_eq(cfg.listen, "127.0.0.1:9999");
        ck_assert_str_eq(cfg.state_dir, "/from/flag");
        ck_assert_str_eq(cfg.log_level, "warn"); /* from the file */
        ck_assert_int_eq(cfg.max_batch, 7);      /* from the file */
        ck_assert_str_eq(cfg.backend, "auto");   /* the default */
    }
}
END_TEST

START_TEST(test_key_flags_and_set_apply_in_command_line_order)
{
    config_t cfg;
    config_action_t action;
    char err[512] = "";
    ck_assert_msg(
        from_args(&cfg,
                  ARGV("--set", "scheduler.max_batch=64", "--backend", "cpu", "--log-level",
                       "debug", "--unix-socket", "/run/g.sock", "--set", "scheduler.max_batch=32",
                       "--listen", "127.0.0.1:1", "--set", "server.listen=127.0.0.1:2", "--set",
                       "limits.max_body_bytes=1 GiB"),
                  &action, err, sizeof err) == 0,
        "%s", err);
    ck_assert_int_eq(cfg.max_batch, 32);
    ck_assert_str_eq(cfg.backend, "cpu");
    ck_assert_str_eq(cfg.log_level, "debug");
    ck_assert_str_eq(cfg.unix_socket, "/run/g.sock");
    ck_assert_str_eq(cfg.listen, "127.0.0.1:2");
    ck_assert_uint_eq(cfg.max_body_bytes, GIB);
}
END_TEST

START_TEST(test_actions)
{
    config_t cfg;
    config_action_t action = CONFIG_ACTION_RUN;
    char err[512] = "";
    ck_assert_int_eq(from_args(&cfg, ARGV("--check-config"), &action, err, sizeof err), 0);
    ck_assert_int_eq(action, CONFIG_ACTION_CHECK);
    ck_assert_int_eq(from_args(&cfg, ARGV("--version"), &action, err, sizeof err), 0);
    ck_assert_int_eq(action, CONFIG_ACTION_VERSION);
    ck_assert_int_eq(from_args(&cfg, ARGV("-V"), &action, err, sizeof err), 0);
    ck_assert_int_eq(action, CONFIG_ACTION_VERSION);
    /* --help answers even when the file it names could not be read. */
    ck_assert_int_eq(
        from_args(&cfg, ARGV("--config", "/nonexistent", "--help"), &action, err, sizeof err), 0);
    ck_assert_int_eq(action, CONFIG_ACTION_HELP);
    ck_assert_int_eq(from_args(&cfg, ARGV("-h"), &action, err, sizeof err), 0);
    ck_assert_int_eq(action, CONFIG_ACTION_HELP);
    char *no_args[] = {"gpujobd", NULL};
    ck_assert_int_eq(from_args(&cfg, no_args, &action, err, sizeof err), 0);
    ck_assert_int_eq(action, CONFIG_ACTION_RUN);
    config_t defaults;
    config_defaults(&defaults);
    ck_assert(memcmp(&cfg, &defaults, sizeof cfg) == 0);
}
END_TEST

START_TEST(test_check_config_reports_a_bad_file)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s", write_file("bad.conf", "[limits]\nmax_wait_ms = soon\n"));
    config_t cfg;
    config_action_t action = CONFIG_ACTION_RUN;
    char err[PATH_MAX + 128] = "", expected[PATH_MAX + 128];
    ck_assert_int_eq(
        from_args(&cfg, ARGV("--check-config", "--config", path), &action, err, sizeof err),
        -EINVAL);
    snprintf(expected, sizeof expected,
             "%s:2: [limits] max_wait_ms: expected an integer, got 'soon'", path);
    ck_assert_str_eq(err, expected);
    ck_assert_int_eq(action, CONFIG_ACTION_RUN); /* written only on success */
    ck_assert_int_eq(
        from_args(&cfg, ARGV("--config", "/nonexistent/g.conf"), &action, err, sizeof err),
        -ENOENT);
    ck_assert_str_eq(err, "cannot read '/nonexistent/g.conf': No such file or directory");
}
END_TEST

START_TEST(test_bad_flags_error_naming_the_flag)
{
    static const struct {
        char *args[4];
        const char *expected;
    } cases[] = {
        {{"--frobnicate"}, "unknown option '--frobnicate' (see --help)"},
        {{"--frobnicate=3"}, "unknown option '--frobnicate' (see --help)"},
        {{"-x"}, "unknown option '-x' (see --help)"},
        {{"--c"}, "ambiguous option '--c' (see --help)"},
        {{"--listen"}, "option '--listen' requires an argument"},
        {{"--check-config", "-c"}, "option '-c' requires an argument"},
        {{"--help=yes"}, "option '--help' does not take an argument"},
        {{"serve"}, "unexpected argument 'serve' (see --help)"},
        {{"--backend", "gpu"},
         "--backend: server.backend: expected one of auto, cuda, cpu, got "
         "'gpu'"},
        {{"--listen", "8080"},
         "--listen: server.listen: expected HOST:PORT (IPv6 as "
         "[::1]:8080), got '8080'"},
        {{"--state-dir", ""}, "--state-dir: server.state_dir: must not be empty"},
        {{"--log-level", "loud"},
         "--log-level: server.log_level: expected one of error, warn, "
         "info, debug, got 'loud'"},
        {{"--set", "max_batch=3"}, "--set: expected SECTION.KEY=VALUE, got 'max_batch=3'"},
        {{"--set", "scheduler.max_batch"},
         "--set: expected SECTION.KEY=VALUE, got "
         "'scheduler.max_batch'"},
        {{"--set", "limits.bogus=1"}, "--set: limits.bogus: unknown key 'bogus' in [limits]"},
        {{"--set", "scheduler.max_batch=0"},
         "--set: scheduler.max_batch: 0 is out of range "
         "(1..65536)"},
        {{"--config", "a", "--config"}, "option '--config' requires an argument"},
        {{"--config", "a", "--config", "b"}, "--config given twice ('a' and 'b')"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *argv[6] = {"gpujobd"};
        int argc = 1;
        for (int j = 0; j < 4 && cases[i].args[j]; j++)
            argv[argc++] = cases[i].args[j];
        config_t cfg, before;
        memset(&cfg, 0x5a, sizeof cfg);
        before = cfg;
        config_action_t action = CONFIG_ACTION_VERSION;
        char err[512] = "";
        ck_assert_msg(config_from_args(&cfg, argc, argv, &action, err, sizeof err) == -EINVAL,
                      "case %zu (%s) was accepted", i, cases[i].expected);
        ck_assert_msg(strcmp(err, cases[i].expected) == 0, "case %zu: got \"%s\", expected \"%s\"",
                      i, err, cases[i].expected);
        ck_assert_msg(memcmp(&cfg, &before, sizeof cfg) == 0 && action == CONFIG_ACTION_VERSION,
                      "case %zu: outputs written on error", i);
    }
}
END_TEST

START_TEST(test_usage_lists_every_flag_and_key)
{
    static const char *const flags[] = {"--config FILE",
                                        "-c,",
                                        "--listen HOST:PORT",
                                        "--unix-socket PATH",
                                        "--state-dir DIR",
                                        "--backend auto|cuda|cpu",
                                        "--log-level error|warn|info|debug",
                                        "--set SECTION.KEY=VALUE",
                                        "--check-config",
                                        "--version",
                                        "-V,",
                                        "--help",
                                        "-h,"};
    const char *usage = config_usage();
    ck_assert_ptr_nonnull(usage);
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        ck_assert_msg(strstr(usage, flags[i]) != NULL, "--help does not list %s", flags[i]);
    for (size_t i = 0; i < FIELD_COUNT; i++) {
        char name[64];
        snprintf(name, sizeof name, "  %s.%s = ", fields[i].section, fields[i].key);
        ck_assert_msg(strstr(usage, name) != NULL, "--help does not list %s.%s", fields[i].section,
                      fields[i].key);
    }
    ck_assert_ptr_nonnull(
        strstr(usage, "  limits.max_body_bytes = 256MiB\n      one HTTP request body"));
}
END_TEST

/* Runs the real gpujobd with args; returns its exit status, its stdout+stderr in ret_output. */
static int run_gpujobd(const char *const *args, char **ret_output)
{
    const char *bin = getenv("GPUJOBD_BIN");
    ck_assert_msg(bin != NULL, "GPUJOBD_BIN is not set (run through ctest)");
    ck_assert_msg(access(bin, X_OK) == 0, "%s is not built: build the gpujobd target", bin);
    char out_path[PATH_MAX];
    snprintf(out_path, sizeof out_path, "%s/gpujobd.out", tmp_dir);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int fd = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0) _exit(127);
        char *argv[16] = {(char *)bin};
        for (int i = 0; args[i] && i < 14; i++)
            argv[i + 1] = (char *)args[i];
        execv(bin, argv);
        _exit(127);
    }
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status), "gpujobd did not exit normally");
    *ret_output = read_whole_file(out_path);
    return WEXITSTATUS(status);
}

static int kept_count;
static char kept_last[64];

static void on_kept(const char *section, const char *key, void *userdata)
{
    (void)userdata;
    kept_count++;
    snprintf(kept_last, sizeof kept_last, "%s.%s", section, key);
}

START_TEST(test_reload_keeps_restart_only_keys_and_applies_the_rest)
{
    config_t running, next;
    config_defaults(&running);
    config_defaults(&next);
    char err[256];
    ck_assert_int_eq(config_set(&next, "server", "listen", "0.0.0.0:9", err, sizeof err), 0);
    ck_assert_int_eq(config_set(&next, "limits", "max_queued_per_user", "7", err, sizeof err), 0);
    ck_assert_int_eq(config_set(&next, "auth", "admins", "alice", err, sizeof err), 0);
    ck_assert_int_eq(config_set(&next, "scheduler", "weight", "3", err, sizeof err), 0);
    ck_assert_int_eq(config_set(&next, "user.bob", "max_queued", "2", err, sizeof err), 0);
    kept_count = 0;
    ck_assert_int_eq(config_keep_restart_only(&next, &running, on_kept, NULL), 1);
    ck_assert_int_eq(kept_count, 1);
    ck_assert_str_eq(kept_last, "server.listen");
    ck_assert_str_eq(next.listen, running.listen);
    ck_assert_int_eq(next.max_queued_per_user, 7);
    ck_assert_str_eq(next.admins, "alice");
    ck_assert_int_eq(next.weight, 3);
    ck_assert_int_eq(next.n_policy_sections, 1);
}
END_TEST

START_TEST(test_binary_check_config_accepts_good_and_rejects_bad_files)
{
    char sample[PATH_MAX], state[PATH_MAX];
    snprintf(sample, sizeof sample, "%s", sample_config_path());
    snprintf(state, sizeof state, "%s/state", tmp_dir);
    char *output = NULL;

    /* The README's run command: the sample with --listen and --state-dir overrides. */
    int code = run_gpujobd((const char *[]){"--config", sample, "--listen", "127.0.0.1:0",
                                            "--state-dir", state, "--check-config", NULL},
                           &output);
    ck_assert_msg(code == 0, "exit %d: %s", code, output);
    ck_assert_ptr_nonnull(strstr(output, "configuration OK"));
    free(output);

    const char *bad = write_file("bad.conf", "[server]\nlisten = 127.0.0.1:1\n\n"
                                             "[gpu]\nstreams_per_device = 100\n");
    code = run_gpujobd((const char *[]){"--check-config", "--config", bad, NULL}, &output);
    ck_assert_int_eq(code, 2);
    char expected[PATH_MAX + 128];
    snprintf(expected, sizeof expected,
             "%s:5: [gpu] streams_per_device: 100 is out of range (1..64)", bad);
    ck_assert_msg(strstr(output, expected) != NULL, "got: %s", output);
    ck_assert_ptr_null(strstr(output, "configuration OK"));
    free(output);

    code = run_gpujobd((const char *[]){"--check-config", "--bogus", NULL}, &output);
    ck_assert_int_eq(code, 2);
    ck_assert_ptr_nonnull(strstr(output, "unknown option '--bogus'"));
    free(output);

    code = run_gpujobd((const char *[]){"--help", NULL}, &output);
    ck_assert_int_eq(code, 0);
    ck_assert_ptr_nonnull(strstr(output, "--check-config"));
    free(output);
}
END_TEST

static Suite *config_suite(void)
{
    Suite *s = suite_create("config");
    TCase *tc = tcase_create("keys");
    tcase_add_checked_fixture(tc, tmp_setup, tmp_teardown);
    tcase_add_test(tc, test_defaults_equal_documented_values);
    tcase_add_test(tc, test_defaults_pass_validation);
    tcase_add_test(tc, test_field_table_covers_config_t);
    tcase_add_test(tc, test_every_field_is_set_by_its_section_and_name);
    tcase_add_test(tc, test_sample_config_loads_and_equals_defaults);
    tcase_add_test(tc, test_sample_config_documents_every_key_in_its_section);
    tcase_add_loop_test(tc, test_bad_file_errors_name_file_line_and_key, 0,
                        sizeof bad_files / sizeof bad_files[0]);
    tcase_add_test(tc, test_file_that_cannot_be_read_is_an_errno_error);
    tcase_add_test(tc, test_file_values_comments_and_quotes);
    tcase_add_test(tc, test_sizes_parse_with_suffixes);
    tcase_add_test(tc, test_bool_spellings);
    tcase_add_test(tc, test_config_set_errors_name_section_and_key);
    tcase_add_test(tc, test_metrics_interval_is_off_at_zero_or_in_its_range);
    tcase_add_test(tc, test_validate_names_the_bad_field);
    tcase_add_test(tc, test_tls_files_are_set_both_or_neither);
    tcase_add_test(tc, test_listen_addr_splits_host_and_port);
    suite_add_tcase(s, tc);

    TCase *args = tcase_create("args");
    tcase_add_checked_fixture(args, tmp_setup, tmp_teardown);
    tcase_add_test(args, test_flags_override_the_file_whatever_their_order);
    tcase_add_test(args, test_key_flags_and_set_apply_in_command_line_order);
    tcase_add_test(args, test_actions);
    tcase_add_test(args, test_check_config_reports_a_bad_file);
    tcase_add_test(args, test_bad_flags_error_naming_the_flag);
    tcase_add_test(args, test_usage_lists_every_flag_and_key);
    tcase_add_test(args, test_reload_keeps_restart_only_keys_and_applies_the_rest);
    suite_add_tcase(s, args);

    /* Needs the gpujobd binary, which links once every module of the daemon exists. */
    TCase *binary = tcase_create("binary");
    tcase_add_checked_fixture(binary, tmp_setup, tmp_teardown);
    tcase_add_test(binary, test_binary_check_config_accepts_good_and_rejects_bad_files);
    suite_add_tcase(s, binary);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(config_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
