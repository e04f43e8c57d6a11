/* Private to quant/model/model_*.c: the architecture table entry (the architecture as
 * data: tensor names, linears, input groups, norms) and the qd_model struct. */
#ifndef QUANT_MODEL_MODEL_INTERNAL_H
#define QUANT_MODEL_MODEL_INTERNAL_H

#include "quant/formats/format.h"
#include "quant/model/block.h"
#include "quant/model/model.h"

/* The width a linear dimension takes, resolved against the config. */
typedef enum qd_dim {
    QD_DIM_HIDDEN = 0,   /* hidden_size */
    QD_DIM_Q,            /* n_heads * head_dim */
    QD_DIM_KV,           /* n_kv_heads * head_dim */
    QD_DIM_FF,           /* intermediate_size */
    QD_DIM_QKV,          /* Q + 2 KV: a fused qkv_proj (Phi-3) */
    QD_DIM_FF2,          /* 2 FF: a fused gate_up_proj (Phi-3) */
    /* Multi-head latent attention (DeepSeek) */
    QD_DIM_QLORA,        /* q_lora_rank */
    QD_DIM_QHEADS,       /* n_heads * (qk_nope + qk_rope) */
    QD_DIM_KVA,          /* kv_lora_rank + qk_rope: kv_a_proj_with_mqa's rows */
    QD_DIM_KVLORA,       /* kv_lora_rank */
    QD_DIM_KVB,          /* n_heads * (qk_nope + v_head_dim): kv_b_proj's rows */
    QD_DIM_VO,           /* n_heads * v_head_dim: o_proj's input */
    QD_DIM_IDXQ,         /* index_n_heads * index_head_dim: DeepSeek-V3.2's indexer.wq_b rows */
    /* Gated attention and Gated DeltaNet (Qwen3-Next, Qwen3.5) */
    QD_DIM_Q2,           /* 2 Q: a q_proj that also emits each head's output gate */
    QD_DIM_GDN_QKVZ,     /* 2 k_heads k_dim + 2 v_heads v_dim: in_proj_qkvz */
    QD_DIM_GDN_BA,       /* 2 v_heads: in_proj_ba */
    QD_DIM_GDN_QKV,      /* 2 k_heads k_dim + v_heads v_dim: in_proj_qkv, the conv's channels */
    QD_DIM_GDN_V,        /* v_heads v_dim: in_proj_z's rows, out_proj's input */
    QD_DIM_GDN_H,        /* v_heads: in_proj_b's and in_proj_a's rows */
    /* Recurrent mixers (model_mixer.c) */
    QD_DIM_HIDDEN3,      /* 3 hidden: LFM2's conv.in_proj rows (B, C, x) */
    QD_DIM_SSM_INNER,    /* Mamba-2's inner width, mamba heads * head dim: out_proj's input */
    QD_DIM_SSM_IN,       /* Mamba-2's in_proj rows: z (inner), x B C (inner + 2 groups * state), dt (heads) */
} qd_dim;

/* Which config flag says the linear has a bias. */
typedef enum qd_bias_kind { QD_BIAS_QKV = 0, QD_BIAS_O, QD_BIAS_MLP, QD_BIAS_NONE, QD_BIAS_MIXER } qd_bias_kind;

/* qd_arch_linear.mixer: the layers that hold a linear, in hybrids (layer_mixer). */
#define QD_ON_EVERY_LAYER 0
#define QD_ON_MIXER(k) ((k) + 1)   /* only the layers whose mixer is k (qd_layer_mixer) */

typedef struct qd_arch_linear {
    const char *name;          /* relative to the block prefix, without ".weight" */
    int group;
    qd_dim n_dim, k_dim;
    qd_bias_kind bias;
    int mixer;                 /* QD_ON_EVERY_LAYER, or QD_ON_MIXER(kind) */
} qd_arch_linear;

typedef struct qd_arch_group {
    const char *name;
    qd_prev_kind prev_kind;    /* for pre-LN models; post-LN OPT has no foldable norm */
    const char *prev;          /* norm or linear name */
    int prev_tail;             /* the input comes from the last dim(prev_tail_dim) rows of a */
    qd_dim prev_tail_dim;      /* fused previous linear (v of qkv_proj, up of gate_up_proj) */
    int prev_part;             /* or, nonzero, from rows [(prev_part - 1) d, prev_part d), d = dim(prev_tail_dim) */
} qd_arch_group;

/* Linear roles the forward code relies on. Separate projections list q, k, v, o, then the
 * MLP; fused ones (fused_qkv) list qkv, o, then the MLP. Latent attention (mla) lists
 * q_a_proj, q_b_proj (or q_proj alone), kv_a_proj_with_mqa, kv_b_proj, o_proj. */
enum { QD_LIN_Q = 0, QD_LIN_K, QD_LIN_V };

/* The architecture table's own capacity (experts are generated from a template). */
#define QD_ARCH_MAX_LINEARS 12
#define QD_ARCH_MAX_GROUPS 6

typedef struct qd_arch {
    const char *name;          /* "llama", "opt" */
    qd_arch_family family;
    const char *block_fmt;     /* printf format with one %d: "model.layers.%d." */
    int n_linears;
    qd_arch_linear linears[QD_ARCH_MAX_LINEARS];
    int n_groups;
    qd_arch_group groups[QD_ARCH_MAX_GROUPS];
    int fused_qkv;             /* linear 0 is [q; k; v] (rows Q, KV, KV) */
    int fused_gate_up;         /* the first MLP linear is [gate; up] (rows FF, FF) */
    int qkv_per_head;          /* fused_qkv laid out per head, [q_h; k_h; v_h] for each head h (GPT-NeoX) */
    int lin_o, lin_mlp0;       /* indices of o_proj and of the first MLP linear */
    int mla;                   /* multi-head latent attention (model_mla.c), q LoRA when q_lora_rank > 0 */
    const char *mla_norms[2];  /* its q_a_layernorm and kv_a_layernorm (NULL where absent) */
    int lin_idx_q;             /* DeepSeek-V3.2: the indexer's wq_b (after q_b_proj); 0: no indexer (model_dsa.c) */
    const char *norms[QD_MAX_NORMS];   /* see qd_model_norm_name; NULL where absent */
    int layernorm;             /* LayerNorm with bias (OPT) vs RMSNorm */
    int norm_no_bias;          /* layernorm without a bias (Cohere's mean-centred LayerNorm, weight only) */
    const char *embed;         /* token embedding [vocab, proj_dim] */
    const char *embed_pos;     /* learned positions [max_pos + offset, hidden] or NULL */
    const char *final_norm;    /* without ".weight" */
    const char *lm_head;
    const char *lm_head_bias;  /* its bias [vocab] where the config has one (Phi), else NULL */
    const char *project_in;    /* [hidden, proj_dim] when proj_dim != hidden */
    const char *project_out;   /* [proj_dim, hidden] */
    /* Mixture of experts: the MLP is a router and experts generated from these names, the
     * linears after the table's own (gate, up, down per expert, then the shared expert). */
    const char *router;        /* "block_sparse_moe.gate" [n_experts, hidden], kept in float */
    const char *expert_fmt;    /* "block_sparse_moe.experts.%d." */
    const char *expert_lin[3]; /* gate, up, down: "w1", "w3", "w2" */
    const char *shared_prefix; /* "mlp.shared_expert." (Qwen2-MoE) */
    const char *shared_gate;   /* "mlp.shared_expert_gate" [1, hidden], kept in float; NULL: ungated */
    const char *router_bias;   /* "mlp.gate.e_score_correction_bias" [n_experts] (DeepSeek-V3), in float;
                                * gpt-oss: "mlp.router.bias", added to the logits */
    int router_bias_2d;        /* router_bias is stored [1, n_experts] (ERNIE's mlp.moe_statics) */
    /* gpt-oss: the experts' biases, their fused 3-D source tensors (model_gptoss.c) and the
     * attention's sinks. */
    int expert_bias;           /* each expert's gate, up and down carry a bias */
    const char *experts_fused; /* "mlp.experts.": gate_up_proj [E, H, 2 FF] (gate, up interleaved), _bias, down_proj
                                * [E, FF, H], _bias, read as per-expert linears */
    int experts_fused_halves;  /* Llama 4: gate_up_proj holds gate in columns [0, FF), up in [FF, 2 FF); no biases */
    const char *sinks;         /* "self_attn.sinks" [n_heads] */
    int experts_stacked;       /* Granite-4: the fused experts are experts_fused + "input_linear.weight" [E, 2 FF, H]
                                * (each expert's gate rows, then its up rows) and "output_linear.weight" [E, H, FF],
                                * nn.Linear-shaped slabs without biases (model_gptoss.c reads both layouts) */
    int moe_beside_mlp;        /* Granite-4: the table's MLP (shared_mlp) runs in every layer beside the experts, on
                                * the same normed input, its output added to theirs */
    /* Gated DeltaNet layers (model_gdn.c): their linears from lin_gdn0 — 1: in_proj_qkvz and
     * in_proj_ba interleaved per key-head group (Qwen3-Next), 2: in_proj_qkv, in_proj_z,
     * in_proj_b, in_proj_a (Qwen3.5) — then out_proj; 0: none. */
    int gdn;
    int lin_gdn0;
    int mlp_ungated;           /* rotary family with up_proj -> activation -> down_proj (Apertus): no gate */
    const char *xielu;         /* "mlp.act_fn": the xIELU parameters' module (model_xielu.c); NULL: none */
    const char *qk_norms[2];   /* the q/k norms' weights (cfg.qk_norm); NULL: self_attn.q_norm/k_norm.weight */
    int qk_norm_post_rope;     /* the q/k norms act on RoPE's output (Hunyuan), not its input (Qwen3) */
    /* Hybrids (model_mixer.c): the mixer's in_proj and out_proj. */
    int lin_mix_in, lin_mix_out;
} qd_arch;

extern const qd_arch qd_arch_qwen_next, qd_arch_qwen35, qd_arch_qwen35_moe;

/* The Llama block's projections and input groups, shared by the table entries (model_arch.c,
 * arch_*.c) of the layouts that keep them separate. */
#define LLAMA_ATTN_LINEARS                                                \
    {"self_attn.q_proj", 0, QD_DIM_Q, QD_DIM_HIDDEN, QD_BIAS_QKV},        \
    {"self_attn.k_proj", 0, QD_DIM_KV, QD_DIM_HIDDEN, QD_BIAS_QKV},       \
    {"self_attn.v_proj", 0, QD_DIM_KV, QD_DIM_HIDDEN, QD_BIAS_QKV},       \
    {"self_attn.o_proj", 1, QD_DIM_HIDDEN, QD_DIM_Q, QD_BIAS_O}
#define LLAMA_MLP_LINEARS                                                 \
    {"mlp.gate_proj", 2, QD_DIM_FF, QD_DIM_HIDDEN, QD_BIAS_MLP},          \
    {"mlp.up_proj", 2, QD_DIM_FF, QD_DIM_HIDDEN, QD_BIAS_MLP},            \
    {"mlp.down_proj", 3, QD_DIM_HIDDEN, QD_DIM_FF, QD_BIAS_MLP}
#define LLAMA_GROUPS                                                      \
    {"attn_in", QD_PREV_NORM, "input_layernorm"},                         \
    {"attn_out", QD_PREV_LINEAR, "self_attn.v_proj"},                     \
    {"mlp_in", QD_PREV_NORM, "post_attention_layernorm"},                 \
    {"mlp_out", QD_PREV_LINEAR, "mlp.up_proj"}

const qd_arch *qd_arch_for(const qd_model_config *c);
/* StarCoder2, Phi, GPT-NeoX, Cohere2 (arch_parallel.c); NULL for another layout. */
const qd_arch *qd_arch_plain_for(const qd_model_config *c);
/* The entries of arch_moe.c (GLM-4.5, dots.llm1, MiniMax-M2, ERNIE 4.5 MoE); NULL for another layout. */
const qd_arch *qd_arch_moe_for(const qd_model_config *c);
/* OLMo 2/3, EXAONE 4 (QD_LAYOUT_POSTNORM) and GLM-4 (QD_LAYOUT_GLM4): arch_postnorm.c. */
const qd_arch *qd_arch_postnorm_for(const qd_model_config *c);
extern const qd_arch qd_arch_gpt_oss;   /* arch_gptoss.c */
extern const qd_arch qd_arch_llama4;    /* arch_llama4.c */
extern const qd_arch qd_arch_falcon_h1; /* arch_falcon_h1.c */

enum { QD_SCRATCH_XN = 0, QD_SCRATCH_Q, QD_SCRATCH_K, QD_SCRATCH_V, QD_SCRATCH_ATT, QD_SCRATCH_TMP,
       QD_SCRATCH_F1, QD_SCRATCH_F2, QD_SCRATCH_POS, QD_SCRATCH_LM, QD_SCRATCH_MOE_X, QD_SCRATCH_MOE_Y,
       QD_SCRATCH_MOE_R, QD_SCRATCH_MLA_LAT, QD_SCRATCH_MLA_ROPE, QD_SCRATCH_MLA_QP, QD_SCRATCH_MLA_KP,
       QD_SCRATCH_MLA_VP, QD_SCRATCH_MOE_I, QD_SCRATCH_QG, QD_SCRATCH_GATE, QD_SCRATCH_GDN_IN, QD_SCRATCH_GDN_MIX,
       QD_SCRATCH_GDN_CONV, QD_SCRATCH_GDN_Z, QD_SCRATCH_GDN_BA, QD_SCRATCH_GDN_IDX, QD_SCRATCH_PAR, QD_SCRATCH_MOE_Z, QD_SCRATCH_DSA_KEEP,
       QD_SCRATCH_COUNT };

struct qd_model {
    char *dir;
    qd_model_config cfg;
    const qd_arch *arch;
    st_model *st;
    qd_backend *be;
    int strip_prefix;          /* tensors saved without the leading "model." */
    const char *text_prefix;   /* multimodal: what stands for "model." in the text tower's names */
    const char *lm_prefix;     /* multimodal: before "lm_head." ("" or "language_model.") */
    int n_lin, n_grp;
    qd_linear_info lin[QD_MAX_LINEARS];
    qd_input_group grp[QD_MAX_GROUPS];
    char (*lin_names)[96];     /* generated linear names (MoE experts); owned */
    char (*grp_names)[32];     /* generated group names; owned */
    struct cJSON *gptq_rules;  /* a mixed GPTQ checkpoint's quantization_config: each packed
                                  layer's widths checked against its `dynamic` rule; owned, else NULL */
    int moe_calibrate_all;     /* see qd_model_set_moe_calibrate_all */
    int compute_bf16;          /* see qd_model_set_compute_bf16 */
    int lin_exp0, grp_exp0;    /* MoE: the first expert's first linear and input group */
    const st_tensor *t_embed, *t_pos, *t_lm_head;
    float *final_w, *final_b;  /* backend [hidden]; NULL without a final norm */
    float *proj_in, *proj_out; /* backend; NULL unless proj_dim != hidden */
    float *lm_head;            /* backend [vocab, proj_dim] when small enough to keep */
    float *lm_bias;            /* backend [vocab]: lm_head's bias (Phi); else NULL */
    int64_t lm_chunk;          /* rows of lm_head converted at a time */
    void *scratch[QD_SCRATCH_COUNT];
    size_t scratch_cap[QD_SCRATCH_COUNT];
};

/* The stored name of a tensor given its canonical name (handles the missing "model."). */
const char *qd_model_tname(const qd_model *m, const char *canonical);
const st_tensor *qd_model_tfind(const qd_model *m, const char *canonical);
/* Backend scratch of at least `bytes`, reused between calls. NULL on failure (err set). */
void *qd_model_scratch(qd_model *m, int slot, size_t bytes, qd_err *err);
int64_t qd_model_dim(const qd_model *m, qd_dim d);
/* Loads a float tensor (any float dtype) checked against shape into new backend memory. */
int qd_model_load_f32(qd_model *m, const char *canonical, int ndim, const int64_t *shape,
                      float **out, qd_err *err);

/* The refusal of a loaded tensor (name, of shape[ndim]) whose element `at` (flat) is v, not
 * finite (model_load.c): QD_ENUMERIC, naming the tensor and the element's index. */
int qd_model_refuse_nonfinite(const char *name, int ndim, const int64_t *shape, int64_t at, float v, qd_err *err);

/* FP8-block source checkpoints (cfg.source_fp8; model_fp8.c, decoding in model_fp8.h). A
 * linear whose weight tensor w (canonical name weight_canonical, "<base>.weight") is
 * F8_E4M3: qd_fp8_check checks w against [n, k] and finds its "<base>.weight_scale_inv" (F32
 * or BF16, [ceil(n/bn), ceil(k/bk)]), the error naming the tensor at fault; qd_fp8_load also
 * dequantizes it into dst (n * k floats of host memory, or the CPU backend's), refusing a
 * scale that is not finite (naming the scale tensor) or a NaN code (naming the weight). */
int qd_fp8_check(const qd_model *m, const char *weight_canonical, const st_tensor *w, int64_t n, int64_t k,
                 const st_tensor **scale, qd_err *err);
int qd_fp8_load(qd_model *m, const char *weight_canonical, const st_tensor *w, int64_t n, int64_t k, float *dst,
                qd_err *err);

/* gpt-oss's fused expert tensors (model_gptoss.c). qd_gptoss_fused_present: block holds the
 * 3-D float mlp.experts.gate_up_proj (a source checkpoint; a quantd output has per-expert
 * linears instead). qd_gptoss_check: its four tensors exist with their shapes, float.
 * qd_gptoss_load_expert: linear li (an expert's gate, up or down) as [n, k] into w and its
 * bias [n] into b (host memory). qd_gptoss_is_fused_tensor: rel (a name relative to the
 * block prefix) is one of the fused tensors, which per-expert linears replace in an output. */
int qd_gptoss_fused_present(const qd_model *m, int block);
int qd_gptoss_check(const qd_model *m, int block, qd_err *err);
int qd_gptoss_load_expert(qd_model *m, int block, int li, float *w, float *b, qd_err *err);
/* gpt-oss's experts in vLLM's per-expert layout, a quantd compressed-tensors output
 * (model_gptoss_w13.c): present when the block holds mlp.experts.0.w13_weight_packed;
 * check: every expert's w13_/w2_ weight_packed, weight_scale and bias with their rows;
 * load: expert e's gate (j 0), up (1) or down (2) dequantized into w [n, k], its bias into
 * b (host memory; b may be NULL). */
int qd_gptoss_w13_present(const qd_model *m, int block);
int qd_gptoss_w13_check(const qd_model *m, int block, qd_err *err);
int qd_gptoss_w13_load(qd_model *m, int block, int e, int j, float *w, float *b, qd_err *err);
/* Dequantizes a packed linear [n, k] of the model's quantized checkpoint into w (host or
 * CPU-backend memory), its tensors found by find(ud, suffix) (qd_fmt_find_named over the
 * model's tensors for "<base>.<suffix>", or a view of another layout's); base names the
 * linear in errors. A weight that decodes to a non-finite value is refused. */
int qd_model_load_packed_find(qd_model *m, qd_fmt_find_fn find, void *ud, const char *base, int64_t n, int64_t k,
                              float *w, qd_err *err);
/* rel (a name relative to the block prefix) is one of the fused expert tensors of the arch's
 * layout (gpt-oss's or Granite's stacked ones), which per-expert linears replace in an output. */
int qd_fused_experts_replaced(const qd_model *m, const char *rel);

/* Pieces of the block forward (model_forward.c) shared with the MoE MLP (model_moe.c):
 * output rows [r0, r0 + n) of linear li (override hook applied) on x [rows, k] into y, and
 * the input hook of group g. */
int qd_fwd_linear_part(qd_model *m, const qd_block_weights *bw, int li, int64_t r0, int64_t n, const float *x,
                       int64_t rows, float *y, const qd_block_hooks *hooks, qd_err *err);
/* The backend's attention op in the model's compute arithmetic: attention_bf16 after
 * qd_model_set_compute_bf16 where the backend has it, else attention. */
typedef int (*qd_attention_fn)(qd_backend *be, float *out, const float *q, const float *k, const float *v,
                               int64_t batch, int64_t seq, int64_t n_heads, int64_t n_kv, int64_t hd, float scale,
                               int64_t window, float softcap);
qd_attention_fn qd_model_attention_op(const qd_model *m);
int qd_fwd_call_input(qd_model *m, const qd_block_weights *bw, int g, const float *x, int64_t rows,
                      const qd_block_hooks *hooks, qd_err *err);
/* Multi-head latent attention (model_mla.c): xn [batch*seq, hidden] → out, the o_proj
 * output; pos_be the tokens' positions, rf this forward's RoPE. */
int qd_mla_forward(qd_model *m, const qd_block_weights *bw, const float *xn, float *out, int64_t batch, int64_t seq,
                   const int32_t *pos_be, const qd_rope_freqs *rf, const qd_block_hooks *hooks, qd_err *err);
/* DeepSeek-V3.2's indexer (model_dsa.c): from xn [batch*seq, hidden] and q_resid (q_a_layernorm's
 * output) [batch*seq, q_lora_rank], both backend memory, the keys each query attends, keep
 * [batch, seq, seq] (backend memory, 1 = attended); its float tensors loaded into / checked
 * for block b, and their size. */
int qd_dsa_keep(qd_model *m, const qd_block_weights *bw, const float *xn, const float *q_resid, int64_t batch,
                int64_t seq, const int32_t *pos_be, const qd_rope_freqs *rf, const qd_block_hooks *hooks,
                uint8_t *keep, qd_err *err);
int qd_dsa_load(qd_model *m, int block, qd_block_weights *bw, qd_err *err);
uint64_t qd_dsa_bytes(const qd_model *m);
/* The mixer of block b (layer_mixer; attention past the config's table). */
static inline int qd_model_block_mixer(const qd_model *m, int b)
{
    return b >= 0 && b < QD_CFG_MAX_LAYERS ? m->cfg.layer_mixer[b] : QD_MIXER_ATTENTION;
}
/* Gated DeltaNet (model_gdn.c): xn [batch*seq, hidden] → out, the out_proj output. */
int qd_gdn_forward(qd_model *m, const qd_block_weights *bw, const float *xn, float *out, int64_t batch, int64_t seq,
                   const qd_block_hooks *hooks, qd_err *err);
/* Column units of rows (model_gdn.c): dst [rows, n_map * unit] takes, for each row r and
 * j < n_map, the unit map[j] (of `unit` floats) of src's row r [src_units * unit], through
 * the backend's gather_rows (an index list built and uploaded here). How interleaved
 * projections (Qwen3-Next's in_proj_qkvz, a gated q_proj) are split into contiguous parts. */
int qd_fwd_gather_units(qd_model *m, float *dst, const float *src, int64_t rows, int64_t src_units, int64_t unit,
                        const int32_t *map, int64_t n_map, qd_err *err);
/* Apertus's xIELU (model_xielu.c): the block's parameters into bw->xielu, and the op on x [n]. */
int qd_xielu_load(qd_model *m, int block, qd_block_weights *bw, qd_err *err);
int qd_fwd_xielu(qd_model *m, const qd_block_weights *bw, float *x, int64_t n, qd_err *err);
/* Ministral 3's query scale after RoPE (model_qscale.c, cfg.q_pos_scale_beta > 0) on
 * q [rows, n_heads * head_dim], pos_be the tokens' positions (backend memory). */
int qd_fwd_q_pos_scale(qd_model *m, float *q, int64_t rows, const int32_t *pos_be, qd_err *err);
/* The dense families' own table entries (arch_dense.c), or NULL for the others. */
const qd_arch *qd_arch_dense_for(const qd_model_config *c);
/* Hybrids (model_mixer.c): the tables of LFM2 and Granite-4; a recurrent layer's mixer,
 * xn [batch*seq, hidden] → out (out_proj's output, backend memory); its float parameters
 * (convolution, A, D, dt_bias, gated norm), loaded into bw->mixer_w, checked at open, and
 * their size. */
const qd_arch *qd_arch_hybrid(const qd_model_config *c);
int qd_mixer_forward(qd_model *m, const qd_block_weights *bw, const float *xn, float *out, int64_t batch, int64_t seq,
                     const qd_block_hooks *hooks, qd_err *err);
int qd_mixer_load(qd_model *m, int block, qd_block_weights *bw, qd_err *err);
int qd_mixer_validate(const qd_model *m, int block, qd_err *err);
uint64_t qd_mixer_bytes(const qd_model *m);
/* find_float of model_load.c: a float tensor checked against shape (named in the error). */
int qd_model_find_float(const qd_model *m, const char *canonical, int ndim, const int64_t *shape, const st_tensor **out,
                        qd_err *err);

/* The MoE MLP: xn [rows, hidden] → out [rows, hidden] (backend memory). */
int qd_moe_forward(qd_model *m, const qd_block_weights *bw, const float *xn, float *out, int64_t rows,
                   const qd_block_hooks *hooks, qd_err *err);

#endif
