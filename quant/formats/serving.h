/* Which vLLM kernel will serve a quantized linear (issue #17 part 3): the rules vLLM applies
 * when it loads a checkpoint, as one table in serving.c with the vLLM source file of each
 * rule, so that `quantctl check-serving` and a job's "serve" pre-flight can say, before
 * anything runs on a GPU, whether every layer gets a fast kernel at a tensor-parallel degree.
 *
 * The input is one (possibly fused) linear as vLLM builds it: its format and quantization
 * settings, its full in/out features, whether it is row-parallel (K split across ranks:
 * o_proj, down_proj) or column-parallel (N split: the fused qkv_proj and gate_up_proj), and
 * the out features of one shard (vLLM replicates KV heads when there are fewer than ranks,
 * so the caller computes it). Pure function, no state. */
#ifndef QUANT_FORMATS_SERVING_H
#define QUANT_FORMATS_SERVING_H

#include <stddef.h>
#include <stdint.h>

typedef enum qd_srv_kernel {
    QD_SRV_MACHETE = 0,       /* CUTLASS mixed-input GEMM, Hopper only */
    QD_SRV_MARLIN,            /* Marlin (gptq_marlin, awq_marlin, or the compressed-tensors chain) */
    QD_SRV_EXLLAMA,           /* exllama / gptq_gemm: loads, slower */
    QD_SRV_FALLBACK,          /* the format's plain kernel (awq GEMM, gptq without exllama): slow */
    QD_SRV_NO_LOAD,           /* vLLM refuses the layer: the model does not load */
} qd_srv_kernel;

typedef struct qd_srv_layer {
    const char *format;       /* format table name */
    int bits;
    int sym;
    int64_t group_size;       /* -1 = one group per row */
    int g_idx;                /* act-order stored as a g_idx (gptq desc_act without static groups) */
    int64_t in_features, out_features;   /* full, fused widths */
    int64_t out_per_shard;    /* out features of one rank (column-parallel), or out_features */
    int row_parallel;
    int tp;
    int gpu_cc;               /* compute capability x 10: 90 Hopper, 80 Ampere */
} qd_srv_layer;

typedef struct qd_srv_choice {
    qd_srv_kernel kernel;
    int fast;                 /* Machete or Marlin */
    char why[768];            /* the chosen kernel and, in order, why each faster one refused */
} qd_srv_choice;

const char *qd_srv_kernel_name(qd_srv_kernel k);
/* Fills out; returns 0, or -1 when the input itself is invalid (why says so). */
int qd_srv_choose(const qd_srv_layer *l, qd_srv_choice *out);
/* The rule table's ids in order ("load.shard", "machete.group", ...), for tests and docs. */
size_t qd_srv_rule_count(void);
const char *qd_srv_rule_id(size_t i);
/* The settings that would fix the refusals named in why ("group_size 128, 64 or -1 ..."). */
void qd_srv_fix_hint(const char *why, char *out, size_t cap);
/* "hopper" -> 90, "ampere" -> 80; 0 when unknown. */
int qd_srv_gpu_cc(const char *gpu);

#endif
