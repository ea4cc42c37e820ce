/* The configuration loader (daemon/util/config.h) on arbitrary INI text: config_load_file
 * reads it from a file, as gpujobd does at start, then the relations between keys are checked.
 * A refusal must say why in err.
 *
 * The file is a memfd, rewritten for each input and opened by its /proc path: a file on disk
 * would make the fuzzer as slow as the disk. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "daemon/util/config.h"

static int fd = -1;
static char path[64];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (fd < 0) {
        fd = memfd_create("gpujobd.conf", MFD_CLOEXEC);
        if (fd < 0) __builtin_trap();
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) != 0 || (size && pwrite(fd, data, size, 0) != (ssize_t)size))
        __builtin_trap();

    config_t cfg;
    config_defaults(&cfg);
    char err[512] = "";
    int r = config_load_file(&cfg, path, err, sizeof err);
    if (r == 0) {
        r = config_validate(&cfg, err, sizeof err);
        char host[256];
        int port;
        if (r == 0 && config_listen_addr(&cfg, host, sizeof host, &port) != 0) __builtin_trap();
    }
    if (r != 0 && !err[0]) __builtin_trap();
    return 0;
}
