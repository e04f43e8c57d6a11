/* The vLLM serving rules (quant/formats/serving.c): one case per rule of the table, each
 * built so that exactly that rule decides, checking the kernel chosen and that the reason
 * names the rule; plus the dispatch by format (gptq_marlin, awq_marlin, the
 * compressed-tensors chain) and the fallbacks. */
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
    CHECK_INT(c.fast, k == QD_SRV_MACHETE || k == QD_SRV_MARLIN);
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
    l = base(); l.gpu_cc = 80; l.g_idx = 1; l.row_parallel = 1; l.tp = 2; l.group_size = 16;
    expect("exllama.actorder", &l, QD_SRV_NO_LOAD, "exllama.actorder");
    l = base(); l.sym = 0; l.bits = 8; l.group_size = 16;
    expect("exllama.type", &l, QD_SRV_NO_LOAD, "exllama.type");
    l = base(); l.gpu_cc = 80; l.out_features = l.out_per_shard = 4100;
    expect("exllama.n", &l, QD_SRV_NO_LOAD, "exllama.n");
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
    /* GPTQ: symmetric through gptq_marlin; asymmetric is not gptq_marlin-compatible. */
    l = base(); l.format = "gptq_v2";
    expect("gptq sym", &l, QD_SRV_MACHETE, NULL);
    l.sym = 0;
    expect("gptq asym", &l, QD_SRV_EXLLAMA, "gptq_marlin.type");
    l = base(); l.format = "gptq"; l.bits = 3;
    expect("gptq 3-bit", &l, QD_SRV_EXLLAMA, "gptq_marlin.type");
    /* GPTQ act-order row-parallel where Marlin cannot: exllama is off, the slow path. */
    l = base(); l.format = "gptq"; l.g_idx = 1; l.row_parallel = 1; l.tp = 2; l.in_features = 4096 + 256 * 2;
    l.group_size = 16;
    expect("gptq act-order row-parallel", &l, QD_SRV_FALLBACK, "marlin.group");
    /* AWQ: awq_marlin, or the awq GEMM. */
    l = base(); l.format = "awq_gemm"; l.sym = 0; l.group_size = 64;
    expect("awq", &l, QD_SRV_MARLIN, NULL);
    l.in_features = 4160;
    expect("awq odd K", &l, QD_SRV_FALLBACK, "marlin.k");
    qd_srv_choice c;
    l.tp = 0;
    CHECK_ERR(qd_srv_choose(&l, &c));
    CHECK_INT(qd_srv_gpu_cc("hopper"), 90);
    CHECK_INT(qd_srv_gpu_cc("ampere"), 80);
    CHECK_INT(qd_srv_gpu_cc("volta"), 0);
}

int main(void)
{
    TEST_RUN(test_rules);
    TEST_RUN(test_dispatch);
    return test_finish();
}
