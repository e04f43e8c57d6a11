/* GPTQ's `dynamic` overrides as quantd reads them (fmt_gptq_dynamic.h): the rule each module
 * gets against a direct reference (the rules written out by hand, as Python's re.match reads
 * them: prefix matches, first rule in file order wins), the mixed flag the format's detect
 * sets, a mixed layer's bits and group size taken from its tensors, and every rule quantd does
 * not read refused by name. */
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include "quant/formats/fmt_gptq_dynamic.h"
#include "quant/formats/format.h"
#include "test_util.h"

/* A config as quantd's target_bpw writer makes it: the float skip first, then one rule per
 * block input group at another candidate than the top level (4 bits, group 64). */
static const char *CFG =
    "{\"quant_method\":\"gptq\",\"bits\":4,\"group_size\":64,\"desc_act\":false,\"sym\":true,"
    "\"checkpoint_format\":\"gptq\",\"dynamic\":{"
    "\"-:model\\\\.layers\\\\.2\\\\.mlp\\\\.down_proj$\":{},"
    "\"+:model\\\\.layers\\\\.0\\\\.self_attn\\\\.(q_proj|k_proj|v_proj|qkv_proj)$\":{\"bits\":3,\"group_size\":32},"
    "\"+:model\\\\.layers\\\\.1\\\\.mlp\\\\.(gate_proj|up_proj|gate_up_proj)$\":{\"bits\":8,\"group_size\":192},"
    "\"model\\\\.layers\\\\.1\\\\.mlp\\\\.down_proj$\":{\"group_size\":-1}}}";

static void test_lookup(void)
{
    cJSON *q = cJSON_Parse(CFG);
    CHECK(q != NULL);
    qd_err err = {0};
    static const struct { const char *name; int match, bits; int64_t gs; } want[] = {
        /* GPTQModel's module names and vLLM's fused ones get the same rule. */
        {"model.layers.0.self_attn.q_proj", QD_GPTQ_DYN_SET, 3, 32},
        {"model.layers.0.self_attn.v_proj", QD_GPTQ_DYN_SET, 3, 32},
        {"model.layers.0.self_attn.qkv_proj", QD_GPTQ_DYN_SET, 3, 32},
        {"model.layers.0.self_attn.o_proj", QD_GPTQ_DYN_NONE, 4, 64},
        /* `$`: layers.0's rule does not reach a longer name. */
        {"model.layers.0.self_attn.q_proj_extra", QD_GPTQ_DYN_NONE, 4, 64},
        {"model.layers.1.mlp.gate_up_proj", QD_GPTQ_DYN_SET, 8, 192},
        {"model.layers.1.mlp.up_proj", QD_GPTQ_DYN_SET, 8, 192},
        /* No prefix is a positive rule; only its keys are overridden. */
        {"model.layers.1.mlp.down_proj", QD_GPTQ_DYN_SET, 4, -1},
        {"model.layers.2.mlp.down_proj", QD_GPTQ_DYN_SKIP, 4, 64},
        {"model.layers.10.self_attn.q_proj", QD_GPTQ_DYN_NONE, 4, 64},
        /* re.match anchors at the start only. */
        {"x.model.layers.0.self_attn.q_proj", QD_GPTQ_DYN_NONE, 4, 64},
    };
    for (size_t i = 0; q && i < sizeof want / sizeof want[0]; i++) {
        int bits = 0;
        int64_t gs = 0;
        int rc = qd_gptq_dynamic_lookup(q, want[i].name, &bits, &gs, &err);
        CHECK_INT(rc, want[i].match);
        if (rc == QD_GPTQ_DYN_SKIP) continue;
        CHECK_INT(bits, want[i].bits);
        CHECK_INT(gs, want[i].gs);
    }
    /* Prefix semantics: an unanchored rule for layers.1 reaches layers.10 too, as in Python. */
    cJSON *q2 = cJSON_Parse("{\"bits\":4,\"group_size\":128,\"dynamic\":{\"+:model\\\\.layers\\\\.1\":{\"bits\":8}}}");
    int bits = 0;
    int64_t gs = 0;
    CHECK_INT(qd_gptq_dynamic_lookup(q2, "model.layers.10.mlp.up_proj", &bits, &gs, &err), QD_GPTQ_DYN_SET);
    CHECK_INT(bits, 8);
    CHECK_INT(gs, 128);
    /* First rule wins: a later, more specific rule is not reached. */
    cJSON *q3 = cJSON_Parse("{\"bits\":4,\"group_size\":128,\"dynamic\":{\"+:.*up_proj\":{\"bits\":8},"
                            "\"+:model\\\\.layers\\\\.0\\\\.mlp\\\\.up_proj$\":{\"bits\":3}}}");
    CHECK_INT(qd_gptq_dynamic_lookup(q3, "model.layers.0.mlp.up_proj", &bits, &gs, &err), QD_GPTQ_DYN_SET);
    CHECK_INT(bits, 8);
    /* Python's \\d, \\w and \\s read as their POSIX classes (quantd's tp_aware rules write
     * \\d+), inside brackets too. */
    cJSON *q4 = cJSON_Parse("{\"bits\":4,\"group_size\":128,\"dynamic\":{"
                            "\"+:model\\\\.layers\\\\.\\\\d+\\\\.mlp\\\\.down_proj$\":{\"bits\":8},"
                            "\"+:model\\\\.[\\\\w.]+\\\\.o_proj\\\\s*$\":{\"bits\":3}}}");
    CHECK_INT(qd_gptq_dynamic_lookup(q4, "model.layers.12.mlp.down_proj", &bits, &gs, &err), QD_GPTQ_DYN_SET);
    CHECK_INT(bits, 8);
    CHECK(qd_gptq_dynamic_lookup(q4, "model.layers.x.mlp.down_proj", &bits, &gs, &err) != QD_GPTQ_DYN_SET);
    CHECK_INT(qd_gptq_dynamic_lookup(q4, "model.layers.3.self_attn.o_proj", &bits, &gs, &err), QD_GPTQ_DYN_SET);
    CHECK_INT(bits, 3);
    CHECK(qd_gptq_dynamic_lookup(q4, "model.layers.3.self-attn.o_proj", &bits, &gs, &err) != QD_GPTQ_DYN_SET);
    cJSON_Delete(q);
    cJSON_Delete(q2);
    cJSON_Delete(q3);
    cJSON_Delete(q4);
}

static void test_detect(void)
{
    cJSON *q = cJSON_Parse(CFG);
    const qd_format *f = NULL;
    qd_fmt_detected d;
    qd_err err = {0};
    CHECK_OK(qd_format_detect(q, "config.json", &f, &d, &err));
    CHECK(f == qd_format_find("gptq"));
    CHECK_INT(d.mixed, 1);
    CHECK_INT(d.bits, 0);
    CHECK_INT(d.sym, 1);
    cJSON_Delete(q);
    /* Only skips and desc_act overrides (quantd's float layers, tp_aware's trivial g_idx): one width. */
    q = cJSON_Parse("{\"quant_method\":\"gptq\",\"bits\":3,\"group_size\":128,\"desc_act\":true,\"sym\":true,"
                    "\"dynamic\":{\"-:(model\\\\.)?visual\\\\..*\":{},\"+:.*down_proj\":{\"desc_act\":false},"
                    "\"+:.*o_proj\":{\"bits\":3,\"group_size\":128}}}");
    CHECK_OK(qd_format_detect(q, "config.json", &f, &d, &err));
    CHECK_INT(d.mixed, 0);
    CHECK_INT(d.bits, 3);
    CHECK_INT(d.group_size, 128);
    cJSON_Delete(q);
}

static void refused(const char *dyn, const char *words)
{
    char buf[1024];
    snprintf(buf, sizeof buf, "{\"quant_method\":\"gptq\",\"bits\":4,\"group_size\":128,\"desc_act\":false,\"sym\":true,"
             "\"dynamic\":%s}", dyn);
    cJSON *q = cJSON_Parse(buf);
    CHECK(q != NULL);
    const qd_format *f = NULL;
    qd_fmt_detected d;
    qd_err err = {0};
    CHECK_ERR(qd_format_detect(q, "config.json", &f, &d, &err));
    CHECK_CONTAINS(err.msg, words);
    cJSON_Delete(q);
}

static void test_refused(void)
{
    refused("{\"+:.*q_proj\":{\"bits\":4,\"act_group_aware\":true}}", "the override \"act_group_aware\" is not read");
    refused("{\"+:.*\\\\.(?:1[0-5])\\\\..*\":{\"bits\":8}}", "\"(?\" groups are Python regex syntax");
    refused("{\"+:.*layers\\\\.\\\\b[0-9]+\\\\.q_proj\":{\"bits\":8}}", "the class \\b is Python regex syntax");
    refused("{\"+:.*q_proj\":{\"bits\":5}}", "bits must be 2, 3, 4 or 8");
    refused("{\"+:.*q_proj\":{\"group_size\":0}}", "group_size must be -1 or positive");
    refused("{\"+:.*q_proj\":{\"sym\":false}}", "sym false differs from the top-level sym");
    refused("{\"+:.*q_proj\":7}", "must map to an object");
    refused("[1]", "quantization_config.dynamic must be an object");
    refused("{\"+:(q_proj\":{\"bits\":8}}", "is not a regex quantd reads");
}

/* A mixed layer's read(): bits from qweight's rows, group size from scales' rows, decoded as
 * the format's own pack wrote it. */
typedef struct one_layer { const qd_fmt_tensor *t; int n; } one_layer;
static int find_one(void *ud, const char *suffix, qd_fmt_tensor *out)
{
    const one_layer *o = ud;
    for (int i = 0; i < o->n; i++)
        if (!strcmp(o->t[i].suffix, suffix)) { *out = o->t[i]; return 1; }
    return 0;
}

static void test_read_mixed(void)
{
    const qd_format *F = qd_format_find("gptq");
    const int64_t n = 64, k = 128;
    static const struct { int bits; int64_t gs; } layers[] = {{3, 32}, {4, 64}, {8, -1}, {2, 128}};
    for (size_t li = 0; li < sizeof layers / sizeof layers[0]; li++) {
        int bits = layers[li].bits;
        int64_t gs = layers[li].gs, g = gs > 0 ? k / gs : 1;
        qd_qlayer l;
        memset(&l, 0, sizeof l);
        l.n = n; l.k = k; l.bits = bits; l.group_size = gs; l.n_groups = g; l.sym = 1;
        l.q = malloc((size_t)(n * k));
        l.zeros = malloc((size_t)(g * n) * sizeof *l.zeros);
        l.scales = malloc((size_t)(g * n) * sizeof *l.scales);
        l.g_idx = malloc((size_t)k * sizeof *l.g_idx);
        for (int64_t i = 0; i < n * k; i++) l.q[i] = (uint8_t)((i * 7 + li) % (1 << bits));
        for (int64_t i = 0; i < g * n; i++) { l.zeros[i] = 1 << (bits - 1); l.scales[i] = 0.01f * (float)(1 + i % 5); }
        for (int64_t i = 0; i < k; i++) l.g_idx[i] = (int32_t)(gs > 0 ? i / gs : 0);
        qd_packed p, back;
        qd_err err = {0};
        CHECK_OK(F->pack(&l, &p, &err));
        qd_fmt_tensor t[QD_FMT_MAX_TENSORS];
        int nt = 0;
        CHECK_OK(F->tensors(&p, t, &nt, &err));
        one_layer o = {t, nt};
        qd_fmt_detected d = {.bits = 0, .group_size = 0, .sym = 1, .mixed = 1};
        CHECK_OK(F->read(find_one, &o, n, k, &d, &back, &err));
        CHECK_INT(back.bits, bits);
        CHECK_INT(back.group_size, g == 1 ? -1 : gs);   /* one group reads as -1 */
        qd_qlayer u;
        CHECK_OK(F->unpack(&back, &u, &err));
        CHECK(memcmp(u.q, l.q, (size_t)(n * k)) == 0);
        qd_qlayer_free(&u);
        qd_fmt_tensors_free(t, nt);
        qd_packed_free(&back);
        qd_packed_free(&p);
        qd_qlayer_free(&l);
    }
}

/* A layer's stored widths against its rule: equal passes (group k and -1 alike), any other
 * width or a packed layer a "-:" rule leaves in float is refused, naming the module. */
static void test_agree(void)
{
    cJSON *q = cJSON_Parse(CFG);
    CHECK(q != NULL);
    qd_err err = {0};
    CHECK_OK(qd_gptq_dynamic_agree(q, "model.layers.0.self_attn.q_proj", 3, 32, 576, &err));
    CHECK_OK(qd_gptq_dynamic_agree(q, "model.layers.0.self_attn.o_proj", 4, 64, 576, &err));
    CHECK_OK(qd_gptq_dynamic_agree(q, "model.layers.1.mlp.down_proj", 4, -1, 1536, &err));
    CHECK_OK(qd_gptq_dynamic_agree(q, "model.layers.1.mlp.down_proj", 4, 1536, 1536, &err));
    CHECK_INT(qd_gptq_dynamic_agree(q, "model.layers.0.self_attn.k_proj", 4, 32, 576, &err), QD_EFORMAT);
    CHECK_CONTAINS(err.msg, "model.layers.0.self_attn.k_proj: its tensors are 4 bits, group size 32, but "
                   "quantization_config.dynamic says 3 bits, group size 32");
    CHECK_INT(qd_gptq_dynamic_agree(q, "model.layers.0.mlp.up_proj", 4, 32, 576, &err), QD_EFORMAT);
    CHECK_CONTAINS(err.msg, "(no dynamic rule matches it) says 4 bits, group size 64");
    CHECK_INT(qd_gptq_dynamic_agree(q, "model.layers.1.mlp.down_proj", 4, 64, 1536, &err), QD_EFORMAT);
    CHECK_INT(qd_gptq_dynamic_agree(q, "model.layers.2.mlp.down_proj", 4, 64, 1536, &err), QD_EFORMAT);
    CHECK_CONTAINS(err.msg, "leaves it unquantized");
    cJSON_Delete(q);
}

int main(void)
{
    TEST_RUN(test_lookup);
    TEST_RUN(test_detect);
    TEST_RUN(test_refused);
    TEST_RUN(test_read_mixed);
    TEST_RUN(test_agree);
    return test_finish();
}
