/* The architecture table entries of the hybrids: each layer is an attention layer or a
 * recurrent one (config layer_mixer), and the table lists both kinds' linears, each marked
 * with the layers that hold it (qd_model_block_has_linear), then the MLP every layer has.
 * The recurrent mixer itself is model_mixer.c.
 *
 * AWQ folds: the mixer's in_proj reads the layer's input norm (as q/k/v do); LFM2's conv
 * out_proj reads C * conv(B * x), whose channel c is C's channel c times a product that
 * does not involve C, so its scales fold exactly into C's rows of in_proj (the second
 * third); Mamba-2's out_proj reads a gated RMSNorm over groups of channels whose weight is
 * not one of the block's norms: not folded (QD_PREV_NONE).
 *
 * The quantized linears are those vLLM 0.32 builds with the quant_config: LFM2's conv.in_proj
 * and conv.out_proj (vllm/model_executor/layers/mamba/short_conv.py lines 69-80; its conv,
 * lines 57-61, takes none, and is no linear here), Mamba-2's in_proj and out_proj
 * (layers/mamba/mamba_mixer2.py lines 368, 387, 502; conv1d has quant_config=None, lines 354,
 * 379), and the attention and MLP linears (models/lfm2.py and models/granitemoehybrid.py
 * packed_modules_mapping: qkv_proj, w13 / input_linear, in_proj). The convolution, A_log, D,
 * dt_bias and the gated norm stay float (model_mixer.c). */
#include <stddef.h>

#include "quant/model/model_internal.h"

#define ATTN_LAYER QD_ON_MIXER(QD_MIXER_ATTENTION)

/* LFM2: operator_norm before the mixer (attention with per-head q_layernorm / k_layernorm,
 * or the short convolution), ffn_norm before feed_forward; embedding_norm at the end. */
static const qd_arch arch_lfm2 = {
    .name = "lfm2",
    .family = QD_ARCH_LLAMA,
    .block_fmt = "model.layers.%d.",
    .lin_o = 3,
    .lin_mix_in = 4,
    .lin_mix_out = 5,
    .lin_mlp0 = 6,
    .n_linears = 9,
    .linears = {
        {"self_attn.q_proj", 0, QD_DIM_Q, QD_DIM_HIDDEN, QD_BIAS_QKV, ATTN_LAYER},
        {"self_attn.k_proj", 0, QD_DIM_KV, QD_DIM_HIDDEN, QD_BIAS_QKV, ATTN_LAYER},
        {"self_attn.v_proj", 0, QD_DIM_KV, QD_DIM_HIDDEN, QD_BIAS_QKV, ATTN_LAYER},
        {"self_attn.out_proj", 1, QD_DIM_HIDDEN, QD_DIM_Q, QD_BIAS_O, ATTN_LAYER},
        {"conv.in_proj", 2, QD_DIM_HIDDEN3, QD_DIM_HIDDEN, QD_BIAS_MIXER, QD_ON_MIXER(QD_MIXER_SHORT_CONV)},
        {"conv.out_proj", 3, QD_DIM_HIDDEN, QD_DIM_HIDDEN, QD_BIAS_MIXER, QD_ON_MIXER(QD_MIXER_SHORT_CONV)},
        {"feed_forward.w1", 4, QD_DIM_FF, QD_DIM_HIDDEN, QD_BIAS_MLP, 0},
        {"feed_forward.w3", 4, QD_DIM_FF, QD_DIM_HIDDEN, QD_BIAS_MLP, 0},
        {"feed_forward.w2", 5, QD_DIM_HIDDEN, QD_DIM_FF, QD_BIAS_MLP, 0},
    },
    .n_groups = 6,
    .groups = {
        {"attn_in", QD_PREV_NORM, "operator_norm"},
        {"attn_out", QD_PREV_LINEAR, "self_attn.v_proj"},
        {"conv_in", QD_PREV_NORM, "operator_norm"},
        {"conv_out", QD_PREV_LINEAR, "conv.in_proj", 0, QD_DIM_HIDDEN, 2},
        {"mlp_in", QD_PREV_NORM, "ffn_norm"},
        {"mlp_out", QD_PREV_LINEAR, "feed_forward.w3"},
    },
    .norms = {"operator_norm", "ffn_norm"},
    .qk_norms = {"self_attn.q_layernorm.weight", "self_attn.k_layernorm.weight"},
    .embed = "model.embed_tokens.weight",
    .final_norm = "model.embedding_norm",
    .lm_head = "lm_head.weight",
};

/* The linears of a Granite-4 hybrid layer, dense and MoE alike. */
#define GRANITE_HYBRID_LINEARS                                                                                \
    .family = QD_ARCH_LLAMA,                                                                                  \
    .block_fmt = "model.layers.%d.",                                                                          \
    .fused_gate_up = 1,                                                                                       \
    .lin_o = 3,                                                                                               \
    .lin_mix_in = 4,                                                                                          \
    .lin_mix_out = 5,                                                                                         \
    .lin_mlp0 = 6,                                                                                            \
    .n_linears = 8,                                                                                           \
    .linears = {                                                                                              \
        {"self_attn.q_proj", 0, QD_DIM_Q, QD_DIM_HIDDEN, QD_BIAS_QKV, ATTN_LAYER},                            \
        {"self_attn.k_proj", 0, QD_DIM_KV, QD_DIM_HIDDEN, QD_BIAS_QKV, ATTN_LAYER},                           \
        {"self_attn.v_proj", 0, QD_DIM_KV, QD_DIM_HIDDEN, QD_BIAS_QKV, ATTN_LAYER},                           \
        {"self_attn.o_proj", 1, QD_DIM_HIDDEN, QD_DIM_Q, QD_BIAS_O, ATTN_LAYER},                              \
        {"mamba.in_proj", 2, QD_DIM_SSM_IN, QD_DIM_HIDDEN, QD_BIAS_MIXER, QD_ON_MIXER(QD_MIXER_MAMBA2)},      \
        {"mamba.out_proj", 3, QD_DIM_HIDDEN, QD_DIM_SSM_INNER, QD_BIAS_MIXER, QD_ON_MIXER(QD_MIXER_MAMBA2)},  \
        {"shared_mlp.input_linear", 4, QD_DIM_FF2, QD_DIM_HIDDEN, QD_BIAS_MLP, 0},                            \
        {"shared_mlp.output_linear", 5, QD_DIM_HIDDEN, QD_DIM_FF, QD_BIAS_MLP, 0},                            \
    }

/* Granite-4 hybrids: input_layernorm before the mixer (attention, or Mamba-2), then
 * post_attention_layernorm before shared_mlp, whose input_linear is [gate; up] (as Phi-3's
 * gate_up_proj) and output_linear the down projection. */
static const qd_arch arch_granite_hybrid = {
    .name = "granite_hybrid",
    GRANITE_HYBRID_LINEARS,
    .n_groups = 6,
    .groups = {
        {"attn_in", QD_PREV_NORM, "input_layernorm"},
        {"attn_out", QD_PREV_LINEAR, "self_attn.v_proj"},
        {"mamba_in", QD_PREV_NORM, "input_layernorm"},
        {"mamba_out", QD_PREV_NONE, NULL},
        {"mlp_in", QD_PREV_NORM, "post_attention_layernorm"},
        {"mlp_out", QD_PREV_LINEAR, "shared_mlp.input_linear", 1, QD_DIM_FF},
    },
    .norms = {"input_layernorm", "post_attention_layernorm"},
    .embed = "model.embed_tokens.weight",
    .final_norm = "model.norm",
    .lm_head = "lm_head.weight",
};

/* Granite-4 MoE hybrids (Granite-4.0-H-Tiny, -Small): the dense entry's linears, and
 * block_sparse_moe beside shared_mlp: router.layer [E, H] (no bias) and E experts that the
 * checkpoint holds fused (input_linear [E, 2 FF, H], output_linear [E, H, FF]), read and
 * written per expert as block_sparse_moe.experts.N.gate_proj / up_proj / down_proj — the
 * names vLLM's GraniteMoeHybridModel.load_weights maps per expert (get_expert_mapping,
 * vllm/model_executor/models/granitemoehybrid.py) into its FusedMoE, quantized or not. The
 * router stays in float as vLLM builds it (GraniteMoeMoE's GateLinear has no quant_config:
 * "Gate always runs at half / full precision", vllm/model_executor/models/granitemoe.py); its
 * top-k softmax with renormalize=True is transformers' softmax over the chosen logits.
 *
 * AWQ: post_attention_layernorm's output feeds shared_mlp, the router and every expert, so
 * shared_mlp.input_linear's group does not fold into the norm on its own (QD_PREV_NONE);
 * the experts' shared-input scale folds into the norm and into the columns of everything
 * else that reads it, shared_mlp.input_linear included (qd_block_fold_moe_input). */
static const qd_arch arch_granite_hybrid_moe = {
    .name = "granite_hybrid_moe",
    GRANITE_HYBRID_LINEARS,
    .n_groups = 6,
    .groups = {
        {"attn_in", QD_PREV_NORM, "input_layernorm"},
        {"attn_out", QD_PREV_LINEAR, "self_attn.v_proj"},
        {"mamba_in", QD_PREV_NORM, "input_layernorm"},
        {"mamba_out", QD_PREV_NONE, NULL},
        {"mlp_in", QD_PREV_NONE, NULL},
        {"mlp_out", QD_PREV_LINEAR, "shared_mlp.input_linear", 1, QD_DIM_FF},
    },
    .norms = {"input_layernorm", "post_attention_layernorm"},
    .embed = "model.embed_tokens.weight",
    .final_norm = "model.norm",
    .lm_head = "lm_head.weight",
    .router = "block_sparse_moe.router.layer",
    .expert_fmt = "block_sparse_moe.experts.%d.",
    .expert_lin = {"gate_proj", "up_proj", "down_proj"},
    .experts_fused = "block_sparse_moe.",
    .experts_stacked = 1,
    .moe_beside_mlp = 1,
};

const qd_arch *qd_arch_hybrid(const qd_model_config *c)
{
    if (c->layout == QD_LAYOUT_GRANITE_HYBRID) return c->n_experts > 0 ? &arch_granite_hybrid_moe : &arch_granite_hybrid;
    return c->layout == QD_LAYOUT_LFM2 ? &arch_lfm2 : NULL;
}
