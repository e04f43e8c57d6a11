/* Private to quant/formats: the table entries and the checks and conversions the format
 * files share. */
#ifndef QUANT_FORMATS_FMT_INTERNAL_H
#define QUANT_FORMATS_FMT_INTERNAL_H

#include "quant/formats/format.h"

extern const qd_format qd_fmt_gptq;
extern const qd_format qd_fmt_gptq_v2;
extern const qd_format qd_fmt_awq_gemm;

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

#endif
