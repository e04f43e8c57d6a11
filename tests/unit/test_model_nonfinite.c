/* Every float tensor a job loads is scanned for NaN and infinity where it is read
 * (quant/model/model_load.c, quant/core/finite.h), not only the linears GPTQ checks: a norm
 * weight, a bias, the embeddings, the final norm and a router. A job on a generated model
 * with one such value fails, and the error names the tensor and the element, whether the
 * kernel check is on or off (with it on, a NaN norm used to be reported as a kernel
 * mismatch; with it off, the job used to finish with NaN in its output). */
#include <stdio.h>
#include <string.h>

#include "pipeline_testlib.h"

static const char *tokens;

static int patch_inf(const char *dir, const char *name) { return pt_patch_tensor(dir, name, 0xFF800000u, 0xFF80u); }

/* A fresh model of o in a directory of its own, with tensor name patched by fn. */
static const char *bad_model(const char *label, const qd_testgen_opts *o, const char *name,
                             int (*fn)(const char *, const char *))
{
    const char *dir = test_fresh_dir(label);
    if (pt_gen_model(dir, o) || fn(dir, name)) return NULL;
    return dir;
}

/* Runs a GPTQ job (extra: more job keys) on model and expects it to fail with QD_ENUMERIC,
 * its message naming tensor, the element and what it is. */
static void expect_refused(const char *model, const char *extra, const char *tensor, const char *element,
                           const char *what)
{
    test_checks++;
    if (!model) { TEST_FAIL_("could not make the model for %s", tensor); return; }
    qp_job *job = pt_job(model, test_path(test_fresh_dir("out"), "q"), "gptq", "gptq", tokens, extra);
    if (!job) { CHECK(0); return; }
    qd_err err = {0};
    int rc = qd_pipeline_run(job, pt_be, NULL, &err);
    fprintf(stderr, "%s%s -> %s\n", tensor, extra ? extra : "", err.msg);
    CHECK_INT(rc, QD_ENUMERIC);
    char want[300];
    snprintf(want, sizeof want, "tensor '%s': element %s is %s", tensor, element, what);
    CHECK_CONTAINS(err.msg, want);
    qp_job_free(job);
}

static void test_norm_nan(void)
{
    qd_testgen_opts o = pt_llama_opts(128, 2);
    const char *m = bad_model("norm", &o, "model.layers.1.input_layernorm.weight", pt_patch_nan);
    expect_refused(m, NULL, "model.layers.1.input_layernorm.weight", "[2]", "NaN");
    expect_refused(m, "\"kernel_check\":false,", "model.layers.1.input_layernorm.weight", "[2]", "NaN");
    /* The same in bfloat16, whose values are converted by another path. */
    o.dtype = QD_DTYPE_BF16;
    m = bad_model("norm-bf16", &o, "model.layers.0.post_attention_layernorm.weight", pt_patch_nan);
    expect_refused(m, "\"kernel_check\":false,", "model.layers.0.post_attention_layernorm.weight", "[4]", "NaN");
}

static void test_globals(void)
{
    qd_testgen_opts o = pt_llama_opts(128, 2);
    o.tie_word_embeddings = 0;
    /* Embedding row 0 (of [vocab, hidden]), element 2. */
    expect_refused(bad_model("embed", &o, "model.embed_tokens.weight", pt_patch_nan), "\"kernel_check\":false,",
                   "model.embed_tokens.weight", "[0][2]", "NaN");
    expect_refused(bad_model("final", &o, "model.norm.weight", patch_inf), NULL, "model.norm.weight", "[2]", "-inf");
    expect_refused(bad_model("head", &o, "lm_head.weight", pt_patch_nan), NULL, "lm_head.weight", "[0][2]", "NaN");
}

static void test_bias_and_router(void)
{
    qd_testgen_opts o = qd_testgen_defaults(QD_ARCH_OPT);
    expect_refused(bad_model("opt-bias", &o, "model.decoder.layers.0.fc1.bias", pt_patch_nan), "\"kernel_check\":false,",
                   "model.decoder.layers.0.fc1.bias", "[2]", "NaN");
    expect_refused(bad_model("opt-ln", &o, "model.decoder.layers.1.final_layer_norm.bias", pt_patch_nan), NULL,
                   "model.decoder.layers.1.final_layer_norm.bias", "[2]", "NaN");
    expect_refused(bad_model("opt-pos", &o, "model.decoder.embed_positions.weight", pt_patch_nan), NULL,
                   "model.decoder.embed_positions.weight", "[0][2]", "NaN");
    qd_testgen_opts x = pt_llama_opts(64, 2);
    x.n_experts = 4;
    expect_refused(bad_model("router", &x, "model.layers.1.block_sparse_moe.gate.weight", pt_patch_nan),
                   "\"kernel_check\":false,", "model.layers.1.block_sparse_moe.gate.weight", "[0][2]", "NaN");
}

/* Finite weights still load (the scan refuses nothing else). */
static void test_clean_model_runs(void)
{
    qd_testgen_opts o = pt_llama_opts(128, 2);
    const char *dir = test_fresh_dir("clean");
    if (pt_gen_model(dir, &o)) { CHECK(0); return; }
    qp_job *job = pt_job(dir, test_path(test_fresh_dir("out-clean"), "q"), "gptq", "gptq", tokens, NULL);
    qd_err err = {0};
    CHECK(job != NULL);
    if (job) CHECK_OK(qd_pipeline_run(job, pt_be, NULL, &err));
    if (err.msg[0]) fprintf(stderr, "clean: %s\n", err.msg);
    qp_job_free(job);
}

int main(void)
{
    if (pt_setup(2, 4000, 128, 3, NULL, &tokens)) return 1;
    TEST_RUN(test_norm_nan);
    TEST_RUN(test_globals);
    TEST_RUN(test_bias_and_router);
    TEST_RUN(test_clean_model_runs);
    return pt_teardown();
}
