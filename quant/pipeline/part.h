/* Private to quant/pipeline: the parts a block's step is split into when it is run over
 * several workers (docs/parallel.md), and the files they exchange through the job's
 * checkpoint directory (.quantd/parts/).
 *
 * A part file (little-endian):
 *   "QDPART\0\0" | u32 version | u32 0 | u64 meta_len | u64 data_len | u64 checksum | meta | data
 * meta is a JSON object (what the part is, its scalars, and "arrays": {name: [offset, bytes]}
 * into data); data starts 64-byte aligned after the meta (spaces pad the JSON), and each
 * array starts 64-byte aligned and is padded to 64. The checksum is qd_hash64 over meta
 * seeding a four-lane form of it over data (part_file.c): a file damaged on disk is refused, and the
 * part is computed again, never used. Files are written to a temp name and renamed, without
 * fsync (qd_fs_write_scratch_iov): a crash can only cost a recomputation. An
 * output file names the checksum of the input it was computed from ("in_checksum"), so an
 * output left by an earlier attempt is used only for that very input. Bump
 * QD_PART_VERSION when the layout or a meta key changes. */
#ifndef QUANT_PIPELINE_PART_H
#define QUANT_PIPELINE_PART_H

#include <stdint.h>

#include "quant/pipeline/pipeline_internal.h"

#define QD_PART_VERSION 3

/* ---- the container (part_file.c) ---- */

typedef struct qd_part_arr {
    const char *name;
    const void *data;            /* borrowed */
    uint64_t bytes;
} qd_part_arr;

struct cJSON;
/* Writes meta (borrowed; its "arrays" member is added here) and the arrays to name in the
 * directory held as dirfd, atomically. *checksum (may be NULL) gets the file's checksum. */
int qd_part_file_write(int dirfd, const char *name, struct cJSON *meta, const qd_part_arr *arrs, int n,
                       uint64_t *checksum, qd_err *err);

typedef struct qd_part_file {
    struct cJSON *meta;          /* owned */
    char *data;                  /* owned: the data section */
    uint64_t data_len;
    uint64_t checksum;
} qd_part_file;
/* Reads name in dirfd (a regular file, no link), checks magic, version, sizes and the
 * checksum. QD_ENOTFOUND when absent, QD_EFORMAT when damaged (the message says how). */
int qd_part_file_read(int dirfd, const char *name, qd_part_file *f, qd_err *err);
/* Reads only the header's checksum (0 when the file is absent or not a part file). */
uint64_t qd_part_file_checksum(int dirfd, const char *name);
/* Only the meta of name, unchecked (NULL when absent or unreadable); the caller frees it. */
struct cJSON *qd_part_file_meta(int dirfd, const char *name);
/* The array `name` of f, which must hold exactly `bytes`; NULL (and err set) otherwise. */
const void *qd_part_file_arr(const qd_part_file *f, const char *name, uint64_t bytes, qd_err *err);
void qd_part_file_free(qd_part_file *f);    /* accepts a zeroed one */
/* Removes every file in dirfd whose name starts with prefix (NULL: every file). */
void qd_part_files_remove(int dirfd, const char *prefix);
/* Removes, in one pass over dirfd, the outputs of parts 0..n-1 of step `step` of block
 * `block` computed from the inputs whose checksums are in_sums, by every maker. */
void qd_part_outputs_remove(int dirfd, int block, const char *step, int n, const uint64_t *in_sums);
/* Removes the file name in dirfd (absent is fine). */
void qd_part_file_remove(int dirfd, const char *name);

/* ---- float arrays in fewer bytes, losing nothing (part_codec.c) ---- */

/* How a float array is stored: as it is, as half precision when every value is exactly a
 * BF16 (or F16: weights read from a half-precision checkpoint), or as the upper triangle
 * (diagonal included, row by row) of a square matrix whose lower triangle is the upper's
 * transpose (a Hessian) or all +0.0 (GPTQ's factor). The writer checks the array and takes
 * the first form that gives back its very bits; the meta's "enc" names the forms used. */
typedef enum {
    QD_PART_ENC_F32,
    QD_PART_ENC_BF16,
    QD_PART_ENC_F16,
    QD_PART_ENC_UPPER_SYM,
    QD_PART_ENC_UPPER_ZERO,
} qd_part_enc;

typedef struct qd_part_farr {
    qd_part_arr arr;             /* what to write: x itself, or own */
    qd_part_enc enc;
    void *own;                   /* owned: the encoded copy, or NULL */
} qd_part_farr;

/* Chooses x's form (n floats, borrowed until the file is written). k_square > 0: x is
 * [k_square, k_square] and the triangles are tried; 0: the halves are. */
int qd_part_farr_make(const char *name, const float *x, uint64_t n, int64_t k_square, qd_part_farr *a, qd_err *err);
void qd_part_farr_free(qd_part_farr *a);     /* accepts a zeroed one */
/* Records a's form in meta's "enc" (nothing for F32); QD_ENOMEM on failure. */
int qd_part_farr_note(struct cJSON *meta, const qd_part_farr *a);
/* Decodes f's array name into dst (n floats; k_square as it was written). */
int qd_part_farr_read(const qd_part_file *f, const char *name, float *dst, uint64_t n, int64_t k_square, qd_err *err);

/* ---- the quantize step's parts: a row range of one linear each (part_quant.c) ---- */

/* GPTQ and RTN quantize a linear's output rows independently once its Hessian is known, so
 * a linear is cut into row ranges of at most QD_PART_ROWS rows (a multiple of 64 each but
 * the last): one part each. The cut is a rule of the shape alone, the same whatever runs
 * it, in memory or over workers; a linear of up to QD_PART_ROWS rows is one part. */
#define QD_PART_ROWS 2048
/* Fills starts[0..P] with the ranges' first rows and n (at most max ranges); returns P. */
int qd_qpart_row_ranges(int64_t n, int64_t *starts, int max);
#define QD_PART_MAX_RANGES 64
/* The most parts one fan-out announces (the wire's parts.n limit, proto/wire.md): a run of
 * more stays in the lead, in memory. */
#define QD_PART_MAX_FANOUT 4096

typedef struct qd_fpart_done qd_fpart_done;

/* What one part reads. Pointers are borrowed. */
typedef struct qd_qpart_in {
    int linear;                  /* the model's linear index */
    int gptq;                    /* GPTQ (else RTN) */
    int use_losses;              /* w is the weight GPTQ sees (not clipped): its column losses
                                    give the error's numerator */
    int64_t r0, r1;              /* the rows of the linear this part quantizes */
    const float *w;              /* host [r1 - r0, k]: those rows of the weight to quantize (AWQ: clipped) */
    const float *w_ref;          /* host [r1 - r0, k]: the rows the error is measured against */
    const qd_gptq_hessian *h;    /* the Hessian of the linear's inputs */
    qd_layer_result res;         /* as the lead filled it: name, method, block, whole shape, routing */
    int shared_last;             /* the group's last part: the shared factorisation is freed once
                                    its quantization is done (not written to files) */
    float global_scale;          /* NVFP4: the global scale of the linear's input group (fused
                                    q/k/v, gate/up share one, as vLLM needs); 0 otherwise */
    int bits;                    /* job.target_bpw: the linear's bits and group size from the */
    int64_t group_size;          /* plan (qd_pipeline_linear_qcfg); bits 0: the job's */
    const qd_gptaq_dxx *dxx;     /* job.gptaq: the group's dXXT beside h (GPTAQ instead of GPTQ;
                                    in memory only: such a run is never fanned out), or NULL */
    const qd_fpart_done *fac;    /* fan-out: the factor part's output its group's factor is in,
                                    else NULL (beside the Hessian, or made by the part) */
    const st_tensor *src;        /* the model's stored weight when the input file names its rows
                                    instead of holding them (qd_qpart_src_find), else NULL */
    uint64_t src_sum;            /* with src: the checksum of the rows' stored bytes */
    int den_known;               /* 1: den is the error's denominator trace of these rows */
    double den;                  /* (qd_pipeline_rel_traces' trace[1]), computed by a trace part
                                    beside the factorisation (part_factor.c); the part skips it */
} qd_qpart_in;

/* What it gives back. */
typedef struct qd_qpart_out {
    qd_qlayer layer;             /* the rows' codes, scales, zeros and g_idx; owned */
    qd_deq dq;                   /* host [r1 - r0, k]: the rows dequantized; owned */
    double trace[2];             /* qd_pipeline_rel_traces of the rows */
    qd_layer_result res;         /* in's, with damp, fallback, seconds and note */
    double stage[QD_STAGE_COUNT];/* seconds per stage spent on it */
} qd_qpart_out;

/* Quantizes rows r0..r1 of one linear on p->be with p's job and quantizer (p needs nothing
 * else: qd_pipeline_part_run makes such a p) and measures their error's traces. shared (or
 * NULL) carries GPTQ's factorisation between the parts of one group. */
int qd_qpart_compute(qd_pipeline *p, const qd_qpart_in *in, qd_gptq_shared *shared, qd_qpart_out *out,
                     qd_err *err);
void qd_qpart_out_free(qd_qpart_out *o);

/* One linear's finished quantization. */
typedef struct qd_qlinear {
    qd_packed packed;            /* owned */
    qd_deq dq;                   /* host [n, k]: the weight the block computes with from now on; owned */
    qd_layer_result res;
} qd_qlinear;

/* The inputs of a linear's finish that stay with the lead (borrowed; NULL/0 when unused). */
typedef struct qd_qlinear_aux {
    const float *bias;           /* [n] */
    const float *w_ref;          /* [n, k]: the whole reference weight (the direct error only) */
    const float *kx;             /* [krows, k]: the kernel check's inputs */
    int64_t krows;
    const float *dx;             /* [drows, k]: the direct error's inputs */
    int64_t drows;
    float act_amax;              /* max |x| of the linear's calibration inputs (its Hessian's
                                    x_amax): the static activation scale of schemes FP8 and
                                    NVFP4 is made from it */
} qd_qlinear_aux;

/* Takes a linear's P parts over (outs are emptied): their rows merged into one layer (P == 1:
 * moved), packed in the job's format, the error from their traces (P == 1: the one
 * linear's traces as they are), then the direct error and the kernel check on the whole.
 * Seconds go to p's cost. */
int qd_qpart_finish(qd_pipeline *p, const qd_qpart_in *ins, qd_qpart_out *outs, int P, const qd_qlinear_aux *aux,
                    qd_qlinear *done, qd_err *err);
void qd_qlinear_free(qd_qlinear *l);

/* The names of the files of block b's quantize step: a group's Hessian, a part's input and
 * its output. An output is named by its input's checksum too: the fan-outs of a block reuse
 * the part indices, and an output left by a failed attempt is found again (and kept) only
 * when the retry writes that very input; and by a hash of its maker (qd_part_maker_desc):
 * GPTQ's bits depend on the CPU's or GPU's kernels, so the lead takes over only rows a
 * backend like its own computed (cap >= 96). */
void qd_qpart_name_hessian(char *buf, size_t cap, int block, int group);
void qd_qpart_name_in(char *buf, size_t cap, int block, int index);
void qd_qpart_name_out(char *buf, size_t cap, int block, int index, uint64_t in_checksum, const char *maker);

/* Writes group g's Hessian of block b for the parts that read it, with GPTQ's factorisation
 * of it when sh is not NULL (qd_gptq_shared_make: the parts then skip factoring it again). */
int qd_qpart_write_hessian(int dirfd, int block, int group, const qd_gptq_hessian *h, const qd_gptq_shared *sh,
                           qd_err *err);
/* Writes part `index`'s input (group: the Hessian file it reads); *checksum gets the file's. */
int qd_qpart_write_in(int dirfd, int block, int index, int group, const qd_qpart_in *in, uint64_t *checksum,
                      qd_err *err);
/* Reads part `index`'s output if it is there, whole and computed from the input whose
 * checksum is in_checksum: 0 with *out filled; QD_ENOTFOUND or QD_EFORMAT (err says why)
 * otherwise; be is the lead's backend (the output must be one a backend like it made); in is
 * the part's input as the lead knows it (its shape). *worker (cap >= 64)
 * gets the name of the worker that computed it. */
int qd_qpart_read_out(int dirfd, int block, int index, uint64_t in_checksum, const qd_backend *be,
                      const qd_qpart_in *in, qd_qpart_out *out, char *worker, qd_err *err);

/* Runs part `index` of block b's quantize step from its input file and writes its output
 * file (worker: the name recorded in it). */
int qd_qpart_run_file(qd_pipeline *p, int dirfd, int block, int index, const char *worker, qd_err *err);
/* Reads the Hessian file `name` (whose checksum must be want_sum, when not 0) into *h on be,
 * expecting [k, k]; and into *sh (may be NULL) the factorisation beside it, or, when fac_name
 * is not NULL, the one in that factor part's output, whose checksum must be fac_sum. */
int qd_qpart_read_hessian(int dirfd, const char *name, uint64_t want_sum, const char *fac_name, uint64_t fac_sum,
                          qd_backend *be, int64_t k, qd_gptq_hessian *h, qd_gptq_shared *sh, qd_err *err);
/* Reads the factor part's output fac_name (whose checksum must be fac_sum) into *sh on be,
 * keyed to h (the Hessian it was made from: whole, or its diagonal alone). */
int qd_qpart_read_factor(int dirfd, const char *fac_name, uint64_t fac_sum, qd_backend *be, const qd_gptq_hessian *h,
                         qd_gptq_shared *sh, qd_err *err);
/* A backend buffer of `bytes` as host memory: itself on the CPU, else a malloc'd copy (*own
 * set: the caller frees it). NULL when out of memory or the copy failed. */
const float *qd_part_host_view(qd_backend *be, const float *buf, size_t bytes, float **own);

/* ---- the factorisation step's parts: one group's Hessian each (part_factor.c) ---- */

/* When one fan-out quantizes the linears of two or more GPTQ groups, each group's Hessian
 * is factored by a part of its own (step "factor") before the row parts, which then read the
 * factor from its output. A factorisation's bits depend on the backend that makes it, so an
 * output is named by its input's checksum and by a hash of its maker's desc: the lead takes
 * over only one made by a backend like its own, and factors the other groups itself. */

/* What the bits of a part be computes depend on: its desc and the GPTQ form asked for
 * (cap >= 160); and the hash of that an output's name carries. */
void qd_part_maker_desc(const qd_backend *be, char *buf, size_t cap);
uint32_t qd_part_maker_hash(const char *desc);
/* The names of factor part `index`'s input and of its output made by a backend of desc
 * (cap >= 96). */
void qd_fpart_name_in(char *buf, size_t cap, int block, int index);
void qd_fpart_name_out(char *buf, size_t cap, int block, int index, uint64_t in_checksum, const char *desc);

/* A factorisation in a part file being made: its record and factor, held until written. */
typedef struct qd_part_factor_w {
    double rec[8];
    qd_part_farr fac;
    float *own;                  /* a host copy of a device factor, or NULL */
} qd_part_factor_w;
/* Adds sh's factorisation of a [k, k] Hessian to a part file being made: meta's "factor",
 * and the arrays factor_rec and (when it factored) fac appended at a[*na] (room for 2). */
int qd_part_factor_put(struct cJSON *meta, const qd_gptq_shared *sh, int64_t k, qd_part_factor_w *fw, qd_part_arr *a,
                       int *na, qd_err *err);
void qd_part_factor_w_free(qd_part_factor_w *fw);   /* accepts a zeroed one */
/* Reads f's factorisation into *sh on be, keyed to h (the Hessian it was made from). */
int qd_part_factor_get(const qd_part_file *f, const char *name, qd_backend *be, const qd_gptq_hessian *h,
                       qd_gptq_shared *sh, qd_err *err);

/* Writes factor part `index`'s input: group's Hessian file (written before) of width k. */
int qd_fpart_write_in(int dirfd, int block, int index, int group, int64_t k, uint64_t *checksum, qd_err *err);
/* Runs factor part `index` from its input file: the Hessian factored on p->be with p's GPTQ
 * options, written as its output (named by the input's checksum and p->be's desc). */
int qd_fpart_run_file(qd_pipeline *p, int dirfd, int block, int index, const char *worker, qd_err *err);
/* A factor part's output, as the lead found it. */
struct qd_fpart_done {
    char name[96];               /* the output file: the row parts of its group read it */
    uint64_t checksum;           /* its checksum, which they check */
    char worker[64];
    double seconds;
};
/* Finds part `index`'s output made by a backend like be from the input of checksum
 * in_checksum, reads it whole (its checksum) and checks it: 0 with *done filled; QD_ENOTFOUND
 * or QD_EFORMAT (err says why) otherwise. */
int qd_fpart_read_out(int dirfd, int block, int index, uint64_t in_checksum, const qd_backend *be, int64_t k,
                      qd_fpart_done *done, qd_err *err);

/* Trace parts. The quantize parts of a fan-out measure their rows' error against
 * tr(W H W^T) (qd_pipeline_rel_traces' denominator), which needs W and H but not the factor:
 * when one group's factorisation would keep the lead alone while the other workers wait (one
 * GPTQ Hessian in the fan-out, on the CPU, wide enough: qd_tpart_pays), the factor step gets,
 * besides that factor part, a trace part for each quantize part, computing the denominator
 * of its rows on whichever worker is free; the quantize parts then skip it (in->den). A trace
 * part's input is a factor-step input (numbered after the factor parts) of kind "trace"; its
 * output is named like a factor's, by its input's checksum and its maker. */

/* Whether a fan-out whose one GPTQ Hessian is [k, k] and whose largest quantize part has
 * max_rows rows gets trace parts: on the CPU backend only (a GPU factors in a fraction of a
 * second), when the factorisation (k^3 / 3 flops) outlasts the trace of the largest part
 * (max_rows k^2 flops), i.e. k > 3 max_rows. mode (qd_pipeline_set_trace_parts): -1 by that
 * rule, 0 never, 1 always. */
int qd_tpart_pays(const qd_backend *be, int64_t k, int64_t max_rows, int mode);
/* Writes trace part `index`'s input: in's rows (named in the model, in->src), group's Hessian
 * file (written before, its checksum in the input); *checksum gets the file's. */
int qd_tpart_write_in(int dirfd, int block, int index, int group, const qd_qpart_in *in, uint64_t *checksum,
                      qd_err *err);
/* Reads trace part `index`'s output (made by a backend like be from the input of checksum
 * in_checksum) into *den; *worker (cap >= 64) and *seconds from it. 0, or QD_ENOTFOUND or
 * QD_EFORMAT (err says why). */
int qd_tpart_read_out(int dirfd, int block, int index, uint64_t in_checksum, const qd_backend *be, double *den,
                      char *worker, double *seconds, qd_err *err);

/* ---- the capture step's parts: a run of calibration batches each (part_capture.c) ---- */

/* A forward pass of a dense block on the CPU backend can be cut at batch boundaries into at
 * most QD_CPART_MAX parts: each runs the block as the lead holds it over its batches and
 * records every input hook call (group, rows, values) and the outputs the pass asks for; the
 * lead feeds the calls to its hooks in order, so what they collect is the in-memory pass's,
 * bit for bit. */
#define QD_CPART_MAX 16
#define QD_CPART_MAX_STATES 16
/* The cut of block's passes: seq_starts[0..P] (room for QD_CPART_MAX + 1); returns P, or 0
 * when its passes are not cut (no fan-out hook, a device backend, experts, one batch). */
int qd_cpart_plan(const qd_pipeline *p, int block, int64_t *seq_starts);
/* Whether a pass over half up to stop_group's input (-1: the whole half) computes enough to
 * be worth its files: it runs a linear of a present group (present[g]) before the stop. A
 * pass that only normalises its input and hands it to the hook stays in the lead. */
int qd_cpart_pass_pays(const qd_pipeline *p, const int *present, qd_block_part half, int stop_group);

/* The linears of a block the lead has quantized, written for the parts (each linear once a
 * block, as the lead's dequantized weights), in the files named here. Zeroed at the block's
 * start; the files go with the block's other part files at its commit. */
typedef struct qd_cpart_state {
    int sum_known;               /* block_sum: 0 not yet hashed, 1 hashed, -1 not hashable */
    uint64_t block_sum;          /* the checksum of the block's stored bytes the parts check */
    int n_files;
    char names[QD_CPART_MAX_STATES][48];
    uint64_t sums[QD_CPART_MAX_STATES];
    int written[QD_MAX_LINEARS];
} qd_cpart_state;

/* What one cut pass runs. */
typedef struct qd_cpart_spec {
    qd_block_part half;          /* the whole block; its attention half, then the MLP half (the
                                    residual stream between goes to p->mid); its MLP half from p->mid */
    const float *x;              /* backend [calib rows, hidden]: the half's input (p->acts, or p->mid for the MLP) */
    float *y;                    /* backend, the same shape: the half's outputs, or NULL */
    qd_cpart_state *st;          /* the block's state files, or NULL: the block is as loaded */
    const int *quantized;        /* with st: [QD_MAX_LINEARS], the linears quantized so far */
    int64_t act_width;           /* > 0: the last forward from the kept MLP activation instead of
                                    a half: x is that activation [calib rows, act_width], p->mid
                                    the residual stream, y the block's outputs
                                    (qd_capture_out_from_act); no hook runs */
    int64_t ctx_width;           /* > 0: the residual stream after the attention from the kept
                                    context instead of a half: x is that context [calib rows,
                                    ctx_width], p->acts the block's input, y (p->mid itself: each
                                    part's rows read before any is written) the residual stream
                                    (qd_capture_mid_from_ctx); no hook runs */
    int experts;                 /* a MoE block's MLP pass cut by its wanted groups instead of its
                                    batches (qd_cpart_experts_pay): x is p->mid, written once for
                                    every part; no y */
} qd_cpart_spec;

/* Whether a MoE block's pass over its MLP half from p->mid into scratch (y NULL), taking the
 * inputs of c's wanted groups (each an expert's or the shared expert's, two or more Hessians
 * to sum: groups whose input is another's in every call count once), is cut
 * by those groups: each part runs the router and only its groups' experts over every
 * calibration row, sums their Hessians (in shards as the lead would) and sends back the
 * Hessians, the rows the hooks keep and the routed-token counts. The part holds the block
 * with its experts' quantized linears, sent in its input. CPU backend, fan-out hook; not
 * AWQ's, GPTAQ's or a pass that keeps a group's whole input. */
int qd_cpart_experts_pay(const qd_pipeline *p, int block, qd_block_part half, const float *y, const qd_capture_ctx *c);
void qd_cpart_name_in(char *buf, size_t cap, int block, int index);
void qd_cpart_name_out(char *buf, size_t cap, int block, int index, uint64_t in_checksum, const char *desc);
/* Writes part `index`'s input: sequences seq0..seq1 of spec->x, the groups c->want marks,
 * c->stop_after, the state files, and block_sum, the checksum of the block's stored bytes
 * the part must find; *checksum gets the file's. An expert cut's part (spec->experts): every
 * sequence, x named by the file x_name of checksum x_sum, and instead of state files the
 * quantized linears (spec->quantized) of its groups' experts, from bw. */
int qd_cpart_write_in(qd_pipeline *p, int dirfd, int block, int index, int64_t seq0, int64_t seq1,
                      const qd_capture_ctx *c, const qd_cpart_spec *spec, const qd_block_weights *bw,
                      const char *x_name, uint64_t x_sum, uint64_t block_sum, uint64_t *checksum, qd_err *err);
/* Runs capture part `index` from its input file (p: a part runner's; the model is opened from
 * p->job here, and the block kept loaded for the process's next capture parts) and writes its
 * output, named by the input's checksum and p->be's desc. */
int qd_cpart_run_file(qd_pipeline *p, int dirfd, int block, int index, const char *worker, qd_err *err);
/* Frees the block kept between capture parts (qd_pipeline_part_idle calls it). */
void qd_cpart_cache_drop(void);
/* The lead's pass (qd_capture_run(p, bw, spec->half, spec->y, c), or with spec->act_width
 * qd_capture_out_from_act) cut into the P parts of
 * seq_starts: the state written, the inputs written, the fan-out hook called, each output
 * taken over in order, a part whose output is missing, damaged or made by an unlike backend
 * run here in memory; the step's files removed. *t_files gets the seconds spent writing and
 * reading the files. */
int qd_cpart_run(qd_pipeline *p, const qd_block_weights *bw, int block, const int64_t *seq_starts, int P,
                 const qd_cpart_spec *spec, qd_capture_ctx *c, double *t_files, qd_err *err);

/* ---- a part's weight rows read from the model's own files (part_src.c) ---- */

/* A worker can read a part's rows of the weight from the model's checkpoint, which every
 * worker opens beneath the same allowed roots, instead of the lead writing them into the
 * part's input: when the model stores the linear as a plain BF16, F16 or F32 [n, k] tensor
 * whose rows r0..r1, converted to F32, are in->w's bit for bit (the lead checks), and w is
 * also the error's reference (GPTQ and RTN without AWQ's scales or clip; an FP8 checkpoint's
 * blocks and fused expert tensors are written as before). Sets in->src and returns 1 when
 * so, 0 otherwise (or on any failure to tell: the rows are then written). */
int qd_qpart_src_find(qd_pipeline *p, int block, qd_qpart_in *in);
/* Puts in->src's name and the checksum of its rows' stored bytes in meta. */
int qd_qpart_src_note(struct cJSON *meta, const qd_qpart_in *in);
/* The worker's side: reads the rows meta names from job's model (opened here and kept open
 * for the process's next parts of that model; the lead passes the checkpoint it holds open as
 * `open`, whose rows it checked, else NULL) into w
 * ([rows, k] floats), refusing (QD_EFORMAT, naming the tensor) a tensor of another shape or
 * dtype or rows whose stored bytes no longer have the checksum the lead saw: the part then
 * fails and the lead computes it itself, from the files it opened. 0, or QD_ENOTFOUND when
 * meta names no source (the rows are in the file). */
int qd_qpart_src_read(const qp_job *job, const st_model *open, const struct cJSON *meta, int64_t r0, int64_t r1,
                      int64_t n, int64_t k, float *w, qd_err *err);
/* The checksum part files use (part_file.c: four lanes of qd_hash64's step), over n bytes. */
uint64_t qd_part_checksum(const void *data, uint64_t n);

/* The setup every pipeline and every part runner share: p->fmt and p->qcfg from p->job. */
int qd_pipeline_quant_setup(qd_pipeline *p, qd_err *err);

#endif
