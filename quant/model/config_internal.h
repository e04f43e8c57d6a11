/* Shared by the config.json readers (config.c, config_rope.c): typed field getters that
 * keep the default when a key is absent or null and name the key when its type is wrong. */
#ifndef QUANT_MODEL_CONFIG_INTERNAL_H
#define QUANT_MODEL_CONFIG_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>

#include "quant/model/config.h"

int qd_cfg_get_int(const cJSON *o, const char *key, int64_t *out, const char *what, qd_err *err);
int qd_cfg_get_float(const cJSON *o, const char *key, float *out, const char *what, qd_err *err);
int qd_cfg_get_bool(const cJSON *o, const char *key, int *out, const char *what, qd_err *err);
/* layer_types of sliding_attention / full_attention layers into c->layer_sliding: 1 when the
 * key is given, 0 when it is absent or null (layer_sliding untouched), or the refusal of a
 * list of another length (or more layers than QD_CFG_MAX_LAYERS) or of another kind, naming
 * the entry and c->architecture. */
int qd_cfg_layer_types_sliding(const cJSON *root, const char *what, qd_model_config *c, qd_err *err);
int qd_cfg_get_str(const cJSON *o, const char *key, char *out, size_t cap, const char *what, qd_err *err);
/* 1 when key is absent from o or null (a config class's default applies). */
int qd_cfg_absent(const cJSON *o, const char *key);
/* Keys of other families' config classes that would change this family's math: the first
 * of keys[0..n) that root sets (present and not null; with false_unset, false counts as not
 * set) is refused, naming it and arch. */
int qd_cfg_refuse_foreign(const cJSON *root, const char *const *keys, size_t n, int false_unset, const char *what,
                          const char *arch, qd_err *err);
#define QD_CFG_NKEYS(a) (sizeof(a) / sizeof((a)[0]))
/* The RoPE keys (config_rope.c): sets c->rope_theta, c->rope and the sliding layers'
 * c->rope_theta_local, c->rope_local (a copy unless the config gives them apart, which it
 * may only when layer_types is non-zero: the family has sliding and full layers). */
int qd_config_rope_parse(const cJSON *root, const char *what, int layer_types, qd_model_config *c, qd_err *err);
/* The keys particular to one rotary family (config_family.c): attention windows and layer
 * types, q/k norms, Gemma's norms, soft-caps, query and embedding scales, Phi-3's fused
 * layout; and the refusal of such keys where the family does not have them. Runs after
 * the shared keys (sizes, activation) are read. */
int qd_config_family_parse(const cJSON *root, const char *what, qd_model_config *c, qd_err *err);
/* GLM-4.5, dots.llm1, OLMoE, MiniMax-M2, ERNIE 4.5 MoE (config_moe.c): whether the architecture is one of
 * them, and the whole family parse for one, after RoPE is read. */
int qd_config_moe_owns(const char *architecture);
int qd_config_moe_parse(const cJSON *root, const char *what, qd_model_config *c, qd_err *err);
/* The Gated DeltaNet hybrids (config_qwen_next.c): Qwen3-Next and Qwen3.5's keys, in place of
 * qd_config_family_parse's, for the architectures qd_config_is_qwen_next names. */
int qd_config_is_qwen_next(const qd_model_config *c);
int qd_config_qwen_next_parse(const cJSON *root, const char *what, qd_model_config *c, qd_err *err);
/* StarCoder2, Phi, GPT-NeoX, Cohere2 (config_parallel.c): the LayerNorm families,
 * their defaults, RoPE spellings and refusals; qd_config_family_parse hands them over. */
int qd_config_is_plain_family(const char *architecture);
int qd_config_plain_parse(const cJSON *root, const char *what, qd_model_config *c, qd_err *err);
/* The post-norm families (config_postnorm.c: OLMo 2/3, EXAONE 4, GLM-4): whether
 * `architecture` is one, and its keys (RoPE included), called by qd_config_family_parse. */
int qd_config_postnorm_is(const char *architecture);
int qd_config_postnorm_parse(const cJSON *root, const char *what, qd_model_config *c, qd_err *err);
/* The dense Llama-shaped families with one change each (config_dense.c: SmolLM3, Granite,
 * Ministral, Ministral 3, Seed-OSS, ERNIE 4.5, Apertus, Hunyuan dense): whether arch is one, and its keys, in place of
 * qd_config_family_parse's. */
int qd_config_dense_owns(const char *arch);
int qd_config_dense_parse(const cJSON *root, const char *what, qd_model_config *c, qd_err *err);
/* Vision-language architectures (config_vlm.c): 1 when arch is a ConditionalGeneration class
 * whose text tower quantd reads. */
int qd_config_vlm_is(const char *arch);
/* For such an arch, *out is a new object (the caller deletes it): the text decoder's keys
 * (text_config, or the flat top-level ones) with the text config class's defaults, the tie
 * the outer config decides and the multimodal RoPE written as the 1-D RoPE it is for text
 * ids. Any other arch: *out is NULL, 0 returned. */
int qd_config_vlm_text(const cJSON *root, const char *what, const char *arch, cJSON **out, qd_err *err);

/* gpt-oss (config_gptoss.c): every key of GptOssConfig, its defaults where config.json
 * leaves one out; called by qd_config_family_parse for GptOssForCausalLM. */
int qd_config_gptoss_parse(const cJSON *root, const char *what, qd_model_config *c, qd_err *err);
/* The hybrids of attention with a recurrent mixer (config_hybrid.c): LFM2 and Granite-4.
 * qd_config_family_parse hands them over whole (RoPE included). */
int qd_config_is_hybrid(const char *architecture);
int qd_config_hybrid_parse(const cJSON *root, const char *what, qd_model_config *c, qd_err *err);
/* Mamba-2's time_step_limit [min, max] into c->mixer.dt_min, dt_max (left as they are when
 * absent; null refused: transformers' scan needs its bounds). */
int qd_cfg_time_step_limit(const cJSON *root, const char *what, qd_model_config *c, qd_err *err);
/* Falcon-H1 (config_falcon_h1.c): FalconH1Config's keys and defaults, RoPE included. */
int qd_config_falcon_h1_is(const char *architecture);
int qd_config_falcon_h1_parse(const cJSON *root, const char *what, qd_model_config *c, qd_err *err);
/* Llama 4 text (config_llama4.c): Llama4TextConfig's keys and defaults, RoPE included,
 * for Llama4ForCausalLM, in place of qd_config_family_parse's. */
int qd_config_llama4_is(const char *architecture);
int qd_config_llama4_parse(const cJSON *root, const char *what, qd_model_config *c, qd_err *err);
/* DeepSeek-V3.2 (config_dsa.c): its indexer's keys and refusals, read by qd_config_family_parse
 * after DeepSeek-V3's (MLA, MoE) for the architectures qd_config_dsa_is names. */
int qd_config_dsa_is(const char *architecture);
int qd_config_dsa_parse(const cJSON *root, const char *what, qd_model_config *c, qd_err *err);

#endif
