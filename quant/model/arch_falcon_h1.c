/* Falcon-H1's architecture table entry (FalconH1DecoderLayer): every layer holds llama
 * attention and a Mamba-2 mixer (model_mixer.c), both reading input_layernorm's output, their
 * outputs summed into the residual stream; then pre_ff_layernorm and feed_forward's SwiGLU.
 * The block runs whole (config parallel_block; model_forward.c), as the hooks of the two
 * branches see scaled copies of one normed input.
 *
 * AWQ folds: input_layernorm feeds q/k/v (times attention_in_multiplier) and mamba.in_proj
 * (times ssm_in_multiplier) in every layer, two groups with two inputs: a scale folded into
 * the norm for one would change the other's input, so neither folds (QD_PREV_NONE).
 * o_proj's input is the attention over v: its scales fold into v_proj's rows as Llama's.
 * mamba.out_proj's input is the scan's output gated by silu(z): no fold (QD_PREV_NONE, as
 * Granite-4's). The MLP's gate_multiplier acts after gate_proj, down_multiplier after
 * down_proj, so pre_ff_layernorm and up_proj take the MLP's scales exactly as Llama's.
 *
 * The quantized linears are those vLLM 0.32 builds with the quant_config
 * (vllm/model_executor/models/falcon_h1.py: FalconH1AttentionDecoderLayer's qkv_proj and
 * o_proj, FalconH1MLP's gate_up_proj and down_proj, MambaMixer2's in_proj and out_proj —
 * layers/mamba/mamba_mixer2.py, whose conv1d has quant_config=None); the convolution, A_log,
 * D, dt_bias and the gated norm stay float, as for Granite-4. */
#include <stddef.h>

#include "quant/model/model_internal.h"

const qd_arch qd_arch_falcon_h1 = {
    .name = "falcon_h1",
    .family = QD_ARCH_LLAMA,
    .block_fmt = "model.layers.%d.",
    .lin_o = 3,
    .lin_mix_in = 4,
    .lin_mix_out = 5,
    .lin_mlp0 = 6,
    .n_linears = 9,
    .linears = {
        LLAMA_ATTN_LINEARS,
        {"mamba.in_proj", 2, QD_DIM_SSM_IN, QD_DIM_HIDDEN, QD_BIAS_MIXER, QD_ON_EVERY_LAYER},
        {"mamba.out_proj", 3, QD_DIM_HIDDEN, QD_DIM_SSM_INNER, QD_BIAS_MIXER, QD_ON_EVERY_LAYER},
        {"feed_forward.gate_proj", 4, QD_DIM_FF, QD_DIM_HIDDEN, QD_BIAS_MLP, QD_ON_EVERY_LAYER},
        {"feed_forward.up_proj", 4, QD_DIM_FF, QD_DIM_HIDDEN, QD_BIAS_MLP, QD_ON_EVERY_LAYER},
        {"feed_forward.down_proj", 5, QD_DIM_HIDDEN, QD_DIM_FF, QD_BIAS_MLP, QD_ON_EVERY_LAYER},
    },
    .n_groups = 6,
    .groups = {
        {"attn_in", QD_PREV_NONE, NULL},
        {"attn_out", QD_PREV_LINEAR, "self_attn.v_proj"},
        {"mamba_in", QD_PREV_NONE, NULL},
        {"mamba_out", QD_PREV_NONE, NULL},
        {"mlp_in", QD_PREV_NORM, "pre_ff_layernorm"},
        {"mlp_out", QD_PREV_LINEAR, "feed_forward.up_proj"},
    },
    .norms = {"input_layernorm", "pre_ff_layernorm"},
    .embed = "model.embed_tokens.weight",
    .final_norm = "model.final_layernorm",
    .lm_head = "lm_head.weight",
};
