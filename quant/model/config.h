/* A model's config.json as a plain struct: the fields the forward pass and the quantizer
 * need, with HF's defaults filled in and cross-checked (heads divide hidden, kv heads
 * divide heads, ...). The architecture string selects the family; an unknown one is an
 * error naming it. A `quantization_config` object (GPTQ / AWQ output directories) is parsed
 * into the quant_* fields so the loader can dequantize packed linears.
 *
 * All strings are fixed-size arrays inside the struct: a qd_model_config is a value with
 * no ownership to track. */
#ifndef QUANT_MODEL_CONFIG_H
#define QUANT_MODEL_CONFIG_H

#include <stdint.h>

#include "quant/core/error.h"

typedef enum qd_arch_family {
    QD_ARCH_UNKNOWN = 0,
    QD_ARCH_LLAMA,       /* LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM */
    QD_ARCH_OPT,         /* OPTForCausalLM */
} qd_arch_family;

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
    int tie_word_embeddings;
    int qkv_bias;              /* q/k/v carry biases (Qwen2, llama attention_bias, OPT) */
    int o_bias;                /* o_proj bias (llama attention_bias, OPT) */
    int mlp_bias;              /* mlp biases (llama mlp_bias, OPT) */
    /* OPT */
    int do_layer_norm_before;  /* pre-LN (1) or post-LN (0, opt-350m) */
    int64_t word_embed_proj_dim;   /* = hidden unless project_in/out exist */
    int pos_offset;            /* learned positions offset (2 for OPT) */
    char activation[16];       /* "silu", "relu", "gelu" */
    int bos_id, eos_id;        /* -1 when absent */
    char torch_dtype[16];
    /* quantization_config (quantized checkpoints) */
    int quantized;
    char quant_format[16];     /* format table name: "gptq", "gptq_v2", "awq_gemm" */
    int quant_bits;
    int64_t quant_group_size;  /* -1 for one group */
    int quant_sym;
    int quant_desc_act;
} qd_model_config;

/* Parses config.json text (`what` names the source in errors). */
int qd_model_config_parse(const char *json, const char *what, qd_model_config *out, qd_err *err);
/* Reads <dir>/config.json. */
int qd_model_config_load(const char *dir, qd_model_config *out, qd_err *err);
/* The family of an architecture string; QD_ARCH_UNKNOWN when not supported. */
qd_arch_family qd_arch_family_of(const char *architecture);

#endif
