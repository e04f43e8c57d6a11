/* Private to quant/pipeline: the pipeline's state and the steps of a block, split across
 * pipeline.c (open, resume, close), pipeline_block.c (one block: capture, quantize,
 * forward, checkpoint), pipeline_layer.c (one linear: RTN/GPTQ/AWQ, pack, error),
 * pipeline_finish.c (the output, eval, report), pipeline_progress.c (progress, the cost
 * record, resource peaks) and pipeline_outdir.c (the output directory's descriptors). */
#ifndef QUANT_PIPELINE_INTERNAL_H
#define QUANT_PIPELINE_INTERNAL_H

#include <stdatomic.h>
#include <stdint.h>

#include "quant/algo/awq.h"
#include "quant/algo/gptaq.h"
#include "quant/algo/gptq.h"
#include "quant/algo/hessian.h"
#include "quant/formats/format.h"
#include "quant/job/job.h"
#include "quant/model/block.h"
#include "quant/model/model.h"
#include "quant/pipeline/pipeline.h"
#include "quant/pipeline/state.h"
#include "quant/tp/tp_serving.h"

#define QD_PATH_MAX 4096

/* The AWQ scales folded into the current block, in the order they were folded (group g, or
 * -1 for the MoE experts' shared input): with the block file they let a resumed job redo the
 * block's forward exactly (pipeline_replay.c). */
typedef struct qd_fold_rec {
    int group;                   /* input group, or -1: the MoE shared input */
    int64_t k;
    float *s;                    /* host [k]; owned */
} qd_fold_rec;

/* job.target_bpw's plan (pipeline_bpw.c): the candidates, each linear's estimated error per
 * candidate and the one chosen; saved as .quantd/bpw-plan.json before block 0, read back on
 * every resume, never made again once a block has followed it (made again before block 0
 * only when it was made with another estimate than the job's). */
#define QD_BPW_MAX_CAND (QP_JOB_BPW_MAX * QP_JOB_BPW_MAX)
typedef struct qd_bpw_plan {
    int n_cand;
    int cand_bits[QD_BPW_MAX_CAND];
    int64_t cand_group[QD_BPW_MAX_CAND];
    int n_blocks, n_lin;
    int *choice;                 /* [n_blocks * n_lin]: candidate index, or -1 (not quantized); owned */
    double *err;                 /* [n_blocks * n_lin * n_cand]: tr(D H D^T) / tr(W H W^T), D the
                                    error of the job's quantizer (GPTQ's or RTN's), NaN
                                    where the candidate does not fit the linear; owned */
    double *blk;                 /* [n_blocks * n_lin * n_cand]: the block-output error of the
                                    linear's input group at each candidate (every linear of the
                                    group the same; qd_bpw_token_rel_err2), what the allocation
                                    ranks; NaN where it does not fit; owned */
    double target;               /* job.target_bpw */
    double bpw;                  /* what the choice stores per weight */
    double seconds;              /* the plan's pass */
} qd_bpw_plan;

struct qd_pipeline {
    const qp_job *job;           /* borrowed */
    qd_backend *be;              /* borrowed */
    qd_pipeline_hooks hooks;
    qd_model *m;                 /* owned */
    const qd_format *fmt;
    qd_quant_cfg qcfg;
    /* The output and its .quantd are held open from the open on (out_fd, ckpt_fd; owned, -1
     * until opened), and every file in them is reached through out_dir and ckpt_dir, which
     * name those descriptors ("/proc/self/fd/N", confine.h) once they are open: renaming
     * the output away and planting a link in its place redirects no write. out_shown is the
     * job's output path, for messages (qd_pipeline_err_unmap). */
    char out_dir[QD_PATH_MAX];
    char ckpt_dir[QD_PATH_MAX];
    char out_shown[QD_PATH_MAX];
    int out_fd, ckpt_fd;
    int parts_fd;                /* .quantd/parts, opened at the first fan-out (part.h); owned, or -1 */
    const atomic_int *part_stop; /* a part's run (qd_pipeline_part_run): nonzero stops GPTQ at its
                                    next column block (QD_ECANCELLED); NULL otherwise */
    qd_ckpt_state st;            /* owned */
    int n_blocks;
    int64_t n_seq, seq_len;      /* calibration: n_seq sequences of seq_len tokens */
    int64_t hidden;
    float *acts;                 /* backend [n_seq*seq_len, hidden]: inputs of st.next_block; owned */
    float *acts_fp;              /* job.gptaq: the same block's inputs in the float model (the float
                                    blocks run on the float stream), same shape; owned, else NULL */
    qd_dtype acts_dtype;         /* the dtype the inputs between blocks are held in (acts.h) */
    qp_compute compute;          /* QP_COMPUTE_F32 or _BF16: the job's "compute" resolved
                                    (qd_pipeline_compute_resolve), or the checkpoint's */
    float *mid;                  /* backend, same shape: the block's residual stream between its
                                    attention and MLP halves once the attention groups are
                                    quantized (true-sequential); owned, per block, or NULL */
    int64_t batch_seqs;          /* sequences per forward batch */
    int n_shards;                /* job.calibration.shards, at most one per batch (1: no shards) */
    int64_t shard_starts[17];    /* shard s: sequences shard_starts[s] .. shard_starts[s + 1] */
    double t_open;               /* monotonic seconds at open */
    double block_seconds_sum;    /* for the ETA */
    int blocks_this_run;
    int resumed_cross_backend;
    int already_done;            /* the output is this job's finished output: nothing to do */
    qd_pipeline_estimate est;    /* the pre-flight estimate the job was accepted under (check_resources) */
    /* MoE coverage of the current block: tokens the router sent to each expert in the first
     * calibration pass that reached the experts. */
    int64_t moe_routed[QD_MAX_EXPERTS];
    int moe_routed_done;
    uint64_t wave_bytes;         /* Hessian bytes one capture pass may fill (qd_pipeline_set_wave_bytes) */
    int no_twins;                /* qd_pipeline_set_twins(p, 0) */
    int trace_parts;             /* qd_pipeline_set_trace_parts: -1 by the rule, 0 never, 1 always */
    uint64_t twins_copied;       /* Hessians a pass copied from a twin (qd_pipeline_twins_copied) */
    int no_mlp_keep;             /* qd_pipeline_set_keep_mlp_act(p, 0): the estimate's kept MLP activation refused */
    qd_block_cost cost;          /* the current block's seconds per stage, passes and bytes */
    qd_serving_report serving;   /* job.serve: the kernel per layer (owned; empty without serve) */
    qd_bpw_plan bpw;             /* job.target_bpw's plan (n_cand 0: none) */
    qd_fold_rec *folds;          /* the current block's AWQ folds, in order; owned */
    int n_folds, cap_folds;
};

/* What happens to one linear. */
typedef struct qd_linear_plan {
    int quantize;                /* 0: left in float */
    int listed;                  /* left in float because the job lists it (modules_to_not_convert) */
    int absent;                  /* not in this block (DeepSeek: a dense layer's experts, a MoE layer's dense MLP) */
    char why[160];               /* why it stays in float */
} qd_linear_plan;

/* One linear's outcome: the packed tensors (when quantized) and the weight the block uses
 * from now on (dequantized, or the float weight). */
typedef struct qd_linear_out {
    int quantized;
    qd_packed packed;            /* owned when quantized */
    float *w_eff;                /* host [n, k]: the weight as loaded (AWQ-scaled) until the layer is
                                  * quantized, then NULL (the block's weights hold Q); owned */
    float *w_float;              /* host [n, k]: float weight to store when not quantized (AWQ-scaled); owned or NULL */
    float *bias;                 /* host [n] or NULL; owned (possibly AWQ-scaled) */
    int bias_modified;
    int weight_modified;         /* float weight differs from the source (AWQ folding) */
} qd_linear_out;

/* Adds the seconds since t0 to stage s of the current block's cost; returns now. */
double qd_pipeline_cost_add(qd_pipeline *p, qd_stage s, double t0);

/* ---- progress and resources (pipeline_progress.c) ---- */

/* Calls the progress hook (if any) with the stage, the block (-1 before the first), the
 * linear or NULL, the part of the block done (0..1) and the layer's error (-1: none);
 * returns the hook's answer (nonzero: cancel). */
int qd_pipeline_report_progress(qd_pipeline *p, const char *stage, int block, const char *layer,
                                double within_block, double layer_error);
/* The bytes under the output directory, through its descriptor once it is open. */
uint64_t qd_pipeline_out_bytes(const qd_pipeline *p);

/* Raises p->st's measured peaks to now: the process's peak resident set (quant/core/rss.h,
 * reset when the pipeline opened) and the bytes under the output directory (checkpoint and
 * output). Called where the disk peak can occur: at each block's commit, after the block
 * file and the next activation file are written and before the older activation file is
 * removed (state.json then records the peaks), and at finish once the output is written
 * beside the checkpoint. */
void qd_pipeline_sample_peaks(qd_pipeline *p);

/* Decides whether linear li of the model can be written in the job's format. */
/* The pre-flight of the plans: every linear of every block must be quantizable unless the
 * job lists it to stay in float; otherwise QD_EINVAL naming the first such layer, its
 * reason and the two ways out. */
int qd_pipeline_check_plans(const qd_pipeline *p, qd_err *err);

/* gpt-oss in compressed-tensors pack-quantized (pipeline_gptoss.c): 1 when the job writes the
 * experts in vLLM's per-expert w13_* / w2_* layout (qd_output_gptoss_experts);
 * qd_pipeline_gptoss_check refuses by name, before any work, what that layout cannot hold
 * (zero points, FP8 activations, target_bpw, an expert left in float). */
int qd_pipeline_gptoss_vllm_layout(const qd_pipeline *p);
int qd_pipeline_gptoss_check(const qd_pipeline *p, qd_err *err);
/* job.serve: every layer as the job would write it, through the vLLM rule table; refuses
 * (QD_EPREFLIGHT, naming the layer, the reason and the settings that fix it) when one would
 * not get a fast kernel. Fills p->serving for the report. */
int qd_pipeline_check_serving(qd_pipeline *p, qd_err *err);
void qd_pipeline_plan_linear(const qd_pipeline *p, int block, int li, qd_linear_plan *plan);

/* A layer's dequantized weights Q, host [n, k]: GPTQ's own buffer (on the CPU one of the
 * backend's cached blocks, be set) or malloc'd (be NULL). qd_deq_free accepts an empty one. */
typedef struct qd_deq {
    float *w;
    qd_backend *be;
} qd_deq;
void qd_deq_free(qd_deq *d);

/* Quantizes w (host [n, k]) with the job's method given its input Hessian h (backend,
 * [k, k], of the inputs the layer sees, AWQ scaling already applied to both) and fills res
 * (damp, fallback, seconds). The codes go to *layer (owned by the caller afterwards), the
 * dequantized weights to *deq (owned by the caller afterwards: qd_deq_free; GPTQ's result
 * buffer is handed over, not copied). use_gptq selects GPTQ (gptq, awq+gptq) over RTN (rtn,
 * awq). *h_err gets tr((w - Q) H (w - Q)^T) where GPTQ kept its column losses
 * (qd_gptq_result.h_err), else -1. shared (or NULL) carries GPTQ's factorisation of h
 * between the linears of one input group (qd_gptq_shared). */
/* The GPTQ options of the job (its quantizer, damping, act order, static groups). */
qd_gptq_opts qd_pipeline_gptq_opts(const qd_pipeline *p);
/* global_scale > 0 replaces the quantizer's (NVFP4: the input group's, fixed by the lead
 * so that every part and every linear of a fused group share it). */
/* cfg: the linear's quantizer (p->qcfg, or the target_bpw plan's, qd_pipeline_linear_qcfg). */
int qd_pipeline_quantize_weight(qd_pipeline *p, const qd_quant_cfg *cfg, int use_gptq, float global_scale, const float *w,
                                int64_t n, int64_t k, const qd_gptq_hessian *h, qd_gptq_shared *shared, qd_qlayer *layer,
                                qd_deq *deq, qd_layer_result *res, double *h_err, qd_err *err);
/* The same with GPTAQ (job.gptaq): dxx the group's dXXT beside h; *h_err is -1. */
int qd_pipeline_quantize_weight_gptaq(qd_pipeline *p, const qd_quant_cfg *cfg, float global_scale, const float *w,
                                      int64_t n, int64_t k, const qd_gptq_hessian *h, const qd_gptaq_dxx *dxx,
                                      qd_qlayer *layer, qd_deq *deq, qd_layer_result *res, double *h_err, qd_err *err);

/* rel = sqrt(tr(D H D^T) / tr(W H W^T)), D = W - Q: the relative output error on the
 * inputs H was accumulated from (H = 2/n X^T X). w, q host [n, k]; h backend. d_err >= 0
 * is tr(D H D^T) known already (GPTQ's column losses): then only the denominator costs a
 * pass over H; d_err < 0 computes both. */
int qd_pipeline_rel_error(qd_pipeline *p, const float *w, const float *q, int64_t n, int64_t k,
                          const qd_gptq_hessian *h, double d_err, double *rel, qd_err *err);
/* The two traces of that ratio, trace[0] = tr(D H D^T) and trace[1] = tr(W H W^T), each
 * scaled by 2 / n as hessian_accum scales (d_err >= 0: trace[0] = d_err * 2 / n). */
int qd_pipeline_rel_traces(qd_pipeline *p, const float *w, const float *q, int64_t n, int64_t k,
                           const qd_gptq_hessian *h, double d_err, double *trace, qd_err *err);
/* The same with the denominator's trace known when den >= 0 (a trace part computed it for
 * these rows, part_factor.c): trace[1] = den, and only the numerator may cost a pass. With
 * q NULL and d_err 0, the denominator alone: trace[1] (trace[0] 0). */
int qd_pipeline_rel_traces_den(qd_pipeline *p, const float *w, const float *q, int64_t n, int64_t k,
                               const qd_gptq_hessian *h, double d_err, double den, double *trace, qd_err *err);
/* sqrt(max(num, 0) / den), 0 when den <= 0. */
double qd_pipeline_rel_ratio(double num, double den);
/* The same ratio computed directly, ||(W - Q) X^T|| / ||W X^T|| over x (host [rows, k]): two
 * GEMMs on the backend (job.error_direct_rows, for debugging the one above). */
int qd_pipeline_rel_error_direct(qd_pipeline *p, const float *w, const float *q, int64_t n, int64_t k,
                                 const float *x, int64_t rows, double *rel, qd_err *err);

int qd_pipeline_run_block_impl(qd_pipeline *p, qd_err *err);

/* ---- job.target_bpw (pipeline_bpw.c) ---- */

/* For a job with target_bpw: reads .quantd/bpw-plan.json, or (at block 0 only) makes it: one
 * pass of the calibration through the float model, block by block, each input group's
 * Hessian, per input group and candidate the job's quantizer on its linears (GPTQ with the
 * job's options, or RTN) and the block's output error with them (pipeline_bpw_block.c),
 * then the allocation (quant/algo/bpw_alloc.h) within the target, saved atomically. p->acts must hold block 0's inputs when it is made. No-op
 * without target_bpw. */
int qd_pipeline_bpw_prepare(qd_pipeline *p, qd_err *err);
/* The pre-flight of target_bpw (before any work): QD_EINVAL when even every linear's smallest
 * candidate stores more than the target. */
int qd_pipeline_bpw_preflight(qd_pipeline *p, qd_err *err);
/* The block-output estimate (pipeline_bpw_block.c). y (backend, the activations' shape, its
 * first n_seq sequences written) = the block on p->acts' first n_seq calibration sequences,
 * each linear li computing with w[li] (backend [n, k]) where w (or w[li]) is not NULL, the
 * loaded weight otherwise. */
int qd_pipeline_bpw_block_forward(qd_pipeline *p, const qd_block_weights *bw, const float *const *w, int64_t n_seq,
                                  float *y, qd_err *err);
/* The mean over rows (tokens) of ||yq_r - y_r||^2 / ||y_r||^2 (host [rows, hidden]; rows
 * with y_r = 0 are left out, 0 when none is left): the error each token's residual stream
 * carries relative to its own size, as the next block's norm sees it. */
double qd_bpw_token_rel_err2(const float *y, const float *yq, int64_t rows, int64_t hidden);
void qd_bpw_plan_free(qd_bpw_plan *b);
/* The quantizer of linear li in block: p->qcfg with the plan's bits and group size. */
qd_quant_cfg qd_pipeline_linear_qcfg(const qd_pipeline *p, int block, int li);
/* The stored bits of an [n, k] linear with bits and group size gs in p's format: codes,
 * F16 scales and (asymmetric) packed zero points. */
double qd_pipeline_bpw_size_bits(const qd_pipeline *p, int64_t n, int64_t k, int bits, int64_t gs);
struct cJSON;
/* The output's quantization_config q (the format's, one config group): its group replaced by
 * one per candidate in use, targeting the modules by name, and meta.target_bpw / meta.bpw.
 * No-op without a plan. */
int qd_pipeline_bpw_config_groups(const qd_pipeline *p, struct cJSON *q, qd_err *err);
/* GPTQ's format (pipeline_bpw_dynamic.c): 1 when the plan is written as `dynamic` overrides
 * (a format with g_idx: gptq, gptq_v2) instead of config groups. */
int qd_pipeline_bpw_is_dynamic(const qd_pipeline *p);
/* Refuses (by name) the models whose layers such rules cannot name for vLLM: MoE experts,
 * column groups vLLM fuses under names quantd does not write. 0 for other formats. */
int qd_pipeline_bpw_dynamic_preflight(const qd_pipeline *p, qd_err *err);
/* The plan into q: top-level bits / group_size the most common candidate vLLM builds, one
 * "+:" rule per block input group at another candidate, meta.target_bpw / meta.bpw. */
int qd_pipeline_bpw_dynamic(const qd_pipeline *p, struct cJSON *q, qd_err *err);
/* The report's "bpw": the candidates, and per quantized layer its bits, group size, bpw, each
 * candidate's estimated error and why (owned by the caller; NULL without a plan or memory). */
struct cJSON *qd_pipeline_bpw_report(const qd_pipeline *p);

/* ---- the output directory (pipeline_outdir.c) ---- */

/* Opens the output directory and its .quantd beneath the allowed roots (confine.h) and from
 * then on names them by descriptor; create makes what is missing (*created_out,
 * *created_ckpt: 1 when it did; may be NULL). Without create a missing output (or .quantd)
 * is not an error: it stays unopened and named by its path. */
int qd_pipeline_out_dirs_open(qd_pipeline *p, int create, int *created_out, int *created_ckpt, qd_err *err);
/* Puts the job's output path back where err names the output by its descriptor. */
void qd_pipeline_err_unmap(const qd_pipeline *p, qd_err *err);

/* ---- redoing finished blocks' forwards on resume (pipeline_replay.c) ---- */

/* Folds s [k] (host) into the block as group g's scales (g -1: the MoE experts' shared input)
 * and records it for the block's fold file. */
int qd_pipeline_fold(qd_pipeline *p, qd_block_weights *bw, int g, const float *s, int64_t k, qd_err *err);
void qd_pipeline_folds_clear(qd_pipeline *p);
/* Writes the current block's folds to path (an AWQ job's every block has one, perhaps empty). */
int qd_pipeline_folds_write(const qd_pipeline *p, const char *path, qd_err *err);
/* p->acts holds the inputs of block `from`: runs blocks from..to-1 again, each as the run
 * that committed it computed it (source weights, its AWQ folds, its quantized linears
 * decoded from its block file), so p->acts ends up holding the inputs of block `to`,
 * bit for bit what the uninterrupted run had. */
int qd_pipeline_replay(qd_pipeline *p, int from, int to, qd_err *err);

/* ---- capturing a block's inputs (pipeline_capture.c) ---- */

/* The most Hessian bytes one true-sequential capture pass fills at once when it collects a
 * wave of independent groups (MoE experts): 4 GiB, e.g. a Mixtral-8x7B block's eight
 * experts' gate/up Hessians (8 x 64 MiB) in one pass and their down Hessians (8 x 784 MiB)
 * four at a time (wave.h: the fewest passes that fit, of even sizes). */
#define QD_WAVE_HESSIAN_BYTES ((uint64_t)4 << 30)
/* The bytes of MLP activation (the last projection's input over every calibration row) a
 * dense true-sequential GPTQ block always keeps so that its final forward is that
 * projection alone instead of the whole MLP half again: 1 GiB (a 7B at 8 x 512 keeps 180
 * MB, SmolLM2-135M at 128 x 512 384 MB). A larger one (a 7B at 128 x 2048: 11.5 GB) is kept
 * where the machine has the memory (qd_pipeline_mlp_keep_decide, pipeline.h); the
 * estimate decides, and counts it where it is kept. */
#define QD_MLP_KEEP_BYTES ((uint64_t)1 << 30)


/* The first rows of each group's input, kept on the host: the kernel check's inputs
 * (job.kernel_check_rows) and the direct error's (job.error_direct_rows). */
typedef struct qd_row_slices {
    float *x[QD_MAX_GROUPS];          /* host [cap, K] or NULL (group absent, or option off) */
    int64_t rows[QD_MAX_GROUPS];      /* rows kept so far */
    int64_t cap;
} qd_row_slices;

/* GPTAQ's second stream inside one block (job.gptaq, pipeline_gptaq.c): the float pass
 * copies each group's input in the float model into keep[g]; a later pass over the
 * (partly quantized) block pairs the rows it sees with those, row for row, into dxx[g]. */
typedef struct qd_gptaq_capture {
    float *keep[QD_MAX_GROUPS];       /* backend [cap, K]: group g's float-model input, or NULL */
    qd_gptaq_dxx *dxx[QD_MAX_GROUPS]; /* the groups whose dXXT this pass accumulates, or NULL */
    int64_t rows[QD_MAX_GROUPS];      /* rows seen so far this pass */
    int64_t cap;                      /* the calibration rows */
    int keeping;                      /* 1: the float pass (copy into keep), 0: accumulate dxx */
} qd_gptaq_capture;

/* A capture part's record of a pass (part_capture.c): every input hook call's group and
 * rows, in order, and each group's rows in the order its calls came (host, owned). */
typedef struct qd_capture_rec {
    int n_calls, cap_calls;
    int *call_group;
    int64_t *call_rows;
    float *x[QD_MAX_GROUPS];          /* [cap[g], K] or NULL: group not recorded */
    int64_t rows[QD_MAX_GROUPS], cap[QD_MAX_GROUPS];
    int64_t keep[QD_MAX_GROUPS];      /* the most rows kept of group g (the rest's calls are
                                         not recorded): its kernel-check and direct-error rows
                                         when its Hessian is summed in the part; cap[g] otherwise */
} qd_capture_rec;

/* What one calibration pass over the block collects through the input hook. */
typedef struct qd_capture_ctx {
    qd_pipeline *p;
    int want[QD_MAX_GROUPS];          /* groups whose Hessian to accumulate */
    qd_gptq_hessian *acc[QD_MAX_GROUPS];
    float *xcap;                      /* backend [R, K] capture of group xcap_group, or NULL */
    int xcap_group;
    int64_t xcap_rows;                /* rows captured so far */
    int64_t xcap_max;                 /* > 0: capture only the first xcap_max rows */
    double *absum[QD_MAX_GROUPS];     /* host [K] or NULL: sum over rows of |x| (AWQ's x_mean) */
    int64_t absum_rows[QD_MAX_GROUPS];
    int stop_after;                   /* stop the forward after this group's input (-1: never) */
    int stopped;
    int64_t n_seq_max;                /* > 0: run only the first n_seq_max calibration sequences */
    int64_t seq0;                     /* the first sequence run (a batch boundary; 0: the first) */
    qd_capture_rec *rec;              /* set: the calls are recorded into it (with their Hessians,
                                         where acc[g] is set, summed in the part) */
    int no_hess;                      /* replay of a shard's record: its Hessians came summed */
    qd_row_slices *kcheck;            /* the kernel check's input rows, or NULL */
    qd_row_slices *direct;            /* the direct error's input rows, or NULL */
    int routed_seen;                  /* a forward reached the experts' router */
    qd_gptaq_capture *gq;             /* job.gptaq: the second stream's rows (borrowed), or NULL */
    /* Set by qd_capture_run for one pass: 1 + the wanted group whose input hook sees exactly
     * what group g's does in every call (qd_model_group_same_input), or 0. Such a g's
     * Hessian is not summed again but copied from that group's once the pass is done. */
    int twin[QD_MAX_GROUPS];
    qd_err *err;
} qd_capture_ctx;

void qd_capture_init(qd_capture_ctx *c, qd_pipeline *p, qd_err *err);
/* Runs the block over every calibration batch (sequences c->seq0 .. c->n_seq_max when those
 * are set) with c's hooks (c may be NULL); y (backend,
 * same shape as the activations) receives the outputs, or NULL. part:
 *   QD_BLOCK_ALL: p->acts through the whole block;
 *   QD_BLOCK_ATTN: p->acts through the attention half into p->mid, then p->mid through the
 *                  MLP half (the first pass that needs an MLP group's input);
 *   QD_BLOCK_MLP: p->mid through the MLP half only.
 * A forward that a hook stops at c->stop_after is not an error. */
int qd_capture_run(qd_pipeline *p, const qd_block_weights *bw, qd_block_part part, float *y, qd_capture_ctx *c,
                   qd_err *err);
/* p->n_shards and p->shard_starts for `shards` requested (job.calibration.shards): the
 * forward batches cut into at most that many runs, shard s taking batches s*nb/S .. (s+1)*nb/S. */
void qd_pipeline_shards_plan(qd_pipeline *p, int64_t shards);
/* Feeds rows (host [rows, K of group]) to c's hooks as if the pass had seen them: how a
 * capture part's record is taken over, call by call in its order. */
int qd_capture_replay(qd_capture_ctx *c, int group, const float *x, int64_t rows);
/* p->mid from the attention's context ctx (backend, [rows of p->acts, ko], as the output
 * projection's input hook saw it; may be p->mid itself when ko == p->hidden) and p->acts,
 * batch by batch as qd_capture_run runs them (qd_block_attn_finish): what QD_BLOCK_ATTN
 * would write, without re-running the attention. */
int qd_capture_mid_from_ctx(qd_pipeline *p, const qd_block_weights *bw, const float *ctx, int64_t ko, qd_err *err);
/* The same for sequences s_begin .. s_end only (s_begin at a batch's start), ctx, p->acts
 * and p->mid indexed from sequence 0. */
int qd_capture_mid_from_ctx_range(qd_pipeline *p, const qd_block_weights *bw, const float *ctx, int64_t ko,
                                  int64_t s_begin, int64_t s_end, qd_err *err);
/* y (backend, the activations' shape) = the block's output from p->mid and act (backend,
 * [rows of p->acts, kd], the MLP's last projection's input as its hook saw it), batch by
 * batch as qd_capture_run runs them (qd_block_mlp_finish): what the MLP half would write. */
int qd_capture_out_from_act(qd_pipeline *p, const qd_block_weights *bw, const float *act, int64_t kd, float *y,
                            qd_err *err);
/* The same for sequences s_begin .. s_end only (s_begin at a batch's start: the batches are
 * the whole run's), act, p->mid and y indexed from sequence 0. */
int qd_capture_out_from_act_range(qd_pipeline *p, const qd_block_weights *bw, const float *act, int64_t kd, float *y,
                                  int64_t s_begin, int64_t s_end, qd_err *err);

/* ---- GPTAQ's float stream (pipeline_gptaq.c) ---- */

/* The cases GPTAQ runs in, checked at open: the CPU backend, no experts, an integer grid
 * with per-row scales; anything else is refused naming it. */
int qd_pipeline_gptaq_check(const qd_pipeline *p, qd_err *err);
/* p->acts_fp for block `upto`: the calibration ids embedded, then the float blocks 0 ..
 * upto-1 run on them (a resumed job recomputes the float stream; every step is the one the
 * uninterrupted run took, so the bytes are the same). */
int qd_pipeline_gptaq_stream_open(qd_pipeline *p, const int32_t *ids, int upto, qd_err *err);
/* The float pass of a block (bw still float): p->acts_fp through the whole block into *y_fp
 * (backend, allocated here, the next block's float inputs), each present group's input
 * copied into gq->keep[g] (allocated here). */
int qd_pipeline_gptaq_float_pass(qd_pipeline *p, const qd_block_weights *bw, const qd_linear_plan *plans,
                                 qd_gptaq_capture *gq, float **y_fp, qd_err *err);
/* Frees gq's kept inputs and dXXT accumulators (dxx: [QD_MAX_GROUPS], may be NULL). */
void qd_pipeline_gptaq_capture_free(qd_pipeline *p, qd_gptaq_capture *gq, qd_gptaq_dxx *dxx);

/* ---- AWQ (pipeline_awq.c) ---- */

/* Searches every input group's AWQ scales on the float block and folds each into the
 * group's linears and the operator before it (norm or linear), in forward order; records
 * how v->o was treated. */
int qd_pipeline_awq_block_scales(qd_pipeline *p, qd_block_weights *bw, int block, const qd_linear_plan *plans,
                                 qd_err *err);

/* Calibration tokens AWQ's module-loss searches score candidates on (the first whole
 * sequences holding them); the candidate scales come from the job's awq.stats_tokens. */
#define AWQ_SEARCH_TOKENS ((int64_t)2048)

/* MoE blocks (pipeline_awq_moe.c): one scale for the experts' shared input, searched on the
 * MoE half's output over AWQ_SEARCH_TOKENS tokens (every expert's gate/up fake-quantized per
 * candidate, the router in float) and folded into post_attention_layernorm
 * (qd_block_fold_moe_input). Nothing for a block without experts. */
int qd_pipeline_awq_moe_input(qd_pipeline *p, qd_block_weights *bw, int block, qd_err *err);

/* ---- the block checkpoint file (pipeline_blockfile.c) ---- */

/* Writes every tensor of block i as the output will hold it: packed linears, float linears
 * and norms (rewritten in their dtype when AWQ changed them, else copied bit-exactly), and
 * every other tensor of the block copied. */
int qd_pipeline_write_block_file(qd_pipeline *p, qd_block_weights *bw, int block, qd_linear_out *outs,
                                 const int *norm_modified, const char *path, qd_err *err);

/* ---- the TP-aware layout (pipeline_tp.c; the permutation is quant/tp/tp_layout.c's) ---- */

/* For a tp_aware job, permutes block's MLP pair in outs (indexed by linear) in place: the
 * packed down projection's rows and the column layers' outputs (packed, or float weights and
 * biases, which are then marked modified so they are written from memory). Does nothing for
 * a plain job or when the down projection stayed in float. Errors name the block and say
 * which shape rule failed. */
int qd_pipeline_tp_apply_block(qd_pipeline *p, int block, qd_linear_out *outs, qd_err *err);

/* What the finished output records about the layout. */
typedef struct qd_pipeline_tp_summary {
    int n_regex;                 /* 0 or 1 */
    char regex[4096];            /* Python regex of every down projection with a trivial g_idx */
    char note[1024];             /* the report's layout_note; "" for a plain job */
} qd_pipeline_tp_summary;

/* Fills s from the model and the layers the checkpoint state lists (works after a resume). */
int qd_pipeline_tp_summarize(const qd_pipeline *p, qd_pipeline_tp_summary *s, qd_err *err);

#endif
