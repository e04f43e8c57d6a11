/* Architecture table entries of the dense families whose block is not Llama's by tensor
 * names or order (config_dense.c reads their keys). Apertus: Llama attention with q/k norms, its
 * norms named attention_layernorm and feedforward_layernorm, and a non-gated MLP (up_proj,
 * xIELU with the layer's learned parameters under mlp.act_fn, down_proj). AWQ folds the
 * attention's and the MLP's inputs into those norms and o_proj's into v_proj's rows;
 * down_proj's input follows xIELU, which no scale passes through exactly (x^2 on one side,
 * expm1 on the other), so it is not scaled (QD_PREV_NONE). */
#include <string.h>

#include "quant/model/model_internal.h"

static const qd_arch arch_apertus = {
    .name = "apertus",
    .family = QD_ARCH_LLAMA,
    .block_fmt = "model.layers.%d.",
    .lin_o = 3,
    .lin_mlp0 = 4,
    .n_linears = 6,
    .linears = {
        LLAMA_ATTN_LINEARS,
        {"mlp.up_proj", 2, QD_DIM_FF, QD_DIM_HIDDEN, QD_BIAS_MLP},
        {"mlp.down_proj", 3, QD_DIM_HIDDEN, QD_DIM_FF, QD_BIAS_MLP},
    },
    .n_groups = 4,
    .groups = {
        {"attn_in", QD_PREV_NORM, "attention_layernorm"},
        {"attn_out", QD_PREV_LINEAR, "self_attn.v_proj"},
        {"mlp_in", QD_PREV_NORM, "feedforward_layernorm"},
        {"mlp_out", QD_PREV_NONE, NULL},
    },
    .norms = {"attention_layernorm", "feedforward_layernorm"},
    .embed = "model.embed_tokens.weight",
    .final_norm = "model.norm",
    .lm_head = "lm_head.weight",
    .mlp_ungated = 1,
    .xielu = "mlp.act_fn",
};

/* Hunyuan dense (HunYuanDenseV1): Llama's block with per-head query_layernorm and
 * key_layernorm applied to RoPE's output. The fold is Llama's: the norms act on q and k,
 * never on v, so o_proj's input still folds into v_proj's rows. */
static const qd_arch arch_hunyuan = {
    .name = "hunyuan_dense",
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
    .qk_norms = {"self_attn.query_layernorm.weight", "self_attn.key_layernorm.weight"},
    .qk_norm_post_rope = 1,
};

const qd_arch *qd_arch_dense_for(const qd_model_config *c)
{
    if (!strcmp(c->architecture, "ApertusForCausalLM")) return &arch_apertus;
    if (!strcmp(c->architecture, "HunYuanDenseV1ForCausalLM")) return &arch_hunyuan;
    return NULL;
}
