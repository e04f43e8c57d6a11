/* The pipeline end to end on tiny generated models: every method x format writes an output
 * directory that follows ../shared/ref/formats.md to the letter (tensor names, shapes and
 * dtypes; quantization_config keys; quantize_config.json equal to it; dtype = torch_dtype = the source's;
 * unquantized tensors byte-identical to the source; tokenizer/generation files copied; a
 * report with one entry per linear; .quantd removed), sharding with an index, and the
 * output loads back with logits close to the float model's. */
#include "pipeline_testlib.h"
#include "quant/pipeline/cost.h"

static const char *T;          /* temp root */
static const char *tokens;
static char llama_dir[4096], opt_dir[4096];
static const char *LINEARS[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                                "out_proj", "fc1", "fc2"};

static int is_linear_weight(const char *name, char *prefix, size_t cap)
{
    const char *dot = strrchr(name, '.');
    if (!dot || strcmp(dot, ".weight") || !strstr(name, "layers.")) return 0;
    for (size_t i = 0; i < sizeof LINEARS / sizeof LINEARS[0]; i++) {
        size_t l = strlen(LINEARS[i]);
        if ((size_t)(dot - name) >= l && !strncmp(dot - l, LINEARS[i], l) && dot[-l - 1] == '.') {
            snprintf(prefix, cap, "%.*s", (int)(dot - name), name);
            return 1;
        }
    }
    return 0;
}

static void check_shape(const st_tensor *t, qd_dtype dt, int64_t d0, int64_t d1, const char *what)
{
    test_checks++;
    int ndim = d1 < 0 ? 1 : 2;
    if (!t) { TEST_FAIL_("%s: missing", what); return; }
    if (t->dtype != dt || t->ndim != ndim || t->shape[0] != d0 || (ndim == 2 && t->shape[1] != d1))
        TEST_FAIL_("%s: dtype %s shape [%lld, %lld], expected %s [%lld, %lld]", what, qd_dtype_name(t->dtype),
                   (long long)t->shape[0], (long long)(t->ndim > 1 ? t->shape[1] : -1), qd_dtype_name(dt),
                   (long long)d0, (long long)d1);
}

/* Names of the layers the report says stayed in float ("" when none), '|' separated. */
static int report_is_float(const cJSON *report, const char *layer)
{
    const cJSON *ls = cJSON_GetObjectItemCaseSensitive(report, "layers"), *l;
    cJSON_ArrayForEach(l, ls) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(l, "name");
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(l, "method");
        if (cJSON_IsString(n) && !strcmp(n->valuestring, layer))
            return cJSON_IsString(m) && !strcmp(m->valuestring, "float");
    }
    return -1;
}

/* Validates out (the job's output) against src. float_expected: linears that must be float. */
static void validate_output(const qp_job *job, const char *src, const char *out, int n_linears_expected,
                            int n_float_expected)
{
    qd_err err = {0};
    CHECK(!qd_fs_exists(test_path(out, ".quantd")));
    cJSON *report = pt_read_json(test_path(out, "quantd_report.json"));
    CHECK(report != NULL);
    if (!report) return;
    const cJSON *layers = cJSON_GetObjectItemCaseSensitive(report, "layers");
    CHECK_INT(cJSON_GetArraySize(layers), n_linears_expected);
    int n_float = 0;
    const cJSON *l;
    cJSON_ArrayForEach(l, layers) {
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(l, "method");
        if (cJSON_IsString(m) && !strcmp(m->valuestring, "float")) {
            n_float++;
            const cJSON *note = cJSON_GetObjectItemCaseSensitive(l, "note");
            CHECK(cJSON_IsString(note) && strlen(note->valuestring) > 10);
        } else {
            CHECK(cJSON_IsString(m) && !strcmp(m->valuestring, qp_method_name(job->method)));
        }
    }
    CHECK_INT(n_float, n_float_expected);
    /* Where the time went: one cost record per block, every stage named, the passes over
     * the calibration tokens (true-sequential: one per input group, the MLP-half ones from
     * the kept residual stream, 4; AWQ adds its float capture for the search; the forward
     * for the next block is down_proj alone on the kept MLP activation, not a pass;
     * otherwise one capture and that forward), the checkpoint bytes. */
    const cJSON *blocks = cJSON_GetObjectItemCaseSensitive(report, "blocks"), *b;
    const cJSON *tot = cJSON_GetObjectItemCaseSensitive(report, "totals");
    CHECK_INT(cJSON_GetArraySize(blocks), cJSON_GetObjectItemCaseSensitive(tot, "blocks")->valueint);
    int awq_search = job->method == QP_METHOD_AWQ || job->method == QP_METHOD_AWQ_GPTQ;
    int sequential = awq_search || (job->method == QP_METHOD_GPTQ && job->true_sequential);
    double bytes = 0;
    int bi = 0;
    cJSON_ArrayForEach(b, blocks) {
        CHECK_INT(cJSON_GetObjectItemCaseSensitive(b, "block")->valueint, bi);
        int passes = cJSON_GetObjectItemCaseSensitive(b, "forward_passes")->valueint;
        if (awq_search) CHECK_INT(passes, 5);   /* + the float capture of the scale search */
        else CHECK_INT(passes, sequential ? 4 : 2);
        double bw = cJSON_GetObjectItemCaseSensitive(b, "bytes_written")->valuedouble;
        CHECK(bw > 0);
        bytes += bw;
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(b, "stages");
        double sum = 0;
        for (int s = 0; s < QD_STAGE_COUNT; s++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(st, qd_stage_name(s));
            CHECK(cJSON_IsNumber(v) && v->valuedouble >= 0);
            if (cJSON_IsNumber(v)) sum += v->valuedouble;
        }
        CHECK(sum <= cJSON_GetObjectItemCaseSensitive(b, "seconds")->valuedouble + 1e-6);
        CHECK(cJSON_GetObjectItemCaseSensitive(st, "calibrate")->valuedouble > 0);
        bi++;
    }
    CHECK(bytes == cJSON_GetObjectItemCaseSensitive(tot, "checkpoint_bytes_written")->valuedouble);
    CHECK(cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(tot, "stage_seconds")));

    /* Configs. */
    cJSON *cfg = pt_read_json(test_path(out, "config.json"));
    cJSON *qcf = pt_read_json(test_path(out, "quantize_config.json"));
    CHECK(cfg && qcf);
    if (!cfg || !qcf) { cJSON_Delete(cfg); cJSON_Delete(qcf); cJSON_Delete(report); return; }
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(cfg, "quantization_config");
    CHECK(cJSON_IsObject(q));
    CHECK(cJSON_Compare(q, qcf, 1));
    /* dtype and torch_dtype both name the source's dtype (the llama is F16, the OPT F32);
     * test_pipeline_dtype covers the rule in detail. */
    const cJSON *td = cJSON_GetObjectItemCaseSensitive(cfg, "torch_dtype");
    const cJSON *dd = cJSON_GetObjectItemCaseSensitive(cfg, "dtype");
    const char *want_dt = !strcmp(src, opt_dir) ? "float32" : "float16";
    CHECK(cJSON_IsString(td) && !strcmp(td->valuestring, want_dt));
    CHECK(cJSON_IsString(dd) && !strcmp(dd->valuestring, want_dt));
    const cJSON *bits = cJSON_GetObjectItemCaseSensitive(q, "bits");
    const cJSON *gs = cJSON_GetObjectItemCaseSensitive(q, "group_size");
    const cJSON *qm = cJSON_GetObjectItemCaseSensitive(q, "quant_method");
    CHECK(cJSON_IsNumber(bits) && bits->valueint == job->bits);
    CHECK(cJSON_IsNumber(gs) && gs->valueint == job->group_size);
    int awq = job->format == QP_FORMAT_AWQ_GEMM;
    CHECK(cJSON_IsString(qm) && !strcmp(qm->valuestring, awq ? "awq" : "gptq"));
    if (awq) {
        const cJSON *zp = cJSON_GetObjectItemCaseSensitive(q, "zero_point");
        const cJSON *ver = cJSON_GetObjectItemCaseSensitive(q, "version");
        CHECK(cJSON_IsBool(zp) && cJSON_IsTrue(zp) == !job->sym);
        CHECK(cJSON_IsString(ver) && !strcmp(ver->valuestring, "gemm"));
        const cJSON *mtnc = cJSON_GetObjectItemCaseSensitive(q, "modules_to_not_convert");
        CHECK(mtnc != NULL);
        if (n_float_expected) CHECK_INT(cJSON_GetArraySize(mtnc), n_float_expected);
        else CHECK(cJSON_IsNull(mtnc));
    } else {
        static const char *keys[] = {"desc_act", "sym", "damp_percent", "static_groups", "true_sequential",
                                     "checkpoint_format", "lm_head"};
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
            CHECK(cJSON_GetObjectItemCaseSensitive(q, keys[i]) != NULL);
        const cJSON *sym = cJSON_GetObjectItemCaseSensitive(q, "sym");
        CHECK(cJSON_IsBool(sym) && cJSON_IsTrue(sym) == job->sym);
        const cJSON *da = cJSON_GetObjectItemCaseSensitive(q, "desc_act");
        /* static groups keep the plain layout, written desc_act false (fmt_gptq.c) */
        CHECK(cJSON_IsBool(da) && cJSON_IsTrue(da) == (job->desc_act && !job->static_groups));
        const cJSON *cf = cJSON_GetObjectItemCaseSensitive(q, "checkpoint_format");
        CHECK(cJSON_IsString(cf) && !strcmp(cf->valuestring, job->format == QP_FORMAT_GPTQ_V2 ? "gptq_v2" : "gptq"));
        const cJSON *dyn = cJSON_GetObjectItemCaseSensitive(q, "dynamic");
        if (n_float_expected) {
            CHECK(cJSON_IsObject(dyn));
            int minus = 0;
            const cJSON *e;
            cJSON_ArrayForEach(e, dyn) if (!strncmp(e->string, "-:", 2)) minus++;
            CHECK_INT(minus, n_float_expected);
        }
    }
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(q, "meta");
    const cJSON *mm = cJSON_GetObjectItemCaseSensitive(meta, "method");
    CHECK(cJSON_IsString(mm) && !strcmp(mm->valuestring, qp_method_name(job->method)));
    /* The llama test model has 2 KV heads for 4 heads: AWQ scales v -> o per KV channel. */
    const cJSON *an = cJSON_GetObjectItemCaseSensitive(report, "awq_note");
    if ((job->method == QP_METHOD_AWQ || job->method == QP_METHOD_AWQ_GPTQ) && strstr(src, "llama"))
        CHECK(cJSON_IsString(an) && strstr(an->valuestring, "one scale per KV channel (grouped-query attention, 2 heads"));

    /* Copied files. */
    CHECK(pt_same_file(test_path(src, "generation_config.json"), test_path(out, "generation_config.json")));
    CHECK(pt_same_file(test_path(src, "tokenizer_config.json"), test_path(out, "tokenizer_config.json")));

    /* Tensors. */
    st_model *sm = NULL, *om = NULL;
    CHECK_OK(st_model_open(src, &sm, &err));
    CHECK_OK(st_model_open(out, &om, &err));
    int bitsv = job->bits;
    int uses_awq = job->method == QP_METHOD_AWQ || job->method == QP_METHOD_AWQ_GPTQ;
    size_t n_expected_out = 0;
    for (size_t i = 0; sm && om && i < st_model_count(sm); i++) {
        const st_tensor *s = st_model_tensor(sm, i);
        char prefix[256], name[300];
        if (is_linear_weight(s->name, prefix, sizeof prefix) && report_is_float(report, prefix) == 0) {
            int64_t N = s->shape[0], K = s->shape[1];
            int64_t G = job->group_size > 0 ? K / job->group_size : 1;
            snprintf(name, sizeof name, "%s.qweight", prefix);
            const st_tensor *qw = st_model_find(om, name);
            snprintf(name, sizeof name, "%s.qzeros", prefix);
            const st_tensor *qz = st_model_find(om, name);
            snprintf(name, sizeof name, "%s.scales", prefix);
            const st_tensor *sc = st_model_find(om, name);
            snprintf(name, sizeof name, "%s.g_idx", prefix);
            const st_tensor *gi = st_model_find(om, name);
            snprintf(name, sizeof name, "%s.weight", prefix);
            CHECK(st_model_find(om, name) == NULL);
            if (awq) {
                check_shape(qw, QD_DTYPE_I32, K, N / 8, prefix);
                check_shape(qz, QD_DTYPE_I32, G, N / 8, prefix);
                check_shape(sc, QD_DTYPE_F16, G, N, prefix);
                CHECK(gi == NULL);
            } else {
                check_shape(qw, QD_DTYPE_I32, K * bitsv / 32, N, prefix);
                check_shape(qz, QD_DTYPE_I32, G, N * bitsv / 32, prefix);
                check_shape(sc, QD_DTYPE_F16, G, N, prefix);
                check_shape(gi, QD_DTYPE_I32, K, -1, prefix);
                /* Without desc_act g_idx[k] = k / group_size. */
                if (gi && !job->desc_act && gi->dtype == QD_DTYPE_I32) {
                    const int32_t *g = gi->data;
                    int ok = 1;
                    for (int64_t k = 0; k < K; k++) ok &= g[k] == (job->group_size > 0 ? k / job->group_size : 0);
                    CHECK(ok);
                }
                /* Symmetric v1 zeros are the fixed 2^(b-1) - 1 words. */
                if (qz && job->sym && job->format == QP_FORMAT_GPTQ && bitsv == 8 && qz->dtype == QD_DTYPE_I32)
                    CHECK_INT((uint32_t)((const int32_t *)qz->data)[0], 0x7F7F7F7Fu);
                if (qz && job->sym && job->format == QP_FORMAT_GPTQ_V2 && bitsv == 8 && qz->dtype == QD_DTYPE_I32)
                    CHECK_INT((uint32_t)((const int32_t *)qz->data)[0], 0x80808080u);
            }
            snprintf(name, sizeof name, "%s.bias", prefix);
            const st_tensor *sb = st_model_find(sm, name), *ob = st_model_find(om, name);
            if (sb) check_shape(ob, QD_DTYPE_F16, N, -1, name);
            n_expected_out += 3 + (!awq) + (sb != NULL);
            continue;
        }
        if (is_linear_weight(s->name, prefix, sizeof prefix)) {
            /* Left in float: same name, dtype and shape (values may carry AWQ scales). */
            const st_tensor *o = st_model_find(om, s->name);
            CHECK(o && o->dtype == s->dtype && o->ndim == s->ndim);
            n_expected_out++;
            if (o && !uses_awq) CHECK(s->end - s->begin == o->end - o->begin && !memcmp(s->data, o->data, s->end - s->begin));
            continue;
        }
        if (strstr(s->name, ".bias") && is_linear_weight(
                (snprintf(name, sizeof name, "%.*sweight", (int)(strlen(s->name) - 4), s->name), name), prefix, sizeof prefix)
            && report_is_float(report, prefix) == 0)
            continue;   /* counted with its layer */
        n_expected_out++;
        const st_tensor *o = st_model_find(om, s->name);
        test_checks++;
        if (!o) { TEST_FAIL_("%s missing from the output", s->name); continue; }
        CHECK_INT(o->dtype, s->dtype);
        /* Everything else is bit-exact, except block norms (and OPT biases of scaled layers)
         * that AWQ folding changed. */
        int may_change = uses_awq && strstr(s->name, "layers.");
        if (!may_change) {
            test_checks++;
            if (s->end - s->begin != o->end - o->begin || memcmp(s->data, o->data, s->end - s->begin))
                TEST_FAIL_("%s: not byte-identical to the source", s->name);
        }
    }
    if (sm && om) CHECK_INT(st_model_count(om), n_expected_out);
    st_model_close(sm);
    st_model_close(om);
    cJSON_Delete(cfg);
    cJSON_Delete(qcf);
    cJSON_Delete(report);
}

static void check_logits(const char *src, const char *out, double tol)
{
    int64_t n1 = 0, n2 = 0;
    float *a = pt_logits(src, &n1), *b = pt_logits(out, &n2);
    CHECK(a && b && n1 == n2);
    if (a && b) {
        double rel = pt_rel_err(b, a, n1);
        if (getenv("PT_VERBOSE")) fprintf(stderr, "logits rel error %-60s %.5f\n", out, rel);
        test_checks++;
        if (!(rel < tol)) TEST_FAIL_("%s: logits rel error %.4g >= %.4g", out, rel, tol);
        /* A broken pack usually gives garbage, not a small error: it must not be exact either. */
        CHECK(rel > 0);
    }
    free(a);
    free(b);
}

static void run_case(const char *model, const char *method, const char *format, int bits, const char *extra,
                     int n_linears, double tol)
{
    static int seq;
    char out[4096], ex[512];
    snprintf(out, sizeof out, "%s/out-%d-%s-%s-%d", T, seq++, method, format, bits);
    snprintf(ex, sizeof ex, "\"bits\":%d,%s", bits, extra ? extra : "");
    qp_job *job = pt_run_job(out, model, out, method, format, tokens, ex);
    if (!job) return;
    validate_output(job, model, out, n_linears, 0);
    check_logits(model, out, tol);
    qp_job_free(job);
}

static void test_llama_methods_formats(void)
{
    static const char *methods[] = {"gptq", "awq", "rtn", "awq+gptq"};
    for (int m = 0; m < 4; m++) {
        /* 8 bits in the GPTQ formats: the logits must be close. */
        run_case(llama_dir, methods[m], "gptq", 8, NULL, 21, 0.05);
        run_case(llama_dir, methods[m], "gptq_v2", 8, NULL, 21, 0.05);
        run_case(llama_dir, methods[m], "awq_gemm", 4, NULL, 21, 0.35);
    }
    /* Asymmetric v1 at 4 bits, act-order, and group -1. */
    run_case(llama_dir, "gptq", "gptq", 4, "\"sym\":false,", 21, 0.35);
    run_case(llama_dir, "gptq", "gptq", 4, "\"desc_act\":true,", 21, 0.35);
    run_case(llama_dir, "gptq", "gptq_v2", 3, "\"desc_act\":true,\"static_groups\":true,\"sym\":false,", 21, 0.6);
}

/* error_direct_rows: over every calibration row (8 x 32) the direct ||(W - Q) X|| / ||W X||
 * equals the Hessian-based rel_error of every layer within float tolerance, for each method
 * (true-sequential GPTQ, whose numerator is its own column losses; AWQ's folded block; RTN
 * on the float block); over fewer rows it is reported too, and the output does not change. */
static void direct_case(const char *method, int rows, int expect_equal)
{
    char out[4096], extra[128];
    snprintf(out, sizeof out, "%s/direct-%s-%d", T, method, rows);
    snprintf(extra, sizeof extra, "\"bits\":4,\"error_direct_rows\":%d,", rows);
    qp_job *job = pt_job(llama_dir, out, method, "gptq_v2", tokens, extra);
    if (!job) { CHECK(0); return; }
    qd_err err = {0};
    CHECK_OK(qd_pipeline_run(job, pt_be, NULL, &err));
    cJSON *rep = pt_read_json(test_path(out, "quantd_report.json"));
    const cJSON *l;
    int n = 0;
    cJSON_ArrayForEach(l, cJSON_GetObjectItemCaseSensitive(rep, "layers")) {
        const cJSON *he = cJSON_GetObjectItemCaseSensitive(l, "rel_error");
        const cJSON *de = cJSON_GetObjectItemCaseSensitive(l, "rel_error_direct");
        test_checks++;
        if (!cJSON_IsNumber(he) || !cJSON_IsNumber(de) || !(de->valuedouble > 0)) {
            TEST_FAIL_("%s: %s has no rel_error_direct", method, cJSON_GetObjectItemCaseSensitive(l, "name")->valuestring);
            continue;
        }
        n++;
        if (expect_equal) CHECK_NEAR(de->valuedouble, he->valuedouble, 1e-3 * he->valuedouble);
    }
    CHECK_INT(n, 21);
    cJSON_Delete(rep);
    qp_job_free(job);
}

static void test_error_direct(void)
{
    direct_case("gptq", 256, 1);
    direct_case("awq", 256, 1);
    direct_case("rtn", 256, 1);
    direct_case("gptq", 16, 0);
}

static void test_opt(void)
{
    run_case(opt_dir, "gptq", "gptq", 8, NULL, 12, 0.05);
    run_case(opt_dir, "awq", "awq_gemm", 4, NULL, 12, 0.35);
}

/* A small shard_size forces several shards and an index that names every tensor. */
static void test_shards(void)
{
    char out[4096];
    snprintf(out, sizeof out, "%s/out-shards", T);
    qp_job *job = pt_job(llama_dir, out, "rtn", "gptq", tokens, "\"bits\":4,\"shard_size\":20000,");
    CHECK(job != NULL);
    if (!job) return;
    qd_err err = {0};
    CHECK_OK(qd_pipeline_run(job, pt_be, NULL, &err));
    CHECK(!qd_fs_exists(test_path(out, "model.safetensors")));
    cJSON *idx = pt_read_json(test_path(out, "model.safetensors.index.json"));
    CHECK(idx != NULL);
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(idx, "weight_map");
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(idx, "metadata");
    const cJSON *total = cJSON_GetObjectItemCaseSensitive(meta, "total_size");
    CHECK(cJSON_IsObject(map) && cJSON_IsNumber(total));
    st_model *om = NULL;
    CHECK_OK(st_model_open(out, &om, &err));
    if (om && map) {
        CHECK_INT(cJSON_GetArraySize(map), st_model_count(om));
        double sum = 0;
        char files[16][64];
        int n_files = 0;
        for (size_t i = 0; i < st_model_count(om); i++) {
            const st_tensor *t = st_model_tensor(om, i);
            sum += (double)(t->end - t->begin);
            const cJSON *f = cJSON_GetObjectItemCaseSensitive(map, t->name);
            CHECK(cJSON_IsString(f) && !strcmp(f->valuestring, st_model_shard_of(om, t->name)));
            int seen = 0;
            for (int k = 0; k < n_files; k++) seen |= !strcmp(files[k], f ? f->valuestring : "");
            if (!seen && n_files < 16 && cJSON_IsString(f)) snprintf(files[n_files++], 64, "%s", f->valuestring);
        }
        CHECK(n_files >= 3);
        CHECK_NEAR(sum, total ? total->valuedouble : -1, 0.5);
        for (int k = 0; k < n_files; k++) {
            char want[64];
            snprintf(want, sizeof want, "-of-%05d.safetensors", n_files);
            CHECK_CONTAINS(files[k], want);
        }
    }
    st_model_close(om);
    cJSON_Delete(idx);
    validate_output(job, llama_dir, out, 21, 0);
    check_logits(llama_dir, out, 0.35);
    qp_job_free(job);
}

int main(void)
{
    if (pt_setup(2, 4000, 128, 3, &T, &tokens)) return 1;
    qd_testgen_opts lo = pt_llama_opts(128, 3);
    lo.dtype = QD_DTYPE_F16;
    qd_testgen_opts oo = qd_testgen_defaults(QD_ARCH_OPT);
    oo.hidden = 64;
    oo.intermediate = 128;
    oo.n_layers = 2;
    oo.n_heads = 4;
    oo.n_kv_heads = 4;
    oo.vocab = 128;
    oo.max_pos = 128;
    if (pt_setup_model("llama", &lo, llama_dir, sizeof llama_dir) || pt_setup_model("opt", &oo, opt_dir, sizeof opt_dir))
        return 1;
    TEST_RUN(test_llama_methods_formats);
    TEST_RUN(test_opt);
    TEST_RUN(test_error_direct);
    TEST_RUN(test_shards);
    return pt_teardown();
}
