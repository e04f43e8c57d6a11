/* Architecture table entries of the post-norm blocks (config_postnorm.c reads their keys).
 * Norm slots as Gemma's: 0 before attention, 1 before the MLP, 2 on the attention output,
 * 3 on the MLP output (model_forward.c applies 2 and 3 before each residual add and skips
 * an empty 0 or 1). */
#include <stddef.h>

#include "quant/model/model_internal.h"

/* OLMo 2/3 and EXAONE 4: the residual stream goes straight into the projections, so q/k/v
 * and gate/up have no norm to fold AWQ's scales into (QD_PREV_NONE: not scaled); o_proj's
 * fold into v_proj's rows and down_proj's into up_proj's as in Llama. The output norms act
 * on sub-block outputs and are never folded. */
static const qd_arch arch_postnorm = {
    .name = "postnorm",
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
        {"attn_in", QD_PREV_NONE, NULL},
        {"attn_out", QD_PREV_LINEAR, "self_attn.v_proj"},
        {"mlp_in", QD_PREV_NONE, NULL},
        {"mlp_out", QD_PREV_LINEAR, "mlp.up_proj"},
    },
    .norms = {NULL, NULL, "post_attention_layernorm", "post_feedforward_layernorm"},
    .layernorm = 0,
    .embed = "model.embed_tokens.weight",
    .final_norm = "model.norm",
    .lm_head = "lm_head.weight",
};

/* GLM-4 (0414): input_layernorm before attention, post_self_attn_layernorm on its output,
 * post_attention_layernorm before the MLP (whose gate and up are one gate_up_proj, as
 * Phi-3's), post_mlp_layernorm on its output. AWQ folds q/k/v into input_layernorm,
 * gate_up_proj into post_attention_layernorm, o_proj into v_proj's rows and down_proj into
 * the up rows (the last FF rows) of gate_up_proj. */
static const qd_arch arch_glm4 = {
    .name = "glm4",
    .family = QD_ARCH_LLAMA,
    .block_fmt = "model.layers.%d.",
    .fused_gate_up = 1,
    .lin_o = 3,
    .lin_mlp0 = 4,
    .n_linears = 6,
    .linears = {
        LLAMA_ATTN_LINEARS,
        {"mlp.gate_up_proj", 2, QD_DIM_FF2, QD_DIM_HIDDEN, QD_BIAS_MLP},
        {"mlp.down_proj", 3, QD_DIM_HIDDEN, QD_DIM_FF, QD_BIAS_MLP},
    },
    .n_groups = 4,
    .groups = {
        {"attn_in", QD_PREV_NORM, "input_layernorm"},
        {"attn_out", QD_PREV_LINEAR, "self_attn.v_proj"},
        {"mlp_in", QD_PREV_NORM, "post_attention_layernorm"},
        {"mlp_out", QD_PREV_LINEAR, "mlp.gate_up_proj", 1, QD_DIM_FF},
    },
    .norms = {"input_layernorm", "post_attention_layernorm", "post_self_attn_layernorm", "post_mlp_layernorm"},
    .layernorm = 0,
    .embed = "model.embed_tokens.weight",
    .final_norm = "model.norm",
    .lm_head = "lm_head.weight",
};

const qd_arch *qd_arch_postnorm_for(const qd_model_config *c)
{
    return c->layout == QD_LAYOUT_GLM4 ? &arch_glm4 : c->layout == QD_LAYOUT_POSTNORM ? &arch_postnorm : NULL;
}
