/* Element types as safetensors names them, and conversions to and from F32.
 *
 * F16 and BF16 conversions round to nearest even and keep NaN (quiet) and +-Inf; F32 ->
 * F16 overflows to Inf as IEEE does. All functions are pure. */
#ifndef QUANT_CORE_DTYPE_H
#define QUANT_CORE_DTYPE_H

#include <stddef.h>
#include <stdint.h>

typedef enum qd_dtype {
    QD_DTYPE_INVALID = 0,
    QD_DTYPE_BOOL, QD_DTYPE_U8, QD_DTYPE_I8, QD_DTYPE_F8_E5M2, QD_DTYPE_F8_E4M3,
    QD_DTYPE_I16, QD_DTYPE_U16, QD_DTYPE_F16, QD_DTYPE_BF16,
    QD_DTYPE_I32, QD_DTYPE_U32, QD_DTYPE_F32,
    QD_DTYPE_F64, QD_DTYPE_I64, QD_DTYPE_U64,
    QD_DTYPE_COUNT
} qd_dtype;

/* Bytes per element; 0 for QD_DTYPE_INVALID. */
size_t qd_dtype_size(qd_dtype t);
/* "F32", "BF16", ...; "INVALID" for anything else. */
const char *qd_dtype_name(qd_dtype t);
/* Parses a safetensors dtype name; QD_DTYPE_INVALID when unknown. */
qd_dtype qd_dtype_parse(const char *name);
/* The Python safetensors library writes tensors sorted by this rank, descending
 * (its Dtype enum order: U64 > I64 > F64 > F32 > U32 > I32 > BF16 > F16 > U16 > I16 > F8 > I8 > U8 > BOOL). */
int qd_dtype_sort_rank(qd_dtype t);

float qd_f16_to_f32(uint16_t h);
uint16_t qd_f32_to_f16(float f);
float qd_bf16_to_f32(uint16_t b);
uint16_t qd_f32_to_bf16(float f);
/* Rounds through F16 and back: what a value becomes once stored as F16. */
float qd_f32_round_f16(float f);

/* Converts n elements of type `from` at src to F32 at dst. Supports F32, F16, BF16, F64,
 * I32, I64, I16, I8, U8. Returns 0 or QD_EUNSUPPORTED. */
int qd_convert_to_f32(qd_dtype from, const void *src, float *dst, size_t n);
/* Converts n F32 values to `to` (F32, F16, BF16). Returns 0 or QD_EUNSUPPORTED. */
int qd_convert_from_f32(qd_dtype to, const float *src, void *dst, size_t n);

#endif
