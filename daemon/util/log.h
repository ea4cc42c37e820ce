/* One line per event, to stderr. In text format "2026-11-30T09:53:36.123Z info sched: message";
 * in json format one JSON object a line, {"ts": "...", "level": "info", "msg": "..."} and the
 * event's fields, for log shippers. The macros test the level before evaluating their
 * arguments. */
#pragma once

#include <errno.h>
#include <stdint.h>

typedef enum log_level { LOG_ERROR, LOG_WARN, LOG_INFO, LOG_DEBUG } log_level_t;
typedef enum log_format { LOG_FORMAT_TEXT, LOG_FORMAT_JSON } log_format_t;

extern log_level_t log_max_level;

/* "error", "warn", "info", "debug" -> level; 0 or -EINVAL. */
int log_level_parse(const char *name, log_level_t *ret);
void log_set_level(log_level_t level);
/* "text", "json" -> format; 0 or -EINVAL. */
int log_format_parse(const char *name, log_format_t *ret);
/* Set once at startup, before other threads log. */
void log_set_format(log_format_t format);
void log_write(log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* One named value of a structured event: a string (str not NULL) or an integer. */
typedef struct log_field {
    const char *key;
    const char *str;
    int64_t num;
} log_field_t;

/* An event with fields: in text format "msg key=value ...", in json format the fields as
 * members of the line's object beside ts, level and msg. Strings are escaped in both formats
 * (a text value with a space, quote or control character is written as a JSON string). */
void log_write_fields(log_level_t level, const char *msg, const log_field_t *fields, int n);

#define log_at(level, ...) ((level) <= log_max_level ? log_write((level), __VA_ARGS__) : (void)0)
#define log_error(...) log_at(LOG_ERROR, __VA_ARGS__)
#define log_warn(...) log_at(LOG_WARN, __VA_ARGS__)
#define log_info(...) log_at(LOG_INFO, __VA_ARGS__)
#define log_debug(...) log_at(LOG_DEBUG, __VA_ARGS__)

/* Logs at error level and returns r (a negative errno), systemd-style:
 *   return log_error_errno(r, "Failed to open '%s': %s", path, strerror(-r)); */
#define log_error_errno(r, ...) (log_error(__VA_ARGS__), (r))
