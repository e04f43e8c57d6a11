/* Reading one block's MLP pair from a quantized checkpoint for the TP simulation (see
 * qd_tp_mlp_load in tp_sim.h). The packed tensors are copied out of the mapping so the
 * in-memory TP-aware permutation can work on them without touching the files. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/core/safetensors.h"
#include "quant/model/model.h"
#include "quant/tp/tp_layout.h"
#include "quant/tp/tp_sim.h"

static int copy_tensor(const st_model *sm, const char *prefix, const char *suffix, qd_dtype dt, int ndim,
                       int required, void **dst, int64_t *shape, qd_err *err)
{
    char name[400];
    snprintf(name, sizeof name, "%s.%s", prefix, suffix);
    const st_tensor *t = st_model_find(sm, name);
    if (!t) return required ? qd_err_set(err, QD_ENOTFOUND, "tp sim: %s is missing", name) : 0;
    if (t->dtype != dt || t->ndim != ndim)
        return qd_err_set(err, QD_ESHAPE, "tp sim: %s is %s with %d dims, expected %s with %d", name, qd_dtype_name(t->dtype),
                          t->ndim, qd_dtype_name(dt), ndim);
    size_t bytes = (size_t)t->numel * qd_dtype_size(dt);
    *dst = malloc(bytes ? bytes : 1);
    if (!*dst) return qd_err_set(err, QD_ENOMEM, "tp sim: out of memory for %s", name);
    memcpy(*dst, t->data, bytes);
    for (int d = 0; d < ndim; d++) shape[d] = t->shape[d];
    return 0;
}

static const st_tensor *tp_lookup(const void *sm, const char *name) { return st_model_find(sm, name); }

/* The packed tensors come through the checkpoint format's descriptor (read() copies them). */
static int load_packed(const qd_model *m, const qd_format *f, const char *prefix, const qd_linear_info *L,
                       qd_packed *p, qd_err *err)
{
    const qd_model_config *c = qd_model_cfg(m);
    const st_model *sm = qd_model_tensors(m);
    char full[300];
    snprintf(full, sizeof full, "%s%s", prefix, L->name);
    qd_fmt_detected d = {.bits = c->quant_bits, .group_size = c->quant_group_size, .sym = c->quant_sym,
                         .desc_act = c->quant_desc_act, .grid = (qd_grid)c->quant_grid,
                         .scale_rule = (qd_scale_rule)c->quant_scale_rule, .row_block = c->quant_row_block};
    qd_fmt_named ctx = {tp_lookup, sm, full};
    int rc = f->read(qd_fmt_find_named, &ctx, L->n, L->k, &d, p, err);
    if (rc) {
        qd_err_prefix(err, "tp sim: %s", full);
        return rc;
    }
    rc = copy_tensor(sm, full, "bias", QD_DTYPE_F16, 1, 0, (void **)&p->bias, &p->bias_len, err);
    if (rc) qd_packed_free(p);
    return rc;
}

int qd_tp_mlp_load(qd_model *m, int block, int tp, qd_tp_mlp *as_stored, qd_tp_mlp *with_aware, qd_err *err)
{
    memset(as_stored, 0, sizeof *as_stored);
    if (with_aware) memset(with_aware, 0, sizeof *with_aware);
    const qd_model_config *c = qd_model_cfg(m);
    const qd_format *f = c->quantized ? qd_format_find(c->quant_format) : NULL;
    if (!f || !f->has_g_idx)
        return qd_err_set(err, QD_EINVAL, "tp sim: %s is not a GPTQ checkpoint (quantization_config format %s)",
                          qd_model_dir(m), c->quantized ? c->quant_format : c->source_fp8 ? "fp8, a source checkpoint" : "none");
    if (block < 0 || block >= c->n_layers)
        return qd_err_set(err, QD_EINVAL, "tp sim: layer %d is not in 0..%lld", block, (long long)c->n_layers - 1);
    const qd_input_group *col = NULL;
    int down_li = -1;
    for (int g = 0; g < qd_model_n_groups(m); g++) {
        const qd_input_group *G = qd_model_group(m, g);
        if (!strcmp(G->name, "mlp_in")) col = G;
        if (!strcmp(G->name, "mlp_out") && G->n_linears == 1) down_li = G->linears[0];
    }
    if (!col || down_li < 0 || col->n_linears > 2)
        return qd_err_set(err, QD_EINVAL, "tp sim: architecture %s has no MLP pair", qd_model_arch_name(m));
    if (!qd_model_block_has_linear(m, block, down_li))
        return qd_err_set(err, QD_EINVAL, "tp sim: layer %d is a mixture-of-experts layer, without one MLP pair", block);
    qd_tp_act act = QD_TP_ACT_SILU_GLU;
    if (!strcmp(c->activation, "relu")) act = QD_TP_ACT_RELU;
    else if (!strcmp(c->activation, "gelu")) act = QD_TP_ACT_GELU;
    char prefix[160];
    qd_model_block_prefix(m, block, prefix, sizeof prefix);
    qd_packed pk[3];
    memset(pk, 0, sizeof pk);
    int n_col = col->n_linears, rc = 0;
    for (int j = 0; j < n_col && !rc; j++) rc = load_packed(m, f, prefix, qd_model_linear(m, col->linears[j]), &pk[j], err);
    if (!rc) rc = load_packed(m, f, prefix, qd_model_linear(m, down_li), &pk[2], err);
    const qd_packed *cc[2] = {&pk[0], &pk[1]};
    if (!rc) rc = qd_tp_mlp_from_packed(f, cc, n_col, &pk[2], act, as_stored, err);
    if (!rc && with_aware) {
        qd_packed *cols[2] = {&pk[0], n_col > 1 ? &pk[1] : NULL};
        rc = qd_tp_layout_apply_pair(&pk[2], cols, n_col, tp, NULL, err);
        if (!rc) rc = qd_tp_mlp_from_packed(f, cc, n_col, &pk[2], act, with_aware, err);
    }
    for (int j = 0; j < 3; j++) qd_packed_free(&pk[j]);
    if (rc) {
        qd_tp_mlp_free(as_stored);
        if (with_aware) qd_tp_mlp_free(with_aware);
        return qd_err_prefix(err, "%s layer %d", qd_model_dir(m), block);
    }
    return 0;
}
