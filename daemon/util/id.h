/* Object ids and the wall clock they are made from. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#define ID_SIZE 32 /* buffer size for an id, NUL included */

/* New ids: "j" or "b" followed by 24 lowercase hex digits: 12 of milliseconds since the epoch,
 * 4 of a per-process sequence and 8 random, so that ids sort by creation time (the cursor of
 * GET /v1/jobs relies on it). Thread-safe. */
void id_new(char prefix, char ret[ID_SIZE]);
/* True when s has the shape of an id with that prefix. */
bool id_valid(char prefix, const char *s);

/* Wall-clock time in µs since the epoch. */
int64_t now_us(void);
/* The monotonic clock in µs (CLOCK_MONOTONIC): for durations, which a step of the wall clock
 * must not stretch or shrink. */
int64_t mono_us(void);
