/* The scale search of quantizer.h: a group's (scale, zero) chosen among shrunk ranges by
 * the lowest weighted error of its dequantized values. Every candidate goes through
 * qd_quant_params_range (so F16 rounding, zero_min1 and the float grids' scale rules are
 * exactly the min-max quantizer's) and is scored on the codes a checkpoint decodes to.
 *
 * Cost: at most one pass over the group per distinct candidate: candidates whose rounded
 * (scale, zero) equal the previous one's are skipped (their error is the same, and a tie
 * keeps the earlier), and a candidate's sum stops once it reaches the best so far. */
#include "quant/formats/quantizer.h"

#include <math.h>
#include <string.h>

const char *qd_scale_search_name(qd_scale_search s)
{
    switch (s) {
    case QD_SCALE_SEARCH_MINMAX: return "minmax";
    case QD_SCALE_SEARCH_MSE: return "mse";
    }
    return NULL;
}

int qd_scale_search_parse(const char *name)
{
    if (!name) return -1;
    if (!strcmp(name, "minmax")) return QD_SCALE_SEARCH_MINMAX;
    if (!strcmp(name, "mse")) return QD_SCALE_SEARCH_MSE;
    return -1;
}

int qd_quant_search_count(const qd_quant_cfg *c)
{
    int m = (int)lrintf(c->search_maxshrink * (float)c->search_grid);
    return m < 1 ? 1 : m;
}

void qd_quant_search_candidate(const qd_quant_cfg *c, float xmin, float xmax, int i, float *scale, float *zero)
{
    qd_quant_cfg cc = *c;
    /* p = 1 is min-max itself (a clip ratio of 1 is not applied at all). */
    if (i > 0) cc.clip_ratio = c->clip_ratio * (1.0f - (float)i / (float)c->search_grid);
    qd_quant_params_range(&cc, xmin, xmax, scale, zero);
}

/* |d|^norm, with the common exponents exact and cheap. */
static inline float search_pow(float d, float norm)
{
    return norm == 2.0f ? d * d : norm == 1.0f ? d : powf(d, norm);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* search_err_bounded for the common case (integer grid, exponent 2, contiguous values): the
 * eight terms of a chunk computed in one AVX2 register with exactly the scalar operations
 * (IEEE division, round to nearest even, the clamp, s * (q - z), no FMA), then summed in
 * the scalar's order, so the result is the scalar's to the bit (test_scale_search). */
__attribute__((target("avx2")))
static double search_err_int2_avx2(const float *w, int64_t n, const float *wt, float scale, float zero, int maxq,
                                   double bound)
{
    const __m256 vs = _mm256_set1_ps(scale), vz = _mm256_set1_ps(zero), vmax = _mm256_set1_ps((float)maxq);
    const __m256 vzero = _mm256_setzero_ps(), sign = _mm256_set1_ps(-0.0f);
    double e = 0.0;
    int64_t i0 = 0;
    for (; i0 + 8 <= n; i0 += 8) {
        __m256 v = _mm256_loadu_ps(w + i0);
        __m256 q = _mm256_add_ps(_mm256_round_ps(_mm256_div_ps(v, vs), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), vz);
        q = _mm256_min_ps(_mm256_max_ps(q, vzero), vmax);
        __m256 d = _mm256_andnot_ps(sign, _mm256_sub_ps(v, _mm256_mul_ps(vs, _mm256_sub_ps(q, vz))));
        __m256 t = _mm256_mul_ps(d, d);
        if (wt) t = _mm256_mul_ps(_mm256_loadu_ps(wt + i0), t);
        float tt[8];
        _mm256_storeu_ps(tt, t);
        float part = 0.0f;
        for (int i = 0; i < 8; i++) part += tt[i];
        e += (double)part;
        if (e >= bound) return e;
    }
    float part = 0.0f;
    for (int64_t i = i0; i < n; i++) {
        float v = w[i];
        float d = fabsf(v - qd_quant_dequant(qd_quant_code(v, scale, zero, maxq), scale, zero));
        part += wt ? wt[i] * (d * d) : d * d;
    }
    return i0 < n ? e + (double)part : e;
}

static int search_have_avx2(void)
{
    static int have = -1;       /* a race writes the same value */
    if (have < 0) have = __builtin_cpu_supports("avx2") ? 1 : 0;
    return have;
}
#endif

/* The error of one candidate, given up (returning a value >= bound) as soon as the partial
 * sum reaches bound: every term is >= 0, so such a candidate cannot win, and the search
 * picks exactly what the full sums would. The sum is checked every 8 values. */
static double search_err_bounded(const qd_quant_cfg *c, const float *w, int64_t n, int64_t stride, const float *wt,
                                 float scale, float zero, double bound)
{
    const float norm = c->search_norm;
#if defined(__x86_64__) && defined(__GNUC__)
    if (c->grid == QD_GRID_INT && norm == 2.0f && stride == 1 && search_have_avx2())
        return search_err_int2_avx2(w, n, wt, scale, zero, qd_quant_maxq(c), bound);
#endif
    const int maxq = qd_quant_maxq(c), is_int = c->grid == QD_GRID_INT;
    double e = 0.0;
    for (int64_t i0 = 0; i0 < n; i0 += 8) {
        const int64_t i1 = i0 + 8 < n ? i0 + 8 : n;
        /* Eight terms summed in float, then into the double: independent chains the CPU
         * overlaps (a double add per value would serialise the loop). */
        float part = 0.0f;
        for (int64_t i = i0; i < i1; i++) {
            float v = w[i * stride];
            float q = is_int ? qd_quant_dequant(qd_quant_code(v, scale, zero, maxq), scale, zero)
                             : qd_quant_dequant_cfg(c, qd_quant_code_cfg(c, v, scale, zero), scale, zero);
            float t = search_pow(fabsf(v - q), norm);
            part += wt ? wt[i] * t : t;
        }
        e += (double)part;
        if (e >= bound) return e;
    }
    return e;
}

double qd_quant_search_err(const qd_quant_cfg *c, const float *w, int64_t n, int64_t stride, const float *wt,
                           float scale, float zero)
{
    return search_err_bounded(c, w, n, stride, wt, scale, zero, INFINITY);
}

void qd_quant_params_w(const qd_quant_cfg *c, const float *w, int64_t n, int64_t stride, const float *wt,
                       float *scale, float *zero)
{
    float xmin = 0.0f, xmax = 0.0f;                     /* as qd_quant_params */
    for (int64_t i = 0; i < n; i++) {
        float v = w[i * stride];
        if (v < xmin) xmin = v;
        if (v > xmax) xmax = v;
    }
    float bs, bz;
    qd_quant_params_range(c, xmin, xmax, &bs, &bz);
    if (c->scale_search != QD_SCALE_SEARCH_MSE || (xmin == 0.0f && xmax == 0.0f)) {
        *scale = bs;
        *zero = bz;
        return;
    }
    double best = qd_quant_search_err(c, w, n, stride, wt, bs, bz);
    float ps = bs, pz = bz;
    const int count = qd_quant_search_count(c);
    for (int i = 1; i < count && best > 0.0; i++) {
        float s, z;
        qd_quant_search_candidate(c, xmin, xmax, i, &s, &z);
        if (s == ps && z == pz) continue;               /* the same codes: the same error */
        ps = s;
        pz = z;
        double e = search_err_bounded(c, w, n, stride, wt, s, z, best);
        if (e < best) {
            best = e;
            bs = s;
            bz = z;
        }
    }
    *scale = bs;
    *zero = bz;
}
