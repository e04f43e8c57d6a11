/* A causal LM checkpoint opened for computing: config, mmapped tensors, the architecture's
 * description, and the pieces of the forward pass that sit outside the decoder blocks
 * (embedding, final norm + lm_head). The blocks themselves are in quant/model/block.h.
 *
 * Memory: tensors stay in the mmapped safetensors files; block weights are materialised as
 * F32 one block at a time (qd_block_load), embedding rows are converted as they are looked
 * up, and lm_head is converted in chunks of rows (kept whole only when small). So a model
 * much larger than RAM can be run block by block.
 *
 * Quantized checkpoints (config.json with quantization_config: gptq, gptq_v2, awq gemm) load
 * the same way: a linear stored as qweight/qzeros/scales[/g_idx] is read through the format
 * table and dequantized when its block is loaded, by the CPU kernel's bulk decoder
 * (qd_kernel_dequant_cpu, bit for bit the table's dequant_ref) on the backend's threads.
 *
 * A qd_model is used by one thread at a time (it owns scratch buffers). It borrows the
 * backend, which must outlive it; all activations passed in and out are backend memory. */
#ifndef QUANT_MODEL_MODEL_H
#define QUANT_MODEL_MODEL_H

#include <stdint.h>

#include "quant/backend/backend.h"
#include "quant/core/error.h"
#include "quant/core/safetensors.h"
#include "quant/model/config.h"

/* A block's linears and input groups: up to 5 attention projections (DeepSeek's latent
 * attention; a hybrid's attention and recurrent layers' projections, up to 9, Qwen3.5), a
 * dense MLP's 3 (DeepSeek's dense layers), and 3 per expert (up to
 * QD_MAX_EXPERTS, plus a shared expert); up to 4 groups for attention, 2 for the dense MLP
 * and 2 per expert. */
#define QD_MAX_LINEARS (12 + 3 * (QD_MAX_EXPERTS + 1))
#define QD_MAX_GROUP_LINEARS 5   /* Cohere2's parallel block: q, k, v, gate, up */
#define QD_MAX_GROUPS (6 + 2 * (QD_MAX_EXPERTS + 1))
#define QD_MAX_NORMS 4

typedef struct qd_model qd_model;

/* What an input group's activations come out of, for folding AWQ scales into it. */
typedef enum qd_prev_kind {
    QD_PREV_NONE = 0,   /* nothing foldable (post-LN OPT) */
    QD_PREV_NORM,       /* a norm's weight (and bias): scale divides them */
    QD_PREV_LINEAR,     /* a previous linear's output rows (and bias) */
} qd_prev_kind;

/* One linear of a decoder block, as nn.Linear: weight [n, k]. */
typedef struct qd_linear_info {
    const char *name;       /* relative to the block: "self_attn.q_proj", "mlp.down_proj", "fc1" */
    int64_t n, k;           /* out_features, in_features */
    int has_bias;
    int group;              /* index of its input group */
    int expert;             /* MoE: the expert it belongs to, QD_SHARED_EXPERT, or -1 */
    int dense_mlp;          /* the dense MLP of a model whose other layers are MoE (DeepSeek) */
    int layer_mixer;        /* hybrids: the qd_layer_mixer of the layers that hold it; -1: every layer */
} qd_linear_info;

#define QD_SHARED_EXPERT (-2)

/* Linears that consume the same input activations (q/k/v; gate/up; ...). */
typedef struct qd_input_group {
    const char *name;       /* "attn_in", "attn_out", "mlp_in", "mlp_out"; MoE "expert.3.in", "shared.out" */
    int n_linears;
    int linears[QD_MAX_GROUP_LINEARS];   /* indices into the block's linears */
    int64_t k;              /* width of the input */
    qd_prev_kind prev_kind;
    const char *prev;       /* "input_layernorm", "self_attn.v_proj", ... or NULL */
    int prev_index;         /* norm index (qd_model_norm_name) or linear index; -1 with NONE */
    int64_t prev_row0;      /* QD_PREV_LINEAR: the rows [prev_row0, prev_row0 + prev_rows) of */
    int64_t prev_rows;      /* the previous linear make this input (v's rows of a fused qkv) */
    int wave;               /* groups of one wave read inputs that none of the others' weights
                               change (every expert's gate/up; then every expert's down): a
                               true-sequential pass may capture them together. Dense blocks: one
                               group per wave, in order. */
} qd_input_group;

/* Opens a HF model directory: config.json + model.safetensors or
 * model.safetensors.index.json with shards. Validates every tensor the architecture needs
 * (presence and shape) up front, so a missing or mis-shaped tensor fails here, named.
 * pytorch_model.bin alone is refused (convert to safetensors). *out is owned by the caller
 * (qd_model_close); be is borrowed. */
int qd_model_open(const char *dir, qd_backend *be, qd_model **out, qd_err *err);
void qd_model_close(qd_model *m);                           /* accepts NULL */

const qd_model_config *qd_model_cfg(const qd_model *m);
/* 1 when the llama-family block's MLP is gated (gate and up, or Phi-3's fused gate_up, then
 * down); 0 for a plain one (fc1 -> activation -> fc2: the LayerNorm families, OPT, Apertus's
 * ungated up -> xIELU -> down). */
int qd_model_mlp_gated(const qd_model *m);
const st_model *qd_model_tensors(const qd_model *m);
qd_backend *qd_model_backend(const qd_model *m);
const char *qd_model_dir(const qd_model *m);
/* "llama" or "opt". */
const char *qd_model_arch_name(const qd_model *m);
/* Rows of the learned position table the architecture stores, [rows, hidden] (OPT's
 * embed_positions: max_position_embeddings + 2), from the architecture table; 0 where the
 * positions are computed (RoPE) or the architecture is not supported. Needs config.json
 * alone, for the pre-flight estimate before a weight is read. */
int64_t qd_model_config_pos_rows(const qd_model_config *c);
/* A vision-language checkpoint's tensor outside its text tower (the vision tower, the
 * projector): 1 with root the module it lies in, as vLLM and transformers name its top
 * ("visual", "vision_tower", "multi_modal_projector": the leading "model." left out); 0 for
 * the text tower's tensors and any tensor of a text-only model. */
int qd_model_outside_text(const qd_model *m, const char *name, char *root, size_t cap);
/* Full tensor name prefix of block i, e.g. "model.layers.3." (static per model). */
int qd_model_block_prefix(const qd_model *m, int block, char *buf, size_t cap);

/* Block structure: the same list of linears for every block, of which a block holds all
 * but where DeepSeek mixes dense and MoE layers: a dense layer (block < first_k_dense_replace)
 * holds the dense_mlp linears and no experts, a MoE layer the experts and no dense_mlp. */
int qd_model_n_linears(const qd_model *m);
int qd_model_block_is_moe(const qd_model *m, int block);
/* The lowest input group of block `block` whose input hook sees, in every call of a forward,
 * the very rows group g's does; g itself where none does. Where every expert calibrates on
 * every token (qd_model_set_moe_calibrate_all), a MoE block's experts' gate/up groups and
 * its shared expert's all take the normalised hidden state of every row: the first expert's
 * gate/up group for each (not Llama 4, whose experts' inputs are scaled by their own
 * scores). */
int qd_model_group_same_input(const qd_model *m, int block, int g);
int qd_model_block_has_linear(const qd_model *m, int block, int li);
const qd_linear_info *qd_model_linear(const qd_model *m, int i);
/* 1 when the block tensor rel (its name after the block prefix) is the source form of
 * linears the output writes one by one — gpt-oss's fused mlp.experts.gate_up_proj,
 * down_proj and their biases, which an output holds as mlp.experts.N.gate_proj, ... — so
 * the output does not also copy it. */
int qd_model_tensor_replaced(const qd_model *m, const char *rel);
/* Index of the linear with this relative name, or -1. */
int qd_model_linear_find(const qd_model *m, const char *name);
int qd_model_n_groups(const qd_model *m);
const qd_input_group *qd_model_group(const qd_model *m, int g);
/* The block's norms: 0 = before attention, 1 = before the MLP ("input_layernorm",
 * "post_attention_layernorm"; OPT "self_attn_layer_norm", "final_layer_norm"; Gemma
 * "pre_feedforward_layernorm"), 2 = after attention and 3 = after the MLP (Gemma's
 * "post_attention_layernorm", "post_feedforward_layernorm"); NULL where the block has none. */
const char *qd_model_norm_name(const qd_model *m, int i);
int qd_model_norm_has_bias(const qd_model *m);            /* LayerNorm (OPT) */
/* What a norm's stored weight w means: the norm multiplies by (offset + w) — 1 for Gemma's
 * RMSNorm, 0 elsewhere. qd_block_norm_get/set speak in multipliers (offset + w); the
 * checkpoint writer subtracts the offset back. */
float qd_model_norm_offset(const qd_model *m);
/* MoE: the router's and Qwen2-MoE's shared-expert gate's module names relative to the block
 * ("block_sparse_moe.gate", "mlp.shared_expert_gate"), which stay in float; NULL where the
 * model has none. */
const char *qd_model_moe_router(const qd_model *m);
const char *qd_model_moe_shared_gate(const qd_model *m);
/* A hybrid's recurrent layer's conv module, linear-shaped and never quantized (vLLM builds
 * it without the quantization config): "linear_attn.conv1d" on block's Gated DeltaNet layer,
 * relative to the block; NULL on other layers and models. */
const char *qd_model_block_conv(const qd_model *m, int block);
/* DeepSeek-V3.2: the indexer's linear-shaped modules kept in float (j 0: wk, 1: weights_proj;
 * vLLM's fused wk_weights_proj is never quantized), relative to the block prefix; NULL for
 * other architectures or j. */
const char *qd_model_dsa_float(const qd_model *m, int j);

/* Token ids (host, batch*seq) → hidden states h [batch*seq, hidden] (backend memory).
 * pos (host, length seq, may be NULL for 0..seq-1) are the positions of each sequence's
 * tokens (OPT adds its learned position embeddings; llama ignores them here). */
int qd_model_embed(qd_model *m, const int32_t *ids, int64_t batch, int64_t seq,
                   const int32_t *pos, float *h, qd_err *err);
/* Final norm (+ OPT project_out) + lm_head: h [rows, hidden] → logits [rows, vocab], both
 * backend memory; h is not modified. */
int qd_model_logits(qd_model *m, const float *h, int64_t rows, float *logits, qd_err *err);
/* Whole forward for batch sequences of seq tokens (positions 0..seq-1): ids host, logits
 * host [batch*seq, vocab]. Loads each block in turn and frees it (convenience for tests
 * and small inputs). */
int qd_model_forward(qd_model *m, const int32_t *ids, int64_t batch, int64_t seq,
                     float *logits_host, qd_err *err);
/* Frees scratch buffers and cached lm_head (they are re-created on demand). */
void qd_model_trim(qd_model *m);

#endif
