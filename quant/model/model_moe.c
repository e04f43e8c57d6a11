/* The mixture-of-experts MLP (Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V2/V3), as
 * transformers computes it: router logits = xn R^T in float; the scores p = softmax(logits)
 * in float32 (DeepSeek-V3: sigmoid(logits)); the top_k experts of each token by a choice
 * score — p itself, except that DeepSeek-V3 adds e_score_correction_bias, and DeepSeek's
 * grouped routings first keep only the topk_group best of n_group groups (V3: a group
 * scores the sum of its two best biased scores; V2 group_limited_greedy: its best); the
 * weights are the chosen p, renormalised where the family does (Mixtral always, Qwen and
 * V3 with norm_topk_prob), times routed_scaling_factor (DeepSeek); each expert e runs its
 * SwiGLU on the tokens routed to it and adds weight * output into those tokens' rows,
 * experts in index order (PhiMoE's sparsemixer picks and weighs its two experts its own
 * way, sparsemixer_row); Qwen2-MoE adds the shared expert's output scaled by
 * sigmoid(xn . shared_expert_gate), DeepSeek its shared experts' output unscaled.
 * Llama 4 (QD_MOE_SIGMOID_INPUT) chooses the top_k largest logits and scales each chosen
 * expert's INPUT by sigmoid(logit) (Llama4TextMoe: routed_in = x * score), adding the
 * outputs unweighted; its shared expert is ungated. With qd_model_set_moe_calibrate_all an
 * expert then runs on every token scaled by that token's sigmoid of its own logit, which is
 * what it sees where chosen.
 *
 * Routing is decided on the host (rows x n_experts floats); everything else stays on the
 * backend: each expert's rows are gathered there (gather_rows), its GEMMs run on them, and
 * its output is added into the block's output weighted (scatter_add_rows), so what crosses
 * between host and device per expert is its token list and weights (n int32 + n float),
 * not its rows — one transfer per expert on a GPU, not three of n x hidden. With input hooks and qd_model_set_moe_calibrate_all, every
 * expert also runs on every token so its hooks see all of them; only the routed rows reach
 * the output, so the block computes the same function either way. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quant/model/model_internal.h"

#define BE_TRY(m, err, what, call) do { int _rc = (call); \
    if (_rc) { rc = qd_err_set((err), _rc, "%s: %s", (what), (m)->be->err.msg); goto done; } } while (0)

typedef struct moe_route {
    int32_t *expert;   /* [rows, top_k] chosen experts */
    float *weight;     /* [rows, top_k] their weights */
    int64_t *count;    /* [n_experts] tokens routed to each */
} moe_route;

/* DeepSeek's grouped choice: each group's score (V3: the sum of its two best choice scores;
 * V2: its best), the topk_group best groups kept, every expert of the others masked out
 * (-inf; V2 masks to 0, which chooses the same since its softmax scores are positive and
 * the kept groups hold top_k experts, checked by the config). */
static void mask_groups(const qd_model_config *c, float *choice)
{
    int64_t G = c->n_group, per = c->n_experts / G;
    int top2 = c->moe_scoring == QD_MOE_SIGMOID_GROUPED;
    float gs[QD_MAX_EXPERTS];
    unsigned char keep[QD_MAX_EXPERTS];
    for (int64_t g = 0; g < G; g++) {
        float a = -INFINITY, b = -INFINITY;   /* best, second best */
        for (int64_t i = 0; i < per; i++) {
            float v = choice[g * per + i];
            if (v > a) { b = a; a = v; } else if (v > b) { b = v; }
        }
        gs[g] = top2 ? a + b : a;
        keep[g] = 0;
    }
    for (int64_t j = 0; j < c->topk_group; j++) {
        int64_t best = -1;
        for (int64_t g = 0; g < G; g++)
            if (!keep[g] && (best < 0 || gs[g] > gs[best])) best = g;
        if (best >= 0) keep[best] = 1;
    }
    for (int64_t g = 0; g < G; g++)
        for (int64_t i = 0; !keep[g] && i < per; i++) choice[g * per + i] = -INFINITY;
}

/* gpt-oss's router on token t's logits l: the top_k largest of l + bias (F.linear's bias;
 * ties to the lower index), then the softmax over those k alone (max first, as torch). */
static void topk_softmax_row(const qd_model_config *c, const float *l, const float *bias, int64_t t, moe_route *r)
{
    int64_t E = c->n_experts, K = c->top_k;
    float v[QD_MAX_EXPERTS], mx = -INFINITY, sum = 0.0f;
    for (int64_t j = 0; j < K; j++) {
        int64_t best = -1;
        for (int64_t e = 0; e < E; e++) {
            int taken = 0;
            for (int64_t i = 0; i < j && !taken; i++) taken = r->expert[t * K + i] == e;
            float x = l[e] + (bias ? bias[e] : 0.0f);
            if (!taken && (best < 0 || x > v[j])) { best = e; v[j] = x; }
        }
        r->expert[t * K + j] = (int32_t)best;
        r->count[best]++;
        mx = v[j] > mx ? v[j] : mx;
    }
    for (int64_t j = 0; j < K; j++) { v[j] = expf(v[j] - mx); sum += v[j]; }
    for (int64_t j = 0; j < K; j++) r->weight[t * K + j] = v[j] / sum;
}

/* PhiMoE's sparsemixer in eval mode (transformers' modeling_phimoe.py) on token t's logits
 * s: the first pick is the largest logit m (ties to the lower index); its weight is its
 * softmax probability among the logits not masked, a logit s_j being masked when
 * (m - s_j) / max(|s_j|, m) > 2 eps. The second pick repeats this over the logits with the
 * first set to -inf (its threshold still divides by the original |s_j|). No renormalisation:
 * the two weights are those probabilities. Division and comparison as torch's float32 (a
 * 0/0 or x/0 compares false or as the infinity it is). */
static float sparsemixer_pick(const float *s, const float *masked, int64_t E, float eps, int64_t *pick)
{
    int64_t best = 0;
    for (int64_t e = 1; e < E; e++)
        if (masked[e] > masked[best]) best = e;
    float m = masked[best], sum = 0.0f;
    for (int64_t e = 0; e < E; e++) {
        float factor = fabsf(s[e]) > m ? fabsf(s[e]) : m;
        if (masked[e] == -INFINITY || (m - s[e]) / factor > 2.0f * eps) continue;
        sum += expf(masked[e] - m);
    }
    *pick = best;
    return 1.0f / sum;   /* exp(m - m) over the sum */
}

static void sparsemixer_row(const qd_model_config *c, const float *s, int64_t t, moe_route *r)
{
    int64_t E = c->n_experts, first = 0, second = 0;
    float masked[QD_MAX_EXPERTS];
    memcpy(masked, s, (size_t)E * sizeof *masked);
    float w1 = sparsemixer_pick(s, masked, E, c->router_jitter, &first);
    masked[first] = -INFINITY;
    float w2 = sparsemixer_pick(s, masked, E, c->router_jitter, &second);
    r->expert[t * 2] = (int32_t)first;
    r->expert[t * 2 + 1] = (int32_t)second;
    r->weight[t * 2] = w1;
    r->weight[t * 2 + 1] = w2;
    r->count[first]++;
    r->count[second]++;
}

/* The router's weights per token: softmax over the logits (float32, as torch's
 * softmax(dtype=float)) or DeepSeek-V3's sigmoid with the biased grouped choice; the
 * top_k largest choice scores (ties to the lower index), renormalised when asked, times
 * routed_scale. bias: e_score_correction_bias (host) or NULL. */
static int route_rows(const qd_model_config *c, const float *lg, const float *bias, int64_t rows, moe_route *r)
{
    int64_t E = c->n_experts, K = c->top_k;
    int sig = c->moe_scoring == QD_MOE_SIGMOID_GROUPED;
    float *p = malloc((size_t)E * sizeof *p), *choice = malloc((size_t)E * sizeof *choice);
    if (!p || !choice) { free(p); free(choice); return QD_ENOMEM; }
    memset(r->count, 0, (size_t)E * sizeof *r->count);
    for (int64_t t = 0; t < rows; t++) {
        const float *l = lg + t * E;
        if (c->moe_scoring == QD_MOE_TOPK_SOFTMAX) {
            topk_softmax_row(c, l, bias, t, r);
            continue;
        }
        if (c->moe_scoring == QD_MOE_SPARSEMIXER) {
            sparsemixer_row(c, l, t, r);
            continue;
        }
        if (c->moe_scoring == QD_MOE_SIGMOID_INPUT) {
            /* Chosen by the logits (the sigmoid saturates: equal scores, distinct logits). */
            for (int64_t e = 0; e < E; e++) {
                p[e] = 1.0f / (1.0f + expf(-l[e]));
                choice[e] = l[e];
            }
        } else if (sig) {
            for (int64_t e = 0; e < E; e++) {
                p[e] = 1.0f / (1.0f + expf(-l[e]));
                choice[e] = p[e] + (bias ? bias[e] : 0.0f);
            }
            mask_groups(c, choice);
        } else {
            float mx = l[0], sum = 0.0f;
            for (int64_t e = 1; e < E; e++) mx = l[e] > mx ? l[e] : mx;
            for (int64_t e = 0; e < E; e++) { p[e] = expf(l[e] - mx); sum += p[e]; }
            for (int64_t e = 0; e < E; e++) choice[e] = p[e] /= sum;
            if (c->moe_scoring == QD_MOE_SOFTMAX_GROUPED) mask_groups(c, choice);
            /* ERNIE: the bias moves the choice only, as V3's does. */
            for (int64_t e = 0; bias && c->moe_scoring == QD_MOE_SOFTMAX_BIAS && e < E; e++) choice[e] = p[e] + bias[e];
        }
        float tsum = 0.0f;
        for (int64_t j = 0; j < K; j++) {
            int64_t best = -1;
            for (int64_t e = 0; e < E; e++) {
                int taken = 0;
                for (int64_t i = 0; i < j && !taken; i++) taken = r->expert[t * K + i] == e;
                if (!taken && (best < 0 || choice[e] > choice[best])) best = e;
            }
            r->expert[t * K + j] = (int32_t)best;
            r->weight[t * K + j] = p[best];
            tsum += p[best];
            r->count[best]++;
        }
        /* transformers' DeepSeek-V3 router divides by the sum + 1e-20; Mixtral and Qwen by the sum. */
        if (c->norm_topk_prob)
            for (int64_t j = 0; j < K; j++) r->weight[t * K + j] /= sig ? tsum + 1e-20f : tsum;
        if (c->routed_scale != 1.0f)
            for (int64_t j = 0; j < K; j++) r->weight[t * K + j] *= c->routed_scale;
    }
    free(p);
    free(choice);
    return 0;
}

/* Whether the expert of groups g0, g0 + 1 runs at all (hooks->want, block.h). */
static int expert_wanted(const qd_block_hooks *hooks, int g0)
{
    return !hooks || !hooks->want || hooks->want[g0] || hooks->want[g0 + 1];
}

/* One expert (gate, up, down linears from l0) on x [n, hidden] → y [n, hidden], with its
 * two input hooks (groups g0, g0 + 1). f1, f2: [n, ff] scratch. *full: y was computed (with
 * hooks->want, only up to the last input that matters: y is then not written). */
static int expert_run(qd_model *m, const qd_block_weights *bw, int l0, int g0, const float *x, int64_t n, float *f1,
                      float *f2, float *y, const qd_block_hooks *hooks, int *full, qd_err *err)
{
    int64_t ff = m->lin[l0].n;
    const int *want = hooks ? hooks->want : NULL;
    int rc;
    *full = 0;
    if ((rc = qd_fwd_call_input(m, bw, g0, x, n, hooks, err))) return rc;
    if (want && !want[g0 + 1]) return 0;
    if ((rc = qd_fwd_linear_part(m, bw, l0, 0, ff, x, n, f1, hooks, err)) ||
        (rc = qd_fwd_linear_part(m, bw, l0 + 1, 0, ff, x, n, f2, hooks, err)))
        return rc;
    const qd_model_config *c = &m->cfg;
    if (c->swiglu_limit > 0.0f)   /* gpt-oss's clamped SwiGLU */
        rc = m->be->ops->swiglu_clamp_mul(m->be, f1, f1, f2, n * ff, c->swiglu_alpha, c->swiglu_limit);
    else
        rc = m->be->ops->silu_mul(m->be, f1, f1, f2, n * ff);
    if (rc) return qd_err_set(err, rc, "block %d %s: activation: %s", bw->block, m->lin[l0].name, m->be->err.msg);
    if ((rc = qd_fwd_call_input(m, bw, g0 + 1, f1, n, hooks, err))) return rc;
    if (want) return 0;
    if ((rc = qd_fwd_linear_part(m, bw, l0 + 2, 0, m->cfg.hidden, f1, n, y, hooks, err))) return rc;
    *full = 1;
    return 0;
}

/* The host staging of one expert's token list for one upload: n row numbers (int32), then
 * their n weights (float), so the device copy is idx = stage, w = stage + n. */
static void stage_weights(int32_t *stage, int64_t n, int64_t i, float w) { memcpy(stage + n + i, &w, sizeof w); }

/* Llama 4's expert e (lines l0, groups g0): its input rows scaled by the router's sigmoid,
 * z[i] = s_i xn[src_i], the expert on z, and its output rows added unweighted into out at
 * the routed rows idx[0..n). Routed only: src = idx, s = the routing weights; calibrating
 * every expert (all): src = every row, s_t = sigmoid(logit of e at t), and the routed rows'
 * outputs are picked from the whole. One upload: idx, ones (n each), src, s, iota (cnt each). */
static int sigmoid_input_expert(qd_model *m, const qd_block_weights *bw, int64_t e, const float *xn, float *out,
                                int64_t rows, const float *lg, const int32_t *stage, int64_t n, int all,
                                int32_t *ix_be, int32_t *host, float *f1, float *f2, const qd_block_hooks *hooks,
                                qd_err *err)
{
    qd_backend *be = m->be;
    int64_t E = m->cfg.n_experts, H = m->cfg.hidden, cnt = all ? rows : n;
    int l0 = m->lin_exp0 + 3 * (int)e, g0 = m->grp_exp0 + 2 * (int)e, rc = 0, full = 0;
    float one = 1.0f;
    float *z = qd_model_scratch(m, QD_SCRATCH_MOE_Z, (size_t)(rows * H) * sizeof(float), err);
    float *xe = z ? qd_model_scratch(m, QD_SCRATCH_MOE_X, (size_t)(rows * H) * sizeof(float), err) : NULL;
    float *ye = xe ? qd_model_scratch(m, QD_SCRATCH_MOE_Y, (size_t)(rows * H) * sizeof(float), err) : NULL;
    if (!ye) return QD_ENOMEM;
    for (int64_t i = 0; i < n; i++) { host[i] = stage[i]; memcpy(host + n + i, &one, sizeof one); }
    for (int64_t i = 0; i < cnt; i++) {
        int32_t t = all ? (int32_t)i : stage[i];
        float s;
        if (all) s = 1.0f / (1.0f + expf(-lg[(int64_t)t * E + e]));
        else memcpy(&s, stage + n + i, sizeof s);
        host[2 * n + i] = t;
        memcpy(host + 2 * n + cnt + i, &s, sizeof s);
        host[2 * n + 2 * cnt + i] = (int32_t)i;
    }
    const int32_t *idx = ix_be, *src = ix_be + 2 * n, *iota = ix_be + 2 * n + 2 * cnt;
    const float *ones = (const float *)(ix_be + n), *sc = (const float *)(ix_be + 2 * n + cnt);
    if ((rc = qd_backend_upload(be, ix_be, host, (size_t)(2 * n + 3 * cnt) * sizeof(int32_t))) ||
        (rc = be->ops->gather_rows(be, xe, xn, rows, src, cnt, H)) ||
        (rc = be->ops->memset0(be, z, (size_t)(cnt * H) * sizeof(float))) ||
        (rc = be->ops->scatter_add_rows(be, z, cnt, xe, iota, sc, cnt, H)))
        return qd_err_set(err, rc, "block %d expert %lld: scaled input: %s", bw->block, (long long)e, be->err.msg);
    if ((rc = expert_run(m, bw, l0, g0, z, cnt, f1, f2, ye, hooks, &full, err)) || !full) return rc;
    const float *y = ye;
    if (all && n > 0) {
        if ((rc = be->ops->gather_rows(be, xe, ye, rows, idx, n, H)))
            return qd_err_set(err, rc, "block %d expert %lld: gather: %s", bw->block, (long long)e, be->err.msg);
        y = xe;
    }
    if (n > 0 && (rc = be->ops->scatter_add_rows(be, out, rows, y, idx, ones, n, H)))
        return qd_err_set(err, rc, "block %d expert %lld: scatter: %s", bw->block, (long long)e, be->err.msg);
    return 0;
}

int qd_moe_forward(qd_model *m, const qd_block_weights *bw, const float *xn, float *out, int64_t rows,
                   const qd_block_hooks *hooks, qd_err *err)
{
    const qd_model_config *c = &m->cfg;
    const qd_arch *a = m->arch;
    qd_backend *be = m->be;
    int64_t E = c->n_experts, K = c->top_k, H = c->hidden;
    float bias[QD_MAX_EXPERTS];
    int64_t ff = c->moe_intermediate > c->shared_intermediate ? c->moe_intermediate : c->shared_intermediate;
    int all = hooks && hooks->input && m->moe_calibrate_all;
    /* The staging holds a token list and its weights (Llama 4: five lists, sigmoid_input_expert). */
    size_t hb = (size_t)(rows * H) * sizeof(float), sb = (size_t)rows * 5 * sizeof(int32_t);
    float *lg_be = qd_model_scratch(m, QD_SCRATCH_MOE_R, (size_t)(rows * (E + 1)) * sizeof(float), err);
    float *xe = lg_be ? qd_model_scratch(m, QD_SCRATCH_MOE_X, hb, err) : NULL;
    float *ye = xe ? qd_model_scratch(m, QD_SCRATCH_MOE_Y, hb, err) : NULL;
    float *f1 = ye ? qd_model_scratch(m, QD_SCRATCH_F1, (size_t)(rows * ff) * sizeof(float), err) : NULL;
    float *f2 = f1 ? qd_model_scratch(m, QD_SCRATCH_F2, (size_t)(rows * ff) * sizeof(float), err) : NULL;
    int32_t *ix_be = f2 ? qd_model_scratch(m, QD_SCRATCH_MOE_I, sb, err) : NULL;
    if (!ix_be) return QD_ENOMEM;
    moe_route r = {malloc((size_t)(rows * K) * sizeof(int32_t)), malloc((size_t)(rows * K) * sizeof(float)),
                   malloc((size_t)E * sizeof(int64_t))};
    float *lg = malloc((size_t)(rows * E) * sizeof(float));
    int32_t *stage = malloc(sb), *stage2 = malloc(sb);
    int rc = 0;
    if (!r.expert || !r.weight || !r.count || !lg || !stage || !stage2) {
        rc = qd_err_set(err, QD_ENOMEM, "block %d: out of memory for the experts' routing", bw->block);
        goto done;
    }
    /* Router: logits in float, decided on the host. */
    BE_TRY(m, err, "router", be->ops->gemm(be, 0, 1, rows, E, H, 1.0f, xn, H, bw->router_w, H, 0.0f, lg_be, E));
    BE_TRY(m, err, "router: download", qd_backend_download(be, lg, lg_be, (size_t)(rows * E) * sizeof(float)));
    if (bw->router_bias)
        BE_TRY(m, err, "router bias: download", qd_backend_download(be, bias, bw->router_bias, (size_t)E * sizeof(float)));
    if (route_rows(c, lg, bw->router_bias ? bias : NULL, rows, &r)) {
        rc = qd_err_set(err, QD_ENOMEM, "block %d: out of memory for the experts' routing", bw->block);
        goto done;
    }
    if (hooks && hooks->routed) hooks->routed(hooks->ud, bw->block, r.count, (int)E);
    /* out accumulates the experts' weighted outputs, experts in index order. */
    BE_TRY(m, err, "experts: clear", be->ops->memset0(be, out, hb));
    for (int64_t e = 0; e < E && !rc; e++) {
        int l0 = m->lin_exp0 + 3 * (int)e, g0 = m->grp_exp0 + 2 * (int)e, full = 0;
        if (!expert_wanted(hooks, g0)) continue;   /* before its token list: a pass may skip hundreds */
        /* The tokens routed to e, in row order, and their weights. A token's top_k experts
         * are distinct (route_rows), so r.count[e] is their number and the list holds each
         * row once, as scatter_add_rows requires. */
        int64_t n = 0, cnt = r.count[e];
        for (int64_t t = 0; t < rows; t++)
            for (int64_t j = 0; j < K; j++)
                if (r.expert[t * K + j] == e) { stage[n] = (int32_t)t; stage_weights(stage, cnt, n, r.weight[t * K + j]); n++; }
        if (n == 0 && !all) continue;
        if (c->moe_scoring == QD_MOE_SIGMOID_INPUT) {
            if ((rc = sigmoid_input_expert(m, bw, e, xn, out, rows, lg, stage, n, all, ix_be, stage2, f1, f2, hooks, err))) goto done;
            continue;
        }
        const int32_t *idx = ix_be;
        const float *w = (const float *)(ix_be + n);
        if (n > 0) BE_TRY(m, err, "experts: upload", qd_backend_upload(be, ix_be, stage, (size_t)n * 2 * sizeof(int32_t)));
        const float *x = xn, *y = ye;
        if (!all) {
            BE_TRY(m, err, "experts: gather", be->ops->gather_rows(be, xe, xn, rows, idx, n, H));
            x = xe;
        }
        if ((rc = expert_run(m, bw, l0, g0, x, all ? rows : n, f1, f2, ye, hooks, &full, err))) goto done;
        if (!full) continue;
        if (all && n > 0) {
            /* Every token ran; only the routed rows reach the output (xe is free here). */
            BE_TRY(m, err, "experts: gather", be->ops->gather_rows(be, xe, ye, rows, idx, n, H));
            y = xe;
        }
        BE_TRY(m, err, "experts: scatter", be->ops->scatter_add_rows(be, out, rows, y, idx, w, n, H));
    }
    if (c->shared_intermediate > 0) {
        /* Qwen2-MoE: + sigmoid(xn . shared_expert_gate) * shared_expert(xn), on every token
         * (a scatter-add onto rows 0..rows-1 with the gates as weights); DeepSeek:
         * + shared_experts(xn), ungated. */
        int l0 = m->lin_exp0 + 3 * (int)E, g0 = m->grp_exp0 + 2 * (int)E, full = 0;
        if (expert_wanted(hooks, g0) && (rc = expert_run(m, bw, l0, g0, xn, rows, f1, f2, ye, hooks, &full, err))) goto done;
        /* (not full: not run, or only up to the inputs that matter; nothing to add) */
        if (full && a->shared_gate) {
            BE_TRY(m, err, "shared expert gate",
                   be->ops->gemm(be, 0, 1, rows, 1, H, 1.0f, xn, H, bw->shared_gate_w, H, 0.0f, lg_be, 1));
            BE_TRY(m, err, "shared expert: download", qd_backend_download(be, lg, lg_be, (size_t)rows * sizeof(float)));
            for (int64_t t = 0; t < rows; t++) {
                stage[t] = (int32_t)t;
                stage_weights(stage, rows, t, 1.0f / (1.0f + expf(-lg[t])));
            }
            BE_TRY(m, err, "shared expert: upload", qd_backend_upload(be, ix_be, stage, sb));
            BE_TRY(m, err, "shared expert: scatter",
                   be->ops->scatter_add_rows(be, out, rows, ye, ix_be, (const float *)(ix_be + rows), rows, H));
        } else if (full) {
            BE_TRY(m, err, "shared expert: add", be->ops->add(be, out, ye, rows * H));
        }
    }
done:
    free(r.expert); free(r.weight); free(r.count);
    free(lg); free(stage); free(stage2);
    return rc;
}
