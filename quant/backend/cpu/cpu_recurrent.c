/* CPU ops of Gated DeltaNet: the gated delta rule and the sigmoid output gate of gated
 * attention (its short conv is conv1d_causal, cpu_ssm.c). Scalar references: the rule runs a
 * (sequence, value head) pair per thread share, each as one thread would, so results do not depend on the
 * thread count. The delta rule keeps its state in double: transformers computes the same
 * function in float32 by chunks, and the exact recurrence is the fixed point both round
 * around. */
#include <math.h>
#include <stdlib.h>

#include "quant/backend/cpu/cpu_internal.h"
#include "quant/core/parallel.h"

typedef struct sig_ctx {
    float *out;
    const float *gate, *x;
} sig_ctx;

static void sigmoid_mul_range(void *ctx, int t, int64_t i0, int64_t i1)
{
    const sig_ctx *c = ctx;
    (void)t;
    for (int64_t i = i0; i < i1; i++) c->out[i] = c->x[i] * (1.0f / (1.0f + expf(-c->gate[i])));
}

int cpu_sigmoid_mul(qd_backend *be, float *out, const float *gate, const float *x, int64_t n)
{
    sig_ctx c = {out, gate, x};
    qd_parallel_for(be->n_threads, n, 65536, sigmoid_mul_range, &c);
    return 0;
}

typedef struct gdn_ctx {
    float *out;
    const float *qkv, *b, *a, *a_log, *dt_bias;
    int64_t ld_qkv, ld_ba, seq, nk, nv, dk, dv;
    int failed;
} gdn_ctx;

/* x / sqrt(sum x^2 + 1e-6) in float, as transformers' l2norm (float32 tensors). */
static void l2norm(float *y, const float *x, int64_t n)
{
    double ss = 0.0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float inv = (float)(1.0 / sqrt((double)(float)ss + 1e-6));
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * inv;
}

/* torch's softplus (beta 1, threshold 20). */
static float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* Pairs (sequence, value head) [p0, p1). */
static void gdn_pairs(void *ctx, int t, int64_t p0, int64_t p1)
{
    gdn_ctx *c = ctx;
    (void)t;
    int64_t dk = c->dk, dv = c->dv, kd = c->nk * dk;
    double *S = malloc((size_t)(dk * dv) * sizeof *S);
    float q[QD_GDN_MAX_DK], k[QD_GDN_MAX_DK];
    if (!S) { c->failed = 1; return; }
    float qs = (float)(1.0 / sqrt((double)dk));
    for (int64_t p = p0; p < p1; p++) {
        int64_t s = p / c->nv, h = p % c->nv, kh = h / (c->nv / c->nk);
        float A = expf(c->a_log[h]);
        for (int64_t i = 0; i < dk * dv; i++) S[i] = 0.0;
        for (int64_t i = 0; i < c->seq; i++) {
            int64_t r = s * c->seq + i;
            const float *row = c->qkv + r * c->ld_qkv, *v = row + 2 * kd + h * dv;
            l2norm(q, row + kh * dk, dk);
            l2norm(k, row + kd + kh * dk, dk);
            for (int64_t j = 0; j < dk; j++) q[j] *= qs;
            float bt = c->b[r * c->ld_ba + h], at = c->a[r * c->ld_ba + h];
            float beta = 1.0f / (1.0f + expf(-bt));
            float g = -A * softplus(at + c->dt_bias[h]);
            double decay = (double)expf(g);
            float *o = c->out + r * (c->nv * dv) + h * dv;
            for (int64_t e = 0; e < dv; e++) {
                double kv = 0.0;
                for (int64_t j = 0; j < dk; j++) {
                    S[j * dv + e] *= decay;
                    kv += S[j * dv + e] * k[j];
                }
                double delta = ((double)v[e] - kv) * beta, acc = 0.0;
                for (int64_t j = 0; j < dk; j++) {
                    S[j * dv + e] += (double)k[j] * delta;
                    acc += S[j * dv + e] * q[j];
                }
                o[e] = (float)acc;
            }
        }
    }
    free(S);
}

int cpu_gated_delta_rule(qd_backend *be, float *out, const float *qkv, int64_t ld_qkv, const float *b, const float *a,
                         int64_t ld_ba, const float *a_log, const float *dt_bias, int64_t batch, int64_t seq, int64_t nk,
                         int64_t nv, int64_t dk, int64_t dv)
{
    if (batch < 0 || seq < 0 || nk <= 0 || nv <= 0 || nv % nk || dk <= 0 || dk > QD_GDN_MAX_DK || dv <= 0 ||
        ld_qkv < 2 * nk * dk + nv * dv || ld_ba < nv)
        return qd_err_set(&be->err, QD_EINVAL, "gated_delta_rule: bad shape (key heads %lld of %lld, value heads %lld of "
                          "%lld, row strides %lld and %lld)", (long long)nk, (long long)dk, (long long)nv, (long long)dv,
                          (long long)ld_qkv, (long long)ld_ba);
    gdn_ctx c = {out, qkv, b, a, a_log, dt_bias, ld_qkv, ld_ba, seq, nk, nv, dk, dv, 0};
    qd_parallel_for(be->n_threads, batch * nv, 1, gdn_pairs, &c);
    if (c.failed) return qd_err_set(&be->err, QD_ENOMEM, "gated_delta_rule: out of memory for the state");
    return 0;
}
