/* Writing the final output directory of a job: sharded safetensors with an index,
 * config.json carrying quantization_config (and the same object in quantize_config.json),
 * and the tokenizer and generation files copied from the source model.
 *
 * The quantization_config follows ../shared/ref/formats.md section 4 to the letter, since
 * vLLM and transformers read it: GPTQ {"quant_method":"gptq","bits",...,"checkpoint_format"}
 * plus a `dynamic` entry {"-:<regex>": {}} for every linear left in float and per-module
 * overrides where a layout asks for them; AWQ {"quant_method":"awq",...,"version":"gemm",
 * "modules_to_not_convert"}. A `meta` object records how the checkpoint was made
 * (quantizer, method, and notes such as the v1 zero-point rule). config.json's `dtype` and
 * `torch_dtype` name the dtype the unquantized tensors are stored in. */
#ifndef QUANT_PIPELINE_OUTPUT_H
#define QUANT_PIPELINE_OUTPUT_H

#include <stddef.h>
#include <stdint.h>

#include "quant/core/dtype.h"
#include "quant/core/error.h"
#include "quant/core/safetensors.h"
#include "quant/job/job.h"

struct cJSON;

typedef struct qd_out_tensor {
    const char *name;          /* borrowed */
    qd_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];   /* every dimension a source tensor has (Qwen-VL's Conv3d patch embedding: 5) */
    const void *data;          /* borrowed until qd_output_write_shards returns */
} qd_out_tensor;

/* Writes tensors, in the given order, into shards of at most shard_size bytes of data each
 * (a tensor larger than shard_size gets a shard of its own): model.safetensors when one
 * shard is enough, else model-0000i-of-0000N.safetensors plus model.safetensors.index.json. */
int qd_output_write_shards(const char *dir, const qd_out_tensor *t, size_t n,
                           uint64_t shard_size, qd_err *err);

/* Buffers a rewrite of the tensor list made (qd_output_owned_free frees them). */
typedef struct qd_output_owned {
    void **bufs;
    size_t n, cap;
} qd_output_owned;
void qd_output_owned_free(qd_output_owned *o);

/* gpt-oss's experts, packed in compressed-tensors pack-quantized, renamed and fused as vLLM's
 * gpt-oss loader reads them (output_experts.c): per expert N, gate_proj's and up_proj's
 * weight_packed, weight_scale and bias become w13_weight_packed [2 FF, H b/32],
 * w13_weight_scale [2 FF, G] and w13_bias [2 FF], gate row f at 2f and up's at 2f + 1;
 * down_proj's become w2_weight_packed, w2_weight_scale and w2_bias; the weight_shape tensors
 * go. Every other tensor is kept, in order. *out (malloc'd, n_out entries) points into t and
 * into o's buffers. 0, or an error naming an expert tensor vLLM would not read. */
int qd_output_gptoss_experts(const qd_out_tensor *t, size_t n, qd_out_tensor **out, size_t *n_out, qd_output_owned *o,
                             qd_err *err);

/* Builds the quantization_config for job (format, bits, ...). float_modules are the full
 * names of linears left unquantized (e.g. "model.layers.0.mlp.down_proj"); trivial_g_idx
 * (may be NULL) are regexes of modules whose g_idx was made trivial by the TP-aware layout.
 * The caller owns the result (cJSON_Delete). */
struct cJSON *qd_output_quant_config(const qp_job *job, const char *const *float_modules,
                                     size_t n_float, const char *const *trivial_g_idx,
                                     size_t n_trivial, const char *awq_note);

/* Declares in q (a format's quantization_config) the top modules of a vision-language
 * model's vision tower and projector (roots: "visual", "vision_tower", ...), kept in float,
 * the way the format's loaders read it, for transformers' in-memory names
 * ("model.visual.blocks.0.attn.qkv") and vLLM's ("visual.blocks.0.attn.qkv") alike:
 * compressed-tensors `ignore` gets "re:(model\.)?ROOT\..*"; AWQ's modules_to_not_convert
 * gets ROOT (vLLM matches substrings) and "model.ROOT" (transformers matches from the
 * start); GPTQ's `dynamic` gets "-:(model\.)?ROOT\..*" (a skip). 0, or QD_ENOMEM. */
int qd_output_declare_float_roots(struct cJSON *q, const char *const *roots, size_t n_roots);

/* "float32", "float16", "bfloat16" (the names config.json uses); NULL for other dtypes. */
const char *qd_output_dtype_name(qd_dtype t);

/* The floating-point dtype of the source checkpoint's weights: the one holding the most
 * bytes among its F32, F16 and BF16 tensors (QD_DTYPE_INVALID when it has none). The output
 * copies unquantized tensors in their source dtype, so this is the dtype they have there. */
qd_dtype qd_output_float_dtype(const st_model *src);

/* Writes out_dir/config.json (the source config with quantization_config, and `dtype` and
 * `torch_dtype` both set to float_dtype's name, replacing the source's) and
 * out_dir/quantize_config.json. A float_dtype without a config.json name is QD_EINVAL. */
int qd_output_write_config(const char *src_dir, const char *out_dir, const struct cJSON *qcfg,
                           qd_dtype float_dtype, qd_err *err);

/* Copies the tokenizer and generation files that exist in src_dir. */
int qd_output_copy_aux(const char *src_dir, const char *out_dir, qd_err *err);

/* Escapes a literal module name for a Python regex ("." -> "\\."). */
void qd_output_regex_escape(const char *in, char *out, size_t cap);

#endif
