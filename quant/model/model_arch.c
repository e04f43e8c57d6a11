/* The architecture table: each supported block layout described as data — tensor names,
 * the block's linears with their shapes, which linears share an input, and what operator
 * each input follows (for folding AWQ scales: docs/architecture.md lists the rule per
 * family). Adding a family that fits one of these block shapes is one entry here. */
#include <stddef.h>

#include "quant/model/model_internal.h"

static const qd_arch arch_llama = {
    .name = "llama",
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
    .lin_o = 3,
    .lin_mlp0 = 4,
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

/* Gemma 2/3: the Llama block with a norm after attention and one after the MLP; the MLP's
 * input norm is pre_feedforward_layernorm (Gemma's post_attention_layernorm normalises the
 * attention output instead). AWQ folds into input_layernorm and pre_feedforward_layernorm
 * (as multipliers 1 + w), v_proj and up_proj. */
static const qd_arch arch_gemma = {
    .name = "gemma",
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
        {"attn_in", QD_PREV_NORM, "input_layernorm"},
        {"attn_out", QD_PREV_LINEAR, "self_attn.v_proj"},
        {"mlp_in", QD_PREV_NORM, "pre_feedforward_layernorm"},
        {"mlp_out", QD_PREV_LINEAR, "mlp.up_proj"},
    },
    .norms = {"input_layernorm", "pre_feedforward_layernorm", "post_attention_layernorm", "post_feedforward_layernorm"},
    .layernorm = 0,
    .embed = "model.embed_tokens.weight",
    .final_norm = "model.norm",
    .lm_head = "lm_head.weight",
};

/* Phi-3/3.5/4: q, k, v fused in one qkv_proj and gate, up in one gate_up_proj, each
 * quantized as the single linear the checkpoint holds (one Hessian). AWQ folds o_proj's
 * scales into the v rows (the last KV rows) of qkv_proj and down_proj's into the up rows
 * (the last FF rows) of gate_up_proj. */
static const qd_arch arch_phi3 = {
    .name = "phi3",
    .family = QD_ARCH_LLAMA,
    .block_fmt = "model.layers.%d.",
    .fused_qkv = 1,
    .fused_gate_up = 1,
    .lin_o = 1,
    .lin_mlp0 = 2,
    .n_linears = 4,
    .linears = {
        {"self_attn.qkv_proj", 0, QD_DIM_QKV, QD_DIM_HIDDEN, QD_BIAS_QKV},
        {"self_attn.o_proj", 1, QD_DIM_HIDDEN, QD_DIM_Q, QD_BIAS_O},
        {"mlp.gate_up_proj", 2, QD_DIM_FF2, QD_DIM_HIDDEN, QD_BIAS_MLP},
        {"mlp.down_proj", 3, QD_DIM_HIDDEN, QD_DIM_FF, QD_BIAS_MLP},
    },
    .n_groups = 4,
    .groups = {
        {"attn_in", QD_PREV_NORM, "input_layernorm"},
        {"attn_out", QD_PREV_LINEAR, "self_attn.qkv_proj", 1, QD_DIM_KV},
        {"mlp_in", QD_PREV_NORM, "post_attention_layernorm"},
        {"mlp_out", QD_PREV_LINEAR, "mlp.gate_up_proj", 1, QD_DIM_FF},
    },
    .norms = {"input_layernorm", "post_attention_layernorm"},
    .layernorm = 0,
    .embed = "model.embed_tokens.weight",
    .final_norm = "model.norm",
    .lm_head = "lm_head.weight",
};

/* Mixture of experts: Llama attention, then a router and SwiGLU experts (model_load.c
 * generates each expert's three linears and two input groups from these names). AWQ folds
 * each expert's down_proj scales into its own up projection; the experts' shared input is
 * not scaled (folding it into post_attention_layernorm would also move the router's input). */
#define MOE_ATTENTION                                                                           \
    .block_fmt = "model.layers.%d.",                                                           \
    .lin_o = 3,                                                                                \
    .lin_mlp0 = 4,                                                                             \
    .n_linears = 4,                                                                            \
    .linears = {LLAMA_ATTN_LINEARS},                                                           \
    .n_groups = 2,                                                                             \
    .groups = {                                                                                \
        {"attn_in", QD_PREV_NORM, "input_layernorm"},                                          \
        {"attn_out", QD_PREV_LINEAR, "self_attn.v_proj"},                                      \
    },                                                                                         \
    .norms = {"input_layernorm", "post_attention_layernorm"},                                  \
    .embed = "model.embed_tokens.weight",                                                      \
    .final_norm = "model.norm",                                                                \
    .lm_head = "lm_head.weight"

static const qd_arch arch_mixtral = {
    .name = "mixtral",
    .family = QD_ARCH_LLAMA,
    MOE_ATTENTION,
    .router = "block_sparse_moe.gate",
    .expert_fmt = "block_sparse_moe.experts.%d.",
    .expert_lin = {"w1", "w3", "w2"},
};

static const qd_arch arch_qwen_moe = {
    .name = "qwen_moe",
    .family = QD_ARCH_LLAMA,
    MOE_ATTENTION,
    .router = "mlp.gate",
    .expert_fmt = "mlp.experts.%d.",
    .expert_lin = {"gate_proj", "up_proj", "down_proj"},
    .shared_prefix = "mlp.shared_expert.",
    .shared_gate = "mlp.shared_expert_gate",
};

/* DeepSeek-V2 and V3: multi-head latent attention (model_mla.c) — the query through a low-rank
 * q_a_proj, its RMSNorm and q_b_proj (or one q_proj when q_lora_rank is null), keys and
 * values through kv_a_proj_with_mqa, kv_a_layernorm on its latent part and kv_b_proj — then
 * a dense SwiGLU in the first first_k_dense_replace layers and routed plus shared experts
 * in the others (model_load.c generates the experts after the dense MLP's linears; a
 * block holds one or the other, qd_model_block_has_linear). The latent norms sit between
 * linears; their inputs are not folded (QD_PREV_NONE), nor o_proj's, whose input mixes
 * kv_b_proj's per-head value rows through attention. */
#define DEEPSEEK_COMMON                                                                        \
    .family = QD_ARCH_LLAMA,                                                                   \
    .block_fmt = "model.layers.%d.",                                                          \
    .mla = 1,                                                                                  \
    .norms = {"input_layernorm", "post_attention_layernorm"},                                  \
    .embed = "model.embed_tokens.weight",                                                      \
    .final_norm = "model.norm",                                                                \
    .lm_head = "lm_head.weight",                                                               \
    .router = "mlp.gate",                                                                      \
    .router_bias = "mlp.gate.e_score_correction_bias", /* V3's sigmoid routing only */          \
    .expert_fmt = "mlp.experts.%d.",                                                           \
    .expert_lin = {"gate_proj", "up_proj", "down_proj"},                                       \
    .shared_prefix = "mlp.shared_experts."

/* V3's query LoRA and what follows kv_a_proj_with_mqa, shared by V3 and V3.2 (whose indexer's
 * wq_b sits between q_b_proj and kv_a_proj_with_mqa). */
#define DEEPSEEK_Q_LORA_LINEARS                                                                \
    {"self_attn.q_a_proj", 0, QD_DIM_QLORA, QD_DIM_HIDDEN, QD_BIAS_QKV},                       \
    {"self_attn.q_b_proj", 1, QD_DIM_QHEADS, QD_DIM_QLORA, QD_BIAS_QKV}
#define DEEPSEEK_Q_LORA_TAIL                                                                   \
    {"self_attn.kv_a_proj_with_mqa", 0, QD_DIM_KVA, QD_DIM_HIDDEN, QD_BIAS_QKV},               \
    {"self_attn.kv_b_proj", 2, QD_DIM_KVB, QD_DIM_KVLORA, QD_BIAS_QKV},                        \
    {"self_attn.o_proj", 3, QD_DIM_HIDDEN, QD_DIM_VO, QD_BIAS_O},                              \
    {"mlp.gate_proj", 4, QD_DIM_FF, QD_DIM_HIDDEN, QD_BIAS_MLP},                               \
    {"mlp.up_proj", 4, QD_DIM_FF, QD_DIM_HIDDEN, QD_BIAS_MLP},                                 \
    {"mlp.down_proj", 5, QD_DIM_HIDDEN, QD_DIM_FF, QD_BIAS_MLP}
/* The groups after attn_in. */
#define DEEPSEEK_Q_LORA_GROUPS                                                                 \
    {"q_latent", QD_PREV_NONE, NULL},                                                          \
    {"kv_latent", QD_PREV_NONE, NULL},                                                         \
    {"attn_out", QD_PREV_NONE, NULL},                                                          \
    {"mlp_in", QD_PREV_NORM, "post_attention_layernorm"},                                      \
    {"mlp_out", QD_PREV_LINEAR, "mlp.up_proj"}

static const qd_arch arch_deepseek_qlora = {
    .name = "deepseek",
    DEEPSEEK_COMMON,
    .lin_o = 4,
    .lin_mlp0 = 5,
    .n_linears = 8,
    .linears = {
        DEEPSEEK_Q_LORA_LINEARS,
        DEEPSEEK_Q_LORA_TAIL,
    },
    .n_groups = 6,
    .groups = {
        {"attn_in", QD_PREV_NORM, "input_layernorm"},
        DEEPSEEK_Q_LORA_GROUPS,
    },
    .mla_norms = {"self_attn.q_a_layernorm", "self_attn.kv_a_layernorm"},
};

/* DeepSeek-V3.2: V3 with q LoRA plus the sparse-attention indexer (model_dsa.c). Its wq_b reads
 * q_a_layernorm's output beside q_b_proj (group q_latent) and is quantized, as vLLM loads it
 * (ReplicatedLinear with the quant_config); wk and weights_proj stay in float (vLLM's fused
 * wk_weights_proj has quant_config=None), loaded as block tensors. They read input_layernorm's
 * output too, so attn_in does not fold into that norm (QD_PREV_NONE): a scale there would have
 * to be carried by wk and weights_proj, which quantd leaves as stored. */
static const qd_arch arch_deepseek_dsa = {
    .name = "deepseek_v32",
    DEEPSEEK_COMMON,
    .lin_o = 5,
    .lin_mlp0 = 6,
    .n_linears = 9,
    .linears = {
        DEEPSEEK_Q_LORA_LINEARS,
        {"self_attn.indexer.wq_b", 1, QD_DIM_IDXQ, QD_DIM_QLORA, QD_BIAS_NONE},
        DEEPSEEK_Q_LORA_TAIL,
    },
    .n_groups = 6,
    .groups = {
        {"attn_in", QD_PREV_NONE, NULL},
        DEEPSEEK_Q_LORA_GROUPS,
    },
    .mla_norms = {"self_attn.q_a_layernorm", "self_attn.kv_a_layernorm"},
    .lin_idx_q = 2,
};

static const qd_arch arch_deepseek_q = {
    .name = "deepseek",
    DEEPSEEK_COMMON,
    .lin_o = 3,
    .lin_mlp0 = 4,
    .n_linears = 7,
    .linears = {
        {"self_attn.q_proj", 0, QD_DIM_QHEADS, QD_DIM_HIDDEN, QD_BIAS_QKV},
        {"self_attn.kv_a_proj_with_mqa", 0, QD_DIM_KVA, QD_DIM_HIDDEN, QD_BIAS_QKV},
        {"self_attn.kv_b_proj", 1, QD_DIM_KVB, QD_DIM_KVLORA, QD_BIAS_QKV},
        {"self_attn.o_proj", 2, QD_DIM_HIDDEN, QD_DIM_VO, QD_BIAS_O},
        {"mlp.gate_proj", 3, QD_DIM_FF, QD_DIM_HIDDEN, QD_BIAS_MLP},
        {"mlp.up_proj", 3, QD_DIM_FF, QD_DIM_HIDDEN, QD_BIAS_MLP},
        {"mlp.down_proj", 4, QD_DIM_HIDDEN, QD_DIM_FF, QD_BIAS_MLP},
    },
    .n_groups = 5,
    .groups = {
        {"attn_in", QD_PREV_NORM, "input_layernorm"},
        {"kv_latent", QD_PREV_NONE, NULL},
        {"attn_out", QD_PREV_NONE, NULL},
        {"mlp_in", QD_PREV_NORM, "post_attention_layernorm"},
        {"mlp_out", QD_PREV_LINEAR, "mlp.up_proj"},
    },
    .mla_norms = {NULL, "self_attn.kv_a_layernorm"},
};

const qd_arch *qd_arch_for(const qd_model_config *c)
{
    const qd_arch *moe = qd_arch_moe_for(c);   /* arch_moe.c */
    if (moe) return moe;
    switch (c->family) {
    case QD_ARCH_LLAMA:
        switch (c->layout) {
        case QD_LAYOUT_GEMMA: return &arch_gemma;
        case QD_LAYOUT_PHI3: return &arch_phi3;
        case QD_LAYOUT_MIXTRAL: return &arch_mixtral;
        case QD_LAYOUT_QWEN_MOE: return &arch_qwen_moe;
        case QD_LAYOUT_DEEPSEEK:
            if (c->index_topk > 0) return &arch_deepseek_dsa;
            return c->q_lora_rank > 0 ? &arch_deepseek_qlora : &arch_deepseek_q;
        case QD_LAYOUT_LFM2: case QD_LAYOUT_GRANITE_HYBRID: return qd_arch_hybrid(c);
        case QD_LAYOUT_QWEN_NEXT: return &qd_arch_qwen_next;
        case QD_LAYOUT_QWEN35: return c->n_experts > 0 ? &qd_arch_qwen35_moe : &qd_arch_qwen35;
        case QD_LAYOUT_STARCODER2: case QD_LAYOUT_PHI: case QD_LAYOUT_NEOX: case QD_LAYOUT_COHERE2:
            return qd_arch_plain_for(c);
        case QD_LAYOUT_POSTNORM:
        case QD_LAYOUT_GLM4: return qd_arch_postnorm_for(c);
        case QD_LAYOUT_GPT_OSS: return &qd_arch_gpt_oss;
        case QD_LAYOUT_LLAMA4: return &qd_arch_llama4;
        case QD_LAYOUT_FALCON_H1: return &qd_arch_falcon_h1;
        default: return qd_arch_dense_for(c) ? qd_arch_dense_for(c) : &arch_llama;
        }
    case QD_ARCH_OPT: return &arch_opt;
    default: return NULL;
    }
}

int64_t qd_model_config_pos_rows(const qd_model_config *c)
{
    const qd_arch *a = qd_arch_for(c);
    return a && a->embed_pos && c->max_pos > 0 ? c->max_pos + c->pos_offset : 0;
}
