#include "backend.h"

#include <errno.h>
#include <string.h>

#include "log.h"

int backend_new(const config_t *cfg, executor_t **ret)
{
    if (strcmp(cfg->backend, "cuda") == 0) {
        /* The CUDA device workers are the next step (DESIGN §1, the CUDA backend issue); until
         * they land, asking for them is an error rather than a silent fallback. */
        log_error("backend 'cuda' was asked for, but this build has no CUDA executor yet");
        return -EOPNOTSUPP;
    }
    if (strcmp(cfg->backend, "auto") == 0)
        log_info("backend auto: no CUDA executor in this build yet, using the CPU");
    return exec_cpu_new(cfg, ret);
}
