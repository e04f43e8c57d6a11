/* CPU neural-net ops for the model forward: norms, RoPE, causal attention, activations,
 * residual adds, row gather and scatter-add, and per-row NLL. All operate on plain host F32 memory (the CPU backend's
 * memory). Attention runs cblas sgemm per (sequence, head, chunk of query rows) for Q K^T and P V,
 * so OpenBLAS does the heavy lifting; the softmax between them is a scalar loop over the
 * causal (lower) triangle only. Norms, activations and attention's (sequence, head) pairs
 * are split over the backend's threads (quant/core/parallel.h); each row, element or head
 * is computed as one thread would, so results do not depend on the thread count. Reductions that decide accuracy (norm variance, logsumexp)
 * accumulate in double so results do not depend on row length. */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quant/backend/cpu/cpu_internal.h"
#include "quant/backend/backend_args.h"
#include "quant/backend/cpu/cpu_amx.h"
#include "quant/backend/cpu/cpu_bf16.h"
#include "quant/backend/cpu/cpu_exp.h"
#include "quant/core/parallel.h"

/* Rows per thread share of the row-wise ops, and elements per share of the element-wise
 * ones: below that a thread's start-up costs more than it saves. */
#define NN_ROW_GRAIN 64
#define NN_ELEM_GRAIN 65536

typedef struct norm_ctx {
    float *y;
    const float *x, *w, *b;
    int64_t dim;
    float eps;
} norm_ctx;

static void rmsnorm_rows(void *ctx, int t, int64_t r0, int64_t r1)
{
    const norm_ctx *c = ctx;
    (void)t;
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = c->x + r * c->dim;
        float *yr = c->y + r * c->dim;
        double ss = 0.0;
        for (int64_t i = 0; i < c->dim; i++) ss += (double)xr[i] * xr[i];
        float inv = (float)(1.0 / sqrt(ss / (double)c->dim + (double)c->eps));
        for (int64_t i = 0; i < c->dim; i++) yr[i] = (xr[i] * inv) * (c->w ? c->w[i] : 1.0f);
    }
}

int cpu_rmsnorm(qd_backend *be, float *y, const float *x, const float *w, int64_t rows,
                int64_t dim, float eps)
{
    if (rows < 0 || dim <= 0) return qd_err_set(&be->err, QD_EINVAL, "rmsnorm: bad shape [%lld, %lld]",
                                                (long long)rows, (long long)dim);
    norm_ctx c = {y, x, w, NULL, dim, eps};
    qd_parallel_for(be->n_threads, rows, NN_ROW_GRAIN, rmsnorm_rows, &c);
    return 0;
}

static void layernorm_rows(void *ctx, int t, int64_t r0, int64_t r1)
{
    const norm_ctx *c = ctx;
    (void)t;
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = c->x + r * c->dim;
        float *yr = c->y + r * c->dim;
        double s = 0.0;
        for (int64_t i = 0; i < c->dim; i++) s += xr[i];
        double mean = s / (double)c->dim, var = 0.0;
        for (int64_t i = 0; i < c->dim; i++) { double d = xr[i] - mean; var += d * d; }
        float inv = (float)(1.0 / sqrt(var / (double)c->dim + (double)c->eps));
        float m = (float)mean;
        for (int64_t i = 0; i < c->dim; i++) {
            float v = (xr[i] - m) * inv;
            if (c->w) v *= c->w[i];
            if (c->b) v += c->b[i];
            yr[i] = v;
        }
    }
}

int cpu_layernorm(qd_backend *be, float *y, const float *x, const float *w, const float *b,
                  int64_t rows, int64_t dim, float eps)
{
    if (rows < 0 || dim <= 0) return qd_err_set(&be->err, QD_EINVAL, "layernorm: bad shape [%lld, %lld]",
                                                (long long)rows, (long long)dim);
    norm_ctx c = {y, x, w, b, dim, eps};
    qd_parallel_for(be->n_threads, rows, NN_ROW_GRAIN, layernorm_rows, &c);
    return 0;
}

int cpu_rope(qd_backend *be, float *x, int64_t tokens, int64_t n_heads, int64_t head_dim,
             const int32_t *pos, const qd_rope_freqs *f)
{
    int64_t rot_dim = f->rot_dim;
    if (rot_dim <= 0 || rot_dim > head_dim || (rot_dim & 1) || rot_dim / 2 > QD_ROPE_MAX_HALF)
        return qd_err_set(&be->err, QD_EINVAL, "rope: rot_dim %lld must be even and in (0, head_dim %lld]",
                          (long long)rot_dim, (long long)head_dim);
    int64_t half = rot_dim / 2;
    float *cs = malloc((size_t)half * 2 * sizeof *cs);
    if (!cs) return qd_err_set(&be->err, QD_ENOMEM, "rope: out of memory");
    for (int64_t t = 0; t < tokens; t++) {
        for (int64_t i = 0; i < half; i++) {
            /* As transformers: the angle is a float32 product; cos and sin of it, scaled. */
            float a = (float)pos[t] * f->inv_freq[i];
            cs[2 * i] = (float)cos((double)a) * f->attn_scale;
            cs[2 * i + 1] = (float)sin((double)a) * f->attn_scale;
        }
        float *xt = x + t * n_heads * head_dim;
        for (int64_t h = 0; h < n_heads; h++) {
            float *xh = xt + h * head_dim;
            for (int64_t i = 0; i < half; i++) {
                float c = cs[2 * i], s = cs[2 * i + 1];
                int64_t i0 = f->interleaved ? 2 * i : i, i1 = f->interleaved ? 2 * i + 1 : i + half;
                float x0 = xh[i0], x1 = xh[i1];
                xh[i0] = x0 * c - x1 * s;
                xh[i1] = x1 * c + x0 * s;
            }
        }
    }
    free(cs);
    return 0;
}

/* Softmax of row[lo..len) in place, zeros in row[0..lo) and row[len..width). */
static void softmax_causal_row(float *row, int64_t lo, int64_t len, int64_t width)
{
    for (int64_t j = 0; j < lo; j++) row[j] = 0.0f;
    row += lo;
    len -= lo;
    width -= lo;
    float mx = row[0];
    for (int64_t j = 1; j < len; j++) mx = row[j] > mx ? row[j] : mx;
    for (int64_t j = 0; j < len; j++) row[j] -= mx;
    cpu_exp_f32(row, row, len);
    /* Eight partial sums: vectorisable, and each adds at most len/8 terms in [0, 1]. */
    float part[8] = {0};
    int64_t j = 0;
    for (; j + 8 <= len; j += 8)
        for (int u = 0; u < 8; u++) part[u] += row[j + u];
    for (; j < len; j++) part[0] += row[j];
    double sum = 0.0;
    for (int u = 0; u < 8; u++) sum += part[u];
    float inv = (float)(1.0 / sum);
    for (j = 0; j < len; j++) row[j] *= inv;
    for (j = len; j < width; j++) row[j] = 0.0f;
}

/* The softmax of row [0, len) over the keys keep[j] marks (one or more), the others 0:
 * transformers' additive float-minimum mask, whose exp is exactly 0. */
static void softmax_keep_row(float *row, int64_t len, int64_t width, const uint8_t *keep)
{
    float mx = -INFINITY;
    for (int64_t j = 0; j < len; j++)
        if (keep[j] && row[j] > mx) mx = row[j];
    for (int64_t j = 0; j < len; j++) row[j] = keep[j] ? row[j] - mx : -200.0f;
    cpu_exp_f32(row, row, len);
    float part[8] = {0};
    int64_t j = 0;
    for (; j < len; j++) {
        if (!keep[j]) row[j] = 0.0f;
        part[j % 8] += row[j];
    }
    double sum = 0.0;
    for (int u = 0; u < 8; u++) sum += part[u];
    float inv = (float)(1.0 / sum);
    for (j = 0; j < len; j++) row[j] *= inv;
    for (j = len; j < width; j++) row[j] = 0.0f;
}

/* The softmax of a row with a sink (gpt-oss): as softmax_causal_row, with one more logit,
 * `sink`, in the max and the sum, whose own probability is dropped. */
static void softmax_sink_row(float *row, int64_t lo, int64_t len, int64_t width, float sink)
{
    for (int64_t j = 0; j < lo; j++) row[j] = 0.0f;
    row += lo;
    len -= lo;
    width -= lo;
    float mx = sink;
    for (int64_t j = 0; j < len; j++) mx = row[j] > mx ? row[j] : mx;
    for (int64_t j = 0; j < len; j++) row[j] -= mx;
    cpu_exp_f32(row, row, len);
    double sum = (double)expf(sink - mx);
    for (int64_t j = 0; j < len; j++) sum += row[j];
    float inv = (float)(1.0 / sum);
    for (int64_t j = 0; j < len; j++) row[j] *= inv;
    for (int64_t j = len; j < width; j++) row[j] = 0.0f;
}

/* Query rows are taken in chunks so that a chunk ending at row r1 only multiplies against
 * keys [0, r1): the causal mask then costs about half the flops of the full square. */
#define ATTN_CHUNK 128

/* The products of "compute": "bf16" (cpu_bf16.h): 0 = F32, 1 = bf16-rounded copies through
 * OpenBLAS, 2 = the AMX tiles. */
enum { ATTN_F32 = 0, ATTN_BF16_PORTABLE = 1, ATTN_BF16_AMX = 2 };

typedef struct attn_ctx {
    float *out;
    const float *q, *k, *v;
    int64_t seq, n_heads, group, hd, ldq, ldk, chunk, window;
    float scale, softcap;
    float *scores;             /* [shares][chunk * seq] */
    int mode;                  /* ATTN_* */
    void *bf;                  /* bf16 modes: [shares][bf_bytes] scratch */
    size_t bf_bytes;
    const float *sinks;        /* [n_heads] or NULL (attention_sink) */
    const uint8_t *keep;       /* [batch, seq, seq] or NULL (attention_keep) */
} attn_ctx;

/* bf16 scratch per share: AMX: K and V packed, and 32 rows of A; portable: rounded copies
 * of K, V and a chunk of Q. */
static size_t attn_bf_bytes(int mode, int64_t seq, int64_t hd, int64_t chunk)
{
    int64_t w = (seq > hd ? seq : hd) + 32;
    if (mode == ATTN_BF16_AMX)
        return (size_t)(cpu_amx_packed_elems(seq, hd) + cpu_amx_packed_elems(hd, seq) + 32 * w) * 2 + 64;
    if (mode == ATTN_BF16_PORTABLE) return (size_t)(2 * seq * hd + chunk * hd) * sizeof(float);
    return 0;
}

/* Heads [p0, p1) of the (sequence, head) pairs, one share's score buffer. */
static void attn_heads(void *ctx, int t, int64_t p0, int64_t p1)
{
    const attn_ctx *c = ctx;
    float *s = c->scores + (size_t)t * (size_t)(c->chunk * c->seq);
    const int64_t seq = c->seq, hd = c->hd, ldq = c->ldq, ldk = c->ldk;
    for (int64_t pair = p0; pair < p1; pair++) {
        int64_t b = pair / c->n_heads, h = pair % c->n_heads, kh = h / c->group;
        const float *kk = c->k + b * seq * ldk + kh * hd;
        const float *vv = c->v + b * seq * ldk + kh * hd;
        int64_t ldkv = ldk;
        uint16_t *kp = NULL, *vp = NULL, *as = NULL;
        float *qr = NULL;
        if (c->mode == ATTN_BF16_AMX) {
            kp = (uint16_t *)(((uintptr_t)((char *)c->bf + (size_t)t * c->bf_bytes) + 63) & ~(uintptr_t)63);
            vp = kp + cpu_amx_packed_elems(seq, hd);
            as = vp + cpu_amx_packed_elems(hd, seq);
            cpu_amx_pack_nk(kk, seq, hd, ldk, kp);
            cpu_amx_pack_kn(vv, seq, hd, ldk, vp);
        } else if (c->mode == ATTN_BF16_PORTABLE) {
            float *kr = (float *)((char *)c->bf + (size_t)t * c->bf_bytes), *vr = kr + seq * hd;
            qr = vr + seq * hd;
            cpu_bf16_round_rows(kr, kk, seq, hd, ldk);
            cpu_bf16_round_rows(vr, vv, seq, hd, ldk);
            kk = kr;
            vv = vr;
            ldkv = hd;
        }
        for (int64_t r0 = 0; r0 < seq; r0 += c->chunk) {
            int64_t rows = seq - r0 < c->chunk ? seq - r0 : c->chunk, keys = r0 + rows;
            const float *qh = c->q + (b * seq + r0) * ldq + h * hd;
            float *oh = c->out + (b * seq + r0) * ldq + h * hd;
            /* S [rows, keys] = scale * Q K^T; entries past the diagonal are zeroed by the
             * softmax so P V ignores them. */
            if (c->mode == ATTN_BF16_AMX) {
                cpu_amx_gemm_packed(rows, keys, hd, qh, ldq, kp, hd, c->scale, s, keys, as);
            } else if (c->mode == ATTN_BF16_PORTABLE) {
                cpu_bf16_round_rows(qr, qh, rows, hd, ldq);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)keys, (int)hd, 1.0f, qr,
                            (int)hd, kk, (int)ldkv, 0.0f, s, (int)keys);
                for (int64_t i = 0; i < rows * keys; i++) s[i] *= c->scale;
            } else {
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)keys, (int)hd, c->scale,
                            qh, (int)ldq, kk, (int)ldk, 0.0f, s, (int)keys);
            }
            for (int64_t i = 0; i < rows; i++) {
                int64_t qi = r0 + i, lo = c->window > 0 && qi + 1 > c->window ? qi + 1 - c->window : 0;
                if (c->softcap > 0.0f)
                    for (int64_t j = lo; j <= qi; j++) s[i * keys + j] = tanhf(s[i * keys + j] / c->softcap) * c->softcap;
                if (c->keep) softmax_keep_row(s + i * keys, qi + 1, keys, c->keep + (b * seq + qi) * seq);
                else if (c->sinks) softmax_sink_row(s + i * keys, lo, qi + 1, keys, c->sinks[h]);
                else softmax_causal_row(s + i * keys, lo, qi + 1, keys);
            }
            if (c->mode == ATTN_BF16_AMX) {
                cpu_amx_gemm_packed(rows, hd, keys, s, keys, vp, seq, 1.0f, oh, ldq, as);
            } else {
                if (c->mode == ATTN_BF16_PORTABLE)
                    for (int64_t i = 0; i < rows * keys; i++) s[i] = cpu_bf16_round(s[i]);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, (int)hd, (int)keys, 1.0f,
                            s, (int)keys, vv, (int)ldkv, 0.0f, oh, (int)ldq);
            }
        }
    }
}

static int attention_run(qd_backend *be, float *out, const float *q, const float *k, const float *v,
                         int64_t batch, int64_t seq, int64_t n_heads, int64_t n_kv, int64_t hd, float scale,
                         int64_t window, float softcap, int mode, const float *sinks, const uint8_t *keep)
{
    if (n_kv <= 0 || n_heads % n_kv != 0)
        return qd_err_set(&be->err, QD_EINVAL, "attention: n_heads %lld is not a multiple of n_kv %lld",
                          (long long)n_heads, (long long)n_kv);
    if (seq <= 0 || batch <= 0) return 0;
    int64_t chunk = seq < ATTN_CHUNK ? seq : ATTN_CHUNK;
    /* The (sequence, head) pairs are split over the threads, each running its small GEMMs
     * on one OpenBLAS thread (they are too small for OpenBLAS to split well, and the
     * softmax between them would otherwise run on one core). */
    int64_t pairs = batch * n_heads;
    int nt = qd_parallel_shares(be->n_threads, pairs, 1);
    float *scores = malloc((size_t)nt * (size_t)chunk * (size_t)seq * sizeof *scores);
    if (!scores) return qd_err_set(&be->err, QD_ENOMEM, "attention: cannot allocate %d x %lld x %lld scores",
                                   nt, (long long)chunk, (long long)seq);
    attn_ctx c = {out, q, k, v, seq, n_heads, n_heads / n_kv, hd, n_heads * hd, n_kv * hd, chunk, window,
                  scale, softcap, scores, mode, NULL, attn_bf_bytes(mode, seq, hd, chunk), sinks, keep};
    if (c.bf_bytes && !(c.bf = malloc((size_t)nt * c.bf_bytes))) {
        free(scores);
        return qd_err_set(&be->err, QD_ENOMEM, "attention: cannot allocate %d x %zu bytes of bf16 scratch", nt,
                          c.bf_bytes);
    }
    if (nt > 1) openblas_set_num_threads(1);
    qd_parallel_for(nt, pairs, 1, attn_heads, &c);
    if (nt > 1) openblas_set_num_threads(be->n_threads);
    free(c.bf);
    free(scores);
    return 0;
}

int cpu_attention(qd_backend *be, float *out, const float *q, const float *k, const float *v,
                  int64_t batch, int64_t seq, int64_t n_heads, int64_t n_kv, int64_t hd, float scale,
                  int64_t window, float softcap)
{
    return attention_run(be, out, q, k, v, batch, seq, n_heads, n_kv, hd, scale, window, softcap, ATTN_F32, NULL, NULL);
}

int cpu_attention_sink(qd_backend *be, float *out, const float *q, const float *k, const float *v,
                       int64_t batch, int64_t seq, int64_t n_heads, int64_t n_kv, int64_t hd, float scale,
                       int64_t window, const float *sinks)
{
    if (!sinks) return qd_err_set(&be->err, QD_EINVAL, "attention_sink: no sinks");
    return attention_run(be, out, q, k, v, batch, seq, n_heads, n_kv, hd, scale, window, 0.0f, ATTN_F32, sinks, NULL);
}

int cpu_attention_keep(qd_backend *be, float *out, const float *q, const float *k, const float *v,
                       int64_t batch, int64_t seq, int64_t n_heads, int64_t n_kv, int64_t hd, float scale,
                       const uint8_t *keep)
{
    if (!keep) return qd_err_set(&be->err, QD_EINVAL, "attention_keep: no keep mask");
    return attention_run(be, out, q, k, v, batch, seq, n_heads, n_kv, hd, scale, 0, 0.0f, ATTN_F32, NULL, keep);
}

/* Both products on bf16-rounded inputs (Q, K; P, V), F32 sums: the AMX tiles where
 * cpu_amx_on(be), else rounded copies through OpenBLAS. The softmax stays F32. */
int cpu_attention_bf16(qd_backend *be, float *out, const float *q, const float *k, const float *v,
                       int64_t batch, int64_t seq, int64_t n_heads, int64_t n_kv, int64_t hd, float scale,
                       int64_t window, float softcap)
{
    return attention_run(be, out, q, k, v, batch, seq, n_heads, n_kv, hd, scale, window, softcap,
                         cpu_amx_on(be) ? ATTN_BF16_AMX : ATTN_BF16_PORTABLE, NULL, NULL);
}

typedef struct dsa_ctx {
    float *out;
    const float *q, *k, *w;
    int64_t seq, n_heads, hd;
    float qk_scale, w_scale;
} dsa_ctx;

/* Query rows [r0, r1) of the batch (row b * seq + i). */
static void dsa_rows(void *ctx, int t, int64_t r0, int64_t r1)
{
    (void)t;
    const dsa_ctx *c = ctx;
    const int64_t seq = c->seq, NH = c->n_heads, hd = c->hd;
    for (int64_t r = r0; r < r1; r++) {
        int64_t b = r / seq, i = r % seq;
        const float *qi = c->q + r * NH * hd, *wi = c->w + r * NH;
        float *o = c->out + r * seq;
        for (int64_t j = 0; j <= i; j++) {
            const float *kj = c->k + (b * seq + j) * hd;
            float acc = 0.0f;
            for (int64_t h = 0; h < NH; h++) {
                float d = 0.0f;
                for (int64_t e = 0; e < hd; e++) d += qi[h * hd + e] * kj[e];
                d *= c->qk_scale;
                acc += wi[h] * c->w_scale * (d > 0.0f ? d : 0.0f);
            }
            o[j] = acc;
        }
        for (int64_t j = i + 1; j < seq; j++) o[j] = 0.0f;
    }
}

int cpu_dsa_scores(qd_backend *be, float *out, const float *q, const float *k, const float *w, int64_t batch,
                   int64_t seq, int64_t n_heads, int64_t hd, float qk_scale, float w_scale)
{
    if (batch <= 0 || seq <= 0) return 0;
    if (n_heads <= 0 || hd <= 0)
        return qd_err_set(&be->err, QD_EINVAL, "dsa_scores: n_heads %lld and hd %lld must be positive",
                          (long long)n_heads, (long long)hd);
    dsa_ctx c = {out, q, k, w, seq, n_heads, hd, qk_scale, w_scale};
    qd_parallel_for(be->n_threads, batch * seq, 1, dsa_rows, &c);
    return 0;
}

typedef struct glu_ctx {
    float *out;
    const float *gate, *up;
} glu_ctx;

#define SILU_CHUNK 1024   /* exp(-g) of this many elements at a time, on the stack */

static void silu_mul_range(void *ctx, int t, int64_t i0, int64_t i1)
{
    const glu_ctx *c = ctx;
    (void)t;
    float e[SILU_CHUNK];
    for (int64_t c0 = i0; c0 < i1; c0 += SILU_CHUNK) {
        const int64_t n = i1 - c0 < SILU_CHUNK ? i1 - c0 : SILU_CHUNK;
        const float *g = c->gate + c0, *u = c->up + c0;
        float *o = c->out + c0;   /* may be gate or up: each element is read before it is written */
        for (int64_t i = 0; i < n; i++) e[i] = -g[i];
        cpu_exp_f32(e, e, n);
        for (int64_t i = 0; i < n; i++) o[i] = g[i] / (1.0f + e[i]) * u[i];
    }
}

int cpu_silu_mul(qd_backend *be, float *out, const float *gate, const float *up, int64_t n)
{
    glu_ctx c = {out, gate, up};
    qd_parallel_for(be->n_threads, n, NN_ELEM_GRAIN, silu_mul_range, &c);
    return 0;
}

typedef struct swiglu_clamp_ctx {
    float *out;
    const float *gate, *up;
    float alpha, limit;
} swiglu_clamp_ctx;

static void swiglu_clamp_range(void *ctx, int t, int64_t i0, int64_t i1)
{
    const swiglu_clamp_ctx *c = ctx;
    (void)t;
    /* transformers' GptOssExperts._apply_gate, term for term (torch.clamp, torch.sigmoid). */
    for (int64_t i = i0; i < i1; i++) {
        float g = c->gate[i], u = c->up[i];
        g = g > c->limit ? c->limit : g;
        u = u > c->limit ? c->limit : u < -c->limit ? -c->limit : u;
        float glu = g * (1.0f / (1.0f + expf(-(g * c->alpha))));
        c->out[i] = (u + 1.0f) * glu;
    }
}

int cpu_swiglu_clamp_mul(qd_backend *be, float *out, const float *gate, const float *up, int64_t n, float alpha,
                         float limit)
{
    swiglu_clamp_ctx c = {out, gate, up, alpha, limit};
    qd_parallel_for(be->n_threads, n, NN_ELEM_GRAIN, swiglu_clamp_range, &c);
    return 0;
}

static void gelu_tanh_mul_range(void *ctx, int t, int64_t i0, int64_t i1)
{
    const glu_ctx *c = ctx;
    (void)t;
    /* torch's tanh approximation, term for term: 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))). */
    for (int64_t i = i0; i < i1; i++) {
        float g = c->gate[i];
        float inner = 0.79788456080286536f * (g + 0.044715f * g * g * g);
        c->out[i] = 0.5f * g * (1.0f + tanhf(inner)) * c->up[i];
    }
}

int cpu_gelu_tanh_mul(qd_backend *be, float *out, const float *gate, const float *up, int64_t n)
{
    glu_ctx c = {out, gate, up};
    qd_parallel_for(be->n_threads, n, NN_ELEM_GRAIN, gelu_tanh_mul_range, &c);
    return 0;
}

int cpu_softcap(qd_backend *be, float *x, int64_t n, float cap)
{
    if (!(cap > 0.0f)) return qd_err_set(&be->err, QD_EINVAL, "softcap: cap %g must be positive", (double)cap);
    for (int64_t i = 0; i < n; i++) x[i] = tanhf(x[i] / cap) * cap;
    return 0;
}

int cpu_scale(qd_backend *be, float *x, int64_t n, float s)
{
    (void)be;
    for (int64_t i = 0; i < n; i++) x[i] *= s;
    return 0;
}

int cpu_relu(qd_backend *be, float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) if (!(x[i] > 0.0f)) x[i] = 0.0f;
    return 0;
}

/* Exact (erf) GELU, as torch's nn.GELU() and HF's "gelu" activation. */
int cpu_gelu(qd_backend *be, float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) x[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678118654752f));
    return 0;
}

/* torch's tanh approximation, term for term, as gelu_tanh_mul's gate. */
int cpu_gelu_tanh(qd_backend *be, float *x, int64_t n)
{
    (void)be;
    for (int64_t i = 0; i < n; i++) {
        float g = x[i];
        float inner = 0.79788456080286536f * (g + 0.044715f * g * g * g);
        x[i] = 0.5f * g * (1.0f + tanhf(inner));
    }
    return 0;
}

int cpu_copy_2d(qd_backend *be, float *dst, int64_t ldd, const float *src, int64_t lds, int64_t rows, int64_t cols)
{
    if (rows < 0 || cols < 0 || ldd < cols || lds < cols)
        return qd_err_set(&be->err, QD_EINVAL, "copy_2d: bad shape [%lld, %lld] with strides %lld, %lld", (long long)rows,
                          (long long)cols, (long long)ldd, (long long)lds);
    for (int64_t r = 0; r < rows; r++) memcpy(dst + r * ldd, src + r * lds, (size_t)cols * sizeof *dst);
    return 0;
}

int cpu_add(qd_backend *be, float *y, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
    return 0;
}

int cpu_add_bias(qd_backend *be, float *y, const float *bias, int64_t rows, int64_t cols)
{
    for (int64_t r = 0; r < rows; r++) {
        float *yr = y + r * cols;
        for (int64_t c = 0; c < cols; c++) yr[c] += bias[c];
    }
    return 0;
}

/* Row gather and weighted scatter-add (backend.h): the scalar reference the CUDA kernels are
 * tested against. The indices are host memory here, so both are checked in full (range, and
 * for the scatter distinctness) before anything is written. The scatter's rows are split
 * over the threads; distinct indices make every dst row one thread's, and each element is
 * dst += src * w as one thread would compute it, so the result does not depend on the
 * thread count. */
typedef struct rows_ctx {
    float *dst;
    const float *src, *w;
    const int32_t *idx;
    int64_t cols;
} rows_ctx;

static void gather_part(void *ctx, int t, int64_t i0, int64_t i1)
{
    const rows_ctx *c = ctx;
    (void)t;
    for (int64_t i = i0; i < i1; i++)
        memcpy(c->dst + i * c->cols, c->src + (int64_t)c->idx[i] * c->cols, (size_t)c->cols * sizeof(float));
}

static void scatter_part(void *ctx, int t, int64_t i0, int64_t i1)
{
    const rows_ctx *c = ctx;
    (void)t;
    for (int64_t i = i0; i < i1; i++) {
        const float *s = c->src + i * c->cols, wi = c->w[i];
        float *d = c->dst + (int64_t)c->idx[i] * c->cols;
        for (int64_t j = 0; j < c->cols; j++) d[j] += s[j] * wi;
    }
}

int cpu_gather_rows(qd_backend *be, float *dst, const float *src, int64_t src_rows, const int32_t *idx,
                    int64_t n_idx, int64_t cols)
{
    int skip = 0;
    int rc = qd_backend_rows_args_check("cpu gather_rows", dst, src, src_rows, idx, NULL, 0, n_idx, cols, &skip,
                                        &be->err);
    if (rc || skip || (rc = qd_backend_rows_idx_check("cpu gather_rows", idx, n_idx, src_rows, 0, &be->err)))
        return rc;
    rows_ctx c = {dst, src, NULL, idx, cols};
    qd_parallel_for(be->n_threads, n_idx, NN_ROW_GRAIN, gather_part, &c);
    return 0;
}

int cpu_scatter_add_rows(qd_backend *be, float *dst, int64_t dst_rows, const float *src, const int32_t *idx,
                         const float *w, int64_t n_idx, int64_t cols)
{
    int skip = 0;
    int rc = qd_backend_rows_args_check("cpu scatter_add_rows", dst, src, dst_rows, idx, w, 1, n_idx, cols, &skip,
                                        &be->err);
    if (rc || skip || (rc = qd_backend_rows_idx_check("cpu scatter_add_rows", idx, n_idx, dst_rows, 1, &be->err)))
        return rc;
    rows_ctx c = {dst, src, w, idx, cols};
    qd_parallel_for(be->n_threads, n_idx, NN_ROW_GRAIN, scatter_part, &c);
    return 0;
}

int cpu_nll_rows(qd_backend *be, const float *logits, const int32_t *targets, int64_t rows,
                 int64_t vocab, double *nll_host)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *lr = logits + r * vocab;
        int32_t t = targets[r];
        if (t < 0 || t >= vocab)
            return qd_err_set(&be->err, QD_EINVAL, "nll_rows: target %d of row %lld is outside the vocabulary [0, %lld)",
                              t, (long long)r, (long long)vocab);
        float mx = lr[0];
        for (int64_t j = 1; j < vocab; j++) if (lr[j] > mx) mx = lr[j];
        double sum = 0.0;
        for (int64_t j = 0; j < vocab; j++) sum += exp((double)lr[j] - mx);
        nll_host[r] = (double)mx + log(sum) - (double)lr[t];
    }
    return 0;
}
