/* The vLLM serving rules (quant/formats/serving.c): one case per rule of the table, each
 * built so that exactly that rule decides, checking the kernel chosen and that the reason
 * names the rule; plus the dispatch by format (gptq_marlin, awq_marlin, the
 * compressed-tensors chain) and the fallbacks; and the float schemes of issue #35 (FP8 W8A8
 * per channel and in blocks, W4AFP8, NVFP4, MXFP4) on Ampere, Hopper and Blackwell, each rule
 * with a case it refuses and the shape or GPU it takes, TP shards that break an alignment among
 * them. */
#include <string.h>

#include "quant/formats/serving.h"
#include "test_util.h"

/* A layer Machete takes: compressed-tensors, symmetric 4-bit g128, 4096 x 4096, column, TP 1, Hopper. */
static qd_srv_layer base(void)
{
    qd_srv_layer l = {.format = "compressed-tensors", .bits = 4, .sym = 1, .group_size = 128, .g_idx = 0,
                      .in_features = 4096, .out_features = 4096, .out_per_shard = 4096, .row_parallel = 0,
                      .tp = 1, .gpu_cc = 90};
    return l;
}

static int rules_seen[64];

static void expect(const char *what, const qd_srv_layer *l, qd_srv_kernel k, const char *rule)
{
    qd_srv_choice c;
    CHECK_OK(qd_srv_choose(l, &c));
    test_checks++;
    if (c.kernel != k) TEST_FAIL_("%s: kernel %s, expected %s (%s)", what, qd_srv_kernel_name(c.kernel), qd_srv_kernel_name(k), c.why);
    if (rule) {
        test_checks++;
        if (!strstr(c.why, rule)) TEST_FAIL_("%s: reason lacks '%s': %s", what, rule, c.why);
        for (size_t i = 0; i < qd_srv_rule_count(); i++)
            if (strstr(c.why, qd_srv_rule_id(i)) && !strcmp(qd_srv_rule_id(i), rule)) rules_seen[i] = 1;
    }
    CHECK_INT(c.fast, k != QD_SRV_EXLLAMA && k != QD_SRV_FALLBACK && k != QD_SRV_NO_LOAD && k != QD_SRV_TRITON_W4A16);
}

/* FP8_DYNAMIC as quantd writes it: float-quantized, per channel, 4096 x 4096, column, TP 1, Hopper. */
static qd_srv_layer fp8(void)
{
    qd_srv_layer l = base();
    l.format = "float-quantized";
    l.bits = 8;
    l.group_size = -1;
    return l;
}
static qd_srv_layer fp8_block(void)
{
    qd_srv_layer l = fp8();
    l.group_size = 128;
    return l;
}
/* W4AFP8: pack-quantized int4 g128 declaring FP8 activations. */
static qd_srv_layer w4a8(void)
{
    qd_srv_layer l = base();
    l.act = QD_SRV_ACT_FP8;
    return l;
}
/* NVFP4A16 (as written) on Blackwell; with act = FP4 the W4A4 NVFP4 of other tools. */
static qd_srv_layer nvfp4(void)
{
    qd_srv_layer l = base();
    l.format = "nvfp4-pack-quantized";
    l.group_size = 16;
    l.gpu_cc = 100;
    return l;
}

static void test_float_rules(void)
{
    /* FP8 per channel: CUTLASS scaled_mm on Hopper and Blackwell, FP8 Marlin on Ampere. */
    qd_srv_layer l = fp8();
    expect("fp8 channel hopper", &l, QD_SRV_CUTLASS_FP8, NULL);
    l.gpu_cc = 100;
    expect("fp8 channel blackwell", &l, QD_SRV_CUTLASS_FP8, NULL);
    l = fp8(); l.gpu_cc = 80;
    expect("cutlass_fp8.gpu (ampere: FP8 Marlin)", &l, QD_SRV_MARLIN, "cutlass_fp8.gpu");
    l = fp8(); l.out_features = l.out_per_shard = 4104;
    expect("cutlass_fp8.align", &l, QD_SRV_NO_LOAD, "cutlass_fp8.align");
    l = fp8(); l.row_parallel = 1; l.tp = 2; l.in_features = 4096 + 32;
    expect("cutlass_fp8.align takes K shards of 16", &l, QD_SRV_CUTLASS_FP8, NULL);
    l = fp8(); l.gpu_cc = 75;
    expect("marlin_fp8.gpu", &l, QD_SRV_NO_LOAD, "marlin_fp8.gpu");
    l = fp8(); l.gpu_cc = 80; l.out_features = l.out_per_shard = 4128;
    expect("marlin_fp8.n", &l, QD_SRV_NO_LOAD, "marlin_fp8.n");
    l = fp8(); l.gpu_cc = 80; l.in_features = 4104;
    expect("marlin_fp8.k", &l, QD_SRV_NO_LOAD, "marlin_fp8.k");

    /* FP8 128x128 blocks: block FP8 on Hopper and Blackwell; the shards must be whole blocks. */
    l = fp8_block();
    expect("fp8 block hopper", &l, QD_SRV_BLOCK_FP8, NULL);
    l.gpu_cc = 100;
    expect("fp8 block blackwell", &l, QD_SRV_BLOCK_FP8, NULL);
    l = fp8_block(); l.gpu_cc = 80;
    expect("block_fp8.gpu (ampere: FP8 Marlin)", &l, QD_SRV_MARLIN, "block_fp8.gpu");
    l = fp8_block(); l.row_parallel = 1; l.tp = 4;
    expect("fp8 block row-parallel tp 4 (1024-wide shards)", &l, QD_SRV_BLOCK_FP8, NULL);
    l.tp = 64;
    expect("load.fp8_block_k (64-wide shards)", &l, QD_SRV_NO_LOAD, "load.fp8_block_k");
    l.gpu_cc = 80;
    expect("load.fp8_block_k holds for FP8 Marlin too", &l, QD_SRV_NO_LOAD, "load.fp8_block_k");
    /* q/k/v of a head_dim-64 model (SmolLM2: 9 q heads, 3 kv heads): q is 576 rows. */
    l = fp8_block(); l.in_features = 576; l.out_features = l.out_per_shard = 960;
    l.n_parts = 3; l.part_per_shard[0] = 576; l.part_per_shard[1] = 192; l.part_per_shard[2] = 192;
    expect("load.fp8_block_n (merged q of 576 rows)", &l, QD_SRV_NO_LOAD, "load.fp8_block_n");
    l = fp8_block(); l.out_features = l.out_per_shard = 6144;
    l.n_parts = 3; l.part_per_shard[0] = 4096; l.part_per_shard[1] = 1024; l.part_per_shard[2] = 1024;
    expect("fp8 block qkv of whole blocks", &l, QD_SRV_BLOCK_FP8, NULL);
    l.tp = 8; l.out_per_shard = 768; l.part_per_shard[0] = 512; l.part_per_shard[1] = 128; l.part_per_shard[2] = 128;
    expect("fp8 block qkv at tp 8", &l, QD_SRV_BLOCK_FP8, NULL);
    l.tp = 16; l.out_per_shard = 384; l.part_per_shard[0] = 256; l.part_per_shard[1] = 64; l.part_per_shard[2] = 64;
    expect("load.fp8_block_n (tp 16 splits k and v below a block)", &l, QD_SRV_NO_LOAD, "load.fp8_block_n");
    l = fp8_block(); l.tp = 2; l.out_features = 4160; l.out_per_shard = 2080;
    expect("load.fp8_block_n (members unknown: the fused shard)", &l, QD_SRV_NO_LOAD, "load.fp8_block_n");

    /* W4AFP8: CutlassW4A8 on Hopper only. */
    l = w4a8();
    expect("w4a8 hopper", &l, QD_SRV_CUTLASS_W4A8, NULL);
    l.gpu_cc = 100;
    expect("cutlass_w4a8.gpu (blackwell)", &l, QD_SRV_NO_LOAD, "cutlass_w4a8.gpu");
    l.gpu_cc = 80;
    expect("cutlass_w4a8.gpu (ampere)", &l, QD_SRV_NO_LOAD, "cutlass_w4a8.gpu");
    l = w4a8(); l.sym = 0;
    expect("cutlass_w4a8.type", &l, QD_SRV_NO_LOAD, "cutlass_w4a8.type");
    l = w4a8(); l.group_size = 64;
    expect("cutlass_w4a8.group", &l, QD_SRV_NO_LOAD, "cutlass_w4a8.group");
    l = w4a8(); l.tp = 2; l.out_features = 4224; l.out_per_shard = 2112;
    expect("cutlass_w4a8.shape (column shard of 2112)", &l, QD_SRV_NO_LOAD, "cutlass_w4a8.shape");
    l = w4a8(); l.row_parallel = 1; l.tp = 2;
    expect("w4a8 row-parallel tp 2 (2048-wide shards)", &l, QD_SRV_CUTLASS_W4A8, NULL);
    l.tp = 32;
    expect("cutlass_w4a8.shape (128-wide shards fit)", &l, QD_SRV_CUTLASS_W4A8, NULL);
    l = w4a8(); l.row_parallel = 1; l.in_features = 4096 + 128 * 2; l.tp = 4;
    expect("w4a8 row shard of 1088 (not whole groups: load.group first)", &l, QD_SRV_NO_LOAD, "load.group");

    /* NVFP4A16: FP4 Marlin everywhere (the FP4 GEMMs need FP4 activations). */
    l = nvfp4();
    expect("nvfp4a16 blackwell", &l, QD_SRV_MARLIN, NULL);
    l.gpu_cc = 90;
    expect("nvfp4a16 hopper", &l, QD_SRV_MARLIN, NULL);
    l = nvfp4(); l.gpu_cc = 70;
    expect("marlin_fp4.gpu", &l, QD_SRV_NO_LOAD, "marlin_fp4.gpu");
    l = nvfp4(); l.tp = 2; l.out_features = 4160; l.out_per_shard = 2080;
    expect("marlin_fp4.n (column shard of 2080)", &l, QD_SRV_NO_LOAD, "marlin_fp4.n");
    l = nvfp4(); l.row_parallel = 1; l.tp = 512;
    expect("load.group for NVFP4 (8-wide shards, groups of 16)", &l, QD_SRV_NO_LOAD, "load.group");
    /* NVFP4 with FP4 activations (another tool's W4A4): the FP4 GEMM on Blackwell. */
    l = nvfp4(); l.act = QD_SRV_ACT_FP4;
    expect("nvfp4 w4a4 blackwell", &l, QD_SRV_FP4, NULL);
    l.gpu_cc = 90;
    expect("fp4_gemm.gpu (hopper: W4A16Fp4 Marlin)", &l, QD_SRV_MARLIN, "fp4_gemm.gpu");
    l = nvfp4(); l.act = QD_SRV_ACT_FP4; l.out_features = l.out_per_shard = 4112;
    expect("fp4_gemm.align", &l, QD_SRV_NO_LOAD, "fp4_gemm.align");

    /* MXFP4A16: FP4 Marlin; MXFP4 (FP4 activations): FlashInfer on Blackwell, Marlin elsewhere. */
    l = nvfp4(); l.format = "mxfp4-pack-quantized"; l.group_size = 32;
    expect("mxfp4a16 blackwell", &l, QD_SRV_MARLIN, NULL);
    l.act = QD_SRV_ACT_FP4;
    expect("mxfp4 w4a4 blackwell", &l, QD_SRV_FP4, NULL);
    l.out_features = l.out_per_shard = 4112;
    expect("mxfp4: fp4_gemm.align is NVFP4's", &l, QD_SRV_FP4, NULL);
    l = nvfp4(); l.format = "mxfp4-pack-quantized"; l.group_size = 32; l.act = QD_SRV_ACT_FP4; l.gpu_cc = 90;
    expect("mxfp4 w4a4 hopper (Marlin)", &l, QD_SRV_MARLIN, "fp4_gemm.gpu");

    /* int4 W4A16 on Blackwell: Machete is Hopper's, Marlin serves it. */
    l = base(); l.gpu_cc = 100;
    expect("w4a16 blackwell", &l, QD_SRV_MARLIN, "machete.gpu");
    l = base(); l.format = "gptq"; l.gpu_cc = 100;
    expect("gptq blackwell", &l, QD_SRV_MARLIN, "machete.gpu");

    /* The fix hints name a setting for the new refusals. */
    char fix[384];
    qd_srv_choice c;
    l = fp8_block(); l.row_parallel = 1; l.tp = 64;
    CHECK_OK(qd_srv_choose(&l, &c));
    qd_srv_fix_hint(c.why, fix, sizeof fix);
    test_checks++;
    if (!strstr(fix, "FP8_DYNAMIC")) TEST_FAIL_("fix for load.fp8_block_k: %s", fix);
    l = w4a8(); l.gpu_cc = 100;
    CHECK_OK(qd_srv_choose(&l, &c));
    qd_srv_fix_hint(c.why, fix, sizeof fix);
    test_checks++;
    if (!strstr(fix, "gpu hopper")) TEST_FAIL_("fix for cutlass_w4a8.gpu: %s", fix);
}

static void test_rules(void)
{
    qd_srv_layer l = base();
    expect("base", &l, QD_SRV_MACHETE, NULL);
    l = base(); l.row_parallel = 1; l.tp = 3;
    expect("load.shard", &l, QD_SRV_NO_LOAD, "load.shard");
    l = base(); l.row_parallel = 1; l.tp = 64;
    expect("load.group", &l, QD_SRV_NO_LOAD, "load.group");
    l = base(); l.sym = 0; l.out_features = 72; l.out_per_shard = 36; l.tp = 2;
    expect("load.packed", &l, QD_SRV_NO_LOAD, "load.packed");
    l = base(); l.gpu_cc = 80;
    expect("machete.gpu", &l, QD_SRV_MARLIN, "machete.gpu");
    l = base(); l.format = "gptq"; l.g_idx = 1; l.row_parallel = 1; l.tp = 2;
    expect("machete.actorder", &l, QD_SRV_MARLIN, "machete.actorder");
    l = base(); l.bits = 2;
    expect("machete.type", &l, QD_SRV_NO_LOAD, "machete.type");
    l = base(); l.group_size = 32;
    expect("machete.group", &l, QD_SRV_MARLIN, "machete.group");
    l = base(); l.group_size = -1; l.in_features = 4128;
    expect("machete.k", &l, QD_SRV_EXLLAMA, "machete.k");
    l = base(); l.out_features = l.out_per_shard = 4160;
    expect("machete.n", &l, QD_SRV_MARLIN, "machete.n");
    l = base(); l.gpu_cc = 75;
    expect("marlin.gpu", &l, QD_SRV_EXLLAMA, "marlin.gpu");
    l = base(); l.sym = 0; l.bits = 8; l.group_size = 32;
    expect("marlin.type (asymmetric 8-bit g32: no kernel)", &l, QD_SRV_NO_LOAD, "marlin.type");
    l = base(); l.group_size = 16;
    expect("marlin.group", &l, QD_SRV_EXLLAMA, "marlin.group");
    l = base(); l.gpu_cc = 80; l.out_features = l.out_per_shard = 4128;
    expect("marlin.n", &l, QD_SRV_EXLLAMA, "marlin.n");
    l = base(); l.gpu_cc = 80; l.in_features = 4160;
    expect("marlin.k", &l, QD_SRV_EXLLAMA, "marlin.k");
    /* A bfloat16 model: Exllama refuses its activations, the chain goes on to Triton W4A16. */
    l = base(); l.group_size = -1; l.in_features = 4128; l.act_bf16 = 1;
    expect("exllama.act", &l, QD_SRV_TRITON_W4A16, "exllama.act");
    CHECK(qd_srv_served_bf16("bfloat16", 90) && qd_srv_served_bf16("float32", 80) && qd_srv_served_bf16("", 100));
    CHECK(!qd_srv_served_bf16("float16", 90) && !qd_srv_served_bf16("bfloat16", 75) && !qd_srv_served_bf16("float32", 75));
    l = base(); l.gpu_cc = 80; l.g_idx = 1; l.row_parallel = 1; l.tp = 2; l.group_size = 16;
    expect("exllama.actorder", &l, QD_SRV_NO_LOAD, "exllama.actorder");
    l = base(); l.sym = 0; l.bits = 8; l.group_size = 16;
    expect("exllama.type", &l, QD_SRV_NO_LOAD, "exllama.type");
    l = base(); l.gpu_cc = 80; l.out_features = l.out_per_shard = 4100;
    expect("exllama.n", &l, QD_SRV_NO_LOAD, "exllama.n");
    expect("triton.n", &l, QD_SRV_NO_LOAD, "triton.n");
    /* Triton W4A16, the chain's last kernel: 4-bit (zero points too), groups up to 256. */
    l = base(); l.gpu_cc = 80; l.sym = 0; l.in_features = 4160; l.group_size = 64;
    expect("triton (asymmetric, K Marlin refuses)", &l, QD_SRV_TRITON_W4A16, "exllama.type");
    l.bits = 8;
    expect("triton.type", &l, QD_SRV_NO_LOAD, "triton.type");
    l = base(); l.gpu_cc = 80; l.sym = 0; l.group_size = 16;
    expect("triton.group", &l, QD_SRV_NO_LOAD, "triton.group");
    test_float_rules();
    for (size_t i = 0; i < qd_srv_rule_count(); i++) {
        test_checks++;
        if (!rules_seen[i]) TEST_FAIL_("rule %s has no test", qd_srv_rule_id(i));
    }
}

static void test_dispatch(void)
{
    /* Asymmetric 4-bit compressed-tensors: Machete takes uint4 with zero points. */
    qd_srv_layer l = base();
    l.sym = 0;
    expect("ct asym w4 g128", &l, QD_SRV_MACHETE, NULL);
    /* GPTQ (vLLM 0.32's AutoGPTQConfig): symmetric 4/8-bit through the mixed-precision chain;
     * asymmetric or other widths do not load; Marlin's group sizes or nothing. */
    l = base(); l.format = "gptq_v2";
    expect("gptq sym", &l, QD_SRV_MACHETE, NULL);
    l.sym = 0;
    expect("gptq asym", &l, QD_SRV_NO_LOAD, "auto_gptq.type");
    l = base(); l.format = "gptq"; l.bits = 3;
    expect("gptq 3-bit", &l, QD_SRV_NO_LOAD, "auto_gptq.type");
    l = base(); l.format = "gptq"; l.group_size = 192; l.in_features = 4032;
    expect("gptq g192", &l, QD_SRV_NO_LOAD, "auto.group");
    /* Machete and Marlin refuse the shape: Exllama (float16 activations). */
    l = base(); l.format = "gptq"; l.in_features = 4096 + 32; l.group_size = 32;
    expect("gptq odd K", &l, QD_SRV_EXLLAMA, "marlin.k");
    /* AWQ (AutoAWQConfig): 4-bit with zero points through the same chain (Machete on Hopper,
     * Marlin on Ampere); other widths do not load. */
    l = base(); l.format = "awq_gemm"; l.sym = 0; l.group_size = 64;
    expect("awq", &l, QD_SRV_MACHETE, NULL);
    l.gpu_cc = 80;
    expect("awq ampere", &l, QD_SRV_MARLIN, "machete.gpu");
    l.in_features = 4160;
    expect("awq ampere odd K", &l, QD_SRV_TRITON_W4A16, "exllama.type");   /* Exllama: symmetric only */
    l = base(); l.format = "awq_gemm"; l.sym = 0; l.bits = 8;
    expect("awq 8-bit", &l, QD_SRV_NO_LOAD, "auto_awq.type");
    qd_srv_choice c;
    l.tp = 0;
    CHECK_ERR(qd_srv_choose(&l, &c));
    CHECK_INT(qd_srv_gpu_cc("hopper"), 90);
    CHECK_INT(qd_srv_gpu_cc("ampere"), 80);
    CHECK_INT(qd_srv_gpu_cc("blackwell"), 100);
    CHECK_INT(qd_srv_gpu_cc("volta"), 0);
}

int main(void)
{
    TEST_RUN(test_rules);
    TEST_RUN(test_dispatch);
    return test_finish();
}
