/* The pipeline's side of the TP-aware layout (job layout "tp_aware"): the one call
 * write_block_file makes before a block's tensors are written, and the summary
 * pipeline_finish puts into quantization_config and the report (pipeline_internal.h). The
 * permutation itself is quant/tp/tp_layout.c's; this file only finds the MLP pair and acts
 * on the pipeline's private state, so it lives in the pipeline: the permutation must act on
 * a block's packed outputs just before they are committed, after the block's forward has
 * computed the next block's inputs with the unpermuted weights, so calibration never sees
 * the reorder. Because a block is committed exactly once, a resumed job permutes every
 * block exactly once too. */
#include "quant/pipeline/pipeline_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/core/log.h"
#include "quant/pipeline/output.h"
#include "quant/tp/tp_layout.h"

/* The MLP pair of the architecture: the input group feeding the MLP (gate/up, fc1) and the
 * one-linear group after it (down_proj, fc2). Both families name them the same. */
static int find_pair(const qd_model *m, const qd_input_group **col, int *down_li)
{
    *col = NULL;
    *down_li = -1;
    for (int g = 0; g < qd_model_n_groups(m); g++) {
        const qd_input_group *G = qd_model_group(m, g);
        if (!strcmp(G->name, "mlp_in")) *col = G;
        if (!strcmp(G->name, "mlp_out") && G->n_linears == 1) *down_li = G->linears[0];
    }
    return *col && *down_li >= 0;
}

int qd_pipeline_tp_apply_block(qd_pipeline *p, int block, qd_linear_out *outs, qd_err *err)
{
    if (p->job->layout != QP_LAYOUT_TP_AWARE) return 0;
    const qd_input_group *G;
    int down_li;
    if (!find_pair(p->m, &G, &down_li))
        return qd_err_set(err, QD_EINVAL, "tp_aware layout: architecture %s has no MLP pair to reorder",
                          qd_model_arch_name(p->m));
    const qd_linear_info *D = qd_model_linear(p->m, down_li);
    if (!outs[down_li].quantized) {
        QD_LOG(QD_LOG_WARN, "tp_layout_skip", "block=%d layer=%s reason=\"left in float, no g_idx to reorder\"", block, D->name);
        return 0;
    }
    qd_packed *cols[QD_MAX_GROUP_LINEARS] = {0};
    for (int j = 0; j < G->n_linears; j++)
        if (outs[G->linears[j]].quantized) cols[j] = &outs[G->linears[j]].packed;
    int64_t *perm = malloc((size_t)D->k * sizeof *perm);
    if (!perm) return qd_err_set(err, QD_ENOMEM, "tp_aware layout: out of memory");
    int rc = qd_tp_layout_apply_pair(&outs[down_li].packed, cols, G->n_linears, p->job->tp, perm, err);
    for (int j = 0; j < G->n_linears && !rc; j++) {
        if (cols[j]) continue;
        /* A column layer kept in float follows the same permutation of its output rows. */
        const qd_linear_info *L = qd_model_linear(p->m, G->linears[j]);
        qd_linear_out *o = &outs[G->linears[j]];
        if (!o->w_float) {
            rc = qd_err_set(err, QD_EINVAL, "tp_aware layout: %s is in float but its weight is not in memory", L->name);
            break;
        }
        rc = qd_tp_permute_rows_f32(o->w_float, L->n, L->k, o->bias, perm, err);
        o->weight_modified = 1;
        o->bias_modified = o->bias != NULL;
    }
    free(perm);
    if (rc) return qd_err_prefix(err, "block %d (%s, tp=%d)", block, D->name, p->job->tp);
    QD_LOG(QD_LOG_DEBUG, "tp_layout", "block=%d layer=%s tp=%d", block, D->name, p->job->tp);
    return 0;
}

static int layer_quantized(const qd_ckpt_state *st, const char *name)
{
    for (size_t i = 0; i < st->n_layers; i++)
        if (!strcmp(st->layers[i].name, name)) return strcmp(st->layers[i].method, "float") != 0;
    return 0;
}

int qd_pipeline_tp_summarize(const qd_pipeline *p, qd_pipeline_tp_summary *s, qd_err *err)
{
    memset(s, 0, sizeof *s);
    if (p->job->layout != QP_LAYOUT_TP_AWARE) return 0;
    const qd_input_group *G;
    int down_li;
    if (!find_pair(p->m, &G, &down_li))
        return qd_err_set(err, QD_EINVAL, "tp_aware layout: architecture %s has no MLP pair", qd_model_arch_name(p->m));
    const char *dname = qd_model_linear(p->m, down_li)->name;
    char prefix[160], name[400], esc[480];
    /* Block prefixes end in "<index>." ("model.layers.3."); the regex keeps the part before. */
    qd_model_block_prefix(p->m, 0, prefix, sizeof prefix);
    size_t pl = strlen(prefix);
    if (pl < 2 || prefix[pl - 1] != '.' || prefix[pl - 2] != '0')
        return qd_err_set(err, QD_EINVAL, "tp_aware layout: unexpected block prefix \"%s\"", prefix);
    prefix[pl - 2] = 0;
    int n_done = 0;
    char alt[3000] = "";
    size_t al = 0;
    for (int b = 0; b < p->n_blocks; b++) {
        char bp[160];
        qd_model_block_prefix(p->m, b, bp, sizeof bp);
        snprintf(name, sizeof name, "%s%s", bp, dname);
        if (!layer_quantized(&p->st, name)) continue;
        int w = snprintf(alt + al, sizeof alt - al, "%s%d", n_done ? "|" : "", b);
        if (w < 0 || (size_t)w >= sizeof alt - al)
            return qd_err_set(err, QD_EINVAL, "tp_aware layout: too many blocks for the dynamic regex");
        al += (size_t)w;
        n_done++;
    }
    char esc_d[160];
    qd_output_regex_escape(prefix, esc, sizeof esc);
    qd_output_regex_escape(dname, esc_d, sizeof esc_d);
    if (n_done == p->n_blocks)
        snprintf(s->regex, sizeof s->regex, "%s\\d+\\.%s$", esc, esc_d);
    else if (n_done)
        snprintf(s->regex, sizeof s->regex, "%s(%s)\\.%s$", esc, alt, esc_d);
    s->n_regex = n_done > 0;
    char cols[200] = "";
    for (int j = 0; j < G->n_linears; j++) {
        size_t cl = strlen(cols);
        snprintf(cols + cl, sizeof cols - cl, "%s%s", j ? ", " : "", qd_model_linear(p->m, G->linears[j])->name);
    }
    snprintf(s->note, sizeof s->note,
             "tp_aware layout for tp=%d: in %d of %d blocks the MLP pair (%s -> %s) is permuted by the stable argsort "
             "of %s's act-order g_idx, so %s's g_idx is k / group_size (declared in quantization_config.dynamic with "
             "desc_act false) and each rank's shard holds whole groups, with no all-gather between the column- and "
             "row-parallel layers; %s output columns follow the same permutation, so the model's function is "
             "unchanged. Attention layers keep the plain act-order layout (the TP-aware reorder applies to the MLP "
             "only).%s",
             p->job->tp, n_done, p->n_blocks, cols, dname, dname, dname, cols,
             n_done < p->n_blocks ? " Blocks whose down projection stayed in float keep the plain layout." : "");
    return 0;
}
