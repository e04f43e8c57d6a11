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

/* The error of one candidate, given up (returning a value >= bound) as soon as the partial
 * sum reaches bound: every term is >= 0, so such a candidate cannot win, and the search
 * picks exactly what the full sums would. The sum is checked every 8 values. */
static double search_err_bounded(const qd_quant_cfg *c, const float *w, int64_t n, int64_t stride, const float *wt,
                                 float scale, float zero, double bound)
{
    const float norm = c->search_norm;
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
