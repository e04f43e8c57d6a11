/* Llama 4 text's architecture table entry (Llama4ForCausalLM): Llama attention, then under
 * feed_forward. either a dense SwiGLU (gate_proj, up_proj, down_proj of
 * intermediate_size_mlp) or, on the MoE layers, router [E, H] (no bias), the experts as
 * fused 3-D tensors — experts.gate_up_proj [E, H, 2 FF], the input dimension first (x @ W),
 * gate in columns [0, FF) and up in [FF, 2 FF), and experts.down_proj [E, FF, H] — read as
 * per-expert gate_proj, up_proj and down_proj (model_gptoss.c; a quantized output names
 * them feed_forward.experts.N.*, as vLLM's Llama4 loader takes them), and shared_expert.*.
 *
 * AWQ: input_layernorm into q/k/v (the L2 q/k norm comes after the projections, and the
 * temperature only scales queries); o_proj into v_proj's rows; the dense MLP as Llama's.
 * The experts' shared input is not scaled (the norm also feeds the router and the shared
 * expert, model_load.c describe_expert). Each expert's down_proj reads silu(gate(z)) up(z)
 * with z = sigmoid(score) x: linear in up's rows whatever z is, so it folds into its own
 * up_proj's rows, the shared expert's likewise. */
#include <stddef.h>

#include "quant/model/model_internal.h"

const qd_arch qd_arch_llama4 = {
    .name = "llama4",
    .family = QD_ARCH_LLAMA,
    .block_fmt = "model.layers.%d.",
    .lin_o = 3,
    .lin_mlp0 = 4,
    .n_linears = 7,
    .linears = {
        LLAMA_ATTN_LINEARS,
        {"feed_forward.gate_proj", 2, QD_DIM_FF, QD_DIM_HIDDEN, QD_BIAS_MLP},
        {"feed_forward.up_proj", 2, QD_DIM_FF, QD_DIM_HIDDEN, QD_BIAS_MLP},
        {"feed_forward.down_proj", 3, QD_DIM_HIDDEN, QD_DIM_FF, QD_BIAS_MLP},
    },
    .n_groups = 4,
    .groups = {
        {"attn_in", QD_PREV_NORM, "input_layernorm"},
        {"attn_out", QD_PREV_LINEAR, "self_attn.v_proj"},
        {"mlp_in", QD_PREV_NORM, "post_attention_layernorm"},
        {"mlp_out", QD_PREV_LINEAR, "feed_forward.up_proj"},
    },
    .norms = {"input_layernorm", "post_attention_layernorm"},
    .embed = "model.embed_tokens.weight",
    .final_norm = "model.norm",
    .lm_head = "lm_head.weight",
    .router = "feed_forward.router",
    .expert_fmt = "feed_forward.experts.%d.",
    .expert_lin = {"gate_proj", "up_proj", "down_proj"},
    .shared_prefix = "feed_forward.shared_expert.",
    .experts_fused = "feed_forward.experts.",
    .experts_fused_halves = 1,
};
