/* The vLLM serving rules (see serving.h), read from vLLM's source through the code index;
 * each rule names the file it comes from. vLLM changes these over time: the table follows
 * the newer tree where versions differ (noted per rule), and ../shared/ref/compressed-tensors.md
 * section 2 has the versions read. A weight-only layer's activations are the model's served
 * dtype (act_type = params_dtype): bfloat16 or float16, which differ only for Exllama, which
 * takes float16 alone.
 *
 * How vLLM picks a kernel for a packed linear:
 *   compressed-tensors -> CompressedTensorsWNA16, then the mixed-precision chain
 *     (kernels/mixed_precision/__init__.py, choose_mp_linear_kernel): Machete, Marlin,
 *     Exllama, Triton W4A16, in that order (Conch only with its package installed; Humming
 *     not modelled); none -> "Failed to find a kernel", the model does not load.
 *   gptq / gptq_v2     -> vLLM 0.32's AutoGPTQConfig (auto_gptq.py, the one GPTQ config:
 *     symmetric 4 or 8 bits, else the model does not load); its linear method checks
 *     Marlin's group sizes (verify_marlin_supported) before any kernel, then the same chain.
 *   awq_gemm           -> AutoAWQConfig (auto_awq.py: 4-bit, zero points or not), the same
 *     group check, the same chain. (Older trees had gptq.py's exllama gptq_gemm and awq.py's
 *     GEMM as fallbacks; 0.32 has neither file.)
 * The float schemes (issue #35), as compressed_tensors.py _get_scheme_from_parts picks them
 * (read at a tree that has CompressedTensorsW4A8Fp8, W4A16Mxfp4 and W4A4Fp4):
 *   FP8 weights, FP8 activations (float-quantized; FP8_DYNAMIC, FP8_BLOCK) -> on compute
 *     capability 8.9 or newer CompressedTensorsW8A8Fp8: CUTLASS scaled_mm per channel or
 *     tensor, and for 128x128 blocks W8A8BlockFp8LinearOp (DeepGEMM when it is installed and
 *     takes the shape, else CUTLASS's block-scaled GEMM); older GPUs (Ampere)
 *     CompressedTensorsW8A16Fp8, FP8 Marlin, weight-only.
 *   int4 weights with FP8 activations (pack-quantized with input_activations; W4AFP8) ->
 *     CompressedTensorsW4A8Fp8 on compute capability 9.0 exactly (_is_fp8_w4a8_sm90), whose
 *     kernel is CutlassW4A8; on any other GPU no scheme matches (pack-quantized is not an
 *     activation-quantization format, so the wNa16 and W8A8 branches refuse it too) and the
 *     model does not load.
 *   NVFP4 weights, no activations (NVFP4A16) -> CompressedTensorsW4A16Fp4: FP4 Marlin on every
 *     GPU, Blackwell included (the FP4 tensor cores need FP4 activations).
 *   NVFP4 weights and activations (NVFP4) -> CompressedTensorsW4A4Fp4 where cutlass_fp4_supported
 *     (Blackwell: CUTLASS or FlashInfer, select_nvfp4_linear_backend), else W4A16Fp4 (Marlin).
 *   MXFP4 (MXFP4A16, MXFP4) -> CompressedTensorsW4A16Mxfp4 (FP4 Marlin, group 32); newer trees
 *     give MXFP4 activations CompressedTensorsW4A4MxFp4, whose init_mxfp4_linear_kernel picks
 *     FlashInfer on Blackwell and Marlin elsewhere.
 * Before any kernel, the layer must shard (the load rules). */
#include "quant/formats/serving.h"

#include <stdio.h>
#include <string.h>

typedef enum srv_grid { SRV_INT = 0, SRV_FP8, SRV_NVFP4, SRV_MXFP4 } srv_grid;

typedef struct srv_ctx {
    const qd_srv_layer *l;
    int64_t k_shard, n_shard;   /* what one rank holds */
    int zp;                     /* zero points stored (asymmetric) */
    srv_grid grid;              /* the weights' grid, from the format */
    int act;                    /* qd_srv_act, resolved (never AS_WRITTEN) */
    int64_t block_n, block_k;   /* FP8 blocks (0: per channel or tensor) */
} srv_ctx;

/* One rule: `refuses` returns 1 (with why) when the kernel cannot take the layer. */
typedef struct srv_rule {
    const char *id;
    qd_srv_kernel kernel;       /* QD_SRV_NO_LOAD: a load rule, before any kernel */
    const char *source;         /* vLLM file */
    int (*refuses)(const srv_ctx *c, char *why, size_t cap);
} srv_rule;

/* Values per packed unit: 32/b words for 2/4/8 bits; 3 bits packs 32 values in 3 words. */
static int pack_unit(int bits) { return 32 % bits == 0 ? 32 / bits : 32; }

static int is_ct(const srv_ctx *c) { return !strcmp(c->l->format, "compressed-tensors"); }
static int is_awq(const srv_ctx *c) { return !strcmp(c->l->format, "awq_gemm"); }

static srv_grid grid_of(const char *format)
{
    if (!strcmp(format, "float-quantized")) return SRV_FP8;
    if (!strcmp(format, "nvfp4-pack-quantized")) return SRV_NVFP4;
    if (!strcmp(format, "mxfp4-pack-quantized")) return SRV_MXFP4;
    return SRV_INT;
}

/* The activations a checkpoint of this format declares when the caller does not know them:
 * what quantd writes most. float-quantized: FP8_DYNAMIC / FP8_BLOCK, dynamic FP8 (the static
 * per-tensor FP8 preset gets the same kernel). nvfp4-pack-quantized: NVFP4A16; an NVFP4 (W4A4)
 * output, which quantd writes since the static-scale schemes, is then checked as NVFP4A16 (FP4
 * Marlin rather than the FP4 GEMM on Blackwell) until the caller passes act.
 * mxfp4-pack-quantized: MXFP4A16 and MXFP4 look alike in the format, and the older trees serve
 * both weight-only, so weight-only. compressed-tensors: W4A16 / W8A16 (a W4AFP8 checkpoint is
 * checked as W4A16 until act says otherwise). */
static int act_of(const qd_srv_layer *l, srv_grid g)
{
    if (l->act != QD_SRV_ACT_AS_WRITTEN) return l->act;
    return g == SRV_FP8 ? QD_SRV_ACT_FP8 : QD_SRV_ACT_NONE;
}

/* ---- load rules ---- */
static int load_shard(const srv_ctx *c, char *why, size_t cap)
{
    const qd_srv_layer *l = c->l;
    if (l->row_parallel && l->in_features % l->tp) {
        snprintf(why, cap, "in_features %lld does not split over %d ranks", (long long)l->in_features, l->tp);
        return 1;
    }
    if (!l->row_parallel && (l->out_per_shard <= 0 || l->out_per_shard * l->tp < l->out_features)) {
        snprintf(why, cap, "out_features %lld does not split over %d ranks", (long long)l->out_features, l->tp);
        return 1;
    }
    return 0;
}

static int load_group(const srv_ctx *c, char *why, size_t cap)
{
    const qd_srv_layer *l = c->l;
    /* FP8 blocks shard by block (load.fp8_block_k); FP4 scales shard by group like int ones. */
    if (c->grid == SRV_FP8 || !l->row_parallel || l->group_size <= 0 || l->group_size >= l->in_features || c->k_shard % l->group_size == 0)
        return 0;
    snprintf(why, cap, "a shard of %lld input features is not whole groups of %lld (scales are sharded by group)",
             (long long)c->k_shard, (long long)l->group_size);
    return 1;
}

static int load_packed(const srv_ctx *c, char *why, size_t cap)
{
    /* FP8 is a byte a value; FP4 packs two a byte along K, which whole groups already are. */
    if (c->grid != SRV_INT) return 0;
    const int per = pack_unit(c->l->bits);
    /* Tensors packed along N (gptq qzeros, awq qweight/qzeros, compressed-tensors' zero
     * point) shard by whole words on column-parallel layers; along K on row-parallel ones. */
    int packs_n = is_ct(c) ? c->zp : 1;
    if (!c->l->row_parallel && packs_n && c->n_shard % per) {
        snprintf(why, cap, "a shard of %lld output features is not whole %d-value packed words", (long long)c->n_shard, per);
        return 1;
    }
    if (c->l->row_parallel && !is_awq(c) && c->k_shard % per) {
        snprintf(why, cap, "a shard of %lld input features is not whole %d-value packed words", (long long)c->k_shard, per);
        return 1;
    }
    return 0;
}

/* ---- Machete ---- */
static int machete_gpu(const srv_ctx *c, char *why, size_t cap)
{
    if (c->l->gpu_cc == 90) return 0;
    snprintf(why, cap, "needs compute capability 9.0 (Hopper)");
    return 1;
}
static int machete_actorder(const srv_ctx *c, char *why, size_t cap)
{
    if (!(c->l->g_idx && c->l->row_parallel && c->l->tp > 1)) return 0;
    snprintf(why, cap, "act-order (g_idx) on a row-parallel layer split over %d ranks", c->l->tp);
    return 1;
}
static int machete_type(const srv_ctx *c, char *why, size_t cap)
{
    if (c->l->bits == 4 || c->l->bits == 8) return 0;   /* uint4/uint8 with zero points, uint4b8/uint8b128 without */
    snprintf(why, cap, "%d-bit weights (4 or 8)", c->l->bits);
    return 1;
}
static int machete_group(const srv_ctx *c, char *why, size_t cap)
{
    int64_t g = c->l->group_size;
    if (g == -1 || g == 64 || g == 128) return 0;
    snprintf(why, cap, "group size %lld (-1, 64 or 128; older vLLM: -1 or 128)", (long long)g);
    return 1;
}
static int machete_k(const srv_ctx *c, char *why, size_t cap)
{
    if (c->k_shard % 64 == 0) return 0;
    snprintf(why, cap, "input features per shard %lld not a multiple of 64", (long long)c->k_shard);
    return 1;
}
static int machete_n(const srv_ctx *c, char *why, size_t cap)
{
    if (c->n_shard % 128 == 0) return 0;
    snprintf(why, cap, "output features per shard %lld not a multiple of 128", (long long)c->n_shard);
    return 1;
}

/* ---- Marlin ---- */
static int marlin_gpu(const srv_ctx *c, char *why, size_t cap)
{
    if (c->l->gpu_cc >= 80) return 0;
    snprintf(why, cap, "needs compute capability 8.0 or newer");
    return 1;
}
static int marlin_type(const srv_ctx *c, char *why, size_t cap)
{
    if (c->zp ? c->l->bits == 4 : (c->l->bits == 4 || c->l->bits == 8)) return 0;
    snprintf(why, cap, "%d-bit %s weights (with zero points only 4-bit uint4; symmetric 4 or 8)", c->l->bits,
             c->zp ? "asymmetric" : "symmetric");
    return 1;
}
static int marlin_group(const srv_ctx *c, char *why, size_t cap)
{
    int64_t g = c->l->group_size;
    if (g == -1 || g == 32 || g == 64 || g == 128) return 0;
    snprintf(why, cap, "group size %lld (-1, 32, 64 or 128)", (long long)g);
    return 1;
}
static int marlin_n(const srv_ctx *c, char *why, size_t cap)
{
    if (c->n_shard % 64 == 0) return 0;
    snprintf(why, cap, "output features per shard %lld not a multiple of 64 (newer vLLM zero-pads some shapes)",
             (long long)c->n_shard);
    return 1;
}
static int marlin_k(const srv_ctx *c, char *why, size_t cap)
{
    if (c->k_shard % 128 == 0) return 0;
    snprintf(why, cap, "input features per shard %lld not a multiple of 128 (newer vLLM zero-pads some shapes)",
             (long long)c->k_shard);
    return 1;
}

/* ---- Exllama (compressed-tensors chain) ---- */
static int exllama_act(const srv_ctx *c, char *why, size_t cap)
{
    if (!c->l->act_bf16) return 0;
    snprintf(why, cap, "bfloat16 activations (float16 only; vLLM's --dtype float16 would take it)");
    return 1;
}
static int exllama_actorder(const srv_ctx *c, char *why, size_t cap) { return machete_actorder(c, why, cap); }
static int exllama_type(const srv_ctx *c, char *why, size_t cap)
{
    if (!c->zp && (c->l->bits == 4 || c->l->bits == 8)) return 0;
    snprintf(why, cap, "%s %d-bit weights (symmetric uint4b8/uint8b128 only)", c->zp ? "asymmetric" : "symmetric",
             c->l->bits);
    return 1;
}
static int exllama_n(const srv_ctx *c, char *why, size_t cap)
{
    if (c->n_shard % pack_unit(c->l->bits) == 0) return 0;
    snprintf(why, cap, "output features per shard %lld not a multiple of %d", (long long)c->n_shard, pack_unit(c->l->bits));
    return 1;
}

/* ---- Triton W4A16 (kernels/mixed_precision/triton_w4a16.py, can_implement) ---- */
static int triton_type(const srv_ctx *c, char *why, size_t cap)
{
    if (c->l->bits == 4) return 0;
    snprintf(why, cap, "%d-bit weights (uint4b8 or uint4 only)", c->l->bits);
    return 1;
}
static int triton_group(const srv_ctx *c, char *why, size_t cap)
{
    int64_t g = c->l->group_size;
    if (g == -1 || g == 32 || g == 64 || g == 128 || g == 256 || g == c->l->in_features) {
        int64_t eg = g == -1 ? c->k_shard : g;
        if (eg > 0 && c->k_shard % eg == 0) return 0;
        snprintf(why, cap, "input features per shard %lld not a multiple of the group %lld", (long long)c->k_shard,
                 (long long)eg);
        return 1;
    }
    snprintf(why, cap, "group size %lld (-1, 32, 64, 128, 256 or the whole input)", (long long)g);
    return 1;
}
static int triton_n(const srv_ctx *c, char *why, size_t cap)
{
    if (c->n_shard % 8 == 0) return 0;
    snprintf(why, cap, "output features per shard %lld not a multiple of 8", (long long)c->n_shard);
    return 1;
}
/* ---- FP8 blocks (load) ----
 * validate_fp8_block_shape (fp8_utils.py), called by both FP8 schemes' create_weights: a
 * row-parallel shard at tp > 1 must be whole blocks along K; column-parallel, each member's
 * shard (q, k, v apart) whole blocks along N when split over ranks, and every member but the
 * last when merged at tp 1. Newer trees skip the check for layers that allow a mismatch
 * (allow_fp8_block_shape_mismatch, a model's own opt-in), not for the llama family. */
static int load_fp8_block_k(const srv_ctx *c, char *why, size_t cap)
{
    const qd_srv_layer *l = c->l;
    if (!c->block_k || !l->row_parallel || l->tp < 2 || c->k_shard % c->block_k == 0) return 0;
    snprintf(why, cap, "a shard of %lld input features is not whole FP8 blocks of %lld", (long long)c->k_shard,
             (long long)c->block_k);
    return 1;
}
static int load_fp8_block_n(const srv_ctx *c, char *why, size_t cap)
{
    const qd_srv_layer *l = c->l;
    if (!c->block_n || l->row_parallel) return 0;
    int n = l->n_parts > QD_SRV_MAX_PARTS ? QD_SRV_MAX_PARTS : l->n_parts;
    if (n > 0) {
        int check = l->tp > 1 ? n : n - 1;
        for (int i = 0; i < check; i++)
            if (l->part_per_shard[i] % c->block_n) {
                snprintf(why, cap, "member %d of the fused layer has %lld output features per shard, not whole FP8 blocks "
                         "of %lld", i + 1, (long long)l->part_per_shard[i], (long long)c->block_n);
                return 1;
            }
        return 0;
    }
    /* Members unknown: the fused shard is checked, which a member may still break. */
    if (l->tp < 2 || c->n_shard % c->block_n == 0) return 0;
    snprintf(why, cap, "a shard of %lld output features is not whole FP8 blocks of %lld", (long long)c->n_shard,
             (long long)c->block_n);
    return 1;
}

/* ---- FP8 W8A8 (CUTLASS scaled_mm, block FP8) ---- */
static int fp8_w8a8_gpu(const srv_ctx *c, char *why, size_t cap)
{
    if (c->l->gpu_cc >= 89) return 0;
    snprintf(why, cap, "FP8 activations need compute capability 8.9 or newer");
    return 1;
}
static int cutlass_fp8_align(const srv_ctx *c, char *why, size_t cap)
{
    if (c->k_shard % 16 == 0 && c->n_shard % 16 == 0) return 0;
    snprintf(why, cap, "input %lld / output %lld features per shard not multiples of 16 (16-byte alignment)",
             (long long)c->k_shard, (long long)c->n_shard);
    return 1;
}

/* ---- FP8 Marlin (weight-only fallback: CompressedTensorsW8A16Fp8) ---- */
static int marlin_fp8_gpu(const srv_ctx *c, char *why, size_t cap) { return marlin_gpu(c, why, cap); }
static int marlin_tile_n(const srv_ctx *c, char *why, size_t cap)
{
    if (c->n_shard % 64 == 0) return 0;
    snprintf(why, cap, "output features per shard %lld not a multiple of 64 (newer vLLM pads N to 64)",
             (long long)c->n_shard);
    return 1;
}
static int marlin_tile_k(const srv_ctx *c, char *why, size_t cap)
{
    if (c->k_shard % 16 == 0) return 0;
    snprintf(why, cap, "input features per shard %lld not a multiple of 16", (long long)c->k_shard);
    return 1;
}

/* ---- CutlassW4A8 (W4AFP8) ---- */
static int w4a8_gpu(const srv_ctx *c, char *why, size_t cap)
{
    if (c->l->gpu_cc == 90) return 0;
    snprintf(why, cap, "int4 weights with FP8 activations are matched on compute capability 9.0 (Hopper) only");
    return 1;
}
static int w4a8_type(const srv_ctx *c, char *why, size_t cap)
{
    if (c->l->bits == 4 && !c->zp && !c->l->g_idx) return 0;
    snprintf(why, cap, "%d-bit %s weights%s (symmetric int4, no act-order g_idx)", c->l->bits,
             c->zp ? "asymmetric" : "symmetric", c->l->g_idx ? " with a g_idx" : "");
    return 1;
}
static int w4a8_group(const srv_ctx *c, char *why, size_t cap)
{
    if (c->l->group_size == 128) return 0;
    snprintf(why, cap, "group size %lld (128 only)", (long long)c->l->group_size);
    return 1;
}
static int w4a8_shape(const srv_ctx *c, char *why, size_t cap)
{
    if (c->k_shard % 128 == 0 && c->n_shard % 128 == 0) return 0;
    snprintf(why, cap, "input %lld / output %lld features per shard not multiples of 128", (long long)c->k_shard,
             (long long)c->n_shard);
    return 1;
}

/* ---- FP4 GEMM (NVFP4 / MXFP4 weights and activations) ---- */
static int fp4_gpu(const srv_ctx *c, char *why, size_t cap)
{
    if (c->l->gpu_cc >= 100) return 0;
    snprintf(why, cap, "FP4 tensor cores need compute capability 10.0 or newer (Blackwell)");
    return 1;
}
static int fp4_align(const srv_ctx *c, char *why, size_t cap)
{
    if (c->grid != SRV_NVFP4 || (c->k_shard % 32 == 0 && c->n_shard % 32 == 0)) return 0;
    snprintf(why, cap, "input %lld / output %lld features per shard not multiples of 32 (newer vLLM pads them: "
             "pad_nvfp4_weight_for_cutlass)", (long long)c->k_shard, (long long)c->n_shard);
    return 1;
}

/* ---- FP4 Marlin (weight-only: CompressedTensorsW4A16Fp4, W4A16Mxfp4) ---- */
static int marlin_fp4_gpu(const srv_ctx *c, char *why, size_t cap)
{
    if (c->l->gpu_cc >= 75) return 0;
    snprintf(why, cap, "needs compute capability 7.5 or newer");
    return 1;
}

#define MP_DIR "vllm/model_executor/kernels/linear/mixed_precision/"
#define UT_DIR "vllm/model_executor/layers/quantization/utils/"
#define CT_DIR "vllm/model_executor/layers/quantization/compressed_tensors/"
#define SC_DIR CT_DIR "schemes/"

/* The table: rules in the order vLLM applies them. */
static const srv_rule rules[] = {
    {"load.shard", QD_SRV_NO_LOAD, "vllm/distributed/utils.py (divide)", load_shard},
    {"load.group", QD_SRV_NO_LOAD, UT_DIR "marlin_utils.py (verify_group_size_divides_partition); gptq.py create_weights", load_group},
    {"load.packed", QD_SRV_NO_LOAD, "vllm/model_executor/parameter.py (PackedvLLMParameter shards whole words)", load_packed},
    {"machete.gpu", QD_SRV_MACHETE, MP_DIR "machete.py (is_device_capability(90))", machete_gpu},
    {"machete.actorder", QD_SRV_MACHETE, MP_DIR "machete.py (has_g_idx and partitioned input features)", machete_actorder},
    {"machete.type", QD_SRV_MACHETE, UT_DIR "machete_utils.py (query_machete_supported_quant_types)", machete_type},
    {"machete.group", QD_SRV_MACHETE, UT_DIR "machete_utils.py (query_machete_supported_group_sizes)", machete_group},
    {"machete.k", QD_SRV_MACHETE, UT_DIR "machete_utils.py (check_machete_supports_shape: block 64)", machete_k},
    {"machete.n", QD_SRV_MACHETE, UT_DIR "machete_utils.py (check_machete_supports_shape: block 128)", machete_n},
    {"marlin.gpu", QD_SRV_MARLIN, UT_DIR "marlin_utils.py (query_marlin_supported_quant_types: capability)", marlin_gpu},
    {"marlin.type", QD_SRV_MARLIN, UT_DIR "marlin_utils.py (query_marlin_supported_quant_types: has_zp -> uint4)", marlin_type},
    {"marlin.group", QD_SRV_MARLIN, UT_DIR "marlin_utils.py (MARLIN_SUPPORTED_GROUP_SIZES)", marlin_group},
    {"marlin.n", QD_SRV_MARLIN, UT_DIR "marlin_utils.py (GPTQ_MARLIN_MIN_THREAD_N = 64)", marlin_n},
    {"marlin.k", QD_SRV_MARLIN, UT_DIR "marlin_utils.py (GPTQ_MARLIN_MIN_THREAD_K = 128)", marlin_k},
    {"exllama.act", QD_SRV_EXLLAMA, MP_DIR "exllama.py (c.act_type != torch.float16)", exllama_act},
    {"exllama.actorder", QD_SRV_EXLLAMA, MP_DIR "exllama.py (has_g_idx and partitioned input features)", exllama_actorder},
    {"exllama.type", QD_SRV_EXLLAMA, MP_DIR "exllama.py (SUPPORTED_QUANT_TYPES)", exllama_type},
    {"exllama.n", QD_SRV_EXLLAMA, MP_DIR "exllama.py (output features a multiple of the pack factor)", exllama_n},
    {"triton.type", QD_SRV_TRITON_W4A16, MP_DIR "triton_w4a16.py (TRITON_W4A16_SUPPORTED_QUANT_TYPES)", triton_type},
    {"triton.group", QD_SRV_TRITON_W4A16, MP_DIR "triton_w4a16.py (TRITON_W4A16_SUPPORTED_GROUP_SIZES; K % group)",
     triton_group},
    {"triton.n", QD_SRV_TRITON_W4A16, MP_DIR "triton_w4a16.py (N % 8)", triton_n},
    /* The float schemes (issue #35). */
    {"load.fp8_block_k", QD_SRV_NO_LOAD, UT_DIR "fp8_utils.py (validate_fp8_block_shape: input_size_per_partition % block_k)",
     load_fp8_block_k},
    {"load.fp8_block_n", QD_SRV_NO_LOAD, UT_DIR "fp8_utils.py (validate_fp8_block_shape: each output_partition_size % block_n)",
     load_fp8_block_n},
    {"cutlass_fp8.gpu", QD_SRV_CUTLASS_FP8, CT_DIR "compressed_tensors.py (_check_scheme_supported("
     "CompressedTensorsW8A8Fp8.get_min_capability() = 89), else CompressedTensorsW8A16Fp8)", fp8_w8a8_gpu},
    {"cutlass_fp8.align", QD_SRV_CUTLASS_FP8, "csrc/quantization/cutlass_w8a8/scaled_mm_entry.cu (cutlass_scaled_mm: "
     "c.stride(0) % 16 and b.stride(1) % 16; torch._scaled_mm needs the same)", cutlass_fp8_align},
    {"block_fp8.gpu", QD_SRV_BLOCK_FP8, CT_DIR "compressed_tensors.py (_check_scheme_supported("
     "CompressedTensorsW8A8Fp8.get_min_capability() = 89), else CompressedTensorsW8A16Fp8)", fp8_w8a8_gpu},
    {"marlin_fp8.gpu", QD_SRV_MARLIN, UT_DIR "marlin_utils_fp8.py (is_fp8_marlin_supported: capability 8.0)", marlin_fp8_gpu},
    {"marlin_fp8.n", QD_SRV_MARLIN, "csrc/quantization/gptq_marlin/gptq_marlin_repack.cu (size_n % tile_n_size 64); "
     UT_DIR "marlin_utils_fp8.py", marlin_tile_n},
    {"marlin_fp8.k", QD_SRV_MARLIN, "csrc/quantization/gptq_marlin/gptq_marlin_repack.cu (size_k % tile_k_size 16); "
     UT_DIR "marlin_utils_fp8.py", marlin_tile_k},
    {"cutlass_w4a8.gpu", QD_SRV_CUTLASS_W4A8, CT_DIR "compressed_tensors.py (_is_fp8_w4a8_sm90: "
     "_check_scheme_supported(90, match_exact=True)); " MP_DIR "cutlass.py (CutlassW4A8LinearKernel.can_implement)", w4a8_gpu},
    {"cutlass_w4a8.type", QD_SRV_CUTLASS_W4A8, MP_DIR "cutlass.py (CutlassW4A8LinearKernel.can_implement: int4, "
     "no zero points, no g_idx); " CT_DIR "compressed_tensors.py (_is_fp8_w4a8: symmetric)", w4a8_type},
    {"cutlass_w4a8.group", QD_SRV_CUTLASS_W4A8, SC_DIR "compressed_tensors_w4a8_fp8.py (CompressedTensorsW4A8Fp8.__init__: "
     "group size 128); " MP_DIR "cutlass.py (can_implement)", w4a8_group},
    {"cutlass_w4a8.shape", QD_SRV_CUTLASS_W4A8, MP_DIR "cutlass.py (CutlassW4A8LinearKernel.can_implement: K and N "
     "divisible by 128)", w4a8_shape},
    {"fp4_gemm.gpu", QD_SRV_FP4, UT_DIR "nvfp4_utils.py (cutlass_fp4_supported: cutlass_scaled_mm_supports_fp4); "
     "vllm/model_executor/kernels/linear (FlashInferMxFp4LinearKernel.is_supported: capability 10.0, FlashInfer CuteDSL)",
     fp4_gpu},
    {"fp4_gemm.align", QD_SRV_FP4, UT_DIR "nvfp4_utils.py (pad_nvfp4_weight_for_cutlass: CUTLASS FP4 needs K and N divisible "
     "by 32)", fp4_align},
    {"marlin_fp4.gpu", QD_SRV_MARLIN, UT_DIR "marlin_utils_fp4.py (is_fp4_marlin_supported: capability 7.5)", marlin_fp4_gpu},
    {"marlin_fp4.n", QD_SRV_MARLIN, "csrc/quantization/gptq_marlin/gptq_marlin_repack.cu (size_n % tile_n_size 64); "
     UT_DIR "marlin_utils_fp4.py (prepare_fp4_layer_for_marlin; newer trees pad N to 64)", marlin_tile_n},
};
#define N_RULES (sizeof rules / sizeof rules[0])

const char *qd_srv_kernel_name(qd_srv_kernel k)
{
    switch (k) {
    case QD_SRV_MACHETE: return "Machete";
    case QD_SRV_MARLIN: return "Marlin";
    case QD_SRV_EXLLAMA: return "Exllama";
    case QD_SRV_FALLBACK: return "fallback";
    case QD_SRV_NO_LOAD: return "will not load";
    case QD_SRV_CUTLASS_FP8: return "CUTLASS FP8";
    case QD_SRV_BLOCK_FP8: return "block FP8";
    case QD_SRV_CUTLASS_W4A8: return "CutlassW4A8";
    case QD_SRV_FP4: return "FP4 GEMM";
    case QD_SRV_TRITON_MOE: return "Triton fused MoE";
    case QD_SRV_TRITON_W4A16: return "Triton W4A16";
    }
    return "?";
}

int qd_srv_served_bf16(const char *dtype, int gpu_cc)
{
    /* Below 8.0 bfloat16 is not supported: vLLM falls back to float16. */
    return gpu_cc >= 80 && (!*dtype || !strcmp(dtype, "bfloat16") || !strcmp(dtype, "float32"));
}

int qd_srv_gpu_cc(const char *gpu)
{
    if (!gpu) return 0;
    if (!strcmp(gpu, "hopper")) return 90;
    if (!strcmp(gpu, "ampere")) return 80;
    if (!strcmp(gpu, "blackwell")) return 100;
    return 0;
}

/* Appends "[id] reason (source); " to why. */
static void note(char *why, size_t cap, const srv_rule *r, const char *reason)
{
    size_t o = strlen(why);
    if (o < cap) snprintf(why + o, cap - o, "%s%s: %s [%s]", o ? "; " : "", r->id, reason, r->source);
}

/* 1 when rule id belongs to group ("marlin" holds "marlin.n", not "marlin_fp8.n"). */
static int in_group(const char *id, const char *group)
{
    size_t n = strlen(group);
    return !strncmp(id, group, n) && id[n] == '.';
}

/* First rule of the group that refuses, noted in why; 0 when its kernel takes the layer. */
static int group_refuses(const char *group, const srv_ctx *c, char *why, size_t cap)
{
    char reason[256];
    for (size_t i = 0; i < N_RULES; i++)
        if (in_group(rules[i].id, group) && rules[i].refuses(c, reason, sizeof reason)) {
            note(why, cap, &rules[i], reason);
            return 1;
        }
    return 0;
}

/* The integer chains name their groups by kernel. */
static int kernel_refuses(qd_srv_kernel k, const srv_ctx *c, char *why, size_t cap)
{
    return group_refuses(k == QD_SRV_MACHETE ? "machete" : k == QD_SRV_MARLIN ? "marlin"
                         : k == QD_SRV_TRITON_W4A16 ? "triton" : "exllama", c, why, cap);
}

/* Puts head in front of s (truncating the end when it does not fit). */
static void prepend(char *s, size_t cap, const char *head)
{
    size_t h = strlen(head), n = strlen(s);
    if (h >= cap) h = cap - 1;
    if (h + n >= cap) n = cap - 1 - h;
    memmove(s + h, s, n);
    memcpy(s, head, h);
    s[h + n] = 0;
}

static void choose(qd_srv_choice *out, qd_srv_kernel k, const char *path)
{
    out->kernel = k;
    out->fast = k != QD_SRV_EXLLAMA && k != QD_SRV_FALLBACK && k != QD_SRV_NO_LOAD && k != QD_SRV_TRITON_W4A16;
    char head[320];
    snprintf(head, sizeof head, "%s via %s%s", qd_srv_kernel_name(k), path, out->why[0] ? "; refused: " : "");
    prepend(out->why, sizeof out->why, head);
}

/* No kernel: the model does not load; head says which dispatch gave up. */
static void no_load(qd_srv_choice *out, const char *head)
{
    char h[320];
    snprintf(h, sizeof h, "will not load: %s%s", head, out->why[0] ? "; refused: " : "");
    prepend(out->why, sizeof out->why, h);
    out->kernel = QD_SRV_NO_LOAD;
}

#define SC_PATH(file, cls) "compressed-tensors " cls " [" SC_DIR file "]"

/* Weight-only FP4 (NVFP4A16, MXFP4A16, and what falls back to it): FP4 Marlin, every GPU. */
static void choose_marlin_fp4(const srv_ctx *c, qd_srv_choice *out)
{
    const char *path = c->grid == SRV_NVFP4
        ? SC_PATH("compressed_tensors_w4a16_nvfp4.py", "CompressedTensorsW4A16Fp4") " (FP4 Marlin, weight-only)"
        : SC_PATH("compressed_tensors_w4a16_mxfp4.py", "CompressedTensorsW4A16Mxfp4") " (FP4 Marlin, weight-only)";
    if (!group_refuses("marlin_fp4", c, out->why, sizeof out->why)) choose(out, QD_SRV_MARLIN, path);
    else no_load(out, "no FP4 weight-only kernel takes it (apply_fp4_marlin_linear is the only one)");
}

/* FP8, NVFP4 and MXFP4 weights. */
static void choose_float(const srv_ctx *c, qd_srv_choice *out)
{
    char *w = out->why;
    const size_t cap = sizeof out->why;
    if (c->grid == SRV_FP8) {
        const char *marlin = SC_PATH("compressed_tensors_w8a16_fp8.py", "CompressedTensorsW8A16Fp8")
                             " (FP8 Marlin, weight-only: activations stay 16-bit)";
        if (c->act == QD_SRV_ACT_FP8) {
            if (c->block_n) {
                /* DeepGEMM needs bf16 and N % 64, K % 128 (should_use_deepgemm_for_fp8_linear,
                 * vllm/utils/deep_gemm.py) and the package; CUTLASS's block-scaled GEMM takes the
                 * rest on sm90 and sm100 (cutlass_block_fp8_supported). Its own shape limits were
                 * not confirmed from source, so no rule stands for them. */
                if (!group_refuses("block_fp8", c, w, cap)) {
                    choose(out, QD_SRV_BLOCK_FP8, SC_PATH("compressed_tensors_w8a8_fp8.py", "CompressedTensorsW8A8Fp8")
                           " (W8A8BlockFp8LinearOp: DeepGEMM, else CUTLASS block-scaled) [" UT_DIR "fp8_utils.py]");
                    return;
                }
            } else if (!group_refuses("cutlass_fp8", c, w, cap)) {
                choose(out, QD_SRV_CUTLASS_FP8, SC_PATH("compressed_tensors_w8a8_fp8.py", "CompressedTensorsW8A8Fp8")
                       " (Fp8LinearOp: cutlass_scaled_mm)");
                return;
            } else if (c->l->gpu_cc >= 89) {
                /* The scheme is W8A8 on this GPU: nothing falls back to Marlin. */
                no_load(out, "CompressedTensorsW8A8Fp8 has no other kernel for the shape");
                return;
            }
        }
        if (!group_refuses("marlin_fp8", c, w, cap)) choose(out, QD_SRV_MARLIN, marlin);
        else no_load(out, "no FP8 weight-only kernel takes it");
        return;
    }
    if (c->act == QD_SRV_ACT_FP4) {
        /* NVFP4 W4A4: CUTLASS / FlashInfer where cutlass_fp4_supported, else W4A16Fp4 (Marlin).
         * MXFP4 W4A4: FlashInfer on sm100 with CuteDSL, else Marlin MXFP4; the FlashInfer
         * kernel's shape limits were not confirmed from source, so only the GPU is checked. */
        if (!group_refuses("fp4_gemm", c, w, cap)) {
            choose(out, QD_SRV_FP4, c->grid == SRV_NVFP4
                   ? SC_PATH("compressed_tensors_w4a4_nvfp4.py", "CompressedTensorsW4A4Fp4")
                     " (CUTLASS or FlashInfer FP4 GEMM: select_nvfp4_linear_backend)"
                   : SC_PATH("compressed_tensors_w4a4_mxfp4.py", "CompressedTensorsW4A4MxFp4")
                     " (FlashInferMxFp4LinearKernel)");
            return;
        }
        if (c->l->gpu_cc >= 100) {
            /* Older trees fail in cutlass_scaled_fp4_mm on an unaligned shape. */
            no_load(out, "CompressedTensorsW4A4Fp4 runs CUTLASS FP4 on this GPU");
            return;
        }
    }
    choose_marlin_fp4(c, out);
}

/* int4 weights with FP8 activations (W4AFP8). */
static void choose_w4a8(const srv_ctx *c, qd_srv_choice *out)
{
    if (!group_refuses("cutlass_w4a8", c, out->why, sizeof out->why)) {
        choose(out, QD_SRV_CUTLASS_W4A8, SC_PATH("compressed_tensors_w4a8_fp8.py", "CompressedTensorsW4A8Fp8")
               " (CutlassW4A8LinearKernel; bfloat16 models only) [" MP_DIR "cutlass.py]");
        return;
    }
    /* Off Hopper no scheme matches; on Hopper the scheme either refuses the group size in
     * __init__ or choose_mp_linear_kernel finds no other kernel for int4 with FP8 activations
     * (Machete and Marlin take uint4b8, not the signed int4 of this scheme; not confirmed for
     * every vLLM version). */
    no_load(out, c->l->gpu_cc == 90 ? "no mixed-precision kernel takes int4 with FP8 activations "
            "(choose_mp_linear_kernel)" : "no compressed-tensors scheme matches int4 weights with FP8 activations off "
            "Hopper (_get_scheme_from_parts: \"No compressed-tensors compatible scheme was found\")");
}

int qd_srv_choose(const qd_srv_layer *l, qd_srv_choice *out)
{
    memset(out, 0, sizeof *out);
    if (!l || !l->format || l->tp < 1 || l->bits < 1 || l->bits > 8 || l->in_features <= 0 || l->out_features <= 0) {
        out->kernel = QD_SRV_NO_LOAD;
        snprintf(out->why, sizeof out->why, "invalid layer description");
        return -1;
    }
    srv_ctx c = {l, l->row_parallel ? l->in_features / l->tp : l->in_features,
                 l->row_parallel ? l->out_features : l->out_per_shard, !l->sym, grid_of(l->format), 0, 0, 0};
    c.act = act_of(l, c.grid);
    if (c.grid == SRV_FP8 && l->group_size > 0) {
        c.block_k = l->group_size;
        c.block_n = l->row_block > 0 ? l->row_block : 128;
    }
    char reason[256];
    for (size_t i = 0; i < N_RULES; i++)
        if (rules[i].kernel == QD_SRV_NO_LOAD && rules[i].refuses(&c, reason, sizeof reason)) {
            note(out->why, sizeof out->why, &rules[i], reason);
            out->kernel = QD_SRV_NO_LOAD;
            prepend(out->why, sizeof out->why, "will not load: ");
            return 0;
        }
    char *w = out->why;
    const size_t cap = sizeof out->why;
    if (c.grid != SRV_INT) {
        choose_float(&c, out);
        return 0;
    }
    if (is_ct(&c) && c.act == QD_SRV_ACT_FP8) {
        choose_w4a8(&c, out);
        return 0;
    }
    if (is_ct(&c)) {
        const char *path = "compressed-tensors CompressedTensorsWNA16 "
                           "[vllm/model_executor/layers/quantization/compressed_tensors/schemes/compressed_tensors_wNa16.py]";
        if (!kernel_refuses(QD_SRV_MACHETE, &c, w, cap)) choose(out, QD_SRV_MACHETE, path);
        else if (!kernel_refuses(QD_SRV_MARLIN, &c, w, cap)) choose(out, QD_SRV_MARLIN, path);
        else if (!kernel_refuses(QD_SRV_EXLLAMA, &c, w, cap)) choose(out, QD_SRV_EXLLAMA, path);
        else if (!kernel_refuses(QD_SRV_TRITON_W4A16, &c, w, cap)) choose(out, QD_SRV_TRITON_W4A16, path);
        else {
            prepend(out->why, cap, "will not load: no mixed-precision kernel takes it (choose_mp_linear_kernel, "
                    MP_DIR "__init__.py); refused: ");
            out->kernel = QD_SRV_NO_LOAD;
        }
        return 0;
    }
    /* gptq, gptq_v2 and awq_gemm as vLLM 0.32 reads them: one config each, AutoGPTQConfig
     * (auto_gptq.py: TYPE_MAP holds symmetric 4 and 8 bits only, any other raises
     * "Unsupported quantization config") and AutoAWQConfig (auto_awq.py: 4 bits only),
     * whose linear method checks Marlin's group sizes before any kernel
     * (verify_marlin_supported, utils/marlin_utils.py), then picks from the same
     * mixed-precision chain as compressed-tensors (choose_mp_linear_kernel). */
    int awq = is_awq(&c);
    const char *path = awq ? "AutoAWQ [vllm/model_executor/layers/quantization/auto_awq.py]"
                           : "AutoGPTQ [vllm/model_executor/layers/quantization/auto_gptq.py]";
    if (awq ? l->bits != 4 : (c.zp || (l->bits != 4 && l->bits != 8))) {
        note(w, cap, &(srv_rule){awq ? "auto_awq.type" : "auto_gptq.type", QD_SRV_NO_LOAD,
                                 awq ? "vllm/model_executor/layers/quantization/auto_awq.py (AutoAWQConfig.TYPE_MAP: 4-bit)"
                                     : "vllm/model_executor/layers/quantization/auto_gptq.py (AutoGPTQConfig.TYPE_MAP: "
                                       "symmetric 4 or 8 bits)", NULL},
             c.zp && !awq ? "asymmetric weights" : awq ? "not 4 bits" : "not 4 or 8 bits");
        prepend(out->why, cap, "will not load: ");
        out->kernel = QD_SRV_NO_LOAD;
        return 0;
    }
    if (marlin_group(&c, reason, sizeof reason)) {
        note(w, cap, &(srv_rule){"auto.group", QD_SRV_NO_LOAD, UT_DIR "marlin_utils.py (verify_marlin_supported, called "
                                 "by the AutoGPTQ and AutoAWQ linear methods before any kernel)", NULL}, reason);
        prepend(out->why, cap, "will not load: ");
        out->kernel = QD_SRV_NO_LOAD;
        return 0;
    }
    if (!kernel_refuses(QD_SRV_MACHETE, &c, w, cap)) choose(out, QD_SRV_MACHETE, path);
    else if (!kernel_refuses(QD_SRV_MARLIN, &c, w, cap)) choose(out, QD_SRV_MARLIN, path);
    else if (!kernel_refuses(QD_SRV_EXLLAMA, &c, w, cap)) choose(out, QD_SRV_EXLLAMA, path);
    else if (!kernel_refuses(QD_SRV_TRITON_W4A16, &c, w, cap)) choose(out, QD_SRV_TRITON_W4A16, path);
    else {
        prepend(out->why, cap, "will not load: no mixed-precision kernel takes it (choose_mp_linear_kernel, "
                MP_DIR "__init__.py); refused: ");
        out->kernel = QD_SRV_NO_LOAD;
    }
    return 0;
}

/* For tests: the table's rule ids, in order. */
size_t qd_srv_rule_count(void) { return N_RULES; }
const char *qd_srv_rule_id(size_t i) { return i < N_RULES ? rules[i].id : NULL; }

/* What setting fixes each refusal, for the job pre-flight's message. */
static const struct { const char *id, *fix; } fixes[] = {
    {"load.shard", "a tp that divides the layer's features"},
    {"load.group", "a group_size that divides in_features / tp (e.g. 64 or 32), or a smaller tp"},
    {"load.packed", "a tp whose shards hold whole packed words"},
    {"auto_gptq.type", "sym true with 4 or 8 bits (or format compressed-tensors)"},
    {"auto_awq.type", "bits 4 (or format compressed-tensors)"},
    {"auto.group", "group_size 128, 64, 32 or -1"},
    {"machete.gpu", "gpu hopper (Machete)"},
    {"machete.actorder", "static_groups true or desc_act false"},
    {"machete.group", "group_size 128, 64 or -1 (Machete)"},
    {"marlin.type", "sym true, or 4 bits (Marlin takes zero points at 4 bits only)"},
    {"marlin.group", "group_size 128, 64, 32 or -1"},
    {"machete.k", "a tp whose input shards are multiples of 64"},
    {"machete.n", "a tp whose output shards are multiples of 128"},
    {"marlin.n", "a tp whose output shards are multiples of 64"},
    {"marlin.k", "a tp whose input shards are multiples of 128"},
    {"load.fp8_block_k", "a tp whose input shards are whole 128-wide blocks, or scheme FP8_DYNAMIC"},
    {"load.fp8_block_n", "a tp whose output shards (each of q, k, v) are whole 128-row blocks, or scheme FP8_DYNAMIC"},
    {"cutlass_fp8.gpu", "gpu hopper or blackwell for FP8 activations"},
    {"block_fp8.gpu", "gpu hopper or blackwell for FP8 activations"},
    {"cutlass_fp8.align", "a tp whose shards are multiples of 16"},
    {"marlin_fp8.n", "a tp whose output shards are multiples of 64"},
    {"marlin_fp8.k", "a tp whose input shards are multiples of 16"},
    {"cutlass_w4a8.gpu", "gpu hopper, or scheme W4A16 (Marlin elsewhere)"},
    {"cutlass_w4a8.type", "scheme W4AFP8 as it stands (symmetric int4, no desc_act)"},
    {"cutlass_w4a8.group", "group_size 128 (scheme W4AFP8)"},
    {"cutlass_w4a8.shape", "a tp whose shards are multiples of 128, or scheme W4A16"},
    {"fp4_gemm.gpu", "gpu blackwell for FP4 activations (weight-only NVFP4A16 / MXFP4A16 runs FP4 Marlin elsewhere)"},
    {"fp4_gemm.align", "a tp whose shards are multiples of 32, or a newer vLLM (it pads)"},
    {"marlin_fp4.n", "a tp whose output shards are multiples of 64, or a newer vLLM (it pads)"},
};

void qd_srv_fix_hint(const char *why, char *out, size_t cap)
{
    size_t o = 0;
    out[0] = 0;
    for (size_t i = 0; i < sizeof fixes / sizeof fixes[0] && o < cap; i++) {
        char key[48];
        snprintf(key, sizeof key, "%s:", fixes[i].id);
        if (strstr(why, key)) o += (size_t)snprintf(out + o, cap - o, "%s%s", o ? "; or " : "", fixes[i].fix);
    }
    if (!o) snprintf(out, cap, "other quantization settings or another tp");
}
