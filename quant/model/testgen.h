/* Tiny random checkpoints for tests and demos: writes a HF directory (config.json +
 * model.safetensors, or shards + model.safetensors.index.json) through the project's own
 * st_writer, for the llama family (GQA, tied or untied lm_head, Qwen2-style q/k/v biases,
 * llama attention_bias, Mixtral's experts) and OPT (biases, learned positions, project_in/out, pre/post-LN).
 *
 * Weights come from a fixed seeded generator (splitmix64 + Box-Muller), so the same options
 * give the same values in any dtype, sharded or not, and on any machine. Linear weights are N(0, 1/K) so
 * activations keep their scale through the blocks. */
#ifndef QUANT_MODEL_TESTGEN_H
#define QUANT_MODEL_TESTGEN_H

#include <stdint.h>

#include "quant/backend/backend.h"
#include "quant/core/dtype.h"
#include "quant/core/error.h"
#include "quant/model/config.h"

typedef struct qd_testgen_opts {
    qd_arch_family family;
    const char *architecture;  /* NULL: LlamaForCausalLM / OPTForCausalLM; or Qwen2ForCausalLM,
                                  MistralForCausalLM (written as given) */
    int64_t hidden, intermediate, n_layers, n_heads, n_kv_heads;
    int64_t head_dim;          /* 0: hidden / n_heads (not written to config.json) */
    int64_t vocab, max_pos;
    int tie_word_embeddings;
    int attention_bias;        /* llama: attention_bias (q/k/v/o biases) */
    int64_t word_embed_proj_dim;   /* OPT: 0 = hidden; otherwise project_in/out are written */
    int post_ln;               /* OPT: do_layer_norm_before = false */
    float rope_theta;
    float norm_eps;
    qd_dtype dtype;            /* F32, F16 or BF16 */
    int round_f16;             /* round every value through F16 first (so F32 and F16 files
                                  hold identical weights) */
    int n_shards;              /* 1: model.safetensors; more: that many shards of nearly equal
                                  tensor counts, with an index */
    uint64_t shard_size;       /* > 0: shards of at most this many bytes of data, split as HF
                                  does (st_shard_plan_by_size); overrides n_shards */
    int64_t n_experts;         /* llama: > 0 writes a MixtralForCausalLM of n_experts experts of
                                  width `intermediate` (block_sparse_moe.gate, experts.N.w1/w2/w3) */
    int64_t top_k;             /* experts per token (num_experts_per_tok); 0: 2 */
    uint64_t seed;
} qd_testgen_opts;

/* Small defaults for a family: hidden 64, intermediate 160, 2 layers, 4 heads (llama: 2 kv
 * heads), vocab 128, max_pos 128, F32, seed 1. */
qd_testgen_opts qd_testgen_defaults(qd_arch_family family);
/* Creates dir (mkdir -p) and writes the checkpoint into it. Each file is written atomically
 * and tensor by tensor, in chunks: memory stays at a few MiB for any model size. A model
 * larger than the free space is refused before anything is written (QD_ERESOURCE). Files of
 * an earlier model there that the new one does not replace (model.safetensors, the index,
 * shards of another count) are removed afterwards, so the directory loads as the new one. */
int qd_testgen_write(const char *dir, const qd_testgen_opts *o, qd_err *err);

/* An FP8-block copy, as DeepSeek-V3/R1, Kimi-K2 and Qwen3-*-FP8 ship, of the float checkpoint
 * in src (opened on be to list its linears): every block linear's weight becomes F8_E4M3 [N,
 * K] with weight_scale_inv F32 [ceil(N/bn), ceil(K/bk)], the scale of a block its largest
 * |w| / 448 in F32 (1 for an all-zero block) and each code e4m3(w / scale) rounded to nearest
 * even, as torch's `(w / scale).to(torch.float8_e4m3fn)`; every other tensor (embeddings,
 * norms, routers, lm_head) is copied as it is, and config.json gains quantization_config
 * {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
 * "weight_block_size": [bn, bk]}. With twin not NULL, the same checkpoint with those linears
 * dequantized to F32 (code * scale in F32, what torch's `weight.to(torch.float32) * scale`
 * gives) and no quantization_config is written to twin. One model.safetensors each, made in
 * memory: for the tiny test models. */
int qd_testgen_fp8(const char *src, const char *out, int64_t bn, int64_t bk, const char *twin, qd_backend *be,
                   qd_err *err);

#endif
