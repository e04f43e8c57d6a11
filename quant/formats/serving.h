/* Which vLLM kernel will serve a quantized linear (issue #17 part 3): the rules vLLM applies
 * when it loads a checkpoint, as one table in serving.c with the vLLM source file of each
 * rule, so that `quantctl check-serving` and a job's "serve" pre-flight can say, before
 * anything runs on a GPU, whether every layer gets a fast kernel at a tensor-parallel degree.
 *
 * The input is one (possibly fused) linear as vLLM builds it: its format and quantization
 * settings, its full in/out features, whether it is row-parallel (K split across ranks:
 * o_proj, down_proj) or column-parallel (N split: the fused qkv_proj and gate_up_proj), and
 * the out features of one shard (vLLM replicates KV heads when there are fewer than ranks,
 * so the caller computes it). Pure function, no state.
 *
 * The float formats (issue #35: FP8 W8A8, W4AFP8, NVFP4, MXFP4) take their scheme from the
 * format name and group size (what quantd writes: float-quantized with group -1 is FP8 per
 * channel or tensor, with group 128 FP8 in 128x128 blocks); the activations a checkpoint
 * declares come in `act`, which a caller that does not know them leaves 0 (QD_SRV_ACT_AS_WRITTEN:
 * as quantd writes the format, see serving.c act_of). */
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
    QD_SRV_CUTLASS_FP8,       /* CUTLASS scaled_mm: FP8 weights (per channel or tensor) and FP8 activations */
    QD_SRV_BLOCK_FP8,         /* FP8 weights in 128x128 blocks, activations per group of 128: DeepGEMM or CUTLASS */
    QD_SRV_CUTLASS_W4A8,      /* CutlassW4A8: int4 weights with FP8 activations, Hopper only */
    QD_SRV_FP4,               /* CUTLASS / FlashInfer FP4 GEMM: FP4 weights and activations, Blackwell */
    QD_SRV_TRITON_MOE,        /* vLLM's Triton fused-MoE kernel for int weights (WNA16), where the
                                 fused Marlin MoE kernel refuses the shape: the experts' usual path */
    QD_SRV_TRITON_W4A16,      /* TritonW4A16LinearKernel, the mixed-precision chain's last CUDA kernel
                                 for int4 (after Exllama): loads, slower */
} qd_srv_kernel;

/* The input activations the checkpoint declares (compressed-tensors input_activations). */
typedef enum qd_srv_act {
    QD_SRV_ACT_AS_WRITTEN = 0,  /* unknown: as quantd writes the format (serving.c act_of) */
    QD_SRV_ACT_NONE,            /* weight-only (A16) */
    QD_SRV_ACT_FP8,             /* FP8, dynamic (per token; per group of 128 with FP8 blocks) */
    QD_SRV_ACT_FP4,             /* FP4 in the weights' own format (NVFP4 or MXFP4 W4A4) */
} qd_srv_act;

#define QD_SRV_MAX_PARTS 4

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
    int gpu_cc;               /* compute capability x 10: 100 Blackwell, 90 Hopper, 80 Ampere */
    int act;                  /* qd_srv_act; 0 = as quantd writes the format */
    int act_bf16;             /* weight-only layers: the model is served in bfloat16
                                 (qd_srv_served_bf16), not float16; Exllama takes float16 only */
    int64_t row_block;        /* FP8 blocks: rows per block; 0 = 128 when group_size > 0 (FP8_BLOCK) */
    /* Out features of one shard of each member of a fused column-parallel layer (q, k, v),
     * which FP8 blocks check one by one; n_parts 0 = unknown, the fused width is checked. */
    int n_parts;
    int64_t part_per_shard[QD_SRV_MAX_PARTS];
} qd_srv_layer;

typedef struct qd_srv_choice {
    qd_srv_kernel kernel;
    int fast;                 /* Machete, Marlin, or one of the FP8 / W4A8 / FP4 GEMMs */
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
/* "blackwell" -> 100, "hopper" -> 90, "ampere" -> 80; 0 when unknown. */
int qd_srv_gpu_cc(const char *gpu);
/* 1 when vLLM serves a checkpoint whose config says dtype (torch_dtype; "" when absent, which
 * transformers reads as float32) in bfloat16 with --dtype auto on a GPU of compute capability
 * gpu_cc (x 10): a bfloat16 checkpoint stays bfloat16, a float32 one is downcast to the
 * platform's first dtype, bfloat16 from 8.0 on (config/model.py _resolve_auto_dtype; CUDA's
 * supported_dtypes). Else 0 (float16). */
int qd_srv_served_bf16(const char *dtype, int gpu_cc);

#endif
