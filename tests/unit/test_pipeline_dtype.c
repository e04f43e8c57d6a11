/* The output config.json's dtype keys (issue #16): a job's output must carry `dtype`
 * (transformers 5) and `torch_dtype` (older transformers, vLLM), once each, equal, and naming
 * the dtype its unquantized tensors are stored in. Before this, the writer replaced only
 * `torch_dtype` with "float16" and kept a source `dtype`, so a float32 model saved by
 * transformers 5 came out with `"torch_dtype": "float16"` beside `"dtype": "float32"` and F32
 * embeddings.
 *
 * Inputs: the transformers-written llama of tests/data/families (config `dtype` "bfloat16",
 * BF16 tensors); generated llamas whose config says `torch_dtype` (F16 tensors), `dtype`
 * alone (F32: the case), and a `torch_dtype` that contradicts the F32 tensors (the
 * tensors decide, since they are what a loader reads). */
#include "pipeline_testlib.h"
#include "quant/pipeline/output.h"

#include <stdio.h>
#include <string.h>

static const char *T;
static const char *tokens;

/* Rewrites dir/config.json: drops both dtype keys, then sets `key` to value. */
static int set_config_dtype(const char *dir, const char *key, const char *value)
{
    cJSON *cfg = pt_read_json(test_path(dir, "config.json"));
    if (!cfg) return -1;
    cJSON_DeleteItemFromObjectCaseSensitive(cfg, "torch_dtype");
    cJSON_DeleteItemFromObjectCaseSensitive(cfg, "dtype");
    cJSON_AddStringToObject(cfg, key, value);
    char *s = cJSON_Print(cfg);
    cJSON_Delete(cfg);
    qd_err err = {0};
    int rc = s ? qd_fs_write_atomic(test_path(dir, "config.json"), s, strlen(s), &err) : -1;
    free(s);
    return rc;
}

static int count_key(const cJSON *obj, const char *key)
{
    int n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, obj) n += e->string && !strcmp(e->string, key);
    return n;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* Runs a GPTQ job (group 32, 4 bits) on model and checks the output's dtype keys and tensors. */
static void check_job(const char *model, const char *tag, const char *method, const char *format,
                      qd_dtype want, const char *want_name)
{
    char out[4096];
    snprintf(out, sizeof out, "%s/out-%s-%s", T, tag, method);
    qp_job *job = pt_run_job(tag, model, out, method, format, tokens, "\"bits\":4,");
    if (!job) return;
    qp_job_free(job);
    qd_err err = {0};
    cJSON *cfg = pt_read_json(test_path(out, "config.json"));
    CHECK(cfg != NULL);
    if (!cfg) return;
    CHECK_INT(count_key(cfg, "dtype"), 1);
    CHECK_INT(count_key(cfg, "torch_dtype"), 1);
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(cfg, "dtype");
    const cJSON *td = cJSON_GetObjectItemCaseSensitive(cfg, "torch_dtype");
    CHECK(cJSON_IsString(d) && cJSON_IsString(td));
    if (cJSON_IsString(d) && cJSON_IsString(td)) {
        CHECK_STR(d->valuestring, want_name);
        CHECK_STR(td->valuestring, want_name);
    }
    cJSON_Delete(cfg);

    /* Every floating tensor but the format's F16 scales is in the named dtype. */
    st_model *om = NULL;
    CHECK_OK(st_model_open(out, &om, &err));
    int n_float = 0;
    for (size_t i = 0; om && i < st_model_count(om); i++) {
        const st_tensor *t = st_model_tensor(om, i);
        if (t->dtype != QD_DTYPE_F32 && t->dtype != QD_DTYPE_F16 && t->dtype != QD_DTYPE_BF16) continue;
        if (ends_with(t->name, ".scales")) {
            CHECK_INT(t->dtype, QD_DTYPE_F16);
            continue;
        }
        n_float++;
        test_checks++;
        if (t->dtype != want)
            TEST_FAIL_("%s: %s is %s, config says %s", tag, t->name, qd_dtype_name(t->dtype), want_name);
    }
    CHECK(n_float >= 3);   /* embeddings, norms, lm_head at least */
    st_model_close(om);
}

static void test_dtype_key_bf16(void)
{
    char model[4300];
    snprintf(model, sizeof model, "%s/tests/data/families/llama", test_source_dir());
    cJSON *cfg = pt_read_json(test_path(model, "config.json"));
    CHECK(cfg != NULL);
    /* The premise: transformers 5 wrote `dtype` and no `torch_dtype`. */
    if (cfg) {
        CHECK_INT(count_key(cfg, "dtype"), 1);
        CHECK_INT(count_key(cfg, "torch_dtype"), 0);
    }
    cJSON_Delete(cfg);
    check_job(model, "hf-bf16", "gptq", "gptq", QD_DTYPE_BF16, "bfloat16");
    check_job(model, "hf-bf16", "awq", "awq_gemm", QD_DTYPE_BF16, "bfloat16");
}

static void gen(const char *name, qd_dtype dt, char *dir, size_t cap)
{
    snprintf(dir, cap, "%s/%s", T, name);
    qd_testgen_opts o = pt_llama_opts(64, 2);
    o.dtype = dt;
    CHECK_OK(pt_gen_model(dir, &o));
}

static void test_torch_dtype_key_f16(void)
{
    char dir[4096];
    gen("gen-f16", QD_DTYPE_F16, dir, sizeof dir);
    cJSON *cfg = pt_read_json(test_path(dir, "config.json"));
    CHECK(cfg && count_key(cfg, "torch_dtype") == 1 && count_key(cfg, "dtype") == 0);
    cJSON_Delete(cfg);
    check_job(dir, "gen-f16", "gptq", "gptq", QD_DTYPE_F16, "float16");
}

static void test_dtype_key_f32(void)
{
    char dir[4096];
    gen("gen-f32-dtype", QD_DTYPE_F32, dir, sizeof dir);
    CHECK_OK(set_config_dtype(dir, "dtype", "float32"));
    check_job(dir, "gen-f32-dtype", "gptq", "gptq_v2", QD_DTYPE_F32, "float32");
}

static void test_config_disagrees_with_tensors(void)
{
    char dir[4096];
    gen("gen-f32-says-bf16", QD_DTYPE_F32, dir, sizeof dir);
    CHECK_OK(set_config_dtype(dir, "torch_dtype", "bfloat16"));
    check_job(dir, "gen-f32-says-bf16", "rtn", "gptq", QD_DTYPE_F32, "float32");
}

static void test_float_dtype_rule(void)
{
    CHECK_STR(qd_output_dtype_name(QD_DTYPE_F32), "float32");
    CHECK_STR(qd_output_dtype_name(QD_DTYPE_F16), "float16");
    CHECK_STR(qd_output_dtype_name(QD_DTYPE_BF16), "bfloat16");
    CHECK(qd_output_dtype_name(QD_DTYPE_I32) == NULL);
    qd_err err = {0};
    CHECK_ERR(qd_output_write_config(T, T, NULL, QD_DTYPE_I32, &err));
    CHECK_CONTAINS(err.msg, "I32");
}

int main(void)
{
    /* Ids below 128: valid for the generated llamas (vocab 128) and the family llama (256). */
    if (pt_setup(2, 2000, 128, 5, &T, &tokens)) return 1;
    TEST_RUN(test_float_dtype_rule);
    TEST_RUN(test_dtype_key_bf16);
    TEST_RUN(test_torch_dtype_key_f16);
    TEST_RUN(test_dtype_key_f32);
    TEST_RUN(test_config_disagrees_with_tensors);
    return pt_teardown();
}
