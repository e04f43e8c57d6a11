/* The decoder-block API the quantization pipeline is built on.
 *
 * A block's float weights are materialised (qd_block_load) as F32 backend memory, run on a
 * batch of hidden states (qd_block_forward) and freed. Two hooks let the pipeline see and
 * change what the block computes:
 *   input:    called once per input group (q/k/v share one input, gate/up another, ...)
 *             with the activations X [rows, K] that feed the group's linears — for
 *             Hessians (X^T X) and AWQ activation statistics;
 *   override: called before each linear; it may substitute the weight [N, K] and bias [N]
 *             (backend memory) the linear uses in this call — e.g. quantized-dequantized
 *             weights — without touching the loaded block.
 * Weights can also be replaced for good with qd_block_linear_set / qd_block_norm_set (AWQ
 * scale folding, writing the quantized weights back before computing the next block's
 * inputs). Linear and group indices are those of qd_model_linear / qd_model_group. */
#ifndef QUANT_MODEL_BLOCK_H
#define QUANT_MODEL_BLOCK_H

#include <stdint.h>

#include "quant/model/model.h"

/* A recurrent mixer's float parameters: the convolution's weight [ch, kernel] and bias, and
 * Mamba-2's A (-exp(A_log)), D, dt_bias [heads], gated norm [inner] and Falcon-H1's muP
 * vector over in_proj's outputs (from the config, not the checkpoint). */
#define QD_MIXER_PARAMS 7

/* One block's float weights, all backend memory owned by the struct (qd_block_free). */
typedef struct qd_block_weights {
    int block;
    float *w[QD_MAX_LINEARS];          /* [n, k] per linear */
    float *b[QD_MAX_LINEARS];          /* [n] or NULL */
    float *norm_w[QD_MAX_NORMS];       /* [hidden] */
    float *norm_b[QD_MAX_NORMS];       /* [hidden] (LayerNorm) or NULL */
    float *qk_norm_w[2];               /* self_attn.q_norm, k_norm: [head_dim] (Qwen3), [heads * head_dim] (qk_norm 2), else NULL */
    float *router_w;                   /* MoE: [n_experts, hidden], in float; else NULL */
    float *shared_gate_w;              /* Qwen2-MoE: [1, hidden] shared_expert_gate; else NULL */
    float *router_bias;                /* [n_experts]: DeepSeek-V3's e_score_correction_bias, gpt-oss's router bias; else NULL */
    float *mla_norm_w[2];              /* DeepSeek: q_a_layernorm [q_lora_rank] (or NULL), kv_a_layernorm [kv_lora_rank] */
    float *mixer_w[QD_MIXER_PARAMS];   /* a recurrent layer's float parameters (model_mixer.c), else NULL */
    /* Gated DeltaNet layers: linear_attn.conv1d [conv channels, 1, taps], A_log [v_heads],
     * dt_bias [v_heads], norm [v_dim] (the gated norm multiplies by w as stored); else NULL. */
    float *gdn_conv_w, *gdn_a_log, *gdn_dt_bias, *gdn_norm_w;
    float xielu[4];                    /* Apertus: xIELU's softplus(alpha_p), beta + softplus(alpha_n), beta, eps (host) */
    float *sinks;                      /* gpt-oss: self_attn.sinks [n_heads]; else NULL */
    /* DeepSeek-V3.2's indexer, in float (vLLM loads them unquantized): wk [index_head_dim, hidden],
     * weights_proj [index_n_heads, hidden], k_norm's weight and bias [index_head_dim]; else NULL. */
    float *dsa_w[4];
} qd_block_weights;

typedef struct qd_block_hooks {
    void *ud;
    /* MoE: called once per forward of a block with the number of tokens routed to each
     * expert (n_experts counts); may be NULL. */
    void (*routed)(void *ud, int block, const int64_t *counts, int n_experts);
    /* x [rows, g->k] backend memory, valid during the call only. Return 0, or a negative
     * code to stop the forward (returned by qd_block_forward). */
    int (*input)(void *ud, int block, int group, const qd_input_group *g, const float *x,
                 int64_t rows);
    /* May set *w (and *b, for linears with a bias) to backend arrays that must stay valid
     * until the linear has run. Leave them untouched to use the loaded weights. */
    int (*override)(void *ud, int block, int linear, const float **w, const float **b);
    /* Optional, for a forward whose output nobody reads (a capture pass into scratch): the
     * groups whose input hook matters, [n_groups]. A MoE block's expert neither of whose
     * groups matters is skipped; one whose down projection's input does not matter runs
     * only to its gate/up input, and one whose does, only to it; none of them adds to the
     * block's output then. NULL: every expert runs whole. */
    const int *want;
} qd_block_hooks;

/* Loads block i's weights as F32 (dequantizing packed linears). *out is owned by the
 * caller: qd_block_free(m, *out). */
int qd_block_load(qd_model *m, int block, qd_block_weights **out, qd_err *err);
/* The same, with linears 0: everything but its linears (norms, router, a recurrent mixer's
 * parameters), each linear left NULL until qd_block_linear_load (a capture part over a MoE
 * block's experts needs only theirs). A forward must not reach a linear not loaded. */
int qd_block_load_some(qd_model *m, int block, int linears, qd_block_weights **out, qd_err *err);
/* Loads linear li of bw's block (its weight and bias) where it is not loaded yet; 0 for a
 * linear the block does not have. */
int qd_block_linear_load(qd_model *m, qd_block_weights *bw, int li, qd_err *err);
/* Frees linear li of bw (weight and bias; NULL after), as qd_block_load_some leaves it. */
void qd_block_linear_unload(qd_model *m, qd_block_weights *bw, int li);
void qd_block_free(qd_model *m, qd_block_weights *bw);     /* accepts NULL */
/* Bytes of F32 weights one block holds (for memory budgets). */
uint64_t qd_block_bytes(const qd_model *m);

/* MoE calibration: on (the default, set by the pipeline from the job), every expert's input
 * hooks see every token — its statistics come from all of them, so none is starved — while
 * the block's output still mixes only the routed experts. Off: each expert's hooks see the
 * tokens routed to it. Without input hooks it changes nothing. */
void qd_model_set_moe_calibrate_all(qd_model *m, int on);
/* on: the block forward's projections (every linear of qd_block_forward and its parts, MoE
 * experts included; not the router, lm_head or eval's logits) run as bfloat16-input products
 * with F32 sums (the backend's gemm_nt_bf16: the job's "compute": "bf16"). QD_EUNSUPPORTED
 * naming the backend when it has no such op; off (the default) is always accepted. Turning it
 * on where the backend's bf16 products are emulated (be->bf16_native 0) logs the warning
 * compute_bf16_emulated: they cost a little more than F32 there. */
int qd_model_set_compute_bf16(qd_model *m, int on, qd_err *err);

/* Runs the block on `batch` independent sequences of `seq` tokens:
 * x [batch*seq, hidden] → y [batch*seq, hidden] (backend memory; y may equal x). pos (host,
 * length seq, NULL for 0..seq-1) are the token positions within each sequence. hooks may be
 * NULL. Attention is causal within each sequence. */
int qd_block_forward(qd_model *m, const qd_block_weights *bw, const float *x, float *y,
                     int64_t batch, int64_t seq, const int32_t *pos, const qd_block_hooks *hooks,
                     qd_err *err);

/* The two halves of a block around its residual stream: attention (x -> h, the residual
 * stream after the attention sub-block and its residual add) and MLP / experts (h -> y).
 * Running QD_BLOCK_ATTN then QD_BLOCK_MLP on its output computes bit for bit what
 * QD_BLOCK_ALL does, so the pipeline can keep h and re-run only the half it changes. */
typedef enum qd_block_part { QD_BLOCK_ALL, QD_BLOCK_ATTN, QD_BLOCK_MLP } qd_block_part;
int qd_block_forward_part(qd_model *m, const qd_block_weights *bw, qd_block_part part, const float *x,
                          float *y, int64_t batch, int64_t seq, const int32_t *pos,
                          const qd_block_hooks *hooks, qd_err *err);
/* QD_BLOCK_ATTN or QD_BLOCK_MLP: the half whose computation feeds input group g. */
qd_block_part qd_model_group_part(const qd_model *m, int g);
/* The input group of the attention's output projection (o_proj / dense): its input is the
 * attention's context, the last thing QD_BLOCK_ATTN computes before o_proj. */
int qd_model_attn_out_group(const qd_model *m);
/* The same for block `block`: in a hybrid's recurrent layer, the mixer's out_proj (whose
 * input is the mixer's output before its projection); qd_block_attn_finish ends that half
 * from it alike. */
int qd_model_block_attn_out_group(const qd_model *m, int block);
/* The end of QD_BLOCK_ATTN from that context: y [rows, hidden] = the residual stream after
 * the attention sub-block, given the block's input x (y may equal x) and ctx [rows, K of the
 * output projection], the input the attention gave its output projection on the same rows
 * (ctx may equal y: it is read before y is written).
 * Bit for bit what QD_BLOCK_ATTN writes when the rows are the same batch it ran (the same
 * ops on the same shapes), without the projections, RoPE and attention before o_proj.
 * No hooks: the projection computes with bw's weight. Backend memory. */
int qd_block_attn_finish(qd_model *m, const qd_block_weights *bw, const float *ctx, const float *x, float *y,
                         int64_t rows, qd_err *err);
/* The input group of the MLP's last projection (down_proj / fc2), whose input is the MLP's
 * activation; -1 for a model with experts. */
int qd_model_mlp_out_group(const qd_model *m);
/* The end of QD_BLOCK_MLP from that activation: y [rows, hidden] = the block's output,
 * given x, the residual stream QD_BLOCK_MLP starts from (y may equal x), and act [rows, K of
 * the last projection] as that projection's input hook saw it on the same rows. Bit for bit
 * what QD_BLOCK_MLP writes for the same batch, without the norm, the first projections and
 * the activation function. A dense block only (QD_EINVAL on a MoE block). No hooks. Backend
 * memory. */
int qd_block_mlp_finish(qd_model *m, const qd_block_weights *bw, const float *act, const float *x, float *y,
                        int64_t rows, qd_err *err);
/* y [rows, n] = x [rows, k] W^T + b through m's backend in the model's compute arithmetic
 * (F32, or bf16 products after qd_model_set_compute_bf16): what the block forward's own
 * projections run, for callers that replay a part of it (AWQ's module losses). Backend
 * memory; b may be NULL; a backend error's text is in m's backend (be->err). */
int qd_model_linear_forward(qd_model *m, const float *x, int64_t rows, const float *w, const float *b, int64_t n,
                            int64_t k, float *y);
/* y [rows, n] = x [rows, k] W^T + b through be->ops (b may be NULL); backend memory. */
int qd_linear_forward(qd_backend *be, const float *x, int64_t rows, const float *w,
                      const float *b, int64_t n, int64_t k, float *y);

/* Copies a linear's weight [n, k] (and bias [n] when b_host is non-NULL and the linear has
 * one) to or from host memory. */
int qd_block_linear_get(qd_model *m, const qd_block_weights *bw, int linear, float *w_host,
                        float *b_host, qd_err *err);
int qd_block_linear_set(qd_model *m, qd_block_weights *bw, int linear, const float *w_host,
                        const float *b_host, qd_err *err);
/* Folds per-channel scales s [g->k] (host) into the block without changing what it
 * computes (AWQ): group g's linears' input columns are multiplied by s and the operator
 * before the group divides its outputs by s — a norm's multipliers and bias (Gemma's
 * 1 + w as a whole), or the rows of the previous linear that make the input (v_proj;
 * the v rows of Phi-3's qkv_proj; up_proj or the up rows of gate_up_proj). Under
 * grouped-query attention the o_proj scales must be equal within each KV channel's class
 * (QD_EINVAL otherwise). QD_EUNSUPPORTED when nothing foldable precedes the group. */
int qd_block_fold_scales(qd_model *m, qd_block_weights *bw, int g, const float *s, qd_err *err);
/* AWQ's one scale for a MoE block's shared input (AutoAWQ's Mixtral recipe): every expert's
 * gate and up, the shared expert's, the router and the shared-expert gate have their input
 * columns multiplied by s [hidden] (host), and post_attention_layernorm divides by s (a
 * LayerNorm its bias too); the block computes the same function (the router's logits are
 * unchanged). QD_EUNSUPPORTED for a block without experts behind post_attention_layernorm. */
int qd_block_fold_moe_input(qd_model *m, qd_block_weights *bw, const float *s, qd_err *err);
/* Copies norm i's multipliers (offset + w, see qd_model_norm_offset; and bias, LayerNorm
 * only, when b_host is non-NULL) [hidden]. */
int qd_block_norm_get(qd_model *m, const qd_block_weights *bw, int norm, float *w_host,
                      float *b_host, qd_err *err);
int qd_block_norm_set(qd_model *m, qd_block_weights *bw, int norm, const float *w_host,
                      const float *b_host, qd_err *err);

#endif
