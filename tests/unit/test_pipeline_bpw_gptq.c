/* job.target_bpw with format gptq on a small llama: the plan written as GPTQ `dynamic` rules.
 *   - One plan, two formats: a compressed-tensors job and a gptq job following the same saved
 *     plan (4 and 8 bits, which both hold) store the same codes, zeros and scales in every
 *     layer, and quantd's reader gives the same logits within F16 rounding (compressed-tensors'
 *     decoder rounds each product to F16).
 *   - A 3/4-bit mix: every module's rule (as vLLM's re.match reads it, for the checkpoint's
 *     q_proj and for vLLM's fused qkv_proj / gate_up_proj alike) is the plan's bits and group
 *     size and its tensors' widths; the plan's bits per weight is the file's (qweight, qzeros,
 *     scales, g_idx); quantd reads it back; the serving check reports 3-bit layers as not
 *     loading in vLLM and the rest by kernel, with no rule reading differently for vLLM's name.
 *   - Refused by name: MoE experts with format gptq. */
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "pipeline_testlib.h"
#include "quant/core/fsutil.h"
#include "quant/formats/fmt_gptq_dynamic.h"
#include "quant/pipeline/pipeline_internal.h"
#include "quant/tp/tp_serving.h"

static const char *T;
static const char *tokens;
static char llama_dir[4096];

#define EXTRA48 "\"target_bpw\":5.0,\"bpw_bits\":[4,8],\"bpw_group_sizes\":[32,64],"

typedef struct hook_ctx { int fired; } hook_ctx;

static int stop_at_block0(void *ud, const qd_progress *p)
{
    hook_ctx *h = ud;
    if (!h->fired && p->block == 0 && !strcmp(p->stage, "load")) {
        h->fired = 1;
        return 1;
    }
    return 0;
}

/* Runs job to block 0 (its plan saved), replaces the plan with plan_from's when given (else
 * copies its own out to plan_to), then to the end. */
static int run_with_plan(qp_job *job, const char *plan_from, char *plan_to, size_t cap)
{
    qd_err err = {0};
    hook_ctx h = {0};
    qd_pipeline_hooks hooks = {.ud = &h, .progress = stop_at_block0};
    CHECK_INT(qd_pipeline_run(job, pt_be, &hooks, &err), QD_ECANCELLED);
    char path[4200];
    snprintf(path, sizeof path, "%s/.quantd/bpw-plan.json", job->output);
    size_t n = 0;
    char *text = pt_read(plan_from ? plan_from : path, &n);
    CHECK(text != NULL);
    if (!text) return -1;
    if (plan_from) CHECK_OK(qd_fs_write_atomic(path, text, n, &err));
    if (!plan_from) {
        snprintf(plan_to, cap, "%s/plan-copy.json", T);
        CHECK_OK(qd_fs_write_atomic(plan_to, text, n, &err));
    }
    free(text);
    int rc = qd_pipeline_run(job, pt_be, NULL, &err);
    CHECK_OK(rc);
    return rc;
}

static const st_tensor *sm_lookup(const void *sm, const char *name) { return st_model_find(sm, name); }

/* Linear `base` [n, k] of the checkpoint in dir, unpacked (its format from config.json). */
static int read_layer(const char *dir, const char *base, int64_t n, int64_t k, qd_qlayer *out)
{
    cJSON *cfg = pt_read_json(test_path(dir, "config.json"));
    const qd_format *f = NULL;
    qd_fmt_detected d;
    qd_err err = {0};
    st_model *sm = NULL;
    qd_packed p;
    memset(&p, 0, sizeof p);
    memset(out, 0, sizeof *out);
    int rc = cfg ? qd_format_detect(cJSON_GetObjectItem(cfg, "quantization_config"), dir, &f, &d, &err) : -1;
    if (!rc) rc = st_model_open(dir, &sm, &err);
    qd_fmt_named ctx = {sm_lookup, sm, base};
    if (!rc) rc = f->read(qd_fmt_find_named, &ctx, n, k, &d, &p, &err);
    if (!rc) rc = f->unpack(&p, out, &err);
    if (rc) fprintf(stderr, "read_layer %s %s: %s\n", dir, base, err.msg);
    qd_packed_free(&p);
    st_model_close(sm);
    cJSON_Delete(cfg);
    return rc;
}

/* One saved plan of 4- and 8-bit candidates, written by compressed-tensors and by gptq. */
static void test_same_plan(void)
{
    char ct[4096], gq[4096], plan[4200];
    snprintf(ct, sizeof ct, "%s/ct", T);
    snprintf(gq, sizeof gq, "%s/gptq", T);
    qp_job *jc = pt_job(llama_dir, ct, "gptq", "compressed-tensors", tokens, EXTRA48);
    qp_job *jg = pt_job(llama_dir, gq, "gptq", "gptq", tokens, EXTRA48);
    CHECK(jc && jg);
    if (!jc || !jg || run_with_plan(jc, NULL, plan, sizeof plan) || run_with_plan(jg, plan, NULL, 0)) {
        qp_job_free(jc);
        qp_job_free(jg);
        return;
    }
    cJSON *rc_ = pt_read_json(test_path(ct, "quantd_report.json")), *rg = pt_read_json(test_path(gq, "quantd_report.json"));
    const cJSON *lc = cJSON_GetObjectItem(cJSON_GetObjectItem(rc_, "bpw"), "layers");
    const cJSON *lg = cJSON_GetObjectItem(cJSON_GetObjectItem(rg, "bpw"), "layers");
    CHECK_INT(cJSON_GetArraySize(lc), 3 * 7);
    CHECK_INT(cJSON_GetArraySize(lg), 3 * 7);
    qd_model *m = NULL;
    qd_err err = {0};
    CHECK_OK(qd_model_open(llama_dir, pt_be, &m, &err));
    int bits8 = 0, same = 0;
    for (const cJSON *a = lc ? lc->child : NULL, *b = lg ? lg->child : NULL; a && b && m; a = a->next, b = b->next) {
        const char *nm = cJSON_GetObjectItem(a, "name")->valuestring;
        CHECK_STR(nm, cJSON_GetObjectItem(b, "name")->valuestring);
        int bits = cJSON_GetObjectItem(a, "bits")->valueint;
        CHECK_INT(bits, cJSON_GetObjectItem(b, "bits")->valueint);
        CHECK_INT(cJSON_GetObjectItem(a, "group_size")->valueint, cJSON_GetObjectItem(b, "group_size")->valueint);
        bits8 += bits == 8;
        int64_t n = 0, k = 0;
        for (int li = 0; li < qd_model_n_linears(m); li++)
            if (strstr(nm, qd_model_linear(m, li)->name)) n = qd_model_linear(m, li)->n, k = qd_model_linear(m, li)->k;
        qd_qlayer x, y;
        if (read_layer(ct, nm, n, k, &x) || read_layer(gq, nm, n, k, &y)) { CHECK(0); continue; }
        CHECK_INT(x.bits, y.bits);
        CHECK_INT(x.n_groups, y.n_groups);
        int eq = x.n_groups == y.n_groups && !memcmp(x.q, y.q, (size_t)(n * k)) &&
                 !memcmp(x.zeros, y.zeros, (size_t)(x.n_groups * n) * sizeof *x.zeros) &&
                 !memcmp(x.scales, y.scales, (size_t)(x.n_groups * n) * sizeof *x.scales);
        CHECK(eq);
        same += eq;
        qd_qlayer_free(&x);
        qd_qlayer_free(&y);
    }
    CHECK(bits8 > 0 && bits8 < 3 * 7);
    CHECK_INT(same, 3 * 7);
    /* Top level 4 bits (most weights), the 8-bit groups as rules. */
    cJSON *cfg = pt_read_json(test_path(gq, "config.json"));
    const cJSON *q = cJSON_GetObjectItem(cfg, "quantization_config");
    CHECK_INT(cJSON_GetObjectItem(q, "bits")->valueint, 4);
    CHECK(cJSON_GetArraySize(cJSON_GetObjectItem(q, "dynamic")) > 0);
    cJSON_Delete(cfg);
    /* The same weights but for F16 rounding of compressed-tensors' products. */
    int64_t na = 0, nb = 0;
    float *la = pt_logits(ct, &na), *lb = pt_logits(gq, &nb);
    CHECK(la && lb && na == nb);
    double rel = la && lb && na == nb ? pt_rel_err(la, lb, na) : -1;
    fprintf(stderr, "logits, compressed-tensors vs gptq of one plan: rel %.3g\n", rel);
    CHECK(rel >= 0 && rel < 2e-3);
    free(la);
    free(lb);
    qd_model_close(m);
    cJSON_Delete(rc_);
    cJSON_Delete(rg);
    qp_job_free(jc);
    qp_job_free(jg);
}

/* The serving check's callbacks over a GPTQ output: stored widths from the tensors, vLLM's
 * from the rules matched against its own layer names. */
typedef struct srv_ctx { const qd_model *m; st_model *sm; const cJSON *q; } srv_ctx;

static int stored_quant(void *ud, int block, int li, int *bits, int64_t *gs)
{
    const srv_ctx *c = ud;
    const qd_linear_info *L = qd_model_linear(c->m, li);
    char prefix[160], name[400];
    qd_model_block_prefix(c->m, block, prefix, sizeof prefix);
    snprintf(name, sizeof name, "%s%s.qweight", prefix, L->name);
    const st_tensor *qw = st_model_find(c->sm, name);
    snprintf(name, sizeof name, "%s%s.scales", prefix, L->name);
    const st_tensor *sc = st_model_find(c->sm, name);
    if (!qw || !sc) return -1;
    *bits = (int)(qw->shape[0] * 32 / L->k);
    *gs = sc->shape[0] == 1 ? -1 : L->k / sc->shape[0];
    return 0;
}

static int vllm_quant(void *ud, const char *name, int *bits, int64_t *gs)
{
    const srv_ctx *c = ud;
    qd_err err = {0};
    int rc = qd_gptq_dynamic_lookup(c->q, name, bits, gs, &err);
    if (rc == QD_GPTQ_DYN_SKIP) *bits = 0;
    return rc < 0 ? rc : 0;
}

/* The bits the plan counts for a [n, k] layer in GPTQ's format: codes, F16 scale and packed zero
 * per group and row, an I32 g_idx per input. */
static double gptq_bits(int64_t n, int64_t k, int b, int64_t gs)
{
    int64_t g = gs > 0 ? k / gs : 1;
    return (double)n * (double)k * b + (double)(n * g) * (16 + b) + 32.0 * (double)k;
}

static void test_mix34(void)
{
    qd_model *m = NULL;
    qd_err err = {0};
    CHECK_OK(qd_model_open(llama_dir, pt_be, &m, &err));
    if (!m) return;
    /* A target halfway between every layer at 3 bits g64 and at 4 bits g32. */
    double lo = 0, hi = 0, w = 0;
    for (int li = 0; li < qd_model_n_linears(m); li++) {
        const qd_linear_info *L = qd_model_linear(m, li);
        lo += 3 * gptq_bits(L->n, L->k, 3, 64);
        hi += 3 * gptq_bits(L->n, L->k, 4, 32);
        w += 3.0 * (double)(L->n * L->k);
    }
    double target = floor((lo + hi) / 2 / w * 100) / 100;
    char extra[256], out[4096];
    snprintf(extra, sizeof extra, "\"target_bpw\":%.2f,\"bpw_bits\":[3,4],\"bpw_group_sizes\":[32,64],", target);
    snprintf(out, sizeof out, "%s/mix34", T);
    qp_job *job = pt_run_job("mix34", llama_dir, out, "gptq", "gptq", tokens, extra);
    if (!job) { qd_model_close(m); return; }
    cJSON *cfg = pt_read_json(test_path(out, "config.json")), *rep = pt_read_json(test_path(out, "quantd_report.json"));
    const cJSON *q = cJSON_GetObjectItem(cfg, "quantization_config");
    const cJSON *bpw = cJSON_GetObjectItem(rep, "bpw");
    CHECK(q && bpw);
    st_model *sm = NULL;
    CHECK_OK(st_model_open(out, &sm, &err));
    int n3 = 0, n4 = 0;
    double file_bits = 0, weights = 0;
    for (const cJSON *l = bpw && sm ? cJSON_GetObjectItem(bpw, "layers")->child : NULL; l; l = l->next) {
        const char *nm = cJSON_GetObjectItem(l, "name")->valuestring;
        int bits = cJSON_GetObjectItem(l, "bits")->valueint, rb = 0;
        int64_t gs = cJSON_GetObjectItem(l, "group_size")->valueint, rg = 0;
        n3 += bits == 3;
        n4 += bits == 4;
        /* The rule GPTQModel and vLLM find for the checkpoint's module. */
        CHECK(qd_gptq_dynamic_lookup(q, nm, &rb, &rg, &err) >= 0);
        CHECK_INT(rb, bits);
        CHECK_INT(rg, gs);
        /* ... and for vLLM's fused layer of it. */
        char fused[400];
        snprintf(fused, sizeof fused, "%s", nm);
        char *at = strstr(fused, "self_attn.");
        if (at && !strstr(at, "o_proj")) strcpy(at + strlen("self_attn."), "qkv_proj");
        at = strstr(fused, "mlp.");
        if (at && !strstr(at, "down_proj")) strcpy(at + strlen("mlp."), "gate_up_proj");
        CHECK(qd_gptq_dynamic_lookup(q, fused, &rb, &rg, &err) >= 0);
        CHECK_INT(rb, bits);
        CHECK_INT(rg, gs);
        /* The file's bytes for it. */
        static const char *const suf[] = {"qweight", "qzeros", "scales", "g_idx"};
        int64_t k = 0, n = 0, qrows = 0;
        for (int s = 0; s < 4; s++) {
            char tn[512];
            snprintf(tn, sizeof tn, "%s.%s", nm, suf[s]);
            const st_tensor *t = st_model_find(sm, tn);
            CHECK(t != NULL);
            if (!t) continue;
            int64_t e = t->shape[0] * (t->ndim > 1 ? t->shape[1] : 1);
            file_bits += 8.0 * (double)e * (s == 2 ? 2 : 4);
            if (s == 3) k = t->shape[0];
            if (s == 2) n = t->shape[1];
            if (s == 0) qrows = t->shape[0];
        }
        CHECK_INT(qrows, k * bits / 32);   /* the tensor's width is the rule's */
        weights += (double)(n * k);
    }
    CHECK(n3 > 0 && n4 > 0);
    double got = cJSON_GetObjectItem(bpw, "bpw")->valuedouble;
    CHECK(got <= target);
    CHECK_NEAR(got, file_bits / weights, 1e-12);   /* the plan's count is the file's */
    fprintf(stderr, "mix34: target %.2f, bpw %.4f, 3-bit %d, 4-bit %d\n", target, got, n3, n4);
    CHECK_INT(cJSON_GetObjectItem(q, "bits")->valueint, 4);   /* vLLM's config refuses a 3-bit top level */
    /* quantd reads it back: logits near the float model's, as near as a uniform 3-bit output's
     * or nearer (loosely: a random model does not order them finely). */
    char u3[4096];
    snprintf(u3, sizeof u3, "%s/u3", T);
    qp_job *ju = pt_run_job("u3", llama_dir, u3, "gptq", "gptq", tokens, "\"bits\":3,");
    double mix_rel = pt_logits_rel(llama_dir, out), u3_rel = ju ? pt_logits_rel(llama_dir, u3) : -1;
    fprintf(stderr, "logits vs float: mix %.5f, uniform 3-bit g32 %.5f\n", mix_rel, u3_rel);
    CHECK(mix_rel > 0 && u3_rel > 0 && mix_rel < 1.5 * u3_rel);
    qp_job_free(ju);
    /* vLLM: 3-bit rows do not load, 4-bit rows get a kernel; no row reads its rule otherwise. */
    srv_ctx sc = {m, sm, q};
    qd_serving_quant sq = {.format = "gptq", .bits = 0, .sym = 1, .group_size = 0, .layer_quant = stored_quant,
                           .layer_ud = &sc, .row_quant = vllm_quant};
    qd_serving_report r = {0};
    CHECK_OK(qd_tp_serving_check(m, &sq, NULL, NULL, 1, qd_srv_gpu_cc("hopper"), &r, &err));
    CHECK_INT((int)r.n, 3 * 4);
    int noload3 = 0, served = 0;
    for (size_t i = 0; i < r.n; i++) {
        const qd_serving_row *row = &r.rows[i];
        if (strstr(row->choice.why, "from the `dynamic` rules matched against its own name")) fprintf(stderr, "%s: %s\n", row->name, row->choice.why);
        CHECK(!strstr(row->choice.why, "from the `dynamic` rules matched against its own name"));
        if (strstr(row->choice.why, "Unsupported quantization config")) noload3++;
        else served += row->choice.kernel != QD_SRV_NO_LOAD;
    }
    CHECK(noload3 > 0);
    CHECK_INT(noload3 + served, 3 * 4);
    qd_tp_serving_report_free(&r);
    /* A rule that reaches vLLM's fused name but not the checkpoint's modules is caught: 8 bits
     * for every qkv_proj, put first, while q/k/v hold 3 or 4. */
    cJSON *q2 = cJSON_Duplicate(q, 1), *nd = cJSON_CreateObject();
    cJSON_AddItemToObject(nd, "+:.*\\.qkv_proj$", cJSON_Parse("{\"bits\":8}"));
    for (const cJSON *x = cJSON_GetObjectItem(q, "dynamic")->child; x; x = x->next)
        cJSON_AddItemToObject(nd, x->string, cJSON_Duplicate(x, 1));
    cJSON_ReplaceItemInObject(q2, "dynamic", nd);
    sc.q = q2;
    CHECK_OK(qd_tp_serving_check(m, &sq, NULL, NULL, 1, qd_srv_gpu_cc("hopper"), &r, &err));
    int caught = 0;
    for (size_t i = 0; i < r.n; i++)
        if (strstr(r.rows[i].choice.why, "at 8 bits") && strstr(r.rows[i].choice.why, "matched against its own name")) {
            CHECK(strstr(r.rows[i].name, "qkv_proj") != NULL);
            caught++;
        }
    CHECK_INT(caught, 3);
    qd_tp_serving_report_free(&r);
    cJSON_Delete(q2);
    st_model_close(sm);
    /* The same plan in gptq_v2 (zeros stored without v1's offset): the same rules, and quantd
     * reads it back to the same logits as the v1 file. */
    char v2[4096];
    snprintf(v2, sizeof v2, "%s/mix34-v2", T);
    qp_job *j2 = pt_run_job("mix34-v2", llama_dir, v2, "gptq", "gptq_v2", tokens, extra);
    cJSON *cfg2 = j2 ? pt_read_json(test_path(v2, "config.json")) : NULL;
    const cJSON *qv2 = cJSON_GetObjectItem(cfg2, "quantization_config");
    CHECK(qv2 && cJSON_Compare(cJSON_GetObjectItem(qv2, "dynamic"), cJSON_GetObjectItem(q, "dynamic"), 1));
    CHECK_STR(cJSON_GetStringValue(cJSON_GetObjectItem(qv2, "checkpoint_format")), "gptq_v2");
    int64_t n1 = 0, n2 = 0;
    float *l1 = pt_logits(out, &n1), *l2 = j2 ? pt_logits(v2, &n2) : NULL;
    CHECK(l1 && l2 && n1 == n2 && !memcmp(l1, l2, (size_t)n1 * sizeof *l1));
    free(l1);
    free(l2);
    cJSON_Delete(cfg2);
    qp_job_free(j2);
    /* A file whose rule lies about a layer's widths is refused by the reader, naming the
     * module: the first rule's bits turned to the other width. */
    cJSON *lie = cJSON_Duplicate(cfg, 1);
    cJSON *rule = cJSON_GetObjectItem(cJSON_GetObjectItem(lie, "quantization_config"), "dynamic")->child;
    int was = cJSON_GetObjectItem(rule, "bits") ? cJSON_GetObjectItem(rule, "bits")->valueint : 4;
    cJSON_DeleteItemFromObject(rule, "bits");
    cJSON_AddNumberToObject(rule, "bits", was == 3 ? 4 : 3);
    char *text = cJSON_PrintUnformatted(lie);
    CHECK_OK(qd_fs_write_atomic(test_path(out, "config.json"), text, strlen(text), &err));
    free(text);
    cJSON_Delete(lie);
    qd_model *ml = NULL;
    int64_t vocab = qd_model_cfg(m)->vocab;
    int32_t ids[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    float *lg = malloc((size_t)(8 * vocab) * sizeof *lg);
    memset(&err, 0, sizeof err);
    int rc = qd_model_open(out, pt_be, &ml, &err);
    if (!rc) rc = qd_model_forward(ml, ids, 1, 8, lg, &err);
    CHECK(rc != 0);
    CHECK_CONTAINS(err.msg, "its tensors are");
    CHECK_CONTAINS(err.msg, "quantization_config.dynamic says");
    fprintf(stderr, "lying rule: %s\n", err.msg);
    free(lg);
    qd_model_close(ml);
    cJSON_Delete(cfg);
    cJSON_Delete(rep);
    qp_job_free(job);
    qd_model_close(m);
}

/* Experts: refused by name before any work. */
static void test_moe_refused(void)
{
    char dir[4096], out[4096];
    qd_testgen_opts o = pt_llama_opts(64, 1);
    o.n_experts = 4;
    snprintf(dir, sizeof dir, "%s/moe", T);
    if (pt_gen_model(dir, &o)) { CHECK(0); return; }
    snprintf(out, sizeof out, "%s/moe-out", T);
    qp_job *job = pt_job(dir, out, "gptq", "gptq", tokens, EXTRA48);
    qd_err err = {0};
    if (job) CHECK_ERR(qd_pipeline_run(job, pt_be, NULL, &err));
    CHECK_CONTAINS(err.msg, "target_bpw with format gptq: the model has MoE experts");
    CHECK(!qd_fs_exists(out));
    qp_job_free(job);
}

/* A job's serve pre-flight: a 3-bit candidate in GPTQ's format will not load in vLLM, named. */
static void test_serve_refused(void)
{
    char out[4096];
    snprintf(out, sizeof out, "%s/serve-out", T);
    qp_job *job = pt_job(llama_dir, out, "gptq", "gptq", tokens,
                         "\"target_bpw\":4.4,\"bpw_bits\":[3,4],\"serve\":{\"engine\":\"vllm\",\"gpu\":\"hopper\",\"tp\":1},");
    qd_err err = {0};
    if (job) CHECK_ERR(qd_pipeline_run(job, pt_be, NULL, &err));
    CHECK_CONTAINS(err.msg, "candidate 3 bits group 32 of target_bpw would not get a fast kernel");
    CHECK_CONTAINS(err.msg, "will not load: vLLM's GPTQ config builds 4- and 8-bit symmetric layers only");
    CHECK(!qd_fs_exists(out));
    qp_job_free(job);
    /* 4 and 8 bits pass it. */
    snprintf(out, sizeof out, "%s/serve-48", T);
    job = pt_job(llama_dir, out, "gptq", "gptq", tokens,
                 "\"target_bpw\":5.0,\"bpw_bits\":[4,8],\"serve\":{\"engine\":\"vllm\",\"gpu\":\"hopper\",\"tp\":1},");
    memset(&err, 0, sizeof err);
    if (job) {
        int rc = qd_pipeline_run(job, pt_be, NULL, &err);
        /* This model is narrower than Machete's and Marlin's tiles in places: any refusal must be
         * a kernel's shape rule, never the bits rule. */
        if (rc) CHECK(!strstr(err.msg, "builds 4- and 8-bit"));
    }
    qp_job_free(job);
}

/* vLLM's GPTQ linear method checks Marlin's group sizes for every layer: group 16 everywhere,
 * stored and ruled alike, does not load. */
static int g16_stored(void *ud, int block, int li, int *bits, int64_t *gs)
{
    (void)ud, (void)block, (void)li;
    *bits = 4;
    *gs = 16;
    return 0;
}

static int g16_vllm(void *ud, const char *name, int *bits, int64_t *gs)
{
    (void)ud, (void)name;
    *bits = 4;
    *gs = 16;
    return 0;
}

static void test_serving_group(void)
{
    qd_model *m = NULL;
    qd_err err = {0};
    CHECK_OK(qd_model_open(llama_dir, pt_be, &m, &err));
    if (!m) return;
    qd_serving_quant sq = {.format = "gptq", .sym = 1, .layer_quant = g16_stored, .row_quant = g16_vllm};
    qd_serving_report r = {0};
    CHECK_OK(qd_tp_serving_check(m, &sq, NULL, NULL, 1, qd_srv_gpu_cc("ampere"), &r, &err));
    CHECK_INT((int)r.n, 3 * 4);
    for (size_t i = 0; i < r.n; i++) {
        CHECK_INT(r.rows[i].choice.kernel, QD_SRV_NO_LOAD);
        CHECK_CONTAINS(r.rows[i].choice.why, "raises for group 16");
    }
    CHECK_INT((int)r.n_slow, 3 * 4);
    qd_tp_serving_report_free(&r);
    qd_model_close(m);
}

int main(void)
{
    qd_testgen_opts lo = pt_llama_opts(128, 3);
    if (pt_setup(2, 4000, 128, 3, &T, &tokens) || pt_setup_model("llama", &lo, llama_dir, sizeof llama_dir)) return 1;
    TEST_RUN(test_same_plan);
    TEST_RUN(test_mix34);
    TEST_RUN(test_moe_refused);
    TEST_RUN(test_serve_refused);
    TEST_RUN(test_serving_group);
    return pt_teardown();
}
