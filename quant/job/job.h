/* The job spec: what one quantization job asks for, as users write it in JSON.
 *
 * One versioned JSON object (docs/jobs.md documents every field). qp_job_parse reads it,
 * validates every field and the rules between them, fills every default (AutoGPTQ/AutoAWQ
 * conventions) and derives an id when none is given; qp_job_to_json writes the canonical
 * form back (every field, fixed key order, defaults filled), which the pipeline fingerprints
 * and the daemon stores. Error messages name the field: "job.bits: 5 is not one of 2, 3, 4, 8".
 *
 * Versioning: QP_JOB_VERSION is the version this build writes and the newest it reads. A
 * compatible addition (a new optional field with a default that keeps old behaviour) does
 * not bump it; a change of meaning does, and then the parser keeps reading the older
 * version and upgrades it in memory (write the upgrade next to parse_v1 in job.c). */
#ifndef QUANT_JOB_JOB_H
#define QUANT_JOB_JOB_H

#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>

#include "quant/job/perr.h"

#define QP_JOB_VERSION 1
#define QP_JOB_MAX_BYTES (64 * 1024)   /* largest payload the parser accepts */
#define QP_JOB_ID_MAX 64               /* longest id (ids go into Redis keys and file names) */
#define QP_JOB_SHARD_DEFAULT 4000000000ULL   /* "4GB", decimal like transformers' max_shard_size */
#define QP_JOB_WORKERS_ALL 0           /* job.workers "all" (the default) */
#define QP_JOB_WORKERS_MAX 4096        /* the largest count job.workers takes */

typedef enum qp_method {
    QP_METHOD_GPTQ = 0,
    QP_METHOD_AWQ,
    QP_METHOD_RTN,
    QP_METHOD_AWQ_GPTQ,      /* AWQ scaling, then GPTQ on the scaled weights */
} qp_method;

/* The output format: an index into the format table (quant/formats/format.h, qd_format_at),
 * which holds everything about each format (names, rules, packing, quantization_config).
 * The constants name the first three entries for code and tests that pick one; a new format
 * needs no constant here. */
typedef enum qp_format {
    QP_FORMAT_GPTQ = 0,      /* GPTQ checkpoint_format "gptq" (v1, zeros stored minus one) */
    QP_FORMAT_GPTQ_V2,       /* checkpoint_format "gptq_v2" */
    QP_FORMAT_AWQ_GEMM,      /* AutoAWQ "gemm", 4-bit only */
} qp_format;

typedef enum qp_calib_style {
    QP_CALIB_GPTQ = 0,       /* random seq_len windows of random documents (GPTQ, AutoGPTQ) */
    QP_CALIB_AWQ,            /* documents concatenated and cut into seq_len blocks (AutoAWQ) */
} qp_calib_style;

typedef enum qp_backend_choice { QP_BACKEND_AUTO = 0, QP_BACKEND_CPU, QP_BACKEND_CUDA } qp_backend_choice;

typedef enum qp_layout {
    QP_LAYOUT_PLAIN = 0,
    QP_LAYOUT_TP_AWARE,      /* permute MLP pairs so act-order down_proj shards cleanly */
} qp_layout;

typedef struct qp_job_calib {
    char *path;              /* owned; dataset file (JSONL with `field`, or plain text); NULL only for rtn */
    char *field;             /* owned; JSONL key holding the text, default "text" */
    int64_t samples;         /* number of sequences, default 128 */
    int64_t seq_len;         /* tokens per sequence, default 2048 (gptq style) or 512 (awq style) */
    uint64_t seed;           /* default 0 */
    qp_calib_style style;    /* default: awq for awq and awq+gptq, gptq otherwise */
    int64_t shards;          /* 1 to 16, default 1: the Hessians are summed per shard of the
                                calibration's forward batches, then in shard order, so the
                                shards' passes can run on several workers (docs/parallel.md) */
} qp_job_calib;

typedef struct qp_job_eval {
    int enabled;             /* 1 when the spec has an "eval" object */
    char *path;              /* owned; text file to measure perplexity on */
    int64_t seq_len;         /* default 2048 */
    int64_t max_windows;     /* 0 = every window of the file (default) */
} qp_job_eval;

/* Mixture-of-experts calibration (ignored for dense models). */
#define QP_MOE_MIN_TOKENS_DEFAULT 32
/* Calibration rows per layer the kernel check runs the packed layer on. */
#define QP_KERNEL_CHECK_ROWS_DEFAULT 64
typedef struct qp_job_moe {
    int calibrate_all_experts;  /* default 1: every expert's statistics from every token */
    int64_t min_tokens;         /* an expert calibrated on fewer tokens falls back to RTN */
    int awq_shared_input;       /* default 0: AWQ also searches one scale for every expert's
                                   gate/up (and the router's columns), folded into
                                   post_attention_layernorm (AutoAWQ's Mixtral recipe) */
} qp_job_moe;
/* AWQ's scale search (methods awq and awq+gptq): the statistics its candidates are formed
 * and scored from (x_mean, and o_proj's and down_proj's own-output Gram matrices) come from
 * the first whole calibration sequences holding stats_tokens tokens, 0 = every token
 * (AutoAWQ's choice). One float forward of the block over them is the search's largest cost
 * after the candidates; the module losses use 2048 of these tokens (AWQ_SEARCH_TOKENS). The
 * experts of a MoE block keep every token they were routed. Changes the output, so part of
 * the fingerprint; absent from the canonical form at the default. */
#define QP_AWQ_STATS_TOKENS_DEFAULT 8192
typedef struct qp_job_awq {
    int64_t stats_tokens;    /* >= 0; 0 = every calibration token */
} qp_job_awq;
/* How often the checkpoint keeps the calibration activations (the next block's inputs, the
 * bulk of its bytes: 2.1 GB per block of a 7B at 128 x 2048): after every acts_every-th
 * block. A resumed job starts from the last kept file and recomputes the blocks after it
 * with their already quantized weights (one forward each, byte-identical output), so what
 * an interruption costs is at most acts_every - 1 forwards, never a block's quantization.
 * Does not change the output (not in the fingerprint). */
#define QP_CKPT_ACTS_EVERY_DEFAULT 4
typedef struct qp_job_ckpt {
    int acts_every;          /* blocks, >= 1; 1 = every block (see qp_job_acts_every) */
} qp_job_ckpt;
/* Where the output will be served; the pre-flight refuses a job whose layers would not get a
 * fast kernel there (quant/formats/serving.h). Absent = no check, nothing changes. */
typedef struct qp_job_serve {
    int enabled;             /* 1 when the spec has a "serve" object */
    char engine[16];         /* "vllm" */
    char gpu[16];            /* "hopper" or "ampere" */
    int tp;                  /* tensor-parallel degree it will be served at, default 1 */
} qp_job_serve;

/* The arithmetic of the calibration forward's projections and of the GPTQ Hessians
 * ("compute"): F32 throughout, or products with bfloat16 inputs summed in F32 (what the
 * Python tools run on a GPU in bf16; on a CPU with AMX-BF16 several times faster than F32).
 * The block forward's projections include AWQ's module forwards over its candidates (and
 * on the CPU the attention's two products, backend op attention_bf16);
 * GPTQ's updates, AWQ's loss arithmetic and clip search and the error report stay F32.
 * auto (the default): bf16 when the checkpoint's weights are bfloat16 and the backend runs
 * bf16 products on a bf16 unit (AMX-BF16, compute capability 8.0+), else f32, as the Python
 * tools compute in the checkpoint's dtype; the pipeline resolves it once per job and records
 * the result in the checkpoint, so a resumed job keeps it (qd_pipeline_compute_resolve).
 * Changes the output, so part of the fingerprint; absent from the canonical form at auto. */
typedef enum qp_compute { QP_COMPUTE_F32 = 0, QP_COMPUTE_BF16 = 1, QP_COMPUTE_AUTO = 2 } qp_compute;

/* The most entries job.bpw_bits and job.bpw_group_sizes each hold. */
#define QP_JOB_BPW_MAX 8

typedef struct qp_job {
    int version;                    /* QP_JOB_VERSION after parsing */
    char id[QP_JOB_ID_MAX + 1];
    int id_derived;                 /* 1 when the id was derived from the payload */
    char *model;                    /* owned; HF model directory */
    char *output;                   /* owned; output directory */
    qp_method method;
    int bits;                       /* 2, 3, 4 or 8 */
    int group_size;                 /* -1 (one group per column) or positive */
    int sym;
    int desc_act;
    int static_groups;
    int true_sequential;
    int gptaq;                      /* GPTAQ (quant/algo/gptaq.h): GPTQ's updates also correct for
                                       the float model's inputs of each linear beside the
                                       quantized model's; method gptq only. Changes the output,
                                       so part of the fingerprint; absent from the canonical
                                       form when false */
    double damp_percent;            /* 0 < x < 1 */
    int scale_search;               /* qd_scale_search (quant/formats/quantizer.h): minmax
                                       (default) or mse; not with the AWQ methods */
    qp_format format;
    int scheme;                     /* 0: none; else 1 + an index into the scheme table
                                       (quant/formats/scheme.h, qd_scheme_at): the preset
                                       that set bits, group_size, sym and format (and the
                                       grid and activations they cannot say) */
    qp_job_calib calibration;
    qp_job_eval eval;
    char **modules_to_not_convert;  /* owned array of owned strings; module-name substrings */
    size_t n_modules_to_not_convert;
    uint64_t shard_size;            /* bytes per output shard */
    int overwrite;
    int priority;                   /* higher runs first; FIFO within one priority */
    int workers;                    /* the most workers one fan-out of a block's step uses, the
                                       lead included: 1..QP_JOB_WORKERS_MAX, or
                                       QP_JOB_WORKERS_ALL (every worker of the node); changes
                                       no output byte (not in the fingerprint) */
    qp_backend_choice backend;
    int tp;                         /* tensor-parallel degree the layout targets, >= 1 */
    qp_layout layout;
    qp_compute compute;             /* see qp_compute */
    int kernel_check;               /* run the dequant-kernel self-check on each packed layer */
    int kernel_check_rows;          /* on this many calibration rows of its input (1..65536) */
    int error_direct_rows;          /* debugging: each layer's error also computed directly over
                                       this many rows of its input (0: off, the default) */
    qp_job_moe moe;
    qp_job_awq awq;                 /* AWQ's scale-search statistics (see qp_job_awq) */
    qp_job_ckpt checkpoint;         /* how often activations are kept (see qp_job_ckpt) */
    qp_job_serve serve;             /* optional serving target (see qp_job_serve) */
    /* Mixed bits per linear (docs/methods.md, "Bits per weight"): target_bpw > 0 asks for
     * that average of stored bits per weight over the quantized linears (scales and zero
     * points counted); 0 = off (the default: every linear takes bits and group_size). The
     * candidates are every (bpw_bits[i], bpw_group_sizes[j]); n = 0 means the format's bit
     * widths, and the job's group_size. Changes the output (fingerprinted). */
    double target_bpw;
    int bpw_bits[QP_JOB_BPW_MAX];
    int n_bpw_bits;
    int bpw_group_sizes[QP_JOB_BPW_MAX];
    int n_bpw_group_sizes;
} qp_job;

/* The blocks between two kept activation files: checkpoint.acts_every, or 1 for layout
 * tp_aware (whose block files hold reordered MLP pairs no forward can be redone from). */
int qp_job_acts_every(const qp_job *job);

/* Names as they appear in JSON ("awq+gptq", "gptq_v2", ...); NULL for an invalid value. */
const char *qp_method_name(qp_method m);
const char *qp_format_name(qp_format f);
const char *qp_calib_style_name(qp_calib_style s);
const char *qp_backend_name(qp_backend_choice b);
const char *qp_layout_name(qp_layout l);
const char *qp_compute_name(qp_compute c);
/* The job's scheme (quant/formats/scheme.h), or NULL when it names none. */
const struct qd_scheme *qp_job_scheme(const qp_job *job);
/* Reverse lookups: 0 and *out set, or QP_EINVAL for an unknown name. */
int qp_method_parse(const char *s, qp_method *out);
int qp_format_parse(const char *s, qp_format *out);

/* Parses, validates and fills defaults. *out is a new job the caller frees with
 * qp_job_free; on failure *out is NULL and err says which field and why. The payload need
 * not be NUL-terminated; payloads over QP_JOB_MAX_BYTES are refused. */
int qp_job_parse(const char *json, size_t len, qp_job **out, qp_err *err);
/* Same from an already parsed object (borrowed, not modified). */
int qp_job_from_cjson(const cJSON *obj, qp_job **out, qp_err *err);

/* Sets every field of job to the defaults for method: calibration.field becomes a malloc'd
 * "text"; model, output and calibration.path stay NULL for the caller to set (malloc'd),
 * then qp_job_validate checks the result. Overwrites without freeing, so use it on fresh
 * memory. Returns 0 or QP_ENOMEM. */
int qp_job_init_defaults(qp_job *job, qp_method method);
/* Checks every range and cross-field rule of a job built in code (qp_job_parse runs it too). */
int qp_job_validate(const qp_job *job, qp_err *err);
/* Deep copy; NULL on allocation failure. Caller frees with qp_job_free. */
qp_job *qp_job_dup(const qp_job *job);
void qp_job_free(qp_job *job);

/* Flags for qp_job_to_json. */
enum {
    QP_JOB_JSON_PRETTY = 1,        /* indented, for humans; canonical output is compact */
    QP_JOB_JSON_NO_ID = 2,         /* leave out "id" (what the id itself is derived from) */
    QP_JOB_JSON_OUTPUT_ONLY = 4,   /* only the fields that change the output bytes: for the
                                      checkpoint fingerprint (leaves out id, model, output,
                                      calibration.path, eval, overwrite, priority, workers,
                                      backend, kernel_check, kernel_check_rows,
                                      error_direct_rows, checkpoint and serve) */
};
/* Canonical JSON: every field in the order of qp_job_fields, defaults filled; the later
 * additions (workers, compute, kernel_check_rows, error_direct_rows, moe, awq, checkpoint, serve)
 * only when not at their defaults, so that older jobs keep their derived ids. malloc'd,
 * caller frees with free(); NULL on allocation failure. */
char *qp_job_to_json(const qp_job *job, unsigned flags);
/* The same as a cJSON tree (caller frees with cJSON_Delete). */
cJSON *qp_job_to_cjson(const qp_job *job, unsigned flags);

/* The id a job without one gets: "j-" + the first 16 hex digits of the SHA-256 of its
 * canonical JSON without "id". Equal specs (whatever their whitespace, key order or
 * spelled-out defaults) get equal ids, which is what lets the daemon refuse a duplicate. */
int qp_job_derive_id(const qp_job *job, char id[QP_JOB_ID_MAX + 1]);

/* The fields the spec has, one entry each (job.c): the parser takes the keys it accepts in
 * every object from this table (any other key is refused, naming it), and docs/jobs.md's
 * field table is checked against it (tests/unit/test_job_fields.c checks the table against
 * the parser's defaults and canonical form, and the doc against the table). A new field is
 * one entry in job.c's table, its parse and canonical lines, and one row in docs/jobs.md. */
typedef struct qp_job_field {
    const char *name;          /* dotted path as users write it: "bits", "calibration.samples" */
    const char *type;          /* as the doc writes it: "integer", "number", "bool", "string",
                                  "object", "array of strings", "integer or string" */
    const char *def;           /* the default as the canonical JSON prints it ("128", "\"text\"",
                                  "null", "{}" for an object of defaults), or "required" or
                                  "derived" (id) where there is none */
    const char *def_awq;       /* the default for methods awq and awq+gptq where it differs,
                                  else NULL */
    const char *const *values; /* an enum's names, NULL-terminated; NULL otherwise (format's
                                  come from the format table: use qp_job_field_value) */
    const char *example;       /* a valid value other than the default, as JSON, for tests;
                                  NULL where there is none (version, serve.engine) */
    const char *def_no_gptq;   /* the default for methods rtn and awq (no GPTQ) where it
                                  differs, else NULL; it wins over def_awq */
} qp_job_field;
/* The table, in the order of the canonical form; *n gets its length. Static, never freed. */
const qp_job_field *qp_job_fields(size_t *n);
/* The entry called name (dotted), or NULL. */
const qp_job_field *qp_job_field_find(const char *name);
/* The i-th name an enum field accepts, NULL past the end or for a field that is no enum. */
const char *qp_job_field_value(const qp_job_field *f, size_t i);

/* Job profiles (job_profile.c): the JSON object of fields profile `name` sets (a static
 * string), NULL when unknown; *what (may be NULL) gets a one-line description.
 * qp_job_profile_name(i) lists them (NULL past the end). */
const char *qp_job_profile(const char *name, const char **what);
const char *qp_job_profile_name(size_t i);

/* Parses a size: a non-negative integer of bytes or a string "<number><unit>" with unit B,
 * KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024), any case, as
 * transformers' max_shard_size does ("4GB", "500MB", "1.5GiB"). */
int qp_size_parse(const char *s, uint64_t *out);

#endif
