/* The recurrent mixers' ops (backend.h): the causal depthwise convolution of LFM2's short
 * convolution and Mamba-2, and Mamba-2's selective scan as its recurrence. The scalar
 * reference the CUDA kernels mirror; the scan's sequences and heads are split over the
 * threads (each (sequence, head) is one thread's, so the result does not depend on the
 * thread count). transformers computes the scan in chunks (its SSD form); the recurrence
 * is the same function, rounded differently only in the last bits. */
#include <math.h>
#include <stdlib.h>

#include "quant/backend/cpu/cpu_internal.h"
#include "quant/core/parallel.h"

typedef struct conv_ctx {
    float *y;
    const float *x, *gi, *go, *w, *bias;
    int64_t ld, seq, ch, kernel;
    int silu;
} conv_ctx;

/* Rows [r0, r1) of the batch*seq outputs. */
static void conv_rows(void *ctx, int th, int64_t r0, int64_t r1)
{
    const conv_ctx *c = ctx;
    (void)th;
    for (int64_t r = r0; r < r1; r++) {
        int64_t t = r % c->seq;
        for (int64_t ch = 0; ch < c->ch; ch++) {
            double sum = c->bias ? (double)c->bias[ch] : 0.0;
            for (int64_t j = 0; j < c->kernel; j++) {
                int64_t back = c->kernel - 1 - j;   /* the tap reads the token `back` steps earlier */
                if (back > t) continue;
                int64_t src = (r - back) * c->ld + ch;
                float u = c->gi ? c->x[src] * c->gi[src] : c->x[src];
                sum += (double)c->w[ch * c->kernel + j] * u;
            }
            float acc = (float)sum;
            if (c->silu) acc = acc / (1.0f + expf(-acc));
            if (c->go) acc *= c->go[r * c->ld + ch];
            c->y[r * c->ch + ch] = acc;
        }
    }
}

int cpu_conv1d_causal(qd_backend *be, float *y, const float *x, const float *gate_in, const float *gate_out, int64_t ld,
                      int64_t batch, int64_t seq, int64_t ch, const float *w, const float *bias, int64_t kernel, int silu)
{
    if (batch < 0 || seq < 0 || ch < 0 || kernel < 1 || ld < ch)
        return qd_err_set(&be->err, QD_EINVAL, "conv1d_causal: batch %lld, seq %lld, ch %lld, kernel %lld, ld %lld",
                          (long long)batch, (long long)seq, (long long)ch, (long long)kernel, (long long)ld);
    if (y == x || (gate_in && y == gate_in) || (gate_out && y == gate_out))
        return qd_err_set(&be->err, QD_EINVAL, "conv1d_causal: y aliases an input");
    conv_ctx c = {y, x, gate_in, gate_out, w, bias, ld, seq, ch, kernel, silu};
    qd_parallel_for(be->n_threads, batch * seq, 16, conv_rows, &c);
    return 0;
}

/* torch.nn.functional.softplus (beta 1, threshold 20). */
static float softplus(float v) { return v > 20.0f ? v : log1pf(expf(v)); }

typedef struct scan_ctx {
    float *y;
    const float *x, *b, *c, *dt, *z, *a, *d, *dt_bias;
    int64_t ld, ld_dt, ld_z, seq, n_heads, p, n_groups, n;
    float dt_min, dt_max;
    float *states;   /* one [p, n] state per share */
} scan_ctx;

/* Units [u0, u1) of batch * n_heads: one sequence's one head each. */
static void scan_units(void *ctx, int th, int64_t u0, int64_t u1)
{
    const scan_ctx *s = ctx;
    float *st = s->states + (int64_t)th * s->p * s->n;
    int64_t width = s->n_heads * s->p;
    for (int64_t u = u0; u < u1; u++) {
        int64_t bi = u / s->n_heads, h = u % s->n_heads, g = h / (s->n_heads / s->n_groups);
        for (int64_t i = 0; i < s->p * s->n; i++) st[i] = 0.0f;
        for (int64_t t = 0; t < s->seq; t++) {
            int64_t r = bi * s->seq + t;
            float dt = softplus(s->dt[r * s->ld_dt + h] + s->dt_bias[h]);
            dt = dt < s->dt_min ? s->dt_min : dt > s->dt_max ? s->dt_max : dt;
            float decay = expf(dt * s->a[h]);
            const float *xr = s->x + r * s->ld + h * s->p;
            const float *br = s->b + r * s->ld + g * s->n, *cr = s->c + r * s->ld + g * s->n;
            float *yr = s->y + r * width + h * s->p;
            for (int64_t i = 0; i < s->p; i++) {
                float *si = st + i * s->n, xd = xr[i] * dt, acc = 0.0f;
                for (int64_t k = 0; k < s->n; k++) {
                    si[k] = si[k] * decay + xd * br[k];
                    acc += si[k] * cr[k];
                }
                float v = acc + s->d[h] * xr[i];
                if (s->z) {
                    float zv = s->z[r * s->ld_z + h * s->p + i];
                    v *= zv / (1.0f + expf(-zv));
                }
                yr[i] = v;
            }
        }
    }
}

int cpu_ssd_scan(qd_backend *be, float *y, const float *x, const float *b, const float *c, int64_t ld, const float *dt,
                 int64_t ld_dt, const float *z, int64_t ld_z, const float *a, const float *d, const float *dt_bias,
                 float dt_min, float dt_max, int64_t batch, int64_t seq, int64_t n_heads, int64_t head_dim,
                 int64_t n_groups, int64_t d_state)
{
    if (batch < 0 || seq < 0 || n_heads < 1 || head_dim < 1 || n_groups < 1 || n_heads % n_groups || d_state < 1 ||
        ld < n_heads * head_dim || ld_dt < n_heads || (z && ld_z < n_heads * head_dim))
        return qd_err_set(&be->err, QD_EINVAL, "ssd_scan: %lld heads of %lld in %lld groups, d_state %lld, ld %lld",
                          (long long)n_heads, (long long)head_dim, (long long)n_groups, (long long)d_state, (long long)ld);
    int shares = qd_parallel_shares(be->n_threads, batch * n_heads, 1);
    float *states = malloc((size_t)(shares < 1 ? 1 : shares) * (size_t)(head_dim * d_state) * sizeof *states);
    if (!states) return qd_err_set(&be->err, QD_ENOMEM, "ssd_scan: out of memory for %d [%lld, %lld] states", shares,
                                   (long long)head_dim, (long long)d_state);
    scan_ctx s = {y, x, b, c, dt, z, a, d, dt_bias, ld, ld_dt, ld_z, seq, n_heads, head_dim, n_groups, d_state,
                  dt_min, dt_max, states};
    qd_parallel_for(be->n_threads, batch * n_heads, 1, scan_units, &s);
    free(states);
    return 0;
}
