/* The pipeline's checkpoints and refusals: a run cancelled at any block (progress hook) or
 * refused a commit (before_commit) resumes to byte-identical output; a changed option is
 * refused against an existing checkpoint, an unrelated output directory unless overwrite;
 * linears a format cannot hold stay in float and the config/report say so; bad inputs
 * (missing model, NaN weight, missing or too small calibration) fail with a clear error. */
#include <stdio.h>
#include <unistd.h>

#include "quant/pipeline/admission.h"
#include "quant/pipeline/state.h"

#include "pipeline_testlib.h"

static const char *T;
static const char *tokens;
static char llama_dir[4096];

typedef struct hook_ctx {
    const char *stage;   /* cancel at the first progress call of this stage for block */
    int block;
    int refuse_commit;   /* before_commit refuses this block (-1: never) */
    int fired;
} hook_ctx;

static int on_progress(void *ud, const qd_progress *p)
{
    hook_ctx *h = ud;
    if (h->stage && !h->fired && p->block == h->block && !strcmp(p->stage, h->stage)) {
        h->fired = 1;
        return 1;
    }
    return 0;
}

static int on_commit(void *ud, int block)
{
    hook_ctx *h = ud;
    if (block == h->refuse_commit) { h->fired = 1; return 1; }
    return 0;
}

static int state_int(const char *out, const char *key)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/.quantd/state.json", out);
    cJSON *j = pt_read_json(p);
    const cJSON *nb = cJSON_GetObjectItemCaseSensitive(j, key);
    int v = cJSON_IsNumber(nb) ? nb->valueint : -1;
    cJSON_Delete(j);
    return v;
}
static int state_next_block(const char *out) { return state_int(out, "next_block"); }

/* The checkpoint keeps the activations of block `want` only (none for 0: the embedding). */
static void check_acts_files(const char *out, int want)
{
    char p[4200];
    for (int b = 0; b <= 3; b++) {
        snprintf(p, sizeof p, "%s/.quantd/acts-%03d.bin", out, b);
        test_checks++;
        if (qd_fs_exists(p) != (b == want && b > 0)) TEST_FAIL_("%s: %s", p, b == want ? "missing" : "should not be there");
    }
}

/* The report's per-block cost records: one per block, in order, across the interruptions. */
static int report_blocks_in_order(const char *out)
{
    cJSON *j = pt_read_json(test_path(out, "quantd_report.json"));
    const cJSON *b;
    int i = 0, ok = j != NULL;
    cJSON_ArrayForEach(b, cJSON_GetObjectItemCaseSensitive(j, "blocks"))
        ok &= cJSON_GetObjectItemCaseSensitive(b, "block")->valueint == i++;
    cJSON_Delete(j);
    return ok ? i : -1;
}

static int report_layers(const char *out)
{
    cJSON *j = pt_read_json(test_path(out, "quantd_report.json"));
    int n = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(j, "layers"));
    cJSON_Delete(j);
    return j ? n : -1;
}

/* resources.measured.<key> of a report, or -1. */
static double report_measured(const char *out, const char *key)
{
    cJSON *j = pt_read_json(test_path(out, "quantd_report.json"));
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "resources"), "measured");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(m, key);
    double d = cJSON_IsNumber(v) ? v->valuedouble : -1;
    cJSON_Delete(j);
    return d;
}

static void check_same_output(const char *ref, const char *out)
{
    test_checks++;
    if (!pt_same_file(test_path(ref, "model.safetensors"), test_path(out, "model.safetensors")))
        TEST_FAIL_("%s/model.safetensors differs from the uninterrupted run %s", out, ref);
    CHECK(pt_same_file(test_path(ref, "config.json"), test_path(out, "config.json")));
    CHECK(pt_same_file(test_path(ref, "quantize_config.json"), test_path(out, "quantize_config.json")));
    CHECK_INT(report_layers(out), report_layers(ref));
    CHECK_INT(report_blocks_in_order(out), report_blocks_in_order(ref));
    CHECK_INT(report_blocks_in_order(ref), 3);
    /* The measured peaks over the interrupted runs: the same files at their largest moment,
     * give or take state.json's digits. */
    CHECK(report_measured(out, "peak_rss_bytes") > 0);
    CHECK_NEAR(report_measured(out, "peak_disk_bytes"), report_measured(ref, "peak_disk_bytes"), 4096);
    CHECK(!qd_fs_exists(test_path(out, ".quantd")));
}

/* every: job.checkpoint.acts_every (a cancelled block b resumes from the activations of block
 * b / every * every and recomputes the blocks from there). */
static void resume_case(const char *method, const char *format, const char *extra0, int every)
{
    char ref[4096], out[4096], extra[512];
    snprintf(extra, sizeof extra, "%s\"checkpoint\":{\"acts_every\":%d},", extra0 ? extra0 : "", every);
    snprintf(ref, sizeof ref, "%s/ref-%s-%s", T, method, format);
    qp_job *job = pt_job(llama_dir, ref, method, format, tokens, extra);
    CHECK(job != NULL);
    if (!job) return;
    qd_err err = {0};
    CHECK_OK(qd_pipeline_run(job, pt_be, NULL, &err));
    qp_job_free(job);
    static const char *stages[] = {"load", "calibrate", "checkpoint"};
    for (int s = 0; s < 3; s++) {
        for (int b = 0; b < 3; b++) {
            if (s == 0 && b == 0) continue;   /* "load" of block 0 is first reported by open */
            snprintf(out, sizeof out, "%s/res-%s-%s-%s-%d", T, method, format, stages[s], b);
            job = pt_job(llama_dir, out, method, format, tokens, extra);
            if (!job) { CHECK(0); return; }
            hook_ctx h = {.stage = stages[s], .block = b, .refuse_commit = -1};
            qd_pipeline_hooks hooks = {.ud = &h, .progress = on_progress};
            int rc = qd_pipeline_run(job, pt_be, &hooks, &err);
            CHECK_INT(rc, QD_ECANCELLED);
            CHECK(h.fired);
            CHECK_INT(state_next_block(out), b);
            CHECK_INT(state_int(out, "acts_block"), b / every * every);
            check_acts_files(out, b / every * every);
            /* The peaks measured so far are committed with the blocks, for the report. */
            if (b > 0) CHECK(state_int(out, "peak_disk_bytes") > 0 && state_int(out, "peak_rss_bytes") > 0);
            CHECK(!qd_fs_exists(test_path(out, "model.safetensors")));
            /* Resume a block at a time through open/run_block/close (a hand-off), then finish. */
            qd_pipeline *p = NULL;
            CHECK_OK(qd_pipeline_open(job, pt_be, NULL, &p, &err));
            if (p) {
                CHECK_INT(qd_pipeline_next_block(p), b);
                CHECK_INT(qd_pipeline_resumed_cross_backend(p), 0);
                if (qd_pipeline_next_block(p) < qd_pipeline_n_blocks(p)) CHECK_OK(qd_pipeline_run_block(p, &err));
                qd_pipeline_close(p);
            }
            CHECK_OK(qd_pipeline_run(job, pt_be, NULL, &err));
            check_same_output(ref, out);
            qp_job_free(job);
        }
    }
}

static void test_resume_gptq(void) { resume_case("gptq", "gptq", "\"desc_act\":true,", 4); }
static void test_resume_awq(void) { resume_case("awq", "awq_gemm", NULL, 2); }
static void test_resume_rtn_v2(void) { resume_case("rtn", "gptq_v2", "\"bits\":3,\"sym\":false,", 1); }
static void test_resume_awq_gptq_ct(void) { resume_case("awq+gptq", "compressed-tensors", "\"sym\":false,", 4); }
/* compute bf16: the recomputed blocks' forwards run the same bf16 products. */
static void test_resume_gptq_bf16(void) { resume_case("gptq", "gptq_v2", "\"compute\":\"bf16\",", 2); }

/* A resume that would have to recompute a block whose fold file is gone or damaged fails
 * with the file's name and leaves the checkpoint as it was. */
static void test_resume_folds_damaged(void)
{
    char out[4096], p[4200];
    snprintf(out, sizeof out, "%s/folds-damaged", T);
    qp_job *job = pt_job(llama_dir, out, "awq", "awq_gemm", tokens, "\"checkpoint\":{\"acts_every\":4},");
    if (!job) { CHECK(0); return; }
    qd_err err = {0};
    hook_ctx h = {.stage = "load", .block = 2, .refuse_commit = -1};
    qd_pipeline_hooks hooks = {.ud = &h, .progress = on_progress};
    CHECK_INT(qd_pipeline_run(job, pt_be, &hooks, &err), QD_ECANCELLED);
    CHECK_INT(state_next_block(out), 2);
    CHECK_INT(state_int(out, "acts_block"), 0);
    snprintf(p, sizeof p, "%s/.quantd/folds-001.safetensors", out);
    CHECK_OK(qd_fs_write_atomic(p, "not a safetensors file", 22, &err));
    qd_pipeline *pl = NULL;
    memset(&err, 0, sizeof err);
    CHECK_ERR(qd_pipeline_open(job, pt_be, NULL, &pl, &err));
    CHECK(pl == NULL);
    CHECK_CONTAINS(err.msg, "folds-001.safetensors");
    CHECK_CONTAINS(err.msg, "recomputing block 1");
    remove(p);
    memset(&err, 0, sizeof err);
    CHECK_ERR(qd_pipeline_open(job, pt_be, NULL, &pl, &err));
    CHECK_CONTAINS(err.msg, "folds-001.safetensors");
    CHECK_INT(state_next_block(out), 2);
    qp_job_free(job);
}

static void test_before_commit_refused(void)
{
    char ref[4096], out[4096];
    snprintf(ref, sizeof ref, "%s/ref-gptq-gptq", T);   /* from test_resume_gptq */
    snprintf(out, sizeof out, "%s/commit-refused", T);
    qp_job *job = pt_job(llama_dir, out, "gptq", "gptq", tokens, "\"desc_act\":true,");
    if (!job) { CHECK(0); return; }
    qd_err err = {0};
    hook_ctx h = {.stage = NULL, .block = -1, .refuse_commit = 1};
    qd_pipeline_hooks hooks = {.ud = &h, .before_commit = on_commit};
    CHECK_INT(qd_pipeline_run(job, pt_be, &hooks, &err), QD_ECANCELLED);
    CHECK_CONTAINS(err.msg, "refused");
    CHECK_INT(state_next_block(out), 1);
    char p[4200];
    snprintf(p, sizeof p, "%s/.quantd/block-001.safetensors", out);
    CHECK(!qd_fs_exists(p));
    snprintf(p, sizeof p, "%s/.quantd/block-000.safetensors", out);
    CHECK(qd_fs_exists(p));
    CHECK_OK(qd_pipeline_run(job, pt_be, NULL, &err));
    check_same_output(ref, out);
    qp_job_free(job);
}

static void test_fingerprint_and_overwrite(void)
{
    char out[4096];
    snprintf(out, sizeof out, "%s/fp", T);
    qd_err err = {0};
    qp_job *j4 = pt_job(llama_dir, out, "gptq", "gptq", tokens, "\"bits\":4,");
    qp_job *j8 = pt_job(llama_dir, out, "gptq", "gptq", tokens, "\"bits\":8,");
    qp_job *j8o = pt_job(llama_dir, out, "gptq", "gptq", tokens, "\"bits\":8,\"overwrite\":true,");
    if (!j4 || !j8 || !j8o) { CHECK(0); goto out; }
    hook_ctx h = {.stage = "calibrate", .block = 1, .refuse_commit = -1};
    qd_pipeline_hooks hooks = {.ud = &h, .progress = on_progress};
    CHECK_INT(qd_pipeline_run(j4, pt_be, &hooks, &err), QD_ECANCELLED);
    CHECK_INT(state_next_block(out), 1);
    memset(&err, 0, sizeof err);
    qd_pipeline *p = NULL;
    CHECK_INT(qd_pipeline_open(j8, pt_be, NULL, &p, &err), QD_EMISMATCH);
    CHECK(p == NULL);
    CHECK_CONTAINS(err.msg, "cannot resume");
    CHECK(strlen(err.msg) > 30);
    CHECK_INT(state_next_block(out), 1);    /* the checkpoint is untouched */
    /* A different calibration seed changes the data fingerprint. */
    qp_job *js = pt_job(llama_dir, out, "gptq", "gptq", tokens, "\"bits\":4,");
    if (js) {
        js->calibration.seed = 99;
        CHECK_INT(qd_pipeline_open(js, pt_be, NULL, &p, &err), QD_EMISMATCH);
        qp_job_free(js);
    }
    /* A checkpoint of another state version (an older build's blocks) is refused, kept. */
    char sp[4200];
    snprintf(sp, sizeof sp, "%s/.quantd/state.json", out);
    cJSON *st = pt_read_json(sp);
    CHECK(st != NULL);
    if (st) {
        cJSON_ReplaceItemInObjectCaseSensitive(st, "version", cJSON_CreateNumber(QD_STATE_VERSION - 1));
        char *txt = cJSON_Print(st);
        CHECK(txt && !qd_fs_write_atomic(sp, txt, strlen(txt), &err));
        free(txt);
        cJSON_Delete(st);
        memset(&err, 0, sizeof err);
        CHECK_INT(qd_pipeline_open(j4, pt_be, NULL, &p, &err), QD_EMISMATCH);
        CHECK(p == NULL);
        CHECK_CONTAINS(err.msg, "checkpoint state version");
        CHECK_INT(state_next_block(out), 1);
    }
    /* overwrite starts over and finishes. */
    CHECK_OK(qd_pipeline_run(j8o, pt_be, NULL, &err));
    cJSON *cfg = pt_read_json(test_path(out, "quantize_config.json"));
    const cJSON *bits = cJSON_GetObjectItemCaseSensitive(cfg, "bits");
    CHECK(cJSON_IsNumber(bits) && bits->valueint == 8);
    cJSON_Delete(cfg);
    /* The same job again into its finished output (its completion never reached the
     * daemon, say) finishes at once and leaves every file as it was... */
    size_t before_len = 0, after_len = 0;
    char *before = pt_read(test_path(out, "model.safetensors"), &before_len);
    char *report_before = pt_read(test_path(out, "quantd_report.json"), NULL);
    memset(&err, 0, sizeof err);
    CHECK_OK(qd_pipeline_run(j8, pt_be, NULL, &err));
    char *after = pt_read(test_path(out, "model.safetensors"), &after_len);
    char *report_after = pt_read(test_path(out, "quantd_report.json"), NULL);
    CHECK(before && after && before_len == after_len && !memcmp(before, after, before_len));
    CHECK(report_before && report_after && !strcmp(report_before, report_after));
    CHECK(!qd_fs_exists(test_path(out, ".quantd")));
    free(before);
    free(after);
    free(report_before);
    free(report_after);
    /* ... while another job into it is refused. */
    memset(&err, 0, sizeof err);
    CHECK_ERR(qd_pipeline_run(j4, pt_be, NULL, &err));
    CHECK_CONTAINS(err.msg, "overwrite");

    /* Unrelated files. */
    char other[4096];
    snprintf(other, sizeof other, "%s/unrelated", T);
    CHECK_OK(qd_fs_mkdir_p(other, &err));
    CHECK_OK(qd_fs_write_atomic(test_path(other, "notes.txt"), "keep me\n", 8, &err));
    qp_job *ju = pt_job(llama_dir, other, "rtn", "gptq", tokens, NULL);
    qp_job *juo = pt_job(llama_dir, other, "rtn", "gptq", tokens, "\"overwrite\":true,");
    if (ju && juo) {
        memset(&err, 0, sizeof err);
        CHECK_ERR(qd_pipeline_run(ju, pt_be, NULL, &err));
        CHECK_CONTAINS(err.msg, other);
        CHECK_CONTAINS(err.msg, "overwrite");
        CHECK(qd_fs_exists(test_path(other, "notes.txt")));
        /* overwrite removes only a quantd output: somebody's notes are never deleted. */
        memset(&err, 0, sizeof err);
        CHECK_ERR(qd_pipeline_run(juo, pt_be, NULL, &err));
        CHECK_CONTAINS(err.msg, "not a quantd output");
        CHECK(qd_fs_exists(test_path(other, "notes.txt")));
        CHECK(!qd_fs_exists(test_path(other, ".quantd")));
        CHECK(!qd_fs_exists(test_path(other, "model.safetensors")));
    } else CHECK(0);
    qp_job_free(ju);
    qp_job_free(juo);
out:
    qp_job_free(j4);
    qp_job_free(j8);
    qp_job_free(j8o);
}

#define MLP_FLOAT "\"modules_to_not_convert\":[\"mlp.\"],"

/* intermediate 172 (stories260K's): gate/up (N = 172) and down (K = 172) cannot be packed. */
static void float_case(const char *model, const char *method, const char *format, const char *calib,
                       int n_blocks, const char *extra)
{
    char out[4096];
    snprintf(out, sizeof out, "%s/float-%s-%s-%d", T, method, format, n_blocks);
    qp_job *job = pt_run_job("float", model, out, method, format, calib, extra);
    if (!job) return;
    qd_err err = {0};
    cJSON *cfg = pt_read_json(test_path(out, "config.json"));
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(cfg, "quantization_config");
    if (job->format == QP_FORMAT_AWQ_GEMM) {
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(q, "modules_to_not_convert");
        CHECK_INT(cJSON_GetArraySize(m), 3 * n_blocks);
        const cJSON *e;
        int down = 0;
        cJSON_ArrayForEach(e, m) down += cJSON_IsString(e) && strstr(e->valuestring, "layers.0.mlp.down_proj") != NULL;
        CHECK_INT(down, 1);
    } else {
        const cJSON *dyn = cJSON_GetObjectItemCaseSensitive(q, "dynamic");
        CHECK(cJSON_IsObject(dyn));
        CHECK(cJSON_GetObjectItemCaseSensitive(dyn, "-:model\\.layers\\.0\\.mlp\\.down_proj$") != NULL);
        CHECK(cJSON_GetObjectItemCaseSensitive(dyn, "-:model\\.layers\\.0\\.mlp\\.gate_proj$") != NULL);
        int minus = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, dyn) minus += !strncmp(e->string, "-:", 2);
        CHECK_INT(minus, 3 * n_blocks);
    }
    cJSON_Delete(cfg);
    cJSON *rep = pt_read_json(test_path(out, "quantd_report.json"));
    const cJSON *ls = cJSON_GetObjectItemCaseSensitive(rep, "layers"), *l;
    int n_float = 0;
    cJSON_ArrayForEach(l, ls) {
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(l, "method");
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(l, "name");
        const cJSON *note = cJSON_GetObjectItemCaseSensitive(l, "note");
        int is_f = cJSON_IsString(m) && !strcmp(m->valuestring, "float");
        int is_mlp = cJSON_IsString(n) && strstr(n->valuestring, ".mlp.");
        CHECK_INT(is_f, is_mlp ? 1 : 0);
        if (is_f) {
            n_float++;
            CHECK(cJSON_IsString(note) && (strstr(note->valuestring, "modules_to_not_convert") != NULL));
        }
    }
    CHECK_INT(n_float, 3 * n_blocks);
    const cJSON *tot = cJSON_GetObjectItemCaseSensitive(rep, "totals");
    const cJSON *lf = cJSON_GetObjectItemCaseSensitive(tot, "layers_float");
    CHECK(cJSON_IsNumber(lf) && lf->valueint == 3 * n_blocks);
    cJSON_Delete(rep);
    /* The float layers are in the output as .weight; quantized ones as .qweight. */
    st_model *om = NULL;
    CHECK_OK(st_model_open(out, &om, &err));
    if (om) {
        CHECK(st_model_find(om, "model.layers.0.mlp.down_proj.weight") != NULL);
        CHECK(st_model_find(om, "model.layers.0.mlp.down_proj.qweight") == NULL);
        CHECK(st_model_find(om, "model.layers.0.self_attn.q_proj.qweight") != NULL);
    }
    st_model_close(om);
    int64_t n1 = 0, n2 = 0;
    float *a = pt_logits(model, &n1), *b = pt_logits(out, &n2);
    CHECK(a && b && n1 == n2);
    if (a && b) {
        double rel = pt_rel_err(b, a, n1);
        test_checks++;
        if (!(rel < 0.5)) TEST_FAIL_("%s: logits rel error %.4g", out, rel);
    }
    free(a);
    free(b);
    qp_job_free(job);
}

static void test_left_in_float(void)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/llama172", T);
    qd_testgen_opts o = pt_llama_opts(172, 2);
    if (pt_gen_model(dir, &o)) { CHECK(0); return; }
    /* Without the listing such a job is refused at pre-flight (test_refusals_leave_nothing). */
    float_case(dir, "gptq", "gptq", tokens, 2, "\"bits\":8," MLP_FLOAT);
    float_case(dir, "awq", "awq_gemm", tokens, 2, MLP_FLOAT);
    float_case(dir, "rtn", "gptq_v2", NULL, 2, "\"bits\":4,\"calibration\":{\"samples\":8,\"seq_len\":32}," MLP_FLOAT);
}

static void test_stories260k_rtn(void)
{
    const char *sd = test_shared_data();
    if (!sd) { fprintf(stderr, "SKIP test_stories260k_rtn: no shared data\n"); return; }
    char model[4096];
    snprintf(model, sizeof model, "%s/models/stories260K", sd);
    if (!qd_fs_exists(model)) { fprintf(stderr, "SKIP test_stories260k_rtn: %s absent\n", model); return; }
    float_case(model, "rtn", "gptq", NULL, 5, "\"bits\":4,\"calibration\":{\"samples\":8,\"seq_len\":64}," MLP_FLOAT);
}

static void expect_fail(const char *what, const char *model, const char *calib, const char *needle)
{
    char out[4096];
    static int k;
    snprintf(out, sizeof out, "%s/bad-%d", T, k++);
    qp_job *job = pt_job(model, out, "gptq", "gptq", calib, NULL);
    if (!job) { CHECK(0); return; }
    qd_err err = {0};
    int rc = qd_pipeline_run(job, pt_be, NULL, &err);
    test_checks++;
    if (rc >= 0) TEST_FAIL_("%s: succeeded, expected an error", what);
    else if (!needle || !strstr(err.msg, needle)) TEST_FAIL_("%s: message \"%s\" lacks \"%s\"", what, err.msg, needle);
    fprintf(stderr, "%s -> %s\n", what, err.msg);
    qp_job_free(job);
}

static void test_bad_input(void)
{
    char missing[4096], nan_dir[4096], small[4096];
    snprintf(missing, sizeof missing, "%s/no-such-model", T);
    expect_fail("missing model", missing, tokens, "no-such-model");
    expect_fail("missing calibration", llama_dir, test_path(T, "no-such-calib.json"), "no-such-calib");
    snprintf(small, sizeof small, "%s/small.json", T);
    if (pt_write_tokens(small, 20, 128, 5)) CHECK(0);
    expect_fail("corpus too small", llama_dir, small, "small.json");
    snprintf(nan_dir, sizeof nan_dir, "%s/nan", T);
    qd_testgen_opts o = pt_llama_opts(128, 2);
    if (pt_gen_model(nan_dir, &o) || pt_patch_nan(nan_dir, "model.layers.1.mlp.up_proj.weight")) { CHECK(0); return; }
    expect_fail("NaN weight", nan_dir, tokens, "up_proj");
}

/* A sorted "name size" listing of a directory tree's files plus their bytes, to show a
 * directory is exactly as it was. */
static char *tree_digest(const char *dir)
{
    char cmd[4400];
    snprintf(cmd, sizeof cmd, "cd '%s' && find . -type f -print0 | sort -z | xargs -0 sha256sum", dir);
    FILE *f = popen(cmd, "r");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    size_t k;
    while (buf && (k = fread(buf + n, 1, cap - n - 1, f)) > 0) n += k;
    pclose(f);
    if (buf) buf[n] = 0;
    return buf;
}

static void expect_overlap(const char *what, const char *model, const char *out, const char *calib,
                           const char *needle)
{
    qp_job *job = pt_job(model, out, "rtn", "gptq", calib, "\"overwrite\":true,");
    if (!job) { CHECK(0); return; }
    char *before = tree_digest(model);
    char *cal_before = calib ? pt_read(calib, NULL) : NULL;
    qd_err err = {0};
    test_checks++;
    int rc = qd_pipeline_run(job, pt_be, NULL, &err);
    if (rc >= 0) TEST_FAIL_("%s: ran, expected a refusal", what);
    else if (!strstr(err.msg, needle)) TEST_FAIL_("%s: message \"%s\" lacks \"%s\"", what, err.msg, needle);
    fprintf(stderr, "%s -> %s\n", what, err.msg);
    char *after = tree_digest(model);
    CHECK(before && after && !strcmp(before, after));
    if (calib) {
        char *cal_after = pt_read(calib, NULL);
        CHECK(cal_before && cal_after && !strcmp(cal_before, cal_after));
        free(cal_after);
    }
    free(before);
    free(after);
    free(cal_before);
    qp_job_free(job);
}

/* overwrite never removes what the job reads: an output that is, contains or lies inside
 * the model directory, or contains the calibration file, is refused and both stay intact
 * (the job used to delete the model before reading it). */
static void test_output_overlap(void)
{
    char base[4096], model[4200], calib[4300], link[4300], out[4400];
    snprintf(base, sizeof base, "%s/overlap", T);
    snprintf(model, sizeof model, "%s/models/m", base);
    snprintf(calib, sizeof calib, "%s/models/m/calib.json", base);
    qd_testgen_opts o = pt_llama_opts(128, 2);
    if (pt_gen_model(model, &o) || pt_write_tokens(calib, 2000, 128, 9)) { CHECK(0); return; }
    expect_overlap("output is the model", model, model, tokens, "is the model directory");
    snprintf(out, sizeof out, "%s/models", base);
    expect_overlap("output contains the model", model, out, tokens, "contains the model directory");
    snprintf(out, sizeof out, "%s/w4", model);
    expect_overlap("output inside the model", model, out, tokens, "lies inside the model directory");
    snprintf(out, sizeof out, "%s/models/m/", base);
    expect_overlap("output is the model, trailing slash", model, out, tokens, "is the model directory");
    snprintf(out, sizeof out, "%s/models/m/../m", base);
    expect_overlap("output is the model through ..", model, out, tokens, "is the model directory");
    snprintf(link, sizeof link, "%s/alias", base);
    CHECK(symlink(model, link) == 0);
    expect_overlap("output is a link to the model", model, link, tokens, "is the model directory");
    /* The calibration file: a directory of calibration data with the output around it. */
    char cdir[4200], cfile[4300];
    snprintf(cdir, sizeof cdir, "%s/data", base);
    snprintf(cfile, sizeof cfile, "%s/data/c.json", base);
    qd_err err = {0};
    if (qd_fs_mkdir_p(cdir, &err) || pt_write_tokens(cfile, 2000, 128, 4)) { CHECK(0); return; }
    expect_overlap("output contains the calibration", model, cdir, cfile, "contains the calibration file");
    CHECK(qd_fs_exists(cfile));
    /* A calibration file inside the model directory is fine when the output is elsewhere. */
    snprintf(out, sizeof out, "%s/elsewhere", base);
    qp_job *ok = pt_job(model, out, "rtn", "gptq", calib, "\"overwrite\":true,");
    CHECK(ok && qd_pipeline_run(ok, pt_be, NULL, &err) == 0);
    qp_job_free(ok);
    /* The protected paths a caller adds (the daemon's allow-roots): is or contains -> refused. */
    char root_dir[4200], out2[4300];
    snprintf(root_dir, sizeof root_dir, "%s/roots/r", base);
    snprintf(out2, sizeof out2, "%s/roots/r/job", base);
    qp_job *j = pt_job(model, out2, "rtn", "gptq", tokens, NULL);
    qd_protected_path root = {root_dir, "an allow-root"};
    if (j) {
        memset(&err, 0, sizeof err);
        CHECK_OK(qd_job_paths_check(j, &root, 1, &err));           /* inside an allow-root: fine */
        free(j->output);
        j->output = strdup(test_path(base, "roots"));
        CHECK_ERR(qd_job_paths_check(j, &root, 1, &err));
        CHECK_CONTAINS(err.msg, "contains an allow-root");
        free(j->output);
        j->output = strdup(root_dir);
        CHECK_ERR(qd_job_paths_check(j, &root, 1, &err));
        CHECK_CONTAINS(err.msg, "is an allow-root");
    } else CHECK(0);
    qp_job_free(j);
}

/* A job refused by a check creates nothing: no output directory, no empty .quantd, so its
 * resubmission is not refused for an output that "exists and is not this job's checkpoint". */
static void expect_refused_clean(const char *what, const char *json, const char *out, int code, const char *needle)
{
    qp_job *job = NULL;
    qp_err pe = {0};
    if (qp_job_parse(json, strlen(json), &job, &pe)) { TEST_FAIL_("%s: %s", what, pe.msg); return; }
    for (int attempt = 0; attempt < 2; attempt++) {   /* the retry sees the same error */
        qd_err err = {0};
        int rc = qd_pipeline_run(job, pt_be, NULL, &err);
        CHECK_INT(rc, code);
        CHECK_CONTAINS(err.msg, needle);
        if (attempt == 0) fprintf(stderr, "%s -> %s\n", what, err.msg);
        test_checks++;
        if (qd_fs_exists(out)) TEST_FAIL_("%s: left %s behind", what, out);
    }
    qp_job_free(job);
}

static void test_refusals_leave_nothing(void)
{
    char json[16384], out[4096], cdir[4096];
    snprintf(out, sizeof out, "%s/refused/out", T);
    snprintf(cdir, sizeof cdir, "%s/calib-dir", T);
    qd_err err = {0};
    CHECK_OK(qd_fs_mkdir_p(cdir, &err));
    snprintf(json, sizeof json, "{\"model\":\"%s\",\"output\":\"%s\",\"method\":\"gptq\",\"group_size\":32,\"calibration\":{\"path\":\"%s\"}}",
             llama_dir, out, cdir);
    expect_refused_clean("calibration path is a directory", json, out, QD_EINVAL, "is a directory");
    /* Widths here are multiples of 64: group 100 fits no layer. It used to finish "done"
     * with every layer left in float. */
    snprintf(json, sizeof json, "{\"model\":\"%s\",\"output\":\"%s\",\"method\":\"rtn\",\"group_size\":100}", llama_dir, out);
    expect_refused_clean("group size fits no layer", json, out, QD_EINVAL, "model.layers.0.self_attn.q_proj cannot be quantized");
    expect_refused_clean("group size fits no layer (names the fix)", json, out, QD_EINVAL, "modules_to_not_convert");
    snprintf(json, sizeof json, "{\"model\":\"%s\",\"output\":\"%s\",\"method\":\"gptq\",\"group_size\":32,\"calibration\":{\"path\":\"%s/none.json\"}}",
             llama_dir, out, T);
    expect_refused_clean("calibration missing", json, out, QD_ENOTFOUND, "none.json");
}

int main(void)
{
    qd_testgen_opts lo = pt_llama_opts(128, 3);
    lo.dtype = QD_DTYPE_BF16;
    if (pt_setup(2, 4000, 128, 3, &T, &tokens) || pt_setup_model("llama", &lo, llama_dir, sizeof llama_dir)) return 1;
    TEST_RUN(test_resume_gptq);
    TEST_RUN(test_resume_awq);
    TEST_RUN(test_resume_rtn_v2);
    TEST_RUN(test_resume_awq_gptq_ct);
    TEST_RUN(test_resume_gptq_bf16);
    TEST_RUN(test_resume_folds_damaged);
    TEST_RUN(test_before_commit_refused);
    TEST_RUN(test_fingerprint_and_overwrite);
    TEST_RUN(test_left_in_float);
    TEST_RUN(test_stories260k_rtn);
    TEST_RUN(test_bad_input);
    TEST_RUN(test_output_overlap);
    TEST_RUN(test_refusals_leave_nothing);
    return pt_teardown();
}
