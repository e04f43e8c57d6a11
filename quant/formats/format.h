/* The output format table: one entry per packed checkpoint layout.
 *
 * Adding a format is one entry in format.c, one pack/unpack file and one test. Each entry
 * says which bit widths it holds, checks that a layer fits it (K and N multiples, group
 * rules, zeros representable), packs a qd_qlayer into checkpoint tensors and unpacks them
 * back, and has a scalar `dequant_ref` that decodes packed tensors to F32 weights [N, K],
 * the reference every kernel is tested against.
 *
 * Packed tensors use the checkpoint's own shapes (see ../shared/ref/formats.md):
 *   gptq / gptq_v2: qweight [K*b/32, N] I32, qzeros [G, N*b/32] I32, scales [G, N] F16,
 *                   g_idx [K] I32
 *   awq_gemm:       qweight [K, N/8] I32, qzeros [G, N/8] I32, scales [G, N] F16
 * A qd_packed owns its arrays (qd_packed_free). */
#ifndef QUANT_FORMATS_FORMAT_H
#define QUANT_FORMATS_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#include "quant/core/error.h"
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
} qd_packed;

typedef struct qd_format {
    const char *name;           /* "gptq", "gptq_v2", "awq_gemm" */
    unsigned bits_mask;         /* bit b set when b bits are allowed */
    int has_g_idx;
    int zero_offset;            /* stored zero = z - zero_offset (1 for gptq v1) */
    /* Checks that l can be written in this format; the error says why not. */
    int (*check)(const qd_qlayer *l, qd_err *err);
    int (*pack)(const qd_qlayer *l, qd_packed *out, qd_err *err);
    int (*unpack)(const qd_packed *p, qd_qlayer *out, qd_err *err);
    /* Decodes packed tensors to W [N, K] (scalar reference). */
    int (*dequant_ref)(const qd_packed *p, float *w, qd_err *err);
} qd_format;

const qd_format *qd_format_find(const char *name);      /* NULL when unknown */
size_t qd_format_count(void);
const qd_format *qd_format_at(size_t i);
void qd_packed_free(qd_packed *p);                      /* accepts zeroed structs */

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
