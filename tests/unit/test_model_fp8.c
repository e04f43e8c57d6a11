/* FP8-block source checkpoints (issue #35, "Reading what the big models ship"): DeepSeek-V3,
 * Kimi-K2, Qwen3-*-FP8 and the like ship each linear as an F8_E4M3 weight with F32
 * weight_scale_inv blocks, and quantd reads them as they are.
 *
 * From transformers' tiny DeepSeek-V3 (latent attention, a dense layer, routed and shared
 * experts) and Qwen3 checkpoints (tests/data/families), qd_testgen_fp8 makes the FP8-block
 * checkpoint (blocks of 32 x 48, 128 x 128 and 48 x 40: none divides every shape) and its twin
 * with those linears dequantized to F32 as torch computes them. Then:
 * - every linear quantd loads from the FP8 checkpoint equals the twin's, bit for bit, and the
 *   estimate is the same for both;
 * - a GPTQ W4 job on each writes the same model.safetensors byte for byte, and the FP8 one's
 *   config.json carries the job's quantization_config, nothing of the source's;
 * - a damaged scale (wrong shape, NaN, missing, F16) or weight (a NaN code) is refused
 *   naming the tensor, and so are an F8 weight without an fp8 config, fmt other than e4m3, a
 *   missing weight_block_size, and gpt-oss (named as the family it is). */
#include "pipeline_testlib.h"
#include "quant/core/minifloat.h"
#include "quant/job/job.h"
#include "quant/model/block.h"
#include "quant/model/model_fp8.h"
#include "quant/pipeline/admission.h"

static const char *T;
static const char *tokens;

/* ---- config.json ---- */

static int parse_cfg(const char *quant, const char *arch, qd_model_config *c, qd_err *err)
{
    char json[2048];
    snprintf(json, sizeof json,
             "{\"architectures\":[\"%s\"],\"hidden_size\":64,\"intermediate_size\":128,\"num_hidden_layers\":2,"
             "\"num_attention_heads\":4,\"num_key_value_heads\":4,\"vocab_size\":256%s%s}",
             arch, quant ? ",\"quantization_config\":" : "", quant ? quant : "");
    memset(err, 0, sizeof *err);
    return qd_model_config_parse(json, "config.json", c, err);
}

static void test_config(void)
{
    qd_model_config c;
    qd_err err;
    CHECK_OK(parse_cfg("{\"quant_method\":\"fp8\",\"fmt\":\"e4m3\",\"activation_scheme\":\"dynamic\","
                       "\"weight_block_size\":[128,128]}", "LlamaForCausalLM", &c, &err));
    CHECK_INT(c.source_fp8, 1);
    CHECK_INT(c.quantized, 0);
    CHECK_INT(c.fp8_block_n, 128);
    CHECK_INT(c.fp8_block_k, 128);
    /* Qwen3-*-FP8 leave fmt out; modules_to_not_convert changes nothing that is read. */
    CHECK_OK(parse_cfg("{\"quant_method\":\"fp8\",\"activation_scheme\":\"dynamic\",\"weight_block_size\":[64,32],"
                       "\"modules_to_not_convert\":[\"lm_head\"]}", "Qwen3ForCausalLM", &c, &err));
    CHECK_INT(c.source_fp8, 1);
    CHECK_INT(c.fp8_block_n, 64);
    CHECK_INT(c.fp8_block_k, 32);
    CHECK_ERR(parse_cfg("{\"quant_method\":\"fp8\",\"fmt\":\"e5m2\",\"weight_block_size\":[128,128]}",
                        "LlamaForCausalLM", &c, &err));
    CHECK_CONTAINS(err.msg, "quantization_config.fmt \"e5m2\"");
    CHECK_ERR(parse_cfg("{\"quant_method\":\"fp8\",\"fmt\":\"e4m3\"}", "LlamaForCausalLM", &c, &err));
    CHECK_CONTAINS(err.msg, "quantization_config.weight_block_size is missing");
    static const char *bad_blocks[] = {"[128]", "[0,128]", "[128,-1]", "[128.5,128]", "\"128x128\"", "[128,128,1]"};
    for (size_t i = 0; i < sizeof bad_blocks / sizeof bad_blocks[0]; i++) {
        char q[200];
        snprintf(q, sizeof q, "{\"quant_method\":\"fp8\",\"weight_block_size\":%s}", bad_blocks[i]);
        CHECK_ERR(parse_cfg(q, "LlamaForCausalLM", &c, &err));
        CHECK_CONTAINS(err.msg, "weight_block_size must be two positive integers");
    }
    /* gpt-oss's MXFP4 experts are a source format of the gpt-oss family only. */
    CHECK_OK(parse_cfg("{\"quant_method\":\"mxfp4\",\"modules_to_not_convert\":[\"model.layers.*.self_attn\"]}",
                       "GptOssForCausalLM", &c, &err));
    CHECK_INT(c.source_mxfp4, 1);
    CHECK_INT(c.quantized, 0);
    CHECK_OK(parse_cfg(NULL, "GptOssForCausalLM", &c, &err));
    CHECK_ERR(parse_cfg("{\"quant_method\":\"mxfp4\"}", "LlamaForCausalLM", &c, &err));
    CHECK_CONTAINS(err.msg, "is read for GptOssForCausalLM only; this checkpoint is a LlamaForCausalLM");
}

/* ---- the decoding ---- */

static void test_dequant_ref(void)
{
    test_rng r;
    test_rng_seed(&r, 35);
    const int64_t n = 37, k = 70, bn = 16, bk = 32, sn = 3, sk = 3;
    uint8_t codes[37 * 70];
    float scales[9], full[37 * 70], split[37 * 70];
    for (int64_t i = 0; i < n * k; i++) codes[i] = (uint8_t)(test_rng_u64(&r) & 0xff);
    for (int64_t i = 0; i < n * k; i++) if ((codes[i] & 0x7f) == 0x7f) codes[i] = 0;   /* no NaN codes here */
    for (int64_t i = 0; i < sn * sk; i++) scales[i] = test_rng_uniform(&r) * 0.01f + 1e-4f;
    qd_fp8_block_dequant(codes, n, k, scales, bn, bk, 0, n, full);
    int bad = 0;
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < k; j++) {
            float want = qd_fp8_e4m3_to_f32(codes[i * k + j]) * scales[(i / bn) * sk + j / bk];
            bad += memcmp(&want, &full[i * k + j], sizeof want) != 0;
        }
    CHECK_INT(bad, 0);
    /* Any split of the rows gives the same bits. */
    qd_fp8_block_dequant(codes, n, k, scales, bn, bk, 0, 5, split);
    qd_fp8_block_dequant(codes, n, k, scales, bn, bk, 5, 21, split);
    qd_fp8_block_dequant(codes, n, k, scales, bn, bk, 21, n, split);
    CHECK(memcmp(full, split, sizeof full) == 0);
}

/* ---- tiny FP8 checkpoints ---- */

/* Every linear of every block of the models in a and b, bit for bit; returns the count. */
static int same_linears(const char *a, const char *b)
{
    qd_err err = {0};
    qd_model *ma = NULL, *mb = NULL;
    int n = 0;
    CHECK_OK(qd_model_open(a, pt_be, &ma, &err));
    if (err.msg[0]) fprintf(stderr, "%s\n", err.msg);
    CHECK_OK(qd_model_open(b, pt_be, &mb, &err));
    if (!ma || !mb) { qd_model_close(ma); qd_model_close(mb); return 0; }
    for (int blk = 0; blk < qd_model_cfg(ma)->n_layers; blk++) {
        qd_block_weights *wa = NULL, *wb = NULL;
        CHECK_OK(qd_block_load(ma, blk, &wa, &err));
        CHECK_OK(qd_block_load(mb, blk, &wb, &err));
        for (int li = 0; wa && wb && li < qd_model_n_linears(ma); li++) {
            if (!qd_model_block_has_linear(ma, blk, li)) continue;
            const qd_linear_info *L = qd_model_linear(ma, li);
            float *x = malloc((size_t)(L->n * L->k) * sizeof *x), *y = malloc((size_t)(L->n * L->k) * sizeof *y);
            CHECK_OK(qd_block_linear_get(ma, wa, li, x, NULL, &err));
            CHECK_OK(qd_block_linear_get(mb, wb, li, y, NULL, &err));
            if (memcmp(x, y, (size_t)(L->n * L->k) * sizeof *x)) TEST_FAIL_("block %d %s: the FP8 load differs", blk, L->name);
            test_checks++;
            n++;
            free(x);
            free(y);
        }
        qd_block_free(ma, wa);
        qd_block_free(mb, wb);
    }
    qd_model_close(ma);
    qd_model_close(mb);
    return n;
}

/* config.json without its dtype lines (the FP8 source's float tensors are BF16, the twin's
 * linears F32, and the output names the source's bulk dtype). */
static cJSON *config_sans_dtype(const char *dir)
{
    cJSON *c = pt_read_json(test_path(dir, "config.json"));
    cJSON_DeleteItemFromObjectCaseSensitive(c, "dtype");
    cJSON_DeleteItemFromObjectCaseSensitive(c, "torch_dtype");
    return c;
}

/* An F32 copy of the checkpoint in src (every float tensor, and config.json's dtype). */
static int to_f32(const char *src, const char *dst)
{
    qd_err err = {0};
    st_model *sm = NULL;
    st_writer *w = NULL;
    int rc = qd_fs_mkdir_p(dst, &err);
    if (!rc) rc = st_model_open(src, &sm, &err);
    if (!rc && st_writer_init(&w)) rc = QD_ENOMEM;
    for (size_t i = 0; i < st_model_count(sm) && !rc; i++) {
        const st_tensor *t = st_model_tensor(sm, i);
        float *f = malloc((t->numel ? t->numel : 1) * sizeof *f);
        if (!(rc = st_tensor_read_f32(t, f, &err))) rc = st_writer_add_copy(w, t->name, QD_DTYPE_F32, t->ndim, t->shape, f, &err);
        free(f);
    }
    if (!rc) rc = st_writer_write(w, test_path(dst, "model.safetensors"), &err);
    st_writer_free(w);
    st_model_close(sm);
    cJSON *c = pt_read_json(test_path(src, "config.json"));
    cJSON_DeleteItemFromObjectCaseSensitive(c, "dtype");
    cJSON_DeleteItemFromObjectCaseSensitive(c, "torch_dtype");
    cJSON_AddStringToObject(c, "dtype", "float32");
    char *text = c ? cJSON_Print(c) : NULL;
    cJSON_Delete(c);
    if (!rc && text) rc = qd_fs_write_atomic(test_path(dst, "config.json"), text, strlen(text), &err);
    free(text);
    if (rc) TEST_FAIL_("F32 copy of %s: %s", src, err.msg);
    return rc;
}

/* dtype_f32: the checkpoint's float tensors (embeddings, norms, the router) in F32 rather
 * than transformers' BF16. The loads compare either way; the quantized outputs are compared
 * byte for byte on the F32 one, because a job rounds the activations between blocks to BF16
 * when the source's float bulk is half precision (pipeline_block.c), which the FP8 source's
 * is (its F8 weights aside) and the twin's, with F32 linears, is not. */
static void run_source(const char *family, int64_t bn, int64_t bk, int expect_moe, int dtype_f32)
{
    char src[4400], fp8[4400], twin[4400], o8[4400], ot[4400];
    snprintf(src, sizeof src, "%s/%s", pt_families_dir(), family);
    if (dtype_f32) {
        char f32[4400];
        snprintf(f32, sizeof f32, "%s/%s-src-f32", T, family);
        if (to_f32(src, f32)) return;
        snprintf(src, sizeof src, "%s", f32);
    }
    snprintf(fp8, sizeof fp8, "%.3000s/%s-fp8-%lldx%lld%s", T, family, (long long)bn, (long long)bk, dtype_f32 ? "-f32" : "");
    snprintf(twin, sizeof twin, "%.3000s/%s-twin-%lldx%lld%s", T, family, (long long)bn, (long long)bk, dtype_f32 ? "-f32" : "");
    snprintf(o8, sizeof o8, "%.4000s-w4", fp8);
    snprintf(ot, sizeof ot, "%.4000s-w4", twin);
    qd_err err = {0};
    CHECK_OK(qd_testgen_fp8(src, fp8, bn, bk, twin, pt_be, &err));
    if (err.msg[0]) { TEST_FAIL_("%s: %s", family, err.msg); return; }
    /* What the file holds: F8 weights, F32 scales of the block grid, the router in float. */
    st_model *sm = NULL;
    CHECK_OK(st_model_open(fp8, &sm, &err));
    const st_tensor *w = sm ? st_model_find(sm, "model.layers.0.self_attn.o_proj.weight") : NULL;
    const st_tensor *s = sm ? st_model_find(sm, "model.layers.0.self_attn.o_proj.weight_scale_inv") : NULL;
    CHECK(w && s);
    if (w && s) {
        CHECK_INT(w->dtype, QD_DTYPE_F8_E4M3);
        CHECK_INT(s->dtype, QD_DTYPE_F32);
        CHECK_INT(s->shape[0], (w->shape[0] + bn - 1) / bn);
        CHECK_INT(s->shape[1], (w->shape[1] + bk - 1) / bk);
    }
    if (expect_moe) {
        const st_tensor *g = sm ? st_model_find(sm, "model.layers.1.mlp.gate.weight") : NULL;
        CHECK(g && g->dtype != QD_DTYPE_F8_E4M3);
        CHECK(sm && st_model_find(sm, "model.layers.1.mlp.experts.3.down_proj.weight_scale_inv"));
        CHECK(sm && st_model_find(sm, "model.layers.1.self_attn.kv_b_proj.weight_scale_inv"));
    }
    st_model_close(sm);
    int nl = same_linears(fp8, twin);
    printf("%-12s blocks %3lldx%-3lld %s  %d linears load as the F32 twin's\n", family, (long long)bn, (long long)bk,
           dtype_f32 ? "F32 rest " : "BF16 rest", nl);
    CHECK(nl >= (expect_moe ? 30 : 14));
    if (!dtype_f32) {
        /* As the real checkpoints: the job's output keeps the BF16 rest, named so. */
        qp_job *r8 = pt_run_job(family, fp8, o8, "rtn", "gptq", NULL, "\"bits\":4,");
        cJSON *c8 = r8 ? pt_read_json(test_path(o8, "config.json")) : NULL;
        const cJSON *dt = c8 ? cJSON_GetObjectItemCaseSensitive(c8, "dtype") : NULL;
        CHECK(cJSON_IsString(dt) && !strcmp(dt->valuestring, "bfloat16"));
        cJSON_Delete(c8);
        qp_job_free(r8);
        return;
    }

    /* The estimate counts the F32 block the loader makes, not the file's bytes. */
    const char *extra = "\"bits\":4,\"compute\":\"f32\",";
    qp_job *j8 = pt_job(fp8, o8, "gptq", "gptq", tokens, extra), *jt = pt_job(twin, ot, "gptq", "gptq", tokens, extra);
    CHECK(j8 && jt);
    if (!j8 || !jt) { qp_job_free(j8); qp_job_free(jt); return; }
    qd_pipeline_estimate e8, et;
    CHECK_OK(qd_pipeline_estimate_job(j8, &e8, &err));
    CHECK_OK(qd_pipeline_estimate_job(jt, &et, &err));
    CHECK_INT(e8.peak_ram_bytes, et.peak_ram_bytes);
    CHECK_INT(e8.disk_bytes, et.disk_bytes);
    qp_job_free(j8);
    qp_job_free(jt);

    /* W4A16 from either source: the same bytes. */
    qp_job *r8 = pt_run_job(family, fp8, o8, "gptq", "gptq", tokens, extra);
    qp_job *rt = pt_run_job(family, twin, ot, "gptq", "gptq", tokens, extra);
    if (r8 && rt) {
        CHECK(pt_same_file(test_path(o8, "model.safetensors"), test_path(ot, "model.safetensors")));
        CHECK(pt_same_file(test_path(o8, "quantize_config.json"), test_path(ot, "quantize_config.json")));
        cJSON *c8 = config_sans_dtype(o8), *ct = config_sans_dtype(ot);
        CHECK(c8 && ct && cJSON_Compare(c8, ct, 1));
        const cJSON *q = cJSON_GetObjectItemCaseSensitive(c8, "quantization_config");
        CHECK(q && cJSON_IsObject(q));
        char *qs = q ? cJSON_PrintUnformatted(q) : NULL;
        CHECK(qs && !strstr(qs, "fp8") && !strstr(qs, "weight_block_size") && !strstr(qs, "e4m3") &&
              !strstr(qs, "activation_scheme"));
        CHECK_CONTAINS(qs, "\"quant_method\":\"gptq\"");
        free(qs);
        cJSON_Delete(c8);
        cJSON_Delete(ct);
        /* No source scale survives in the output. */
        st_model *om = NULL;
        CHECK_OK(st_model_open(o8, &om, &err));
        for (size_t i = 0; om && i < st_model_count(om); i++)
            if (strstr(st_model_tensor(om, i)->name, "scale_inv") || st_model_tensor(om, i)->dtype == QD_DTYPE_F8_E4M3)
                TEST_FAIL_("%s: the output holds %s", family, st_model_tensor(om, i)->name);
        st_model_close(om);
    }
    qp_job_free(r8);
    qp_job_free(rt);
}

static void test_deepseek_v3(void)
{
    run_source("deepseek_v3", 32, 48, 1, 0);
    run_source("deepseek_v3", 32, 48, 1, 1);
    run_source("deepseek_v3", 128, 128, 1, 1);
}

static void test_qwen3(void)
{
    run_source("qwen3", 48, 40, 0, 0);
    run_source("qwen3", 48, 40, 0, 1);
}

static const char *open_and_load(const char *dir, qd_err *err);

/* A compressed-tensors FP8 checkpoint (quantd's FP8_DYNAMIC output) as a source: quantized
 * again to GPTQ with o_proj kept in float, the output holds no tensor of the source's format
 * (weight_scale and the F8 weights) and its float linear dequantized, and it loads. */
static void test_ct_fp8_source(void)
{
    char src[4400], o1[4400], o2[4400];
    snprintf(src, sizeof src, "%s/qwen3", pt_families_dir());
    snprintf(o1, sizeof o1, "%.4000s/qwen3-ct-fp8", T);
    snprintf(o2, sizeof o2, "%.4000s/qwen3-ct-fp8-w4", T);
    qp_job *j1 = pt_run_job("qwen3 FP8_DYNAMIC", src, o1, "rtn", "float-quantized", NULL, "\"scheme\":\"FP8_DYNAMIC\",");
    qp_job *j2 = j1 ? pt_run_job("qwen3 FP8 -> w4", o1, o2, "rtn", "gptq", NULL,
                                 "\"bits\":4,\"modules_to_not_convert\":[\"o_proj\"],") : NULL;
    CHECK(j1 && j2);
    qd_err err = {0};
    st_model *om = NULL;
    if (j2) CHECK_OK(st_model_open(o2, &om, &err));
    int n_float_o = 0;
    for (size_t i = 0; om && i < st_model_count(om); i++) {
        const st_tensor *t = st_model_tensor(om, i);
        if (t->dtype == QD_DTYPE_F8_E4M3 || strstr(t->name, "weight_scale") || strstr(t->name, "input_scale"))
            TEST_FAIL_("ct fp8 source: the output holds %s", t->name);
        if (strstr(t->name, "o_proj.weight")) n_float_o += t->dtype == QD_DTYPE_F32 || t->dtype == QD_DTYPE_BF16 ||
                                                          t->dtype == QD_DTYPE_F16;
    }
    st_model_close(om);
    CHECK(n_float_o > 0);
    if (j2) CHECK_STR(open_and_load(o2, &err), "");
    qp_job_free(j1);
    qp_job_free(j2);
}

/* ---- damaged checkpoints ---- */

enum damage { D_RESHAPE, D_DROP, D_F16, D_NAN_SCALE, D_NAN_CODE, D_NO_CONFIG };

/* A copy of the FP8 checkpoint src in dst with tensor `name` damaged. */
static int damaged(const char *src, const char *dst, const char *name, enum damage how)
{
    qd_err err = {0};
    st_model *sm = NULL;
    st_writer *w = NULL;
    if (qd_fs_mkdir_p(dst, &err) || st_model_open(src, &sm, &err) || st_writer_init(&w)) {
        st_model_close(sm);
        TEST_FAIL_("damaged copy: %s", err.msg);
        return -1;
    }
    int rc = 0;
    for (size_t i = 0; i < st_model_count(sm) && !rc; i++) {
        const st_tensor *t = st_model_tensor(sm, i);
        int64_t shape[2] = {t->shape[0], t->ndim > 1 ? t->shape[1] : 0};
        if (strcmp(t->name, name)) {
            rc = st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data, &err);
            continue;
        }
        if (how == D_DROP) continue;
        if (how == D_RESHAPE) {
            int64_t flat[2] = {1, (int64_t)t->numel};
            rc = st_writer_add(w, t->name, t->dtype, 2, flat, t->data, &err);
        } else if (how == D_F16) {
            float *f = malloc(t->numel * sizeof *f);
            uint16_t *h = malloc(t->numel * sizeof *h);
            st_tensor_read_f32(t, f, &err);
            for (uint64_t j = 0; j < t->numel; j++) h[j] = qd_f32_to_f16(f[j]);
            rc = st_writer_add_copy(w, t->name, QD_DTYPE_F16, t->ndim, shape, h, &err);
            free(f);
            free(h);
        } else if (how == D_NAN_SCALE) {
            float *f = malloc(t->numel * sizeof *f);
            memcpy(f, t->data, t->numel * sizeof *f);
            f[t->numel - 1] = NAN;
            rc = st_writer_add_copy(w, t->name, t->dtype, t->ndim, shape, f, &err);
            free(f);
        } else if (how == D_NAN_CODE) {
            uint8_t *c = malloc(t->numel);
            memcpy(c, t->data, t->numel);
            c[3] = 0xff;
            rc = st_writer_add_copy(w, t->name, t->dtype, t->ndim, shape, c, &err);
            free(c);
        } else {
            rc = st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data, &err);
        }
    }
    if (!rc) rc = st_writer_write(w, test_path(dst, "model.safetensors"), &err);
    st_writer_free(w);
    st_model_close(sm);
    /* config.json: as it is, or without its quantization_config. */
    cJSON *c = pt_read_json(test_path(src, "config.json"));
    if (how == D_NO_CONFIG) cJSON_DeleteItemFromObjectCaseSensitive(c, "quantization_config");
    char *text = c ? cJSON_Print(c) : NULL;
    cJSON_Delete(c);
    if (!rc && text) rc = qd_fs_write_atomic(test_path(dst, "config.json"), text, strlen(text), &err);
    free(text);
    if (rc) TEST_FAIL_("damaged copy: %s", err.msg);
    return rc;
}

/* Opens dir and loads every block: the first error, or "" when all loaded. */
static const char *open_and_load(const char *dir, qd_err *err)
{
    memset(err, 0, sizeof *err);
    qd_model *m = NULL;
    if (qd_model_open(dir, pt_be, &m, err)) return err->msg;
    for (int b = 0; b < qd_model_cfg(m)->n_layers; b++) {
        qd_block_weights *bw = NULL;
        if (qd_block_load(m, b, &bw, err)) break;
        qd_block_free(m, bw);
    }
    qd_model_close(m);
    return err->msg;
}

static void test_damaged(void)
{
    char src[4200], fp8[4400], dst[4400];
    snprintf(src, sizeof src, "%s/deepseek_v3", pt_families_dir());
    snprintf(fp8, sizeof fp8, "%s/damage-src", T);
    qd_err err = {0};
    CHECK_OK(qd_testgen_fp8(src, fp8, 32, 32, NULL, pt_be, &err));
    const char *sname = "model.layers.1.mlp.experts.5.up_proj.weight_scale_inv";
    const char *wname = "model.layers.0.self_attn.kv_b_proj.weight";
    struct { enum damage how; const char *name, *want, *want2; } cases[] = {
        {D_RESHAPE, "model.layers.1.mlp.experts.5.down_proj.weight_scale_inv",
         "tensor 'model.layers.1.mlp.experts.5.down_proj.weight_scale_inv': shape [1, 2] does not match [2, 1]", NULL},
        {D_RESHAPE, "model.layers.0.self_attn.o_proj.weight_scale_inv",
         "tensor 'model.layers.0.self_attn.o_proj.weight_scale_inv': shape [1, 4] does not match [2, 2]", "weight_block_size"},
        {D_DROP, sname, "tensor 'model.layers.1.mlp.experts.5.up_proj.weight_scale_inv' is missing", NULL},
        {D_F16, sname, "tensor 'model.layers.1.mlp.experts.5.up_proj.weight_scale_inv': dtype F16 is not F32 or BF16", NULL},
        {D_NAN_SCALE, "model.layers.0.self_attn.o_proj.weight_scale_inv",
         "tensor 'model.layers.0.self_attn.o_proj.weight_scale_inv': element [1][1] is NaN", NULL},
        {D_NAN_CODE, wname, "tensor 'model.layers.0.self_attn.kv_b_proj.weight (FP8, dequantized)': element [0][3] is NaN", NULL},
        {D_NO_CONFIG, wname, "dtype F8_E4M3, but config.json's quantization_config does not say how it is scaled", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(dst, sizeof dst, "%s/damage-%zu", T, i);
        if (damaged(fp8, dst, cases[i].name, cases[i].how)) continue;
        const char *msg = open_and_load(dst, &err);
        CHECK_CONTAINS(msg, cases[i].want);
        if (cases[i].want2) CHECK_CONTAINS(msg, cases[i].want2);
    }
    /* A linear the job leaves in float is written dequantized, in the model's float dtype
     * (its FP8 codes mean nothing without the source's scales, which the output leaves
     * out), and the output loads. */
    char out[4400];
    snprintf(out, sizeof out, "%s/float-left", T);
    qp_job *job = pt_job(fp8, out, "rtn", "gptq", NULL, "\"bits\":4,\"modules_to_not_convert\":[\"kv_b_proj\"],");
    CHECK(job != NULL);
    if (job) {
        CHECK_OK(qd_pipeline_run(job, pt_be, NULL, &err));
        st_model *om = NULL;
        CHECK_OK(st_model_open(out, &om, &err));
        const st_tensor *kv = om ? st_model_find(om, "model.layers.1.self_attn.kv_b_proj.weight") : NULL;
        CHECK(kv != NULL && kv->dtype != QD_DTYPE_F8_E4M3);
        for (size_t i = 0; om && i < st_model_count(om); i++)
            if (strstr(st_model_tensor(om, i)->name, "scale_inv") || st_model_tensor(om, i)->dtype == QD_DTYPE_F8_E4M3)
                TEST_FAIL_("float-left: the output holds %s", st_model_tensor(om, i)->name);
        st_model_close(om);
        CHECK_STR(open_and_load(out, &err), "");
        qp_job_free(job);
    }
}

int main(void)
{
    if (pt_setup(2, 4000, 256, 35, &T, &tokens)) return 1;
    TEST_RUN(test_config);
    TEST_RUN(test_dequant_ref);
    TEST_RUN(test_deepseek_v3);
    TEST_RUN(test_qwen3);
    TEST_RUN(test_damaged);
    TEST_RUN(test_ct_fp8_source);
    return pt_teardown();
}
