#include "id.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

void id_new(char prefix, char ret[ID_SIZE])
{
    static atomic_uint sequence;
    uint32_t rnd = 0;
    if (getrandom(&rnd, sizeof rnd, 0) != sizeof rnd) rnd = (uint32_t)now_us() * 2654435761u;
    uint64_t ms = (uint64_t)(now_us() / 1000) & 0xffffffffffffULL;
    unsigned seq = atomic_fetch_add(&sequence, 1) & 0xffff;
    snprintf(ret, ID_SIZE, "%c%012" PRIx64 "%04x%08" PRIx32, prefix, ms, seq, rnd);
}

void id_request(char ret[REQUEST_ID_SIZE])
{
    static atomic_uint_fast64_t sequence;
    static atomic_uint_fast64_t start; /* 0 until drawn; a draw of 0 is harmless */
    uint64_t base = atomic_load(&start);
    if (base == 0) {
        if (getrandom(&base, sizeof base, 0) != sizeof base) base = (uint64_t)now_us();
        uint64_t expected = 0;
        if (!atomic_compare_exchange_strong(&start, &expected, base)) base = expected;
    }
    uint64_t z = base + atomic_fetch_add(&sequence, 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    snprintf(ret, REQUEST_ID_SIZE, "%016" PRIx64, z);
}

bool id_valid(char prefix, const char *s)
{
    if (!s || s[0] != prefix || strlen(s) != 25) return false;
    for (const char *p = s + 1; *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'))) return false;
    return true;
}
