/* gpujob: the command users type to run jobs on gpujobd, built on libgpujob.
 *
 * Each subcommand is one function that parses its own options (the global ones, --url, --json
 * and --help, are accepted before the subcommand and after it), talks to the daemon through
 * the library and prints either human output (aligned tables, durations, sizes) or, with
 * --json, the daemon's JSON. Exit statuses tell usage errors, daemon errors, unreachable
 * daemons, failed jobs and wait timeouts apart (cli.h, gpujob(1)). */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "gpujob_internal.h"

static const char main_usage[] =
    "usage: gpujob [--url URL] [--cacert FILE] [--json] COMMAND [ARGS]\n"
    "\n"
    "Runs jobs on gpujobd, the GPU job daemon.\n"
    "\n"
    "Commands:\n"
    "  info                      the daemon's version, backend, ops and limits\n"
    "  run OP [OPTIONS]          submit a job (and wait for it with --wait or -o)\n"
    "  status ID                 show a job\n"
    "  wait ID [--timeout S]     wait until a job is final\n"
    "  ls [--state S] [--op OP]  list your jobs\n"
    "  cancel ID                 cancel a queued or running job\n"
    "  out ID NAME -o FILE       download an output (.npy, or raw bytes with --raw)\n"
    "  buf put FILE.npy          upload a buffer; buf keep JOB OUTPUT; buf get ID; buf rm ID\n"
    "  usage                     your jobs, run time and buffers\n"
    "  token create NAME         mint a token (on the server); token list; token revoke ID\n"
    "\n"
    "Global options:\n"
    "  --url URL      daemon address: http://HOST:PORT or unix:/PATH (default $GPUJOB_URL,\n"
    "                 else unix:" GPUJOB_DEFAULT_SOCKET ")\n"
    "  --cacert FILE  CA certificates (PEM) that verify an https:// daemon, instead of the\n"
    "                 system's (default $GPUJOB_CA_FILE)\n"
    "  --json         print JSON instead of human output\n"
    "  -h, --help     help (also after a command: gpujob run --help)\n"
    "  --version      the version of gpujob\n"
    "\n"
    "Exit status: 0 success, 1 job failed or cancelled, 2 usage or local file error,\n"
    "3 the daemon answered an error, 4 the daemon could not be reached, 5 wait timed out.\n";

int cli_usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "gpujob%s%s: ", cmd ? " " : "", cmd ? cmd : "");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\nTry 'gpujob%s%s --help'.\n", cmd ? " " : "", cmd ? cmd : "");
    va_end(ap);
    return CLI_EXIT_USAGE;
}

int cli_api_error(cli_t *cli, const char *what, int r)
{
    const char *msg = cli->client ? gpujob_errmsg(cli->client) : "";
    fprintf(stderr, "gpujob: %s: %s\n", what, msg && msg[0] ? msg : gpujob_strerror(r));
    long status = cli->client ? gpujob_http_status(cli->client) : 0;
    if (r == -ETIMEDOUT && status != 0) return CLI_EXIT_TIMEOUT;
    if (status >= 400) return CLI_EXIT_SERVER;
    switch (r) {
    case -ECONNREFUSED:
    case -ECONNRESET:
    case -ETIMEDOUT:
    case -EHOSTUNREACH:
    case -EPROTO:
    case -EIO:
        return CLI_EXIT_UNREACHABLE;
    case -EBADMSG:
        return CLI_EXIT_SERVER;
    default:
        return status ? CLI_EXIT_SERVER : CLI_EXIT_USAGE;
    }
}

int cli_connect(cli_t *cli)
{
    char err[512] = "";
    int r = gpujob_client_new(cli->url, &cli->client, err, sizeof err);
    if (r < 0) {
        fprintf(stderr, "gpujob: %s\n", err[0] ? err : gpujob_strerror(r));
        return CLI_EXIT_USAGE;
    }
    r = cli->cacert ? gpujob_client_set_ca_file(cli->client, cli->cacert) : 0;
    if (r < 0) {
        fprintf(stderr, "gpujob: --cacert '%s': %s\n", cli->cacert, strerror(-r));
        return CLI_EXIT_USAGE;
    }
    /* --json prints the daemon's JSON: outputs as numbers, not offsets into a section. */
    gpujob_client_set_binary_outputs(cli->client, !cli->json);
    return CLI_EXIT_OK;
}

bool cli_common_option(cli_t *cli, int opt)
{
    switch (opt) {
    case OPT_URL:
        cli->url = optarg;
        return true;
    case OPT_CACERT:
        cli->cacert = optarg;
        return true;
    case OPT_JSON:
        cli->json = true;
        return true;
    default:
        return false;
    }
}

/* Parses integer text within [lo, hi]. 0 or -EINVAL. */
static int parse_long(const char *text, long lo, long hi, long *ret)
{
    char *end = NULL;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (end == text || *end || errno == ERANGE || v < lo || v > hi) return -EINVAL;
    *ret = v;
    return 0;
}

static int parse_seconds(const char *text, double *ret)
{
    char *end = NULL;
    double v = strtod(text, &end);
    if (end == text || *end || !(v >= 0)) return -EINVAL;
    *ret = v;
    return 0;
}

void cli_print_json_text(const char *text)
{
    json_t *v = json_loads(text, JSON_DECODE_ANY, NULL);
    char *pretty = v ? gjc_json_dumps(v, JSON_INDENT(2) | JSON_ENCODE_ANY) : NULL;
    puts(pretty ? pretty : text);
    free(pretty);
    json_decref(v);
}

void cli_print_json(json_t *v)
{
    char *text = gjc_json_dumps(v, JSON_INDENT(2) | JSON_ENCODE_ANY);
    if (text) puts(text);
    free(text);
    json_decref(v);
}

/* Writes len bytes to path ("-" for stdout) through a temporary file renamed into place. */
static int write_file(const char *path, const void *data, size_t len)
{
    if (strcmp(path, "-") == 0) return fwrite(data, 1, len, stdout) == len ? 0 : -EIO;
    return gjc_write_file(path, data, len);
}

/* ---- Jobs, human-readable ---------------------------------------------------------------- */

/* "waiting:   fair_share, 12 jobs before it" (and the limit when a user limit holds it),
 * from the job's JSON: the daemon explains a queued job's wait there. */
static void print_waiting(const gpujob_job_t *job)
{
    json_t *o = json_loads(gpujob_job_json(job), 0, NULL);
    json_t *w = json_object_get(o, "waiting");
    const char *reason = json_string_value(json_object_get(w, "reason"));
    const char *limit = json_string_value(json_object_get(w, "limit"));
    if (reason)
        printf("waiting:   %s%s%s, %" JSON_INTEGER_FORMAT " jobs before it\n", reason,
               limit ? " " : "", limit ? limit : "",
               json_integer_value(json_object_get(w, "position")));
    json_decref(o);
}

static void print_job(const gpujob_job_t *job)
{
    char a[64], b[64], c[64];
    const char *err_code = gpujob_job_error_code(job);
    printf("id:        %s\n", gpujob_job_id(job));
    printf("op:        %s\n", gpujob_job_op(job));
    printf("state:     %s\n", gpujob_state_name(gpujob_job_state(job)));
    print_waiting(job);
    if (err_code)
        printf("error:     %s: %s\n", err_code,
               gpujob_job_error_message(job) ? gpujob_job_error_message(job) : "");
    printf("priority:  %d\n", gpujob_job_priority(job));
    if (gpujob_job_device(job) >= 0) printf("device:    %d\n", gpujob_job_device(job));
    printf("created:   %s\n", gpujob_job_created_at(job) ? gpujob_job_created_at(job) : "-");
    printf("started:   %s\n", gpujob_job_started_at(job) ? gpujob_job_started_at(job) : "-");
    printf("finished:  %s\n", gpujob_job_finished_at(job) ? gpujob_job_finished_at(job) : "-");
    printf("times:     queued %s, ran %s, gpu %s\n", cli_duration(gpujob_job_queue_ms(job), a, 64),
           cli_duration(gpujob_job_run_ms(job), b, 64),
           cli_duration(gpujob_job_gpu_ms(job), c, 64));
    printf("attempts:  %d\n", gpujob_job_attempts(job));
    if (gpujob_job_batch_size(job) > 0) printf("batch:     %d jobs\n", gpujob_job_batch_size(job));
    if (gpujob_job_run_device(job) >= 0)
        printf("ran on:    device %d\n", gpujob_job_run_device(job));
    for (size_t i = 0; i < gpujob_job_output_count(job); i++) {
        const char *name = gpujob_job_output_name(job, i);
        gpujob_tensor_t t;
        if (gpujob_job_output(job, name, &t) < 0) continue;
        printf("output:    %s %s %s (%s)\n", name, gpujob_dtype_name(t.dtype),
               cli_shape(t.ndim, t.shape, a, 64), cli_size(t.nbytes, b, 64));
        gpujob_tensor_clear(&t);
    }
}

/* One line for a final job: "JOB succeeded in 1.2 ms (queued 0.3 ms)". */
static void print_job_outcome(const gpujob_job_t *job)
{
    char a[64], b[64];
    gpujob_state_t s = gpujob_job_state(job);
    if (s == GPUJOB_SUCCEEDED)
        printf("%s succeeded in %s (queued %s)\n", gpujob_job_id(job),
               cli_duration(gpujob_job_run_ms(job), a, 64),
               cli_duration(gpujob_job_queue_ms(job), b, 64));
    else
        printf("%s %s\n", gpujob_job_id(job), gpujob_state_name(s));
}

/* The exit status and message for a final job. */
static int job_outcome_status(const gpujob_job_t *job)
{
    gpujob_state_t s = gpujob_job_state(job);
    if (s == GPUJOB_SUCCEEDED) return CLI_EXIT_OK;
    const char *code = gpujob_job_error_code(job), *msg = gpujob_job_error_message(job);
    fprintf(stderr, "gpujob: job %s %s%s%s%s%s\n", gpujob_job_id(job), gpujob_state_name(s),
            code ? ": " : "", code ? code : "", msg ? ": " : "", msg ? msg : "");
    return CLI_EXIT_JOB_FAILED;
}

static int on_progress(const gpujob_job_t *job, double elapsed_s, void *userdata)
{
    char a[64];
    fprintf(stderr, "\r\033[K%s  %s  %s", gpujob_job_id(job),
            gpujob_state_name(gpujob_job_state(job)), cli_duration(elapsed_s * 1000.0, a, 64));
    fflush(stderr);
    return 0;
}

/* Waits for id, with a progress line on a terminal. 0 and the final job, or an exit status. */
static int wait_job(cli_t *cli, const char *id, double timeout_s, gpujob_job_t **ret)
{
    /* The progress line is for a person at a terminal; scripts and pipes get silence. */
    bool progress = !cli->json && isatty(STDERR_FILENO);
    int r = gpujob_wait_progress(cli->client, id, timeout_s, 0.5, progress ? on_progress : NULL,
                                 NULL, ret);
    if (progress) fprintf(stderr, "\r\033[K");
    return r < 0 ? cli_api_error(cli, "wait", r) : CLI_EXIT_OK;
}

/* ---- Commands ---------------------------------------------------------------------------- */

static int cmd_info(cli_t *cli, int argc, char **argv)
{
    static const char usage[] = "usage: gpujob info [--json]\n"
                                "Shows the daemon's version, backend, ops and limits.\n";
    static const struct option opts[] = {COMMON_LONG_OPTIONS, {0}};
    int opt;
    while ((opt = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
        if (opt == 'h') return fputs(usage, stdout), CLI_EXIT_OK;
        if (!cli_common_option(cli, opt)) return cli_usage_error("info", "unknown option");
    }
    if (optind != argc) return cli_usage_error("info", "unexpected argument '%s'", argv[optind]);
    int r = cli_connect(cli);
    if (r) return r;
    gpujob_info_t *info = NULL;
    if ((r = gpujob_info(cli->client, &info)) < 0) return cli_api_error(cli, "info", r);
    if (cli->json) {
        cli_print_json_text(gpujob_info_json(info));
        gpujob_info_free(info);
        return CLI_EXIT_OK;
    }
    json_t *root = json_loads(gpujob_info_json(info), 0, NULL);
    printf("gpujobd %s at %s\n", gpujob_info_version(info), gpujob_client_address(cli->client));
    printf("backend: %s, %zu GPU%s\n", gpujob_info_backend(info), gpujob_info_device_count(info),
           gpujob_info_device_count(info) == 1 ? "" : "s");
    json_t *user = json_object_get(root, "user");
    if (user)
        printf("user: %s%s\n", json_string_value(json_object_get(user, "name")),
               json_is_true(json_object_get(user, "admin")) ? " (admin)" : "");

    cli_table_t *t = cli_table_new(4);
    const char *head[] = {"OP", "INPUTS", "PARAMS", "SUMMARY"};
    cli_table_add(t, head);
    size_t i;
    json_t *op;
    json_array_foreach(json_object_get(root, "ops"), i, op)
    {
        char inputs[256] = "", params[256] = "";
        size_t j;
        json_t *v;
        /* Optional inputs are marked with '?'. */
        json_array_foreach(json_object_get(op, "inputs"), j, v)
        {
            size_t n = strlen(inputs);
            snprintf(inputs + n, sizeof inputs - n, "%s%s%s", j ? " " : "",
                     json_string_value(json_object_get(v, "name")),
                     json_is_true(json_object_get(v, "required")) ? "" : "?");
        }
        json_array_foreach(json_object_get(op, "params"), j, v)
        {
            size_t n = strlen(params);
            snprintf(params + n, sizeof params - n, "%s%s", j ? " " : "", json_string_value(v));
        }
        const char *row[] = {json_string_value(json_object_get(op, "name")), inputs,
                             params[0] ? params : "-",
                             json_string_value(json_object_get(op, "summary"))};
        cli_table_add(t, row);
    }
    printf("\n");
    cli_table_print(t);
    cli_table_free(t);

    const char *key;
    json_t *v;
    printf("\nlimits:\n");
    json_object_foreach(json_object_get(root, "limits"), key, v)
    {
        char size[64];
        bool bytes = strstr(key, "bytes") != NULL;
        if (bytes)
            printf("  %-24s %s\n", key, cli_size((uint64_t)json_integer_value(v), size, 64));
        else
            printf("  %-24s %lld\n", key, (long long)json_integer_value(v));
    }
    json_decref(root);
    gpujob_info_free(info);
    return CLI_EXIT_OK;
}

/* -p KEY=VALUE: VALUE as JSON when it parses (numbers, true/false, lists), else a string. */
static int add_param(gpujob_spec_t *spec, const char *arg)
{
    const char *eq = strchr(arg, '=');
    if (!eq || eq == arg) return -EINVAL;
    char *key = strndup(arg, (size_t)(eq - arg));
    if (!key) return -ENOMEM;
    int r = gpujob_spec_param_json(spec, key, eq + 1);
    if (r == -EINVAL) r = gpujob_spec_param_string(spec, key, eq + 1);
    free(key);
    return r;
}

/* -i NAME=FILE.npy, or NAME=buffer:ID for an uploaded buffer. */
static int add_input(gpujob_spec_t *spec, const char *arg)
{
    const char *eq = strchr(arg, '=');
    if (!eq || eq == arg || !eq[1])
        return cli_usage_error("run", "-i wants NAME=FILE.npy, not '%s'", arg);
    char *name = strndup(arg, (size_t)(eq - arg));
    int r = 0;
    if (strncmp(eq + 1, "buffer:", 7) == 0) {
        r = gpujob_spec_input_buffer(spec, name, eq + 8);
    } else {
        char err[512] = "";
        gpujob_tensor_t t;
        r = gpujob_npy_load(eq + 1, &t, err, sizeof err);
        if (r < 0) {
            fprintf(stderr, "gpujob run: input %s: %s\n", name, err);
            free(name);
            return CLI_EXIT_USAGE;
        }
        r = gpujob_spec_input(spec, name, &t);
        gpujob_tensor_clear(&t);
    }
    if (r < 0) {
        fprintf(stderr, "gpujob run: input %s: %s\n", name,
                r == -EEXIST ? "given twice" : gpujob_strerror(r));
        free(name);
        return CLI_EXIT_USAGE;
    }
    free(name);
    return CLI_EXIT_OK;
}

typedef struct output_request {
    const char *name, *path;
} output_request_t;

/* Downloads an output as .npy into path. */
static int save_output(cli_t *cli, const char *id, const char *name, const char *path, bool raw)
{
    void *data = NULL;
    size_t len = 0;
    int r = gpujob_output_fetch(cli->client, id, name, raw ? GPUJOB_FORMAT_RAW : GPUJOB_FORMAT_NPY,
                                &data, &len);
    if (r < 0) {
        char what[160];
        snprintf(what, sizeof what, "output %s", name);
        return cli_api_error(cli, what, r);
    }
    r = write_file(path, data, len);
    free(data);
    if (r < 0) {
        fprintf(stderr, "gpujob: writing '%s': %s\n", path, strerror(-r));
        return CLI_EXIT_USAGE;
    }
    return CLI_EXIT_OK;
}

/* The options of 'gpujob run'. The three lists point into arrays the caller sizes by argc
 * and into argv itself. */
typedef struct run_options {
    const char **params, **inputs;
    output_request_t *outputs;
    int np, ni, no;
    bool wait;
    double timeout_s;
    long priority, device, deadline, time_limit;
    bool has_priority;
} run_options_t;

/* The long options of 'gpujob run' that have no short form. */
enum {
    RUN_OPT_TIMEOUT = 2000,
    RUN_OPT_PRIORITY,
    RUN_OPT_DEVICE,
    RUN_OPT_DEADLINE,
    RUN_OPT_TIME_LIMIT
};

/* Applies one option of 'gpujob run' (other than --help) to o; -o's arg is split in place.
 * CLI_EXIT_OK, or the exit status of the usage error. */
static int run_apply_option(cli_t *cli, int opt, char *arg, run_options_t *o)
{
    switch (opt) {
    case 'p':
        o->params[o->np++] = arg;
        break;
    case 'i':
        o->inputs[o->ni++] = arg;
        break;
    case 'o': {
        char *eq = strchr(arg, '=');
        if (!eq || eq == arg || !eq[1])
            return cli_usage_error("run", "-o wants NAME=FILE.npy, not '%s'", arg);
        *eq = '\0';
        o->outputs[o->no++] = (output_request_t){arg, eq + 1};
        o->wait = true;
        break;
    }
    case 'w':
        o->wait = true;
        break;
    case RUN_OPT_TIMEOUT:
        if (parse_seconds(arg, &o->timeout_s) < 0)
            return cli_usage_error("run", "--timeout wants seconds, not '%s'", arg);
        break;
    case RUN_OPT_PRIORITY:
        if (parse_long(arg, -100, 100, &o->priority) < 0)
            return cli_usage_error("run", "--priority wants an integer in -100..100, not '%s'",
                                   arg);
        o->has_priority = true;
        break;
    case RUN_OPT_DEVICE:
        if (parse_long(arg, 0, 1 << 20, &o->device) < 0)
            return cli_usage_error("run", "--device wants a GPU index, not '%s'", arg);
        break;
    case RUN_OPT_DEADLINE:
        if (parse_long(arg, 1, 1L << 40, &o->deadline) < 0)
            return cli_usage_error("run", "--deadline wants milliseconds, not '%s'", arg);
        break;
    case RUN_OPT_TIME_LIMIT:
        if (parse_long(arg, 1, 1L << 40, &o->time_limit) < 0)
            return cli_usage_error("run", "--time-limit wants milliseconds, not '%s'", arg);
        break;
    default:
        if (!cli_common_option(cli, opt)) return cli_usage_error("run", "unknown option");
    }
    return CLI_EXIT_OK;
}

/* Parses run's options, which may come before or after OP, into o: the spec is built once OP
 * is known. Returns CLI_EXIT_OK to go on, or the exit status to return; *ret_help is true when
 * --help was printed. */
static int run_parse_options(cli_t *cli, int argc, char **argv, run_options_t *o, bool *ret_help)
{
    static const char usage[] =
        "usage: gpujob run OP [-p KEY=VALUE]... [-i NAME=FILE.npy]... [-o NAME=FILE.npy]...\n"
        "                  [--wait] [--timeout S] [--priority N] [--device N] [--deadline MS]\n"
        "                  [--time-limit MS]\n"
        "Submits one job. Without --wait or -o, prints its id and returns at once.\n"
        "  -p, --param KEY=VALUE   an op parameter; VALUE is JSON when it parses (2.5, true,\n"
        "                          [1,1]), else a string\n"
        "  -i, --input NAME=FILE   an input tensor from a .npy file, or NAME=buffer:ID for an\n"
        "                          uploaded buffer\n"
        "  -o, --output NAME=FILE  write output NAME to a .npy file (implies --wait)\n"
        "  -w, --wait              wait until the job is final; exit 1 if it failed\n"
        "  --timeout S             give up waiting after S seconds (exit 5)\n"
        "  --priority N            -100..100, higher runs first (default 0)\n"
        "  --device N              run on GPU N\n"
        "  --deadline MS           fail the job if it has not started within MS ms\n"
        "  --time-limit MS         fail the job if it runs longer than MS ms (time_limit)\n";
    static const struct option opts[] = {
        COMMON_LONG_OPTIONS,
        {"param", required_argument, NULL, 'p'},
        {"input", required_argument, NULL, 'i'},
        {"output", required_argument, NULL, 'o'},
        {"wait", no_argument, NULL, 'w'},
        {"timeout", required_argument, NULL, RUN_OPT_TIMEOUT},
        {"priority", required_argument, NULL, RUN_OPT_PRIORITY},
        {"device", required_argument, NULL, RUN_OPT_DEVICE},
        {"deadline", required_argument, NULL, RUN_OPT_DEADLINE},
        {"time-limit", required_argument, NULL, RUN_OPT_TIME_LIMIT},
        {0}};
    int opt;
    *ret_help = false;
    while ((opt = getopt_long(argc, argv, "hp:i:o:w", opts, NULL)) != -1) {
        if (opt == 'h') {
            fputs(usage, stdout);
            *ret_help = true;
            return CLI_EXIT_OK;
        }
        int status = run_apply_option(cli, opt, optarg, o);
        if (status) return status;
    }
    if (optind >= argc) return cli_usage_error("run", "missing OP (see 'gpujob info' for the ops)");
    if (optind + 1 < argc)
        return cli_usage_error("run", "unexpected argument '%s'", argv[optind + 1]);
    return CLI_EXIT_OK;
}

/* Puts the parameters, inputs and placement of o into spec. CLI_EXIT_OK, or the exit status of
 * the first parameter or input that is refused. */
static int run_fill_spec(gpujob_spec_t *spec, const run_options_t *o)
{
    int status = CLI_EXIT_OK;
    for (int k = 0; status == CLI_EXIT_OK && k < o->np; k++)
        if (add_param(spec, o->params[k]) < 0)
            status = cli_usage_error("run", "-p wants KEY=VALUE, not '%s'", o->params[k]);
    for (int k = 0; status == CLI_EXIT_OK && k < o->ni; k++)
        status = add_input(spec, o->inputs[k]);
    if (o->has_priority) gpujob_spec_set_priority(spec, (int)o->priority);
    gpujob_spec_set_device(spec, (int)o->device);
    gpujob_spec_set_deadline_ms(spec, o->deadline);
    gpujob_spec_set_time_limit_ms(spec, o->time_limit);
    return status;
}

/* Prints a final job, and saves the outputs -o asked for when it succeeded. The exit status. */
static int run_report_outcome(cli_t *cli, const gpujob_job_t *done, const run_options_t *o)
{
    if (cli->json)
        cli_print_json_text(gpujob_job_json(done));
    else
        print_job_outcome(done);
    int status = job_outcome_status(done);
    for (int k = 0; status == CLI_EXIT_OK && k < o->no; k++)
        status =
            save_output(cli, gpujob_job_id(done), o->outputs[k].name, o->outputs[k].path, false);
    return status;
}

/* Submits spec. Without --wait prints the job and returns; with it, waits until the job is
 * final and reports its outcome. The exit status. */
static int run_submit(cli_t *cli, gpujob_spec_t *spec, const run_options_t *o)
{
    /* With --wait the submission itself waits a little: a short job's result comes back in
     * that one request. */
    double first_wait = !o->wait                                  ? -1
                        : o->timeout_s >= 0 && o->timeout_s < 0.5 ? o->timeout_s
                                                                  : 0.5;
    gpujob_job_t *job = NULL, *done = NULL;
    int r = gpujob_submit_wait(cli->client, spec, first_wait, &job);
    if (r < 0) return cli_api_error(cli, "submit", r);
    int status = CLI_EXIT_OK;
    if (!o->wait) {
        if (cli->json)
            cli_print_json_text(gpujob_job_json(job));
        else
            printf("%s\n", gpujob_job_id(job));
    } else if (gpujob_state_is_final(gpujob_job_state(job))) {
        done = job;
        job = NULL;
    } else {
        status = wait_job(cli, gpujob_job_id(job),
                          o->timeout_s < 0 ? -1 : o->timeout_s - first_wait, &done);
        if (status == CLI_EXIT_TIMEOUT) printf("%s\n", gpujob_job_id(job));
    }
    if (status == CLI_EXIT_OK && o->wait) status = run_report_outcome(cli, done, o);
    gpujob_job_free(done);
    gpujob_job_free(job);
    return status;
}

static int cmd_run(cli_t *cli, int argc, char **argv)
{
    const char *params[argc], *inputs[argc];
    output_request_t outputs[argc];
    run_options_t o = {
        .params = params, .inputs = inputs, .outputs = outputs, .timeout_s = -1, .device = -1};
    bool help;
    int status = run_parse_options(cli, argc, argv, &o, &help);
    if (status || help) return status;

    gpujob_spec_t *spec = NULL;
    if (gpujob_spec_new(argv[optind], &spec) < 0) return cli_usage_error("run", "bad OP");
    status = run_fill_spec(spec, &o);
    if (status == CLI_EXIT_OK) status = cli_connect(cli);
    if (status == CLI_EXIT_OK) status = run_submit(cli, spec, &o);
    gpujob_spec_free(spec);
    return status;
}

/* Parses the options of a command that takes exactly nargs positional arguments. */
static int parse_simple(cli_t *cli, const char *cmd, const char *usage, int argc, char **argv,
                        int nargs, bool *ret_help)
{
    static const struct option opts[] = {COMMON_LONG_OPTIONS, {0}};
    int opt;
    *ret_help = false;
    while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (opt == 'h') {
            fputs(usage, stdout);
            *ret_help = true;
            return CLI_EXIT_OK;
        }
        if (!cli_common_option(cli, opt)) return cli_usage_error(cmd, "unknown option");
    }
    if (argc - optind < nargs) return cli_usage_error(cmd, "missing argument");
    if (argc - optind > nargs)
        return cli_usage_error(cmd, "unexpected argument '%s'", argv[optind + nargs]);
    return cli_connect(cli);
}

static int cmd_status(cli_t *cli, int argc, char **argv)
{
    static const char usage[] = "usage: gpujob status ID [--json]\n"
                                "Shows a job: state (and, queued, why it waits and how many\n"
                                "jobs will run before it), times, error and outputs.\n";
    bool help;
    int status = parse_simple(cli, "status", usage, argc, argv, 1, &help);
    if (status || help) return status;
    gpujob_job_t *job = NULL;
    int r = gpujob_get(cli->client, argv[optind], &job);
    if (r < 0) return cli_api_error(cli, "status", r);
    if (cli->json)
        cli_print_json_text(gpujob_job_json(job));
    else
        print_job(job);
    gpujob_job_free(job);
    return CLI_EXIT_OK;
}

static int cmd_wait(cli_t *cli, int argc, char **argv)
{
    static const char usage[] =
        "usage: gpujob wait ID [--timeout S] [--json]\n"
        "Waits until the job is final. Exit 0 if it succeeded, 1 if it failed or was\n"
        "cancelled, 5 if it was still queued or running after --timeout seconds.\n";
    enum { OPT_TIMEOUT = 2000 };
    static const struct option opts[] = {
        COMMON_LONG_OPTIONS, {"timeout", required_argument, NULL, OPT_TIMEOUT}, {0}};
    double timeout_s = -1;
    int opt;
    while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (opt == 'h') return fputs(usage, stdout), CLI_EXIT_OK;
        if (opt == OPT_TIMEOUT) {
            if (parse_seconds(optarg, &timeout_s) < 0)
                return cli_usage_error("wait", "--timeout wants seconds, not '%s'", optarg);
        } else if (!cli_common_option(cli, opt)) {
            return cli_usage_error("wait", "unknown option");
        }
    }
    if (argc - optind != 1) return cli_usage_error("wait", "wants one job ID");
    int status = cli_connect(cli);
    gpujob_job_t *job = NULL;
    if (status == CLI_EXIT_OK) status = wait_job(cli, argv[optind], timeout_s, &job);
    if (status != CLI_EXIT_OK) return status;
    if (cli->json)
        cli_print_json_text(gpujob_job_json(job));
    else
        print_job_outcome(job);
    status = job_outcome_status(job);
    gpujob_job_free(job);
    return status;
}

/* Parses ls's options into q and *all. Returns CLI_EXIT_OK to go on, or the exit status to
 * return; *ret_help is true when --help was printed. */
static int ls_parse_options(cli_t *cli, int argc, char **argv, gpujob_list_query_t *q, bool *all,
                            bool *ret_help)
{
    static const char usage[] =
        "usage: gpujob ls [--state STATE] [--op OP] [--limit N] [--all] [--json]\n"
        "Lists your jobs in submission order: one page of --limit (default 100), or all with "
        "--all.\n"
        "STATE is queued, running, succeeded, failed or cancelled.\n";
    enum { OPT_STATE = 2000, OPT_OP, OPT_LIMIT, OPT_ALL };
    static const struct option opts[] = {COMMON_LONG_OPTIONS,
                                         {"state", required_argument, NULL, OPT_STATE},
                                         {"op", required_argument, NULL, OPT_OP},
                                         {"limit", required_argument, NULL, OPT_LIMIT},
                                         {"all", no_argument, NULL, OPT_ALL},
                                         {0}};
    long limit = 0;
    int opt;
    *ret_help = false;
    while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        gpujob_state_t s;
        switch (opt) {
        case 'h':
            fputs(usage, stdout);
            *ret_help = true;
            return CLI_EXIT_OK;
        case OPT_STATE:
            if (gpujob_state_parse(optarg, &s) < 0)
                return cli_usage_error("ls", "unknown state '%s'", optarg);
            q->state = optarg;
            break;
        case OPT_OP:
            q->op = optarg;
            break;
        case OPT_LIMIT:
            if (parse_long(optarg, 1, 1000, &limit) < 0)
                return cli_usage_error("ls", "--limit wants 1..1000, not '%s'", optarg);
            q->limit = (int)limit;
            break;
        case OPT_ALL:
            *all = true;
            break;
        default:
            if (!cli_common_option(cli, opt)) return cli_usage_error("ls", "unknown option");
        }
    }
    if (optind != argc) return cli_usage_error("ls", "unexpected argument '%s'", argv[optind]);
    return CLI_EXIT_OK;
}

/* Adds one job as a row of the table and as an element of the JSON array. */
static void ls_add_job(cli_table_t *t, json_t *jobs, const gpujob_job_t *job)
{
    char prio[16], queued[64], ran[64];
    snprintf(prio, sizeof prio, "%d", gpujob_job_priority(job));
    const char *row[] = {gpujob_job_id(job),
                         gpujob_job_op(job),
                         gpujob_state_name(gpujob_job_state(job)),
                         prio,
                         gpujob_job_created_at(job),
                         cli_duration(gpujob_job_queue_ms(job), queued, 64),
                         cli_duration(gpujob_job_run_ms(job), ran, 64)};
    cli_table_add(t, row);
    json_array_append_new(jobs, json_loads(gpujob_job_json(job), 0, NULL));
}

/* Fetches one page of the listing, or with all every page, into t and jobs. CLI_EXIT_OK and in
 * *ret_cursor the cursor of the page after the last one fetched (NULL when there is none; the
 * caller frees it), or the exit status of the request that failed. */
static int ls_fetch(cli_t *cli, gpujob_list_query_t *q, bool all, cli_table_t *t, json_t *jobs,
                    char **ret_cursor)
{
    char *cursor = NULL;
    do {
        gpujob_job_list_t *list = NULL;
        q->after = cursor;
        int r = gpujob_list(cli->client, q, &list);
        if (r < 0) {
            free(cursor);
            return cli_api_error(cli, "ls", r);
        }
        for (size_t i = 0; i < gpujob_job_list_count(list); i++)
            ls_add_job(t, jobs, gpujob_job_list_at(list, i));
        const char *next = gpujob_job_list_next(list);
        free(cursor);
        cursor = next ? strdup(next) : NULL;
        gpujob_job_list_free(list);
    } while (all && cursor);
    *ret_cursor = cursor;
    return CLI_EXIT_OK;
}

static int cmd_ls(cli_t *cli, int argc, char **argv)
{
    gpujob_list_query_t q = {0};
    bool all = false, help;
    int status = ls_parse_options(cli, argc, argv, &q, &all, &help);
    if (status || help) return status;
    status = cli_connect(cli);
    if (status) return status;

    cli_table_t *t = cli_table_new(7);
    const char *head[] = {"ID", "OP", "STATE", "PRIO", "CREATED", "QUEUED", "RAN"};
    cli_table_add(t, head);
    json_t *jobs = json_array();
    char *cursor = NULL;
    status = ls_fetch(cli, &q, all, t, jobs, &cursor);
    if (status == CLI_EXIT_OK) {
        if (cli->json) {
            cli_print_json(json_pack("{s:O, s:o}", "jobs", jobs, "next",
                                     cursor ? json_string(cursor) : json_null()));
        } else {
            cli_table_print(t);
            if (cursor) fprintf(stderr, "(more: gpujob ls --all, or --limit)\n");
        }
    }
    free(cursor);
    json_decref(jobs);
    cli_table_free(t);
    return status;
}

static int cmd_cancel(cli_t *cli, int argc, char **argv)
{
    static const char usage[] =
        "usage: gpujob cancel ID [--json]\n"
        "Cancels a job and prints what became of it: dequeued (it never runs), stopped (its\n"
        "CPU worker stops it) or dropped (it runs to its end on the GPU, its result dropped).\n"
        "A job that is already final cannot be cancelled (exit 3).\n";
    bool help;
    int status = parse_simple(cli, "cancel", usage, argc, argv, 1, &help);
    if (status || help) return status;
    gpujob_job_t *job = NULL;
    int r = gpujob_cancel(cli->client, argv[optind], &job);
    if (r < 0) return cli_api_error(cli, "cancel", r);
    const char *outcome = gpujob_job_cancel_outcome(job);
    if (cli->json)
        cli_print_json_text(gpujob_job_json(job));
    else if (outcome)
        printf("%s %s (%s)\n", gpujob_job_id(job), gpujob_state_name(gpujob_job_state(job)),
               outcome);
    else
        printf("%s %s\n", gpujob_job_id(job), gpujob_state_name(gpujob_job_state(job)));
    gpujob_job_free(job);
    return CLI_EXIT_OK;
}

static int cmd_out(cli_t *cli, int argc, char **argv)
{
    static const char usage[] =
        "usage: gpujob out ID NAME -o FILE [--raw]\n"
        "Downloads output NAME of a succeeded job as a .npy file (FILE '-' for stdout).\n"
        "  --raw   the tensor's raw little-endian bytes instead (bf16 has no .npy form)\n";
    enum { OPT_RAW = 2000 };
    static const struct option opts[] = {COMMON_LONG_OPTIONS,
                                         {"output", required_argument, NULL, 'o'},
                                         {"raw", no_argument, NULL, OPT_RAW},
                                         {0}};
    const char *path = NULL;
    bool raw = false;
    int opt;
    while ((opt = getopt_long(argc, argv, "ho:", opts, NULL)) != -1) {
        if (opt == 'h') return fputs(usage, stdout), CLI_EXIT_OK;
        if (opt == 'o')
            path = optarg;
        else if (opt == OPT_RAW)
            raw = true;
        else if (!cli_common_option(cli, opt))
            return cli_usage_error("out", "unknown option");
    }
    if (argc - optind != 2) return cli_usage_error("out", "wants a job ID and an output NAME");
    if (!path) return cli_usage_error("out", "missing -o FILE");
    int status = cli_connect(cli);
    if (status == CLI_EXIT_OK) status = save_output(cli, argv[optind], argv[optind + 1], path, raw);
    return status;
}

static json_t *buffer_json(const gpujob_buffer_t *b)
{
    json_t *shape = json_array();
    for (int i = 0; i < b->ndim; i++)
        json_array_append_new(shape, json_integer(b->shape[i]));
    return json_pack("{s:s, s:s, s:o, s:I, s:b, s:s}", "id", b->id, "dtype",
                     gpujob_dtype_name(b->dtype), "shape", shape, "bytes", (json_int_t)b->bytes,
                     "resident", b->resident, "created_at", b->created_at);
}

static int cmd_buf(cli_t *cli, int argc, char **argv)
{
    static const char usage[] =
        "usage: gpujob buf put FILE.npy [--resident] [--json]\n"
        "       gpujob buf keep JOB OUTPUT [--resident] [--json]\n"
        "       gpujob buf get ID [--json]\n"
        "       gpujob buf rm ID\n"
        "Uploads a tensor the daemon keeps for later jobs (run -i NAME=buffer:ID), keeps a\n"
        "succeeded job's output as one (copied by the daemon, not downloaded), shows one, or\n"
        "deletes one. put and keep print the new buffer's id.\n"
        "  --resident   keep the buffer in device memory across jobs (counts against quota)\n";
    enum { OPT_RESIDENT = 2000 };
    static const struct option opts[] = {
        COMMON_LONG_OPTIONS, {"resident", no_argument, NULL, OPT_RESIDENT}, {0}};
    bool resident = false;
    int opt;
    while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (opt == 'h') return fputs(usage, stdout), CLI_EXIT_OK;
        if (opt == OPT_RESIDENT)
            resident = true;
        else if (!cli_common_option(cli, opt))
            return cli_usage_error("buf", "unknown option");
    }
    const char *verb = optind < argc ? argv[optind] : "";
    bool keep = strcmp(verb, "keep") == 0;
    if (argc - optind != (keep ? 3 : 2))
        return cli_usage_error("buf", "wants put FILE, keep JOB OUTPUT, get ID or rm ID");
    const char *arg = argv[optind + 1];
    if (strcmp(verb, "put") && !keep && strcmp(verb, "get") && strcmp(verb, "rm"))
        return cli_usage_error("buf", "unknown action '%s' (put, keep, get or rm)", verb);
    int status = cli_connect(cli);
    if (status) return status;
    gpujob_buffer_t b;
    int r;
    if (strcmp(verb, "rm") == 0) {
        if ((r = gpujob_buffer_delete(cli->client, arg)) < 0)
            return cli_api_error(cli, "buf rm", r);
        if (cli->json)
            cli_print_json(json_pack("{s:s, s:b}", "id", arg, "deleted", 1));
        else
            printf("deleted %s\n", arg);
        return CLI_EXIT_OK;
    }
    if (strcmp(verb, "get") == 0) {
        if ((r = gpujob_buffer_get(cli->client, arg, &b)) < 0)
            return cli_api_error(cli, "buf get", r);
        if (cli->json) {
            cli_print_json(buffer_json(&b));
        } else {
            char shape[160], size[64];
            printf("id:        %s\n", b.id);
            printf("tensor:    %s %s (%s)\n", gpujob_dtype_name(b.dtype),
                   cli_shape(b.ndim, b.shape, shape, sizeof shape), cli_size(b.bytes, size, 64));
            printf("resident:  %s\n", b.resident ? "yes" : "no");
            printf("created:   %s\n", b.created_at[0] ? b.created_at : "-");
        }
        return CLI_EXIT_OK;
    }
    if (keep) {
        r = gpujob_buffer_keep(cli->client, arg, argv[optind + 2], resident, &b);
        if (r < 0) return cli_api_error(cli, "buf keep", r);
    } else {
        r = gpujob_buffer_put_file(cli->client, arg, resident, &b);
        /* A file that cannot be read or parsed is the caller's, not the daemon's, error. */
        if (r < 0 && gpujob_http_status(cli->client) == 0 && r != -ECONNREFUSED &&
            r != -ECONNRESET && r != -ETIMEDOUT && r != -EIO) {
            fprintf(stderr, "gpujob buf put: %s\n", gpujob_errmsg(cli->client));
            return CLI_EXIT_USAGE;
        }
        if (r < 0) return cli_api_error(cli, "buf put", r);
    }
    if (cli->json)
        cli_print_json(buffer_json(&b));
    else
        printf("%s\n", b.id);
    return CLI_EXIT_OK;
}

static const struct command {
    const char *name;
    int (*run)(cli_t *cli, int argc, char **argv);
} commands[] = {
    {"info", cmd_info},       {"run", cmd_run},         {"status", cmd_status}, {"wait", cmd_wait},
    {"ls", cmd_ls},           {"cancel", cmd_cancel},   {"out", cmd_out},       {"buf", cmd_buf},
    {"usage", cli_cmd_usage}, {"token", cli_cmd_token},
};

int main(int argc, char **argv)
{
    cli_t cli = {0};
    static const struct option opts[] = {
        COMMON_LONG_OPTIONS, {"version", no_argument, NULL, OPT_VERSION}, {0}};
    int opt;
    /* '+': stop at the command; its own options are parsed by the command. */
    while ((opt = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
        if (opt == 'h') return fputs(main_usage, stdout), CLI_EXIT_OK;
        if (opt == OPT_VERSION) return printf("gpujob %s\n", GPUJOB_CLIENT_VERSION), CLI_EXIT_OK;
        if (!cli_common_option(&cli, opt)) return cli_usage_error(NULL, "unknown option");
    }
    if (optind >= argc) return cli_usage_error(NULL, "missing COMMAND");
    const char *name = argv[optind];
    if (strcmp(name, "help") == 0) return fputs(main_usage, stdout), CLI_EXIT_OK;
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(commands[i].name, name) != 0) continue;
        int sub_argc = argc - optind;
        char **sub_argv = argv + optind;
        optind = 0; /* glibc: restart getopt from scratch for the command's arguments */
        int status = commands[i].run(&cli, sub_argc, sub_argv);
        gpujob_client_free(cli.client);
        return status;
    }
    return cli_usage_error(NULL, "unknown command '%s'", name);
}
