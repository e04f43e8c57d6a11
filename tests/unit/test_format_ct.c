/* The compressed-tensors format (issue #17 part 2) and the format descriptor's rules:
 *   - job settings: 4/8 bits only, act-order only with static groups (the reason names the
 *     compressed-tensors package), group -1 allowed; defaults of the other formats unchanged;
 *   - packing: every tensor decoded by hand from ../shared/ref/compressed-tensors.md (a
 *     decoder written here, not the format's) equals dequant_ref exactly; read() of the
 *     written tensors gives back the same packed layer; refusals;
 *   - quantization_config as compressed-tensors writes it, and detect() of it and of bad ones;
 *   - whole jobs for every method: the output holds weight_packed/weight_scale/weight_shape
 *     (+ weight_zero_point when asymmetric), no .weight for quantized linears, an `ignore`
 *     list, and every linear loads back as exactly the same job written as gptq_v2 decodes
 *     to, rounded to F16 (the same integers in the transposed layout; compressed-tensors
 *     computes in the scale dtype). */
#include "pipeline_testlib.h"

#include <string.h>

#include "quant/formats/format.h"
#include "quant/model/block.h"

static const char *T;
static const char *tokens;
static char llama_dir[4096];

static const qd_format *ct(void) { return qd_format_find("compressed-tensors"); }

static void test_settings(void)
{
    const qd_format *f = ct();
    CHECK(f != NULL);
    if (!f) return;
    const char *field = NULL;
    char msg[512];
    qd_fmt_settings s = {.bits = 4, .group_size = 128, .sym = 1};
    CHECK_OK(qd_format_check_settings(f, &s, &field, msg, sizeof msg));
    s.bits = 8; s.sym = 0; s.group_size = -1;
    CHECK_OK(qd_format_check_settings(f, &s, &field, msg, sizeof msg));
    s.bits = 3;
    CHECK_ERR(qd_format_check_settings(f, &s, &field, msg, sizeof msg));
    CHECK_STR(field, "format");
    CHECK_STR(msg, "compressed-tensors holds 4- or 8-bit weights only, but job.bits is 3; use format gptq or gptq_v2");
    s.bits = 4; s.desc_act = 1; s.static_groups = 0;
    CHECK_ERR(qd_format_check_settings(f, &s, &field, msg, sizeof msg));
    CHECK_STR(field, "static_groups");
    CHECK_CONTAINS(msg, "refuses actorder \"group\" with a g_idx");
    s.static_groups = 1;
    CHECK_OK(qd_format_check_settings(f, &s, &field, msg, sizeof msg));
    /* The older formats' rules, now from their descriptors. */
    s = (qd_fmt_settings){.bits = 3, .group_size = 128};
    CHECK_ERR(qd_format_check_settings(qd_format_find("awq_gemm"), &s, &field, msg, sizeof msg));
    CHECK_STR(msg, "awq_gemm holds 4-bit weights only, but job.bits is 3; use format gptq or gptq_v2");
    s.bits = 8;
    CHECK_ERR(qd_format_check_settings(qd_format_find("awq_gemm"), &s, &field, msg, sizeof msg));
    CHECK_STR(msg, "awq_gemm holds 4-bit weights only, but job.bits is 8; use format gptq, gptq_v2 or compressed-tensors");
    s = (qd_fmt_settings){.bits = 3, .group_size = 128, .desc_act = 1};
    CHECK_OK(qd_format_check_settings(qd_format_find("gptq"), &s, &field, msg, sizeof msg));
    /* Defaults: awq's own format at 4 bits, gptq otherwise; compressed-tensors only when asked. */
    CHECK_STR(qd_format_at((size_t)qd_format_default(QD_FMT_METHOD_AWQ, 4))->name, "awq_gemm");
    CHECK_STR(qd_format_at((size_t)qd_format_default(QD_FMT_METHOD_AWQ_GPTQ, 3))->name, "gptq");
    CHECK_STR(qd_format_at((size_t)qd_format_default(QD_FMT_METHOD_RTN, 4))->name, "gptq");
    CHECK_STR(qd_format_at((size_t)qd_format_default(QD_FMT_METHOD_GPTQ, 8))->name, "gptq");
    char why[160];
    CHECK(qd_format_misfit(f, 64, 48, 32, why, sizeof why));
    CHECK_CONTAINS(why, "not a multiple of group_size 32");
    CHECK(qd_format_misfit(f, 40, 64, 32, why, sizeof why));
    CHECK_CONTAINS(why, "32-value blocks");
    CHECK(!qd_format_misfit(f, 32, 64, -1, why, sizeof why));
}

/* A random layer: codes, zeros (2^(b-1) when sym), F16-exact scales. */
static void make_layer(qd_qlayer *l, int bits, int64_t gs, int sym, int64_t n, int64_t k, uint64_t seed)
{
    qd_err err = {0};
    CHECK_OK(qd_qlayer_alloc(l, n, k, bits, sym, gs, 0, &err));
    test_rng r;
    test_rng_seed(&r, seed);
    const int maxq = (1 << bits) - 1;
    for (int64_t i = 0; i < n * k; i++) l->q[i] = (uint8_t)(test_rng_u64(&r) % (uint64_t)(maxq + 1));
    for (int64_t i = 0; i < l->n_groups * n; i++) {
        l->scales[i] = qd_f16_to_f32(qd_f32_to_f16(0.001f + 0.03f * test_rng_uniform(&r)));
        l->zeros[i] = sym ? 1 << (bits - 1) : (int32_t)(test_rng_u64(&r) % (uint64_t)(maxq + 1));
    }
}

static const qd_fmt_tensor *tfind(const qd_fmt_tensor *t, int n, const char *suffix)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(t[i].suffix, suffix)) return &t[i];
    return NULL;
}

typedef struct tens_set { const qd_fmt_tensor *t; int n; } tens_set;

static int set_find(void *ud, const char *suffix, qd_fmt_tensor *out)
{
    const tens_set *s = ud;
    const qd_fmt_tensor *t = tfind(s->t, s->n, suffix);
    if (!t) return 0;
    *out = *t;
    out->owned = NULL;
    return 1;
}

/* Decodes code k of a row-major LSB-first stream of b-bit values (compressed-tensors.md 1.3). */
static uint32_t stream_get(const int32_t *row, int b, int64_t idx)
{
    int64_t bit = idx * b;
    uint32_t w = (uint32_t)row[bit / 32] >> (bit % 32);
    if (bit % 32 + b > 32) w |= (uint32_t)row[bit / 32 + 1] << (32 - bit % 32);
    return w & ((1u << b) - 1u);
}

static void one_layer(int bits, int64_t gs, int sym, int64_t n, int64_t k, uint64_t seed)
{
    const qd_format *f = ct();
    qd_err err = {0};
    qd_qlayer l;
    make_layer(&l, bits, gs, sym, n, k, seed);
    qd_packed p;
    memset(&p, 0, sizeof p);
    CHECK_OK(f->pack(&l, &p, &err));
    qd_fmt_tensor t[QD_FMT_MAX_TENSORS];
    int nt = 0;
    CHECK_OK(f->tensors(&p, t, &nt, &err));
    CHECK_INT(nt, sym ? 3 : 4);
    const int64_t g = l.n_groups, rw = k * bits / 32, nw = n * bits / 32;
    const qd_fmt_tensor *wp = tfind(t, nt, "weight_packed"), *ws = tfind(t, nt, "weight_scale"),
                        *wsh = tfind(t, nt, "weight_shape"), *wz = tfind(t, nt, "weight_zero_point");
    CHECK(wp && ws && wsh && (sym ? wz == NULL : wz != NULL));
    if (!wp || !ws || !wsh || (!sym && !wz)) goto done;
    CHECK(wp->dtype == QD_DTYPE_I32 && wp->ndim == 2 && wp->shape[0] == n && wp->shape[1] == rw);
    CHECK(ws->dtype == QD_DTYPE_F16 && ws->ndim == 2 && ws->shape[0] == n && ws->shape[1] == g);
    CHECK(wsh->dtype == QD_DTYPE_I64 && wsh->ndim == 1 && wsh->shape[0] == 2);
    CHECK(((const int64_t *)wsh->data)[0] == n && ((const int64_t *)wsh->data)[1] == k);
    if (wz) CHECK(wz->dtype == QD_DTYPE_I32 && wz->ndim == 2 && wz->shape[0] == nw && wz->shape[1] == g);
    /* Hand decode from the spec vs the qlayer and vs dequant_ref: exact. */
    float *ref = malloc((size_t)(n * k) * sizeof *ref);
    CHECK_OK(f->dequant_ref(&p, ref, &err));
    int bad = 0;
    for (int64_t r = 0; r < n && bad < 5; r++)
        for (int64_t c = 0; c < k && bad < 5; c++) {
            int64_t gi = gs > 0 ? c / gs : 0;
            uint32_t u = stream_get((const int32_t *)wp->data + r * rw, bits, c);
            /* zero points: column gi of [nw, G] is a stream of N codes along dim 0. */
            uint32_t z = 1u << (bits - 1);
            if (wz) {
                int64_t bit = r * bits;
                uint32_t word = (uint32_t)((const int32_t *)wz->data)[(bit / 32) * g + gi];
                z = (word >> (bit % 32)) & ((1u << bits) - 1u);
            }
            float scale = qd_f16_to_f32(((const uint16_t *)ws->data)[r * g + gi]);
            /* In the scale's dtype (F16), as the package's _dequantize computes. */
            float w = qd_f32_round_f16(scale * ((float)u - (float)z));
            if (u != l.q[r * k + c] || z != (uint32_t)l.zeros[gi * n + r] || w != ref[r * k + c]) {
                TEST_FAIL_("ct %d-bit g%lld sym %d: [%lld, %lld] u %u (q %d) z %u (zero %d) w %g ref %g", bits,
                           (long long)gs, sym, (long long)r, (long long)c, u, l.q[r * k + c], z, l.zeros[gi * n + r],
                           (double)w, (double)ref[r * k + c]);
                bad++;
            }
        }
    test_checks++;
    /* read() of the written tensors: the same packed layer, the same decode. */
    tens_set set = {t, nt};
    qd_fmt_detected d = {.bits = bits, .group_size = gs, .sym = sym};
    qd_packed back;
    CHECK_OK(f->read(set_find, &set, n, k, &d, &back, &err));
    float *w2 = malloc((size_t)(n * k) * sizeof *w2);
    CHECK_OK(f->dequant_ref(&back, w2, &err));
    CHECK(!memcmp(back.qweight, p.qweight, (size_t)(rw * n) * 4));
    CHECK(!memcmp(back.qzeros, p.qzeros, (size_t)(g * nw) * 4));
    CHECK(!memcmp(back.scales, p.scales, (size_t)(g * n) * 2));
    CHECK(!memcmp(w2, ref, (size_t)(n * k) * sizeof *w2));
    /* A symmetric read of an asymmetric layer would decode other weights: zero points matter. */
    qd_packed_free(&back);
    free(w2);
    free(ref);
done:
    qd_fmt_tensors_free(t, nt);
    qd_packed_free(&p);
    qd_qlayer_free(&l);
}

static void test_pack_layers(void)
{
    uint64_t seed = 1;
    for (int sym = 0; sym < 2; sym++) {
        one_layer(4, 32, sym, 64, 128, seed++);
        one_layer(4, -1, sym, 96, 64, seed++);
        one_layer(8, 64, sym, 32, 128, seed++);
        one_layer(8, -1, sym, 64, 96, seed++);
    }
    /* Refusals: a symmetric layer whose zero is not 2^(b-1); an act-order g_idx. */
    qd_err err = {0};
    qd_qlayer l;
    qd_packed p;
    memset(&p, 0, sizeof p);
    make_layer(&l, 4, 32, 1, 32, 64, 99);
    l.zeros[3] = 7;
    CHECK_ERR(ct()->pack(&l, &p, &err));
    CHECK_CONTAINS(err.msg, "symmetric stores no zero point");
    l.zeros[3] = 8;
    l.g_idx[0] = 1;
    l.g_idx[40] = 0;
    CHECK_ERR(ct()->pack(&l, &p, &err));
    CHECK_CONTAINS(err.msg, "stores no g_idx");
    qd_qlayer_free(&l);
    make_layer(&l, 3, 32, 0, 32, 64, 98);
    CHECK_ERR(ct()->pack(&l, &p, &err));
    CHECK_CONTAINS(err.msg, "3-bit");
    qd_qlayer_free(&l);
}

static void test_config(void)
{
    const char *floats[] = {"model.layers.0.mlp.down_proj"};
    qd_fmt_config_in in = {.s = {.bits = 4, .group_size = 128, .sym = 0, .desc_act = 1, .static_groups = 1},
                           .float_modules = floats, .n_float = 1};
    cJSON *q = ct()->quant_config(&in);
    CHECK(q != NULL);
    if (!q) return;
    char *text = cJSON_PrintUnformatted(q);
    CHECK_STR(text,
              "{\"config_groups\":{\"group_0\":{\"format\":\"pack-quantized\",\"input_activations\":null,"
              "\"output_activations\":null,\"targets\":[\"Linear\"],\"weights\":{\"actorder\":\"weight\","
              "\"dynamic\":false,\"group_size\":128,\"num_bits\":4,\"strategy\":\"group\",\"symmetric\":false,"
              "\"type\":\"int\"}}},\"format\":\"pack-quantized\",\"global_compression_ratio\":null,"
              "\"ignore\":[\"lm_head\",\"model.layers.0.mlp.down_proj\"],\"kv_cache_scheme\":null,"
              "\"quant_method\":\"compressed-tensors\",\"quantization_status\":\"compressed\","
              "\"sparsity_config\":{},\"transform_config\":{},\"version\":\"0.20.0\"}");
    free(text);
    const qd_format *f = NULL;
    qd_fmt_detected d;
    qd_err err = {0};
    CHECK_OK(qd_format_detect(q, "cfg", &f, &d, &err));
    CHECK(f == ct());
    CHECK(d.bits == 4 && d.group_size == 128 && d.sym == 0 && d.desc_act == 1);
    cJSON_Delete(q);
    in.s = (qd_fmt_settings){.bits = 8, .group_size = -1, .sym = 1};
    q = ct()->quant_config(&in);
    CHECK_OK(qd_format_detect(q, "cfg", &f, &d, &err));
    CHECK(d.bits == 8 && d.group_size == -1 && d.sym == 1 && d.desc_act == 0);
    cJSON *w = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(q, "config_groups"), "group_0"), "weights");
    CHECK_STR(cJSON_GetObjectItem(w, "strategy")->valuestring, "channel");
    /* What quantd does not read is refused, naming it. */
    cJSON_ReplaceItemInObject(w, "actorder", cJSON_CreateString("group"));
    CHECK_ERR(qd_format_detect(q, "cfg", &f, &d, &err));
    CHECK_CONTAINS(err.msg, "actorder \"group\" (weight_g_idx) is not read");
    cJSON_ReplaceItemInObject(w, "actorder", cJSON_CreateNull());
    cJSON_ReplaceItemInObject(q, "quantization_status", cJSON_CreateString("frozen"));
    CHECK_ERR(qd_format_detect(q, "cfg", &f, &d, &err));
    CHECK_CONTAINS(err.msg, "quantization_status \"frozen\"");
    cJSON_ReplaceItemInObject(q, "quantization_status", cJSON_CreateString("compressed"));
    cJSON_ReplaceItemInObject(q, "format", cJSON_CreateString("int-quantized"));
    cJSON_DeleteItemFromObject(cJSON_GetObjectItem(cJSON_GetObjectItem(q, "config_groups"), "group_0"), "format");
    CHECK_ERR(qd_format_detect(q, "cfg", &f, &d, &err));
    CHECK_CONTAINS(err.msg, "\"int-quantized\" is not read");
    cJSON_Delete(q);
    q = cJSON_Parse("{\"quant_method\":\"bitsandbytes\"}");
    CHECK_ERR(qd_format_detect(q, "cfg", &f, &d, &err));
    CHECK_STR(err.msg, "cfg: quantization_config.quant_method \"bitsandbytes\" is not supported (gptq, awq, compressed-tensors)");
    cJSON_Delete(q);
}

static qp_job *mk_job(const char *out, const char *method, const char *format, int gs, const char *extra)
{
    char buf[8192], cal[4400] = "";
    if (strcmp(method, "rtn"))
        snprintf(cal, sizeof cal, "\"calibration\":{\"path\":\"%s\",\"samples\":8,\"seq_len\":32},", tokens);
    snprintf(buf, sizeof buf, "{%s%s\"model\":\"%s\",\"output\":\"%s\",\"method\":\"%s\",\"format\":\"%s\","
             "\"group_size\":%d}", cal, extra, llama_dir, out, method, format, gs);
    qp_job *job = NULL;
    qp_err perr;
    memset(&perr, 0, sizeof perr);
    if (qp_job_parse(buf, strlen(buf), &job, &perr)) fprintf(stderr, "job parse failed: %s\n  %s\n", perr.msg, buf);
    return job;
}

/* One job into compressed-tensors and the same job into gptq_v2. */
static void job_pair(const char *method, int gs, const char *extra, int expect_zp)
{
    char out_ct[4096], out_v2[4096], ex[512];
    snprintf(out_ct, sizeof out_ct, "%s/ct-%s-%d-%d", T, method, gs, (int)strlen(extra));
    snprintf(out_v2, sizeof out_v2, "%s/v2-%s-%d-%d", T, method, gs, (int)strlen(extra));
    snprintf(ex, sizeof ex, "%s\"modules_to_not_convert\":[\"layers.1.mlp.down_proj\"],", extra);
    qp_job *jc = mk_job(out_ct, method, "compressed-tensors", gs, ex);
    qp_job *jv = mk_job(out_v2, method, "gptq_v2", gs, ex);
    CHECK(jc && jv);
    if (!jc || !jv) { qp_job_free(jc); qp_job_free(jv); return; }
    qd_err err = {0};
    CHECK_OK(qd_pipeline_run(jc, pt_be, NULL, &err));
    CHECK_OK(qd_pipeline_run(jv, pt_be, NULL, &err));
    st_model *om = NULL;
    CHECK_OK(st_model_open(out_ct, &om, &err));
    if (om) {
        const char *base = "model.layers.0.self_attn.q_proj";
        char name[256];
        static const char *const need[] = {"weight_packed", "weight_scale", "weight_shape"};
        for (int i = 0; i < 3; i++) {
            snprintf(name, sizeof name, "%s.%s", base, need[i]);
            CHECK(st_model_find(om, name) != NULL);
        }
        snprintf(name, sizeof name, "%s.weight_zero_point", base);
        CHECK((st_model_find(om, name) != NULL) == expect_zp);
        snprintf(name, sizeof name, "%s.weight", base);
        CHECK(st_model_find(om, name) == NULL);
        snprintf(name, sizeof name, "%s.qweight", base);
        CHECK(st_model_find(om, name) == NULL);
        CHECK(st_model_find(om, "model.layers.1.mlp.down_proj.weight") != NULL);
        st_model_close(om);
    }
    cJSON *cfg = pt_read_json(test_path(out_ct, "config.json"));
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(cfg, "quantization_config");
    CHECK_STR(cJSON_GetStringValue(cJSON_GetObjectItem(q, "quant_method")), "compressed-tensors");
    const cJSON *ign = cJSON_GetObjectItem(q, "ignore");
    CHECK_INT(cJSON_GetArraySize(ign), 2);
    CHECK_STR(cJSON_GetStringValue(cJSON_GetArrayItem(ign, 1)), "model.layers.1.mlp.down_proj");
    cJSON_Delete(cfg);
    /* Every linear: the compressed-tensors decode is the gptq_v2 decode rounded to F16. */
    qd_model *mc = NULL, *mv = NULL;
    CHECK_OK(qd_model_open(out_ct, pt_be, &mc, &err));
    CHECK_OK(qd_model_open(out_v2, pt_be, &mv, &err));
    int bad = 0;
    for (int blk = 0; mc && mv && blk < (int)qd_model_cfg(mc)->n_layers; blk++) {
        qd_block_weights *bc = NULL, *bv = NULL;
        CHECK_OK(qd_block_load(mc, blk, &bc, &err));
        CHECK_OK(qd_block_load(mv, blk, &bv, &err));
        for (int li = 0; bc && bv && li < qd_model_n_linears(mc); li++) {
            const qd_linear_info *L = qd_model_linear(mc, li);
            float *a = malloc((size_t)(L->n * L->k) * sizeof *a), *b = malloc((size_t)(L->n * L->k) * sizeof *b);
            CHECK_OK(qd_block_linear_get(mc, bc, li, a, NULL, &err));
            CHECK_OK(qd_block_linear_get(mv, bv, li, b, NULL, &err));
            for (int64_t i = 0; i < L->n * L->k && bad < 3; i++)
                if (a[i] != qd_f32_round_f16(b[i])) {
                    TEST_FAIL_("%s %s block %d %s [%lld]: compressed-tensors %g, gptq_v2 %g", method, extra, blk,
                               L->name, (long long)i, (double)a[i], (double)b[i]);
                    bad++;
                }
            test_checks++;
            free(a);
            free(b);
        }
        qd_block_free(mc, bc);
        qd_block_free(mv, bv);
    }
    qd_model_close(mc);
    qd_model_close(mv);
    int64_t n1 = 0, n2 = 0;
    float *la = pt_logits(out_ct, &n1), *lb = pt_logits(out_v2, &n2);
    CHECK(la && lb && n1 == n2);
    if (la && lb) CHECK(pt_rel_err(la, lb, n1) < 1e-3);
    free(la);
    free(lb);
    qp_job_free(jc);
    qp_job_free(jv);
}

static void test_jobs(void)
{
    job_pair("gptq", 32, "\"bits\":4,", 0);
    job_pair("gptq", 32, "\"bits\":4,\"sym\":false,\"desc_act\":true,\"static_groups\":true,", 1);
    job_pair("awq", 64, "\"bits\":4,", 1);
    job_pair("awq+gptq", 32, "\"bits\":8,\"sym\":true,", 0);
    job_pair("rtn", -1, "\"bits\":8,\"sym\":false,", 1);
    job_pair("gptq", -1, "\"bits\":4,\"desc_act\":true,\"static_groups\":true,", 0);
    /* desc_act without static groups is refused at the job, naming the reason. */
    qp_err perr;
    memset(&perr, 0, sizeof perr);
    qp_job *j = NULL;
    char buf[1024];
    snprintf(buf, sizeof buf, "{\"model\":\"m\",\"output\":\"o\",\"method\":\"gptq\",\"format\":\"compressed-tensors\","
             "\"desc_act\":true,\"static_groups\":false,\"calibration\":{\"path\":\"c\"}}");
    CHECK_ERR(qp_job_parse(buf, strlen(buf), &j, &perr));
    CHECK_CONTAINS(perr.msg, "job.static_groups: compressed-tensors holds act-order (desc_act) weights only with static groups");
}

int main(void)
{
    qd_testgen_opts lo = pt_llama_opts(128, 2);
    lo.dtype = QD_DTYPE_F16;
    if (pt_setup(2, 4000, 128, 3, &T, &tokens) || pt_setup_model("llama", &lo, llama_dir, sizeof llama_dir)) return 1;
    TEST_RUN(test_settings);
    TEST_RUN(test_pack_layers);
    TEST_RUN(test_config);
    TEST_RUN(test_jobs);
    return pt_teardown();
}
