/* Multi-head latent attention as vLLM 0.32 builds it (DeepSeek-V2, V3, V3.2, and what loads
 * as DeepseekV3ForCausalLM): vllm/model_executor/models/deepseek_v2.py,
 * DeepseekV2MLAAttention.__init__, the attention every MLA config gets on GPUs
 * (DeepseekV2DecoderLayer picks it when model_config.use_mla; quantd's MLA always has
 * qk_rope_head_dim > 0, so never the MHA DeepseekAttention), and V3.2's
 * vllm/models/deepseek_v32/attention.py (DeepseekV32Attention, DeepseekV32Indexer; the CUDA
 * model, nvidia/model.py, loads the same names):
 *   q_lora_rank set: q_a_proj and kv_a_proj_with_mqa are one DeepSeekV2FusedQkvAProjLinear
 *     "fused_qkv_a_proj", a MergedColumnParallelLinear with disable_tp=True (tp_size 1 in
 *     layers/linear.py: the whole [q_lora_rank; kv_lora_rank + qk_rope_head_dim] on every
 *     rank), one quant_method for both; load_weights stacks the checkpoint's
 *     self_attn.q_a_proj.* and self_attn.kv_a_proj_with_mqa.* into it (stacked_params_mapping
 *     shards 0 and 1; DeepseekV2ForCausalLM.packed_modules_mapping names the pair for the
 *     quantization config). q_b_proj: ColumnParallelLinear, heads split.
 *   q_lora_rank null (V2-Lite): q_proj ColumnParallelLinear, heads split; kv_a_proj_with_mqa
 *     ReplicatedLinear (loaded under its own name: fused_qkv_a_proj is not a parameter).
 *   kv_b_proj: ColumnParallelLinear, heads split. Its weight is also dequantized once at load
 *     for the absorbed W_UK / W_UV (layers/attention/mla_attention.py split_kv_b_proj ->
 *     quantization/utils/quant_utils.py get_and_maybe_dequant_weights: FP8 by its scales,
 *     every other method by applying the layer to an identity), so any method that serves it
 *     serves that too; prefill runs kv_b_proj itself.
 *   o_proj: RowParallelLinear.
 *   V3.2's indexer: wq_b ReplicatedLinear with the quant_config; wk and weights_proj one
 *     MergedColumnParallelLinear "wk_weights_proj" with quant_config=None and disable_tp
 *     (float, as quantd keeps them).
 * Both attentions assert num_heads % tp_size == 0. With VLLM_MLA_DISABLE vLLM builds
 * DeepseekV2Attention instead, q_a_proj a ReplicatedLinear of its own; the rows follow the
 * default. */
#include "quant/tp/tp_serving_parts.h"

#include <stdio.h>
#include <string.h>

static int named(const qd_model *m, const qd_input_group *G, int j, const char *name)
{
    return j < G->n_linears && !strcmp(qd_model_linear(m, G->linears[j])->name, name);
}

int qd_tp_serving_mla_parts(const qd_model *m, const qd_input_group *G, int tp, qd_srv_part *parts, int cap)
{
    const qd_model_config *c = qd_model_cfg(m);
    int n = 0;
    for (int j = 0; j < G->n_linears; j++) {
        if (n + 2 > cap) return -1;
        qd_srv_part *p = &parts[n++];
        *p = (qd_srv_part){.first = j, .last = j + 1, .per_shard = -1};
        if (c->q_lora_rank > 0 && named(m, G, j, "self_attn.q_a_proj") && named(m, G, j + 1, "self_attn.kv_a_proj_with_mqa")) {
            p->last = j + 2;
            p->fused = "fused_qkv_a_proj";
            p->replicated = 1;
            p->n_members = 2;
            p->member_n[0] = c->q_lora_rank;
            p->member_n[1] = c->kv_lora_rank + c->qk_rope_dim;
            j++;
        } else if (c->q_lora_rank == 0 && named(m, G, j, "self_attn.kv_a_proj_with_mqa")) {
            p->replicated = 1;
        } else if (named(m, G, j, "self_attn.indexer.wq_b")) {
            p->replicated = 1;
            parts[n++] = (qd_srv_part){.name = "self_attn.indexer.wk_weights_proj (wk+weights_proj)", .replicated = 1};
        } else if (named(m, G, j, c->q_lora_rank > 0 ? "self_attn.q_b_proj" : "self_attn.q_proj") ||
                   named(m, G, j, "self_attn.kv_b_proj") || named(m, G, j, "self_attn.o_proj")) {
            p->row_parallel = named(m, G, j, "self_attn.o_proj");
            if (c->n_heads % tp)
                snprintf(p->no_load, sizeof p->no_load, "num_attention_heads %lld does not split over %d ranks "
                         "(DeepseekV2MLAAttention asserts num_heads %% tp_size == 0)", (long long)c->n_heads, tp);
            else if (!p->row_parallel)
                p->per_shard = qd_model_linear(m, G->linears[j])->n / tp;
        } else {
            return -1;
        }
    }
    return n;
}
