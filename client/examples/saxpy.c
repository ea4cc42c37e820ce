/* saxpy with libgpujob: out = a*x + y on the daemon, checked against the same sum computed
 * here. A complete program: connect, describe the inputs as typed tensors, submit, wait, read
 * the output, and report errors with the library's messages.
 *
 *   cc saxpy.c $(pkg-config --cflags --libs gpujob) -o saxpy
 *   ./saxpy [ADDRESS]        (ADDRESS: http://127.0.0.1:8080, unix:/path; default $GPUJOB_URL
 *                             or the daemon's Unix socket)
 * Exit status: 0 when the result is right, 1 when it is not or the job failed, 2 on errors. */
#include <gpujob.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { N = 1000 };

static int fail(gpujob_client_t *c, const char *what, int r)
{
    fprintf(stderr, "saxpy: %s: %s\n", what, c ? gpujob_errmsg(c) : gpujob_strerror(r));
    return 2;
}

int main(int argc, char **argv)
{
    if (argc > 1 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
        printf("usage: saxpy [ADDRESS]\n");
        return 0;
    }
    gpujob_client_t *c = NULL;
    char err[256] = "";
    int r = gpujob_client_new(argc > 1 ? argv[1] : NULL, &c, err, sizeof err);
    if (r < 0) {
        fprintf(stderr, "saxpy: %s\n", err[0] ? err : gpujob_strerror(r));
        return 2;
    }

    static float x[N], y[N];
    for (int i = 0; i < N; i++) {
        x[i] = (float)i;
        y[i] = 1.0f - (float)i / 2;
    }
    const float a = 2.5f;
    const int64_t shape[1] = {N};
    gpujob_tensor_t tx, ty;
    gpujob_tensor_init(&tx, GPUJOB_F32, 1, shape, x);
    gpujob_tensor_init(&ty, GPUJOB_F32, 1, shape, y);

    gpujob_spec_t *spec = NULL;
    gpujob_job_t *job = NULL, *done = NULL;
    gpujob_tensor_t out = {0};
    int status = 2;
    if (gpujob_spec_new("saxpy", &spec) < 0 || gpujob_spec_input(spec, "x", &tx) < 0 ||
        gpujob_spec_input(spec, "y", &ty) < 0 || gpujob_spec_param_double(spec, "a", a) < 0) {
        fprintf(stderr, "saxpy: out of memory\n");
        goto out;
    }
    if ((r = gpujob_submit(c, spec, &job)) < 0) {
        status = fail(c, "submit", r);
        goto out;
    }
    printf("submitted job %s\n", gpujob_job_id(job));
    if ((r = gpujob_wait(c, gpujob_job_id(job), 60.0, &done)) < 0) {
        status = fail(c, "wait", r);
        goto out;
    }
    if (gpujob_job_state(done) != GPUJOB_SUCCEEDED) {
        printf("job %s %s: %s\n", gpujob_job_id(done), gpujob_state_name(gpujob_job_state(done)),
               gpujob_job_error_message(done) ? gpujob_job_error_message(done) : "");
        status = 1;
        goto out;
    }
    /* Small outputs come inline with the job; large ones are downloaded. */
    if (gpujob_job_output(done, "out", &out) < 0 || !out.data) {
        gpujob_tensor_clear(&out);
        if ((r = gpujob_output_tensor(c, gpujob_job_id(done), "out", &out)) < 0) {
            status = fail(c, "download", r);
            goto out;
        }
    }
    int wrong = 0;
    const float *o = out.data;
    for (int i = 0; i < N; i++)
        if (out.dtype != GPUJOB_F32 || out.nbytes != sizeof x ||
            fabsf(o[i] - (a * x[i] + y[i])) > 1e-5f * fabsf(a * x[i] + y[i]) + 1e-6f)
            wrong++;
    printf("job %s succeeded in %.3f ms: %d of %d values %s\n", gpujob_job_id(done),
           gpujob_job_run_ms(done), wrong ? wrong : N, N, wrong ? "wrong" : "right");
    status = wrong ? 1 : 0;
out:
    gpujob_tensor_clear(&out);
    gpujob_job_free(done);
    gpujob_job_free(job);
    gpujob_spec_free(spec);
    gpujob_client_free(c);
    return status;
}
