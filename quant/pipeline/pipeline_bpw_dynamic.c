/* job.target_bpw in GPTQ's format: the plan's bits and group size per layer written as
 * `dynamic` overrides (GPTQModel's per-module rules, which vLLM reads in gptq_utils.py
 * get_dynamic_override / override_config, fmt_gptq_dynamic.h).
 *
 * The top-level bits and group_size: the candidate holding most weights among those vLLM's
 * AutoGPTQConfig can build (4 or 8 bits, symmetric: its TYPE_MAP, auto_gptq.py; a config whose
 * top-level bits are not there raises before any layer is made, so a 3-bit top level would
 * make no layer load), the most common one when none is; every input group of a block with
 * another candidate gets one "+:" rule. Older vLLM trees choose gptq_marlin from the top-level
 * keys alone (is_gptq_marlin_compatible) and likewise refuse a 2- or 3-bit override under it,
 * so the top level does not change which rows load there either; it only saves rules.
 *
 * The rule's regex: vLLM matches each layer's own prefix with re.match, and its layers are
 * the fused ones (model.layers.0.self_attn.qkv_proj, mlp.gate_up_proj), while GPTQModel
 * matches the checkpoint's modules (q_proj, gate_proj): the plan gives every linear of an
 * input group one candidate, so one rule names the block, the members and the fused name,
 * anchored with `$` (model.layers.1.self_attn.q_proj must not match layers.10). The shapes
 * this cannot name (experts, whose FusedMoE layer takes one scheme for all of them; column
 * groups vLLM fuses under other names) are refused in the pre-flight. */
#include "quant/pipeline/pipeline_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include "quant/core/jsonfile.h"
#include "quant/pipeline/output.h"

int qd_pipeline_bpw_is_dynamic(const qd_pipeline *p) { return p->fmt->has_g_idx; }

/* The fused layer vLLM makes of input group G ("qkv_proj", "gate_up_proj"), NULL for a group
 * it builds linear by linear, or "" when quantd cannot name it. */
static const char *fused_name(const qd_input_group *G)
{
    size_t nl = strlen(G->name);
    if ((nl > 4 && !strcmp(G->name + nl - 4, "_out")) || G->n_linears == 1) return NULL;
    if (!strcmp(G->name, "attn_in") && G->n_linears == 3) return "qkv_proj";
    if (!strcmp(G->name, "mlp_in") && G->n_linears == 2) return "gate_up_proj";
    return "";
}

int qd_pipeline_bpw_dynamic_preflight(const qd_pipeline *p, qd_err *err)
{
    if (!qd_pipeline_bpw_is_dynamic(p)) return 0;
    for (int g = 0; g < qd_model_n_groups(p->m); g++) {
        const qd_input_group *G = qd_model_group(p->m, g);
        for (int j = 0; j < G->n_linears; j++)
            if (qd_model_linear(p->m, G->linears[j])->expert != -1)
                return qd_err_set(err, QD_EUNSUPPORTED, "target_bpw with format %s: the model has MoE experts (%s), "
                                  "which vLLM builds as one FusedMoE layer with one GPTQ scheme; use format "
                                  "compressed-tensors", p->fmt->name, qd_model_linear(p->m, G->linears[j])->name);
        const char *f = fused_name(G);
        if (f && !*f)
            return qd_err_set(err, QD_EUNSUPPORTED, "target_bpw with format %s: input group %s (%d linears) is not "
                              "fused by vLLM under a name quantd writes `dynamic` rules for (qkv_proj, gate_up_proj); "
                              "use format compressed-tensors", p->fmt->name, G->name, G->n_linears);
    }
    return 0;
}

/* "<block prefix><dir>(q_proj|k_proj|v_proj|qkv_proj)$", escaped. */
static int group_regex(const qd_pipeline *p, int block, const qd_input_group *G, char *out, size_t cap)
{
    char prefix[160], esc[800];
    qd_model_block_prefix(p->m, block, prefix, sizeof prefix);
    const char *first = qd_model_linear(p->m, G->linears[0])->name, *dot = strrchr(first, '.');
    size_t dlen = dot ? (size_t)(dot - first + 1) : 0;
    char dir[400];
    snprintf(dir, sizeof dir, "%s%.*s", prefix, (int)dlen, first);
    qd_output_regex_escape(dir, esc, sizeof esc);
    size_t o = (size_t)snprintf(out, cap, "+:%s(", esc);
    for (int j = 0; j < G->n_linears && o < cap; j++) {
        const char *nm = qd_model_linear(p->m, G->linears[j])->name;
        if (strncmp(nm, first, dlen)) return -1;   /* members in different modules: not one rule */
        qd_output_regex_escape(nm + dlen, esc, sizeof esc);
        o += (size_t)snprintf(out + o, cap - o, "%s%s", j ? "|" : "", esc);
    }
    const char *f = fused_name(G);
    if (f && *f && o < cap) o += (size_t)snprintf(out + o, cap - o, "|%s", f);
    if (o < cap) o += (size_t)snprintf(out + o, cap - o, ")$");
    return o < cap ? 0 : -1;
}

/* The top-level candidate (see the top of the file). */
static int top_candidate(const qd_pipeline *p)
{
    const qd_bpw_plan *b = &p->bpw;
    double w[QP_JOB_BPW_MAX * QP_JOB_BPW_MAX] = {0};
    for (int i = 0; i < b->n_blocks * b->n_lin; i++) {
        int c = b->choice[i];
        if (c < 0) continue;
        const qd_linear_info *L = qd_model_linear(p->m, i % b->n_lin);
        w[c] += (double)(L->n * L->k);
    }
    int best = -1, best_any = 0;
    for (int c = 0; c < b->n_cand; c++) {
        int served = b->cand_bits[c] == 4 || b->cand_bits[c] == 8;
        if (served && w[c] > 0 && (best < 0 || w[c] > w[best])) best = c;
        if (w[c] > w[best_any]) best_any = c;
    }
    return best >= 0 ? best : best_any;
}

int qd_pipeline_bpw_dynamic(const qd_pipeline *p, cJSON *q, qd_err *err)
{
    const qd_bpw_plan *b = &p->bpw;
    int top = top_candidate(p);
    cJSON_ReplaceItemInObjectCaseSensitive(q, "bits", cJSON_CreateNumber(b->cand_bits[top]));
    cJSON_ReplaceItemInObjectCaseSensitive(q, "group_size", cJSON_CreateNumber((double)b->cand_group[top]));
    cJSON *dyn = cJSON_GetObjectItemCaseSensitive(q, "dynamic");
    if (!dyn && !(dyn = cJSON_AddObjectToObject(q, "dynamic"))) return qd_err_set(err, QD_ENOMEM, "out of memory");
    /* After the "-:" rules of the layers left in float: vLLM takes the first rule that matches. */
    for (int blk = 0; blk < b->n_blocks; blk++)
        for (int g = 0; g < qd_model_n_groups(p->m); g++) {
            const qd_input_group *G = qd_model_group(p->m, g);
            int c = -1;
            for (int j = 0; j < G->n_linears; j++) {
                int cj = b->choice[(size_t)blk * b->n_lin + G->linears[j]];
                if (cj < 0) continue;
                if (c >= 0 && cj != c)
                    return qd_err_set(err, QD_EINVAL, "target_bpw: block %d input group %s has members at different "
                                      "candidates", blk, G->name);
                c = cj;
            }
            if (c < 0 || c == top) continue;
            char key[1024];
            if (group_regex(p, blk, G, key, sizeof key))
                return qd_err_set(err, QD_EINVAL, "target_bpw: block %d input group %s: no `dynamic` rule can name it",
                                  blk, G->name);
            cJSON *o = cJSON_CreateObject();
            if (!o || !cJSON_AddNumberToObject(o, "bits", b->cand_bits[c]) ||
                !cJSON_AddNumberToObject(o, "group_size", (double)b->cand_group[c])) {
                cJSON_Delete(o);
                return qd_err_set(err, QD_ENOMEM, "out of memory");
            }
            cJSON_AddItemToObject(dyn, key, o);
        }
    cJSON *meta = cJSON_GetObjectItemCaseSensitive(q, "meta");
    if (meta) {
        qd_json_add_exact(meta, "target_bpw", b->target);
        qd_json_add_exact(meta, "bpw", b->bpw);
    }
    return 0;
}
