/* Object ids and the wall clock they are made from. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#define ID_SIZE 32 /* buffer size for an id, NUL included */

/* New ids: "j" or "b" followed by 24 lowercase hex digits: 12 of milliseconds since the epoch,
 * 4 of a per-process sequence and 8 random, so that ids sort by creation time (the cursor of
 * GET /v1/jobs relies on it). Thread-safe. */
void id_new(char prefix, char ret[ID_SIZE]);
/* A request's id, 16 lowercase hex digits: a per-process random start mixed with a sequence
 * through a bijection (splitmix64's finaliser), so that no two requests of a process share
 * one and ids do not reveal how many came before. Thread-safe. */
#define REQUEST_ID_SIZE 17
void id_request(char ret[REQUEST_ID_SIZE]);
/* True when s has the shape of an id with that prefix. */
bool id_valid(char prefix, const char *s);

/* Wall-clock time in µs since the epoch. */
int64_t now_us(void);
/* Monotonic time in µs (CLOCK_MONOTONIC): for durations and deadlines, which a step of the
 * wall clock must not move. */
int64_t mono_us(void);
