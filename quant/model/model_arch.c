/* The architecture table: each supported family described as data — tensor names, the
 * block's linears with their shapes, which linears share an input, and what operator each
 * input follows (for folding AWQ scales). Adding a family that fits the llama or OPT block
 * shape is one entry here. */
#include <stddef.h>

#include "quant/model/model_internal.h"

static const qd_arch arch_llama = {
    .name = "llama",
    .family = QD_ARCH_LLAMA,
    .block_fmt = "model.layers.%d.",
    .n_linears = 7,
    .linears = {
        {"self_attn.q_proj", 0, QD_DIM_Q, QD_DIM_HIDDEN, QD_BIAS_QKV},
        {"self_attn.k_proj", 0, QD_DIM_KV, QD_DIM_HIDDEN, QD_BIAS_QKV},
        {"self_attn.v_proj", 0, QD_DIM_KV, QD_DIM_HIDDEN, QD_BIAS_QKV},
        {"self_attn.o_proj", 1, QD_DIM_HIDDEN, QD_DIM_Q, QD_BIAS_O},
        {"mlp.gate_proj", 2, QD_DIM_FF, QD_DIM_HIDDEN, QD_BIAS_MLP},
        {"mlp.up_proj", 2, QD_DIM_FF, QD_DIM_HIDDEN, QD_BIAS_MLP},
        {"mlp.down_proj", 3, QD_DIM_HIDDEN, QD_DIM_FF, QD_BIAS_MLP},
    },
    .n_groups = 4,
    .groups = {
        {"attn_in", QD_PREV_NORM, "input_layernorm"},
        {"attn_out", QD_PREV_LINEAR, "self_attn.v_proj"},
        {"mlp_in", QD_PREV_NORM, "post_attention_layernorm"},
        {"mlp_out", QD_PREV_LINEAR, "mlp.up_proj"},
    },
    .norms = {"input_layernorm", "post_attention_layernorm"},
    .layernorm = 0,
    .embed = "model.embed_tokens.weight",
    .embed_pos = NULL,
    .final_norm = "model.norm",
    .lm_head = "lm_head.weight",
    .project_in = NULL,
    .project_out = NULL,
};

static const qd_arch arch_opt = {
    .name = "opt",
    .family = QD_ARCH_OPT,
    .block_fmt = "model.decoder.layers.%d.",
    .n_linears = 6,
    .linears = {
        {"self_attn.q_proj", 0, QD_DIM_HIDDEN, QD_DIM_HIDDEN, QD_BIAS_QKV},
        {"self_attn.k_proj", 0, QD_DIM_HIDDEN, QD_DIM_HIDDEN, QD_BIAS_QKV},
        {"self_attn.v_proj", 0, QD_DIM_HIDDEN, QD_DIM_HIDDEN, QD_BIAS_QKV},
        {"self_attn.out_proj", 1, QD_DIM_HIDDEN, QD_DIM_HIDDEN, QD_BIAS_O},
        {"fc1", 2, QD_DIM_FF, QD_DIM_HIDDEN, QD_BIAS_MLP},
        {"fc2", 3, QD_DIM_HIDDEN, QD_DIM_FF, QD_BIAS_MLP},
    },
    .n_groups = 4,
    .groups = {
        {"attn_in", QD_PREV_NORM, "self_attn_layer_norm"},
        {"attn_out", QD_PREV_LINEAR, "self_attn.v_proj"},
        {"mlp_in", QD_PREV_NORM, "final_layer_norm"},
        {"mlp_out", QD_PREV_LINEAR, "fc1"},
    },
    .norms = {"self_attn_layer_norm", "final_layer_norm"},
    .layernorm = 1,
    .embed = "model.decoder.embed_tokens.weight",
    .embed_pos = "model.decoder.embed_positions.weight",
    .final_norm = "model.decoder.final_layer_norm",
    .lm_head = "lm_head.weight",
    .project_in = "model.decoder.project_in.weight",
    .project_out = "model.decoder.project_out.weight",
};

const qd_arch *qd_arch_for(qd_arch_family family)
{
    switch (family) {
    case QD_ARCH_LLAMA: return &arch_llama;
    case QD_ARCH_OPT: return &arch_opt;
    default: return NULL;
    }
}
