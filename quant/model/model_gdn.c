/* Gated DeltaNet, the linear-attention mixer of Qwen3-Next and Qwen3.5 layers, as
 * transformers' Qwen3NextGatedDeltaNet / Qwen3_5GatedDeltaNet compute it without a cache:
 *   the projections of the normed input into q, k, v (the conv's channels, in that order), the
 *   gate z [v_heads * v_dim], and b, a [v_heads] — Qwen3-Next's in_proj_qkvz holds, per key
 *   head group, that group's q, k, v and z ([k_dim, k_dim, r v_dim, r v_dim], r = v_heads /
 *   k_heads) and in_proj_ba its b and a ([r, r]), which are gathered into the contiguous
 *   layout Qwen3.5's separate projections give directly;
 *   the causal depthwise conv over q, k, v with SiLU (backend op conv1d_causal, without gates);
 *   the gated delta rule (backend op gated_delta_rule: L2-normalised q and k, beta =
 *   sigmoid(b), g = -exp(A_log) softplus(a + dt_bias));
 *   the gated RMSNorm of each value head's output, w * norm(o) * silu(z) (rmsnorm over
 *   v_dim, then silu_mul), and out_proj.
 * The input hooks see the projections' input (input_layernorm's output) and out_proj's (the
 * gated norm's output), as for any block. */
#include <stdlib.h>

#include "quant/model/model_internal.h"

#define BE_CALL(m, err, call) do { int _rc = (call); \
    if (_rc) return qd_err_set((err), _rc, "%s: %s", #call, (m)->be->err.msg); } while (0)

int qd_fwd_gather_units(qd_model *m, float *dst, const float *src, int64_t rows, int64_t src_units, int64_t unit,
                        const int32_t *map, int64_t n_map, qd_err *err)
{
    int64_t n = rows * n_map;
    if (src_units * rows > INT32_MAX)
        return qd_err_set(err, QD_EINVAL, "gather: %lld rows of %lld units exceed an int32 index", (long long)rows,
                          (long long)src_units);
    int32_t *idx = qd_model_scratch(m, QD_SCRATCH_GDN_IDX, (size_t)n * sizeof(int32_t), err);
    int32_t *host = idx ? malloc((size_t)n * sizeof *host) : NULL;
    if (!host) return idx ? qd_err_set(err, QD_ENOMEM, "gather: out of memory") : QD_ENOMEM;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < n_map; j++) host[r * n_map + j] = (int32_t)(r * src_units + map[j]);
    int rc = qd_backend_upload(m->be, idx, host, (size_t)n * sizeof *host);
    free(host);
    if (!rc) rc = m->be->ops->gather_rows(m->be, dst, src, rows * src_units, idx, n, unit);
    if (rc) return qd_err_set(err, rc, "gather: %s", m->be->err.msg);
    return 0;
}

static int64_t gcd64(int64_t a, int64_t b) { while (b) { int64_t t = a % b; a = b; b = t; } return a; }

/* Qwen3-Next: in_proj_qkvz's output qkvz [rows, 2 kd + 2 vd] into mix [rows, 2 kd + vd]
 * (q of every group, then k, then v) and z [rows, vd]; in_proj_ba's ba [rows, 2 nv] into
 * [rows, 2 nv] (every b, then every a) in place of ba's copy `ba2`. */
static int split_interleaved(qd_model *m, const float *qkvz, const float *ba, float *mix, float *z, float *ba2,
                             int64_t rows, qd_err *err)
{
    const qd_model_config *c = &m->cfg;
    int64_t nk = c->gdn_k_heads, r = c->gdn_v_heads / nk, dk = c->gdn_k_dim, rv = r * c->gdn_v_dim;
    int64_t u = gcd64(dk, rv), per = (2 * dk + 2 * rv) / u, ku = dk / u, vu = rv / u;
    int64_t n_mix = nk * (2 * ku + vu), n_z = nk * vu;
    int32_t *map = malloc((size_t)(n_mix + n_z + 2 * nk) * sizeof *map);
    if (!map) return qd_err_set(err, QD_ENOMEM, "linear attention: out of memory");
    int64_t j = 0;
    for (int64_t g = 0; g < nk; g++)   /* every group's q */
        for (int64_t i = 0; i < ku; i++) map[j++] = (int32_t)(g * per + i);
    for (int64_t g = 0; g < nk; g++)   /* k */
        for (int64_t i = 0; i < ku; i++) map[j++] = (int32_t)(g * per + ku + i);
    for (int64_t g = 0; g < nk; g++)   /* v */
        for (int64_t i = 0; i < vu; i++) map[j++] = (int32_t)(g * per + 2 * ku + i);
    for (int64_t g = 0; g < nk; g++)   /* z */
        for (int64_t i = 0; i < vu; i++) map[j++] = (int32_t)(g * per + 2 * ku + vu + i);
    int32_t *bmap = map + j;           /* ba per group: [b (r), a (r)]; units of r */
    for (int64_t g = 0; g < nk; g++) { bmap[g] = (int32_t)(2 * g); bmap[nk + g] = (int32_t)(2 * g + 1); }
    int rc = qd_fwd_gather_units(m, mix, qkvz, rows, nk * per, u, map, n_mix, err);
    if (!rc) rc = qd_fwd_gather_units(m, z, qkvz, rows, nk * per, u, map + n_mix, n_z, err);
    if (!rc) rc = qd_fwd_gather_units(m, ba2, ba, rows, 2 * nk, r, bmap, 2 * nk, err);
    free(map);
    return rc;
}

int qd_gdn_forward(qd_model *m, const qd_block_weights *bw, const float *xn, float *out, int64_t batch, int64_t seq,
                   const qd_block_hooks *hooks, qd_err *err)
{
    const qd_model_config *c = &m->cfg;
    const qd_arch *a = m->arch;
    int64_t rows = batch * seq, nv = c->gdn_v_heads, dv = c->gdn_v_dim, vd = nv * dv;
    int64_t ch = qd_model_dim(m, QD_DIM_GDN_QKV), l0 = a->lin_gdn0;
    int interleaved = a->gdn == 1;
    int l_out = l0 + (interleaved ? 2 : 4);
    float *in = interleaved ? qd_model_scratch(m, QD_SCRATCH_GDN_IN, (size_t)(rows * (ch + vd)) * sizeof(float), err)
                            : qd_model_scratch(m, QD_SCRATCH_GDN_IN, 16, err);
    float *mix = in ? qd_model_scratch(m, QD_SCRATCH_GDN_MIX, (size_t)(rows * ch) * sizeof(float), err) : NULL;
    float *conv = mix ? qd_model_scratch(m, QD_SCRATCH_GDN_CONV, (size_t)(rows * ch) * sizeof(float), err) : NULL;
    float *z = conv ? qd_model_scratch(m, QD_SCRATCH_GDN_Z, (size_t)(rows * vd) * sizeof(float), err) : NULL;
    float *ba = z ? qd_model_scratch(m, QD_SCRATCH_GDN_BA, (size_t)(rows * 4 * nv) * sizeof(float), err) : NULL;
    float *core = ba ? qd_model_scratch(m, QD_SCRATCH_ATT, (size_t)(rows * vd) * sizeof(float), err) : NULL;
    if (!core) return QD_ENOMEM;
    int rc;
    if ((rc = qd_fwd_call_input(m, bw, m->lin[l0].group, xn, rows, hooks, err))) return rc;
    const float *b_in, *a_in;
    int64_t ld_ba;
    if (interleaved) {
        /* in_proj_qkvz into `in`, in_proj_ba into the back half of `ba`; split into mix, z
         * and the front half of `ba` ([b | a] per row). */
        float *raw_ba = ba + rows * 2 * nv;
        if ((rc = qd_fwd_linear_part(m, bw, l0, 0, m->lin[l0].n, xn, rows, in, hooks, err)) ||
            (rc = qd_fwd_linear_part(m, bw, l0 + 1, 0, 2 * nv, xn, rows, raw_ba, hooks, err)) ||
            (rc = split_interleaved(m, in, raw_ba, mix, z, ba, rows, err)))
            return rc;
        b_in = ba;
        a_in = ba + nv;
        ld_ba = 2 * nv;
    } else {
        if ((rc = qd_fwd_linear_part(m, bw, l0, 0, ch, xn, rows, mix, hooks, err)) ||
            (rc = qd_fwd_linear_part(m, bw, l0 + 1, 0, vd, xn, rows, z, hooks, err)) ||
            (rc = qd_fwd_linear_part(m, bw, l0 + 2, 0, nv, xn, rows, ba, hooks, err)) ||
            (rc = qd_fwd_linear_part(m, bw, l0 + 3, 0, nv, xn, rows, ba + rows * nv, hooks, err)))
            return rc;
        b_in = ba;
        a_in = ba + rows * nv;
        ld_ba = nv;
    }
    BE_CALL(m, err, m->be->ops->conv1d_causal(m->be, conv, mix, NULL, NULL, ch, batch, seq, ch, bw->gdn_conv_w, NULL, c->gdn_conv, 1));
    BE_CALL(m, err, m->be->ops->gated_delta_rule(m->be, core, conv, ch, b_in, a_in, ld_ba, bw->gdn_a_log, bw->gdn_dt_bias,
                                                 batch, seq, c->gdn_k_heads, nv, c->gdn_k_dim, dv));
    /* The gated RMSNorm: w * norm(o), then times silu(z). */
    BE_CALL(m, err, m->be->ops->rmsnorm(m->be, core, core, bw->gdn_norm_w, rows * nv, dv, c->norm_eps));
    BE_CALL(m, err, m->be->ops->silu_mul(m->be, core, z, core, rows * vd));
    if ((rc = qd_fwd_call_input(m, bw, m->lin[l_out].group, core, rows, hooks, err)) ||
        (rc = qd_fwd_linear_part(m, bw, l_out, 0, c->hidden, core, rows, out, hooks, err)))
        return rc;
    return 0;
}
