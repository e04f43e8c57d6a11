/* The serving check over a whole model (issue #17 part 3): every linear of every block, as
 * vLLM builds it at tensor-parallel degree tp (q/k/v fused into one column-parallel
 * qkv_proj, gate/up into gate_up_proj, o_proj and down_proj row-parallel; DeepSeek's latent
 * attention with its replicated fused_qkv_a_proj, tp_serving_mla.c), run through the
 * rule table of quant/formats/serving.h. Used by `quantctl check-serving` on a checkpoint and
 * by the pipeline's pre-flight for a job's "serve" block (on the float model, with the job's
 * settings). The report's rows are owned by it (qd_tp_serving_report_free). */
#ifndef QUANT_TP_TP_SERVING_H
#define QUANT_TP_TP_SERVING_H

#include "quant/formats/serving.h"
#include "quant/model/model.h"

/* How the model's linears are (or will be) quantized. */
typedef struct qd_serving_quant {
    const char *format;          /* format table name */
    int bits, sym;
    int64_t group_size;
    int g_idx;                   /* act-order stored as a g_idx */
    int act;                     /* qd_srv_act: the activations declared (0: as quantd writes
                                    the format) */
    /* Mixed bits per layer (job.target_bpw): when set, each quantized linear's bits and group
     * size come from it (0 when found) instead of bits and group_size above; a fused layer
     * whose members differ is reported as not loading. */
    int (*layer_quant)(void *ud, int block, int li, int *bits, int64_t *group_size);
    void *layer_ud;
    /* GPTQ's `dynamic` overrides (format gptq / gptq_v2, fmt_gptq_dynamic.h): when set, the bits
     * and group size vLLM builds a layer with from the rules matched against ITS name (the fused
     * "model.layers.0.self_attn.qkv_proj"), 0 when found, with layer_ud. A row whose stored bits
     * or group size (layer_quant) differ from those, or whose bits or group size vLLM's GPTQ config
     * cannot build (2 or 3 bits: auto_gptq.py TYPE_MAP holds 4 and 8; groups other than -1, 32,
     * 64, 128: verify_marlin_supported), is reported as not loading. */
    int (*row_quant)(void *ud, const char *vllm_name, int *bits, int64_t *group_size);
    /* GPTQ with `dynamic` overrides whose rules are known to read as the plan (a target_bpw
     * job's pre-flight): the 4-and-8-bit rule above without row_quant's comparison. */
    int gptq_dynamic;
} qd_serving_quant;

/* 1 when linear li of block b stays in float (not quantized). */
typedef int (*qd_serving_is_float_fn)(void *ud, int block, int li);

typedef struct qd_serving_row {
    char name[256];              /* "model.layers.0.self_attn.qkv_proj (q_proj+k_proj+v_proj)" */
    int is_float;                /* served unquantized */
    int64_t in_shard, out_shard; /* a quantized layer that shards: what one rank holds (the whole
                                    layer when vLLM replicates it); 0 otherwise */
    qd_srv_choice choice;        /* meaningful when !is_float */
} qd_serving_row;

typedef struct qd_serving_report {
    qd_serving_row *rows;
    size_t n;
    size_t n_slow;               /* rows without a fast kernel (fallback, Exllama, will not load) */
} qd_serving_report;

int qd_tp_serving_check(const qd_model *m, const qd_serving_quant *q, qd_serving_is_float_fn is_float, void *ud,
                        int tp, int gpu_cc, qd_serving_report *out, qd_err *err);
void qd_tp_serving_report_free(qd_serving_report *r);    /* accepts zeroed */

/* gpt-oss's experts (tp_serving_gptoss.c): the kernel vLLM serves one expert's fused
 * gate_up (or down) row with, or why it will not load, for q's format and settings, n_float
 * of its linears kept in float, per_linear set when the checkpoint holds them as per-expert
 * gate_proj/up_proj/down_proj (not vLLM's w13_ and w2_ tensors), at tp ranks. */
void qd_tp_serving_gptoss_experts(const qd_model_config *cfg, const qd_serving_quant *q, int n_float, int per_linear,
                                  int tp, qd_srv_choice *c);

#endif
