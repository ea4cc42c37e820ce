/* The configuration's key table as the three files that implement config.h share it: config.c
 * (the table, its values, the INI file, reloads), config_policy.c (the [user.NAME] and
 * [group.NAME] sections) and config_cli.c (the command line and --help). The rest of the
 * daemon uses config.h alone. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"

typedef enum config_type {
    CONFIG_STRING, /* char[]: length bounded by the field's size, optional check() */
    CONFIG_ENUM,   /* char[]: one of choices, stored in its canonical spelling */
    CONFIG_BOOL,   /* bool */
    CONFIG_INT,    /* int in [min, max], or 0 when zero_is_off; durations are ints in the unit
                      their name ends with */
    CONFIG_SIZE,   /* uint64_t bytes in [umin, umax], with an optional K/M/G/T suffix */
    CONFIG_HOURS,  /* uint64_t µs in [0, umax], written as a number of hours (budget.h) */
} config_type_t;

/* Checks a string value; 0, or -EINVAL with the reason (no key name) in reason. */
typedef int (*config_check_fn)(const char *value, char *reason, size_t reason_size);

typedef struct config_key {
    const char *section;
    const char *name;
    config_type_t type;
    size_t offset; /* of the field in config_t */
    size_t size;   /* of the field: a string's capacity including its NUL */
    int64_t min, max;
    bool zero_is_off;  /* CONFIG_INT: 0 is also allowed, and turns the feature off */
    bool power_of_two; /* CONFIG_INT: only powers of two in [min, max] */
    uint64_t umin, umax;
    const char *const *choices; /* CONFIG_ENUM: NULL-terminated */
    config_check_fn check;      /* CONFIG_STRING: NULL for any string that fits */
    const char *def;            /* the default, parsed like a value from the file */
    const char *help;
} config_key_t;
/* The table (config.c), in the order the --help text lists it, and its length. */
extern const config_key_t config_keys[];
extern const size_t config_key_count;

/* Longest part of a user-supplied value quoted back in a message. */
#define CONFIG_QUOTE_MAX 128

/* The field of cfg that key describes (borrowed). */
static inline void *config_key_field(config_t *cfg, const config_key_t *key)
{
    return (char *)cfg + key->offset;
}

static inline const void *config_key_field_const(const config_t *cfg, const config_key_t *key)
{
    return (const char *)cfg + key->offset;
}

/* The key [section] name of the table, or NULL. */
const config_key_t *config_key_find(const char *section, const char *name);

/* 0, -EINVAL when value is not an integer, or -ERANGE when it is outside [min, max]; reason
 * then says why. */
int config_parse_int(const char *value, int64_t min, int64_t max, int64_t *ret, char *reason,
                     size_t reason_size);
/* A whole number of bytes with an optional binary suffix: K and KiB are both 1024, M and MiB
 * 1024^2, and so on; a space may separate the number from its suffix. 0, or -EINVAL with the
 * reason. */
int config_parse_size(const char *value, uint64_t min, uint64_t max, uint64_t *ret, char *reason,
                      size_t reason_size);

/* snprintf into err, tolerating a NULL or empty buffer so that callers may pass none. */
void config_err_printf(char *err, size_t err_size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Sets key name of a [user.NAME] or [group.NAME] section in cfg (config_policy.c). -ENOENT
 * when section is not one (the key table then decides), -EINVAL with the reason otherwise;
 * refuse_twice refuses a key the section already set, as a file may set each key once; line
 * is where the section appears in the file (0 for none). */
int config_policy_set(config_t *cfg, const char *section, const char *name, const char *value,
                      int line, bool refuse_twice, char *reason, size_t reason_size);
