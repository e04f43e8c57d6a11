/* The kept MLP activation (pipeline.h: qd_pipeline_mlp_keep_decide, qd_pipeline_estimate_fit):
 * a dense true-sequential GPTQ block keeps its down projection's input for the final forward
 * up to 1 GiB always and beyond that where half the machine's memory holds the job with it;
 * a large one goes before a job would be refused for memory; the estimate counts it exactly
 * when it is kept; and the output is byte-identical whether it is kept or the MLP half runs
 * again (so the machine-dependent choice never changes a checkpoint), for GPTQ and for AWQ,
 * which keeps it always. */
#include <stdio.h>
#include <string.h>

#include "pipeline_testlib.h"
#include "quant/pipeline/pipeline_internal.h"

#define GiB ((uint64_t)1 << 30)

static const char *T;
static const char *tokens;
static char model[4096];

static void test_decide(void)
{
    CHECK_INT(qd_pipeline_mlp_keep_decide(GiB, 100 * GiB, 8 * GiB), 1);           /* small: always */
    CHECK_INT(qd_pipeline_mlp_keep_decide(GiB + 1, 1 * GiB, 0), 0);               /* memory unknown */
    /* A 7B block at 128 x 2048: 11.5 GB on top of about 19 GB. */
    uint64_t keep = 262144ull * 11008 * 4, peak = 19 * GiB;
    CHECK_INT(qd_pipeline_mlp_keep_decide(keep, peak, 64 * GiB), 1);
    CHECK_INT(qd_pipeline_mlp_keep_decide(keep, peak, 32 * GiB), 0);
    CHECK_INT(qd_pipeline_mlp_keep_decide(keep, peak, 2 * (peak + keep)), 1);    /* the edge: half */
    CHECK_INT(qd_pipeline_mlp_keep_decide(keep, peak, 2 * (peak + keep) - 2), 0);
}

static void test_fit(void)
{
    qd_pipeline_estimate e = {.peak_ram_bytes = 30 * GiB, .acts_ram_bytes = 20 * GiB,
                              .mlp_act_bytes = 10 * GiB, .mlp_act_added_bytes = 10 * GiB, .keep_mlp_act = 1};
    qd_pipeline_estimate f = e;
    CHECK_INT(qd_pipeline_estimate_fit(&f, 40 * GiB), 0);                          /* fits: kept */
    CHECK_INT(f.keep_mlp_act, 1);
    CHECK_INT(qd_pipeline_estimate_fit(&f, 15 * GiB), 0);                          /* short either way */
    CHECK_INT(f.keep_mlp_act, 1);
    CHECK_INT(qd_pipeline_estimate_fit(&f, 25 * GiB), 1);                          /* fits without it */
    CHECK_INT(f.keep_mlp_act, 0);
    CHECK((long long)f.peak_ram_bytes == (long long)(20 * GiB));
    CHECK((long long)f.acts_ram_bytes == (long long)(10 * GiB));
    CHECK_INT(qd_pipeline_estimate_fit(&f, 5 * GiB), 0);                           /* once only */
    f = e;
    f.mlp_act_added_bytes = 0;                                  /* AWQ's: it adds nothing, it stays */
    CHECK_INT(qd_pipeline_estimate_fit(&f, 25 * GiB), 0);
    CHECK_INT(f.keep_mlp_act, 1);
    e.mlp_act_bytes = e.mlp_act_added_bytes = GiB;                                  /* small ones stay */
    CHECK_INT(qd_pipeline_estimate_fit(&e, 29 * GiB + GiB / 2), 0);
    CHECK_INT(e.keep_mlp_act, 1);
}

/* The estimate counts the activation for true-sequential GPTQ (adding rows x intermediate x 4
 * to the peak) and AWQ (kept, nothing added: its term holds that input), not for others. */
static void test_estimate_counts(void)
{
    char out[4200];
    snprintf(out, sizeof out, "%s/est", T);
    qp_job *g = pt_job(model, out, "gptq", "gptq", tokens, NULL);
    qp_job *n = pt_job(model, out, "gptq", "gptq", tokens, "\"true_sequential\":false,");
    qp_job *r = pt_job(model, out, "rtn", "gptq", tokens, NULL);
    qp_job *a = pt_job(model, out, "awq", "gptq", tokens, NULL);
    qd_pipeline_estimate eg, en, er, ea;
    qd_err err = {0};
    if (!g || !n || !r || !a) { CHECK(0); goto out; }
    CHECK_OK(qd_pipeline_estimate_job(g, &eg, &err));
    CHECK_OK(qd_pipeline_estimate_job(n, &en, &err));
    CHECK_OK(qd_pipeline_estimate_job(r, &er, &err));
    CHECK_OK(qd_pipeline_estimate_job(a, &ea, &err));
    CHECK((long long)eg.mlp_act_bytes == 8LL * 32 * 96 * 4);   /* pt_job: 8 x 32 rows; intermediate 96 */
    CHECK_INT(eg.keep_mlp_act, 1);
    CHECK((long long)eg.mlp_act_added_bytes == (long long)eg.mlp_act_bytes);
    CHECK((long long)ea.mlp_act_bytes == (long long)eg.mlp_act_bytes);
    CHECK_INT(ea.keep_mlp_act, 1);
    CHECK_INT((long long)ea.mlp_act_added_bytes, 0);
    CHECK_INT((long long)en.mlp_act_bytes, 0);
    CHECK_INT(en.keep_mlp_act, 0);
    CHECK_INT((long long)er.mlp_act_bytes, 0);
    cJSON *j = qd_pipeline_estimate_to_json(&eg);
    const cJSON *kb = cJSON_GetObjectItemCaseSensitive(j, "mlp_act_kept_bytes");
    CHECK(cJSON_IsNumber(kb) && kb->valuedouble == (double)eg.mlp_act_bytes);
    cJSON_Delete(j);
out:
    qp_job_free(g);
    qp_job_free(n);
    qp_job_free(r);
    qp_job_free(a);
}

/* Runs the job, keeping the activation or not; returns the last block's forward passes. */
static int run(const char *out, const char *method, int keep)
{
    qp_job *job = pt_job(model, out, method, "gptq", tokens, NULL);
    qd_err err = {0};
    qd_pipeline *p = NULL;
    int passes = -1;
    CHECK_OK(qd_pipeline_open(job, pt_be, NULL, &p, &err));
    if (p) {
        qd_pipeline_set_keep_mlp_act(p, keep);
        passes = pt_run_all(p);
    }
    qp_job_free(job);
    return passes;
}

static void test_output_same(void)
{
    char a[4200], b[4200];
    snprintf(a, sizeof a, "%s/kept", T);
    snprintf(b, sizeof b, "%s/rerun", T);
    CHECK_INT(run(a, "gptq", 1), 4);   /* q/k/v, o, gate/up, down captures; the forward is down alone */
    CHECK_INT(run(b, "gptq", 0), 5);   /* + the MLP half again */
    CHECK(pt_same_file(test_path(a, "model.safetensors"), test_path(b, "model.safetensors")));
    /* AWQ keeps it always (its clip search's input for down_proj): + its float capture. */
    snprintf(a, sizeof a, "%s/awq-kept", T);
    snprintf(b, sizeof b, "%s/awq-rerun", T);
    CHECK_INT(run(a, "awq", 1), 5);
    CHECK_INT(run(b, "awq", 0), 6);
    CHECK(pt_same_file(test_path(a, "model.safetensors"), test_path(b, "model.safetensors")));
}

int main(void)
{
    qd_testgen_opts lo = pt_llama_opts(96, 2);
    if (pt_setup(2, 4000, 128, 3, &T, &tokens) || pt_setup_model("llama", &lo, model, sizeof model)) return 1;
    TEST_RUN(test_decide);
    TEST_RUN(test_fit);
    TEST_RUN(test_estimate_counts);
    TEST_RUN(test_output_same);
    return pt_teardown();
}
