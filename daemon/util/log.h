/* One line per event, to stderr: "2026-11-30T09:53:36.123Z info sched: message".
 * The macros test the level before evaluating their arguments. */
#pragma once

#include <errno.h>

typedef enum log_level { LOG_ERROR, LOG_WARN, LOG_INFO, LOG_DEBUG } log_level_t;

extern log_level_t log_max_level;

/* "error", "warn", "info", "debug" -> level; 0 or -EINVAL. */
int log_level_parse(const char *name, log_level_t *ret);
void log_set_level(log_level_t level);
void log_write(log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_at(level, ...) ((level) <= log_max_level ? log_write((level), __VA_ARGS__) : (void)0)
#define log_error(...) log_at(LOG_ERROR, __VA_ARGS__)
#define log_warn(...) log_at(LOG_WARN, __VA_ARGS__)
#define log_info(...) log_at(LOG_INFO, __VA_ARGS__)
#define log_debug(...) log_at(LOG_DEBUG, __VA_ARGS__)

/* Logs at error level and returns r (a negative errno), systemd-style:
 *   return log_error_errno(r, "Failed to open '%s': %s", path, strerror(-r)); */
#define log_error_errno(r, ...) (log_error(__VA_ARGS__), (r))
