/* Picks and creates the executor named by cfg->backend: "cuda" when built with CUDA and a GPU
 * is present (for "auto"), else "cpu". Logs which backend runs. */
#pragma once

#include "config.h"
#include "executor.h"

int backend_new(const config_t *cfg, executor_t **ret);
