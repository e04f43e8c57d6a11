/* The serving check over a model (see tp_serving.h). vLLM's layer structure: an input group
 * whose name ends in "_in" is one fused column-parallel linear (QKVParallelLinear or
 * MergedColumnParallelLinear, vllm/model_executor/layers/linear.py); "_out" groups are
 * RowParallelLinear. QKV: each rank holds q/tp heads and max(1, kv/tp) KV heads (KV heads
 * are replicated when there are fewer than ranks). Multi-head latent attention has its own
 * layout, replicated layers included (tp_serving_mla.c). */
#include "quant/tp/tp_serving.h"

#include "quant/core/safetensors.h"
#include "quant/model/block.h"
#include "quant/tp/tp_serving_parts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void qd_tp_serving_report_free(qd_serving_report *r)
{
    if (!r) return;
    free(r->rows);
    memset(r, 0, sizeof *r);
}

static int add_row(qd_serving_report *r, size_t *cap, qd_serving_row **row)
{
    if (r->n == *cap) {
        size_t nc = *cap ? 2 * *cap : 16;
        qd_serving_row *nr = realloc(r->rows, nc * sizeof *nr);
        if (!nr) return QD_ENOMEM;
        r->rows = nr;
        *cap = nc;
    }
    *row = &r->rows[r->n++];
    memset(*row, 0, sizeof **row);
    return 0;
}

/* GPTQ `dynamic` (qd_serving_quant.row_quant): 1 with the row marked "will not load" when vLLM
 * would build the row, named as vLLM names it (the row's name up to " ("), with other bits or
 * group size than its tensors hold, or at bits or a group size its GPTQ config cannot build
 * (vLLM 0.32's AutoGPTQConfig, the one config for every GPTQ checkpoint there: 4 and 8 bits,
 * Marlin's group sizes, checked in the linear method's constructor before any kernel). */
static int dynamic_refuses(const qd_serving_quant *q, qd_serving_row *row, int bits, int64_t gs, int64_t k)
{
    char vname[256];
    snprintf(vname, sizeof vname, "%s", row->name);
    char *sp = strstr(vname, " (");
    if (sp) *sp = 0;
    int vb = bits;
    int64_t vg = gs;
    if (q->row_quant && q->row_quant(q->layer_ud, vname, &vb, &vg)) {
        row->choice.kernel = QD_SRV_NO_LOAD;
        snprintf(row->choice.why, sizeof row->choice.why, "will not load: quantization_config.dynamic cannot be read");
        return 1;
    }
    if (vb == 0) {
        row->choice.kernel = QD_SRV_NO_LOAD;
        snprintf(row->choice.why, sizeof row->choice.why, "will not load: a \"-:\" `dynamic` rule leaves %s unquantized "
                 "in vLLM, but the checkpoint stores it packed "
                 "[vllm/model_executor/layers/quantization/utils/gptq_utils.py (get_linear_quant_method)]", vname);
        return 1;
    }
    /* One group of the whole row is one group however it is written (-1 or K). */
    int64_t vgn = vg <= 0 || vg >= k ? -1 : vg, gsn = gs <= 0 || gs >= k ? -1 : gs;
    if (vb != bits || vgn != gsn) {
        row->choice.kernel = QD_SRV_NO_LOAD;
        snprintf(row->choice.why, sizeof row->choice.why, "will not load: vLLM builds %s at %d bits group %lld from the "
                 "`dynamic` rules matched against its own name, but the checkpoint stores %d bits group %lld "
                 "[vllm/model_executor/layers/quantization/utils/gptq_utils.py (get_dynamic_override, override_config)]",
                 vname, vb, (long long)vg, bits, (long long)gs);
        return 1;
    }
    if (bits != 4 && bits != 8) {
        row->choice.kernel = QD_SRV_NO_LOAD;
        snprintf(row->choice.why, sizeof row->choice.why, "will not load: vLLM's GPTQ config builds 4- and 8-bit "
                 "symmetric layers only; a %d-bit `dynamic` override raises \"Unsupported quantization config\" "
                 "[vllm/model_executor/layers/quantization/auto_gptq.py (AutoGPTQConfig.TYPE_MAP); "
                 "utils/gptq_utils.py (override_config)]", bits);
        return 1;
    }
    if (vg != -1 && vg != 32 && vg != 64 && vg != 128) {
        row->choice.kernel = QD_SRV_NO_LOAD;
        snprintf(row->choice.why, sizeof row->choice.why, "will not load: vLLM's GPTQ linear method checks Marlin's "
                 "group sizes (-1, 32, 64, 128) for every layer and raises for group %lld "
                 "[vllm/model_executor/layers/quantization/auto_gptq.py (AutoGPTQLinearMethod, verify_marlin_supported); "
                 "utils/marlin_utils.py (MARLIN_SUPPORTED_GROUP_SIZES)]", (long long)vg);
        return 1;
    }
    return 0;
}

/* Column groups are fused as vLLM fuses them. Its own model files say so in
 * packed_modules_mapping; the architectures it serves through its Transformers backend
 * (vllm/model_executor/models/registry.py: OLMo 2/3, SmolLM3, Seed-OSS, Hunyuan, StarCoder2,
 * Phi, GPT-NeoX) are fused there too: the QKVFuser turns q(x), k(x), v(x) on one input into
 * one QKVParallelLinear (models/transformers/fusers/qkv.py) and the GLU fuser gate/up into one
 * MergedColumnParallelLinear (fusers/glu.py).
 * Row-parallel groups: each linear alone; column groups: one fused linear, with two
 * exceptions.
 * A Gated DeltaNet's input is two (vllm/model_executor/layers/mamba/gdn/
 * qwen_gdn_linear_attn.py: in_proj_qkvz, in_proj_ba, each a MergedColumnParallelLinear;
 * Qwen3.5's in_proj_qkv + in_proj_z and in_proj_b + in_proj_a packed into them,
 * models/qwen3_5.py packed_modules_mapping). And a parallel block's one input group holding
 * attention and MLP linears (Phi's q/k/v and fc1) is two: vLLM serves PhiForCausalLM through
 * its Transformers backend, whose QKVFuser fuses q/k/v into QKVParallelLinear
 * (models/transformers/fusers/qkv.py) and whose tp plan builds fc1 alone ("colwise",
 * models/transformers/utils.py, replace_linear_class); Cohere2's q/k/v and gate/up likewise:
 * qkv_proj and gate_up_proj (vllm/model_executor/models/commandr.py). */
static int plain_parts(const qd_model *m, const qd_input_group *G, int o_li, int tp, qd_srv_part *parts)
{
    const qd_model_config *cfg = qd_model_cfg(m);
    size_t nl = strlen(G->name);
    int row_parallel = nl > 4 && !strcmp(G->name + nl - 4, "_out");
    int fused = !row_parallel;
    int gdn_in = fused && !strcmp(G->name, "gdn_in");
    int n_attn = 0;
    for (int j = 0; j < G->n_linears; j++) n_attn += G->linears[j] < o_li;
    int split = fused && (gdn_in || (n_attn > 0 && n_attn < G->n_linears));
    int cut = gdn_in ? G->n_linears / 2 : n_attn;
    int n = !fused ? G->n_linears : split ? 2 : 1;
    for (int p = 0; p < n; p++) {
        qd_srv_part *P = &parts[p];
        *P = (qd_srv_part){.first = !fused ? p : split && p ? cut : 0, .row_parallel = row_parallel, .per_shard = -1};
        P->last = !fused ? p + 1 : split && !p ? cut : G->n_linears;
        if (P->last - P->first > 1)
            P->fused = gdn_in ? (p ? "in_proj_ba" : "in_proj_qkvz")
                     : !strcmp(G->name, "attn_in") && P->first < n_attn ? "qkv_proj" : "gate_up_proj";
        if (fused && !strcmp(G->name, "attn_in") && P->first == 0 && P->last - P->first == 3) {
            /* Gated attention (Qwen3-Next, Qwen3.5): q_proj's rows hold each head's gate too. */
            int64_t hd = cfg->head_dim, qh = cfg->n_heads, kvh = cfg->n_kv_heads, qm = cfg->attn_gate ? 2 : 1;
            P->per_shard = (qh % tp) ? 0 : (qm * qh / tp + 2 * (kvh >= tp ? (kvh % tp ? 0 : kvh / tp) : 1)) * hd;
            if (kvh >= tp && kvh % tp) P->per_shard = 0;
        }
        if (!row_parallel && !strcmp(G->name, "mamba_in")) {
            /* Mamba-2's in_proj [z, x, B, C, dt] (vllm/model_executor/layers/mamba/mamba_mixer2.py,
             * MambaMixer2.__init__): the heads are sharded (tp must divide them), the
             * groups too when tp divides them; one group is copied to every rank (any
             * other count asserts). */
            const qd_mixer_config *x = &cfg->mixer;
            int64_t grp = x->ssm_groups % tp == 0 ? x->ssm_groups / tp : x->ssm_groups == 1 ? 1 : -1;
            P->per_shard = x->ssm_heads % tp || grp < 0 ? 0
                         : 2 * x->ssm_heads / tp * x->ssm_head_dim + 2 * grp * x->ssm_state + x->ssm_heads / tp;
        }
    }
    return n;
}

/* Sets row to a layer that does not load, counted as slow. */
static void row_no_load(qd_serving_report *out, qd_serving_row *row, const char *why)
{
    row->choice.kernel = QD_SRV_NO_LOAD;
    snprintf(row->choice.why, sizeof row->choice.why, "will not load: %s", why);
    out->n_slow++;
}

/* The row of one part P of group G in block b. */
static void part_row(const qd_model *m, const qd_serving_quant *q, qd_serving_is_float_fn is_float, void *ud, int b,
                     const char *prefix, const qd_input_group *G, const qd_srv_part *P, int tp, int gpu_cc,
                     qd_serving_report *out, qd_serving_row *row)
{
    const qd_model_config *cfg = qd_model_cfg(m);
    int first = P->first, last = P->last;
    size_t o = (size_t)snprintf(row->name, sizeof row->name, "%s", prefix);
    if (first == last) {   /* built unquantized by vLLM from block tensors */
        snprintf(row->name + o, sizeof row->name - o, "%s", P->name);
        row->is_float = 1;
        return;
    }
    int n_float = 0;
    int64_t n_sum = 0, k = 0;
    const char *base = qd_model_linear(m, G->linears[first])->name;
    if (last - first > 1) {
        /* "self_attn.q_proj" -> "self_attn.qkv_proj (q_proj+k_proj+v_proj)" */
        const char *dot = strrchr(base, '.');
        size_t plen = dot ? (size_t)(dot - base + 1) : 0;
        o += (size_t)snprintf(row->name + o, sizeof row->name - o, "%.*s%s (", (int)plen, base, P->fused);
    }
    for (int j = first; j < last; j++) {
        const qd_linear_info *L = qd_model_linear(m, G->linears[j]);
        if (o < sizeof row->name) {
            const char *nm = L->name;
            if (last - first > 1 && strrchr(nm, '.')) nm = strrchr(nm, '.') + 1;
            o += (size_t)snprintf(row->name + o, sizeof row->name - o, "%s%s", j > first ? "+" : "", nm);
        }
        n_sum += L->n;
        k = L->k;
        n_float += is_float && is_float(ud, b, G->linears[j]);
    }
    if (last - first > 1 && o < sizeof row->name) snprintf(row->name + o, sizeof row->name - o, ")");
    /* gpt-oss: its experts load only in the layout vLLM's gpt-oss loader streams
     * (tp_serving_gptoss.c). */
    if (cfg->layout == QD_LAYOUT_GPT_OSS && qd_model_linear(m, G->linears[first])->expert >= 0) {
        /* A quantized checkpoint shows its layout; a float model (the pipeline's pre-flight)
         * gets the one its job's format writes. */
        char w13[200];
        snprintf(w13, sizeof w13, "%smlp.experts.0.w13_weight_packed", prefix);
        int per_linear = cfg->quantized && !st_model_find(qd_model_tensors(m), w13);
        qd_tp_serving_gptoss_experts(cfg, q, n_float, per_linear, tp, &row->choice);
        if (!row->choice.fast) out->n_slow++;
        return;
    }
    if (n_float == last - first) {
        row->is_float = 1;
        return;
    }
    if (n_float) {
        row_no_load(out, row, "the fused layer mixes float and quantized members (vLLM gives one fused linear one "
                    "scheme; vllm/model_executor/layers/linear.py)");
        return;
    }
    if (P->no_load[0]) {
        row_no_load(out, row, P->no_load);
        return;
    }
    /* A replicated layer is whole on every rank: vLLM builds it as at tp 1 (LinearBase with
     * disable_tp, or ReplicatedLinear's full input and output sizes). */
    int ltp = P->replicated ? 1 : tp;
    int64_t per_shard = P->per_shard >= 0 ? P->per_shard : n_sum / ltp;
    if (P->per_shard < 0 && !P->row_parallel && n_sum % ltp) per_shard = 0;
    int bits = q->bits;
    int64_t gs = q->group_size;
    int mixed = 0;
    for (int j = first; q->layer_quant && j < last; j++) {
        int bj = 0;
        int64_t gj = 0;
        if (q->layer_quant(q->layer_ud, b, G->linears[j], &bj, &gj)) continue;
        if (j > first && (bj != bits || gj != gs)) mixed = 1;
        bits = bj;
        gs = gj;
    }
    if (mixed) {
        row_no_load(out, row, "the fused layer's members have "
                    "different bits or group sizes (vLLM requires one scheme for all shards of a fused layer; "
                    "vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors.py)");
        return;
    }
    if ((q->row_quant || q->gptq_dynamic) && dynamic_refuses(q, row, bits, gs, k)) {
        out->n_slow++;
        return;
    }
    qd_srv_layer sl = {.format = q->format, .bits = bits, .sym = q->sym, .group_size = gs,
                       .g_idx = q->g_idx, .act = q->act, .in_features = k, .out_features = n_sum,
                       .out_per_shard = per_shard, .row_parallel = P->row_parallel, .tp = ltp, .gpu_cc = gpu_cc,
                       .act_bf16 = qd_srv_served_bf16(qd_model_cfg(m)->torch_dtype, gpu_cc),
                       .n_parts = P->n_members};
    for (int i = 0; i < P->n_members && i < QD_SRV_MAX_PARTS; i++) sl.part_per_shard[i] = P->member_n[i];
    qd_srv_choose(&sl, &row->choice);
    if (!row->choice.fast) out->n_slow++;
    row->in_shard = P->row_parallel ? k / ltp : k;
    row->out_shard = P->row_parallel ? n_sum : per_shard;
}

int qd_tp_serving_check(const qd_model *m, const qd_serving_quant *q, qd_serving_is_float_fn is_float, void *ud,
                        int tp, int gpu_cc, qd_serving_report *out, qd_err *err)
{
    memset(out, 0, sizeof *out);
    if (tp < 1 || !gpu_cc || !q || !q->format)
        return qd_err_set(err, QD_EINVAL, "serving check: tp %d and the GPU must be given", tp);
    const qd_model_config *cfg = qd_model_cfg(m);
    /* vLLM 0.32 registers no Dots1ForCausalLM (vllm/model_executor/models/registry.py): it cannot load it. */
    if (!strcmp(cfg->architecture, "Dots1ForCausalLM"))
        return qd_err_set(err, QD_EUNSUPPORTED, "serving check: vLLM has no %s model (not in vllm/model_executor/models/"
                          "registry.py), so it cannot serve this checkpoint", cfg->architecture);
    /* DeepSeek-V3.2's sparse attention: vLLM's CUDA backends for it are FlashMLA sparse
     * (capability 9.x and 10.x), FlashAttention and FlashInfer MLA sparse on 9.x, FlashInfer MLA
     * sparse on 10.x (supports_compute_capability in vllm/v1/attention/backends/mla/
     * flashmla_sparse.py, flashattn_mla_sparse.py, flashinfer_mla_sparse*.py): none on Ampere. */
    if (cfg->index_topk > 0 && gpu_cc < 90)
        return qd_err_set(err, QD_EUNSUPPORTED, "serving check: %s's sparse attention has no vLLM backend before compute "
                          "capability 9.0 (FlashMLA sparse 9.x/10.x, FlashAttention and FlashInfer MLA sparse 9.x or "
                          "10.x; vllm/v1/attention/backends/mla/)", cfg->architecture);
    size_t cap = 0;
    int o_li = qd_model_group(m, qd_model_attn_out_group(m))->linears[0];   /* attention linears come before it */
    for (int b = 0; b < (int)cfg->n_layers; b++) {
        char prefix[160];
        qd_model_block_prefix(m, b, prefix, sizeof prefix);
        for (int g = 0; g < qd_model_n_groups(m); g++) {
            const qd_input_group *G = qd_model_group(m, g);
            /* Linears this layer does not hold: its dense MLP or its experts
             * (first_k_dense_replace), a hybrid's attention in its recurrent layers and its
             * mixer in its attention layers. */
            if (!qd_model_block_has_linear(m, b, G->linears[0])) continue;
            qd_srv_part parts[QD_MAX_GROUP_LINEARS + 2];
            /* Latent attention's linears are laid out by tp_serving_mla.c. */
            int n = cfg->kv_lora_rank > 0 && G->linears[0] <= o_li
                  ? qd_tp_serving_mla_parts(m, G, tp, parts, (int)(sizeof parts / sizeof parts[0]))
                  : plain_parts(m, G, o_li, tp, parts);
            if (n < 0) {
                qd_tp_serving_report_free(out);
                return qd_err_set(err, QD_EUNSUPPORTED, "serving check: %s's attention group %s holds a linear vLLM's "
                                  "multi-head latent attention does not build", cfg->architecture, G->name);
            }
            for (int p = 0; p < n; p++) {
                qd_serving_row *row;
                if (add_row(out, &cap, &row)) {
                    qd_tp_serving_report_free(out);
                    return qd_err_set(err, QD_ENOMEM, "serving check: out of memory");
                }
                part_row(m, q, is_float, ud, b, prefix, G, &parts[p], tp, gpu_cc, out, row);
            }
        }
    }
    /* vLLM's DeepSeek models never tie the head to the embeddings: DeepseekV2ForCausalLM
     * (vllm/model_executor/models/deepseek_v2.py) builds a ParallelLMHead of its own and
     * loads lm_head.weight, with no tie_word_embeddings branch, so a tied checkpoint (no
     * lm_head tensor) serves with a head never loaded. */
    if (cfg->kv_lora_rank > 0 && cfg->tie_word_embeddings && !strncmp(cfg->architecture, "Deepseek", 8)) {
        qd_serving_row *row;
        if (add_row(out, &cap, &row)) {
            qd_tp_serving_report_free(out);
            return qd_err_set(err, QD_ENOMEM, "serving check: out of memory");
        }
        snprintf(row->name, sizeof row->name, "lm_head");
        row->choice.kernel = QD_SRV_NO_LOAD;
        snprintf(row->choice.why, sizeof row->choice.why, "will not load: tie_word_embeddings is true, and vLLM's %s never "
                 "ties lm_head to the embeddings (it loads lm_head.weight, which a tied checkpoint does not hold) "
                 "[vllm/model_executor/models/deepseek_v2.py]", cfg->architecture);
        out->n_slow++;
    }
    return 0;
}
