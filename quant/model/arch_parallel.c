/* The architecture table entries of the LayerNorm rotary families with a plain MLP (one
 * fc1 -> activation -> fc2, biases; model_forward.c runs them): StarCoder2 (the Llama block
 * shape), Phi and GPT-NeoX (the parallel block: attention and MLP both read the block's
 * input, config.parallel_block).
 *
 * AWQ folds (docs/architecture.md): a group after a LayerNorm folds into its weight and bias.
 * Phi's q/k/v and fc1 read the same input_layernorm output, so they are ONE input group
 * folded into it (as they share one Hessian). o_proj / dense folds into v_proj's rows where
 * they are separate (StarCoder2, Phi); GPT-NeoX's v rows are spread over query_key_value's
 * per-head layout, so dense is not folded (QD_PREV_NONE). fc2's input follows GELU, which is
 * not positively homogeneous (gelu(x / s) != gelu(x) / s), so it has no exact fold either. */
#include <stddef.h>

#include "quant/model/model_internal.h"

static const qd_arch arch_starcoder2 = {
    .name = "starcoder2",
    .family = QD_ARCH_LLAMA,
    .block_fmt = "model.layers.%d.",
    .lin_o = 3,
    .lin_mlp0 = 4,
    .n_linears = 6,
    .linears = {
        LLAMA_ATTN_LINEARS,
        {"mlp.c_fc", 2, QD_DIM_FF, QD_DIM_HIDDEN, QD_BIAS_MLP},
        {"mlp.c_proj", 3, QD_DIM_HIDDEN, QD_DIM_FF, QD_BIAS_MLP},
    },
    .n_groups = 4,
    .groups = {
        {"attn_in", QD_PREV_NORM, "input_layernorm"},
        {"attn_out", QD_PREV_LINEAR, "self_attn.v_proj"},
        {"mlp_in", QD_PREV_NORM, "post_attention_layernorm"},
        {"mlp_out", QD_PREV_NONE, NULL},
    },
    .norms = {"input_layernorm", "post_attention_layernorm"},
    .layernorm = 1,
    .embed = "model.embed_tokens.weight",
    .final_norm = "model.norm",
    .lm_head = "lm_head.weight",
};

/* Phi: one input_layernorm feeds q/k/v and fc1 (group attn_in, four linears). */
static const qd_arch arch_phi = {
    .name = "phi",
    .family = QD_ARCH_LLAMA,
    .block_fmt = "model.layers.%d.",
    .lin_o = 3,
    .lin_mlp0 = 4,
    .n_linears = 6,
    .linears = {
        {"self_attn.q_proj", 0, QD_DIM_Q, QD_DIM_HIDDEN, QD_BIAS_QKV},
        {"self_attn.k_proj", 0, QD_DIM_KV, QD_DIM_HIDDEN, QD_BIAS_QKV},
        {"self_attn.v_proj", 0, QD_DIM_KV, QD_DIM_HIDDEN, QD_BIAS_QKV},
        {"self_attn.dense", 1, QD_DIM_HIDDEN, QD_DIM_Q, QD_BIAS_O},
        {"mlp.fc1", 0, QD_DIM_FF, QD_DIM_HIDDEN, QD_BIAS_MLP},
        {"mlp.fc2", 2, QD_DIM_HIDDEN, QD_DIM_FF, QD_BIAS_MLP},
    },
    .n_groups = 3,
    .groups = {
        {"attn_in", QD_PREV_NORM, "input_layernorm"},
        {"attn_out", QD_PREV_LINEAR, "self_attn.v_proj"},
        {"mlp_out", QD_PREV_NONE, NULL},
    },
    .norms = {"input_layernorm"},
    .layernorm = 1,
    .embed = "model.embed_tokens.weight",
    .final_norm = "model.final_layernorm",
    .lm_head = "lm_head.weight",
    .lm_head_bias = "lm_head.bias",
};

/* GPT-NeoX / Pythia: query_key_value is [heads, 3, head_dim] (transformers views its output
 * as (..., heads, 3 * head_size) and chunks q, k, v out of each head), so it is fused per
 * head, not [q; k; v]. input_layernorm feeds the attention, post_attention_layernorm the MLP
 * (of the block's input with use_parallel_residual, of the stream after attention without). */
static const qd_arch arch_neox = {
    .name = "gpt_neox",
    .family = QD_ARCH_LLAMA,
    .block_fmt = "gpt_neox.layers.%d.",
    .fused_qkv = 1,
    .qkv_per_head = 1,
    .lin_o = 1,
    .lin_mlp0 = 2,
    .n_linears = 4,
    .linears = {
        {"attention.query_key_value", 0, QD_DIM_QKV, QD_DIM_HIDDEN, QD_BIAS_QKV},
        {"attention.dense", 1, QD_DIM_HIDDEN, QD_DIM_Q, QD_BIAS_O},
        {"mlp.dense_h_to_4h", 2, QD_DIM_FF, QD_DIM_HIDDEN, QD_BIAS_MLP},
        {"mlp.dense_4h_to_h", 3, QD_DIM_HIDDEN, QD_DIM_FF, QD_BIAS_MLP},
    },
    .n_groups = 4,
    .groups = {
        {"attn_in", QD_PREV_NORM, "input_layernorm"},
        {"attn_out", QD_PREV_NONE, NULL},
        {"mlp_in", QD_PREV_NORM, "post_attention_layernorm"},
        {"mlp_out", QD_PREV_NONE, NULL},
    },
    .norms = {"input_layernorm", "post_attention_layernorm"},
    .layernorm = 1,
    .embed = "gpt_neox.embed_in.weight",
    .final_norm = "gpt_neox.final_layer_norm",
    .lm_head = "embed_out.weight",
};

/* Cohere2 (Command R7B): one mean-centred LayerNorm without bias feeds q/k/v and gate/up
 * (one input group of five linears, folded into its weight); o_proj folds into v_proj's
 * rows, down_proj into up_proj's (SwiGLU: silu(g) * (u / s) = (silu(g) * u) / s). */
static const qd_arch arch_cohere2 = {
    .name = "cohere2",
    .family = QD_ARCH_LLAMA,
    .block_fmt = "model.layers.%d.",
    .lin_o = 3,
    .lin_mlp0 = 4,
    .n_linears = 7,
    .linears = {
        LLAMA_ATTN_LINEARS,
        {"mlp.gate_proj", 0, QD_DIM_FF, QD_DIM_HIDDEN, QD_BIAS_MLP},
        {"mlp.up_proj", 0, QD_DIM_FF, QD_DIM_HIDDEN, QD_BIAS_MLP},
        {"mlp.down_proj", 2, QD_DIM_HIDDEN, QD_DIM_FF, QD_BIAS_MLP},
    },
    .n_groups = 3,
    .groups = {
        {"attn_in", QD_PREV_NORM, "input_layernorm"},
        {"attn_out", QD_PREV_LINEAR, "self_attn.v_proj"},
        {"mlp_out", QD_PREV_LINEAR, "mlp.up_proj"},
    },
    .norms = {"input_layernorm"},
    .layernorm = 1,
    .norm_no_bias = 1,
    .embed = "model.embed_tokens.weight",
    .final_norm = "model.norm",
    .lm_head = "lm_head.weight",
};

const qd_arch *qd_arch_plain_for(const qd_model_config *c)
{
    switch (c->layout) {
    case QD_LAYOUT_STARCODER2: return &arch_starcoder2;
    case QD_LAYOUT_PHI: return &arch_phi;
    case QD_LAYOUT_NEOX: return &arch_neox;
    case QD_LAYOUT_COHERE2: return &arch_cohere2;
    default: return NULL;
    }
}
