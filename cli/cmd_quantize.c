/* quantctl quantize JOB.json: runs a job in the foreground, without the daemon, with a
 * progress bar on a TTY (plain lines otherwise). Re-running the same job resumes from its
 * checkpoint. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/quantctl.h"
#include "quant/backend/backend.h"
#include "quant/core/fsutil.h"
#include "quant/job/job.h"
#include "quant/pipeline/pipeline.h"

typedef struct bar_state {
    int tty;
    double last_fraction;
    const char *last_stage;
} bar_state;

static int on_progress(void *ud, const qd_progress *pr)
{
    bar_state *b = ud;
    if (b->tty) {
        int width = 30, filled = (int)(pr->fraction * width + 0.5);
        char eta[32] = "";
        if (pr->eta_s >= 0) snprintf(eta, sizeof eta, " eta %dm%02ds", (int)pr->eta_s / 60, (int)pr->eta_s % 60);
        fprintf(stderr, "\r[%.*s%*s] %5.1f%% block %d/%d %-10s %-22s%s\033[K", filled,
                "##############################", width - filled, "", 100 * pr->fraction, pr->block + 1,
                pr->n_blocks, pr->stage, pr->layer ? pr->layer : "", eta);
        if (!strcmp(pr->stage, "done")) fputc('\n', stderr);
    } else if (pr->layer_error >= 0 || strcmp(pr->stage, b->last_stage ? b->last_stage : "") != 0) {
        fprintf(stderr, "progress stage=%s block=%d/%d fraction=%.3f%s%s", pr->stage, pr->block + 1, pr->n_blocks,
                pr->fraction, pr->layer ? " layer=" : "", pr->layer ? pr->layer : "");
        if (pr->layer_error >= 0) fprintf(stderr, " rel_error=%.5f", pr->layer_error);
        fputc('\n', stderr);
    }
    b->last_stage = pr->stage;
    b->last_fraction = pr->fraction;
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: quantctl quantize JOB.json [--backend cpu|cuda:N] [--threads N]\n"
               "Runs the job in the foreground (see docs/jobs.md for the spec). Running the same job\n"
               "again after an interruption resumes from its last finished block.\n"
               "Prints the job's report path as the last line. Exit: 0 done, 1 failed, 2 bad job.\n");
}

int cmd_quantize(int argc, char **argv, const qd_runtime_opts *rt)
{
    static const struct option opts[] = {{"backend", required_argument, 0, 'b'}, {"threads", required_argument, 0, 't'},
                                         {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    const char *backend = NULL;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "b:t:h", opts, NULL)) != -1) {
        switch (c) {
        case 'b': backend = optarg; break;
        case 't': setenv("OPENBLAS_NUM_THREADS", optarg, 1); break;
        case 'h': usage(stdout); return QCTL_OK;
        default: usage(stderr); return QCTL_USAGE;
        }
    }
    if (optind != argc - 1) { usage(stderr); return QCTL_USAGE; }
    const char *path = argv[optind];
    qp_job *job = qctl_read_job("quantize", path);
    if (!job) return QCTL_USAGE;
    qd_err err = {0};
    int rc = 0;
    if (!backend) backend = job->backend == QP_BACKEND_CUDA ? "cuda:0"
                          : job->backend == QP_BACKEND_CPU ? "cpu"
                          : qd_backend_cuda_device_count() > 0 ? "cuda:0" : "cpu";
    qd_backend *be = NULL;
    if (qd_backend_open(backend, rt, &be, &err)) {
        fprintf(stderr, "quantctl quantize: backend %s: %s\n", backend, err.msg);
        qp_job_free(job);
        return QCTL_FAIL;
    }
    bar_state bar = {.tty = isatty(STDERR_FILENO)};
    qd_pipeline_hooks hooks = {.ud = &bar, .progress = on_progress};
    rc = qd_pipeline_run(job, be, &hooks, &err);
    if (bar.tty) fputc('\n', stderr);
    if (rc) {
        fprintf(stderr, "quantctl quantize: job %s failed: %s\n", job->id, err.msg);
        rc = rc == QD_EINVAL || rc == QD_EMISMATCH ? QCTL_USAGE : QCTL_FAIL;
    } else {
        printf("%s/quantd_report.json\n", job->output);
    }
    qd_backend_close(be);
    qp_job_free(job);
    return rc;
}
