/* Private to quant/formats: the table entries and the checks and conversions the format
 * files share (format.c: layer checks and packed plumbing; fmt_io.c: reading checkpoint
 * tensors and quantization_config values). */
#ifndef QUANT_FORMATS_FMT_INTERNAL_H
#define QUANT_FORMATS_FMT_INTERNAL_H

#include "quant/formats/format.h"

extern const qd_format qd_fmt_gptq;
extern const qd_format qd_fmt_gptq_v2;
extern const qd_format qd_fmt_awq_gemm;
extern const qd_format qd_fmt_ct;
extern const qd_format qd_fmt_fp8;
extern const qd_format qd_fmt_nvfp4;
extern const qd_format qd_fmt_mxfp4;

/* Checks what every packed format needs: bits allowed by f->bits_mask, K % group_size == 0
 * (no partial last group), n_groups consistent, codes and zeros in [0, 2^bits - 1], g_idx
 * in [0, G), scales positive and finite in F16. The error names the format. */
int fmt_check_common(const qd_format *f, const qd_qlayer *l, qd_err *err);
/* Fills the header fields of out from l and allocates scales [G, N] (F16) and bias [N]. */
int fmt_packed_begin(const qd_qlayer *l, qd_packed *out, qd_err *err);
/* Allocates a qlayer for p and copies scales and bias back to F32. */
int fmt_unpack_begin(const char *fmt, const qd_packed *p, qd_qlayer *out, qd_err *err);
/* Checks that a packed tensor has the expected 2-D shape. */
int fmt_check_shape(const char *fmt, const char *tensor, const int64_t *got, int64_t r, int64_t c,
                    qd_err *err);

/* The GPTQ kernel layout, shared by gptq, gptq_v2 and compressed-tensors (fmt_gptq.c):
 * pack writes g_idx only when f->has_g_idx; unpack and dequant read p->g_idx when present. */
int fmt_gptq_layout_pack(const qd_format *f, const qd_qlayer *l, qd_packed *out, qd_err *err);
int fmt_gptq_layout_unpack(const qd_format *f, const qd_packed *p, qd_qlayer *out, qd_err *err);
int fmt_gptq_layout_dequant(const qd_format *f, const qd_packed *p, float *w, qd_err *err);
/* Packs a [G, N] zero matrix (already minus the zero offset) into qzeros [G, N*b/32]. */
void fmt_gptq_pack_zeros(int bits, const int32_t *z, int64_t g, int64_t n, int32_t *qzeros);

/* ---- fmt_float.c: what the float-grid formats share ---- */
/* Checks a float-grid layer for f: grid and scale rule as f wants, K % group_size == 0,
 * no g_idx other than k / group_size, scales positive and finite (and representable as
 * the format stores them: E4M3 for NVFP4, powers of two in E8M0's range for MXFP4), rows of
 * a row block sharing their scale, codes in range. */
int fmt_float_check(const qd_format *f, const qd_qlayer *l, qd_err *err);
/* Packs l into p's float fields (fcodes, fscales [R, G]); runs fmt_float_check first. */
int fmt_float_pack(const qd_format *f, const qd_qlayer *l, qd_packed *out, qd_err *err);
int fmt_float_unpack(const qd_format *f, const qd_packed *p, qd_qlayer *out, qd_err *err);
/* W [N, K] = value(code) * scale (scale / global under FP8_GLOBAL), as grid.h defines. */
int fmt_float_dequant(const qd_format *f, const qd_packed *p, float *w, qd_err *err);
/* Rows of scales R for n rows, and groups G along k, of p's layout. */
int64_t fmt_float_scale_rows(int64_t n, int64_t row_block);
/* compressed-tensors' quantization_config around one config group: `format` (e.g.
 * "float-quantized"), the weights' and input activations' argument objects (taken over;
 * acts may be NULL for null) and the layers left in float. NULL on allocation failure. */
cJSON *fmt_ct_config(const char *format, cJSON *weights, cJSON *acts, const qd_fmt_config_in *in);
/* The input_activations object a scheme declares (NULL for none or on failure). */
cJSON *fmt_ct_acts(const struct qd_scheme *s);
/* Reads compressed-tensors' config group 0 for a float format: 0 when q is not
 * compressed-tensors with format `format` (nothing set), 1 with *w (the weights object,
 * borrowed) set, negative with err set when it is that format but unreadable. */
int fmt_ct_group(const cJSON *q, const char *format, const char *what, const cJSON **w, qd_err *err);
/* The input activations compressed-tensors' config group 0 declares, as serving.h's
 * qd_srv_act: NONE (null or absent), FP8 (float, 8 bits) or FP4 (float, 4 bits). */
int fmt_ct_acts_declared(const cJSON *q);

/* ---- fmt_io.c ---- */
/* Copies a 1-byte tensor <suffix> (dtype `want`: U8 or F8_E4M3) of shape [r, c] into a new
 * array. */
int fmt_read_bytes(qd_fmt_find_fn find, void *ud, const char *fmt, const char *suffix, qd_dtype want,
                   int64_t r, int64_t c, uint8_t **out, qd_err *err);
/* Reads float tensor <suffix> [r, c] (c = 0: 1-D) of F32, BF16, F16 or F8_E4M3 as F32 in a
 * new array; every value must be finite (the error names the tensor). */
int fmt_read_f32(qd_fmt_find_fn find, void *ud, const char *fmt, const char *suffix, int64_t r,
                 int64_t c, float **out, qd_err *err);
/* Copies the I32 tensor <suffix> of shape [r, c] (c = 0: 1-D of length r) into a new
 * array. Absent: 0 with *out NULL when !required, else QD_ENOTFOUND. */
int fmt_read_i32(qd_fmt_find_fn find, void *ud, const char *fmt, const char *suffix, int required,
                 int64_t r, int64_t c, int32_t **out, qd_err *err);
/* Reads float tensor <suffix> [r, c] (F16, BF16 or F32) as F16 bits in a new array. */
int fmt_read_f16(qd_fmt_find_fn find, void *ud, const char *fmt, const char *suffix, int64_t r,
                 int64_t c, uint16_t **out, qd_err *err);
/* Sets t to a borrowed tensor. */
void fmt_tensor_set(qd_fmt_tensor *t, const char *suffix, qd_dtype dtype, int ndim, int64_t r,
                    int64_t c, const void *data);
/* quantization_config values: absent/null keep *out; a wrong type is QD_EFORMAT naming key. */
int fmt_json_int(const cJSON *o, const char *key, int64_t *out, const char *what, qd_err *err);
int fmt_json_bool(const cJSON *o, const char *key, int *out, const char *what, qd_err *err);
int fmt_json_str(const cJSON *o, const char *key, char *out, size_t cap, const char *what, qd_err *err);
/* A JSON array of strings (NULL on allocation failure). */
cJSON *fmt_json_strings(const char *const *v, size_t n);

#endif
