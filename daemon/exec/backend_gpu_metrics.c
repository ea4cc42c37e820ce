/* The GPU gauges' hookup to the CUDA backend: which devices to sample, and the memory of those
 * NVML cannot read, both from the executor's description. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "executor.h"

/* Memory of a device NVML cannot read: what the executor last saw. Only a device's worker
 * calls CUDA on it, so that no other thread ever races a device reset. */
static int described_memory(int index, uint64_t *ret_free, uint64_t *ret_total, void *ud)
{
    executor_t *ex = ud;
    json_t *description = ex->ops->describe(ex);
    int r = -ENODEV;
    size_t i;
    json_t *device;
    json_array_foreach(json_object_get(description, "devices"), i, device)
    {
        if (json_integer_value(json_object_get(device, "index")) != index) continue;
        json_t *free_b = json_object_get(device, "memory_free");
        json_t *total_b = json_object_get(device, "memory_total");
        if (json_is_integer(free_b) && json_is_integer(total_b)) {
            *ret_free = (uint64_t)json_integer_value(free_b);
            *ret_total = (uint64_t)json_integer_value(total_b);
            r = 0;
        }
        break;
    }
    json_decref(description);
    return r;
}

int backend_gpu_metrics_start(const config_t *cfg, executor_t *ex, gpu_metrics_t **ret)
{
    if (cfg->metrics_interval_ms > 0 && strcmp(ex->ops->name, "cuda") == 0) {
        /* The description is the executor's word on which devices it runs, ordinal and UUID,
         * after cfg->devices and any device that failed to start. */
        json_t *description = ex->ops->describe(ex);
        json_t *list = json_object_get(description, "devices");
        size_t n = json_array_size(list);
        gpu_metrics_device_t *devices = calloc(n ? n : 1, sizeof *devices);
        if (!devices) {
            json_decref(description);
            return -ENOMEM;
        }
        int count = 0;
        size_t i;
        json_t *device;
        json_array_foreach(list, i, device)
        {
            json_t *index = json_object_get(device, "index");
            const char *uuid = json_string_value(json_object_get(device, "uuid"));
            if (!json_is_integer(index) || !uuid) continue;
            devices[count].index = (int)json_integer_value(index);
            snprintf(devices[count].uuid, sizeof devices[count].uuid, "%s", uuid);
            count++;
        }
        json_decref(description);
        int r = 0;
        gpu_metrics_t *m = NULL;
        if (count > 0)
            r = gpu_metrics_start(devices, count, cfg->metrics_interval_ms, described_memory, ex,
                                  &m);
        free(devices);
        if (r < 0) return r;
        *ret = m;
        return 0;
    }
    *ret = NULL;
    return 0;
}
