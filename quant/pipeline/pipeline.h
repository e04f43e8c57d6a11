/* The quantization pipeline: one job, a whole model, block by block, with a checkpoint
 * after every block so a killed job resumes where it stopped.
 *
 * Flow (see ../shared/ref/architecture.md): open the model (mmapped), tokenize and sample
 * the calibration data, embed it; then for each decoder block: capture the inputs of its
 * linears (hooks of quant/model/block.h), quantize them (RTN, GPTQ with shared Hessians and
 * optionally true-sequential, AWQ with scale folding and clipping, or AWQ then GPTQ), pack
 * them through the format table, run the block again with the quantized weights to produce
 * the next block's inputs, and commit a checkpoint. When the last block is done the output
 * directory is assembled (sharded safetensors + index, config.json with
 * quantization_config, quantize_config.json, tokenizer files, quantd_report.json).
 *
 * Checkpoint layout, inside the output directory:
 *   .quantd/state.json          version, fingerprint, next block, the block whose inputs are
 *                               kept (acts_block), per-layer results so far, the peak RSS
 *                               and disk measured so far (for the report's resources)
 *   .quantd/block-NNN.safetensors   the finished block's tensors (packed and float)
 *   .quantd/folds-NNN.safetensors   an AWQ block's scales in the order they were folded
 *   .quantd/acts-NNN.bin        the inputs of block NNN (written by block NNN-1 when NNN is a
 *                               multiple of job.checkpoint.acts_every; a resume recomputes
 *                               the blocks after the last one kept: pipeline_replay.c)
 * Every file is written to a temp name, fsynced and renamed; state.json is written last and
 * is the commit point. A resumed run is byte-identical to an uninterrupted one on the same
 * backend (fixed seeds, fixed reduction orders, same thread count).
 *
 * The job is run either in one call (qd_pipeline_run) or a block at a time (open,
 * run_block until next_block == n_blocks, finish) so a scheduler can hand a job to another
 * worker between blocks: the checkpoint is the hand-off. A qd_pipeline is used by one
 * thread. It borrows the job and the backend. */
#ifndef QUANT_PIPELINE_PIPELINE_H
#define QUANT_PIPELINE_PIPELINE_H

#include <stdatomic.h>
#include <stdint.h>

#include "quant/backend/backend.h"
#include "quant/core/dtype.h"
#include "quant/core/error.h"
#include "quant/job/job.h"
#include "quant/pipeline/admission.h"

typedef struct qd_progress {
    const char *job_id;
    const char *stage;       /* "load", "calibrate", "quantize", "forward", "checkpoint",
                                "write", "eval", "done"; "bpw_plan": target_bpw's pass over
                                every block, before block 0 (fraction 0) */
    int block, n_blocks;     /* the block being worked on (0-based; -1 before the first) and the total */
    const char *layer;       /* the linear being quantized ("self_attn.q_proj") or NULL */
    double fraction;         /* of the whole job, 0..1 */
    double eta_s;            /* seconds left, -1 when unknown */
    double layer_error;      /* relative output error of `layer`, -1 when none */
} qd_progress;

typedef struct qd_pipeline_hooks {
    void *ud;
    /* Progress. Return nonzero to cancel: the pipeline stops at the next safe point with
     * QD_ECANCELLED, its checkpoint intact. */
    int (*progress)(void *ud, const qd_progress *p);
    /* Called before every checkpoint commit with the block about to be committed. Nonzero
     * refuses the commit (e.g. the worker lost its lease): the run stops with QD_ECANCELLED
     * and writes nothing. */
    int (*before_commit)(void *ud, int block);
    /* The lease fencing token recorded in state.json at each commit (0: keep the one there). */
    uint64_t fence;
    /* Fan-out of one step of a block over other workers (docs/parallel.md). The pipeline has
     * written the inputs of parts 0..n-1 of (block, step) into the job's checkpoint
     * directory (.quantd/parts/); the hook has them run, each by some worker calling
     * qd_pipeline_part_run (the caller's own process included), and returns once none is
     * running any more. Every part's output is then read back and checked; one that is
     * missing or damaged is computed by the pipeline itself, so a hook that gives up on a
     * part loses time, never bytes. names[i] is what part i works on, for status. Returns
     * nonzero to cancel (the run stops with QD_ECANCELLED). NULL: the pipeline runs every
     * part itself, in memory; the bytes it writes are the same either way. */
    int (*fanout)(void *ud, int block, const char *step, int n, const char *const *names);
    /* The name of this worker, recorded in the part outputs it writes (the report's
     * per-part worker); NULL: "local". */
    const char *worker;
} qd_pipeline_hooks;

typedef struct qd_pipeline qd_pipeline;

/* The estimate itself (qd_pipeline_estimate, qd_pipeline_estimate_job and its JSON) is in
 * admission.h, included above: the part of the pipeline's interface the daemon uses. */

/* Whether a block keeps its MLP activation of keep_bytes, given the job's peak without it:
 * always up to QD_MLP_KEEP_BYTES (1 GiB), and beyond that when the peak with it stays within
 * half of phys_bytes, the machine's physical memory (0: unknown, then only the first rule).
 * A 7B job at 128 x 2048 keeps its 11.5 GB on a 64 GB machine and saves the re-run of its
 * gate/up projections, about a third of a block's time. */
int qd_pipeline_mlp_keep_decide(uint64_t keep_bytes, uint64_t peak_without, uint64_t phys_bytes);
/* Takes a large kept MLP activation out of *est (keep_mlp_act 0, the peak and acts_ram_bytes
 * lowered by mlp_act_added_bytes) when the peak with it is over avail_bytes but would fit
 * without it; returns 1 when it did (never for AWQ, whose activation adds nothing). The pipeline's memory check calls it before refusing a job. */
int qd_pipeline_estimate_fit(qd_pipeline_estimate *est, uint64_t avail_bytes);
/* The settings that lower the figure a job was refused for, as one parenthesised sentence
 * for the refusal message: which (0: memory, 1: disk). The activations' share decides
 * whether fewer calibration samples help memory; the activation files' share whether
 * checkpoint.acts_every helps disk. */
void qd_pipeline_estimate_hint(const qd_pipeline_estimate *est, int which, char *buf, size_t cap);
/* The pre-flight's disk rule: 0 when free_bytes and held_bytes together reach
 * est->disk_bytes, else QD_EPREFLIGHT with the figures and the hint, the file system named
 * by where (its end, when long). held_bytes is what the output directory already holds that
 * the run reuses or replaces, which the estimate counts as still to be written: the job's
 * own checkpoint and partial output from an earlier attempt (a resume after a full disk), or
 * a quantd output that overwrite removes first. */
int qd_pipeline_check_disk(const qd_pipeline_estimate *est, uint64_t free_bytes, uint64_t held_bytes, const char *where,
                           qd_err *err);

/* Opens the model, checks the output directory (refused when it exists and is neither
 * empty, nor this job's checkpoint, nor allowed by job->overwrite), checks memory and disk,
 * validates the checkpoint fingerprint (a mismatch refuses to resume and says why), and
 * prepares the calibration activations (from the checkpoint, or by embedding fresh
 * samples). *out is owned by the caller (qd_pipeline_close). */
int qd_pipeline_open(const qp_job *job, qd_backend *be, const qd_pipeline_hooks *hooks,
                     qd_pipeline **out, qd_err *err);
void qd_pipeline_close(qd_pipeline *p);                 /* accepts NULL */
int qd_pipeline_n_blocks(const qd_pipeline *p);
/* The next block to run; n_blocks when every block is done. */
int qd_pipeline_next_block(const qd_pipeline *p);
/* The name through which the output directory's files are reached: its descriptor,
 * "/proc/self/fd/N" (confine.h), once the open created or found it. Borrowed. */
const char *qd_pipeline_out_dir(const qd_pipeline *p);
/* The most Hessian bytes one true-sequential capture pass may fill when it collects a wave of
 * independent input groups (MoE experts; default QD_WAVE_HESSIAN_BYTES, 4 GiB). Lower it to
 * bound memory (fewer experts per pass, more passes); 0 captures one group per pass. The
 * output does not depend on it. */
void qd_pipeline_set_wave_bytes(qd_pipeline *p, uint64_t bytes);
/* on 0 makes every capture pass sum each group's Hessian itself, even where another wanted
 * group's input is the same in every call (a MoE block's experts' gate/up with
 * moe.calibrate_all_experts) and the default copies that group's once the pass is done. The
 * output does not depend on it. qd_pipeline_twins_copied: the Hessians copied so far. */
void qd_pipeline_set_twins(qd_pipeline *p, int on);
/* Trace parts (quant/pipeline/part.h, qd_tpart_pays): mode -1 (the default) where the rule
 * says they pay, 0 never, 1 in every fan-out with one GPTQ Hessian whose rows the model
 * names. The output does not depend on it. */
void qd_pipeline_set_trace_parts(qd_pipeline *p, int mode);
uint64_t qd_pipeline_twins_copied(const qd_pipeline *p);
/* keep 0 stops the job keeping its MLP activation for each block's last forward (GPTQ where
 * its estimate chose to: keep_mlp_act, qd_pipeline_mlp_keep_decide; AWQ always): one more
 * pass over the MLP per block, and for GPTQ less memory. keep 1 restores the default. The
 * output does not depend on it. */
void qd_pipeline_set_keep_mlp_act(qd_pipeline *p, int keep);
/* Replaces the fan-out hook (NULL: the parts run in memory) and the worker's name for the
 * blocks run from now on, the hook's ud staying the open's. The bytes do not change; the
 * open's disk check counted the part files only when it had a hook. */
void qd_pipeline_set_fanout(qd_pipeline *p, int (*fanout)(void *ud, int block, const char *step, int n,
                                                         const char *const *names),
                            const char *worker);
/* The last committed block's cost record (cost.h) as compact JSON, malloc'd and owned by the
 * caller; NULL when no block was committed in this run, or out of memory. */
char *qd_pipeline_last_block_cost(const qd_pipeline *p);
/* A job's "compute" on this checkpoint and backend. auto is bf16 where the checkpoint's bulk
 * weights (qd_output_float_dtype) are bfloat16 and the backend runs bf16 products on a
 * bfloat16 unit (be->bf16_native and its gemm_nt_bf16 op: AMX-BF16, compute capability
 * 8.0+), else f32: the Python tools compute in the checkpoint's dtype, and where bf16 is
 * only emulated it gains nothing. f32 and bf16 come back as given. *why (may be NULL) gets a
 * static phrase naming what decided. */
qp_compute qd_pipeline_compute_resolve(qp_compute want, qd_dtype weights, const qd_backend *be, const char **why);
/* 1 when the checkpoint this run resumed from was written by another backend. */
int qd_pipeline_resumed_cross_backend(const qd_pipeline *p);
/* Runs the next block and commits its checkpoint. */
int qd_pipeline_run_block(qd_pipeline *p, qd_err *err);
/* Runs part `index` of step `step` ("quantize", "factor") of block `block` of the job, as a fan-out
 * (qd_pipeline_hooks.fanout) announced it: reads the part's input from the job's checkpoint
 * directory (opened beneath the allowed roots like every job path), computes it on be and
 * writes its output beside it atomically, with a checksum. worker names this process in the
 * output (NULL: "local"). *seconds (may be NULL) gets the part's compute time. An input
 * that is missing or fails its checksum is QD_EFORMAT: the lead computes that part itself.
 * stop (may be NULL) turning nonzero stops GPTQ at its next column block: QD_ECANCELLED,
 * no output written (another copy of the part finished first). */
int qd_pipeline_part_run(const qp_job *job, qd_backend *be, int block, const char *step, int index,
                         const char *worker, const atomic_int *stop, double *seconds, qd_err *err);
/* Closes what the parts keep open from one to the next (the model checkpoint their weight
 * rows are read from, and the block capture parts keep loaded): a worker calls it once it
 * has been idle a while. qd_pipeline_part_idle_files closes the checkpoint only: the kept
 * block (GBs for a MoE block) costs seconds to load again, and a lead working alone between
 * two of its block's passes leaves its helpers idle longer than files are worth keeping. */
void qd_pipeline_part_idle(void);
void qd_pipeline_part_idle_files(void);
/* After the last block: assembles the output directory, runs the eval when asked,
 * writes quantd_report.json and removes .quantd/. */
int qd_pipeline_finish(qd_pipeline *p, qd_err *err);
/* open + every block + finish + close. */
int qd_pipeline_run(const qp_job *job, qd_backend *be, const qd_pipeline_hooks *hooks,
                    qd_err *err);

#endif
