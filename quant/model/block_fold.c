/* Folding per-channel scales into a block (see block.h, qd_block_fold_scales): the rule
 * each input group follows comes from the architecture table (qd_input_group.prev_*), so
 * every family folds through this one function. */
#include <stdlib.h>
#include <string.h>

#include "quant/model/model_internal.h"

int qd_block_fold_scales(qd_model *m, qd_block_weights *bw, int g, const float *s, qd_err *err)
{
    const qd_input_group *G = qd_model_group(m, g);
    const qd_model_config *c = &m->cfg;
    if (!G) return qd_err_set(err, QD_EINVAL, "fold: group %d is outside [0, %d)", g, m->n_grp);
    if (!qd_model_block_has_linear(m, bw->block, G->linears[0]))
        return qd_err_set(err, QD_EINVAL, "fold: block %d has no %s (a %s layer)", bw->block, G->name,
                          qd_model_block_is_moe(m, bw->block) ? "MoE" : "dense");
    if (G->prev_kind == QD_PREV_NONE)
        return qd_err_set(err, QD_EUNSUPPORTED, "fold: %s has no operator before it to fold into", G->name);
    int64_t K = G->k, rep = 1;
    if (G->prev_kind == QD_PREV_LINEAR && G->prev_rows != K) {
        /* Grouped-query attention: v's output channel (kv, d) feeds o_proj's input channels
         * (h, d) of the heads h = kv * rep .. kv * rep + rep - 1 (HF's repeat_kv). */
        int gqa = c->n_kv_heads > 0 && c->n_heads % c->n_kv_heads == 0 && G->prev_rows == c->n_kv_heads * c->head_dim &&
                  K == c->n_heads * c->head_dim;
        if (!gqa)
            return qd_err_set(err, QD_EUNSUPPORTED, "fold: %s gives %lld channels to %s's %lld", G->prev, (long long)G->prev_rows,
                              G->name, (long long)K);
        rep = c->n_heads / c->n_kv_heads;
        for (int64_t ch = 0; ch < K; ch++) {
            int64_t h = ch / c->head_dim, d = ch % c->head_dim, first = (h / rep) * rep * c->head_dim + d;
            if (s[ch] != s[first])
                return qd_err_set(err, QD_EINVAL, "fold: %s scales differ within a KV head's channel class (%lld, %lld)",
                                  G->name, (long long)first, (long long)ch);
        }
    }
    qd_backend *be = m->be;
    int rc = 0;
    for (int j = 0; j < G->n_linears && !rc; j++) {
        const qd_linear_info *L = &m->lin[G->linears[j]];
        if ((rc = be->ops->scale_cols(be, bw->w[G->linears[j]], L->n, K, s, 0)))
            rc = qd_err_set(err, rc, "fold: %s: %s", L->name, be->err.msg);
    }
    if (rc) return rc;
    if (G->prev_kind == QD_PREV_NORM) {
        /* The norm's multipliers (Gemma: 1 + w) and bias divide by s. */
        int has_b = qd_model_norm_has_bias(m);
        float *nw = malloc((size_t)K * sizeof(float) * 2), *nb = nw ? nw + K : NULL;
        if (!nw) return qd_err_set(err, QD_ENOMEM, "fold: out of memory");
        rc = qd_block_norm_get(m, bw, G->prev_index, nw, has_b ? nb : NULL, err);
        for (int64_t i = 0; i < K && !rc; i++) { nw[i] /= s[i]; if (has_b) nb[i] /= s[i]; }
        if (!rc) rc = qd_block_norm_set(m, bw, G->prev_index, nw, has_b ? nb : NULL, err);
        free(nw);
        return rc;
    }
    const qd_linear_info *prev = &m->lin[G->prev_index];
    float *pw = malloc((size_t)(prev->n * prev->k) * sizeof(float));
    float *pb = prev->has_bias ? malloc((size_t)prev->n * sizeof(float)) : NULL;
    if (!pw || (prev->has_bias && !pb)) rc = qd_err_set(err, QD_ENOMEM, "fold: out of memory");
    if (!rc) rc = qd_block_linear_get(m, bw, G->prev_index, pw, pb, err);
    for (int64_t i = 0; i < G->prev_rows && !rc; i++) {
        /* prev's output row0 + i feeds input channel i, or under GQA the channels of its
         * class, which share one scale: the first is that of head kv * rep. A fused prev
         * (Phi-3's qkv_proj, gate_up_proj) has other outputs before row0, untouched. */
        int64_t r = G->prev_row0 + i;
        int64_t ch = rep == 1 ? i : (i / c->head_dim) * rep * c->head_dim + i % c->head_dim;
        for (int64_t j = 0; j < prev->k; j++) pw[r * prev->k + j] /= s[ch];
        if (pb) pb[r] /= s[ch];
    }
    if (!rc) rc = qd_block_linear_set(m, bw, G->prev_index, pw, pb, err);
    free(pw);
    free(pb);
    return rc;
}

int qd_block_fold_moe_input(qd_model *m, qd_block_weights *bw, const float *s, qd_err *err)
{
    const qd_model_config *c = &m->cfg;
    const char *nn = qd_model_norm_name(m, 1);
    if (!qd_model_block_is_moe(m, bw->block) || !nn || strcmp(nn, "post_attention_layernorm") != 0)
        return qd_err_set(err, QD_EUNSUPPORTED, "fold: block %d has no experts behind post_attention_layernorm", bw->block);
    qd_backend *be = m->be;
    const int64_t K = c->hidden;
    int rc = 0;
    /* Every expert's (and the shared expert's) gate and up read the normed input: the
     * linears of the expert groups whose input is hidden wide. */
    for (int li = 0; li < m->n_lin && !rc; li++) {
        const qd_linear_info *L = &m->lin[li];
        if (L->expert == -1 || !qd_model_block_has_linear(m, bw->block, li)) continue;
        if (m->grp[L->group].n_linears != 2) continue;   /* down (its group's only linear): reads act(gate) * up */
        if ((rc = be->ops->scale_cols(be, bw->w[li], L->n, K, s, 0)))
            rc = qd_err_set(err, rc, "fold: %s: %s", L->name, be->err.msg);
    }
    /* Granite's shared_mlp beside the experts reads it too: its input linears' columns. */
    for (int li = 0; li < m->n_lin && !rc && m->arch->moe_beside_mlp; li++) {
        const qd_linear_info *L = &m->lin[li];
        if (L->expert != -1 || li < m->arch->lin_mlp0 || L->group != m->lin[m->arch->lin_mlp0].group) continue;
        if ((rc = be->ops->scale_cols(be, bw->w[li], L->n, K, s, 0)))
            rc = qd_err_set(err, rc, "fold: %s: %s", L->name, be->err.msg);
    }
    /* The router (and Qwen2-MoE's shared-expert gate) read it too: their columns take s,
     * so the logits, and with them the routing, are unchanged. */
    if (!rc && bw->router_w && (rc = be->ops->scale_cols(be, bw->router_w, c->n_experts, K, s, 0)))
        rc = qd_err_set(err, rc, "fold: router: %s", be->err.msg);
    if (!rc && bw->shared_gate_w && (rc = be->ops->scale_cols(be, bw->shared_gate_w, 1, K, s, 0)))
        rc = qd_err_set(err, rc, "fold: shared expert gate: %s", be->err.msg);
    if (rc) return rc;
    /* A LayerNorm's output is xn * w + b: both divided (PhiMoE). */
    int has_b = qd_model_norm_has_bias(m);
    float *nw = malloc((size_t)K * 2 * sizeof(float)), *nb = nw ? nw + K : NULL;
    if (!nw) return qd_err_set(err, QD_ENOMEM, "fold: out of memory");
    rc = qd_block_norm_get(m, bw, 1, nw, has_b ? nb : NULL, err);
    for (int64_t i = 0; i < K && !rc; i++) {
        nw[i] /= s[i];
        if (has_b) nb[i] /= s[i];
    }
    if (!rc) rc = qd_block_norm_set(m, bw, 1, nw, has_b ? nb : NULL, err);
    free(nw);
    return rc;
}
