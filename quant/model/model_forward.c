/* The forward pass through be->ops: token embedding (+ OPT positions and project_in, Gemma's
 * scale), one decoder block with input hooks and weight overrides (llama family: RMSNorm or LayerNorm,
 * RoPE, GQA attention with optional window and soft-cap (DeepSeek's latent attention in
 * model_mla.c; Gated DeltaNet layers in model_gdn.c; Qwen3-Next's output gate), SwiGLU or
 * GeGLU or a plain GELU MLP (StarCoder2, Phi, GPT-NeoX), Phi-3's fused projections, GPT-NeoX's
 * per-head query_key_value, Gemma's extra norms, the parallel block (Phi, GPT-NeoX, Cohere2);
 * OPT: pre- or post-LayerNorm, ReLU/GELU MLP, biases), and final norm + lm_head (+ its bias,
 * Phi; + Gemma 2's logit soft-cap).
 * Activations live in the model's backend scratch buffers, reused between calls. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/model/model_internal.h"
#include "quant/model/rope.h"

#define BE_CALL(m, err, call) do { int _rc = (call); \
    if (_rc) return qd_err_set((err), _rc, "%s: %s", #call, (m)->be->err.msg); } while (0)

int qd_linear_forward(qd_backend *be, const float *x, int64_t rows, const float *w,
                      const float *b, int64_t n, int64_t k, float *y)
{
    if (rows == 0) return 0;
    int rc = be->ops->gemm(be, 0, 1, rows, n, k, 1.0f, x, k, w, k, 0.0f, y, n);
    if (!rc && b) rc = be->ops->add_bias(be, y, b, rows, n);
    return rc;
}

int qd_model_linear_forward(qd_model *m, const float *x, int64_t rows, const float *w, const float *b, int64_t n,
                            int64_t k, float *y)
{
    qd_backend *be = m->be;
    if (!m->compute_bf16 || rows == 0) return qd_linear_forward(be, x, rows, w, b, n, k, y);
    int rc = be->ops->gemm_nt_bf16(be, rows, n, k, x, k, w, k, y, n);
    if (!rc && b) rc = be->ops->add_bias(be, y, b, rows, n);
    return rc;
}

qd_attention_fn qd_model_attention_op(const qd_model *m)
{
    return m->compute_bf16 && m->be->ops->attention_bf16 ? m->be->ops->attention_bf16 : m->be->ops->attention;
}

int qd_model_embed(qd_model *m, const int32_t *ids, int64_t batch, int64_t seq,
                   const int32_t *pos, float *h, qd_err *err)
{
    const qd_model_config *c = &m->cfg;
    int64_t rows = batch * seq, pd = c->word_embed_proj_dim, hid = c->hidden;
    const st_tensor *te = m->t_embed;
    size_t esz = qd_dtype_size(te->dtype);
    float *host = malloc((size_t)rows * (size_t)(pd > hid ? pd : hid) * sizeof *host);
    if (!host) return qd_err_set(err, QD_ENOMEM, "embed: out of memory for %lld rows", (long long)rows);
    int rc = 0;
    for (int64_t r = 0; r < rows && !rc; r++) {
        if (ids[r] < 0 || ids[r] >= c->vocab) {
            rc = qd_err_set(err, QD_EINVAL, "embed: token id %d at %lld is outside the vocabulary [0, %lld)",
                            ids[r], (long long)r, (long long)c->vocab);
            break;
        }
        rc = qd_convert_to_f32(te->dtype, (const char *)te->data + (size_t)ids[r] * pd * esz, host + r * pd, (size_t)pd);
        if (rc) qd_err_set(err, rc, "embed: cannot convert %s rows", qd_dtype_name(te->dtype));
        /* Gemma: embeddings times sqrt(hidden) (rounded to the model's dtype, see config). */
        for (int64_t i = 0; !rc && c->embed_scale > 0 && i < pd; i++) host[r * pd + i] *= c->embed_scale;
    }
    if (!rc) {
        if (m->proj_in) {
            float *tmp = qd_model_scratch(m, QD_SCRATCH_TMP, (size_t)rows * pd * sizeof(float), err);
            if (!tmp) rc = QD_ENOMEM;
            else if ((rc = qd_backend_upload(m->be, tmp, host, (size_t)rows * pd * sizeof(float))) ||
                     (rc = qd_linear_forward(m->be, tmp, rows, m->proj_in, NULL, hid, pd, h)))
                qd_err_set(err, rc, "embed: project_in: %s", m->be->err.msg);
        } else if ((rc = qd_backend_upload(m->be, h, host, (size_t)rows * hid * sizeof(float)))) {
            qd_err_set(err, rc, "embed: upload: %s", m->be->err.msg);
        }
    }
    if (!rc && m->t_pos) {
        const st_tensor *tp = m->t_pos;
        size_t psz = qd_dtype_size(tp->dtype);
        for (int64_t r = 0; r < rows && !rc; r++) {
            int64_t p = (pos ? pos[r % seq] : r % seq) + c->pos_offset;
            if (p < 0 || p >= tp->shape[0]) {
                rc = qd_err_set(err, QD_EINVAL, "embed: position %lld is beyond max_position_embeddings %lld",
                                (long long)(p - c->pos_offset), (long long)c->max_pos);
                break;
            }
            rc = qd_convert_to_f32(tp->dtype, (const char *)tp->data + (size_t)p * hid * psz, host + r * hid, (size_t)hid);
        }
        float *tmp = rc ? NULL : qd_model_scratch(m, QD_SCRATCH_TMP, (size_t)rows * hid * sizeof(float), err);
        if (!rc && !tmp) rc = QD_ENOMEM;
        if (!rc && ((rc = qd_backend_upload(m->be, tmp, host, (size_t)rows * hid * sizeof(float))) ||
                    (rc = m->be->ops->add(m->be, h, tmp, rows * hid))))
            qd_err_set(err, rc, "embed: positions: %s", m->be->err.msg);
    }
    free(host);
    return rc;
}

/* The weight and bias linear li computes with in this call: the loaded ones, or what the
 * override hook substitutes. */
static int linear_weights(qd_model *m, const qd_block_weights *bw, int li, const qd_block_hooks *hooks,
                          const float **w, const float **b, qd_err *err)
{
    const qd_linear_info *L = &m->lin[li];
    *w = bw->w[li];
    *b = bw->b[li];
    if (hooks && hooks->override) {
        int rc = hooks->override(hooks->ud, bw->block, li, w, b);
        if (rc) return qd_err_set(err, rc, "block %d %s: the weight override failed", bw->block, L->name);
    }
    if (!*w) return qd_err_set(err, QD_EINVAL, "block %d %s: no weight", bw->block, L->name);
    if (!L->has_bias) *b = NULL;
    return 0;
}

/* Output rows [r0, r0 + n) of linear li on x (rows) into y [rows, n]: the whole linear, or
 * one part of a fused one (q, k or v of qkv_proj; gate or up of gate_up_proj), whose rows
 * are contiguous in the [N, K] weight. */
int qd_fwd_linear_part(qd_model *m, const qd_block_weights *bw, int li, int64_t r0, int64_t n, const float *x,
                       int64_t rows, float *y, const qd_block_hooks *hooks, qd_err *err)
{
    const qd_linear_info *L = &m->lin[li];
    const float *w, *b;
    int rc = linear_weights(m, bw, li, hooks, &w, &b, err);
    if (rc) return rc;
    rc = qd_model_linear_forward(m, x, rows, w + r0 * L->k, b ? b + r0 : NULL, n, L->k, y);
    if (rc) return qd_err_set(err, rc, "block %d %s: %s", bw->block, L->name, m->be->err.msg);
    return 0;
}

static int run_linear(qd_model *m, const qd_block_weights *bw, int li, const float *x, int64_t rows, float *y,
                      const qd_block_hooks *hooks, qd_err *err)
{
    return qd_fwd_linear_part(m, bw, li, 0, m->lin[li].n, x, rows, y, hooks, err);
}

int qd_fwd_call_input(qd_model *m, const qd_block_weights *bw, int g, const float *x, int64_t rows,
                      const qd_block_hooks *hooks, qd_err *err)
{
    if (!hooks || !hooks->input) return 0;
    /* The pipeline's hooks write why they failed (a Hessian update's device error) into the
     * qd_err this forward reports through: cleared first, so what is there afterwards is
     * theirs, and kept under the block's and group's names. */
    if (err) *err = (qd_err){0};
    int rc = hooks->input(hooks->ud, bw->block, g, &m->grp[g], x, rows);
    if (!rc) return 0;
    char why[QD_ERR_MSG_MAX];
    snprintf(why, sizeof why, "%s", err && err->code == rc && err->msg[0] ? err->msg : "the input hook stopped the forward");
    return qd_err_set(err, rc, "block %d %s: %s", bw->block, m->grp[g].name, why);
}

static int norm(qd_model *m, float *y, const float *x, const float *w, const float *b, int64_t rows)
{
    if (m->arch->layernorm)
        return m->be->ops->layernorm(m->be, y, x, w, b, rows, m->cfg.hidden, m->cfg.norm_eps);
    return m->be->ops->rmsnorm(m->be, y, x, w, rows, m->cfg.hidden, m->cfg.norm_eps);
}

/* The per-head RMSNorms of q [rows, n_heads * head_dim] and k [rows, n_kv_heads * head_dim]. */
static int qk_norm(qd_model *m, const qd_block_weights *bw, float *q, float *k, int64_t rows, qd_err *err)
{
    const qd_model_config *c = &m->cfg;
    BE_CALL(m, err, m->be->ops->rmsnorm(m->be, q, q, bw->qk_norm_w[0], rows * c->n_heads, c->head_dim, c->norm_eps));
    BE_CALL(m, err, m->be->ops->rmsnorm(m->be, k, k, bw->qk_norm_w[1], rows * c->n_kv_heads, c->head_dim, c->norm_eps));
    return 0;
}

/* Attention sub-block: xn (normed input) → out (o_proj output). rf: this layer's RoPE
 * (NULL for OPT); window: this layer's sliding window (0 = none). */
static int attention(qd_model *m, const qd_block_weights *bw, const float *xn, float *out, int64_t batch,
                     int64_t seq, const int32_t *pos_be, const qd_rope_freqs *rf, int64_t window,
                     const qd_block_hooks *hooks, qd_err *err)
{
    const qd_model_config *c = &m->cfg;
    const qd_arch *a = m->arch;
    int64_t rows = batch * seq, qd = c->n_heads * c->head_dim, kvd = c->n_kv_heads * c->head_dim;
    int64_t chunk = c->attn_chunk > 0 && bw->block < QD_CFG_MAX_LAYERS && c->layer_chunked[bw->block] ? c->attn_chunk : 0;
    float *q = qd_model_scratch(m, QD_SCRATCH_Q, (size_t)(rows * qd) * sizeof(float), err);
    float *k = q ? qd_model_scratch(m, QD_SCRATCH_K, (size_t)(rows * kvd) * sizeof(float), err) : NULL;
    float *v = k ? qd_model_scratch(m, QD_SCRATCH_V, (size_t)(rows * kvd) * sizeof(float), err) : NULL;
    float *att = v ? qd_model_scratch(m, QD_SCRATCH_ATT, (size_t)(rows * qd) * sizeof(float), err) : NULL;
    if (!att) return QD_ENOMEM;
    int rc;
    float *gate = NULL;
    if ((rc = qd_fwd_call_input(m, bw, m->lin[QD_LIN_Q].group, xn, rows, hooks, err))) return rc;
    if (a->qkv_per_head) {
        /* GPT-NeoX's query_key_value: head h's rows are [q_h; k_h; v_h]. The whole
         * projection, then each head's three parts into q, k and v. */
        int64_t hd = c->head_dim, w = qd + 2 * kvd;
        float *f = qd_model_scratch(m, QD_SCRATCH_F2, (size_t)(rows * w) * sizeof(float), err);
        if (!f) return QD_ENOMEM;
        if ((rc = run_linear(m, bw, 0, xn, rows, f, hooks, err))) return rc;
        for (int64_t h = 0; h < c->n_heads; h++) {
            BE_CALL(m, err, m->be->ops->copy_2d(m->be, q + h * hd, qd, f + h * 3 * hd, w, rows, hd));
            BE_CALL(m, err, m->be->ops->copy_2d(m->be, k + h * hd, kvd, f + h * 3 * hd + hd, w, rows, hd));
            BE_CALL(m, err, m->be->ops->copy_2d(m->be, v + h * hd, kvd, f + h * 3 * hd + 2 * hd, w, rows, hd));
        }
    } else if (a->fused_qkv) {
        /* Phi-3's qkv_proj: rows [0, Q) are q, then k, then v. */
        if ((rc = qd_fwd_linear_part(m, bw, 0, 0, qd, xn, rows, q, hooks, err)) ||
            (rc = qd_fwd_linear_part(m, bw, 0, qd, kvd, xn, rows, k, hooks, err)) ||
            (rc = qd_fwd_linear_part(m, bw, 0, qd + kvd, kvd, xn, rows, v, hooks, err)))
            return rc;
    } else if (c->attn_gate) {
        /* Qwen3-Next, Qwen3.5: q_proj's rows are, per head, its query then its output gate;
         * gathered (in head_dim units) into q and gate. */
        float *qg = qd_model_scratch(m, QD_SCRATCH_QG, (size_t)(rows * 2 * qd) * sizeof(float), err);
        gate = qg ? qd_model_scratch(m, QD_SCRATCH_GATE, (size_t)(rows * qd) * sizeof(float), err) : NULL;
        int32_t map[2 * 1024];
        if (!gate) return QD_ENOMEM;
        if (c->n_heads > 1024) return qd_err_set(err, QD_EUNSUPPORTED, "gated attention: %lld heads (at most 1024)", (long long)c->n_heads);
        for (int64_t h = 0; h < c->n_heads; h++) { map[h] = (int32_t)(2 * h); map[c->n_heads + h] = (int32_t)(2 * h + 1); }
        if ((rc = run_linear(m, bw, QD_LIN_Q, xn, rows, qg, hooks, err)) ||
            (rc = qd_fwd_gather_units(m, q, qg, rows, 2 * c->n_heads, c->head_dim, map, c->n_heads, err)) ||
            (rc = qd_fwd_gather_units(m, gate, qg, rows, 2 * c->n_heads, c->head_dim, map + c->n_heads, c->n_heads, err)) ||
            (rc = run_linear(m, bw, QD_LIN_K, xn, rows, k, hooks, err)) ||
            (rc = run_linear(m, bw, QD_LIN_V, xn, rows, v, hooks, err)))
            return rc;
    } else if ((rc = run_linear(m, bw, QD_LIN_Q, xn, rows, q, hooks, err)) ||
               (rc = run_linear(m, bw, QD_LIN_K, xn, rows, k, hooks, err)) ||
               (rc = run_linear(m, bw, QD_LIN_V, xn, rows, v, hooks, err))) {
        return rc;
    }
    /* Qwen3, Gemma 3, EXAONE 4: RMSNorm over each head's dims (q_norm, k_norm), before RoPE;
     * Hunyuan's query_layernorm and key_layernorm come after it (qk_norm_post_rope). */
    if (c->qk_norm == QD_QK_NORM_HEAD && !a->qk_norm_post_rope && (rc = qk_norm(m, bw, q, k, rows, err))) return rc;
    if (c->qk_norm == QD_QK_NORM_WHOLE) {
        /* OLMo 2/3: over each token's whole q and k projections, before the heads split. */
        BE_CALL(m, err, m->be->ops->rmsnorm(m->be, q, q, bw->qk_norm_w[0], rows, qd, c->norm_eps));
        BE_CALL(m, err, m->be->ops->rmsnorm(m->be, k, k, bw->qk_norm_w[1], rows, kvd, c->norm_eps));
    }
    if (rf) {
        /* GLM-4, ERNIE 4.5 and Cohere2 turn interleaved pairs (DeepSeek's interleave is model_mla.c's own). */
        qd_rope_freqs rfi;
        if (c->rope_interleave) { rfi = *rf; rfi.interleaved = 1; rf = &rfi; }
        BE_CALL(m, err, m->be->ops->rope(m->be, q, rows, c->n_heads, c->head_dim, pos_be, rf));
        BE_CALL(m, err, m->be->ops->rope(m->be, k, rows, c->n_kv_heads, c->head_dim, pos_be, rf));
    }
    if (c->qk_norm == QD_QK_NORM_HEAD && a->qk_norm_post_rope && (rc = qk_norm(m, bw, q, k, rows, err))) return rc;
    if (rf && c->qk_l2norm) {
        /* Llama 4: q and k over their RMS per head, no weight, after RoPE (RoPE layers only). */
        BE_CALL(m, err, m->be->ops->rmsnorm(m->be, q, q, NULL, rows * c->n_heads, c->head_dim, c->norm_eps));
        BE_CALL(m, err, m->be->ops->rmsnorm(m->be, k, k, NULL, rows * c->n_kv_heads, c->head_dim, c->norm_eps));
    }
    /* The query position scale: Ministral 3's on every (RoPE) layer, Llama 4's on its NoPE layers. */
    if (c->q_pos_scale_beta > 0 && (c->q_pos_scale_nope ? !rf : rf != NULL) &&
        (rc = qd_fwd_q_pos_scale(m, q, rows, pos_be, err)))
        return rc;
    /* Gemma scales by query_pre_attn_scalar^-1/2 instead of head_dim^-1/2. */
    double qs = c->query_pre_attn_scalar > 0 ? (double)c->query_pre_attn_scalar : (double)c->head_dim;
    float scale = c->attn_scale > 0 ? c->attn_scale : (float)(1.0 / sqrt(qs));
    if (bw->sinks)   /* gpt-oss: a learned sink logit per head (F32 also under compute bf16) */
        BE_CALL(m, err, m->be->ops->attention_sink(m->be, att, q, k, v, batch, seq, c->n_heads, c->n_kv_heads,
                                                   c->head_dim, scale, window, bw->sinks));
    else if (chunk > 0 && chunk < seq) {
        /* Llama 4's chunked layers: a query sees the keys of its own chunk only, so each
         * chunk of each sequence is an attention of its own over contiguous rows (whole
         * chunks: one call over batch * seq / chunk sequences of chunk tokens). */
        if (seq % chunk == 0)
            BE_CALL(m, err, qd_model_attention_op(m)(m->be, att, q, k, v, batch * (seq / chunk), chunk, c->n_heads,
                                                     c->n_kv_heads, c->head_dim, scale, window, c->attn_softcap));
        else
            for (int64_t b = 0; b < batch; b++)
                for (int64_t t0 = 0; t0 < seq; t0 += chunk) {
                    int64_t r0 = b * seq + t0, len = seq - t0 < chunk ? seq - t0 : chunk;
                    BE_CALL(m, err, qd_model_attention_op(m)(m->be, att + r0 * qd, q + r0 * qd, k + r0 * kvd,
                                                             v + r0 * kvd, 1, len, c->n_heads, c->n_kv_heads,
                                                             c->head_dim, scale, window, c->attn_softcap));
                }
    } else
        BE_CALL(m, err, qd_model_attention_op(m)(m->be, att, q, k, v, batch, seq, c->n_heads, c->n_kv_heads,
                                                 c->head_dim, scale, window, c->attn_softcap));
    if (gate) BE_CALL(m, err, m->be->ops->sigmoid_mul(m->be, att, gate, att, rows * qd));
    if ((rc = qd_fwd_call_input(m, bw, m->lin[a->lin_o].group, att, rows, hooks, err)) ||
        (rc = run_linear(m, bw, a->lin_o, att, rows, out, hooks, err)))
        return rc;
    return 0;
}

/* MLP sub-block: xn → out. */
static int mlp(qd_model *m, const qd_block_weights *bw, const float *xn, float *out, int64_t rows,
               const qd_block_hooks *hooks, qd_err *err)
{
    const qd_model_config *c = &m->cfg;
    const qd_arch *a = m->arch;
    int64_t ff = c->intermediate;
    float *f1 = qd_model_scratch(m, QD_SCRATCH_F1, (size_t)(rows * ff) * sizeof(float), err);
    if (!f1) return QD_ENOMEM;
    int rc, l0 = a->lin_mlp0;
    /* Phi's fc1 reads the input q/k/v read (one group, whose hook the attention called). */
    if (m->lin[l0].group != m->lin[QD_LIN_Q].group && (rc = qd_fwd_call_input(m, bw, m->lin[l0].group, xn, rows, hooks, err)))
        return rc;
    if (qd_model_mlp_gated(m)) {
        float *f2 = qd_model_scratch(m, QD_SCRATCH_F2, (size_t)(rows * ff) * sizeof(float), err);
        if (!f2) return QD_ENOMEM;
        int down = a->fused_gate_up ? l0 + 1 : l0 + 2;
        if (a->fused_gate_up) {
            /* Phi-3's gate_up_proj: rows [0, FF) are the gate, [FF, 2 FF) the up projection. */
            if ((rc = qd_fwd_linear_part(m, bw, l0, 0, ff, xn, rows, f1, hooks, err)) ||
                (rc = qd_fwd_linear_part(m, bw, l0, ff, ff, xn, rows, f2, hooks, err)))
                return rc;
        } else if ((rc = run_linear(m, bw, l0, xn, rows, f1, hooks, err)) ||          /* gate */
                   (rc = run_linear(m, bw, l0 + 1, xn, rows, f2, hooks, err))) {      /* up */
            return rc;
        }
        /* Falcon-H1's gate multiplier acts on gate_proj's output, before the activation. */
        if (c->layout == QD_LAYOUT_FALCON_H1 && c->falcon.mlp_gate != 1.0f)
            BE_CALL(m, err, m->be->ops->scale(m->be, f1, rows * ff, c->falcon.mlp_gate));
        if (c->layout == QD_LAYOUT_GEMMA) BE_CALL(m, err, m->be->ops->gelu_tanh_mul(m->be, f1, f1, f2, rows * ff));
        else BE_CALL(m, err, m->be->ops->silu_mul(m->be, f1, f1, f2, rows * ff));
        if ((rc = qd_fwd_call_input(m, bw, m->lin[down].group, f1, rows, hooks, err)) ||
            (rc = run_linear(m, bw, down, f1, rows, out, hooks, err)))
            return rc;
    } else {
        if ((rc = run_linear(m, bw, l0, xn, rows, f1, hooks, err))) return rc;   /* fc1 */
        if (a->xielu) { if ((rc = qd_fwd_xielu(m, bw, f1, rows * ff, err))) return rc; }
        else if (!strcmp(c->activation, "relu")) BE_CALL(m, err, m->be->ops->relu(m->be, f1, rows * ff));
        else if (!strcmp(c->activation, "gelu")) BE_CALL(m, err, m->be->ops->gelu(m->be, f1, rows * ff));
        else BE_CALL(m, err, m->be->ops->gelu_tanh(m->be, f1, rows * ff));   /* gelu_new, gelu_pytorch_tanh */
        if ((rc = qd_fwd_call_input(m, bw, m->lin[l0 + 1].group, f1, rows, hooks, err)) ||
            (rc = run_linear(m, bw, l0 + 1, f1, rows, out, hooks, err)))
            return rc;
    }
    return 0;
}

qd_block_part qd_model_group_part(const qd_model *m, int g)
{
    /* Every family lists its attention linears first, up to the output projection (a
     * hybrid's recurrent layers name theirs linear_attn.*); everything after the attention's
     * residual add (MLP, router, experts) belongs to the second half. A parallel block has
     * no halves: its MLP reads the block's input, which the residual stream between halves
     * no longer holds, so it runs whole (QD_BLOCK_ALL). */
    const qd_input_group *G = qd_model_group(m, g);
    if (m->cfg.parallel_block) return QD_BLOCK_ALL;
    const qd_linear_info *L = G && G->n_linears > 0 ? qd_model_linear(m, G->linears[0]) : NULL;
    if (!L) return QD_BLOCK_MLP;
    /* A hybrid's recurrent mixer (conv.*, mamba.*, linear_attn.*) stands where attention does. */
    return G->linears[0] <= m->arch->lin_o || !strncmp(L->name, "linear_attn.", 12) || L->layer_mixer >= 0
               ? QD_BLOCK_ATTN : QD_BLOCK_MLP;
}

int qd_model_attn_out_group(const qd_model *m)
{
    return m->lin[m->arch->lin_o].group;
}

/* The first half's output projection in block `block`: o_proj, or a recurrent layer's out_proj. */
static int attn_out_linear(const qd_model *m, int block)
{
    int k = qd_model_block_mixer(m, block);
    return k == QD_MIXER_MAMBA2 || k == QD_MIXER_SHORT_CONV ? m->arch->lin_mix_out : m->arch->lin_o;
}

int qd_model_block_attn_out_group(const qd_model *m, int block)
{
    return m->lin[attn_out_linear(m, block)].group;
}

/* A half's tail after its last projection (tmp holds that projection's output): Gemma's norm
 * on the sub-block's output (norm 2 after the attention, 3 after the MLP), Granite's residual
 * multiplier, the residual add,
 * post-LN's norm (0, 1). One copy for qd_block_forward_part and the finish functions below,
 * so they compute the same floats. half: 0 attention, 1 MLP. */
static int half_tail(qd_model *m, const qd_block_weights *bw, int half, float *y, float *tmp, int64_t rows,
                     int pre, qd_err *err)
{
    if (bw->norm_w[2 + half]) BE_CALL(m, err, norm(m, tmp, tmp, bw->norm_w[2 + half], NULL, rows));
    if (m->cfg.residual_scale > 0) BE_CALL(m, err, m->be->ops->scale(m->be, tmp, rows * m->cfg.hidden, m->cfg.residual_scale));
    BE_CALL(m, err, m->be->ops->add(m->be, y, tmp, rows * m->cfg.hidden));
    if (!pre) BE_CALL(m, err, norm(m, y, y, bw->norm_w[half], bw->norm_b[half], rows));
    return 0;
}

/* Pre-LN (every llama-family model, OPT with do_layer_norm_before) or post-LN. */
static int pre_ln(const qd_model *m)
{
    return m->cfg.family == QD_ARCH_LLAMA || m->cfg.do_layer_norm_before;
}

/* A half's end from its last projection li's input `in`: y = x + tail(li(in)). */
static int half_finish(qd_model *m, const qd_block_weights *bw, int half, int li, const float *in, const float *x,
                       float *y, int64_t rows, qd_err *err)
{
    if (m->cfg.parallel_block)
        return qd_err_set(err, QD_EINVAL, "block %d: a parallel block runs whole, it has no %s half to finish", bw->block,
                          half ? "MLP" : "attention");
    if (rows <= 0) return qd_err_set(err, QD_EINVAL, "block %d: finishing a half on %lld rows", bw->block, (long long)rows);
    size_t hbytes = (size_t)(rows * m->cfg.hidden) * sizeof(float);
    float *tmp = qd_model_scratch(m, QD_SCRATCH_TMP, hbytes, err);
    if (!tmp) return QD_ENOMEM;
    int rc = run_linear(m, bw, li, in, rows, tmp, NULL, err);   /* first: in may be y */
    if (rc) return rc;
    if (y != x) BE_CALL(m, err, m->be->ops->copy(m->be, y, x, hbytes));
    return half_tail(m, bw, half, y, tmp, rows, pre_ln(m), err);
}

int qd_block_attn_finish(qd_model *m, const qd_block_weights *bw, const float *ctx, const float *x, float *y,
                         int64_t rows, qd_err *err)
{
    /* A hybrid's recurrent layer ends its half in its own projection (LFM2's and Mamba-2's
     * out_proj); a Gated DeltaNet layer's is not finished from its context. */
    int li = attn_out_linear(m, bw->block);
    if (!qd_model_block_has_linear(m, bw->block, li))
        return qd_err_set(err, QD_EINVAL, "attention finish: block %d has no %s (a recurrent layer)", bw->block,
                          m->lin[li].name);
    return half_finish(m, bw, 0, li, ctx, x, y, rows, err);
}

/* The dense MLP's last linear (down_proj, fc2) as mlp() runs it; -1 for a model with
 * experts (whose dense layers, DeepSeek's first ones, are left to the whole MLP half). */
static int mlp_out_linear(const qd_model *m)
{
    if (m->cfg.n_experts > 0) return -1;
    const qd_arch *a = m->arch;
    if (!qd_model_mlp_gated(m)) return a->lin_mlp0 + 1;
    return a->fused_gate_up ? a->lin_mlp0 + 1 : a->lin_mlp0 + 2;
}

int qd_model_mlp_out_group(const qd_model *m)
{
    int li = mlp_out_linear(m);
    return li < 0 ? -1 : m->lin[li].group;
}

int qd_block_mlp_finish(qd_model *m, const qd_block_weights *bw, const float *act, const float *x, float *y,
                        int64_t rows, qd_err *err)
{
    int li = mlp_out_linear(m);
    if (li < 0 || qd_model_block_is_moe(m, bw->block))
        return qd_err_set(err, QD_EINVAL, "MLP finish: block %d has experts, not one MLP", bw->block);
    return half_finish(m, bw, 1, li, act, x, y, rows, err);
}

/* The parallel block (Phi, GPT-NeoX with use_parallel_residual): attention and MLP both read
 * the block's input y, through the one shared norm 0 (Phi) or norms 0 and 1 (GPT-NeoX):
 * y = y + (attn + mlp), the order transformers adds them in (attn + mlp + residual). The
 * MLP's input is the norm of the block's input, not of the stream after attention, which is
 * why such a block has no halves for the pipeline to split (qd_model_group_part). */
static int parallel_forward(qd_model *m, const qd_block_weights *bw, float *y, float *xn, float *tmp, int64_t batch,
                            int64_t seq, const int32_t *pos_be, const qd_rope_freqs *rf, int64_t window,
                            const qd_block_hooks *hooks, qd_err *err)
{
    int64_t rows = batch * seq, n = rows * m->cfg.hidden;
    float *par = qd_model_scratch(m, QD_SCRATCH_PAR, (size_t)n * sizeof(float), err);
    if (!par) return QD_ENOMEM;
    BE_CALL(m, err, norm(m, xn, y, bw->norm_w[0], bw->norm_b[0], rows));
    int rc = attention(m, bw, xn, tmp, batch, seq, pos_be, rf, window, hooks, err);
    if (rc) return rc;
    if (bw->norm_w[1]) BE_CALL(m, err, norm(m, xn, y, bw->norm_w[1], bw->norm_b[1], rows));
    if ((rc = mlp(m, bw, xn, par, rows, hooks, err))) return rc;
    BE_CALL(m, err, m->be->ops->add(m->be, tmp, par, n));
    BE_CALL(m, err, m->be->ops->add(m->be, y, tmp, n));
    return 0;
}

/* x *= s over n floats, skipped at 1 (a product by 1 changes nothing). */
static int scale_by(qd_model *m, float *x, int64_t n, float s, qd_err *err)
{
    if (s != 1.0f) BE_CALL(m, err, m->be->ops->scale(m->be, x, n, s));
    return 0;
}

/* Falcon-H1 (FalconH1DecoderLayer): xn = input_layernorm(y); y = y + (mamba(xn * ssm_in) *
 * ssm_out + attn(xn * attn_in) * attn_out), the order transformers adds them in; then
 * y = y + mlp(pre_ff_layernorm(y)) * down (the gate multiplier is mlp()'s). The branches'
 * hooks see their own scaled inputs, which is why the block runs whole (parallel_block). */
static int falcon_h1_forward(qd_model *m, const qd_block_weights *bw, float *y, float *xn, float *tmp, int64_t batch,
                             int64_t seq, const int32_t *pos_be, const qd_rope_freqs *rf, int64_t window,
                             const qd_block_hooks *hooks, qd_err *err)
{
    const qd_falcon_mul *f = &m->cfg.falcon;
    int64_t rows = batch * seq, n = rows * m->cfg.hidden;
    float *par = qd_model_scratch(m, QD_SCRATCH_PAR, (size_t)n * sizeof(float), err);
    if (!par) return QD_ENOMEM;
    int rc;
    BE_CALL(m, err, norm(m, xn, y, bw->norm_w[0], NULL, rows));
    if ((rc = scale_by(m, xn, n, f->ssm_in, err)) || (rc = qd_mixer_forward(m, bw, xn, par, batch, seq, hooks, err)))
        return rc;
    BE_CALL(m, err, norm(m, xn, y, bw->norm_w[0], NULL, rows));   /* the same floats again, for attention */
    if ((rc = scale_by(m, xn, n, f->attn_in, err)) ||
        (rc = attention(m, bw, xn, tmp, batch, seq, pos_be, rf, window, hooks, err)) ||
        (rc = scale_by(m, par, n, f->ssm_out, err)) || (rc = scale_by(m, tmp, n, f->attn_out, err)))
        return rc;
    BE_CALL(m, err, m->be->ops->add(m->be, par, tmp, n));
    BE_CALL(m, err, m->be->ops->add(m->be, y, par, n));
    BE_CALL(m, err, norm(m, xn, y, bw->norm_w[1], NULL, rows));
    if ((rc = mlp(m, bw, xn, tmp, rows, hooks, err)) || (rc = scale_by(m, tmp, n, f->mlp_down, err))) return rc;
    BE_CALL(m, err, m->be->ops->add(m->be, y, tmp, n));
    return 0;
}

int qd_block_forward(qd_model *m, const qd_block_weights *bw, const float *x, float *y,
                     int64_t batch, int64_t seq, const int32_t *pos, const qd_block_hooks *hooks,
                     qd_err *err)
{
    return qd_block_forward_part(m, bw, QD_BLOCK_ALL, x, y, batch, seq, pos, hooks, err);
}

int qd_block_forward_part(qd_model *m, const qd_block_weights *bw, qd_block_part part, const float *x,
                          float *y, int64_t batch, int64_t seq, const int32_t *pos,
                          const qd_block_hooks *hooks, qd_err *err)
{
    const qd_model_config *c = &m->cfg;
    int64_t rows = batch * seq, hid = c->hidden;
    if (batch <= 0 || seq <= 0) return qd_err_set(err, QD_EINVAL, "block forward: batch %lld and seq %lld must be positive",
                                                  (long long)batch, (long long)seq);
    if (seq > qd_rope_max_seq(c))
        return qd_err_set(err, QD_EINVAL, "block forward: seq %lld is beyond max_position_embeddings %lld",
                          (long long)seq, (long long)qd_rope_max_seq(c));
    size_t hbytes = (size_t)(rows * hid) * sizeof(float);
    float *xn = qd_model_scratch(m, QD_SCRATCH_XN, hbytes, err);
    float *tmp = xn ? qd_model_scratch(m, QD_SCRATCH_TMP, hbytes, err) : NULL;
    int32_t *pos_be = tmp ? qd_model_scratch(m, QD_SCRATCH_POS, (size_t)rows * sizeof(int32_t), err) : NULL;
    if (!pos_be) return QD_ENOMEM;
    int32_t *ph = malloc((size_t)rows * sizeof *ph);
    if (!ph) return qd_err_set(err, QD_ENOMEM, "block forward: out of memory");
    int32_t max_p = 0, shifted = 0;
    for (int64_t r = 0; r < rows; r++) {
        ph[r] = pos ? pos[r % seq] : (int32_t)(r % seq);
        if (ph[r] > max_p) max_p = ph[r];
        shifted |= ph[r] != (int32_t)(r % seq);
    }
    /* Llama 4's chunks are counted from position 0 (transformers' chunked mask, no cache):
     * the forward splits a sequence at multiples of the chunk size, so positions must be 0..seq-1. */
    if (shifted && c->attn_chunk > 0 && bw->block < QD_CFG_MAX_LAYERS && c->layer_chunked[bw->block]) {
        free(ph);
        return qd_err_set(err, QD_EUNSUPPORTED, "block %d: chunked attention with positions other than 0..seq-1", bw->block);
    }
    /* This layer's attention window and RoPE's frequencies for this forward (dynamic and
     * LongRoPE depend on its length; Gemma 3's sliding layers have their own base). */
    int sliding = c->sliding_window > 0 && bw->block < QD_CFG_MAX_LAYERS && c->layer_sliding[bw->block];
    int nope = bw->block < QD_CFG_MAX_LAYERS && c->layer_nope[bw->block];
    int64_t window = sliding ? c->sliding_window : 0;
    qd_rope_freqs rf;
    int rc0 = c->family == QD_ARCH_LLAMA ? qd_rope_freqs_compute(c, sliding, (int64_t)max_p + 1, &rf, err) : 0;
    if (rc0) { free(ph); return rc0; }
    int rc = qd_backend_upload(m->be, pos_be, ph, (size_t)rows * sizeof *ph);
    free(ph);
    if (rc) return qd_err_set(err, rc, "block forward: upload: %s", m->be->err.msg);
    if (y != x) BE_CALL(m, err, m->be->ops->copy(m->be, y, x, hbytes));

    if (c->parallel_block) {
        if (part != QD_BLOCK_ALL)
            return qd_err_set(err, QD_EINVAL, "block %d: a parallel block (attention and MLP both read the block's input) "
                              "runs whole, not in halves", bw->block);
        if (c->layout == QD_LAYOUT_FALCON_H1)
            return falcon_h1_forward(m, bw, y, xn, tmp, batch, seq, pos_be, nope ? NULL : &rf, window, hooks, err);
        return parallel_forward(m, bw, y, xn, tmp, batch, seq, pos_be, nope ? NULL : &rf, window, hooks, err);
    }
    int pre = pre_ln(m);
    /* Pre-LN: y = x + attn(norm0(x)); y = y + mlp(norm1(y)).
     * Post-LN: y = norm0(x + attn(x)); y = norm1(y + mlp(y)).
     * Gemma and GLM-4 add norm2 and norm3 on each sub-block's output before the residual
     * add; OLMo 2/3 and EXAONE 4 have only those (no norm0, norm1: the stream itself goes in).
     * The residual stream between the two halves is what QD_BLOCK_ATTN returns and
     * QD_BLOCK_MLP takes. */
    if (part != QD_BLOCK_MLP) {
        const float *ain = y;
        if (pre && bw->norm_w[0]) { BE_CALL(m, err, norm(m, xn, y, bw->norm_w[0], bw->norm_b[0], rows)); ain = xn; }
        int kind = qd_model_block_mixer(m, bw->block);
        if (m->arch->mla)
            rc = qd_mla_forward(m, bw, ain, tmp, batch, seq, pos_be, &rf, hooks, err);
        else if (kind == QD_MIXER_GATED_DELTANET)   /* Qwen3-Next, Qwen3.5 */
            rc = qd_gdn_forward(m, bw, ain, tmp, batch, seq, hooks, err);
        else if (kind == QD_MIXER_MAMBA2 || kind == QD_MIXER_SHORT_CONV)   /* Granite-4.0-H, LFM2 */
            rc = qd_mixer_forward(m, bw, ain, tmp, batch, seq, hooks, err);
        else
            rc = attention(m, bw, ain, tmp, batch, seq, pos_be, c->family == QD_ARCH_LLAMA && !nope ? &rf : NULL, window,
                           hooks, err);
        if (rc || (rc = half_tail(m, bw, 0, y, tmp, rows, pre, err))) return rc;
    }
    if (part == QD_BLOCK_ATTN) return 0;

    const float *min = y;
    if (pre && bw->norm_w[1]) { BE_CALL(m, err, norm(m, xn, y, bw->norm_w[1], bw->norm_b[1], rows)); min = xn; }
    rc = qd_model_block_is_moe(m, bw->block) ? qd_moe_forward(m, bw, min, tmp, rows, hooks, err)
                                             : mlp(m, bw, min, tmp, rows, hooks, err);
    if (rc) return rc;
    if (m->arch->moe_beside_mlp && qd_model_block_is_moe(m, bw->block)) {
        /* Granite-4: moe(x) + shared_mlp(x), the order GraniteMoeHybridDecoderLayer adds them. */
        float *sh = qd_model_scratch(m, QD_SCRATCH_MOE_Y, (size_t)(rows * c->hidden) * sizeof(float), err);
        if (!sh) return QD_ENOMEM;
        if ((rc = mlp(m, bw, min, sh, rows, hooks, err))) return rc;
        BE_CALL(m, err, m->be->ops->add(m->be, tmp, sh, rows * c->hidden));
    }
    return half_tail(m, bw, 1, y, tmp, rows, pre, err);
}

int qd_model_logits(qd_model *m, const float *h, int64_t rows, float *logits, qd_err *err)
{
    const qd_model_config *c = &m->cfg;
    int64_t hid = c->hidden, pd = c->word_embed_proj_dim, V = c->vocab;
    const float *hn = h;
    if (m->final_w) {
        float *xn = qd_model_scratch(m, QD_SCRATCH_XN, (size_t)(rows * hid) * sizeof(float), err);
        if (!xn) return QD_ENOMEM;
        BE_CALL(m, err, norm(m, xn, h, m->final_w, m->final_b, rows));
        hn = xn;
    }
    if (m->proj_out) {
        float *t = qd_model_scratch(m, QD_SCRATCH_TMP, (size_t)(rows * pd) * sizeof(float), err);
        if (!t) return QD_ENOMEM;
        BE_CALL(m, err, qd_linear_forward(m->be, hn, rows, m->proj_out, NULL, pd, hid, t));
        hn = t;
    }
    if (m->lm_head) {
        BE_CALL(m, err, m->be->ops->gemm(m->be, 0, 1, rows, V, pd, 1.0f, hn, pd, m->lm_head, pd, 0.0f, logits, V));
        if (m->lm_bias) BE_CALL(m, err, m->be->ops->add_bias(m->be, logits, m->lm_bias, rows, V));
        if (c->logit_scale > 0) BE_CALL(m, err, m->be->ops->scale(m->be, logits, rows * V, c->logit_scale));
        if (c->final_softcap > 0) BE_CALL(m, err, m->be->ops->softcap(m->be, logits, rows * V, c->final_softcap));
        return 0;
    }
    /* Large vocabularies: convert lm_head a chunk of rows at a time. */
    const st_tensor *t = m->t_lm_head;
    size_t esz = qd_dtype_size(t->dtype);
    int64_t ch = m->lm_chunk;
    float *dev = qd_model_scratch(m, QD_SCRATCH_LM, (size_t)(ch * pd) * sizeof(float), err);
    if (!dev) return QD_ENOMEM;
    float *host = m->be->device < 0 ? dev : malloc((size_t)(ch * pd) * sizeof *host);
    if (!host) return qd_err_set(err, QD_ENOMEM, "lm_head: out of memory");
    int rc = 0;
    for (int64_t v0 = 0; v0 < V && !rc; v0 += ch) {
        int64_t n = V - v0 < ch ? V - v0 : ch;
        rc = qd_convert_to_f32(t->dtype, (const char *)t->data + (size_t)v0 * pd * esz, host, (size_t)(n * pd));
        if (!rc && host != dev) rc = qd_backend_upload(m->be, dev, host, (size_t)(n * pd) * sizeof *host);
        if (!rc) rc = m->be->ops->gemm(m->be, 0, 1, rows, n, pd, 1.0f, hn, pd, dev, pd, 0.0f, logits + v0, V);
        if (rc) qd_err_set(err, rc, "lm_head rows [%lld, %lld): %s", (long long)v0, (long long)(v0 + n), m->be->err.msg);
    }
    if (host != dev) free(host);
    if (!rc && m->lm_bias && (rc = m->be->ops->add_bias(m->be, logits, m->lm_bias, rows, V)))
        qd_err_set(err, rc, "lm_head bias: %s", m->be->err.msg);
    if (!rc && c->logit_scale > 0 && (rc = m->be->ops->scale(m->be, logits, rows * V, c->logit_scale)))
        qd_err_set(err, rc, "logit scale: %s", m->be->err.msg);
    if (!rc && c->final_softcap > 0 && (rc = m->be->ops->softcap(m->be, logits, rows * V, c->final_softcap)))
        qd_err_set(err, rc, "final logit soft-cap: %s", m->be->err.msg);
    return rc;
}

int qd_model_forward(qd_model *m, const int32_t *ids, int64_t batch, int64_t seq, float *logits_host, qd_err *err)
{
    const qd_model_config *c = &m->cfg;
    int64_t rows = batch * seq;
    qd_backend *be = m->be;
    float *h = qd_backend_alloc(be, (size_t)(rows * c->hidden) * sizeof(float));
    float *lg = h ? qd_backend_alloc(be, (size_t)(rows * c->vocab) * sizeof(float)) : NULL;
    if (!lg) { qd_backend_free(be, h); return qd_err_set(err, QD_ENOMEM, "forward: cannot allocate activations for %lld rows", (long long)rows); }
    int rc = qd_model_embed(m, ids, batch, seq, NULL, h, err);
    for (int b = 0; b < c->n_layers && !rc; b++) {
        qd_block_weights *bw = NULL;
        if ((rc = qd_block_load(m, b, &bw, err))) break;
        rc = qd_block_forward(m, bw, h, h, batch, seq, NULL, NULL, err);
        qd_block_free(m, bw);
    }
    if (!rc) rc = qd_model_logits(m, h, rows, lg, err);
    if (!rc && (rc = qd_backend_download(be, logits_host, lg, (size_t)(rows * c->vocab) * sizeof(float))))
        qd_err_set(err, rc, "forward: download: %s", be->err.msg);
    qd_backend_free(be, h);
    qd_backend_free(be, lg);
    return rc;
}
