/* The CPU dequantizing matmul (see kernels.h): the packed weight is decoded in tiles of
 * 32 K-rows x 8 output columns (one AVX2 register per row) into F32, then multiplied.
 *   GEMV (M <= 8):  each tile is used once by up to 8 rows of x held in 8 accumulators, so
 *                   the weight streams through once and nothing is written back until the
 *                   whole K is summed.
 *   GEMM (M > 8):   a panel of 256 K-rows x 8 columns is decoded once into L1 and reused
 *                   by every row of x, accumulating into y.
 * Scales and zeros are widened once per call to F32 tables [G, N] (1/group_size of the
 * weight's work), which makes the act-order case (a group lookup per K-row) cheap to read.
 * For the reordered layout x is permuted once per call into a scratch copy. The float
 * grids (QD_KMAT_FLOAT) have their own tile decoders (kernel_float.c) and no tables: their
 * scales are read where a tile needs them; their N need not be a multiple of 8, so the
 * last tile stores only the columns that exist.
 * The AVX2 path is chosen at run time (__builtin_cpu_supports), never by -march. */
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "quant/kernels/kernel_internal.h"

#define KCPU_PANEL 256         /* K-rows per GEMM panel */

/* y rows [r0, r0 + mr) x columns [n0, n0 + 8) (+)= x[:, i0:i0+len] T. */
typedef void (*kcpu_accum_fn)(const float *x, int64_t ldx, int mr, const float *T, int len, float *acc);

/* ---- portable ------------------------------------------------------------------------ */

static void kcpu_decode_portable(const kcpu_ctx *c, int64_t i0, int len, int64_t n0, float *T)
{
    const qd_kmat *m = c->m;
    const int64_t n = m->n;
    int64_t gcur = -1;
    const float *s = NULL, *z = NULL;
    for (int j = 0; j < len; j++) {
        int64_t i = i0 + j, g = kmat_group(m, i);
        if (g != gcur) {
            s = c->S + g * n + n0;
            z = c->Z + g * n + n0;
            gcur = g;
        }
        for (int l = 0; l < 8; l++) T[j * 8 + l] = s[l] * ((float)kmat_code(m, i, n0 + l) - z[l]);
    }
}

static void kcpu_accum_portable(const float *x, int64_t ldx, int mr, const float *T, int len, float *acc)
{
    for (int r = 0; r < mr; r++) {
        float a[8];
        memcpy(a, acc + r * 8, sizeof a);
        const float *xr = x + r * ldx;
        for (int j = 0; j < len; j++)
            for (int l = 0; l < 8; l++) a[l] += xr[j] * T[j * 8 + l];
        memcpy(acc + r * 8, a, sizeof a);
    }
}

/* ---- AVX2 ---------------------------------------------------------------------------- */

__attribute__((target("avx2,fma")))
static void kcpu_decode_avx2(const kcpu_ctx *c, int64_t i0, int len, int64_t n0, float *T)
{
    const qd_kmat *m = c->m;
    const int64_t n = m->n;
    int64_t gcur = -1;
    __m256 vs = _mm256_setzero_ps(), vz = vs;
    if (m->layout == QD_KMAT_AWQ) {
        /* One word holds the 8 channels; shifting a broadcast copy by each channel's nibble
         * position puts them back in natural order. */
        const __m256i sh = _mm256_setr_epi32(0, 16, 4, 20, 8, 24, 12, 28), mask = _mm256_set1_epi32(15);
        const int32_t *qw = m->qweight + n0 / 8;
        for (int j = 0; j < len; j++) {
            int64_t i = i0 + j, g = kmat_group(m, i);
            if (g != gcur) {
                vs = _mm256_loadu_ps(c->S + g * n + n0);
                vz = _mm256_loadu_ps(c->Z + g * n + n0);
                gcur = g;
            }
            __m256i v = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(qw[i * (n / 8)]), sh), mask);
            _mm256_storeu_ps(T + j * 8, _mm256_mul_ps(vs, _mm256_sub_ps(_mm256_cvtepi32_ps(v), vz)));
        }
        return;
    }
    /* GPTQ: the 32 values of a block fill `bits` words per column, read as one bit stream. */
    const int b = m->bits;
    const __m256i mask = _mm256_set1_epi32((1 << b) - 1);
    __m256i W[8];
    const int32_t *base = m->qweight + (i0 / 32) * b * n + n0;
    for (int w = 0; w < b; w++) W[w] = _mm256_loadu_si256((const __m256i *)(base + w * n));
    for (int j = 0; j < len; j++) {
        int64_t i = i0 + j, g = kmat_group(m, i);
        if (g != gcur) {
            vs = _mm256_loadu_ps(c->S + g * n + n0);
            vz = _mm256_loadu_ps(c->Z + g * n + n0);
            gcur = g;
        }
        int pos = b * j, wi = pos >> 5, off = pos & 31;
        __m256i v = _mm256_srl_epi32(W[wi], _mm_cvtsi32_si128(off));
        if (off + b > 32) v = _mm256_or_si256(v, _mm256_sll_epi32(W[wi + 1], _mm_cvtsi32_si128(32 - off)));
        v = _mm256_and_si256(v, mask);
        _mm256_storeu_ps(T + j * 8, _mm256_mul_ps(vs, _mm256_sub_ps(_mm256_cvtepi32_ps(v), vz)));
    }
}

__attribute__((target("avx2,fma")))
static void kcpu_accum_avx2(const float *x, int64_t ldx, int mr, const float *T, int len, float *acc)
{
    int r = 0;
    /* Four rows at a time: each T row is loaded once for four FMAs. */
    for (; r + 4 <= mr; r += 4) {
        const float *x0 = x + r * ldx, *x1 = x0 + ldx, *x2 = x1 + ldx, *x3 = x2 + ldx;
        __m256 a0 = _mm256_loadu_ps(acc + r * 8), a1 = _mm256_loadu_ps(acc + r * 8 + 8);
        __m256 a2 = _mm256_loadu_ps(acc + r * 8 + 16), a3 = _mm256_loadu_ps(acc + r * 8 + 24);
        for (int j = 0; j < len; j++) {
            __m256 t = _mm256_loadu_ps(T + j * 8);
            a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(x0 + j), t, a0);
            a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(x1 + j), t, a1);
            a2 = _mm256_fmadd_ps(_mm256_broadcast_ss(x2 + j), t, a2);
            a3 = _mm256_fmadd_ps(_mm256_broadcast_ss(x3 + j), t, a3);
        }
        _mm256_storeu_ps(acc + r * 8, a0);
        _mm256_storeu_ps(acc + r * 8 + 8, a1);
        _mm256_storeu_ps(acc + r * 8 + 16, a2);
        _mm256_storeu_ps(acc + r * 8 + 24, a3);
    }
    for (; r < mr; r++) {
        const float *xr = x + r * ldx;
        __m256 a = _mm256_loadu_ps(acc + r * 8);
        for (int j = 0; j < len; j++) a = _mm256_fmadd_ps(_mm256_broadcast_ss(xr + j), _mm256_loadu_ps(T + j * 8), a);
        _mm256_storeu_ps(acc + r * 8, a);
    }
}

/* ---- drivers ------------------------------------------------------------------------- */

/* Stores columns [n0, n0 + nc) of rows [r0, r0 + mr) from acc [mr][8]. */
static void kcpu_store(float *y, int64_t n, int64_t r0, int mr, int64_t n0, int nc, const float *acc)
{
    for (int r = 0; r < mr; r++) memcpy(y + (r0 + r) * n + n0, acc + r * 8, (size_t)nc * sizeof(float));
}

static void kcpu_gemv(const kcpu_ctx *c, kcpu_decode_fn dec, kcpu_accum_fn acc_fn, const float *x,
                      int64_t rows, float *y)
{
    const qd_kmat *m = c->m;
    const int64_t n = m->n, k = m->k;
    float T[KCPU_TILE * 8] __attribute__((aligned(32)));
    float acc[QD_KERNEL_GEMV_MAX_ROWS * 8] __attribute__((aligned(32)));
    for (int64_t r0 = 0; r0 < rows; r0 += QD_KERNEL_GEMV_MAX_ROWS) {
        int mr = (int)(rows - r0 < QD_KERNEL_GEMV_MAX_ROWS ? rows - r0 : QD_KERNEL_GEMV_MAX_ROWS);
        for (int64_t n0 = 0; n0 < n; n0 += 8) {
            memset(acc, 0, sizeof acc);
            for (int64_t i0 = 0; i0 < k; i0 += KCPU_TILE) {
                int len = (int)(k - i0 < KCPU_TILE ? k - i0 : KCPU_TILE);
                dec(c, i0, len, n0, T);
                acc_fn(x + r0 * k + i0, k, mr, T, len, acc);
            }
            kcpu_store(y, n, r0, mr, n0, kcpu_tile_cols(m, n0), acc);
        }
    }
}

static void kcpu_gemm(const kcpu_ctx *c, kcpu_decode_fn dec, kcpu_accum_fn acc_fn, const float *x,
                      int64_t rows, float *y)
{
    const qd_kmat *m = c->m;
    const int64_t n = m->n, k = m->k;
    float T[KCPU_PANEL * 8] __attribute__((aligned(32)));
    float acc[4 * 8] __attribute__((aligned(32)));
    for (int64_t n0 = 0; n0 < n; n0 += 8) {
        const int nc = kcpu_tile_cols(m, n0);
        for (int64_t p0 = 0; p0 < k; p0 += KCPU_PANEL) {
            int plen = (int)(k - p0 < KCPU_PANEL ? k - p0 : KCPU_PANEL);
            for (int t = 0; t < plen; t += KCPU_TILE)
                dec(c, p0 + t, plen - t < KCPU_TILE ? plen - t : KCPU_TILE, n0, T + t * 8);
            for (int64_t r0 = 0; r0 < rows; r0 += 4) {
                int mr = (int)(rows - r0 < 4 ? rows - r0 : 4);
                memset(acc, 0, sizeof acc);
                if (p0)
                    for (int r = 0; r < mr; r++) memcpy(acc + r * 8, y + (r0 + r) * n + n0, (size_t)nc * sizeof(float));
                acc_fn(x + r0 * k + p0, k, mr, T, plen, acc);
                kcpu_store(y, n, r0, mr, n0, nc, acc);
            }
        }
    }
}

int kcpu_have_avx2(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

int kcpu_isa_pick(qd_kcpu_isa isa, int *avx2, qd_err *err)
{
    *avx2 = isa != QD_KCPU_PORTABLE && kcpu_have_avx2();
    if (isa == QD_KCPU_AVX2 && !*avx2)
        return qd_err_set(err, QD_EUNSUPPORTED, "cpu kernel: this CPU has no AVX2+FMA");
    return 0;
}

kcpu_decode_fn kcpu_decode_pick(const qd_kmat *m, int avx2)
{
    if (m->layout == QD_KMAT_FLOAT) return avx2 ? kcpu_decode_float_avx2 : kcpu_decode_float_portable;
    return avx2 ? kcpu_decode_avx2 : kcpu_decode_portable;
}

void kcpu_tables_fill(const qd_kmat *m, float *S, float *Z, int64_t c0, int64_t c1)
{
    if (m->layout == QD_KMAT_FLOAT) return;             /* no tables: see kernel_float.c */
    const int64_t n = m->n;
    for (int64_t g = 0; g < m->n_groups; g++)
        for (int64_t c = c0; c < c1; c++) {
            S[g * n + c] = qd_f16_to_f32(m->scales[g * n + c]);
            Z[g * n + c] = (float)kmat_zero(m, g, c);
        }
}

const char *qd_kernel_cpu_isa_name(void) { return kcpu_have_avx2() ? "avx2" : "portable"; }

int qd_kernel_matmul_cpu(const qd_kmat *m, const float *x, int64_t rows, float *y, qd_kpath path,
                         qd_kcpu_isa isa, qd_err *err)
{
    int rc = kmat_validate(m, err);
    if (rc) return rc;
    if (rows < 0 || (rows > 0 && (!x || !y)))
        return qd_err_set(err, QD_EINVAL, "cpu kernel: bad input (rows %lld)", (long long)rows);
    if (rows == 0) return 0;
    int avx2;
    if ((rc = kcpu_isa_pick(isa, &avx2, err))) return rc;
    const int64_t n = m->n, k = m->k, G = m->n_groups;
    const int tables = m->layout != QD_KMAT_FLOAT;
    float *S = tables ? malloc((size_t)(G * n) * sizeof *S) : NULL;
    float *Z = tables ? malloc((size_t)(G * n) * sizeof *Z) : NULL;
    float *xp = NULL;
    if (m->layout == QD_KMAT_GPTQ_REORDERED) xp = malloc((size_t)(rows * k) * sizeof *xp);
    if ((tables && (!S || !Z)) || (m->layout == QD_KMAT_GPTQ_REORDERED && !xp)) {
        free(S);
        free(Z);
        free(xp);
        return qd_err_set(err, QD_ENOMEM, "cpu kernel: out of memory for [%lld, %lld] tables",
                          (long long)G, (long long)n);
    }
    kcpu_tables_fill(m, S, Z, 0, n);
    if (xp)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t i = 0; i < k; i++) xp[r * k + i] = x[r * k + m->perm[i]];
    kcpu_ctx c = {m, S, Z};
    kcpu_decode_fn dec = kcpu_decode_pick(m, avx2);
    kcpu_accum_fn acc = avx2 ? kcpu_accum_avx2 : kcpu_accum_portable;
    int gemv = path == QD_KPATH_GEMV || (path == QD_KPATH_AUTO && rows <= QD_KERNEL_GEMV_MAX_ROWS);
    if (gemv) kcpu_gemv(&c, dec, acc, xp ? xp : x, rows, y);
    else kcpu_gemm(&c, dec, acc, xp ? xp : x, rows, y);
    free(S);
    free(Z);
    free(xp);
    return 0;
}
