#include "log.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define LOG_LINE_MAX 2048

log_level_t log_max_level = LOG_INFO;
static log_format_t log_format = LOG_FORMAT_TEXT;

static const char *const level_names[] = {"error", "warn", "info", "debug"};
static const char *const format_names[] = {"text", "json"};

/* The index of name in names (n of them), or -EINVAL. */
static int name_index(const char *const *names, int n, const char *name)
{
    for (int i = 0; name && i < n; i++)
        if (strcmp(name, names[i]) == 0) return i;
    return -EINVAL;
}

int log_level_parse(const char *name, log_level_t *ret)
{
    int i = name_index(level_names, LOG_DEBUG + 1, name);
    if (i < 0) return i;
    *ret = (log_level_t)i;
    return 0;
}

void log_set_level(log_level_t level)
{
    log_max_level = level;
}

int log_format_parse(const char *name, log_format_t *ret)
{
    int i = name_index(format_names, LOG_FORMAT_JSON + 1, name);
    if (i < 0) return i;
    *ret = (log_format_t)i;
    return 0;
}

void log_set_format(log_format_t format)
{
    log_format = format;
}

/* A line being built: text appended up to the buffer's end, the rest cut. */
typedef struct log_line {
    char buf[LOG_LINE_MAX];
    size_t len;
} log_line_t;

static void line_put(log_line_t *l, const char *s, size_t n)
{
    size_t room = sizeof l->buf - 3 - l->len; /* keeps room for a brace and the newline */
    if (n > room) n = room;
    memcpy(l->buf + l->len, s, n);
    l->len += n;
}

static void line_printf(log_line_t *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void line_printf(log_line_t *l, const char *fmt, ...)
{
    size_t room = sizeof l->buf - 3 - l->len;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(l->buf + l->len, room + 1, fmt, ap);
    va_end(ap);
    if (m > 0) l->len += (size_t)m < room ? (size_t)m : room;
}

/* s as a JSON string, quotes included: control characters escaped, other bytes as they are
 * (the daemon's messages and the names they quote are UTF-8 or ASCII). A string too long for
 * the line is cut where a whole escape still fits before the closing quote and brace, so that
 * the line still parses. */
static void line_json_string(log_line_t *l, const char *s)
{
    line_put(l, "\"", 1);
    for (; *s && l->len < sizeof l->buf - 12; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            char esc[2] = {'\\', (char)c};
            line_put(l, esc, 2);
        } else if (c < 0x20 || c == 0x7f) {
            line_printf(l, "\\u%04x", c);
        } else {
            line_put(l, (const char *)&c, 1);
        }
    }
    line_put(l, "\"", 1);
}

/* The line's start: the time and the level, in either format. */
static void line_begin(log_line_t *l, log_level_t level)
{
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    char stamp[32];
    size_t n = strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(stamp + n, sizeof stamp - n, ".%03ldZ", ts.tv_nsec / 1000000);
    l->len = 0;
    if (log_format == LOG_FORMAT_JSON)
        line_printf(l, "{\"ts\":\"%s\",\"level\":\"%s\",\"msg\":", stamp, level_names[level]);
    else
        line_printf(l, "%s %s ", stamp, level_names[level]);
}

/* Ends the line and writes it in one call, which keeps lines from different threads whole. */
static void line_end(log_line_t *l)
{
    if (log_format == LOG_FORMAT_JSON) l->buf[l->len++] = '}';
    l->buf[l->len++] = '\n';
    fwrite(l->buf, 1, l->len, stderr);
}

void log_write(log_level_t level, const char *fmt, ...)
{
    log_line_t l;
    line_begin(&l, level);
    char msg[LOG_LINE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (log_format == LOG_FORMAT_JSON)
        line_json_string(&l, msg);
    else
        line_put(&l, msg, strlen(msg));
    line_end(&l);
}

/* Whether a text-format value must be quoted to stay one token of its line. */
static bool text_needs_quotes(const char *s)
{
    if (!*s) return true;
    for (; *s; s++)
        if ((unsigned char)*s <= 0x20 || *s == '"' || *s == '=' || *s == 0x7f) return true;
    return false;
}

void log_write_fields(log_level_t level, const char *msg, const log_field_t *fields, int n)
{
    if (level > log_max_level) return;
    log_line_t l;
    line_begin(&l, level);
    bool json = log_format == LOG_FORMAT_JSON;
    if (json)
        line_json_string(&l, msg);
    else
        line_put(&l, msg, strlen(msg));
    for (int i = 0; i < n; i++) {
        const log_field_t *f = &fields[i];
        if (json) {
            line_put(&l, ",", 1);
            line_json_string(&l, f->key);
            line_put(&l, ":", 1);
        } else {
            line_printf(&l, " %s=", f->key);
        }
        if (!f->str)
            line_printf(&l, "%" PRId64, f->num);
        else if (json || text_needs_quotes(f->str))
            line_json_string(&l, f->str);
        else
            line_put(&l, f->str, strlen(f->str));
    }
    line_end(&l);
}
