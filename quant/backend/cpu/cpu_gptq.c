/* The CPU backend's GPTQ block op (quant/backend/gptq_block.h): rows split across threads,
 * each thread running one of three kernels picked at open: portable C, AVX2 (8 rows per
 * batch) or AVX-512 (16 rows per batch), all computing the same floats in the same order. */
#include "quant/backend/cpu/cpu_internal.h"

#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "quant/backend/gptq_block.h"
#include "quant/core/parallel.h"
#include "quant/formats/quantizer.h"


/* Rows of the block processed together: each Hinv row is read once per batch, and the
 * SIMD kernels hold one column of a batch in one register (8 lanes with AVX2, 16 with
 * AVX-512). Threads split the rows in whole batches of the widest kernel. */
#define CPU_GPTQ_ROWS 16

/* Scratch floats per thread: the block copy, errors, Q, codes, the original weights and
 * the group-parameter state (LDL form), each [B][16], then k floats for one row. */
#define CPU_GPTQ_SCRATCH(B, k) (((size_t)(6 * CPU_GPTQ_ROWS) * (size_t)(B) + (size_t)(k) + 15) / 16 * 16)

/* Dynamic groups: the parameters of every group that starts inside the block, for row r,
 * from the U form's weights as they stood when the block started: w itself, or in the LDL
 * form w + D with D_c = acc_c - sum_{i1 <= i < c} D_i hinv[i][c] (see gptq_block.h), which
 * is solved here row by row into tmp [k] over the columns the groups need. */
static void cpu_gptq_find_params(const qd_gptq_block_args *a, int64_t r, float *tmp)
{
    const int64_t k = a->k, i1 = a->i1, i2 = a->i2;
    const int64_t gs = a->cfg->group_size > 0 ? a->cfg->group_size : k;
    const int64_t j0 = (i1 + gs - 1) / gs * gs;
    const float *wr = a->w + r * a->ldw;
    if (a->ldl && a->acc && j0 < i2) {
        int64_t jl = j0 + (i2 - 1 - j0) / gs * gs;             /* the last group start in the block */
        int64_t end = jl + gs < k ? jl + gs : k;
        const float *ar = a->acc + r * a->lda;
        for (int64_t c = i1; c < end; c++) tmp[c - i1] = ar[c];
        for (int64_t i = i1; i < end; i++) {
            const float *hrow = a->hinv + i * a->ldh;
            float d = tmp[i - i1];
            for (int64_t c = i + 1; c < end; c++) tmp[c - i1] -= d * hrow[c];
        }
        for (int64_t c = i1; c < end; c++) tmp[c - i1] += wr[c];
    }
    for (int64_t j = j0; j < i2; j += gs) {
        int64_t len = j + gs <= k ? gs : k - j;
        int64_t g = a->col_group[j];
        const float *src = a->ldl && a->acc ? tmp + (j - i1) : wr + j;
        qd_quant_params_w(a->cfg, src, len, 1, a->col_weight ? a->col_weight + j : NULL, &a->scales[g * a->n + r],
                          &a->zeros[g * a->n + r]);
    }
}

/* Whether the LDL form's group parameters can be found on the block copy: dynamic groups,
 * corrections present, and every group that starts in the block ends inside it. */
static int cpu_gptq_ldl_vec_params(const qd_gptq_block_args *a)
{
    if (!a->find_params || !a->ldl || !a->acc) return 0;
    const int64_t gs = a->cfg->group_size > 0 ? a->cfg->group_size : a->k;
    const int64_t j0 = (a->i1 + gs - 1) / gs * gs;
    if (j0 >= a->i2) return 0;                                  /* no group starts here */
    int64_t jl = j0 + (a->i2 - 1 - j0) / gs * gs;
    return (jl + gs < a->k ? jl + gs : a->k) <= a->i2;
}

/* The parameters of the groups in the block for the rows of a batch of `lanes` rows, from
 * pl [B][lanes] = w + D (see cpu_gptq_find_params), read with a stride. */
static void cpu_gptq_params_from_batch(const qd_gptq_block_args *a, int64_t rb, int nr, const float *pl,
                                       int lanes)
{
    const int64_t k = a->k, i1 = a->i1, i2 = a->i2;
    const int64_t gs = a->cfg->group_size > 0 ? a->cfg->group_size : k;
    for (int rr = 0; rr < nr; rr++)
        for (int64_t j = (i1 + gs - 1) / gs * gs; j < i2; j += gs) {
            int64_t len = j + gs <= k ? gs : k - j, g = a->col_group[j], r = rb + rr;
            qd_quant_params_w(a->cfg, pl + (j - i1) * lanes + rr, len, lanes, a->col_weight ? a->col_weight + j : NULL,
                              &a->scales[g * a->n + r], &a->zeros[g * a->n + r]);
        }
}

/* Where row r's Q goes: q when given, else w (see gptq_block.h). */
static inline float *cpu_gptq_qrow(const qd_gptq_block_args *a, int64_t r)
{
    return a->q ? a->q + r * a->ldq : a->w + r * a->ldw;
}

/* Row r's slice [i1, i2) of the updated weights (w, or w + acc) into dst with stride st. */
static void cpu_gptq_load_row(const qd_gptq_block_args *a, int64_t r, float *dst, int64_t st)
{
    const int64_t i1 = a->i1, B = a->i2 - a->i1;
    const float *src = a->w + r * a->ldw + i1;
    if (a->ldl && a->acc) {
        const float *ac = a->acc + r * a->lda + i1;
        for (int64_t i = 0; i < B; i++) dst[i * st] = src[i] + ac[i];
    } else {
        for (int64_t i = 0; i < B; i++) dst[i * st] = src[i];
    }
}

/* One column's loss (gptq_block.h): (x - q)^2 D_jj in the LDL form (hjj = D_jj), e^2 in
 * the U form. */
static inline float cpu_gptq_col_loss(int ldl, float d, float e, float hjj)
{
    return ldl ? d * d * hjj : e * e;
}

/* A batch's block losses into the rows' double sums (when asked for). */
static inline void cpu_gptq_loss_add(const qd_gptq_block_args *a, int64_t rb, int nr, const float *loss)
{
    if (a->loss)
        for (int rr = 0; rr < nr; rr++) a->loss[rb + rr] += loss[rr];
}

/* Portable kernel: rows [r0, r1) in batches, each row's slice of the block in scratch. */
static void cpu_gptq_rows_ref(const qd_gptq_block_args *a, int64_t r0, int64_t r1, float *scratch)
{
    const int64_t n = a->n, i1 = a->i1, B = a->i2 - a->i1;
    float *w1 = scratch;                                     /* [16][B] */
    float *tmp = scratch + 6 * CPU_GPTQ_ROWS * B;
    for (int64_t rb = r0; rb < r1; rb += CPU_GPTQ_ROWS) {
        int nr = (int)(r1 - rb < CPU_GPTQ_ROWS ? r1 - rb : CPU_GPTQ_ROWS);
        float loss[CPU_GPTQ_ROWS] = {0};
        for (int rr = 0; rr < nr; rr++) {
            if (a->find_params) cpu_gptq_find_params(a, rb + rr, tmp);
            cpu_gptq_load_row(a, rb + rr, w1 + rr * B, 1);
        }
        for (int64_t i = 0; i < B; i++) {
            int64_t j = i1 + i, g = a->col_group[j];
            const float *hrow = a->hinv + j * a->ldh;
            for (int rr = 0; rr < nr; rr++) {
                int64_t r = rb + rr;
                float s = a->scales[g * n + r], z = a->zeros[g * n + r];
                float *y = w1 + rr * B;
                float x = y[i];
                int code = qd_quant_code_cfg(a->cfg, x, s, z);
                float qv = qd_quant_dequant_cfg(a->cfg, code, s, z);
                /* LDL form: the original weight's error, added (see gptq_block.h). */
                float e = a->ldl ? a->w[r * a->ldw + j] - qv : (x - qv) / hrow[j];
                loss[rr] += cpu_gptq_col_loss(a->ldl, x - qv, e, hrow[j]);
                if (a->ldl)
                    for (int64_t c = i + 1; c < B; c++) y[c] += e * hrow[i1 + c];
                else
                    for (int64_t c = i + 1; c < B; c++) y[c] -= e * hrow[i1 + c];
                a->err[r * a->lde + i] = e;
                a->codes[r * a->ldc + j] = (uint8_t)code;
                cpu_gptq_qrow(a, r)[j] = qv;
            }
        }
        cpu_gptq_loss_add(a, rb, nr, loss);
    }
}

/* AVX2 kernel: a batch of 8 rows is stored column-major ([B][8]), so one column of the
 * batch is one register: quantization runs on 8 rows at once with the same operations as
 * qd_quant_code / qd_quant_dequant (divide, round half to even, add zero, clamp), and the
 * in-block update of column c is one FMA with Hinv[j][c] broadcast. */
__attribute__((target("avx2,fma")))
static void cpu_gptq_rows_avx2(const qd_gptq_block_args *a, int64_t r0, int64_t r1, float *scratch)
{
    const int64_t n = a->n, i1 = a->i1, B = a->i2 - a->i1;
    float *w1 = scratch, *el = w1 + B * 8, *ql = el + B * 8, *cl = ql + B * 8, *w0 = cl + B * 8, *pl = w0 + B * 8;
    const int vec_params = cpu_gptq_ldl_vec_params(a);
    float *tmp = scratch + 6 * CPU_GPTQ_ROWS * B;
    const __m256 v0 = _mm256_setzero_ps(), vmaxq = _mm256_set1_ps((float)qd_quant_maxq(a->cfg));
    for (int64_t rb = r0; rb < r1; rb += 8) {
        int nr = (int)(r1 - rb < 8 ? r1 - rb : 8);
        for (int rr = 0; rr < 8; rr++) {
            if (rr < nr && a->find_params && !vec_params) cpu_gptq_find_params(a, rb + rr, tmp);
            const float *src = a->w + (rb + rr) * a->ldw + i1;
            if (rr < nr) cpu_gptq_load_row(a, rb + rr, w1 + rr, 8);
            else for (int64_t i = 0; i < B; i++) w1[i * 8 + rr] = 0.0f;
            if (a->ldl) for (int64_t i = 0; i < B; i++) w0[i * 8 + rr] = rr < nr ? src[i] : 0.0f;
            if (vec_params) {
                const float *ac = a->acc + (rb + rr) * a->lda + i1;
                for (int64_t i = 0; i < B; i++) pl[i * 8 + rr] = rr < nr ? ac[i] : 0.0f;
            }
        }
        if (vec_params) {
            /* D_c = acc_c - sum_{i < c} D_i A[i][c], then w + D (cpu_gptq_find_params) */
            for (int64_t i = 0; i < B; i++) {
                __m256 dv = _mm256_loadu_ps(pl + i * 8);
                const float *hc = a->hinv + (i1 + i) * a->ldh + i1;
                for (int64_t c = i + 1; c < B; c++)
                    _mm256_storeu_ps(pl + c * 8, _mm256_fnmadd_ps(dv, _mm256_set1_ps(hc[c]), _mm256_loadu_ps(pl + c * 8)));
                _mm256_storeu_ps(pl + i * 8, _mm256_add_ps(dv, _mm256_loadu_ps(w0 + i * 8)));
            }
            cpu_gptq_params_from_batch(a, rb, nr, pl, 8);
        }
        int64_t gcur = -1;
        __m256 vs = v0, vz = v0, vloss = v0;
        for (int64_t i = 0; i < B; i++) {
            int64_t j = i1 + i, g = a->col_group[j];
            if (g != gcur) {
                /* Missing rows of a short batch get scale 1, zero 0: harmless, never stored. */
                float s8[8], z8[8];
                for (int rr = 0; rr < 8; rr++) {
                    s8[rr] = rr < nr ? a->scales[g * n + rb + rr] : 1.0f;
                    z8[rr] = rr < nr ? a->zeros[g * n + rb + rr] : 0.0f;
                }
                vs = _mm256_loadu_ps(s8);
                vz = _mm256_loadu_ps(z8);
                gcur = g;
            }
            const float *hrow = a->hinv + j * a->ldh;
            __m256 x = _mm256_loadu_ps(w1 + i * 8);
            __m256 v = _mm256_add_ps(_mm256_round_ps(_mm256_div_ps(x, vs), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), vz);
            v = _mm256_min_ps(_mm256_max_ps(v, v0), vmaxq);
            __m256 qv = _mm256_mul_ps(vs, _mm256_sub_ps(v, vz));
            /* LDL form: e is the original weight's error and the update adds e * A, done
             * below as w1 - (-e) * A (negation is exact, so this is the fused w1 + e * A). */
            __m256 e = a->ldl ? _mm256_sub_ps(_mm256_loadu_ps(w0 + i * 8), qv)
                              : _mm256_div_ps(_mm256_sub_ps(x, qv), _mm256_set1_ps(hrow[j]));
            if (a->loss) {
                __m256 d = a->ldl ? _mm256_sub_ps(x, qv) : e;
                vloss = _mm256_fmadd_ps(d, a->ldl ? _mm256_mul_ps(d, _mm256_set1_ps(hrow[j])) : d, vloss);
            }
            _mm256_storeu_ps(el + i * 8, e);
            if (a->ldl) e = _mm256_sub_ps(v0, e);
            _mm256_storeu_ps(ql + i * 8, qv);
            _mm256_storeu_ps(cl + i * 8, v);
            float *wc = w1 + (i + 1) * 8;
            const float *hc = hrow + j + 1;
            int64_t len = B - i - 1, c = 0;
            for (; c + 4 <= len; c += 4) {
                __m256 y0 = _mm256_fnmadd_ps(e, _mm256_set1_ps(hc[c]), _mm256_loadu_ps(wc + c * 8));
                __m256 y1 = _mm256_fnmadd_ps(e, _mm256_set1_ps(hc[c + 1]), _mm256_loadu_ps(wc + c * 8 + 8));
                __m256 y2 = _mm256_fnmadd_ps(e, _mm256_set1_ps(hc[c + 2]), _mm256_loadu_ps(wc + c * 8 + 16));
                __m256 y3 = _mm256_fnmadd_ps(e, _mm256_set1_ps(hc[c + 3]), _mm256_loadu_ps(wc + c * 8 + 24));
                _mm256_storeu_ps(wc + c * 8, y0);
                _mm256_storeu_ps(wc + c * 8 + 8, y1);
                _mm256_storeu_ps(wc + c * 8 + 16, y2);
                _mm256_storeu_ps(wc + c * 8 + 24, y3);
            }
            for (; c < len; c++)
                _mm256_storeu_ps(wc + c * 8, _mm256_fnmadd_ps(e, _mm256_set1_ps(hc[c]), _mm256_loadu_ps(wc + c * 8)));
        }
        for (int rr = 0; rr < nr; rr++) {
            int64_t r = rb + rr;
            float *er = a->err + r * a->lde, *wr = cpu_gptq_qrow(a, r) + i1;
            uint8_t *cr = a->codes + r * a->ldc + i1;
            for (int64_t i = 0; i < B; i++) {
                er[i] = el[i * 8 + rr];
                wr[i] = ql[i * 8 + rr];
                cr[i] = (uint8_t)(int)cl[i * 8 + rr];
            }
        }
        float loss[8];
        _mm256_storeu_ps(loss, vloss);
        cpu_gptq_loss_add(a, rb, nr, loss);
    }
}

/* Transposes the 16 x 16 floats in r (r[i] lane j <-> r[j] lane i): the batch layout
 * [B][16] holds a row-major [16][B] slab transposed, so copies in and out go through this
 * in 16-column tiles instead of one strided scalar per element. */
__attribute__((target("avx512f")))
static inline void cpu_transpose16(__m512 r[16])
{
    __m512 t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
        t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
    }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
    }
}

/* cpu_gptq_params_from_batch for 16 lanes: each group's min and max over all 16 rows at
 * once (min_ps(v, m) is v < m ? v : m, exactly qd_quant_params' comparison), then the
 * parameters lane by lane from the range. */
__attribute__((target("avx512f")))
static void cpu_gptq_params_from_batch16(const qd_gptq_block_args *a, int64_t rb, int nr, const float *pl)
{
    /* The scale search reads every value per candidate, not only the range. */
    if (a->cfg->scale_search == QD_SCALE_SEARCH_MSE) {
        cpu_gptq_params_from_batch(a, rb, nr, pl, 16);
        return;
    }
    const int64_t k = a->k, i1 = a->i1, i2 = a->i2;
    const int64_t gs = a->cfg->group_size > 0 ? a->cfg->group_size : k;
    for (int64_t j = (i1 + gs - 1) / gs * gs; j < i2; j += gs) {
        const int64_t len = j + gs <= k ? gs : k - j, g = a->col_group[j];
        __m512 lo = _mm512_setzero_ps(), hi = _mm512_setzero_ps();
        for (int64_t i = 0; i < len; i++) {
            __m512 v = _mm512_loadu_ps(pl + (j - i1 + i) * 16);
            lo = _mm512_min_ps(v, lo);
            hi = _mm512_max_ps(v, hi);
        }
        float lo16[16], hi16[16];
        _mm512_storeu_ps(lo16, lo);
        _mm512_storeu_ps(hi16, hi);
        for (int rr = 0; rr < nr; rr++)
            qd_quant_params_range(a->cfg, lo16[rr], hi16[rr], &a->scales[g * a->n + rb + rr],
                                  &a->zeros[g * a->n + rb + rr]);
    }
}

/* Prefetches rows [ra, rb) (clipped to r1) of the block's columns of w, and of acc when the
 * block has corrections. */
static inline void cpu_gptq_prefetch_rows(const qd_gptq_block_args *a, int64_t ra, int64_t rb, int64_t r1)
{
    const int64_t B = a->i2 - a->i1;
    for (int64_t r = ra; r < rb && r < r1; r++)
        for (int64_t i = 0; i < B; i += 16) {
            _mm_prefetch((const char *)(a->w + r * a->ldw + a->i1 + i), _MM_HINT_T0);
            if (a->ldl && a->acc) _mm_prefetch((const char *)(a->acc + r * a->lda + a->i1 + i), _MM_HINT_T0);
        }
}

/* The group parameters of a 16-row batch as the AVX-512 column loop reaches column j:
 * reloaded only when the column's group changes. */
typedef struct cpu_gptq_group16 {
    const qd_gptq_block_args *a;
    int64_t rb;                 /* the batch's first row */
    int nr;                     /* rows in the batch (16 but for the last) */
    int64_t g;                  /* the group loaded, -1 before the first */
    __m512 s, z;
    __m512 loss;                /* the batch's column losses so far (when asked for) */
} cpu_gptq_group16;

/* Quantizes column j of a batch (x: its 16 rows) with the operations of qd_quant_code /
 * qd_quant_dequant, stores the error, Q and codes at el, ql, cl, and returns the factor
 * the later columns' updates take (fnmadd): the U form's e = (x - q) / hinv[j][j], the LDL
 * form's -(w - q) (negation is exact, so fnmadd adds e * A exactly as fmadd would). */
__attribute__((target("avx512f,fma"), always_inline))
static inline __m512 cpu_gptq_quant16(cpu_gptq_group16 *gp, int64_t j, __m512 x, float hjj, const float *w0,
                                      float *el, float *ql, float *cl, __m512 vmaxq)
{
    const qd_gptq_block_args *a = gp->a;
    const __m512 v0 = _mm512_setzero_ps();
    const int64_t g = a->col_group[j];
    if (g != gp->g) {
        /* Missing rows of a short batch get scale 1, zero 0: harmless, never stored. */
        float s16[16], z16[16];
        for (int rr = 0; rr < 16; rr++) {
            s16[rr] = rr < gp->nr ? a->scales[g * a->n + gp->rb + rr] : 1.0f;
            z16[rr] = rr < gp->nr ? a->zeros[g * a->n + gp->rb + rr] : 0.0f;
        }
        gp->s = _mm512_loadu_ps(s16);
        gp->z = _mm512_loadu_ps(z16);
        gp->g = g;
    }
    const __m512 vs = gp->s, vz = gp->z;
    __m512 v = _mm512_add_ps(_mm512_roundscale_ps(_mm512_div_ps(x, vs), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), vz);
    v = _mm512_min_ps(_mm512_max_ps(v, v0), vmaxq);
    __m512 qv = _mm512_mul_ps(vs, _mm512_sub_ps(v, vz));
    __m512 e = a->ldl ? _mm512_sub_ps(_mm512_loadu_ps(w0), qv) : _mm512_div_ps(_mm512_sub_ps(x, qv), _mm512_set1_ps(hjj));
    if (a->loss) {
        __m512 d = a->ldl ? _mm512_sub_ps(x, qv) : e;
        gp->loss = _mm512_fmadd_ps(d, a->ldl ? _mm512_mul_ps(d, _mm512_set1_ps(hjj)) : d, gp->loss);
    }
    _mm512_storeu_ps(el, e);
    _mm512_storeu_ps(ql, qv);
    _mm512_storeu_ps(cl, v);
    return a->ldl ? _mm512_sub_ps(v0, e) : e;
}

/* Columns [c0, B) of a batch y [B][16] take the 16 updates of the sub-block before them:
 * y[c] = fnmadd(ev[i], h[i * ldh + c], y[c]) for i = 0 .. 15 in turn, which is per element
 * what 16 rank-1 updates do, so the floats are the same; but each y[c] is loaded and
 * stored once, and 4 columns give 4 independent chains of FMAs. */
__attribute__((target("avx512f,fma"), always_inline))
static inline void cpu_gptq_rank16_avx512(float *y, int64_t c0, int64_t B, const __m512 ev[16], const float *h,
                                          int64_t ldh)
{
    int64_t c = c0;
    for (; c + 4 <= B; c += 4) {
        __m512 y0 = _mm512_loadu_ps(y + c * 16), y1 = _mm512_loadu_ps(y + c * 16 + 16);
        __m512 y2 = _mm512_loadu_ps(y + c * 16 + 32), y3 = _mm512_loadu_ps(y + c * 16 + 48);
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) {
            const float *hr = h + i * ldh + c;
            y0 = _mm512_fnmadd_ps(ev[i], _mm512_set1_ps(hr[0]), y0);
            y1 = _mm512_fnmadd_ps(ev[i], _mm512_set1_ps(hr[1]), y1);
            y2 = _mm512_fnmadd_ps(ev[i], _mm512_set1_ps(hr[2]), y2);
            y3 = _mm512_fnmadd_ps(ev[i], _mm512_set1_ps(hr[3]), y3);
        }
        _mm512_storeu_ps(y + c * 16, y0);
        _mm512_storeu_ps(y + c * 16 + 16, y1);
        _mm512_storeu_ps(y + c * 16 + 32, y2);
        _mm512_storeu_ps(y + c * 16 + 48, y3);
    }
    for (; c < B; c++) {
        __m512 y0 = _mm512_loadu_ps(y + c * 16);
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) y0 = _mm512_fnmadd_ps(ev[i], _mm512_set1_ps(h[i * ldh + c]), y0);
        _mm512_storeu_ps(y + c * 16, y0);
    }
}

/* AVX-512 kernel: the AVX2 kernel with 16 rows per batch, one column of a batch in one
 * 16-lane register. Every lane runs exactly the AVX2 kernel's operations (divide, round
 * half to even, add, clamp, multiply, subtract, divide, fused multiply-subtract), so the
 * results are bit-identical to it; only the width changes. */
__attribute__((target("avx512f,fma")))
static void cpu_gptq_rows_avx512(const qd_gptq_block_args *a, int64_t r0, int64_t r1, float *scratch)
{
    const int64_t i1 = a->i1, B = a->i2 - a->i1;
    float *w1 = scratch, *el = w1 + B * 16, *ql = el + B * 16, *cl = ql + B * 16, *w0 = cl + B * 16;
    float *pl = w0 + B * 16;
    const int vec_params = cpu_gptq_ldl_vec_params(a);
    float *tmp = scratch + 6 * CPU_GPTQ_ROWS * B;
    const __m512 v0 = _mm512_setzero_ps(), vmaxq = _mm512_set1_ps((float)qd_quant_maxq(a->cfg));
    const int with_acc = a->ldl && a->acc;
    for (int64_t rb = r0; rb < r1; rb += 16) {
        int nr = (int)(r1 - rb < 16 ? r1 - rb : 16);
        /* Full batches copy in by 16 x 16 tiles, the rest (short batches, the last B % 16
         * columns) element by element: the same values either way. */
        const int64_t Bt = nr == 16 ? B / 16 * 16 : 0;
        for (int rr = 0; rr < 16; rr++) {
            if (rr < nr && a->find_params && !vec_params) cpu_gptq_find_params(a, rb + rr, tmp);
            const float *src = a->w + (rb + rr) * a->ldw + i1;
            const float *ac = with_acc ? a->acc + (rb + rr) * a->lda + i1 : NULL;
            for (int64_t i = Bt; i < B; i++) {
                w1[i * 16 + rr] = rr < nr ? (ac ? src[i] + ac[i] : src[i]) : 0.0f;
                if (a->ldl) w0[i * 16 + rr] = rr < nr ? src[i] : 0.0f;
                if (vec_params) pl[i * 16 + rr] = rr < nr ? ac[i] : 0.0f;
            }
        }
        for (int64_t i = 0; i < Bt; i += 16) {
            __m512 tw[16], ta[16];
            for (int rr = 0; rr < 16; rr++) tw[rr] = _mm512_loadu_ps(a->w + (rb + rr) * a->ldw + i1 + i);
            for (int rr = 0; rr < 16; rr++)
                ta[rr] = with_acc ? _mm512_loadu_ps(a->acc + (rb + rr) * a->lda + i1 + i) : v0;
            if (a->ldl) {
                __m512 t0[16];
                for (int rr = 0; rr < 16; rr++) t0[rr] = tw[rr];
                cpu_transpose16(t0);
                for (int c = 0; c < 16; c++) _mm512_storeu_ps(w0 + (i + c) * 16, t0[c]);
            }
            if (with_acc)
                for (int rr = 0; rr < 16; rr++) tw[rr] = _mm512_add_ps(tw[rr], ta[rr]);
            cpu_transpose16(tw);
            for (int c = 0; c < 16; c++) _mm512_storeu_ps(w1 + (i + c) * 16, tw[c]);
            if (vec_params) {
                cpu_transpose16(ta);
                for (int c = 0; c < 16; c++) _mm512_storeu_ps(pl + (i + c) * 16, ta[c]);
            }
        }
        if (vec_params) {
            /* D_c = acc_c - sum_{i < c} D_i A[i][c], then w + D (cpu_gptq_find_params):
             * sub-blocks of 16 columns in registers, then one rank-16 update of the
             * block's later columns per sub-block; the last B % 16 columns one by one. */
            const float *hb = a->hinv + i1 * a->ldh + i1;           /* A[i1:i2, i1:i2] */
            const int64_t Bs = B / 16 * 16;
            for (int64_t s0 = 0; s0 < Bs; s0 += 16) {
                __m512 y[16];
#pragma GCC unroll 16
                for (int c = 0; c < 16; c++) y[c] = _mm512_loadu_ps(pl + (s0 + c) * 16);
#pragma GCC unroll 16
                for (int i = 0; i < 16; i++) {
                    const float *hc = hb + (s0 + i) * a->ldh + s0;
#pragma GCC unroll 16
                    for (int c = i + 1; c < 16; c++) y[c] = _mm512_fnmadd_ps(y[i], _mm512_set1_ps(hc[c]), y[c]);
                    _mm512_storeu_ps(pl + (s0 + i) * 16, _mm512_add_ps(y[i], _mm512_loadu_ps(w0 + (s0 + i) * 16)));
                }
                cpu_gptq_rank16_avx512(pl, s0 + 16, B, y, hb + s0 * a->ldh, a->ldh);
            }
            for (int64_t i = Bs; i < B; i++) {
                __m512 dv = _mm512_loadu_ps(pl + i * 16);
                const float *hc = hb + i * a->ldh;
                for (int64_t c = i + 1; c < B; c++)
                    _mm512_storeu_ps(pl + c * 16, _mm512_fnmadd_ps(dv, _mm512_set1_ps(hc[c]), _mm512_loadu_ps(pl + c * 16)));
                _mm512_storeu_ps(pl + i * 16, _mm512_add_ps(dv, _mm512_loadu_ps(w0 + i * 16)));
            }
            cpu_gptq_params_from_batch16(a, rb, nr, pl);
        }
        /* The column loop, sub-blocked like the solve above: 16 columns held in registers
         * take their rank-1 updates from each other, then the block's later columns take
         * the sub-block's 16 errors at once. Per element these are the rank-1 loop's fused
         * operations in the same order, so the results do not change. */
        cpu_gptq_group16 grp = {.a = a, .rb = rb, .nr = nr, .g = -1, .loss = v0};
        const float *hb = a->hinv + i1 * a->ldh + i1;               /* hinv[i1:i2, i1:i2] */
        const int64_t Bs = B / 16 * 16;
        for (int64_t s0 = 0; s0 < Bs; s0 += 16) {
            /* The next batch's rows of w and acc are cold (the trailing GEMM last wrote acc
             * over the whole layer): ask for a share of them with every sub-block, few
             * enough at a time not to stall on the CPU's outstanding misses. */
            cpu_gptq_prefetch_rows(a, rb + 16 + s0 * 16 / Bs, rb + 16 + (s0 + 16) * 16 / Bs, r1);
            __m512 y[16], ev[16];
#pragma GCC unroll 16
            for (int c = 0; c < 16; c++) y[c] = _mm512_loadu_ps(w1 + (s0 + c) * 16);
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++) {
                const int64_t b = s0 + i;
                const float *hc = hb + b * a->ldh + s0;
                ev[i] = cpu_gptq_quant16(&grp, i1 + b, y[i], hc[i], w0 + b * 16, el + b * 16, ql + b * 16,
                                         cl + b * 16, vmaxq);
#pragma GCC unroll 16
                for (int c = i + 1; c < 16; c++) y[c] = _mm512_fnmadd_ps(ev[i], _mm512_set1_ps(hc[c]), y[c]);
            }
            cpu_gptq_rank16_avx512(w1, s0 + 16, B, ev, hb + s0 * a->ldh, a->ldh);
        }
        for (int64_t i = Bs; i < B; i++) {
            const float *hc = hb + i * a->ldh;
            __m512 e = cpu_gptq_quant16(&grp, i1 + i, _mm512_loadu_ps(w1 + i * 16), hc[i], w0 + i * 16,
                                        el + i * 16, ql + i * 16, cl + i * 16, vmaxq);
            for (int64_t c = i + 1; c < B; c++)
                _mm512_storeu_ps(w1 + c * 16, _mm512_fnmadd_ps(e, _mm512_set1_ps(hc[c]), _mm512_loadu_ps(w1 + c * 16)));
        }
        for (int64_t i = 0; i < Bt; i += 16) {
            __m512 te[16], tq[16], tc[16];
            for (int c = 0; c < 16; c++) {
                te[c] = _mm512_loadu_ps(el + (i + c) * 16);
                tq[c] = _mm512_loadu_ps(ql + (i + c) * 16);
                tc[c] = _mm512_loadu_ps(cl + (i + c) * 16);
            }
            cpu_transpose16(te);
            cpu_transpose16(tq);
            cpu_transpose16(tc);
            for (int rr = 0; rr < 16; rr++) {
                int64_t r = rb + rr;
                _mm512_storeu_ps(a->err + r * a->lde + i, te[rr]);
                _mm512_storeu_ps(cpu_gptq_qrow(a, r) + i1 + i, tq[rr]);
                /* codes are small exact integers: converting rounds nothing */
                _mm_storeu_si128((__m128i *)(a->codes + r * a->ldc + i1 + i),
                                 _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(tc[rr])));
            }
        }
        for (int rr = 0; rr < nr; rr++) {
            int64_t r = rb + rr;
            float *er = a->err + r * a->lde, *wr = cpu_gptq_qrow(a, r) + i1;
            uint8_t *cr = a->codes + r * a->ldc + i1;
            for (int64_t i = Bt; i < B; i++) {
                er[i] = el[i * 16 + rr];
                wr[i] = ql[i * 16 + rr];
                cr[i] = (uint8_t)(int)cl[i * 16 + rr];
            }
        }
        float loss[16];
        _mm512_storeu_ps(loss, grp.loss);
        cpu_gptq_loss_add(a, rb, nr, loss);
    }
}

typedef struct cpu_gptq_share {
    const qd_gptq_block_args *a;
    cpu_gptq_rows_fn rows;
    float *scratch;            /* per share: CPU_GPTQ_SCRATCH floats each */
    size_t per_thread;
} cpu_gptq_share;

static void cpu_gptq_rows_run(void *ctx, int t, int64_t r0, int64_t r1)
{
    const cpu_gptq_share *s = ctx;
    s->rows(s->a, r0, r1, s->scratch + (size_t)t * s->per_thread);
}

int cpu_gptq_block(qd_backend *be, const qd_gptq_block_args *a)
{
    if (!a || !a->cfg || !a->w || !a->hinv || !a->err || !a->codes || !a->scales || !a->zeros ||
        !a->col_group || a->n < 0 || a->i1 < 0 || a->i2 <= a->i1 || a->i2 > a->k ||
        a->ldw < a->k || a->ldh < a->k || a->ldc < a->k || a->lde < a->i2 - a->i1 ||
        (a->ldl && a->acc && a->lda < a->k) || (a->q && (!a->ldl || a->ldq < a->k)))
        return qd_err_set(&be->err, QD_EINVAL, "cpu gptq_block: bad arguments");
    const cpu_impl *impl = be->impl;
    const int64_t n = a->n, B = a->i2 - a->i1;
    /* Threads split the rows; below a few batches per thread the start-up is not worth it. */
    int nt = be->n_threads;
    if (n < (int64_t)nt * 128) nt = 1;
    const size_t per_thread = CPU_GPTQ_SCRATCH(B, a->k);
    nt = qd_parallel_shares(nt, n, CPU_GPTQ_ROWS);
    float *scratch = qd_backend_alloc(be, (size_t)nt * per_thread * sizeof(float));
    if (!scratch) return QD_ENOMEM;
    /* Whole batches of rows per thread. */
    /* The SIMD kernels round on the integer grid; the float grids (FP8, FP4) take the
     * portable kernel, whose rounding is qd_quant_code_cfg's. */
    cpu_gptq_share share = {a, a->cfg->grid == QD_GRID_INT ? impl->gptq_rows : cpu_gptq_rows_ref, scratch, per_thread};
    qd_parallel_for(nt, n, CPU_GPTQ_ROWS, cpu_gptq_rows_run, &share);
    qd_backend_free(be, scratch);
    return 0;
}

const char *cpu_gptq_rows_name(cpu_gptq_rows_fn f)
{
    return f == cpu_gptq_rows_avx512 ? "avx512" : f == cpu_gptq_rows_avx2 ? "avx2" : "portable";
}

cpu_gptq_rows_fn cpu_gptq_rows_pick(qd_cpu_kernel kernel)
{
    __builtin_cpu_init();
    /* QD_CPU_KERNEL_PORTABLE selects the plain C kernels (tests compare the two). */
    int simd = kernel != QD_CPU_KERNEL_PORTABLE;
    /* QD_CPU_KERNEL_AVX2 keeps the 8-lane kernel on AVX-512 machines (tests compare). */
    int avx2_only = kernel == QD_CPU_KERNEL_AVX2;
    int fma = __builtin_cpu_supports("fma");
    return (simd && !avx2_only && fma && __builtin_cpu_supports("avx512f")) ? cpu_gptq_rows_avx512
           : (simd && fma && __builtin_cpu_supports("avx2"))                ? cpu_gptq_rows_avx2
                                                                            : cpu_gptq_rows_ref;
}
