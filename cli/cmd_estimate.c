/* quantctl estimate JOB.json [--json]: the pre-flight estimate of a job (the one the pipeline
 * checks against free memory and disk before it starts, and the daemon's admission uses),
 * from the model's config.json and the job alone; no weights are read and nothing is written.
 * The job file is the one `quantctl quantize` and `quantctl submit` take. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/quantctl.h"
#include "quant/core/fsutil.h"
#include "quant/job/job.h"
#include "quant/pipeline/pipeline.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: quantctl estimate JOB.json [--json]\n"
               "Prints what the job needs before it runs (peak RAM, disk for output + checkpoint,\n"
               "calibration activations of one block, blocks), from config.json and the job alone.\n"
               "--json prints one JSON object with the byte counts instead.\n"
               "exit status: 0 printed, 1 reading failed, 2 bad job, a model without a usable config.json, or usage\n");
}

/* "12.3 GiB" with binary units, the way free(1) -h and the job's shard_size suffixes read. */
static void human(uint64_t b, char *out, size_t cap)
{
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int u = 0;
    while (v >= 1024.0 && u < 4) { v /= 1024.0; u++; }
    if (u == 0) snprintf(out, cap, "%llu B", (unsigned long long)b);
    else snprintf(out, cap, "%.1f %s", v, unit[u]);
}

int cmd_estimate(int argc, char **argv, const qd_runtime_opts *rt)
{
    static const struct option opts[] = {{"json", no_argument, 0, 'j'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int as_json = 0, c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "jh", opts, NULL)) != -1) {
        switch (c) {
        case 'j': as_json = 1; break;
        case 'h': usage(stdout); return QCTL_OK;
        default: usage(stderr); return QCTL_USAGE;
        }
    }
    if (optind != argc - 1) { usage(stderr); return QCTL_USAGE; }
    const char *path = argv[optind];
    qp_job *job = qctl_read_job("estimate", path);
    if (!job) return QCTL_USAGE;
    qd_err err = {0};
    int rc = 0;
    qd_pipeline_estimate est;
    if ((rc = qd_pipeline_estimate_job(job, &est, &err))) {
        fprintf(stderr, "quantctl estimate: %s: %s\n", job->model, err.msg);
        qp_job_free(job);
        return rc == QD_EIO || rc == QD_ENOMEM ? QCTL_FAIL : QCTL_USAGE;
    }
    if (as_json) {
        printf("{\"id\":\"%s\",\"peak_ram_bytes\":%llu,\"disk_bytes\":%llu,\"act_bytes\":%llu,"
               "\"mlp_act_kept_bytes\":%llu,\"part_disk_bytes\":%llu,\"part_ram_bytes\":%llu,\"part_lead_bytes\":%llu,"
               "\"n_blocks\":%d}\n",
               job->id, (unsigned long long)est.peak_ram_bytes, (unsigned long long)est.disk_bytes,
               (unsigned long long)est.act_bytes, (unsigned long long)(est.keep_mlp_act ? est.mlp_act_bytes : 0),
               (unsigned long long)est.part_disk_bytes, (unsigned long long)est.part_ram_bytes,
               (unsigned long long)est.part_lead_bytes, est.n_blocks);
    } else {
        char ram[32], disk[32], act[32];
        human(est.peak_ram_bytes, ram, sizeof ram);
        human(est.disk_bytes, disk, sizeof disk);
        human(est.act_bytes, act, sizeof act);
        printf("job          %s\nmodel        %s\n", job->id, job->model);
        printf("peak RAM     %s  (the most the job holds at once: one block's weights, calibration activations\n"
               "                       in and out, Hessians, scratch, the model's resident tensors)\n", ram);
        printf("disk         %s  (output + checkpoint, both present while the output is written)\n", disk);
        printf("activations  %s  (calibration hidden states of one block; one acts-NNN.bin)\n", act);
        if (est.mlp_act_bytes) {
            char mlp[32];
            human(est.mlp_act_bytes, mlp, sizeof mlp);
            printf("MLP act      %s  %s\n", mlp,
                   est.keep_mlp_act ? "(kept for each block's final forward: counted in peak RAM)"
                                    : "(not kept: over 1 GiB and over half this machine's memory with the rest; "
                                      "each block runs its MLP half once more)");
        }
        if (est.part_disk_bytes) {
            char pd[32], pr[32];
            human(est.part_disk_bytes, pd, sizeof pd);
            human(est.part_ram_bytes, pr, sizeof pr);
            printf("part files   %s  (the largest fan-out's files beside the checkpoint, under the daemon: "
                   "job.workers != 1)\n", pd);
            printf("part peak    %s  (the most one part holds in the worker that runs it)\n", pr);
            if (est.part_lead_bytes) {
                char pl[32];
                human(est.part_lead_bytes, pl, sizeof pl);
                printf("lead's parts %s  (beside peak RAM in the lead whose calibration passes go out as parts: "
                       "a part it runs, a part's record it reads)\n", pl);
            }
        }
        printf("blocks       %d\n", est.n_blocks);
    }
    qp_job_free(job);
    return QCTL_OK;
}
