/* The output format table: one descriptor per packed checkpoint layout, holding every piece
 * of knowledge about that layout. Nothing outside quant/formats names a format:
 *   - the job spec (quant/job/job.c) takes the names, the default and the rules on bits, group
 *     size, symmetry and act-order from here (qd_format_check_settings, qd_format_default);
 *   - the pipeline asks which layers fit (qd_format_fit_layer), packs (check, pack), names
 *     the checkpoint tensors (tensors) and writes quantization_config (quant_config, which
 *     also declares the layers left in float);
 *   - the model loader recognises a quantized checkpoint (qd_format_detect) and reads its
 *     tensors back (read, dequant_ref); the kernels take the in-memory layout (kernel).
 * Adding a format is one descriptor (a fmt_<name>.c file), one line in format.c's table and
 * its tests; docs/architecture.md ("Adding an output format") walks through it.
 *
 * In memory a packed layer is a qd_packed in one of two kernel layouts (../shared/ref/formats.md):
 *   QD_FMT_KERNEL_GPTQ: qweight [K*b/32, N] I32 packed along K, qzeros [G, N*b/32] I32 packed
 *                       along N (stored zero = z - zero_offset), scales [G, N] F16, g_idx [K]
 *                       (formats with has_g_idx) — gptq, gptq_v2, compressed-tensors
 *   QD_FMT_KERNEL_AWQ:  qweight [K, N/8] I32, qzeros [G, N/8] I32 (AWQ interleave), scales
 *                       [G, N] F16 — awq_gemm
 * The checkpoint's own tensors (names, shapes, dtypes) may differ from that layout: the
 * descriptor's tensors() and read() convert (compressed-tensors stores the transposes).
 * A qd_packed owns its arrays (qd_packed_free). */
#ifndef QUANT_FORMATS_FORMAT_H
#define QUANT_FORMATS_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "quant/core/dtype.h"
#include "quant/core/error.h"
#include "quant/formats/grid.h"
#include "quant/formats/qlayer.h"

typedef struct qd_packed {
    int64_t n, k;
    int bits;
    int64_t group_size;
    int64_t n_groups;
    int32_t *qweight;  int64_t qweight_shape[2];
    int32_t *qzeros;   int64_t qzeros_shape[2];
    uint16_t *scales;  int64_t scales_shape[2];    /* F16 bits */
    int32_t *g_idx;    int64_t g_idx_len;          /* NULL for formats without g_idx */
    uint16_t *bias;    int64_t bias_len;           /* F16 bits, or NULL */
    int sym;                                       /* zeros are all 2^(bits-1) and formats that
                                                      store no zero points for symmetric layers
                                                      (compressed-tensors) leave them out */
    /* Float grids (grid != QD_GRID_INT, formats whose kernel is QD_FMT_KERNEL_FLOAT; the
     * integer arrays above are then NULL):
     *   fcodes   FP8: [N, K] E4M3 bytes; FP4: [N, K/2], two E2M1 codes a byte, the even k
     *            in the low nibble (compressed-tensors' weight_packed)
     *   fscales  [R, G] F32: the value of each stored scale, R = N / row_block rows of
     *            scales (1 when row_block is -1), G = K / group_size groups (1 for -1)
     *   W[n][k] = value(code) * s, s = fscales[(n / row_block) * G + k / group_size], and
     *   s / global_scale instead of s under QD_SCALE_FP8_GLOBAL (NVFP4), as grid.h says. */
    qd_grid grid;
    qd_scale_rule scale_rule;
    float global_scale;                            /* FP8_GLOBAL only */
    int64_t row_block;                             /* 1, 128 or -1 (one scale row for all) */
    uint8_t *fcodes;   int64_t fcodes_shape[2];
    float *fscales;    int64_t fscales_shape[2];
    /* Static activation scales the format writes beside the weight (FP8 "input_scale",
     * NVFP4 "input_global_scale"), from the calibration data: 0 = none. */
    float input_scale;
} qd_packed;

/* The in-memory layout a descriptor packs into (what the kernels read). */
typedef enum qd_fmt_kernel {
    QD_FMT_KERNEL_GPTQ = 0,
    QD_FMT_KERNEL_AWQ,
    QD_FMT_KERNEL_FLOAT,       /* fcodes + fscales (the float grids) */
} qd_fmt_kernel;

/* How a format can hold act-order (desc_act) weights. */
typedef enum qd_fmt_act_order {
    QD_FMT_ACT_ORDER_G_IDX = 0,    /* any order: the file carries g_idx */
    QD_FMT_ACT_ORDER_STATIC,       /* only with static groups (contiguous groups, no g_idx) */
    QD_FMT_ACT_ORDER_NONE,         /* never */
} qd_fmt_act_order;

/* Methods, as bits, for the default-format rule (the job spec maps its enum onto them). */
enum {
    QD_FMT_METHOD_GPTQ = 1u << 0,
    QD_FMT_METHOD_AWQ = 1u << 1,
    QD_FMT_METHOD_RTN = 1u << 2,
    QD_FMT_METHOD_AWQ_GPTQ = 1u << 3,
    QD_FMT_METHOD_ALL = 0xFu,
};

/* The job-level settings a format is asked to hold. */
typedef struct qd_fmt_settings {
    int bits;
    int64_t group_size;           /* > 0, or -1 (one group per row) */
    int sym;
    int desc_act;
    int static_groups;
} qd_fmt_settings;

/* What the writer passes to quant_config. The arrays are borrowed. */
typedef struct qd_fmt_config_in {
    qd_fmt_settings s;
    double damp_percent;
    int true_sequential;
    const char *const *float_modules;   /* full module names left in float */
    size_t n_float;
    const char *const *trivial_g_idx;   /* regexes of layers whose g_idx is k / group_size */
    size_t n_trivial;
    const struct qd_scheme *scheme;     /* the job's scheme (scheme.h), or NULL: the weights'
                                           grid and the activations it declares */
} qd_fmt_config_in;

/* One checkpoint tensor of a packed linear. In tensors(): data points into the qd_packed or
 * into `owned` (malloc'd, freed by qd_fmt_tensors_free). In read(): a borrowed view of the
 * file's tensor (data may be unaligned). */
typedef struct qd_fmt_tensor {
    char suffix[24];              /* after "<module>.", e.g. "qweight", "weight_packed" */
    qd_dtype dtype;
    int ndim;                     /* 1 or 2 */
    int64_t shape[2];
    const void *data;
    void *owned;
} qd_fmt_tensor;
#define QD_FMT_MAX_TENSORS 6

/* Looks up tensor "<module>.<suffix>" for read(): 1 and *out filled when present, 0 when absent. */
typedef int (*qd_fmt_find_fn)(void *ud, const char *suffix, qd_fmt_tensor *out);
struct st_tensor;
/* What a find callback fills from a checkpoint tensor: a view of t's data under suffix (more
 * than two dimensions read as 3, which read() refuses). */
void qd_fmt_tensor_view(const struct st_tensor *t, const char *suffix, qd_fmt_tensor *out);
/* A find callback over any collection of named checkpoint tensors: read() asks for
 * "<base>.<suffix>", found through lookup(src, name) (NULL when absent). Pass a
 * qd_fmt_named as read()'s ud and qd_fmt_find_named as its find. */
typedef struct qd_fmt_named {
    const struct st_tensor *(*lookup)(const void *src, const char *name);
    const void *src;
    const char *base;
} qd_fmt_named;
int qd_fmt_find_named(void *ud, const char *suffix, qd_fmt_tensor *out);

/* What a recognised quantization_config says. */
typedef struct qd_fmt_detected {
    int bits;
    int64_t group_size;
    int sym;
    int desc_act;
    /* Float formats: the grid and how scales are shared (zeroed for integer formats). */
    qd_grid grid;
    qd_scale_rule scale_rule;
    int64_t row_block;          /* 0 or 1: one scale row per row */
    int act;                    /* the input activations declared, as serving.h's qd_srv_act
                                   (0: unknown / not a compressed-tensors config) */
    int mixed;                  /* compressed-tensors with config groups of different bits or
                                   group sizes (job.target_bpw): bits and group_size are 0, and
                                   read() takes each layer's from its tensors' shapes */
} qd_fmt_detected;

typedef struct qd_format {
    const char *name;           /* as in job.format and quantization_config.meta.format */
    const char *summary;        /* one line: what the format is and who loads it */
    const char *quant_method;   /* quantization_config.quant_method it writes and reads */
    const char *main_tensor;    /* the suffix every packed linear has ("qweight"): its presence
                                   tells the loader a linear is packed */
    unsigned bits_mask;         /* bit b set when b bits are allowed */
    int channel_groups;         /* 1 when group_size -1 (one group per row) can be stored */
    const char *channel_why;    /* why not, when it cannot */
    qd_fmt_act_order act_order;
    const char *act_order_why;  /* why act-order is limited, when it is */
    int has_g_idx;              /* the packed layer carries g_idx */
    int zero_offset;            /* stored zero = z - zero_offset (1 for gptq v1) */
    qd_fmt_kernel kernel;
    int f16_products;           /* dequant_ref rounds each scale * (q - z) to F16, as the
                                   format's own reference decoder does (compressed-tensors) */
    qd_grid grid;               /* the grid its layers are on; a float grid's format is
                                   written only through a job's scheme (scheme.h) */
    unsigned default_methods;   /* QD_FMT_METHOD_* bits this format is a default for */
    int default_rank;           /* among defaults that hold the bits, the highest rank wins */
    /* Layer shape rules beyond "K splits into whole groups": 0, or 1 with why filled. */
    int (*misfit)(int64_t n, int64_t k, char *why, size_t cap);
    /* Checks that l can be written in this format; the error says why not. */
    int (*check)(const qd_qlayer *l, qd_err *err);
    /* Packs l; runs check first and refuses what it refuses (callers need not check too). */
    int (*pack)(const qd_qlayer *l, qd_packed *out, qd_err *err);
    int (*unpack)(const qd_packed *p, qd_qlayer *out, qd_err *err);
    /* Decodes packed tensors to W [N, K] (scalar reference). */
    int (*dequant_ref)(const qd_packed *p, float *w, qd_err *err);
    /* The checkpoint tensors of one packed linear, in file order (bias excluded: the
     * writer adds it). *n_out set; free with qd_fmt_tensors_free. */
    int (*tensors)(const qd_packed *p, qd_fmt_tensor *t, int *n_out, qd_err *err);
    /* Reads one linear [n, k] back from checkpoint tensors into out (owned arrays);
     * d is what detect() found in quantization_config. */
    int (*read)(qd_fmt_find_fn find, void *ud, int64_t n, int64_t k, const qd_fmt_detected *d,
                qd_packed *out, qd_err *err);
    /* The quantization_config object (format keys and the layers left in float; the
     * writer adds "meta"). NULL on allocation failure. */
    cJSON *(*quant_config)(const qd_fmt_config_in *in);
    /* 1 and out filled when q is this format's quantization_config, 0 when it is another
     * format's, negative (err set, naming `what`) when it is this format's but unreadable. */
    int (*detect)(const cJSON *q, const char *what, qd_fmt_detected *out, qd_err *err);
} qd_format;

const qd_format *qd_format_find(const char *name);      /* NULL when unknown */
size_t qd_format_count(void);
const qd_format *qd_format_at(size_t i);
void qd_packed_free(qd_packed *p);                      /* accepts zeroed structs */
/* Index of f in the table (qd_format_at(i) == f), or -1. */
int qd_format_index(const qd_format *f);

/* Checks job settings against f. 0, or QD_EINVAL with *field set to the job field to blame
 * ("format", "group_size", "static_groups") and msg to the reason, e.g. "awq_gemm holds
 * 4-bit weights only, but job.bits is 3; use format gptq or gptq_v2". */
int qd_format_check_settings(const qd_format *f, const qd_fmt_settings *s, const char **field,
                             char *msg, size_t cap);
/* The format a job gets when it names none: the table index of the highest-ranked default
 * for method (a QD_FMT_METHOD_* bit) that holds `bits`; -1 when none does. */
int qd_format_default(unsigned method, int bits);
/* 1 with why filled when a [n, k] linear cannot be stored with group_size gs; 0 when it fits. */
int qd_format_misfit(const qd_format *f, int64_t n, int64_t k, int64_t gs, char *why, size_t cap);
/* Recognises a checkpoint's quantization_config: 0 with *fmt (borrowed) and what it says, or
 * a negative code with err set (a config no format recognises, or one that is not valid). */
int qd_format_detect(const cJSON *q, const char *what, const qd_format **fmt, qd_fmt_detected *out,
                     qd_err *err);
void qd_fmt_tensors_free(qd_fmt_tensor *t, int n);

/* Raw bit packing shared by the formats (b in 2, 3, 4, 8): packs `count` values (count a
 * multiple of 32) taken at vals[i * vstride] into words[j * wstride], LSB first, with the
 * 3-bit 32-values-in-3-words layout. */
void qd_pack_bits(int bits, const int32_t *vals, int64_t count, int64_t vstride,
                  int32_t *words, int64_t wstride);
void qd_unpack_bits(int bits, const int32_t *words, int64_t count, int64_t wstride,
                    int32_t *vals, int64_t vstride);
/* Value idx of such a packed stream (the scalar decode the dequant_ref functions use). */
int32_t qd_bits_get(int bits, const int32_t *words, int64_t wstride, int64_t idx);

#endif
