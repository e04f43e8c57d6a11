/* Architecture table entries of the MoE families with standard (non-latent) attention that
 * follow DeepSeek-V3's or Mixtral's MoE block (docs/methods.md, "Mixture of experts"):
 *
 * - GLM-4.5/4.6 (Glm4MoeForCausalLM) and dots.llm1 (Dots1ForCausalLM): Llama attention, a
 *   dense SwiGLU (mlp.gate_proj/up_proj/down_proj) in layers [0, first_k_dense_replace),
 *   then mlp.gate (+ its e_score_correction_bias), mlp.experts.N.* and mlp.shared_experts.
 *   AWQ folds as DeepSeek's dense MLP and experts do, attention as Llama's.
 * - MiniMax-M2 (MiniMaxM2ForCausalLM): Mixtral's block_sparse_moe with the routing bias
 *   block_sparse_moe.e_score_correction_bias beside its gate.
 *
 * - ERNIE 4.5 MoE (Ernie4_5_MoeForCausalLM): the GLM layout with its dense layers anywhere
 *   (moe_layer_start_index / end_index / interval) and the routing bias stored [1, experts]
 *   as mlp.moe_statics.e_score_correction_bias.
 *
 * - PhiMoE (PhimoeForCausalLM): Mixtral's block_sparse_moe (gate, experts.N.w1/w3/w2) with
 *   LayerNorms (weight and bias: AWQ divides both, as StarCoder2's), q/k/v/o biased with
 *   attention_bias, lm_head.bias with lm_head_bias. AWQ folds as Mixtral's.
 *
 * OLMoE needs no entry of its own: its tensors are Qwen-MoE's (arch_qwen_moe). */
#include <stddef.h>

#include "quant/model/model_internal.h"

static const qd_arch arch_moe_shared = {
    .name = "moe_shared",
    .family = QD_ARCH_LLAMA,
    .block_fmt = "model.layers.%d.",
    .lin_o = 3,
    .lin_mlp0 = 4,
    .n_linears = 7,
    .linears = {
        LLAMA_ATTN_LINEARS,
        LLAMA_MLP_LINEARS,
    },
    .n_groups = 4,
    .groups = {
        LLAMA_GROUPS,
    },
    .norms = {"input_layernorm", "post_attention_layernorm"},
    .embed = "model.embed_tokens.weight",
    .final_norm = "model.norm",
    .lm_head = "lm_head.weight",
    .router = "mlp.gate",
    .router_bias = "mlp.gate.e_score_correction_bias",
    .expert_fmt = "mlp.experts.%d.",
    .expert_lin = {"gate_proj", "up_proj", "down_proj"},
    .shared_prefix = "mlp.shared_experts.",
};

static const qd_arch arch_ernie_moe = {
    .name = "ernie4_5_moe",
    .family = QD_ARCH_LLAMA,
    .block_fmt = "model.layers.%d.",
    .lin_o = 3,
    .lin_mlp0 = 4,
    .n_linears = 7,
    .linears = {
        LLAMA_ATTN_LINEARS,
        LLAMA_MLP_LINEARS,
    },
    .n_groups = 4,
    .groups = {
        LLAMA_GROUPS,
    },
    .norms = {"input_layernorm", "post_attention_layernorm"},
    .embed = "model.embed_tokens.weight",
    .final_norm = "model.norm",
    .lm_head = "lm_head.weight",
    .router = "mlp.gate",
    .router_bias = "mlp.moe_statics.e_score_correction_bias",
    .router_bias_2d = 1,
    .expert_fmt = "mlp.experts.%d.",
    .expert_lin = {"gate_proj", "up_proj", "down_proj"},
    .shared_prefix = "mlp.shared_experts.",
};

static const qd_arch arch_minimax = {
    .name = "minimax_m2",
    .family = QD_ARCH_LLAMA,
    .block_fmt = "model.layers.%d.",
    .lin_o = 3,
    .lin_mlp0 = 4,
    .n_linears = 4,
    .linears = {
        LLAMA_ATTN_LINEARS,
    },
    .n_groups = 2,
    .groups = {
        {"attn_in", QD_PREV_NORM, "input_layernorm"},
        {"attn_out", QD_PREV_LINEAR, "self_attn.v_proj"},
    },
    .norms = {"input_layernorm", "post_attention_layernorm"},
    .embed = "model.embed_tokens.weight",
    .final_norm = "model.norm",
    .lm_head = "lm_head.weight",
    .router = "block_sparse_moe.gate",
    .router_bias = "block_sparse_moe.e_score_correction_bias",
    .expert_fmt = "block_sparse_moe.experts.%d.",
    .expert_lin = {"w1", "w3", "w2"},
};

static const qd_arch arch_phimoe = {
    .name = "phimoe",
    .family = QD_ARCH_LLAMA,
    .block_fmt = "model.layers.%d.",
    .lin_o = 3,
    .lin_mlp0 = 4,
    .n_linears = 4,
    .linears = {
        LLAMA_ATTN_LINEARS,
    },
    .n_groups = 2,
    .groups = {
        {"attn_in", QD_PREV_NORM, "input_layernorm"},
        {"attn_out", QD_PREV_LINEAR, "self_attn.v_proj"},
    },
    .norms = {"input_layernorm", "post_attention_layernorm"},
    .layernorm = 1,
    .embed = "model.embed_tokens.weight",
    .final_norm = "model.norm",
    .lm_head = "lm_head.weight",
    .lm_head_bias = "lm_head.bias",
    .router = "block_sparse_moe.gate",
    .expert_fmt = "block_sparse_moe.experts.%d.",
    .expert_lin = {"w1", "w3", "w2"},
};

const qd_arch *qd_arch_moe_for(const qd_model_config *c)
{
    if (c->family != QD_ARCH_LLAMA) return NULL;
    if (c->layout == QD_LAYOUT_MOE_SHARED) return &arch_moe_shared;
    if (c->layout == QD_LAYOUT_MINIMAX) return &arch_minimax;
    if (c->layout == QD_LAYOUT_ERNIE_MOE) return &arch_ernie_moe;
    if (c->layout == QD_LAYOUT_PHIMOE) return &arch_phimoe;
    return NULL;
}
