#!/usr/bin/env python3
"""Forward-parity goldens for quantd's decoder families (issue #16).

For each family below this builds a tiny random model with transformers itself (fixed
torch seed, peaked initialisation so that a wrong RoPE, norm or mask shows in the logits),
saves it with save_pretrained(safe_serialization=True) exactly as transformers writes it,
and records transformers' logits (eval mode, eager attention, float32) on fixed token ids:

    OUT/<family>/config.json, model.safetensors   the checkpoint as transformers wrote it
    OUT/<family>/ids.json                         {"tokens": [...]}, positions 0..n-1
    OUT/<family>/logits.f32                       little-endian float32 [n_tokens, vocab]
    OUT/<family>/meta.json                        versions, seed, what the case exercises

tests/unit/test_model_families.c compares quantd's CPU forward with these files, without
Python. Run through tests/families/run.sh, which owns the virtual environment:

    python make_goldens.py OUT_DIR [FAMILY...]

Weights are stored as bfloat16 (--dtype float32 stores them as float32): the float32 model
is rounded to bf16-representable values *before* the golden forward, so the logits are the
float32 forward of exactly the stored values. This halves the files (all families in about
3.5 MB instead of about 6) and costs the comparison nothing, since bf16 -> f32 is exact.

After saving, every checkpoint is loaded back with from_pretrained (float32, eager) and run
again; the logits must be bit-identical to the ones recorded, so the files on disk are what
produced the goldens (this is also what proves the hand-edited llama31_legacy config means
the same to transformers as llama31's).
"""
import argparse
import json
import math
import os
import shutil
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from transformers import (
    ApertusConfig,
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    Cohere2Config,
    Gemma3Config,
    Mistral3Config,
    Qwen2VLConfig,
    Qwen2_5_VLConfig,
    Qwen3VLConfig,
    DeepseekV2Config,
    DeepseekV3Config,
    Ernie4_5Config,
    Exaone4Config,
    FalconH1Config,
    Gemma2Config,
    Gemma3TextConfig,
    Glm4Config,
    GPTNeoXConfig,
    GraniteConfig,
    HunYuanDenseV1Config,
    GptOssConfig,
    GraniteMoeHybridConfig,
    Lfm2Config,
    LlamaConfig,
    Ministral3Config,
    MinistralConfig,
    MistralConfig,
    MixtralConfig,
    PhimoeConfig,
    Olmo2Config,
    Olmo3Config,
    Phi3Config,
    PhiConfig,
    Qwen2Config,
    Qwen2MoeConfig,
    Qwen3Config,
    Qwen3MoeConfig,
    Qwen3NextConfig,
    Starcoder2Config,
    SeedOssConfig,
    SmolLM3Config,
)
from transformers.models.deepseek_v32 import DeepseekV32Config
from transformers.models.dots1 import Dots1Config
from transformers.models.ernie4_5_moe import Ernie4_5_MoeConfig
from transformers.models.glm4_moe import Glm4MoeConfig
from transformers.models.minimax_m2 import MiniMaxM2Config
from transformers.models.llama4 import Llama4Config, Llama4TextConfig
from transformers.models.olmoe import OlmoeConfig
from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig

VOCAB = 256
N_TOKENS = 64
# Shared shape: GQA 4 query heads on 2 kv heads, head_dim 16 (8 RoPE frequencies).
BASE = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    # Large init: the logits are peaked (a few units apart) and attention is sharp, so a
    # wrong frequency or scale moves them far beyond the 1e-4 tolerance.
    initializer_range=0.3,
    rms_norm_eps=1e-6,
    # Tied to keep the files small; llama, llama31, mistral_window and phi3 keep their own
    # lm_head (the families' defaults), so both paths are covered.
    tie_word_embeddings=True,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=None,
)
# Norm weights and biases are initialised to constants (1 or 0); they get this much noise
# so that a norm applied as w instead of (1 + w), or a dropped bias, shows.
VECTOR_NOISE = 0.2


def fam(cls, seed, what, n_tokens=N_TOKENS, ablate=(), init=None, drop=(), buffers=False, **kw):
    """One family: its config class, seed, one line on what it exercises, and `ablate`:
    (label, config changes) pairs. Each is the same weights under the changed config; the
    generator records how far its logits are from the golden, so that a case which would
    not notice the feature missing (too short a sequence, a factor that changes nothing)
    shows up as a small number in meta.json. `init(model, generator)`, when given, changes
    the weights after the random initialisation (e.g. a decay the default one makes too
    fast for a 64-token sequence to show). `drop`: BASE keys the config class does not
    have (transformers would write them into config.json as unknown extras). `buffers`:
    the router's e_score_correction_bias buffers get noise too."""
    cfg = {k: v for k, v in BASE.items() if k not in drop}
    cfg.update(kw)
    return dict(cls=cls, seed=seed, what=what, n_tokens=n_tokens, kwargs=cfg, ablate=list(ablate), init=init,
                buffers=buffers)


def slow_decay(model, g):
    """Gated DeltaNet layers: A = exp(A_log) in [0.02, 0.2] instead of [0.01, 16], so the
    recurrent state decays by a factor of about 0.5 to 0.95 a token rather than forgetting
    everything at once: the 64 tokens then exercise the recurrence, not only its last step."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("linear_attn.A_log"):
                p.copy_(torch.empty(p.shape).uniform_(0.02, 0.2, generator=g).log())


# Gated DeltaNet hybrids (Qwen3-Next, Qwen3.5): 2 key heads of 16 shared by 32 value heads of
# 4 (16 per key head), a 4-tap causal conv; the gated full attention layers have head_dim 32
# with partial_rotary_factor 0.25 (8 rotated dims) and a sigmoid gate from q_proj. 32 value
# heads make in_proj_b / in_proj_a (and in_proj_ba) 32 or 64 rows, which GPTQ's packing needs.
GDN = dict(linear_num_key_heads=2, linear_num_value_heads=32, linear_key_head_dim=16, linear_value_head_dim=4,
           linear_conv_kernel_dim=4, head_dim=32, num_hidden_layers=4,
           layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
           rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25})


DEFAULT_ROPE = {"rope_type": "default", "rope_theta": 10000.0}


def vlm(cls, seed, what, text, vision, ablate=(), **outer):
    """A vision-language family: its composite config class, the text tower's keys (on top
    of BASE) and a tiny vision tower's. The golden is the ConditionalGeneration class's
    forward on text-only ids (no position_ids: the model derives them as it does for text,
    Qwen's three M-RoPE streams included); `ablate` changes are merged into text_config.
    meta.json also records the text-only CausalLM of the text tower on the same weights
    (`text_causal_lm`: rel diff to the golden), which for Qwen proves M-RoPE on text ids is
    the 1-D RoPE."""
    t = dict(BASE)
    t.update(text)
    kw = dict(outer, text_config=t, vision_config=vision)
    return dict(cls=cls, seed=seed, what=what, n_tokens=N_TOKENS, kwargs=kw, ablate=list(ablate), vlm=True)


# The text-only CausalLM classes of the text towers (the vlm cases' text_causal_lm check).
TEXT_CAUSAL = {"qwen2_vl_text": ("Qwen2Config", "Qwen2ForCausalLM"),
               "qwen2_5_vl_text": ("Qwen2Config", "Qwen2ForCausalLM"), "qwen3_vl_text": ("Qwen3Config", "Qwen3ForCausalLM"),
               "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM"), "mistral": ("MistralConfig", "MistralForCausalLM"),
               "llama4_text": ("Llama4TextConfig", "Llama4ForCausalLM")}


PHIMOE_LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0, 1.1, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0],
                   "long_factor": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], "short_mscale": 1.1, "long_mscale": 1.25,
                   "original_max_position_embeddings": 32}


# Sequences are 64 tokens: 4x the 16-token sliding windows, longer than the dynamic-NTK
# max_position_embeddings (48) and the longrope original context (32).
FAMILIES = {
    "llama": fam(LlamaConfig, 1001,
                 "Llama, GQA 4/2, rope_parameters with rope_theta 500000, untied lm_head",
                 rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
                 tie_word_embeddings=False,
                 ablate=[("rope_theta 10000", {"rope_parameters": dict(DEFAULT_ROPE)})]),
    "llama_tied": fam(LlamaConfig, 1002, "Llama with tie_word_embeddings (lm_head is embed_tokens)",
                      tie_word_embeddings=True),
    # head_dim 16, theta 500000: wavelengths 6.3, 32.5, 168, ... With an original context
    # of 64 and low/high freq factors 1/4 (wavelength bounds 64 and 16), frequency 0 is
    # kept, 1 is smoothed and 2..7 are divided by the factor: all three llama3 branches.
    "llama31": fam(LlamaConfig, 1003,
                   "Llama 3.1 RoPE (rope_type llama3, factor 8, low/high 1/4, original 64): kept, "
                   "smoothed and divided frequency bands",
                   rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 64},
                   tie_word_embeddings=False,
                   ablate=[("no scaling", {"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}})]),
    "llama_linear": fam(LlamaConfig, 1005, "Llama with rope_type linear, factor 4 (positions divided by 4)",
                        rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
                        ablate=[("no scaling", {"rope_parameters": dict(DEFAULT_ROPE)})]),
    # transformers grows the NTK base once the sequence (64) is longer than
    # max_position_embeddings (48): base * (factor * 64 / 48 - (factor - 1)) ** (d / (d - 2)).
    "llama_dynamic": fam(LlamaConfig, 1006,
                         "Llama with rope_type dynamic, factor 2, max_position_embeddings 48 < 64 tokens, "
                         "so the NTK base is recomputed for seq_len 64",
                         rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
                         max_position_embeddings=48,
                         ablate=[("no scaling", {"rope_parameters": dict(DEFAULT_ROPE)}),
                                 ("max_position_embeddings 64 (base not grown)", {"max_position_embeddings": 64})]),
    "llama_yarn": fam(LlamaConfig, 1007,
                      "Llama with rope_type yarn, factor 4, original 32, max_position_embeddings 128, "
                      "default attention_factor (0.1 ln 4 + 1) and beta 32/1",
                      rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                       "original_max_position_embeddings": 32},
                      ablate=[("no scaling", {"rope_parameters": dict(DEFAULT_ROPE)}),
                              ("attention_factor 1", {"rope_parameters": {
                                  "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                  "original_max_position_embeddings": 32, "attention_factor": 1.0}})]),
    "llama_head_dim": fam(LlamaConfig, 1008, "Llama with explicit head_dim 32 != hidden 64 / 4 heads",
                          head_dim=32, tie_word_embeddings=True),
    "mistral_window": fam(MistralConfig, 1009,
                          "Mistral with sliding_window 16 on a 64-token sequence (every layer windowed)",
                          sliding_window=16, tie_word_embeddings=False,
                          ablate=[("no window", {"sliding_window": None})]),
    "qwen2": fam(Qwen2Config, 1010, "Qwen2: q/k/v biases (no o_proj bias), rope_theta 1000000",
                 rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
    # As Qwen2.5 / Qwen3 ship YaRN: factor 4 with original_max_position_embeddings equal
    # to max_position_embeddings. transformers 5.23 uses `factor` as given (the ratio
    # max_position_embeddings / original only when factor is absent) and warns that the
    # two disagree; an implementation that prefers the ratio computes plain RoPE here.
    "qwen2_yarn": fam(Qwen2Config, 1016,
                      "Qwen2 with YaRN as Qwen2.5 ships it: factor 4 but original_max_position_embeddings = "
                      "max_position_embeddings (64), so the factor is not their ratio",
                      max_position_embeddings=64,
                      rope_parameters={"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
                                       "original_max_position_embeddings": 64},
                      ablate=[("no scaling", {"rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}}),
                              ("factor = max_pos / original = 1", {"rope_parameters": {
                                  "rope_type": "yarn", "rope_theta": 1000000.0, "factor": 1.0,
                                  "original_max_position_embeddings": 64}})]),
    "qwen3": fam(Qwen3Config, 1011,
                 "Qwen3: per-head RMSNorm q_norm/k_norm before RoPE, explicit head_dim 32 (hidden 64, 4 heads)",
                 head_dim=32, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
    "gemma2": fam(Gemma2Config, 1012,
                  "Gemma2: layers sliding(16)/full, attn softcap 10, final softcap 5, query_pre_attn_scalar 32 "
                  "(head_dim 16), (1+w) RMSNorms incl. post-attn/post-ffw, sqrt(hidden) embedding scale, gelu_tanh",
                  head_dim=16, sliding_window=16, attn_logit_softcapping=5.0, final_logit_softcapping=10.0,
                  query_pre_attn_scalar=32, layer_types=["sliding_attention", "full_attention"],
                  hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6, pad_token_id=0,
                  tie_word_embeddings=True,
                  ablate=[("no attn softcap", {"attn_logit_softcapping": None}),
                          ("no final softcap", {"final_logit_softcapping": None}),
                          ("query_pre_attn_scalar = head_dim", {"query_pre_attn_scalar": 16}),
                          ("no window", {"layer_types": ["full_attention", "full_attention"]})]),
    "gemma3": fam(Gemma3TextConfig, 1013,
                  "Gemma3 text: layer_types sliding(16)/full with local RoPE base 10000 vs global 1000000, "
                  "q_norm/k_norm, query_pre_attn_scalar 32 (head_dim 16)",
                  head_dim=16, sliding_window=16, query_pre_attn_scalar=32,
                  layer_types=["sliding_attention", "full_attention"], rope_local_base_freq=10000.0,
                  rope_theta=1000000.0, hidden_activation="gelu_pytorch_tanh", pad_token_id=0,
                  tie_word_embeddings=True,
                  ablate=[("local base = global", {"rope_local_base_freq": 1000000.0}),
                          ("no window", {"layer_types": ["full_attention", "full_attention"]})]),
    "phi3": fam(Phi3Config, 1014, "Phi3: fused qkv_proj and gate_up_proj, no RoPE scaling",
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                original_max_position_embeddings=128, pad_token_id=None, eos_token_id=2,
                tie_word_embeddings=False),
    # 64 tokens > original 32, so transformers uses long_factor; the attention factor is
    # sqrt(1 + ln(128/32) / ln 32) from max_position_embeddings / original.
    "phi3_longrope": fam(Phi3Config, 1015,
                         "Phi3 longrope: 64 tokens > original_max_position_embeddings 32 selects long_factor "
                         "(8 distinct values); max_position_embeddings 128 sets the attention factor",
                         rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                          "short_factor": [1.0, 1.05, 1.1, 1.2, 1.35, 1.5, 1.7, 1.9],
                                          "long_factor": [1.0, 1.3, 1.9, 2.7, 3.8, 5.0, 6.5, 8.0]},
                         original_max_position_embeddings=32, pad_token_id=None, eos_token_id=2,
                         ablate=[("short factors", {"rope_parameters": {
                             "rope_type": "longrope", "rope_theta": 10000.0,
                             "short_factor": [1.0, 1.05, 1.1, 1.2, 1.35, 1.5, 1.7, 1.9],
                             "long_factor": [1.0, 1.05, 1.1, 1.2, 1.35, 1.5, 1.7, 1.9]}}),
                                 ("attention factor 1 (max_position_embeddings 32)", {"max_position_embeddings": 32})]),
    # Mixture of experts (issue #18): 8 experts, top-2, so 64 tokens route unevenly and a
    # wrong softmax / renormalisation / expert order moves the logits.
    "mixtral": fam(MixtralConfig, 1017,
                   "Mixtral: 8 experts (block_sparse_moe.experts.N.w1/w2/w3), top-2 softmax routing renormalised",
                   num_local_experts=8, num_experts_per_tok=2, intermediate_size=32, tie_word_embeddings=False,
                   rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
    # PhiMoE: the sparsemixer router (eval): top-2, each weight a softmax over the logits
    # within 2 * router_jitter_noise (relative) of that pick. 0.3 rather than the default
    # 0.01 so that some tokens keep several logits in their softmax, others one.
    "phimoe": fam(PhimoeConfig, 1046,
                  "PhiMoE: LayerNorms with biases, q/k/v/o biases, lm_head bias; 8 experts, sparsemixer top-2 "
                  "routing (router_jitter_noise 0.3: masked softmax per pick, no renormalisation)",
                  num_local_experts=8, num_experts_per_tok=2, intermediate_size=32, attention_bias=True,
                  lm_head_bias=True, router_jitter_noise=0.3, tie_word_embeddings=False, rms_norm_eps=1e-5,
                  rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                  ablate=[("router_jitter_noise 0.01", {"router_jitter_noise": 0.01}),
                          ("router_jitter_noise 10 (no mask)", {"router_jitter_noise": 10.0}),
                          ("no lm_head bias", {"_params": ("lm_head.bias", 0.0)}),
                          ("no LayerNorm biases", {"_params": ("layernorm.bias", 0.0)}),
                          ("no attention biases", {"_params": ("self_attn.", 0.0, ".bias")})]),
    # PhiMoE's longrope as Phi-3.5-MoE ships it: PhimoeRotaryEmbedding takes short_factor
    # whatever the length (long_factor changes nothing: the ablation shows 0) and scales
    # cos/sin by long_mscale once the 64 tokens pass the original context of 32.
    "phimoe_longrope": fam(PhimoeConfig, 1047,
                           "PhiMoE with longrope (original 32 < 64 tokens): short_factor, cos/sin times long_mscale 1.25 "
                           "(short_mscale 1.1); sparsemixer top-2 (router_jitter_noise 0.3)",
                           num_local_experts=8, num_experts_per_tok=2, intermediate_size=32, attention_bias=True,
                           lm_head_bias=True, router_jitter_noise=0.3, tie_word_embeddings=False, rms_norm_eps=1e-5,
                           rope_parameters=PHIMOE_LONGROPE,
                           ablate=[("long_mscale 1.1 (= short_mscale)", {"rope_parameters": dict(PHIMOE_LONGROPE,
                                                                                                 long_mscale=1.1)}),
                                   ("short_factor all 1", {"rope_parameters": dict(PHIMOE_LONGROPE,
                                                                                   short_factor=[1.0] * 8)}),
                                   ("long_factor = short_factor (no effect: transformers takes short_factor)",
                                    {"rope_parameters": dict(PHIMOE_LONGROPE,
                                                             long_factor=PHIMOE_LONGROPE["short_factor"])})]),
    "qwen2_moe": fam(Qwen2MoeConfig, 1018,
                     "Qwen2-MoE: 8 experts top-2 without renormalisation, a shared expert with its sigmoid gate, "
                     "q/k/v biases",
                     num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                     shared_expert_intermediate_size=64, norm_topk_prob=False, decoder_sparse_step=1,
                     mlp_only_layers=[], qkv_bias=True,
                     ablate=[("top-k renormalised", {"norm_topk_prob": True})]),
    "qwen3_moe": fam(Qwen3MoeConfig, 1019,
                     "Qwen3-MoE: Qwen3 attention (q/k norms, head_dim 32), 8 experts top-2 renormalised, "
                     "no shared expert",
                     num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
                     decoder_sparse_step=1, mlp_only_layers=[], head_dim=32,
                     rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                     ablate=[("top-k not renormalised", {"norm_topk_prob": False})]),
    # DeepSeek-V3: multi-head latent attention with a q LoRA (q_a_proj -> q_a_layernorm ->
    # q_b_proj), kv_a_proj_with_mqa -> kv_a_layernorm -> kv_b_proj, v_head_dim (16) unlike
    # qk_head_dim (48), interleaved RoPE on 32 dims with YaRN (factor 4, mscale_all_dim 1, so
    # the softmax scale carries mscale^2); one dense layer then a MoE layer of 8 experts in 4
    # groups (2 kept), top-2 by sigmoid + e_score_correction_bias (noised, so it matters),
    # renormalised and scaled by 2.5, plus a shared expert. kv_lora_rank + qk_rope_head_dim
    # (kv_a_proj_with_mqa's rows) is 64, so every linear packs with group size 32 (as
    # DeepSeek-V3's 512 + 64).
    "deepseek_v3": fam(DeepseekV3Config, 1020,
                       "DeepSeek-V3: MLA with q_lora_rank 32, kv_lora_rank 32, nope 16 + rope 32 (interleaved), "
                       "v_head_dim 16, YaRN; first_k_dense_replace 1, 8 experts in 4 groups (topk_group 2), "
                       "top-2 sigmoid routing with e_score_correction_bias, routed_scaling_factor 2.5, 1 shared expert",
                       num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16,
                       qk_rope_head_dim=32, v_head_dim=16, n_routed_experts=8, num_experts_per_tok=2, n_group=4,
                       topk_group=2, moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1,
                       routed_scaling_factor=2.5, norm_topk_prob=True, rope_interleave=True,
                       rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                        "original_max_position_embeddings": 32, "mscale": 1.0,
                                        "mscale_all_dim": 1.0, "beta_fast": 32.0, "beta_slow": 1.0},
                       ablate=[("rope not interleaved", {"rope_interleave": False}),
                               ("one expert group", {"n_group": 1, "topk_group": 1}),
                               ("not renormalised", {"norm_topk_prob": False}),
                               ("no YaRN", {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}})]),
    # DeepSeek-V3.2: V3's MLA and MoE (RoPE interleaved, YaRN) plus the DSA indexer in every
    # layer: 8 indexer heads of 48 dims (its own half-split RoPE on the first 32) score each
    # query's causal keys and only the index_topk 8 best (of up to 64) reach the attention,
    # so most rows see a strict subset of their prefix. The goldens check that no row's
    # 8th and 9th best index scores are within 1e-5 of each other (dsa_margin): the choice
    # is unambiguous, whatever order torch.topk gives tied scores.
    "deepseek_v32": fam(DeepseekV32Config, 1024,
                        "DeepSeek-V3.2: V3's MLA (q_lora_rank 32, kv_lora_rank 32, nope 16 + rope 32 interleaved, "
                        "v_head_dim 16, YaRN) and MoE (first_k_dense_replace 1, 8 experts in 4 groups, top-2 sigmoid), "
                        "with the DSA indexer: 8 heads of 48 (half-split RoPE on 32), k_norm LayerNorm, "
                        "weights_proj, index_topk 8 of 64 tokens",
                        buffers=True, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16,
                        qk_rope_head_dim=32, v_head_dim=16, n_routed_experts=8, num_experts_per_tok=2, n_group=4,
                        topk_group=2, moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1,
                        routed_scaling_factor=2.5, norm_topk_prob=True, index_topk=8, index_head_dim=48,
                        index_n_heads=8,
                        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                         "original_max_position_embeddings": 32, "mscale": 1.0,
                                         "mscale_all_dim": 1.0, "beta_fast": 32.0, "beta_slow": 1.0},
                        ablate=[("index_topk 64 (every causal key)", {"index_topk": 64}),
                                ("index_topk 16", {"index_topk": 16}),
                                ("no YaRN", {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}})]),
    # DeepSeek-V2 (V2-Lite's shape): one q_proj (q_lora_rank null), RoPE by complex rotation
    # of pairs, softmax routing with group_limited_greedy (groups scored by their best
    # expert; one of two kept, so the second choice often differs from greedy), not
    # renormalised, scaled by 2; YaRN with mscale = mscale_all_dim = 0.707 as
    # V2-Lite (the attention factor is 1, the softmax scale carries mscale^2).
    "deepseek_v2": fam(DeepseekV2Config, 1021,
                       "DeepSeek-V2: MLA with q_proj (q_lora_rank null), kv_lora_rank 32, nope 16 + rope 32, "
                       "v_head_dim 16, YaRN mscale 0.707; first_k_dense_replace 1, 8 experts top-2 softmax "
                       "group_limited_greedy (2 groups of 4, 1 kept), routed_scaling_factor 2, 2 shared experts",
                       num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=16,
                       qk_rope_head_dim=32, v_head_dim=16, n_routed_experts=8, num_experts_per_tok=2, n_group=2,
                       topk_group=1, topk_method="group_limited_greedy", moe_intermediate_size=32,
                       n_shared_experts=2, first_k_dense_replace=1, routed_scaling_factor=2.0, norm_topk_prob=False,
                       rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                        "original_max_position_embeddings": 32, "mscale": 0.707,
                                        "mscale_all_dim": 0.707, "beta_fast": 32.0, "beta_slow": 1.0},
                       ablate=[("greedy", {"topk_method": "greedy"}),
                               ("no YaRN", {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}})]),
    # GLM-4.5/4.6: Llama attention with q/k/v biases (o_proj without), per-head q/k norms,
    # RoPE on half of head_dim (partial_rotary_factor 0.5, GLM's default); one dense layer
    # then DeepSeek-V3's routing (sigmoid + e_score_correction_bias, 4 groups, 2 kept,
    # renormalised, times 2.5) over 8 experts plus a shared expert. The correction bias is
    # a buffer, noised and rounded like the parameters (buffers=True) so it matters.
    "glm4_moe": fam(Glm4MoeConfig, 1022,
                    "GLM-4.5 MoE: attention_bias (q/k/v), use_qk_norm, partial_rotary_factor 0.5; "
                    "first_k_dense_replace 1, 8 experts in 4 groups (topk_group 2), top-2 sigmoid routing with "
                    "e_score_correction_bias, routed_scaling_factor 2.5, 1 shared expert",
                    buffers=True, n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2,
                    moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1,
                    routed_scaling_factor=2.5, norm_topk_prob=True, attention_bias=True, use_qk_norm=True,
                    partial_rotary_factor=0.5,
                    ablate=[("full rotary", {"partial_rotary_factor": 1.0}),
                            ("one expert group", {"n_group": 1, "topk_group": 1}),
                            ("not renormalised", {"norm_topk_prob": False})]),
    # dots.llm1: Qwen3 attention (per-head q/k norms), DeepSeek-V3 routing with shared
    # experts after one dense layer; layer 1 slides (sliding_window 16 from max_window_layers 1).
    "dots1": fam(Dots1Config, 1023,
                 "dots.llm1: per-head q/k norms, sliding window 16 on layer 1 (max_window_layers 1); "
                 "first_k_dense_replace 1, 8 experts in 2 groups (1 kept), top-2 sigmoid routing with "
                 "e_score_correction_bias, renormalised, routed_scaling_factor 2.5, 2 shared experts",
                 buffers=True, n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
                 moe_intermediate_size=32, n_shared_experts=2, first_k_dense_replace=1,
                 routed_scaling_factor=2.5, norm_topk_prob=True, sliding_window=16, max_window_layers=1,
                 ablate=[("no window", {"sliding_window": None}),
                         ("one expert group", {"n_group": 1, "topk_group": 1})]),
    # OLMoE: RMSNorm over the whole q and k projections (before the head split), softmax
    # top-2 of 8 experts, not renormalised (OlmoeConfig's default).
    "olmoe": fam(OlmoeConfig, 1024,
                 "OLMoE: q_norm/k_norm over the whole q/k projections, 8 experts top-2 softmax not renormalised",
                 num_experts=8, num_experts_per_tok=2, intermediate_size=32, norm_topk_prob=False,
                 ablate=[("top-k renormalised", {"norm_topk_prob": True})]),
    # MiniMax-M2: block_sparse_moe.experts.N.w1/w2/w3, sigmoid routing with
    # e_score_correction_bias (no groups), always renormalised; q/k norms over all heads;
    # rotary_dim 8 of head_dim 16 (partial RoPE).
    "minimax_m2": fam(MiniMaxM2Config, 1025,
                      "MiniMax-M2: q/k norms over all heads, rotary_dim 8 of head_dim 16; 8 experts top-2 sigmoid "
                      "routing with e_score_correction_bias, renormalised",
                      buffers=True, num_local_experts=8, num_experts_per_tok=2, intermediate_size=32, head_dim=16,
                      rotary_dim=8,
                      ablate=[("full rotary", {"rotary_dim": 16, "partial_rotary_factor": 1.0})]),
    # ERNIE 4.5 MoE: 3 layers, MoE only in layer 1 (moe_layer_start_index = end_index = 1),
    # so a dense layer follows a sparse one; softmax routing whose choice adds the [1, 8]
    # mlp.moe_statics.e_score_correction_bias (a parameter: noised with buffers=True),
    # renormalised; a shared expert; RoPE on interleaved pairs.
    "ernie4_5_moe": fam(Ernie4_5_MoeConfig, 1026,
                        "ERNIE 4.5 MoE: 3 layers, dense-MoE-dense (moe_layer_start/end_index 1), 8 experts top-2 "
                        "softmax with e_score_correction_bias in the choice, renormalised, 1 shared expert, "
                        "interleaved RoPE",
                        buffers=True, num_hidden_layers=3, moe_num_experts=8, moe_k=2, moe_intermediate_size=32,
                        moe_num_shared_experts=1, moe_layer_start_index=1, moe_layer_end_index=1,
                        moe_layer_interval=1, use_bias=False,
                        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                        ablate=[("top-1", {"moe_k": 1}),
                                ("rope_theta 1e6", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}})]),
    "qwen3_next": fam(Qwen3NextConfig, 1030,
                      "Qwen3-Next: Gated DeltaNet layers (interleaved in_proj_qkvz / in_proj_ba, 4-tap conv, "
                      "2 key heads for 4 value heads, gated RMSNorm) and gated full attention (q_proj's sigmoid gate, "
                      "q/k norms, partial RoPE 0.25) alternating; (1 + w) norms; 8 experts top-2 with a gated shared "
                      "expert, layer 2 dense (mlp_only_layers)",
                      **GDN, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                      shared_expert_intermediate_size=64, norm_topk_prob=True, decoder_sparse_step=1,
                      mlp_only_layers=[2], init=slow_decay,
                      ablate=[("full rotary", {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                                   "partial_rotary_factor": 1.0}}),
                              ("top-k not renormalised", {"norm_topk_prob": False})]),
    "qwen3_5": fam(Qwen3_5TextConfig, 1031,
                   "Qwen3.5 text: Gated DeltaNet layers with separate in_proj_qkv / in_proj_z / in_proj_b / "
                   "in_proj_a, gated full attention (partial RoPE 0.25), dense SwiGLU MLP",
                   **GDN, init=slow_decay,
                   ablate=[("full rotary", {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                                "partial_rotary_factor": 1.0}})]),
    "qwen3_5_moe": fam(Qwen3_5MoeTextConfig, 1032,
                       "Qwen3.5-MoE text: Qwen3.5's layers with 8 experts top-2 and a gated shared expert on "
                       "every layer",
                       **GDN, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                       shared_expert_intermediate_size=64, init=slow_decay,
                       ablate=[("full rotary", {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                                    "partial_rotary_factor": 1.0}})]),
    # Post-norm blocks: no norm in front of attention or the MLP, an RMSNorm on each
    # sub-block's output before the residual add (OLMo 2/3, EXAONE 4), or both (GLM-4).
    "olmo2": fam(Olmo2Config, 1030,
                 "OLMo 2: no pre-norms, post_attention_layernorm / post_feedforward_layernorm on the sub-block "
                 "outputs, q_norm/k_norm over the whole q (64) and k (32) projections before RoPE, untied lm_head",
                 rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, tie_word_embeddings=False,
                 ablate=[("rope_theta 10000", {"rope_parameters": dict(DEFAULT_ROPE)})]),
    "olmo3": fam(Olmo3Config, 1031,
                 "OLMo 3: OLMo 2's block with layer_types sliding(16)/full and a RoPE per layer type "
                 "(YaRN factor 4, original 32 on the full layers, plain on the sliding ones)",
                 sliding_window=16, layer_types=["sliding_attention", "full_attention"],
                 rope_parameters={"full_attention": {"rope_type": "yarn", "rope_theta": 500000.0, "factor": 4.0,
                                                     "original_max_position_embeddings": 32},
                                  "sliding_attention": {"rope_type": "default", "rope_theta": 500000.0}},
                 ablate=[("no window", {"layer_types": ["full_attention", "full_attention"]}),
                         ("no YaRN on full layers", {"rope_parameters": {
                             "full_attention": {"rope_type": "default", "rope_theta": 500000.0},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 500000.0}}})]),
    "exaone4": fam(Exaone4Config, 1032,
                   "EXAONE 4: post-norms as OLMo 2, per-head q_norm/k_norm, layer_types sliding(16) with RoPE / "
                   "full without RoPE (NoPE)",
                   num_hidden_layers=3, sliding_window=16,
                   layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                   rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                   ablate=[("every layer sliding (RoPE everywhere)", {"layer_types": ["sliding_attention"] * 3}),
                           ("every layer full (NoPE, no window)", {"layer_types": ["full_attention"] * 3})]),
    "glm4": fam(Glm4Config, 1033,
                "GLM-4 (0414): input/post_self_attn/post_attention/post_mlp RMSNorms, fused gate_up_proj, "
                "q/k/v biases, RoPE on the first half of head_dim (partial_rotary_factor 0.5) by interleaved pairs",
                head_dim=16, attention_bias=True, partial_rotary_factor=0.5,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
                tie_word_embeddings=False, pad_token_id=None,
                ablate=[("partial_rotary_factor 1", {"partial_rotary_factor": 1.0, "rope_parameters": {
                    "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0}})]),
    # Dense families with one change to the Llama block each.
    # SmolLM3: layer 1 is NoPE (no_rope_layers [1, 0]); with use_sliding_window and
    # sliding_window 16 the derived layer_types slide that NoPE layer only.
    "smollm3": fam(SmolLM3Config, 1101,
                   "SmolLM3: no_rope_layers [1, 0] (layer 1 without RoPE), use_sliding_window with window 16 on the "
                   "NoPE layer (derived layer_types), rope_theta 2000000",
                   no_rope_layers=[1, 0], use_sliding_window=True, sliding_window=16,
                   rope_parameters={"rope_type": "default", "rope_theta": 2000000.0},
                   ablate=[("RoPE on every layer", {"no_rope_layers": [1, 1],
                                                    "layer_types": ["full_attention", "sliding_attention"]}),
                           ("no window", {"use_sliding_window": False})]),
    # Granite 3.x's multipliers (8B: embedding 12, attention 1/128, residual 0.22, logits 16).
    "granite": fam(GraniteConfig, 1102,
                   "Granite: embedding_multiplier 12, attention_multiplier 0.125 (the softmax scale; head_dim^-1/2 "
                   "is 0.25), residual_multiplier 0.22, logits_scaling 8, untied lm_head",
                   embedding_multiplier=12.0, attention_multiplier=0.125, residual_multiplier=0.22,
                   logits_scaling=8.0, tie_word_embeddings=False,
                   ablate=[("embedding_multiplier 1", {"embedding_multiplier": 1.0}),
                           ("attention_multiplier = head_dim^-1/2", {"attention_multiplier": 0.25}),
                           ("residual_multiplier 1", {"residual_multiplier": 1.0}),
                           ("logits_scaling 1", {"logits_scaling": 1.0})]),
    "ministral": fam(MinistralConfig, 1103,
                     "Ministral: layer_types sliding(16)/full per layer, explicit head_dim 16",
                     head_dim=16, sliding_window=16, layer_types=["sliding_attention", "full_attention"],
                     tie_word_embeddings=False,
                     ablate=[("no window", {"layer_types": ["full_attention", "full_attention"]}),
                             ("every layer slides", {"layer_types": ["sliding_attention", "sliding_attention"]})]),
    # Seed-OSS: biases on q/k/v (attention_bias) and, here, on o_proj (attention_out_bias)
    # and the MLP too, so that every bias path is exercised.
    "seed_oss": fam(SeedOssConfig, 1104,
                    "Seed-OSS: attention_bias (q/k/v), attention_out_bias (o_proj) and mlp_bias, head_dim 32",
                    head_dim=32, attention_bias=True, attention_out_bias=True, mlp_bias=True,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    # ERNIE 4.5: RoPE on interleaved pairs (x0, x1), (x2, x3), ...; use_bias on every linear.
    "ernie4_5": fam(Ernie4_5Config, 1105,
                    "ERNIE 4.5 (dense): interleaved-pair RoPE over the whole head (head_dim 16), use_bias on "
                    "q/k/v/o and the MLP, rope_theta 500000, tied",
                    head_dim=16, use_bias=True, rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
                    ablate=[("rope_theta 10000", {"rope_parameters": dict(DEFAULT_ROPE)})]),
    # Apertus: xIELU (learned alpha_p, alpha_n per layer, noised here; beta and eps buffers)
    # in a non-gated MLP, q/k norms, llama3 RoPE as Apertus ships it (here with an original
    # context of 64 so that the bands differ on 64 tokens).
    "apertus": fam(ApertusConfig, 1106,
                   "Apertus: xIELU activation with per-layer alpha_p/alpha_n, non-gated MLP (up_proj, down_proj), "
                   "q_norm/k_norm, attention_layernorm/feedforward_layernorm, llama3 RoPE (factor 8, original 64)",
                   tie_word_embeddings=False,
                   rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 64},
                   ablate=[("plain RoPE", {"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}})]),
    # Hunyuan dense: query_layernorm/key_layernorm per head AFTER RoPE; RoPE labelled "dynamic"
    # with a fixed alpha, which transformers turns into a static NTK base theta * alpha^(d/(d-2)).
    "hunyuan_dense": fam(HunYuanDenseV1Config, 1107,
                         "Hunyuan dense: query_layernorm/key_layernorm after RoPE, rope_type dynamic with alpha 1000 "
                         "(static NTK base), head_dim 16",
                         head_dim=16, tie_word_embeddings=False,
                         rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "alpha": 1000.0, "factor": 1.0},
                         ablate=[("no alpha (plain RoPE)", {"rope_parameters": dict(DEFAULT_ROPE)})]),
    # Ministral 3: YaRN plus Llama 4's query scale 1 + beta ln(1 + floor(pos / original)):
    # with an original context of 16, positions 16..63 are scaled (beta 0.5 to show it).
    "ministral3": fam(Ministral3Config, 1108,
                      "Ministral 3: YaRN factor 4, original 16, mscale 1/1, llama_4_scaling_beta 0.5 (queries past "
                      "position 16 scaled), head_dim 16",
                      head_dim=16, tie_word_embeddings=False,
                      rope_parameters={"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
                                       "original_max_position_embeddings": 16, "beta_fast": 32.0, "beta_slow": 1.0,
                                       "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.5},
                      ablate=[("llama_4_scaling_beta 0", {"rope_parameters": {
                          "rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
                          "original_max_position_embeddings": 16, "beta_fast": 32.0, "beta_slow": 1.0,
                          "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.0}})]),
    # Vision-language models: the text tower is the quantized part; the golden is text-only.
    "qwen2_5_vl": vlm(Qwen2_5_VLConfig, 1040,
                      "Qwen2.5-VL text tower (Qwen2: q/k/v biases) through Qwen2_5_VLForConditionalGeneration on "
                      "text ids: M-RoPE mrope_section [2, 3, 3] with three equal position streams, untied lm_head, "
                      "a 2-block vision tower + merger copied unchanged",
                      text=dict(rope_parameters={"rope_type": "default", "rope_theta": 1000000.0,
                                                 "mrope_section": [2, 3, 3]}, tie_word_embeddings=False),
                      vision=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                                  patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=56,
                                  fullatt_block_indexes=[1]),
                      tie_word_embeddings=False,
                      ablate=[("rope_theta 10000", {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                                        "mrope_section": [2, 3, 3]}}),
                              ("mrope_section [8, 0, 0] (no effect on text: streams equal)",
                               {"rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0,
                                                    "mrope_section": [8, 0, 0]}})]),
    # Qwen2-VL: the text tower of Qwen2.5-VL (Qwen2 with M-RoPE); its vision tower differs
    # (LayerNorm blocks with fc1/fc2 MLPs, a LayerNorm merger), copied unchanged all the same.
    "qwen2_vl": vlm(Qwen2VLConfig, 1045,
                    "Qwen2-VL text tower (Qwen2: q/k/v biases) through Qwen2VLForConditionalGeneration on text ids: "
                    "M-RoPE mrope_section [4, 2, 2] with three equal position streams, untied lm_head, a 2-block "
                    "vision tower (LayerNorm, fc1/fc2) + merger copied unchanged",
                    text=dict(rope_parameters={"rope_type": "default", "rope_theta": 1000000.0,
                                               "mrope_section": [4, 2, 2]}, tie_word_embeddings=False),
                    vision=dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, patch_size=14,
                                spatial_merge_size=2, temporal_patch_size=2),
                    tie_word_embeddings=False,
                    ablate=[("rope_theta 10000", {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                                      "mrope_section": [4, 2, 2]}}),
                            ("mrope_section [8, 0, 0] (no effect on text: streams equal)",
                             {"rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0,
                                                  "mrope_section": [8, 0, 0]}})]),
    "qwen3_vl": vlm(Qwen3VLConfig, 1041,
                    "Qwen3-VL text tower (Qwen3: q/k norms, head_dim 32) through Qwen3VLForConditionalGeneration on "
                    "text ids: interleaved M-RoPE mrope_section [8, 4, 4], tied embeddings, vision tower with a "
                    "deepstack merger (images only) copied unchanged",
                    text=dict(head_dim=32, rope_parameters={"rope_type": "default", "rope_theta": 5000000.0,
                                                            "mrope_section": [8, 4, 4], "mrope_interleaved": True}),
                    vision=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                                patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=16,
                                deepstack_visual_indexes=[0]),
                    tie_word_embeddings=True,
                    ablate=[("rope_theta 10000", {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                                      "mrope_section": [8, 4, 4],
                                                                      "mrope_interleaved": True}}),
                            ("not interleaved (no effect on text: streams equal)",
                             {"rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0,
                                                  "mrope_section": [8, 4, 4], "mrope_interleaved": False}})]),
    "gemma3_vl": vlm(Gemma3Config, 1042,
                     "Gemma 3 text tower through Gemma3ForConditionalGeneration on text ids: sliding(16)/full layers, "
                     "local RoPE base 10000 vs global 1000000, q/k norms, query_pre_attn_scalar 32, sqrt(hidden) "
                     "embedding scale, tied lm_head; SigLIP tower + projector copied unchanged",
                     text=dict(head_dim=16, sliding_window=16, query_pre_attn_scalar=32,
                               layer_types=["sliding_attention", "full_attention"],
                               rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                                                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
                               hidden_activation="gelu_pytorch_tanh", pad_token_id=0),
                     vision=dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64,
                                 num_hidden_layers=1, num_attention_heads=2, image_size=32, patch_size=8),
                     mm_tokens_per_image=4, tie_word_embeddings=True,
                     ablate=[("local base = global", {"rope_parameters": {
                                 "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
                                 "sliding_attention": {"rope_type": "default", "rope_theta": 1000000.0}}}),
                             ("no window", {"layer_types": ["full_attention", "full_attention"]})]),
    "mistral3": vlm(Mistral3Config, 1043,
                    "Mistral-3 (Mistral-Small-3.1) text tower (Mistral, no window, rope_theta 1e9) through "
                    "Mistral3ForConditionalGeneration on text ids, untied lm_head; Pixtral tower + projector copied "
                    "unchanged",
                    text=dict(model_type="mistral", sliding_window=None, head_dim=16,
                              rope_parameters={"rope_type": "default", "rope_theta": 1000000000.0},
                              tie_word_embeddings=False),
                    vision=dict(model_type="pixtral", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                num_attention_heads=2, head_dim=16, image_size=64, patch_size=8),
                    tie_word_embeddings=False, spatial_merge_size=2,
                    ablate=[("rope_theta 10000", {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}})]),
    # Llama 4 multimodal: llama4's text tower (the same shape and features) through
    # Llama4ForConditionalGeneration on text ids (language_model.model.*, language_model.lm_head);
    # a 1-layer vision tower, its pixel-shuffle adapter and the projector copied unchanged.
    "llama4_vl": vlm(Llama4Config, 1051,
                     "Llama 4 multimodal: llama4's text tower (dense/MoE/MoE, NoPE layer 1 with the temperature, "
                     "chunked attention 16, L2 q/k norms, interleaved llama3 RoPE, 8 experts top-1, shared expert) "
                     "through Llama4ForConditionalGeneration on text ids; vision tower + projector copied unchanged",
                     text=dict(model_type="llama4_text", num_hidden_layers=3, intermediate_size=32,
                               intermediate_size_mlp=64, head_dim=16, num_local_experts=8, num_experts_per_tok=1,
                               moe_layers=[1, 2], no_rope_layers=[1, 0, 1], attention_chunk_size=16,
                               attn_temperature_tuning=True, floor_scale=8, attn_scale=0.5, use_qk_norm=True,
                               tie_word_embeddings=False, rms_norm_eps=1e-5,
                               rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                "original_max_position_embeddings": 32}),
                     vision=dict(model_type="llama4_vision_model", hidden_size=32, intermediate_size=64,
                                 num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14,
                                 vision_output_dim=64, projector_input_dim=64, projector_output_dim=64),
                     tie_word_embeddings=False, image_token_index=250, boi_token_index=251, eoi_token_index=252,
                     ablate=[("no chunks", {"attention_chunk_size": 128})]),
    # The LayerNorm families with a plain MLP (fc1 -> GELU -> fc2, biases everywhere).
    "starcoder2": fam(Starcoder2Config, 1030,
                      "StarCoder2: LayerNorms with bias, q/k/v/o and c_fc/c_proj biases (use_bias), GQA 4/2, "
                      "c_fc -> gelu_pytorch_tanh -> c_proj, sliding_window 16 on every layer, rope_theta 100000",
                      drop=("rms_norm_eps",), norm_epsilon=1e-5, use_bias=True, sliding_window=16,
                      hidden_act="gelu_pytorch_tanh", intermediate_size=128,
                      rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
                      ablate=[("no window", {"sliding_window": None}),
                              ("rope_theta 10000", {"rope_parameters": dict(DEFAULT_ROPE)})]),
    "phi2": fam(PhiConfig, 1031,
                "Phi-2: parallel attention and MLP from one input_layernorm (LayerNorm with bias), q/k/v/dense and "
                "fc1/fc2 biases, fc1 -> gelu_new -> fc2, partial_rotary_factor 0.5, final_layernorm, lm_head bias",
                drop=("rms_norm_eps",), num_key_value_heads=4, layer_norm_eps=1e-5, hidden_act="gelu_new",
                intermediate_size=128, tie_word_embeddings=False, qk_layernorm=False,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
                ablate=[("full rotary", {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                              "partial_rotary_factor": 1.0}})]),
    "gpt_neox": fam(GPTNeoXConfig, 1032,
                    "GPT-NeoX (Pythia): use_parallel_residual (attention from input_layernorm, MLP from "
                    "post_attention_layernorm, both of the block input), query_key_value per head [heads, 3, "
                    "head_dim], rotary 0.25 of head_dim 16, gelu, embed_in / final_layer_norm / embed_out",
                    drop=("rms_norm_eps", "num_key_value_heads"), layer_norm_eps=1e-5, hidden_act="gelu",
                    intermediate_size=128, tie_word_embeddings=False, use_parallel_residual=True,
                    attention_bias=True,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
                    ablate=[("sequential residual", {"use_parallel_residual": False}),
                            ("full rotary", {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                                  "partial_rotary_factor": 1.0}})]),
    "gpt_neox_seq": fam(GPTNeoXConfig, 1033,
                        "GPT-NeoX with use_parallel_residual false: the MLP reads post_attention_layernorm of the "
                        "stream after attention; rotary 0.5, rope_theta 1000",
                        drop=("rms_norm_eps", "num_key_value_heads"), layer_norm_eps=1e-5, hidden_act="gelu",
                        intermediate_size=128, tie_word_embeddings=False, use_parallel_residual=False,
                        attention_bias=True,
                        rope_parameters={"rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 0.5},
                        ablate=[("parallel residual", {"use_parallel_residual": True})]),
    # Cohere2 (Command R7B): the parallel block with SwiGLU from one mean-centred LayerNorm
    # (weight only); RoPE with interleaved pairs on the sliding layers, none on the full ones.
    "cohere2": fam(Cohere2Config, 1034,
                   "Cohere2: parallel attention and SwiGLU from one mean-centred LayerNorm without bias, layer_types "
                   "sliding(16, interleaved RoPE)/full (no RoPE), logit_scale 0.25, GQA 4/2",
                   drop=("rms_norm_eps",), layer_norm_eps=1e-5, sliding_window=16,
                   layer_types=["sliding_attention", "full_attention"], logit_scale=0.25,
                   rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, pad_token_id=0,
                   ablate=[("logit_scale 1", {"logit_scale": 1.0}),
                           ("RoPE on both layers", {"layer_types": ["sliding_attention", "sliding_attention"],
                                                    "sliding_window": 64})]),
    # Llama 4 text: 3 layers — 0 dense (intermediate_size_mlp 64) with RoPE, 1 MoE without
    # RoPE (NoPE, full causal attention, the query temperature from position 7 on:
    # floor_scale 8, attn_scale 0.5), 2 MoE with RoPE; RoPE layers attend within chunks of 16
    # (64 tokens: 4 chunks) and L2-normalise q and k after RoPE (complex, interleaved pairs,
    # llama3 scaling); 8 experts top-1, the sigmoid of the chosen logit scaling the expert's
    # input, fused gate_up_proj [E, H, 2 FF] (gate then up), a shared expert.
    "llama4": fam(Llama4TextConfig, 1050,
                  "Llama 4 text: dense/MoE/MoE layers (moe_layers [1, 2]), NoPE layer 1 (full attention, "
                  "attn temperature floor_scale 8, attn_scale 0.5), chunked attention 16 and L2 q/k norm on "
                  "RoPE layers, interleaved llama3 RoPE, 8 experts top-1 (sigmoid score on the input), shared expert",
                  num_hidden_layers=3, intermediate_size=32, intermediate_size_mlp=64, head_dim=16,
                  num_local_experts=8, num_experts_per_tok=1, moe_layers=[1, 2], no_rope_layers=[1, 0, 1],
                  attention_chunk_size=16, attn_temperature_tuning=True, floor_scale=8, attn_scale=0.5,
                  use_qk_norm=True, tie_word_embeddings=False, rms_norm_eps=1e-5,
                  rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                   "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 32},
                  ablate=[("no chunks", {"attention_chunk_size": 128}),
                          ("no temperature tuning", {"attn_temperature_tuning": False}),
                          ("no qk norm", {"use_qk_norm": False}),
                          ("RoPE on every layer", {"no_rope_layers": [1, 1, 1]}),
                          ("top-2", {"num_experts_per_tok": 2}),
                          ("no scaling", {"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}})]),
    # gpt-oss: q/k/v/o biases, a learned sink per head, sliding (16) and full layers
    # alternating (layer_types' default), YaRN with truncate false, 8 experts top-2 by the
    # router's logits (with its bias) softmaxed over the two, experts with biases and the
    # clamped SwiGLU (swiglu_limit 1.5 so that the clamps bite at this scale). The experts'
    # 2-D biases are noised too (build), so a dropped or misread bias shows.
    "gpt_oss": fam(GptOssConfig, 1022,
                   "gpt-oss: attention sinks, q/k/v/o biases, sliding window 16 on even layers, YaRN (factor 4, "
                   "truncate false); 8 experts top-2 (router with bias, softmax over the chosen logits), fused "
                   "interleaved gate_up_proj with biases, clamped SwiGLU (alpha 1.702, limit 1.5)",
                   num_local_experts=8, num_experts_per_tok=2, intermediate_size=32, head_dim=16,
                   sliding_window=16, attention_bias=True, swiglu_limit=1.5, tie_word_embeddings=False,
                   rms_norm_eps=1e-5,
                   rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0,
                                    "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 32},
                   ablate=[("no sinks", {"_params": ("self_attn.sinks", -1e30)}),
                           ("every layer full", {"layer_types": ["full_attention", "full_attention"]}),
                           ("swiglu_limit 7", {"swiglu_limit": 7.0}),
                           ("truncate true", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0,
                                                                  "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                                                  "truncate": True,
                                                                  "original_max_position_embeddings": 32}}),
                           ("no expert biases", {"_params": ("experts.", 0.0, "_bias")}),
                           ("no router bias", {"_params": ("router.bias", 0.0)})]),
    # LFM2: short-convolution layers around one attention layer (q/k layernorms per head,
    # RoPE theta 1e6); feed_forward width from intermediate_size 96 by the config class's
    # rule (int(2 * 96 / 3) = 64, times 1.5 = 96, a multiple of 16); embedding_norm last.
    "lfm2": fam(Lfm2Config, 1030,
                "LFM2: conv / full_attention / conv layers (short convolution C * conv(B * x), 3 taps), "
                "q/k layernorms, feed_forward 96 wide from block_auto_adjust_ff_dim, block_ffn_dim_multiplier 1.5, "
                "block_multiple_of 16",
                num_hidden_layers=3, intermediate_size=96, block_multiple_of=16, block_ffn_dim_multiplier=1.5,
                layer_types=["conv", "full_attention", "conv"], norm_eps=1e-5, conv_L_cache=3,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                ablate=[("rope theta 10000", {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}})]),
    # Granite-4.0-H (dense, Micro's shape): Mamba-2 layers (32 heads of 4 in 2 groups, state
    # 16, 4 taps, chunks of 16 so the scan crosses chunk boundaries, dt clamped to [0, 1.5];
    # in_proj's 352 rows a multiple of 32 as GPTQ packing needs)
    # and one attention layer without RoPE; shared_mlp; Granite's four multipliers.
    "granite4_h": fam(GraniteMoeHybridConfig, 1031,
                      "Granite-4.0-H dense: mamba / attention / mamba layers (Mamba-2: 32 heads x 4, 2 groups, "
                      "d_state 16, d_conv 4, chunk 16, time_step_limit [0, 1.5], gated RMSNorm), attention without "
                      "RoPE (nope), shared_mlp 96 wide (intermediate_size 32 unused), embedding 2, attention 0.2, residual 0.5, logits_scaling 4",
                      num_hidden_layers=3, num_local_experts=0, shared_intermediate_size=96, intermediate_size=32,
                      layer_types=["mamba", "attention", "mamba"], mamba_n_heads=32, mamba_n_groups=2,
                      mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=16,
                      time_step_limit=[0.0, 1.5], position_embedding_type="nope", embedding_multiplier=2.0,
                      attention_multiplier=0.2, residual_multiplier=0.5, logits_scaling=4.0,
                      ablate=[("rope", {"position_embedding_type": "rope"}),
                              ("residual_multiplier 1", {"residual_multiplier": 1.0}),
                              ("attention_multiplier 1", {"attention_multiplier": 1.0}),
                              ("no dt limit", {"time_step_limit": [0.0, float("inf")]})]),
    # Granite-4.0-H with MoE experts (Tiny's and Small's block): beside shared_mlp, 8 experts
    # top-2 (the router's top two logits softmaxed over the two), stored fused as
    # block_sparse_moe.input_linear [E, 2 FF, H] (gate rows, then up) and output_linear
    # [E, H, FF]; attention with RoPE here (the dense entry has none).
    "granite4_h_moe": fam(GraniteMoeHybridConfig, 1041,
                          "Granite-4.0-H MoE: mamba / attention / mamba layers as granite4_h, attention with RoPE; "
                          "8 experts (32 wide) top-2 (softmax over the chosen router logits) beside shared_mlp 64 wide, "
                          "fused input_linear / output_linear experts; embedding 2, attention 0.2, residual 0.5, "
                          "logits_scaling 4",
                          num_hidden_layers=3, num_local_experts=8, num_experts_per_tok=2, intermediate_size=32,
                          shared_intermediate_size=64, layer_types=["mamba", "attention", "mamba"], mamba_n_heads=32,
                          mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=16,
                          time_step_limit=[0.0, 1.5], position_embedding_type="rope", embedding_multiplier=2.0,
                          attention_multiplier=0.2, residual_multiplier=0.5, logits_scaling=4.0,
                          ablate=[("top-1", {"num_experts_per_tok": 1}),
                                  ("top-3", {"num_experts_per_tok": 3}),
                                  ("no shared_mlp", {"_params": ("shared_mlp.output_linear", 0.0)}),
                                  ("no experts", {"_params": ("experts.down_proj", 0.0)}),
                                  ("nope", {"position_embedding_type": "nope"})]),
    # Falcon-H1: attention (RoPE, GQA 4/2) and Mamba-2 (32 heads of 4 in 2 groups, d_ssm 128,
    # state 16, 4 taps, chunks of 16, dt clamped to [0, 1.5], no gated norm: the default
    # mamba_rms_norm false) side by side in every layer; every muP multiplier away from 1.
    # in_proj's 2 * 128 + 2 * 32 + 32 = 352 rows are a multiple of 32 as GPTQ packing needs.
    "falcon_h1": fam(FalconH1Config, 1051,
                     "Falcon-H1: attention beside Mamba-2 in each of 3 layers (32 heads x 4, 2 groups, d_ssm 128, "
                     "d_state 16, d_conv 4, chunk 16, time_step_limit [0, 1.5], no gated norm), SwiGLU feed_forward; "
                     "multipliers: embedding 2, lm_head 0.5, key 0.7, attention in 1.3 / out 0.8, ssm in 1.5 / out 0.6, "
                     "mlp [1.4, 0.7], ssm_multipliers [1.2, 0.9, 1.1, 0.8, 1.3]",
                     num_hidden_layers=3, mamba_d_ssm=128, mamba_n_heads=32, mamba_n_groups=2, mamba_d_state=16,
                     mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=16, time_step_limit=[0.0, 1.5],
                     embedding_multiplier=2.0, lm_head_multiplier=0.5, key_multiplier=0.7,
                     attention_in_multiplier=1.3, attention_out_multiplier=0.8, ssm_in_multiplier=1.5,
                     ssm_out_multiplier=0.6, mlp_multipliers=[1.4, 0.7], ssm_multipliers=[1.2, 0.9, 1.1, 0.8, 1.3],
                     rope_parameters=DEFAULT_ROPE,
                     ablate=[("embedding_multiplier 1", {"embedding_multiplier": 1.0}),
                             ("lm_head_multiplier 1", {"lm_head_multiplier": 1.0}),
                             ("key_multiplier 1", {"key_multiplier": 1.0}),
                             ("attention_in_multiplier 1", {"attention_in_multiplier": 1.0}),
                             ("attention_out_multiplier 1", {"attention_out_multiplier": 1.0}),
                             ("ssm_in_multiplier 1", {"ssm_in_multiplier": 1.0}),
                             ("ssm_out_multiplier 1", {"ssm_out_multiplier": 1.0}),
                             ("mlp gate multiplier 1", {"mlp_multipliers": [1.0, 0.7]}),
                             ("mlp down multiplier 1", {"mlp_multipliers": [1.4, 1.0]}),
                             ("ssm_multipliers z 1", {"ssm_multipliers": [1.0, 0.9, 1.1, 0.8, 1.3]}),
                             ("ssm_multipliers x 1", {"ssm_multipliers": [1.2, 1.0, 1.1, 0.8, 1.3]}),
                             ("ssm_multipliers B 1", {"ssm_multipliers": [1.2, 0.9, 1.0, 0.8, 1.3]}),
                             ("ssm_multipliers C 1", {"ssm_multipliers": [1.2, 0.9, 1.1, 1.0, 1.3]}),
                             ("ssm_multipliers dt 1", {"ssm_multipliers": [1.2, 0.9, 1.1, 0.8, 1.0]}),
                             ("no dt limit", {"time_step_limit": [0.0, float("inf")]}),
                             ("no mamba", {"_params": ("mamba.out_proj", 0.0)}),
                             ("no attention", {"_params": ("self_attn.o_proj", 0.0)})]),
    # Falcon-H1 with the gated RMSNorm (mamba_rms_norm, after the gate as vLLM computes it),
    # biased in_proj and out_proj (mamba_proj_bias = projectors_bias) and GQA attention biases.
    "falcon_h1_norm": fam(FalconH1Config, 1061,
                          "Falcon-H1 as falcon_h1 with mamba_rms_norm (gated RMSNorm over 2 groups, after the gate), "
                          "mamba_proj_bias and projectors_bias, attention_bias; multipliers as falcon_h1",
                          num_hidden_layers=2, mamba_d_ssm=128, mamba_n_heads=32, mamba_n_groups=2, mamba_d_state=16,
                          mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=16, mamba_rms_norm=True,
                          mamba_norm_before_gate=False, mamba_proj_bias=True, projectors_bias=True, attention_bias=True,
                          embedding_multiplier=2.0, lm_head_multiplier=0.5, key_multiplier=0.7,
                          attention_in_multiplier=1.3, attention_out_multiplier=0.8, ssm_in_multiplier=1.5,
                          ssm_out_multiplier=0.6, mlp_multipliers=[1.4, 0.7], ssm_multipliers=[1.2, 0.9, 1.1, 0.8, 1.3],
                          rope_parameters=DEFAULT_ROPE,
                          ablate=[("norm before the gate", {"mamba_norm_before_gate": True}),
                                  ("gated norm weight 1", {"_params": ("mamba.norm.weight", 1.0)}),
                                  ("no in_proj bias", {"_params": ("mamba.in_proj", 0.0, "bias")}),
                                  ("no out_proj bias", {"_params": ("mamba.out_proj", 0.0, "bias")})]),
}
# llama31_legacy is llama31's checkpoint with config.json rewritten (see write_legacy).
LEGACY = "llama31_legacy"
# mistral3_tie_default is mistral3's checkpoint with the outer tie_word_embeddings removed (see write_tie_default).
TIE_DEFAULT = "mistral3_tie_default"
# gpt_oss_mxfp4 is gpt_oss's checkpoint with the experts in MXFP4, as the Hub ships gpt-oss
# (see write_mxfp4).
MXFP4 = "gpt_oss_mxfp4"
ALL_NAMES = list(FAMILIES) + [LEGACY, TIE_DEFAULT, MXFP4]


def build(spec):
    """The float32 model for one family, deterministic in spec['seed']."""
    torch.manual_seed(spec["seed"])
    config = spec["cls"](**spec["kwargs"])
    model = auto_of(spec).from_config(config, attn_implementation="eager", dtype=torch.float32)
    g = torch.Generator().manual_seed(spec["seed"] + 7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            # 2-D biases: gpt-oss's experts' (gate_up_proj_bias [E, 2 FF], down_proj_bias [E, H]);
            # a router's e_score_correction_bias parameter where the family asks (buffers).
            if p.dim() == 1 or name.endswith("_proj_bias") or \
                    (spec.get("buffers") and name.endswith("e_score_correction_bias")):
                p.add_(VECTOR_NOISE * torch.randn(p.shape, generator=g))
        # Routers' e_score_correction_bias is a saved buffer (zeros at init): noised too
        # where the family has one (buffers=True), or the biased choice would go untested.
        for name, b in model.named_buffers():
            if spec.get("buffers") and name.endswith("e_score_correction_bias"):
                b.add_(VECTOR_NOISE * torch.randn(b.shape, generator=g))
        if spec.get("init"):
            spec["init"](model, g)
    model.eval()
    return model


def auto_of(spec):
    return AutoModelForImageTextToText if spec.get("vlm") else AutoModelForCausalLM


def changed_kwargs(spec, change):
    kw = dict(spec["kwargs"])
    if spec.get("vlm"):
        kw["text_config"] = dict(kw["text_config"], **change)
    else:
        kw.update(change)
    return kw


def text_causal_lm(model, spec, ids, logits):
    """The text tower as its own CausalLM (same weights, the text config alone): rel diff of
    its logits to the golden. For Qwen-VL it proves M-RoPE on text ids is the 1-D RoPE."""
    tcfg = model.config.get_text_config().to_dict()
    ccls, mcls = TEXT_CAUSAL[tcfg["model_type"]]
    tcfg.pop("model_type")
    rp = tcfg.get("rope_parameters")
    if isinstance(rp, dict) and "mrope_section" in rp:
        tcfg["rope_parameters"] = {k: v for k, v in rp.items() if k not in ("mrope_section", "mrope_interleaved")}
    tcfg["tie_word_embeddings"] = model.config.tie_word_embeddings
    cfg = getattr(transformers, ccls)(**tcfg)
    m = getattr(transformers, mcls)._from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    sd = {}
    for k, v in model.state_dict().items():
        if k.startswith("model.language_model."):
            sd["model." + k[len("model.language_model."):]] = v
        elif k.startswith("language_model."):   # Llama 4: language_model is a Llama4ForCausalLM
            sd[k[len("language_model."):]] = v
        elif k.startswith("lm_head."):
            sd[k] = v
    missing, unexpected = m.load_state_dict(sd, strict=False)
    if unexpected or missing:
        raise SystemExit(f"text_causal_lm: missing {missing} unexpected {unexpected}")
    m.eval()
    with torch.no_grad():
        out = m(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False)
    return rel_err(out.logits[0].to(torch.float32).numpy(), logits)


def round_to(model, dtype):
    """Rounds every parameter (and saved router bias buffer) to `dtype`-representable
    values, kept in float32."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(dtype).to(torch.float32))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(b.to(dtype).to(torch.float32))


def forward(model, ids):
    # Vision-language models derive their (M-RoPE) positions from the ids, as for any text.
    pos = {} if hasattr(model.config, "text_config") else {"position_ids": torch.arange(len(ids)).unsqueeze(0)}
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False, **pos)
    return out.logits[0].to(torch.float32).contiguous().numpy()


def rel_err(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def ablations(model, spec, ids, logits):
    out = {}
    for label, change in spec["ablate"]:
        change = dict(change)
        # "_params": (substring, value[, suffix]): the same config, those parameters set to
        # value (a feature that is weights, not a key: gpt-oss's sinks and biases).
        params = change.pop("_params", None)
        kw = changed_kwargs(spec, change)
        m = auto_of(spec).from_config(spec["cls"](**kw), attn_implementation="eager", dtype=torch.float32)
        m.load_state_dict(model.state_dict())
        if params:
            with torch.no_grad():
                for name, p in m.named_parameters():
                    if params[0] in name and name.endswith(params[2] if len(params) > 2 else ""):
                        p.fill_(params[1])
        m.eval()
        out[label] = rel_err(forward(m, ids), logits)
    return out


def reload_logits(d, ids, auto=AutoModelForCausalLM):
    m = auto.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
    m.eval()
    return forward(m, ids)


ROPE_KEYS = ("rope_parameters", "rope_scaling", "rope_theta", "rope_local_base_freq",
             "original_max_position_embeddings", "partial_rotary_factor")


def rope_view(cfg):
    return {k: cfg[k] for k in ROPE_KEYS if k in cfg}


def differences(spec, written):
    """What transformers wrote differently from the keyword arguments we gave it."""
    notes = []
    for k, v in spec["kwargs"].items():
        if k not in written:
            notes.append(f"{k} is not a config.json key in transformers {transformers.__version__} "
                         f"(given {json.dumps(v)}; see rope_parameters)" if "rope" in k else
                         f"{k} is not a config.json key in transformers {transformers.__version__}")
        elif isinstance(v, dict) and isinstance(written[k], dict):   # a nested config: the keys given
            notes += differences(dict(kwargs=v), written[k])
        elif written[k] != v:
            notes.append(f"{k}: given {json.dumps(v)}, written {json.dumps(written[k])}")
    return notes


def dsa_margin(model, ids):
    """DeepSeek-V3.2: the smallest gap, over the layers and the rows with more causal keys
    than index_topk, between the k-th and (k+1)-th best index scores, relative to the row's
    largest magnitude — recomputed from each indexer's inputs as DeepseekV32Indexer does. A
    gap of 0 is a tie torch.topk breaks its own way; the goldens refuse one under 1e-5."""
    from transformers.models.deepseek_v32 import modeling_deepseek_v32 as mdl
    gaps = []

    def hook(mod, args, kwargs, _out):
        x, q_resid, (cos, sin), mask = args[:4]
        b, s, _ = x.shape
        q = mod.wq_b(q_resid).view(b, s, mod.n_heads, mod.head_dim)
        q_rot, q_pass = torch.split(q, [mod.qk_rope_head_dim, mod.head_dim - mod.qk_rope_head_dim], dim=-1)
        k = mod.k_norm(mod.wk(x)).unsqueeze(2)
        k_rot, k_pass = torch.split(k, [mod.qk_rope_head_dim, mod.head_dim - mod.qk_rope_head_dim], dim=-1)
        q_rot, k_rot = mdl.apply_rotary_pos_emb(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
        q = torch.cat([q_rot, q_pass], dim=-1)
        k = torch.cat([k_rot, k_pass], dim=-1).squeeze(2)
        sc = F.relu(torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * mod.softmax_scale)
        w = mod.weights_proj(x).float() * (mod.n_heads ** -0.5)
        idx = torch.matmul(w.unsqueeze(-2), sc).squeeze(-2)[0]
        kk = mod.index_topk
        for i in range(kk, s):
            row = torch.sort(idx[i, :i + 1], descending=True).values
            gaps.append(float((row[kk - 1] - row[kk]) / row.abs().max().clamp_min(1e-30)))

    hs = [m.register_forward_hook(hook, with_kwargs=True) for m in model.modules()
          if type(m).__name__ == "DeepseekV32Indexer"]
    forward(model, ids)
    for h in hs:
        h.remove()
    return min(gaps) if gaps else None


def write_family(out_dir, name, spec, dtype):
    d = os.path.join(out_dir, name)
    model = build(spec)
    round_to(model, dtype)
    rng = np.random.RandomState(spec["seed"])
    ids = [int(x) for x in rng.randint(3, VOCAB, size=spec["n_tokens"])]
    logits = forward(model, ids)
    sens = ablations(model, spec, ids, logits)
    margin = dsa_margin(model, ids) if spec["cls"] is DeepseekV32Config else None
    if margin is not None and margin < 1e-5:
        raise SystemExit(f"{name}: an index score tie at the top-k boundary (relative gap {margin:.3g})")
    text_lm = text_causal_lm(model, spec, ids, logits) if spec.get("vlm") else None
    if not np.all(np.isfinite(logits)):
        raise SystemExit(f"{name}: non-finite logits")
    shutil.rmtree(d, ignore_errors=True)
    model.to(dtype).save_pretrained(d, safe_serialization=True)
    for extra in os.listdir(d):   # generation_config.json is not part of the forward
        if extra not in ("config.json", "model.safetensors"):
            os.remove(os.path.join(d, extra))
    again = reload_logits(d, ids, auto_of(spec))
    if not np.array_equal(again, logits):
        raise SystemExit(f"{name}: reloaded checkpoint gives different logits (max |d| "
                         f"{np.max(np.abs(again - logits)):.3g})")
    with open(os.path.join(d, "config.json")) as f:
        written = json.load(f)
    notes = differences(spec, written)
    top = np.sort(logits, axis=1)
    meta = {
        "family": name,
        "architecture": written["architectures"][0],
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "n_tokens": len(ids),
        "vocab": int(logits.shape[1]),
        "seed": spec["seed"],
        "what": spec["what"],
        "weights": f"{str(dtype).replace('torch.', '')}; logits are the float32 eager forward of exactly these values",
        "max_abs_logit": float(np.max(np.abs(logits))),
        "mean_top1_top2_gap": float(np.mean(top[:, -1] - top[:, -2])),
        "transformers_differences": notes,
        "sensitivity": {k: round(v, 4) for k, v in sens.items()},
    }
    if margin is not None:
        meta["dsa_topk_margin"] = margin
    if text_lm is not None:
        meta["text_causal_lm"] = text_lm
        print(f"  text tower as its own CausalLM: rel diff {text_lm:.3g}")
        if text_lm > 1e-5:
            raise SystemExit(f"{name}: the text-only CausalLM differs from the ConditionalGeneration forward")
    save_goldens(d, ids, logits, meta)
    print(f"{name}: {meta['architecture']} n={len(ids)} vocab={meta['vocab']} max|logit|={meta['max_abs_logit']:.2f} "
          f"top1-top2={meta['mean_top1_top2_gap']:.2f}")
    print(f"  rope keys: {json.dumps(rope_view(written))}")
    for k, v in sens.items():
        print(f"  without it ({k}): rel diff {v:.3g}" + ("   <-- TOO SMALL" if v < 1e-2 else ""))
    for n in notes:
        print(f"  differs: {n}")
    return ids, logits


def save_goldens(d, ids, logits, meta):
    with open(os.path.join(d, "ids.json"), "w") as f:
        json.dump({"tokens": ids}, f)
        f.write("\n")
    logits.astype("<f4").tofile(os.path.join(d, "logits.f32"))
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    for name in os.listdir(d):   # save_pretrained writes the weights 0600
        os.chmod(os.path.join(d, name), 0o644)


def write_legacy(out_dir, dtype):
    """llama31's checkpoint with the pre-transformers-5 RoPE spelling: top-level rope_theta
    and rope_scaling {"type": "llama3", ...}. Hand-edited on purpose; transformers must
    reproduce llama31's logits from it exactly."""
    src, d = os.path.join(out_dir, "llama31"), os.path.join(out_dir, LEGACY)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    shutil.copyfile(os.path.join(src, "model.safetensors"), os.path.join(d, "model.safetensors"))
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    rp = cfg.pop("rope_parameters")
    scaling = {"type": rp.pop("rope_type")}
    cfg["rope_theta"] = rp.pop("rope_theta")
    scaling.update(rp)
    cfg["rope_scaling"] = scaling
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    with open(os.path.join(src, "ids.json")) as f:
        ids = json.load(f)["tokens"]
    ref = np.fromfile(os.path.join(src, "logits.f32"), dtype="<f4").reshape(len(ids), -1)
    again = reload_logits(d, ids)
    if not np.array_equal(again, ref):
        raise SystemExit(f"{LEGACY}: transformers reads the legacy spelling differently (max |d| "
                         f"{np.max(np.abs(again - ref)):.3g})")
    with open(os.path.join(src, "meta.json")) as f:
        meta = json.load(f)
    meta.pop("sensitivity", None)
    meta.update(family=LEGACY,
                what="llama31's weights and logits with config.json HAND-EDITED to the legacy spelling: "
                     "top-level rope_theta and rope_scaling {\"type\": \"llama3\", ...} instead of rope_parameters",
                hand_edited=True, transformers_differences=[])
    save_goldens(d, ids, ref, meta)
    print(f"{LEGACY}: hand-edited config of llama31; transformers reproduces its logits")
    print(f"  rope keys: {json.dumps(rope_view(cfg))}")


def write_tie_default(out_dir):
    """mistral3's checkpoint with config.json's outer tie_word_embeddings left out, as the
    Hub's Mistral-Small-3.1 config does: Mistral3Config's default is true, but the
    checkpoint stores language_model.lm_head, which transformers then does not tie (it
    differs from the embeddings). Hand-edited; transformers must reproduce mistral3's logits."""
    src, d = os.path.join(out_dir, "mistral3"), os.path.join(out_dir, TIE_DEFAULT)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    shutil.copyfile(os.path.join(src, "model.safetensors"), os.path.join(d, "model.safetensors"))
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    cfg.pop("tie_word_embeddings")
    cfg["text_config"].pop("tie_word_embeddings", None)
FP4_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def mxfp4_pack(w):
    """w [E, N, K] float32 -> (blocks uint8 [E, N, K/32, 16], scales uint8 [E, N, K/32]) as the
    Hub's gpt-oss stores its experts: per 32 values along K one E8M0 scale 2^(s - 127), each
    value an FP4 (e2m1) code, two a byte, the even element in the low nibble. The scale is the
    smallest power of two that brings the group's largest magnitude within 6; each value takes
    the nearest code (a tie to the lower index). transformers' own dequantization
    (integrations/mxfp4.py, _convert_moe_packed_tensors) is the reference reader."""
    E, N, K = w.shape
    g = w.reshape(E, N, K // 32, 32)
    amax = g.abs().amax(-1).clamp_min(2.0 ** -126)
    e = torch.ceil(torch.log2(amax / 6.0)).clamp(-127, 127)
    q = g / torch.ldexp(torch.ones_like(e), e.to(torch.int32))[..., None]
    lut = torch.tensor(FP4_VALUES)
    codes = (q[..., None] - lut).abs().argmin(-1).to(torch.uint8)                # [E, N, K/32, 32]
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return blocks.contiguous(), (e + 127).to(torch.uint8).contiguous()


def write_mxfp4(out_dir):
    """gpt_oss's checkpoint with every expert weight stored as MXFP4 (mlp.experts.*_blocks and
    *_scales, quantization_config quant_method "mxfp4", as openai/gpt-oss-20b ships) and the
    rest (attention, router, biases, embeddings) as written by save_pretrained. The goldens
    are transformers' forward of this directory, loaded by from_pretrained, which dequantizes
    MXFP4 on a CPU; they must equal the forward of gpt_oss's model with the decoded values put
    in by hand (so the packing above is read as transformers reads it)."""
    from safetensors.torch import load_file, save_file
    src, d = os.path.join(out_dir, "gpt_oss"), os.path.join(out_dir, MXFP4)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    sd = load_file(os.path.join(src, "model.safetensors"))
    out, decoded = {}, {}
    lut = torch.tensor(FP4_VALUES)
    for k, v in sd.items():
        if k.endswith(("experts.gate_up_proj", "experts.down_proj")):
            wt = v.float().transpose(1, 2).contiguous()                            # [E, N, K]
            blocks, scales = mxfp4_pack(wt)
            out[k + "_blocks"], out[k + "_scales"] = blocks, scales
            codes = torch.stack([blocks & 15, blocks >> 4], -1).reshape(*blocks.shape[:-1], 32).long()
            vals = torch.ldexp(lut[codes], (scales.to(torch.int32) - 127)[..., None])
            decoded[k] = vals.reshape(wt.shape).transpose(1, 2).contiguous()
        else:
            out[k] = v
    save_file(out, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    with open(os.path.join(src, "ids.json")) as f:
        ids = json.load(f)["tokens"]
    ref = np.fromfile(os.path.join(src, "logits.f32"), dtype="<f4").reshape(len(ids), -1)
    again = reload_logits(d, ids, AutoModelForImageTextToText)
    if not np.array_equal(again, ref):
        raise SystemExit(f"{TIE_DEFAULT}: transformers ties the stored lm_head (max |d| {np.max(np.abs(again - ref)):.3g})")
    with open(os.path.join(src, "meta.json")) as f:
        meta = json.load(f)
    meta.pop("sensitivity", None)
    meta.update(family=TIE_DEFAULT,
                what="mistral3's weights and logits with config.json HAND-EDITED: tie_word_embeddings left out "
                     "(Mistral3Config's default true, as the Hub's Mistral-Small-3.1 has it) while "
                     "language_model.lm_head is stored: transformers uses the stored lm_head",
                hand_edited=True, transformers_differences=[])
    save_goldens(d, ids, ref, meta)
    print(f"{TIE_DEFAULT}: hand-edited config of mistral3; transformers reproduces its logits")
    # Mxfp4Config(dequantize=True): what from_pretrained does on a CPU without the kernels
    # package (said explicitly, so it needs no accelerate either): the experts are decoded by
    # integrations/mxfp4.py into float32 parameters on load.
    mq = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager",
                                              quantization_config=transformers.Mxfp4Config(dequantize=True))
    mq.eval()
    logits = forward(mq, ids)
    m = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name in decoded:
                p.copy_(decoded[name])
    m.eval()
    by_hand = forward(m, ids)
    if not np.array_equal(by_hand, logits):
        raise SystemExit(f"{MXFP4}: transformers decodes the MXFP4 experts differently from write_mxfp4 (max |d| "
                         f"{np.max(np.abs(by_hand - logits)):.3g})")
    ref = np.fromfile(os.path.join(src, "logits.f32"), dtype="<f4").reshape(len(ids), -1)
    with open(os.path.join(src, "meta.json")) as f:
        meta = json.load(f)
    meta.pop("sensitivity", None)
    meta.update(family=MXFP4,
                what="gpt_oss's weights with every expert's gate_up_proj and down_proj stored in MXFP4 "
                     "(mlp.experts.*_blocks uint8, *_scales E8M0, quant_method mxfp4) as the Hub's gpt-oss; "
                     "logits are transformers' forward of this directory (it dequantizes MXFP4 on load)",
                weights="bfloat16 except the experts (MXFP4); logits are the float32 eager forward",
                transformers_differences=[],
                sensitivity={"bf16 experts instead (gpt_oss's logits)": round(rel_err(ref, logits), 4)})
    save_goldens(d, ids, logits, meta)
    print(f"{MXFP4}: gpt_oss with MXFP4 experts; transformers' decoding equals write_mxfp4's; "
          f"rel diff from the bf16 experts' logits {rel_err(ref, logits):.3g}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("families", nargs="*", help=f"default: all ({', '.join(ALL_NAMES)})")
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16",
                    help="storage dtype of the weights (the forward is float32 either way)")
    a = ap.parse_args()
    names = a.families or ALL_NAMES
    unknown = [n for n in names if n not in ALL_NAMES]
    if unknown:
        raise SystemExit(f"unknown families: {unknown} (known: {ALL_NAMES})")
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    dtype = getattr(torch, a.dtype)
    os.makedirs(a.out, exist_ok=True)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, weights {a.dtype}")
    for n in names:
        if n in FAMILIES:
            write_family(a.out, n, FAMILIES[n], dtype)
    if TIE_DEFAULT in names:
        write_tie_default(a.out)
    if LEGACY in names:
        write_legacy(a.out, dtype)
    if MXFP4 in names:
        write_mxfp4(a.out)


if __name__ == "__main__":
    main()
