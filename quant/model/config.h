/* A model's config.json as a plain struct: the fields the forward pass and the quantizer
 * need, with HF's defaults filled in and cross-checked (heads divide hidden, kv heads
 * divide heads, ...). The architecture string selects the family; an unknown one is an
 * error naming it. A `quantization_config` object (GPTQ / AWQ output directories) is parsed
 * into the quant_* fields so the loader can dequantize packed linears; an FP8-block source
 * checkpoint's (quant_method "fp8") into source_fp8 and its block sizes.
 *
 * All strings are fixed-size arrays inside the struct: a qd_model_config is a value with
 * no ownership to track. */
#ifndef QUANT_MODEL_CONFIG_H
#define QUANT_MODEL_CONFIG_H

#include <stdint.h>

#include "quant/core/error.h"

typedef enum qd_arch_family {
    QD_ARCH_UNKNOWN = 0,
    QD_ARCH_LLAMA,       /* rotary pre-norm decoders: Llama, Mistral, Qwen2/3, Gemma 2/3, Phi-3, StarCoder2, Phi, GPT-NeoX,
                          * Cohere2 */
    QD_ARCH_OPT,         /* OPTForCausalLM */
} qd_arch_family;

/* RoPE as config.json describes it: `rope_scaling` (legacy, with "type" or "rope_type") or
 * transformers 5's `rope_parameters` (which also carries rope_theta). rope.h turns it into
 * frequencies for a forward. */
typedef enum qd_rope_type {
    QD_ROPE_DEFAULT = 0, QD_ROPE_LINEAR, QD_ROPE_DYNAMIC, QD_ROPE_LLAMA3, QD_ROPE_YARN, QD_ROPE_LONGROPE,
} qd_rope_type;

#define QD_ROPE_CFG_MAX_FACTORS 512
typedef struct qd_rope_config {
    qd_rope_type type;
    float factor;                /* linear, dynamic, llama3, yarn (1 when absent) */
    int has_factor;              /* factor was given (YaRN derives it from the context lengths otherwise) */
    float low_freq_factor;       /* llama3 */
    float high_freq_factor;      /* llama3 */
    int64_t orig_max_pos;        /* original_max_position_embeddings; 0 when absent */
    float attention_factor;      /* yarn, longrope; 0 when absent (derived from factor) */
    float beta_fast, beta_slow;  /* yarn (32 and 1 by default) */
    float mscale, mscale_all_dim;/* yarn; 0 when absent */
    int truncate;                /* yarn: round the correction range (default 1) */
    int n_factors;               /* longrope: length of short_factor and long_factor */
    float short_mscale, long_mscale; /* longrope, PhiMoE only: cos/sin times these (0 when absent) */
    float short_factor[QD_ROPE_CFG_MAX_FACTORS];
    float long_factor[QD_ROPE_CFG_MAX_FACTORS];
    float partial_rotary_factor; /* rotated share of head_dim (1 by default) */
} qd_rope_config;

/* How a rotary decoder's block names and lays out its tensors (the architecture table entry,
 * quant/model/model_arch.c). */
typedef enum qd_block_layout {
    QD_LAYOUT_LLAMA = 0,   /* q/k/v/o_proj, gate/up/down_proj, two norms */
    QD_LAYOUT_GEMMA,       /* as llama, plus norms after attention and after the MLP */
    QD_LAYOUT_PHI3,        /* fused qkv_proj and gate_up_proj */
    QD_LAYOUT_MIXTRAL,     /* llama attention; block_sparse_moe.gate + experts.N.w1/w3/w2 */
    QD_LAYOUT_QWEN_MOE,    /* llama attention; mlp.gate + mlp.experts.N.gate/up/down_proj (+ shared expert) */
    QD_LAYOUT_DEEPSEEK,    /* multi-head latent attention; dense MLP layers, then mlp.gate + mlp.experts.N.* + mlp.shared_experts */
    QD_LAYOUT_MOE_SHARED,  /* llama attention; dense MLP layers, then DeepSeek's MoE (GLM-4.5, dots.llm1: arch_moe.c) */
    QD_LAYOUT_MINIMAX,     /* llama attention; Mixtral's block_sparse_moe with e_score_correction_bias (MiniMax-M2) */
    QD_LAYOUT_ERNIE_MOE,   /* llama attention; dense MLP layers among MoE ones with mlp.moe_statics' bias (ERNIE 4.5) */
    QD_LAYOUT_PHIMOE,      /* Mixtral's block with LayerNorms (weight and bias), biased attention and lm_head (PhiMoE) */
    QD_LAYOUT_LFM2,        /* short-convolution (conv.*) or attention layers; feed_forward.w1/w3/w2 */
    QD_LAYOUT_GRANITE_HYBRID, /* Mamba-2 (mamba.*) or attention layers; shared_mlp.input_linear/output_linear */
    QD_LAYOUT_QWEN_NEXT,   /* Gated DeltaNet (linear_attn.in_proj_qkvz, in_proj_ba interleaved) or gated attention
                            * per layer; Qwen2-MoE's experts, dense layers among them */
    QD_LAYOUT_QWEN35,      /* as Qwen3-Next with linear_attn.in_proj_qkv, in_proj_z, in_proj_b, in_proj_a; dense MLP */
    QD_LAYOUT_STARCODER2,  /* llama attention with biases; LayerNorms; mlp.c_fc -> act -> mlp.c_proj */
    QD_LAYOUT_PHI,         /* parallel block from one input_layernorm; q/k/v/dense; mlp.fc1 -> act -> mlp.fc2 */
    QD_LAYOUT_NEOX,        /* gpt_neox.layers.N.: attention.query_key_value per head [q; k; v], attention.dense,
                            * mlp.dense_h_to_4h -> act -> mlp.dense_4h_to_h; parallel or sequential residual */
    QD_LAYOUT_COHERE2,     /* parallel block from one mean-centred LayerNorm without bias; llama q/k/v/o and SwiGLU */
    QD_LAYOUT_POSTNORM,    /* llama projections, no norm before attention or the MLP, one on each's output
                            * (OLMo 2/3, EXAONE 4: post_attention_layernorm, post_feedforward_layernorm) */
    QD_LAYOUT_GLM4,        /* GLM-4: llama attention, fused gate_up_proj, a norm before and after each sub-block */
    QD_LAYOUT_GPT_OSS,     /* llama attention with biases and sinks; mlp.router (with bias) + mlp.experts' fused
                            * 3-D gate_up_proj / down_proj (model_gptoss.c), read as per-expert gate, up, down */
    QD_LAYOUT_LLAMA4,      /* Llama 4 text: llama attention; feed_forward.* dense SwiGLU or feed_forward.router +
                            * fused 3-D experts (gate_up_proj's gate then up halves) + shared_expert (arch_llama4.c) */
    QD_LAYOUT_FALCON_H1,   /* Falcon-H1: llama attention beside Mamba-2 (mamba.*) in every layer on input_layernorm,
                            * pre_ff_layernorm, feed_forward.gate/up/down_proj; muP multipliers (arch_falcon_h1.c) */
} qd_block_layout;

/* How a MoE router turns its logits into the experts' weights. */
typedef enum qd_moe_scoring {
    QD_MOE_SOFTMAX = 0,    /* softmax, the top_k largest (Mixtral, Qwen-MoE, DeepSeek-V2 "greedy") */
    QD_MOE_SOFTMAX_GROUPED,/* DeepSeek-V2 "group_limited_greedy": softmax, the choice among the topk_group
                            * best of n_group groups (a group scores its largest) */
    QD_MOE_SIGMOID_GROUPED,/* DeepSeek-V3: sigmoid; the choice adds e_score_correction_bias and keeps the
                            * topk_group best of n_group groups (a group scores the sum of its top 2) */
    QD_MOE_TOPK_SOFTMAX,   /* gpt-oss: the top_k largest logits (the router's bias added), then a softmax
                            * over those k alone */
    QD_MOE_SOFTMAX_BIAS,   /* ERNIE 4.5: softmax; the choice adds e_score_correction_bias, no groups */
    QD_MOE_SIGMOID_INPUT,  /* Llama 4: the top_k largest logits, sigmoid(logit) scales the chosen expert's
                            * INPUT; the experts' outputs are summed unweighted */
    QD_MOE_SPARSEMIXER,    /* PhiMoE (eval): top-2, each weight a softmax over the logits within
                            * 2 * router_jitter of that pick (relative), the first pick masked for the second */
} qd_moe_scoring;

/* What mixes tokens in a layer of a hybrid model (layer_mixer): attention everywhere else. */
typedef enum qd_layer_mixer {
    QD_MIXER_ATTENTION = 0,
    QD_MIXER_GATED_DELTANET,   /* Qwen3-Next / Qwen3.5 linear attention */
    QD_MIXER_MAMBA2,           /* Granite-4, Falcon-H1 */
    QD_MIXER_SHORT_CONV,       /* LFM2 */
} qd_layer_mixer;

/* qd_model_config.qk_norm: what q_norm and k_norm normalise (0: there are none). */
enum { QD_QK_NORM_HEAD = 1, QD_QK_NORM_WHOLE = 2 };

/* Most experts a mixture-of-experts layer may have (DeepSeek-V3: 256; Qwen3-Next, Qwen3.5-MoE: 512). */
#define QD_MAX_EXPERTS 512

/* The recurrent mixers' sizes (QD_MIXER_SHORT_CONV, QD_MIXER_MAMBA2 layers; model_mixer.c). */
typedef struct qd_mixer_config {
    int64_t conv_kernel;       /* the causal convolution's taps: LFM2 conv_L_cache, mamba_d_conv */
    int conv_bias;             /* the convolution has a bias (LFM2 conv_bias, mamba_conv_bias) */
    int proj_bias;             /* in_proj and out_proj have biases (LFM2 conv_bias, mamba_proj_bias) */
    int64_t ssm_heads;         /* Mamba-2: mamba_n_heads, */
    int64_t ssm_head_dim;      /* mamba_d_head (inner = heads * head_dim = mamba_expand * hidden), */
    int64_t ssm_groups;        /* mamba_n_groups (sharing B and C, and the gated norm's groups), */
    int64_t ssm_state;         /* mamba_d_state, */
    float dt_min, dt_max;      /* time_step_limit */
    int no_norm;               /* Falcon-H1 without mamba_rms_norm: y * silu(z) feeds out_proj, no gated norm */
    float mup[5];              /* Falcon-H1's ssm_multipliers: in_proj's z, x, B, C, dt outputs times these */
} qd_mixer_config;

/* Falcon-H1's multipliers (config_falcon_h1.c; read by its layout only): the attention's and
 * the mixer's inputs and outputs, and the MLP's gate (before the activation) and down_proj. */
typedef struct qd_falcon_mul {
    float attn_in, attn_out, ssm_in, ssm_out, mlp_gate, mlp_down;
} qd_falcon_mul;

/* Most layers a config may describe per layer (layer_types). */
#define QD_CFG_MAX_LAYERS 1024

typedef struct qd_model_config {
    char architecture[64];     /* "LlamaForCausalLM" */
    char model_type[32];       /* "llama", "mistral", "qwen2", "opt" */
    qd_arch_family family;
    int64_t hidden;            /* hidden_size */
    int64_t intermediate;      /* intermediate_size (OPT: ffn_dim) */
    int64_t n_layers;
    int64_t n_heads;
    int64_t n_kv_heads;        /* = n_heads without GQA */
    int64_t head_dim;          /* config head_dim, default hidden / n_heads */
    int64_t vocab;
    int64_t max_pos;           /* max_position_embeddings */
    float norm_eps;            /* rms_norm_eps (llama) or 1e-5 (OPT layer norms) */
    float rope_theta;          /* llama family; 10000 by default */
    qd_rope_config rope;       /* llama family: scaling type and its parameters */
    float rope_theta_local;    /* sliding-window layers' RoPE (Gemma 3's local base); equal to */
    qd_rope_config rope_local; /* rope_theta / rope where the config gives one RoPE for all */
    int64_t sliding_window;    /* window of the sliding layers (keys seen at most); 0 = none */
    unsigned char layer_sliding[QD_CFG_MAX_LAYERS]; /* 1: layer i uses the window (layer_types) */
    unsigned char layer_nope[QD_CFG_MAX_LAYERS];  /* 1: layer i applies no RoPE (SmolLM3, Cohere2's global layers) */
    unsigned char layer_mixer[QD_CFG_MAX_LAYERS]; /* qd_layer_mixer of layer i (hybrids); 0: attention */
    int qk_norm;               /* RMSNorm of q and k before RoPE: QD_QK_NORM_HEAD per head (Qwen3, Gemma 3,
                                * EXAONE 4), QD_QK_NORM_WHOLE over the whole projection (OLMo 2/3); 0 none */
    qd_block_layout layout;
    float norm_offset;         /* RMSNorm multiplies by (norm_offset + w): 1 for Gemma, else 0 */
    float embed_scale;         /* embeddings times this (Gemma: sqrt(hidden) in the model's dtype); 0 = none */
    float query_pre_attn_scalar; /* attention scale is its -1/2 power (Gemma); 0 = head_dim */
    float attn_scale;          /* the softmax scale itself (Granite's attention_multiplier); 0 = from
                                * query_pre_attn_scalar or head_dim */
    float residual_scale;      /* each sub-block's output times this before the residual add
                                * (Granite's residual_multiplier); 0 = none */
    float q_pos_scale_beta;    /* queries after RoPE times 1 + beta ln(1 + floor(pos / q_pos_scale_orig)) (Ministral 3's
                                * llama_4_scaling_beta); 0 = none */
    int64_t q_pos_scale_orig;
    int q_pos_scale_nope;      /* Llama 4's attn_temperature_tuning: the scale above on NoPE layers only (none on
                                * RoPE layers), of pos + 1: 1 + beta ln(1 + floor((pos + 1) / orig)) */
    int qk_l2norm;             /* Llama 4's use_qk_norm: q and k divided by their RMS per head (no weight), after
                                * RoPE, on RoPE layers only */
    int64_t attn_chunk;        /* Llama 4's attention_chunk_size: a layer_chunked layer's query sees the keys of */
    unsigned char layer_chunked[QD_CFG_MAX_LAYERS]; /* its own chunk [floor(i / chunk) chunk, i] only */
    float logit_scale;         /* logits times this (Cohere's logit_scale, Granite's 1 / logits_scaling),
                                * before any soft-cap; 0 = none */
    float attn_softcap;        /* Gemma 2 attention score soft-cap; 0 = none */
    float final_softcap;       /* Gemma 2 final logit soft-cap; 0 = none */
    /* Mixture of experts (QD_LAYOUT_MIXTRAL, QD_LAYOUT_QWEN_MOE, QD_LAYOUT_DEEPSEEK): every
     * layer's MLP (DeepSeek: from layer first_dense on) is a router (moe_scoring over
     * n_experts, the top_k taken) and n_experts SwiGLU experts of width moe_intermediate,
     * plus a shared expert of width shared_intermediate (Qwen2-MoE: scaled by
     * sigmoid(shared_expert_gate); DeepSeek: n_shared_experts of them as one, ungated). */
    int64_t n_experts;         /* 0: a dense MLP */
    int64_t top_k;
    int64_t moe_intermediate;
    int norm_topk_prob;        /* renormalise the top-k weights to sum to 1 (Mixtral always) */
    int64_t shared_intermediate; /* 0: no shared expert */
    qd_moe_scoring moe_scoring;
    int64_t n_group, topk_group; /* the _GROUPED scorings: expert groups, and how many are kept */
    float routed_scale;        /* the chosen experts' weights times this (DeepSeek routed_scaling_factor; else 1) */
    float router_jitter;       /* QD_MOE_SPARSEMIXER: router_jitter_noise, the masking threshold's eps */
    int64_t first_dense;       /* DeepSeek first_k_dense_replace: layers [0, first_dense) have a dense MLP */
    qd_mixer_config mixer;     /* LFM2, Granite-4 hybrids, Falcon-H1: their mixer layers' sizes */
    qd_falcon_mul falcon;      /* QD_LAYOUT_FALCON_H1 only */
    unsigned char layer_dense[QD_CFG_MAX_LAYERS]; /* MoE models: 1 = layer i has a dense MLP of width
                                * intermediate (Qwen3-Next's mlp_only_layers, decoder_sparse_step) */
    /* Gated DeltaNet layers (layer_mixer QD_MIXER_GATED_DELTANET; model_gdn.c): gdn_k_heads key
     * (and query) heads of gdn_k_dim, gdn_v_heads value heads of gdn_v_dim (a multiple: each key
     * head serves gdn_v_heads / gdn_k_heads consecutive value heads), a causal conv of gdn_conv
     * taps over q, k and v. */
    int64_t gdn_k_heads, gdn_v_heads, gdn_k_dim, gdn_v_dim, gdn_conv;
    int attn_gate;             /* q_proj emits each head's query then its gate; the attention's output
                                * times sigmoid(gate) feeds o_proj (Qwen3-Next, Qwen3.5) */
    /* gpt-oss: attention sinks (a learned per-head logit in each softmax's denominator), and
     * the experts' clamped SwiGLU: gate <= limit, -limit <= up <= limit,
     * out = (up + 1) * gate * sigmoid(alpha * gate). swiglu_limit 0: the plain SwiGLU. */
    int attn_sinks;
    float swiglu_alpha, swiglu_limit;
    /* Multi-head latent attention (QD_LAYOUT_DEEPSEEK; kv_lora_rank 0 elsewhere). head_dim
     * is qk_rope_dim there (RoPE's dims, as transformers sets it); n_kv_heads = n_heads. */
    int64_t q_lora_rank;       /* 0: one q_proj; else q_a_proj -> q_a_layernorm -> q_b_proj */
    int64_t kv_lora_rank;
    int64_t qk_nope_dim, qk_rope_dim, v_head_dim;
    int rope_interleave;       /* RoPE pairs (x0, x1), (x2, x3), ... of the rope dims (DeepSeek's default, GLM-4, Cohere2) */
    /* DeepSeek-V3.2's sparse-attention indexer (model_dsa.c; index_topk 0 elsewhere): index_heads
     * heads of index_head_dim score each query's causal keys, the index_topk best are attended. */
    int64_t index_topk, index_heads, index_head_dim;
    int tie_word_embeddings;
    int multimodal;            /* a vision-language checkpoint (config_vlm.c): the text tower is this
                                * config, read from text_config; the vision tower and projector
                                * are other tensors, copied to an output unchanged */
    /* StarCoder2, Phi, GPT-NeoX (config_parallel.c) */
    int mlp_plain;             /* one fc1 -> activation -> fc2, no gate (activation: relu, gelu, gelu_new,
                                * gelu_pytorch_tanh) */
    int parallel_block;        /* attention and MLP both read the block's input: y = x + attn(n0(x)) + mlp(n(x)),
                                * n the shared norm 0 (Phi) or norm 1 (GPT-NeoX use_parallel_residual); Falcon-H1
                                * (attention beside its mixer, then the MLP) runs whole as well */
    int lm_head_bias;          /* lm_head carries a bias (Phi) */
    int qkv_bias;              /* q/k/v carry biases (Qwen2, llama attention_bias, OPT) */
    int o_bias;                /* o_proj bias (llama attention_bias, OPT) */
    int mlp_bias;              /* mlp biases (llama mlp_bias, OPT) */
    /* OPT */
    int do_layer_norm_before;  /* pre-LN (1) or post-LN (0, opt-350m) */
    int64_t word_embed_proj_dim;   /* = hidden unless project_in/out exist */
    int pos_offset;            /* learned positions offset (2 for OPT) */
    char activation[24];       /* "silu", "relu", "gelu", "gelu_pytorch_tanh" (Gemma's GeGLU) */
    int bos_id, eos_id;        /* -1 when absent */
    char torch_dtype[16];
    /* quantization_config (quantized checkpoints) */
    int quantized;
    char quant_format[32];     /* format table name (quant/formats), e.g. "gptq_v2" */
    int quant_bits;
    int64_t quant_group_size;  /* -1 for one group */
    int quant_sym;
    int quant_desc_act;
    int quant_grid;                 /* qd_grid of a float format (quant/formats/grid.h), 0 int */
    int quant_scale_rule;           /* qd_scale_rule */
    int64_t quant_row_block;        /* rows sharing a scale (FP8 blocks: 128; -1 per tensor) */
    int quant_act;                  /* the input activations it declares (serving.h qd_srv_act) */
    /* A source checkpoint in FP8 blocks (quantization_config quant_method "fp8", fmt e4m3:
     * DeepSeek-V3/R1, Kimi-K2, Qwen3-*-FP8, GLM-4.5-FP8, MiniMax-M2): a linear whose weight
     * is F8_E4M3 [N, K] carries weight_scale_inv [ceil(N/bn), ceil(K/bk)] and is dequantized
     * as its block is loaded (model_fp8.c). It is a format quantd reads, never one it writes:
     * `quantized` stays 0, so nothing takes such a checkpoint for a quantd output. */
    int source_fp8;
    int64_t fp8_block_n, fp8_block_k;  /* weight_block_size [bn, bk] */
    /* gpt-oss's MXFP4 experts (quantization_config quant_method "mxfp4", as the Hub ships
     * gpt-oss): mlp.experts.{gate_up,down}_proj_blocks (U8, two FP4 e2m1 codes a byte) and
     * _scales (U8, E8M0, one per 32 values), decoded as they are loaded (model_gptoss.c);
     * read, never written, like source_fp8. */
    int source_mxfp4;
} qd_model_config;

/* Parses config.json text (`what` names the source in errors). */
int qd_model_config_parse(const char *json, const char *what, qd_model_config *out, qd_err *err);
/* Reads <dir>/config.json. */
int qd_model_config_load(const char *dir, qd_model_config *out, qd_err *err);
/* As qd_model_config_load, and *quant (caller frees with cJSON_Delete) a copy of the file's
 * quantization_config, NULL when it has none: what the parsed config does not keep (a GPTQ
 * checkpoint's `dynamic` rules) read from the same bytes. */
struct cJSON;
int qd_model_config_load_quant(const char *dir, qd_model_config *out, struct cJSON **quant, qd_err *err);
/* The family of an architecture string; QD_ARCH_UNKNOWN when not supported. */
qd_arch_family qd_arch_family_of(const char *architecture);

#endif
