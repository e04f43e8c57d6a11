/* gpt-oss's architecture table entry: Llama attention whose q/k/v/o carry biases and whose
 * softmax has a learned sink per head (self_attn.sinks), then every layer's MoE MLP —
 * mlp.router [E, H] with a bias, and E experts that the checkpoint holds as fused 3-D
 * tensors (mlp.experts.gate_up_proj [E, H, 2 FF] with gate and up interleaved column by
 * column, down_proj [E, FF, H], each with a bias [E, ...]). model_gptoss.c reads them as
 * per-expert gate_proj, up_proj and down_proj linears [N, K] with biases, which is also how
 * a quantized output names them (mlp.experts.N.gate_proj, ...).
 *
 * AWQ: input_layernorm folds into q/k/v as in Llama; o_proj's scales fold into v_proj's rows
 * and bias (the attention output is linear in v, sinks or not). The experts' shared input
 * follows the MoE rule (model_load.c describe_expert), and down_proj's input, the clamped
 * SwiGLU (up + 1) * glu(gate), is not linear in up's rows: QD_PREV_NONE there. */
#include <stddef.h>

#include "quant/model/model_internal.h"

const qd_arch qd_arch_gpt_oss = {
    .name = "gpt_oss",
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
    .router = "mlp.router",
    .router_bias = "mlp.router.bias",
    .expert_fmt = "mlp.experts.%d.",
    .expert_lin = {"gate_proj", "up_proj", "down_proj"},
    .expert_bias = 1,
    .experts_fused = "mlp.experts.",
    .sinks = "self_attn.sinks",
};
