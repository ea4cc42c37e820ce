/* Backend selection: the CUDA backend where it is built and a GPU is usable, else the CPU's. */
#include <errno.h>
#include <string.h>

#include "daemon/util/log.h"
#include "executor.h"

int backend_new(const config_t *cfg, const exec_blob_reader_t *blobs, executor_t **ret)
{
    bool want_cuda = strcmp(cfg->backend, "cuda") == 0;
    if (strcmp(cfg->backend, "cpu") != 0) {
#ifdef GPUJOB_WITH_CUDA
        if (want_cuda || cuda_device_count() > 0) {
            int r = exec_cuda_new(cfg, blobs, ret);
            if (r >= 0 || want_cuda) {
                if (r >= 0)
                    log_info("backend: cuda");
                else
                    log_error("backend 'cuda': no usable GPU: %s", strerror(-r));
                return r;
            }
            log_warn("backend auto: the GPUs could not be used (%s), using the CPU", strerror(-r));
        } else {
            log_info("backend auto: no GPU found, using the CPU");
        }
#else
        if (want_cuda) {
            log_error("backend 'cuda': this gpujobd was built without CUDA");
            return -EOPNOTSUPP;
        }
        log_info("backend auto: built without CUDA, using the CPU");
#endif
    }
    return exec_cpu_new(cfg, blobs, ret);
}
