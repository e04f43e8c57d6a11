/* What the daemon's admission needs of the pipeline, and nothing more: a job's estimate
 * (peak memory, disk, blocks, and its JSON for the status hash), the check that its output
 * overlaps neither its inputs nor the daemon's protected paths, and how far its checkpoint
 * got. The daemon includes this header alone of the pipeline's, and links what implements it
 * as libqadmit (estimate.c, job_paths.c, state.c and what they need: config.json parsing, the
 * architecture table, the AWQ defaults, the formats, core), which carries no backend, BLAS,
 * LAPACKE or CUDA (docs/architecture.md, "Admission"). pipeline.h includes it for the
 * pipeline's own users. */
#ifndef QUANT_PIPELINE_ADMISSION_H
#define QUANT_PIPELINE_ADMISSION_H

#include <stdint.h>

#include "quant/core/error.h"
#include "quant/job/job.h"

/* What a job needs, estimated before it starts (estimate.c, term by term): an upper bound,
 * not more than twice the measured peak on test_estimate's jobs. */
typedef struct qd_pipeline_estimate {
    uint64_t peak_ram_bytes;     /* process base + lm_head + one block's F32 weights x3 + activations
                                    in, out and the file's host copy + Hessians + batch scratch
                                    (+ AWQ outputs, + the final eval) */
    uint64_t disk_bytes;         /* checkpoint (every block, up to two activation files) + output */
    uint64_t act_bytes;          /* calibration activations of one block (F32 in memory) */
    uint64_t acts_ram_bytes;     /* the part of peak_ram_bytes the calibration size sets: the
                                    activations in, out, between the halves, and the file copy */
    uint64_t acts_disk_bytes;    /* the part of disk_bytes that is activation files */
    uint64_t mlp_act_bytes;      /* a dense block's MLP activation (the down projection's input
                                    over every calibration row) for true-sequential GPTQ and AWQ,
                                    0 for other jobs */
    uint64_t mlp_act_added_bytes;/* what keeping it adds to peak_ram_bytes and acts_ram_bytes:
                                    GPTQ's activation; 0 for AWQ, whose term already counts it
                                    (its clip search holds that input) */
    int keep_mlp_act;            /* 1: the block keeps it for the final forward, which is then the
                                    down projection alone instead of the MLP half again */
    /* A job whose quantize steps go out as parts (job.workers != 1, under the daemon;
     * docs/parallel.md); 0 otherwise: */
    uint64_t part_disk_bytes;    /* the part files of the largest fan-out, present at once beside
                                    the checkpoint (inputs, Hessians, outputs); counted in the
                                    pre-flight's disk check of a run that fans out */
    uint64_t part_ram_bytes;     /* the largest part's peak in the worker that runs it (its input
                                    and output, the Hessian read and factored, GPTQ's buffers;
                                    beside them the block a helper keeps from its capture parts) */
    uint64_t part_lead_bytes;    /* what a lead whose passes go out as capture parts holds beside
                                    peak_ram_bytes (a part it runs itself, a part's record it
                                    reads); counted where it fans out */
    int n_blocks;
} qd_pipeline_estimate;

/* Estimates from the model's config.json, the job and this machine's physical memory (which
 * decides keep_mlp_act: qd_pipeline_mlp_keep_decide, pipeline.h); no weights are read. */
int qd_pipeline_estimate_job(const qp_job *job, qd_pipeline_estimate *est, qd_err *err);
/* The figures a run is measured against, {"peak_ram_bytes": .., "disk_bytes": ..}: the
 * report's resources.estimate and the status hash's `estimate`. Owned by the caller
 * (cJSON_Delete); NULL when out of memory. */
struct cJSON;
struct cJSON *qd_pipeline_estimate_to_json(const qd_pipeline_estimate *est);

/* The paths a job reads and writes, checked against each other before anything is created
 * or removed (job_paths.c).
 *
 * A job writes (and with "overwrite" removes) its output directory, so that directory must
 * never be, contain, or lie inside what the job reads: the model directory, the calibration
 * file and the eval file. Callers add their own protected paths (the daemon: its allow-roots
 * and its configuration file), which the output may lie inside but never be or contain.
 * The check resolves every path (symbolic links, "..") before comparing, so an alias
 * cannot hide an overlap. */
typedef struct qd_protected_path {
    const char *path;        /* absolute; borrowed */
    const char *what;        /* for the message: "allow-root", "the daemon's configuration file" */
} qd_protected_path;

/* 0 when job->output overlaps none of the job's inputs nor the n protected paths, else
 * QD_EINVAL naming both paths and how they overlap ("output /d/m is the model directory").
 * A path in /proc, /sys or /dev (as named or resolved) is refused too.
 * A path that cannot be resolved is reported the same way. */
int qd_job_paths_check(const qp_job *job, const qd_protected_path *protect, int n, qd_err *err);

/* How far the checkpoint in the output directory `output` got (its .quantd/state.json, read
 * through quant/core/confine.h like every file of a job): *next_block, the block a run
 * would start at (n_blocks when every block is done), and *n_blocks, both set only when it
 * returns 0. Otherwise qd_state_load's code (state.c): QD_ENOTFOUND when there is none,
 * QD_EMISMATCH for a checkpoint of another version. */
int qd_state_progress(const char *output, int *next_block, int *n_blocks, qd_err *err);

#endif
