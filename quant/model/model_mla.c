/* DeepSeek's multi-head latent attention, as transformers' DeepseekV3Attention computes it:
 *   q = q_b_proj(rmsnorm(q_a_proj(x), q_a_layernorm))   (or q_proj(x) without a q LoRA)
 *   [latent | k_rot] = kv_a_proj_with_mqa(x);  kv = kv_b_proj(rmsnorm(latent, kv_a_layernorm))
 * each head's query is [q_nope | q_rot] and key [k_nope | k_rot] (k_nope and the value from
 * kv, k_rot shared by every head); RoPE turns q_rot and k_rot only; softmax scale
 * (qk_nope + qk_rope)^-1/2, times mscale^2 under YaRN with mscale_all_dim; o_proj reads the
 * heads' values [n_heads * v_head_dim]. The two latent norms use eps 1e-6 whatever
 * rms_norm_eps says (DeepseekV3RMSNorm's default, which transformers leaves in place).
 *
 * rope_interleave (the default) rotates the pairs (x0, x1), (x2, x3), ... and writes the
 * result as [rotated evens | rotated odds]; that is rotate-half RoPE on the de-interleaved
 * vector, which is what is computed here (q and k alike, so the scores are transformers').
 *
 * The heads' pieces are assembled on the host and padded with zeros to one head width
 * D = max(qk_head_dim, v_head_dim), so the backend's ordinary attention runs it (zeros add
 * nothing to a score, and the padded value columns are dropped).
 *
 * DeepSeek-V3.2 (arch lin_idx_q): its indexer (model_dsa.c) reads q_a_layernorm's output and
 * x and chooses each query's keys; the attention then sees only those (attention_keep). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quant/model/model_internal.h"

#define MLA_NORM_EPS 1e-6f

#define BE_TRY(m, err, what, call) do { int _rc = (call); \
    if (_rc) { rc = qd_err_set((err), _rc, "block %d %s: %s", bw->block, (what), (m)->be->err.msg); goto done; } } while (0)

/* The softmax scale: qk_head_dim^-1/2, times yarn_get_mscale(factor, mscale_all_dim)^2
 * when the RoPE is scaled and mscale_all_dim is set (transformers' yarn_apply_mscale). */
static float mla_scale(const qd_model_config *c)
{
    double s = 1.0 / sqrt((double)(c->qk_nope_dim + c->qk_rope_dim));
    const qd_rope_config *r = &c->rope;
    if (r->type != QD_ROPE_DEFAULT && r->mscale_all_dim != 0.0f && r->factor > 1.0f) {
        double ms = 0.1 * (double)r->mscale_all_dim * log((double)r->factor) + 1.0;
        s *= ms * ms;
    }
    return (float)s;
}

/* dst [R] = src [R] de-interleaved ([evens | odds]) when asked, else copied. */
static void rope_part(float *dst, const float *src, int64_t R, int interleave)
{
    if (!interleave) { memcpy(dst, src, (size_t)R * sizeof *dst); return; }
    for (int64_t i = 0; i < R / 2; i++) { dst[i] = src[2 * i]; dst[R / 2 + i] = src[2 * i + 1]; }
}

int qd_mla_forward(qd_model *m, const qd_block_weights *bw, const float *xn, float *out, int64_t batch, int64_t seq,
                   const int32_t *pos_be, const qd_rope_freqs *rf, const qd_block_hooks *hooks, qd_err *err)
{
    const qd_model_config *c = &m->cfg;
    const qd_arch *a = m->arch;
    int64_t rows = batch * seq, H = c->n_heads, N = c->qk_nope_dim, R = c->qk_rope_dim, V = c->v_head_dim;
    int64_t QK = N + R, D = QK > V ? QK : V, L = c->kv_lora_rank, QL = c->q_lora_rank;
    int64_t lat = QL > L ? QL : L;
    /* DeepSeek-V3.2: the indexer's wq_b sits after q_b_proj; its choice of keys, keep. */
    int qlora = QL > 0, li_kva = qlora ? (a->lin_idx_q ? 3 : 2) : 1, li_kvb = li_kva + 1;
    size_t f = sizeof(float);
    float *q = qd_model_scratch(m, QD_SCRATCH_Q, (size_t)(rows * H * QK) * f, err);
    float *kva = q ? qd_model_scratch(m, QD_SCRATCH_K, (size_t)(rows * (L + R)) * f, err) : NULL;
    float *kvb = kva ? qd_model_scratch(m, QD_SCRATCH_V, (size_t)(rows * H * (N + V)) * f, err) : NULL;
    float *lt = kvb ? qd_model_scratch(m, QD_SCRATCH_MLA_LAT, (size_t)(rows * lat) * f, err) : NULL;
    float *rp = lt ? qd_model_scratch(m, QD_SCRATCH_MLA_ROPE, (size_t)(rows * (H + 1) * R) * f, err) : NULL;
    float *qp = rp ? qd_model_scratch(m, QD_SCRATCH_MLA_QP, (size_t)(rows * H * D) * f, err) : NULL;
    float *kp = qp ? qd_model_scratch(m, QD_SCRATCH_MLA_KP, (size_t)(rows * H * D) * f, err) : NULL;
    float *vp = kp ? qd_model_scratch(m, QD_SCRATCH_MLA_VP, (size_t)(rows * H * D) * f, err) : NULL;
    float *att = vp ? qd_model_scratch(m, QD_SCRATCH_ATT, (size_t)(rows * H * D) * f, err) : NULL;
    uint8_t *keep = att && a->lin_idx_q ? qd_model_scratch(m, QD_SCRATCH_DSA_KEEP, (size_t)(rows * seq), err) : NULL;
    if (!att || (a->lin_idx_q && !keep)) return QD_ENOMEM;
    float *hq = malloc((size_t)(rows * H * QK) * f), *hkva = malloc((size_t)(rows * (L + R)) * f);
    float *hkvb = malloc((size_t)(rows * H * (N + V)) * f), *hr = malloc((size_t)(rows * (H + 1) * R) * f);
    float *hqp = calloc((size_t)(rows * H * D), f), *hkp = calloc((size_t)(rows * H * D), f);
    float *hvp = calloc((size_t)(rows * H * D), f), *hlat = malloc((size_t)(rows * L) * f);
    int rc = 0;
    if (!hq || !hkva || !hkvb || !hr || !hqp || !hkp || !hvp || !hlat) {
        rc = qd_err_set(err, QD_ENOMEM, "block %d: out of memory for the latent attention", bw->block);
        goto done;
    }
    /* Queries. */
    if ((rc = qd_fwd_call_input(m, bw, m->lin[0].group, xn, rows, hooks, err))) goto done;
    if (qlora) {
        if ((rc = qd_fwd_linear_part(m, bw, 0, 0, QL, xn, rows, lt, hooks, err))) goto done;
        BE_TRY(m, err, "q_a_layernorm", m->be->ops->rmsnorm(m->be, lt, lt, bw->mla_norm_w[0], rows, QL, MLA_NORM_EPS));
        if ((rc = qd_fwd_call_input(m, bw, m->lin[1].group, lt, rows, hooks, err)) ||
            (rc = qd_fwd_linear_part(m, bw, 1, 0, H * QK, lt, rows, q, hooks, err)))
            goto done;
        if (keep && (rc = qd_dsa_keep(m, bw, xn, lt, batch, seq, pos_be, rf, hooks, keep, err))) goto done;
    } else if ((rc = qd_fwd_linear_part(m, bw, 0, 0, H * QK, xn, rows, q, hooks, err))) {
        goto done;
    }
    /* Keys and values: the latent [rows, L] normed and expanded by kv_b_proj; k_rot kept. */
    if ((rc = qd_fwd_linear_part(m, bw, li_kva, 0, L + R, xn, rows, kva, hooks, err))) goto done;
    BE_TRY(m, err, "kv_a: download", qd_backend_download(m->be, hkva, kva, (size_t)(rows * (L + R)) * f));
    for (int64_t t = 0; t < rows; t++) memcpy(hlat + t * L, hkva + t * (L + R), (size_t)L * f);
    BE_TRY(m, err, "kv latent: upload", qd_backend_upload(m->be, lt, hlat, (size_t)(rows * L) * f));
    BE_TRY(m, err, "kv_a_layernorm", m->be->ops->rmsnorm(m->be, lt, lt, bw->mla_norm_w[1], rows, L, MLA_NORM_EPS));
    if ((rc = qd_fwd_call_input(m, bw, m->lin[li_kvb].group, lt, rows, hooks, err)) ||
        (rc = qd_fwd_linear_part(m, bw, li_kvb, 0, H * (N + V), lt, rows, kvb, hooks, err)))
        goto done;
    BE_TRY(m, err, "q: download", qd_backend_download(m->be, hq, q, (size_t)(rows * H * QK) * f));
    BE_TRY(m, err, "kv_b: download", qd_backend_download(m->be, hkvb, kvb, (size_t)(rows * H * (N + V)) * f));
    /* RoPE on the rope parts: queries [rows, H, R], then the shared keys [rows, 1, R]. */
    for (int64_t t = 0; t < rows; t++) {
        for (int64_t h = 0; h < H; h++) rope_part(hr + (t * H + h) * R, hq + (t * H + h) * QK + N, R, c->rope_interleave);
        rope_part(hr + rows * H * R + t * R, hkva + t * (L + R) + L, R, c->rope_interleave);
    }
    BE_TRY(m, err, "rope: upload", qd_backend_upload(m->be, rp, hr, (size_t)(rows * (H + 1) * R) * f));
    BE_TRY(m, err, "rope q", m->be->ops->rope(m->be, rp, rows, H, R, pos_be, rf));
    BE_TRY(m, err, "rope k", m->be->ops->rope(m->be, rp + rows * H * R, rows, 1, R, pos_be, rf));
    BE_TRY(m, err, "rope: download", qd_backend_download(m->be, hr, rp, (size_t)(rows * (H + 1) * R) * f));
    /* Heads padded to D: q [q_nope | q_rot], k [k_nope | k_rot], v [v]. */
    for (int64_t t = 0; t < rows; t++)
        for (int64_t h = 0; h < H; h++) {
            float *dq = hqp + (t * H + h) * D, *dk = hkp + (t * H + h) * D, *dv = hvp + (t * H + h) * D;
            const float *kv = hkvb + (t * H + h) * (N + V);
            memcpy(dq, hq + (t * H + h) * QK, (size_t)N * f);
            memcpy(dq + N, hr + (t * H + h) * R, (size_t)R * f);
            memcpy(dk, kv, (size_t)N * f);
            memcpy(dk + N, hr + rows * H * R + t * R, (size_t)R * f);
            memcpy(dv, kv + N, (size_t)V * f);
        }
    BE_TRY(m, err, "heads: upload", qd_backend_upload(m->be, qp, hqp, (size_t)(rows * H * D) * f));
    BE_TRY(m, err, "heads: upload", qd_backend_upload(m->be, kp, hkp, (size_t)(rows * H * D) * f));
    BE_TRY(m, err, "heads: upload", qd_backend_upload(m->be, vp, hvp, (size_t)(rows * H * D) * f));
    if (keep)   /* F32 whatever the compute arithmetic: the op has no bf16 form */
        BE_TRY(m, err, "attention", m->be->ops->attention_keep(m->be, att, qp, kp, vp, batch, seq, H, H, D, mla_scale(c), keep));
    else
        BE_TRY(m, err, "attention", qd_model_attention_op(m)(m->be, att, qp, kp, vp, batch, seq, H, H, D, mla_scale(c), 0, 0.0f));
    /* Drop the value padding: [rows, H * V] for o_proj. */
    BE_TRY(m, err, "attention: download", qd_backend_download(m->be, hqp, att, (size_t)(rows * H * D) * f));
    for (int64_t t = 0; t < rows; t++)
        for (int64_t h = 0; h < H; h++) memcpy(hvp + (t * H + h) * V, hqp + (t * H + h) * D, (size_t)V * f);
    BE_TRY(m, err, "attention: upload", qd_backend_upload(m->be, vp, hvp, (size_t)(rows * H * V) * f));
    if ((rc = qd_fwd_call_input(m, bw, m->lin[a->lin_o].group, vp, rows, hooks, err)) ||
        (rc = qd_fwd_linear_part(m, bw, a->lin_o, 0, c->hidden, vp, rows, out, hooks, err)))
        goto done;
done:
    free(hq); free(hkva); free(hkvb); free(hr); free(hqp); free(hkp); free(hvp); free(hlat);
    return rc;
}
