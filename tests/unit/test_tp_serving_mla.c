/* The serving check on multi-head latent attention (quant/tp/tp_serving_mla.c): the rows
 * name vLLM's layers (fused_qkv_a_proj, q_b_proj or q_proj, kv_b_proj, o_proj; V3.2's
 * indexer wq_b and its float wk_weights_proj), replicated layers are whole on every rank at
 * any tp, heads-split layers hold 1/tp, a tp that does not divide the heads does not load,
 * and a fused layer mixing float and quantized members does not load. On one-layer
 * checkpoints with DeepSeek's attention widths (zero weights: the check reads shapes), and on
 * the tiny transformers checkpoints (tests/data/families). */
#include <stdlib.h>
#include <string.h>

#include "pipeline_testlib.h"
#include "quant/core/safetensors.h"
#include "quant/tp/tp_serving.h"

static qd_backend *be;

/* DeepSeek-V3's attention at 16 heads (V2-Lite's count): hidden 1024, q_lora_rank 1536,
 * kv_lora_rank 512, qk_nope 128, qk_rope 64, v 128; V3.2's indexer 16 heads of 128. */
enum { HID = 1024, FF = 1024, HEADS = 16, QLORA = 1536, KVLORA = 512, NOPE = 128, ROPE = 64, VHD = 128,
       IDXH = 16, IDXD = 128, VOCAB = 128 };

typedef struct { const char *name; int64_t n, k; } tdesc;   /* k 0: a vector of n */

/* Writes a one-layer checkpoint: v 2 (DeepSeek-V2-Lite: no q LoRA), 3 (V3), 32 (V3.2). */
static const char *write_model(int v)
{
    char name[32];
    snprintf(name, sizeof name, "mla-v%d", v);
    const char *dir = test_fresh_dir(name);
    char cfg[2048];
    snprintf(cfg, sizeof cfg,
             "{\"architectures\":[\"%s\"],\"model_type\":\"%s\",\"hidden_size\":%d,\"intermediate_size\":%d,"
             "\"num_hidden_layers\":1,\"num_attention_heads\":%d,\"num_key_value_heads\":%d,\"q_lora_rank\":%s,"
             "\"kv_lora_rank\":%d,\"qk_nope_head_dim\":%d,\"qk_rope_head_dim\":%d,\"v_head_dim\":%d,\"head_dim\":%d,"
             "\"first_k_dense_replace\":1,\"n_routed_experts\":8,\"n_shared_experts\":1,\"moe_intermediate_size\":64,"
             "\"num_experts_per_tok\":2,\"n_group\":%d,\"topk_group\":1,\"norm_topk_prob\":%s,%s"
             "\"vocab_size\":%d,\"max_position_embeddings\":128,\"rms_norm_eps\":1e-06,\"tie_word_embeddings\":false,"
             "\"rope_parameters\":{\"rope_theta\":10000.0,\"rope_type\":\"default\"},\"dtype\":\"bfloat16\"}",
             v == 2 ? "DeepseekV2ForCausalLM" : v == 3 ? "DeepseekV3ForCausalLM" : "DeepseekV32ForCausalLM",
             v == 2 ? "deepseek_v2" : v == 3 ? "deepseek_v3" : "deepseek_v32", HID, FF, HEADS, HEADS,
             v == 2 ? "null" : "1536", KVLORA, NOPE, ROPE, VHD, ROPE, v == 2 ? 1 : 4, v == 2 ? "false" : "true",
             v == 32 ? "\"index_topk\":8,\"index_n_heads\":16,\"index_head_dim\":128,\"layer_types\":[\"indexed_attention\"],"
                       "\"mlp_layer_types\":[\"dense\"]," : "",
             VOCAB);
    FILE *f = fopen(test_path(dir, "config.json"), "w");
    CHECK(f != NULL);
    if (!f) return NULL;
    fputs(cfg, f);
    fclose(f);
    const tdesc common[] = {
        {"model.embed_tokens.weight", VOCAB, HID}, {"lm_head.weight", VOCAB, HID}, {"model.norm.weight", HID, 0},
        {"model.layers.0.input_layernorm.weight", HID, 0}, {"model.layers.0.post_attention_layernorm.weight", HID, 0},
        {"model.layers.0.mlp.gate_proj.weight", FF, HID}, {"model.layers.0.mlp.up_proj.weight", FF, HID},
        {"model.layers.0.mlp.down_proj.weight", HID, FF},
        {"model.layers.0.self_attn.kv_a_proj_with_mqa.weight", KVLORA + ROPE, HID},
        {"model.layers.0.self_attn.kv_a_layernorm.weight", KVLORA, 0},
        {"model.layers.0.self_attn.kv_b_proj.weight", HEADS * (NOPE + VHD), KVLORA},
        {"model.layers.0.self_attn.o_proj.weight", HID, HEADS * VHD},
    };
    const tdesc q_only[] = {{"model.layers.0.self_attn.q_proj.weight", HEADS * (NOPE + ROPE), HID}};
    const tdesc q_lora[] = {
        {"model.layers.0.self_attn.q_a_proj.weight", QLORA, HID}, {"model.layers.0.self_attn.q_a_layernorm.weight", QLORA, 0},
        {"model.layers.0.self_attn.q_b_proj.weight", HEADS * (NOPE + ROPE), QLORA},
    };
    const tdesc indexer[] = {
        {"model.layers.0.self_attn.indexer.wq_b.weight", IDXH * IDXD, QLORA},
        {"model.layers.0.self_attn.indexer.wk.weight", IDXD, HID},
        {"model.layers.0.self_attn.indexer.k_norm.weight", IDXD, 0}, {"model.layers.0.self_attn.indexer.k_norm.bias", IDXD, 0},
        {"model.layers.0.self_attn.indexer.weights_proj.weight", IDXH, HID},
    };
    const struct { const tdesc *t; size_t n; int on; } lists[] = {
        {common, sizeof common / sizeof common[0], 1}, {q_only, 1, v == 2},
        {q_lora, sizeof q_lora / sizeof q_lora[0], v != 2}, {indexer, sizeof indexer / sizeof indexer[0], v == 32},
    };
    st_writer *w = NULL;
    qd_err err = {0};
    CHECK_OK(st_writer_init(&w));
    for (size_t l = 0; l < sizeof lists / sizeof lists[0]; l++)
        for (size_t i = 0; lists[l].on && i < lists[l].n; i++) {
            const tdesc *t = &lists[l].t[i];
            int64_t shape[2] = {t->n, t->k};
            CHECK_OK(st_writer_declare(w, t->name, QD_DTYPE_BF16, t->k ? 2 : 1, shape, &err));
        }
    uint64_t left = st_writer_data_bytes(w);
    static const char zeros[1 << 16];
    int rc = st_writer_begin(w, test_path(dir, "model.safetensors"), &err);
    while (!rc && left) {
        size_t n = left < sizeof zeros ? (size_t)left : sizeof zeros;
        rc = st_writer_append(w, zeros, n, &err);
        left -= n;
    }
    if (!rc) rc = st_writer_finish(w, &err);
    if (rc) TEST_FAIL_("%s: %s", dir, err.msg);
    st_writer_free(w);
    return rc ? NULL : dir;
}

static const qd_serving_row *find(const qd_serving_report *r, const char *name)
{
    for (size_t i = 0; i < r->n; i++)
        if (!strcmp(r->rows[i].name, name)) return &r->rows[i];
    TEST_FAIL_("no row %s", name);
    return NULL;
}

/* One attention row: its kernel and what one rank holds (in, out). */
static void expect(const qd_serving_report *r, const char *name, qd_srv_kernel k, int64_t in, int64_t out, int tp)
{
    const qd_serving_row *row = find(r, name);
    if (!row) return;
    if (row->choice.kernel != k || row->in_shard != in || row->out_shard != out)
        TEST_FAIL_("tp %d %s: %s in %lld out %lld (expected %s in %lld out %lld): %s", tp, name,
                   qd_srv_kernel_name(row->choice.kernel), (long long)row->in_shard, (long long)row->out_shard,
                   qd_srv_kernel_name(k), (long long)in, (long long)out, row->choice.why);
    test_checks++;
}

static int check(qd_model *m, qd_serving_is_float_fn is_float, int tp, qd_serving_report *rep)
{
    qd_serving_quant q = {.format = "gptq", .bits = 4, .sym = 1, .group_size = 128};
    qd_err err = {0};
    int rc = qd_tp_serving_check(m, &q, is_float, m, tp, qd_srv_gpu_cc("hopper"), rep, &err);
    if (rc) TEST_FAIL_("tp %d: %s", tp, err.msg);
    return rc;
}

#define L0 "model.layers.0.self_attn."

/* GPTQ 4-bit group 128 on Hopper. fused_qkv_a_proj [1536 + 576, 1024] is replicated: 2112
 * rows on every rank (not a multiple of 128: Machete refuses, Marlin takes it) at any tp —
 * divided by 8 it would be 264 rows, which Marlin refuses too. q_b_proj, kv_b_proj: 1/tp of
 * the heads (Machete); o_proj 1/tp of its 2048 inputs; V3.2's wq_b [2048, 1536] replicated
 * and wk_weights_proj in float. */
static void test_v3_rows(void)
{
    for (int v = 3; v <= 32; v += 29) {
        const char *dir = write_model(v);
        qd_model *m = NULL;
        qd_err err = {0};
        if (!dir || qd_model_open(dir, be, &m, &err)) { TEST_FAIL_("v%d: %s", v, err.msg); continue; }
        static const int tps[] = {1, 2, 4, 8};
        for (size_t i = 0; i < sizeof tps / sizeof tps[0]; i++) {
            int tp = tps[i];
            qd_serving_report rep = {0};
            if (check(m, NULL, tp, &rep)) continue;
            CHECK_INT((int)rep.n, v == 32 ? 8 : 6);   /* attention 4 (+ wq_b, wk_weights_proj), MLP 2 */
            expect(&rep, L0 "fused_qkv_a_proj (q_a_proj+kv_a_proj_with_mqa)", QD_SRV_MARLIN, HID, QLORA + KVLORA + ROPE, tp);
            expect(&rep, L0 "q_b_proj", QD_SRV_MACHETE, QLORA, HEADS * (NOPE + ROPE) / tp, tp);
            expect(&rep, L0 "kv_b_proj", QD_SRV_MACHETE, KVLORA, HEADS * (NOPE + VHD) / tp, tp);
            expect(&rep, L0 "o_proj", QD_SRV_MACHETE, HEADS * VHD / tp, HID, tp);
            CHECK_CONTAINS(find(&rep, L0 "fused_qkv_a_proj (q_a_proj+kv_a_proj_with_mqa)")->choice.why,
                           "output features per shard 2112 not a multiple of 128");
            if (v == 32) {
                expect(&rep, L0 "indexer.wq_b", QD_SRV_MACHETE, QLORA, IDXH * IDXD, tp);
                const qd_serving_row *r = find(&rep, L0 "indexer.wk_weights_proj (wk+weights_proj)");
                CHECK(r && r->is_float);
            } else {
                CHECK_INT(rep.n_slow, 0);
            }
            qd_tp_serving_report_free(&rep);
        }
        /* 16 heads over 32 ranks: vLLM's attention asserts num_heads % tp_size == 0; the
         * replicated fused_qkv_a_proj is still judged whole. */
        qd_serving_report rep = {0};
        if (!check(m, NULL, 32, &rep)) {
            static const char *const split[] = {L0 "q_b_proj", L0 "kv_b_proj", L0 "o_proj"};
            for (size_t i = 0; i < 3; i++) {
                const qd_serving_row *r = find(&rep, split[i]);
                if (!r) continue;
                CHECK_INT(r->choice.kernel, QD_SRV_NO_LOAD);
                CHECK_CONTAINS(r->choice.why, "num_attention_heads 16 does not split over 32 ranks");
            }
            expect(&rep, L0 "fused_qkv_a_proj (q_a_proj+kv_a_proj_with_mqa)", QD_SRV_MARLIN, HID, QLORA + KVLORA + ROPE, 32);
        }
        qd_tp_serving_report_free(&rep);
        qd_model_close(m);
    }
}

/* V2-Lite's q_proj is column-parallel and kv_a_proj_with_mqa [576, 1024] a ReplicatedLinear
 * of its own: 576 rows on every rank (Marlin; 72 at tp 8 would not be). */
static void test_v2_rows(void)
{
    const char *dir = write_model(2);
    qd_model *m = NULL;
    qd_err err = {0};
    if (!dir || qd_model_open(dir, be, &m, &err)) { TEST_FAIL_("v2: %s", err.msg); return; }
    for (int tp = 1; tp <= 8; tp *= 2) {
        qd_serving_report rep = {0};
        if (check(m, NULL, tp, &rep)) continue;
        CHECK_INT((int)rep.n, 6);
        expect(&rep, L0 "q_proj", QD_SRV_MACHETE, HID, HEADS * (NOPE + ROPE) / tp, tp);
        expect(&rep, L0 "kv_a_proj_with_mqa", QD_SRV_MARLIN, HID, KVLORA + ROPE, tp);
        expect(&rep, L0 "kv_b_proj", QD_SRV_MACHETE, KVLORA, HEADS * (NOPE + VHD) / tp, tp);
        expect(&rep, L0 "o_proj", QD_SRV_MACHETE, HEADS * VHD / tp, HID, tp);
        CHECK_INT(rep.n_slow, 0);
        qd_tp_serving_report_free(&rep);
    }
    qd_model_close(m);
}

/* Float linears, as a job's modules_to_not_convert leaves them. */
static const char *float_names;
static int some_float(void *ud, int block, int li)
{
    (void)block;
    const char *nm = qd_model_linear(ud, li)->name;
    const char *dot = strrchr(nm, '.');
    char key[64];
    snprintf(key, sizeof key, ",%s,", dot ? dot + 1 : nm);
    return strstr(float_names, key) != NULL;
}

/* q_a_proj float beside a quantized kv_a_proj_with_mqa: one fused layer with one scheme
 * cannot hold both, it does not load; both float: served in float. V2-Lite's q_proj float
 * beside a quantized kv_a_proj_with_mqa: two layers, both load. */
static void test_float_members(void)
{
    static const struct { int v; const char *floats, *row; int no_load, is_float; } cases[] = {
        {3, ",q_a_proj,", L0 "fused_qkv_a_proj (q_a_proj+kv_a_proj_with_mqa)", 1, 0},
        {3, ",kv_a_proj_with_mqa,", L0 "fused_qkv_a_proj (q_a_proj+kv_a_proj_with_mqa)", 1, 0},
        {3, ",q_a_proj,kv_a_proj_with_mqa,", L0 "fused_qkv_a_proj (q_a_proj+kv_a_proj_with_mqa)", 0, 1},
        {32, ",wq_b,", L0 "indexer.wq_b", 0, 1},
        {2, ",q_proj,", L0 "q_proj", 0, 1},
        {2, ",q_proj,", L0 "kv_a_proj_with_mqa", 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *dir = write_model(cases[i].v);
        qd_model *m = NULL;
        qd_err err = {0};
        if (!dir || qd_model_open(dir, be, &m, &err)) { TEST_FAIL_("%s", err.msg); continue; }
        float_names = cases[i].floats;
        for (int tp = 1; tp <= 8; tp *= 8) {
            qd_serving_report rep = {0};
            if (check(m, some_float, tp, &rep)) continue;
            const qd_serving_row *r = find(&rep, cases[i].row);
            if (r) {
                CHECK_INT(r->is_float, cases[i].is_float);
                CHECK_INT(!r->is_float && r->choice.kernel == QD_SRV_NO_LOAD, cases[i].no_load);
                if (cases[i].no_load) CHECK_CONTAINS(r->choice.why, "mixes float and quantized members");
                if (!cases[i].no_load && !cases[i].is_float) CHECK(r->choice.fast);
            }
            qd_tp_serving_report_free(&rep);
        }
        qd_model_close(m);
    }
}

/* The tiny transformers checkpoints (2 layers, 4 heads, hidden 64): every layer of the
 * attention named as vLLM builds it, and its experts and dense MLP as for other MoE models;
 * fused_qkv_a_proj's 96 rows (32 + 64) whole on every rank. */
static void test_tiny_families(void)
{
    static const struct { const char *family; int rows; const char *first; } fams[] = {
        {"deepseek_v2", 2 * 4 + 2 + 2 * 9, L0 "q_proj"},
        {"deepseek_v3", 2 * 4 + 2 + 2 * 9, L0 "fused_qkv_a_proj (q_a_proj+kv_a_proj_with_mqa)"},
        {"deepseek_v32", 2 * 6 + 2 + 2 * 9, L0 "fused_qkv_a_proj (q_a_proj+kv_a_proj_with_mqa)"},
    };
    for (size_t i = 0; i < sizeof fams / sizeof fams[0]; i++) {
        char dir[4200];
        snprintf(dir, sizeof dir, "%s/%s", pt_families_dir(), fams[i].family);
        qd_model *m = NULL;
        qd_err err = {0};
        if (qd_model_open(dir, be, &m, &err)) { TEST_FAIL_("%s: %s", dir, err.msg); continue; }
        for (int tp = 1; tp <= 4; tp *= 2) {
            qd_serving_report rep = {0};
            if (check(m, NULL, tp, &rep)) continue;
            /* The tiny checkpoints tie lm_head, which vLLM's DeepSeek never does: one more row. */
            CHECK_INT((int)rep.n, fams[i].rows + 1);
            CHECK_STR(rep.rows[0].name, fams[i].first);
            if (rep.n) {
                CHECK_STR(rep.rows[rep.n - 1].name, "lm_head");
                CHECK_INT(rep.rows[rep.n - 1].choice.kernel, QD_SRV_NO_LOAD);
            }
            const qd_serving_row *r = find(&rep, i ? L0 "fused_qkv_a_proj (q_a_proj+kv_a_proj_with_mqa)"
                                                   : L0 "kv_a_proj_with_mqa");
            if (r) CHECK_INT(r->out_shard, i ? 96 : 64);
            r = find(&rep, "model.layers.1.self_attn.kv_b_proj");
            if (r) CHECK_INT(r->out_shard, 128 / tp);
            qd_tp_serving_report_free(&rep);
        }
        qd_model_close(m);
    }
}

/* FP8 blocks of 128 (FP8_BLOCK): vLLM's validate_fp8_block_shape checks every member of a
 * merged layer but the last at tp 1, which is what fused_qkv_a_proj is at any tp: V3's
 * q_lora_rank 1536 is whole blocks, the tiny model's 32 is not, and it does not load. */
static void test_fp8_block(void)
{
    qd_serving_quant q = {.format = "float-quantized", .bits = 8, .sym = 1, .group_size = 128};
    const char *dirs[2] = {write_model(3), NULL};
    char tiny[4200];
    snprintf(tiny, sizeof tiny, "%s/deepseek_v3", pt_families_dir());
    dirs[1] = tiny;
    for (int i = 0; i < 2; i++) {
        qd_model *m = NULL;
        qd_err err = {0};
        if (!dirs[i] || qd_model_open(dirs[i], be, &m, &err)) { TEST_FAIL_("%s", err.msg); continue; }
        qd_serving_report rep = {0};
        if (!qd_tp_serving_check(m, &q, NULL, NULL, i ? 1 : 8, qd_srv_gpu_cc("hopper"), &rep, &err)) {
            const qd_serving_row *r = find(&rep, L0 "fused_qkv_a_proj (q_a_proj+kv_a_proj_with_mqa)");
            if (r && !i) CHECK_INT(r->choice.kernel, QD_SRV_BLOCK_FP8);
            if (r && i) CHECK_CONTAINS(r->choice.why, "member 1 of the fused layer has 32 output features per shard");
        } else {
            TEST_FAIL_("%s", err.msg);
        }
        qd_tp_serving_report_free(&rep);
        qd_model_close(m);
    }
}

/* V3.2's sparse attention has no vLLM backend on Ampere: refused by name. */
static void test_v32_ampere(void)
{
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/deepseek_v32", pt_families_dir());
    qd_model *m = NULL;
    qd_err err = {0};
    if (qd_model_open(dir, be, &m, &err)) { TEST_FAIL_("%s: %s", dir, err.msg); return; }
    qd_serving_quant q = {.format = "gptq", .bits = 4, .sym = 1, .group_size = 32};
    qd_serving_report rep = {0};
    CHECK_INT(qd_tp_serving_check(m, &q, NULL, NULL, 1, qd_srv_gpu_cc("ampere"), &rep, &err), QD_EUNSUPPORTED);
    CHECK_CONTAINS(err.msg, "DeepseekV32ForCausalLM's sparse attention has no vLLM backend before compute capability 9.0");
    CHECK_INT((int)rep.n, 0);
    qd_model_close(m);
}

int main(void)
{
    qd_err err = {0};
    if (qd_backend_cpu_open(1, NULL, &be, &err)) { fprintf(stderr, "cpu backend: %s\n", err.msg); return 1; }
    TEST_RUN(test_v3_rows);
    TEST_RUN(test_v2_rows);
    TEST_RUN(test_float_members);
    TEST_RUN(test_tiny_families);
    TEST_RUN(test_fp8_block);
    TEST_RUN(test_v32_ampere);
    qd_backend_close(be);
    return test_finish();
}
