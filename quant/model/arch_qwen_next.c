/* The Gated DeltaNet hybrids' architecture entries: Qwen3-Next, Qwen3.5 and Qwen3.5-MoE. Each layer is a
 * gated full attention (self_attn.*: q_proj emits each head's query and its output gate,
 * q_norm, k_norm, partial RoPE) or a Gated DeltaNet (linear_attn.*, model_gdn.c), as
 * layer_types says: one list of linears for both kinds, each held by the layers of its kind
 * (qd_arch_linear.mixer, qd_model_block_has_linear), as DeepSeek's dense and MoE layers share
 * one list. Then a dense SwiGLU, or (Qwen3-Next, Qwen3.5-MoE) Qwen2-MoE's router, experts and
 * gated shared expert, a layer at a time.
 *
 * The quantized linears are those vLLM loads with the quantization config (vLLM 0.32,
 * model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py lines 516-531: in_proj_qkvz and
 * in_proj_ba are MergedColumnParallelLinear(quant_config=...) — Qwen3.5's in_proj_qkv /
 * in_proj_z and in_proj_b / in_proj_a packed into them, models/qwen3_5.py lines 307-317 —
 * and lines 581-589 out_proj a RowParallelLinear(quant_config=...); lines 503-508 conv1d a
 * ColumnParallelLinear without one, so it stays float, as do A_log, dt_bias and the norms,
 * which are parameters, not linears; models/qwen3_next.py lines 825-834 packed_modules_mapping).
 * The router and shared_expert_gate stay float (models/qwen3_next.py lines 191-202: GateLinear,
 * and ReplicatedLinear(quant_config=None)).
 *
 * AWQ folds: the attention's and the DeltaNet's input projections read input_layernorm's
 * output (a (1 + w) norm: the multipliers fold as a whole, as Gemma's). Neither output
 * projection's input follows anything foldable: o_proj reads attention times sigmoid(gate)
 * (v_proj's rows no longer reach it linearly), and out_proj reads the gated RMSNorm's output
 * w * norm(core) * silu(z), whose weight [v_dim] is shared by every value head, so a
 * per-column scale folds exactly only when it repeats across heads: QD_PREV_NONE for both. */
#include <stddef.h>

#include "quant/model/model_internal.h"

#define ATTN QD_ON_MIXER(QD_MIXER_ATTENTION)
#define GDN QD_ON_MIXER(QD_MIXER_GATED_DELTANET)

#define QWEN_NEXT_ATTN_LINEARS                                                     \
    {"self_attn.q_proj", 0, QD_DIM_Q2, QD_DIM_HIDDEN, QD_BIAS_QKV, ATTN},          \
    {"self_attn.k_proj", 0, QD_DIM_KV, QD_DIM_HIDDEN, QD_BIAS_QKV, ATTN},          \
    {"self_attn.v_proj", 0, QD_DIM_KV, QD_DIM_HIDDEN, QD_BIAS_QKV, ATTN},          \
    {"self_attn.o_proj", 1, QD_DIM_HIDDEN, QD_DIM_Q, QD_BIAS_O, ATTN}

#define QWEN_NEXT_COMMON                                                                    \
    .family = QD_ARCH_LLAMA,                                                               \
    .block_fmt = "model.layers.%d.",                                                       \
    .lin_o = 3,                                                                            \
    .lin_gdn0 = 4,                                                                         \
    .n_groups = 6,                                                                         \
    .groups = {                                                                            \
        {"attn_in", QD_PREV_NORM, "input_layernorm"},                                      \
        {"attn_out", QD_PREV_NONE, NULL},                                                  \
        {"gdn_in", QD_PREV_NORM, "input_layernorm"},                                       \
        {"gdn_out", QD_PREV_NONE, NULL},                                                   \
        {"mlp_in", QD_PREV_NORM, "post_attention_layernorm"},                              \
        {"mlp_out", QD_PREV_LINEAR, "mlp.up_proj"},                                        \
    },                                                                                     \
    .norms = {"input_layernorm", "post_attention_layernorm"},                              \
    .embed = "model.embed_tokens.weight",                                                  \
    .final_norm = "model.norm",                                                            \
    .lm_head = "lm_head.weight"

const qd_arch qd_arch_qwen_next = {
    .name = "qwen3_next",
    QWEN_NEXT_COMMON,
    .gdn = 1,
    .lin_mlp0 = 7,
    .n_linears = 10,
    .linears = {
        QWEN_NEXT_ATTN_LINEARS,
        {"linear_attn.in_proj_qkvz", 2, QD_DIM_GDN_QKVZ, QD_DIM_HIDDEN, QD_BIAS_NONE, GDN},
        {"linear_attn.in_proj_ba", 2, QD_DIM_GDN_BA, QD_DIM_HIDDEN, QD_BIAS_NONE, GDN},
        {"linear_attn.out_proj", 3, QD_DIM_HIDDEN, QD_DIM_GDN_V, QD_BIAS_NONE, GDN},
        {"mlp.gate_proj", 4, QD_DIM_FF, QD_DIM_HIDDEN, QD_BIAS_NONE, QD_ON_EVERY_LAYER},
        {"mlp.up_proj", 4, QD_DIM_FF, QD_DIM_HIDDEN, QD_BIAS_NONE, QD_ON_EVERY_LAYER},
        {"mlp.down_proj", 5, QD_DIM_HIDDEN, QD_DIM_FF, QD_BIAS_NONE, QD_ON_EVERY_LAYER},
    },
    .router = "mlp.gate",
    .expert_fmt = "mlp.experts.%d.",
    .expert_lin = {"gate_proj", "up_proj", "down_proj"},
    .shared_prefix = "mlp.shared_expert.",
    .shared_gate = "mlp.shared_expert_gate",
};

#define QWEN35_LINEARS                                                                                \
    .gdn = 2,                                                                                     \
    .lin_mlp0 = 9,                                                                                \
    .n_linears = 12,                                                                              \
    .linears = {                                                                                  \
        QWEN_NEXT_ATTN_LINEARS,                                                                   \
        {"linear_attn.in_proj_qkv", 2, QD_DIM_GDN_QKV, QD_DIM_HIDDEN, QD_BIAS_NONE, GDN},         \
        {"linear_attn.in_proj_z", 2, QD_DIM_GDN_V, QD_DIM_HIDDEN, QD_BIAS_NONE, GDN},             \
        {"linear_attn.in_proj_b", 2, QD_DIM_GDN_H, QD_DIM_HIDDEN, QD_BIAS_NONE, GDN},             \
        {"linear_attn.in_proj_a", 2, QD_DIM_GDN_H, QD_DIM_HIDDEN, QD_BIAS_NONE, GDN},             \
        {"linear_attn.out_proj", 3, QD_DIM_HIDDEN, QD_DIM_GDN_V, QD_BIAS_NONE, GDN},              \
        {"mlp.gate_proj", 4, QD_DIM_FF, QD_DIM_HIDDEN, QD_BIAS_NONE, QD_ON_EVERY_LAYER},          \
        {"mlp.up_proj", 4, QD_DIM_FF, QD_DIM_HIDDEN, QD_BIAS_NONE, QD_ON_EVERY_LAYER},            \
        {"mlp.down_proj", 5, QD_DIM_HIDDEN, QD_DIM_FF, QD_BIAS_NONE, QD_ON_EVERY_LAYER},          \
    }

const qd_arch qd_arch_qwen35 = {
    .name = "qwen3_5",
    QWEN_NEXT_COMMON,
    QWEN35_LINEARS,
};

/* Qwen3.5-MoE: experts on every layer (the dense MLP's linears, listed, are held by none). */
const qd_arch qd_arch_qwen35_moe = {
    .name = "qwen3_5_moe",
    QWEN_NEXT_COMMON,
    QWEN35_LINEARS,
    .router = "mlp.gate",
    .expert_fmt = "mlp.experts.%d.",
    .expert_lin = {"gate_proj", "up_proj", "down_proj"},
    .shared_prefix = "mlp.shared_expert.",
    .shared_gate = "mlp.shared_expert_gate",
};
