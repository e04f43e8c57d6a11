/* Bulk dequantization of a packed linear to W [N, K] F32 (see kernels.h), for loading a
 * quantized checkpoint's blocks: the CPU kernel's tile decoder (kernel_cpu.c) decodes 32
 * K-rows x 8 output columns at a time from scale and zero tables built once per group and
 * column, and each tile is transposed into the 8 rows of W it belongs to. The output
 * columns are split over threads in whole tiles; every thread fills its own columns of
 * the tables and its own rows of W, so the threads share nothing they write.
 *
 * The result is the format's dequant_ref to the bit (tests/unit/test_kernel_dequant.c):
 * the decoder computes scale * ((float)q - zero), whose difference is the reference's
 * exact integer q - zero, and formats whose reference rounds each product to F16
 * (f16_products) get the same rounding (qd_f32_round_f16, or F16C's round-to-nearest-even
 * conversion, which is the same function). The float grids (QD_KMAT_FLOAT) go through the
 * same tiles with their own decoder (kernel_float.c), whose weights are kdecode.h's
 * kd_float_weight to the bit; their N need not be a multiple of 8, so the last tile stores
 * only its rows of W. */
#include <cpuid.h>
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "quant/core/parallel.h"
#include "quant/kernels/kernel_internal.h"

/* CPUID leaf 1, ECX bit 29. Read directly rather than with __builtin_cpu_supports("f16c"),
 * which clang before 15 does not know (the fuzz build uses clang). */
static int cpu_has_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}

/* Below this many weights per thread the thread start-up costs more than it saves. */
#define KDEQ_MIN_WEIGHTS_PER_THREAD (1 << 16)

/* Writes tile T [len][8] (K-rows x columns) to w[l * k + j] for l < nc, j < len: w points
 * at row n0, column i0 of W. f16: each value rounded to F16 on the way. */
typedef void (*kdeq_store_fn)(const float *T, int len, int nc, float *w, int64_t k, int f16);

typedef struct kdeq_job {
    kcpu_ctx c;
    kcpu_decode_fn dec;
    kdeq_store_fn store;
    int f16;
    float *S, *Z;              /* the shared tables; each share fills its own columns */
    float *w;
} kdeq_job;

static void kdeq_store_portable(const float *T, int len, int nc, float *w, int64_t k, int f16)
{
    for (int l = 0; l < nc; l++)
        for (int j = 0; j < len; j++) {
            float v = T[j * 8 + l];
            w[l * k + j] = f16 ? qd_f32_round_f16(v) : v;
        }
}

/* The classic 8x8 transpose in three shuffle stages: r[j] (row j = K-row) in, r[l]
 * (column l = output row of W) out. */
__attribute__((target("avx2,fma")))
void kd_transpose8_avx2(__m256 r[8])
{
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
    r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
    r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

__attribute__((target("avx2,fma,f16c")))
static void kdeq_store_avx2(const float *T, int len, int nc, float *w, int64_t k, int f16)
{
    if (nc < 8) {
        kdeq_store_portable(T, len, nc, w, k, f16);
        return;
    }
    int j0 = 0;
    for (; j0 + 8 <= len; j0 += 8) {
        __m256 r[8];
        for (int j = 0; j < 8; j++) r[j] = _mm256_loadu_ps(T + (j0 + j) * 8);
        kd_transpose8_avx2(r);
        for (int l = 0; l < 8; l++) {
            __m256 v = r[l];
            if (f16) v = _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            _mm256_storeu_ps(w + l * k + j0, v);
        }
    }
    if (j0 < len) kdeq_store_portable(T + j0 * 8, len - j0, 8, w + j0, k, f16);
}

/* Output columns (rows of W) [c0, c1), multiples of 8. */
static void kdeq_cols(void *arg, int t, int64_t c0, int64_t c1)
{
    const kdeq_job *j = arg;
    (void)t;
    const qd_kmat *m = j->c.m;
    const int64_t k = m->k;
    float T[KCPU_TILE * 8] __attribute__((aligned(32)));
    kcpu_tables_fill(m, j->S, j->Z, c0, c1);
    for (int64_t n0 = c0; n0 < c1; n0 += 8)
        for (int64_t i0 = 0; i0 < k; i0 += KCPU_TILE) {
            int len = (int)(k - i0 < KCPU_TILE ? k - i0 : KCPU_TILE);
            j->dec(&j->c, i0, len, n0, T);
            j->store(T, len, kcpu_tile_cols(m, n0), j->w + n0 * k + i0, k, j->f16);
        }
}

/* The tensor shapes and group counts dequant_ref's checks insist on, so that a checkpoint
 * this decoder reads is one the reference would read (qd_kmat_from_packed checks the rest).
 * One check more: a K beyond its groups, which the gptq reference would read past. */
static int kdeq_check(const qd_format *fmt, const qd_packed *p, const qd_kmat *m, qd_err *err)
{
    /* A float weight's arrays were checked against its shape by qd_kmat_from_float. */
    if (m->layout == QD_KMAT_FLOAT) {
        if (!(fmt->bits_mask & (1u << m->bits)))
            return qd_err_set(err, QD_EUNSUPPORTED, "dequant: %d-bit tensors are not in format %s", m->bits, fmt->name);
        return 0;
    }
    if (!(fmt->bits_mask & (1u << p->bits)))
        return qd_err_set(err, QD_EUNSUPPORTED, "dequant: %d-bit tensors are not in format %s", p->bits, fmt->name);
    const int awq = m->layout == QD_KMAT_AWQ;
    const int64_t qw0 = awq ? p->k : p->k * p->bits / 32, qw1 = awq ? p->n / 8 : p->n;
    const int64_t qz1 = awq ? p->n / 8 : p->n * p->bits / 32;
    if (p->qweight_shape[0] != qw0 || p->qweight_shape[1] != qw1 || p->qzeros_shape[0] != p->n_groups ||
        p->qzeros_shape[1] != qz1 || p->scales_shape[0] != p->n_groups || p->scales_shape[1] != p->n)
        return qd_err_set(err, QD_ESHAPE, "dequant: %s tensors of a [%lld, %lld] %d-bit layer with %lld groups "
                          "have the wrong shapes", fmt->name, (long long)p->n, (long long)p->k, p->bits,
                          (long long)p->n_groups);
    if (awq && ((p->group_size > 0 && p->k % p->group_size) ||
                p->n_groups != (p->group_size > 0 ? p->k / p->group_size : 1)))
        return qd_err_set(err, QD_ESHAPE, "dequant: awq_gemm: %lld groups do not fit K %lld and group_size %lld",
                          (long long)p->n_groups, (long long)p->k, (long long)p->group_size);
    if (!m->act_order && m->group_size > 0 && m->k > m->group_size * m->n_groups)
        return qd_err_set(err, QD_ESHAPE, "dequant: %s K %lld exceeds %lld groups of %lld", fmt->name,
                          (long long)m->k, (long long)m->n_groups, (long long)m->group_size);
    return 0;
}

int qd_kernel_dequant_cpu(const qd_format *fmt, const qd_packed *p, float *w, int n_threads,
                          qd_kcpu_isa isa, qd_err *err)
{
    if (!fmt || !p || !w) return qd_err_set(err, QD_EINVAL, "dequant: NULL format, tensors or output");
    qd_kmat m;
    int avx2, rc = qd_kmat_from_packed(fmt, p, &m, err);
    if (!rc) rc = kdeq_check(fmt, p, &m, err);
    if (!rc) rc = kcpu_isa_pick(isa, &avx2, err);
    if (rc) return rc;
    /* F16C comes with every AVX2 CPU in practice, but is its own CPUID bit. */
    if (avx2 && fmt->f16_products && !cpu_has_f16c()) avx2 = 0;
    const int64_t n = m.n, k = m.k, G = m.n_groups, tiles = (n + 7) / 8;
    const int tables = m.layout != QD_KMAT_FLOAT;       /* the float decoder reads fscales */
    float *S = tables ? malloc((size_t)(G * n) * sizeof *S) : NULL;
    float *Z = tables ? malloc((size_t)(G * n) * sizeof *Z) : NULL;
    if (tables && (!S || !Z)) {
        free(S);
        free(Z);
        return qd_err_set(err, QD_ENOMEM, "dequant: out of memory for [%lld, %lld] tables", (long long)G,
                          (long long)n);
    }
    int nt = n_threads < 1 ? 1 : n_threads > QD_PARALLEL_MAX_THREADS ? QD_PARALLEL_MAX_THREADS : n_threads;
    if (n * k < (int64_t)nt * KDEQ_MIN_WEIGHTS_PER_THREAD) nt = (int)(n * k / KDEQ_MIN_WEIGHTS_PER_THREAD);
    if (nt > tiles) nt = (int)tiles;
    if (nt < 1) nt = 1;
    kdeq_job job = {{&m, S, Z}, kcpu_decode_pick(&m, avx2), avx2 ? kdeq_store_avx2 : kdeq_store_portable,
                    fmt->f16_products, S, Z, w};
    qd_parallel_for(nt, n, 8, kdeq_cols, &job);
    free(S);
    free(Z);
    return 0;
}
