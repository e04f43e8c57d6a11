/* AWQ's scale-search statistics over the job's awq.stats_tokens (quant/job/job.h, qp_job_awq;
 * quant/pipeline/pipeline_awq.c): the float capture runs on the first whole calibration
 * sequences holding that many tokens. A value at or above the calibration's tokens, and 0,
 * are every token (the same bytes); a value is rounded up to whole sequences (40 tokens of
 * 32-token sequences are 64); fewer tokens give other statistics, so other scales. */
#include <stdio.h>
#include <string.h>

#include "pipeline_testlib.h"

static const char *T;
static const char *tokens;
static char model[4096];

/* Runs an AWQ job with awq.stats_tokens = st (-1: the default) into T/name; 0 or -1. */
static int run(const char *name, int st)
{
    char out[4200], extra[64] = "";
    snprintf(out, sizeof out, "%s/%s", T, name);
    if (st >= 0) snprintf(extra, sizeof extra, "\"awq\":{\"stats_tokens\":%d},", st);
    qp_job *job = pt_job(model, out, "awq", "gptq", tokens, extra);
    if (!job) return -1;
    qd_err err = {0};
    qd_pipeline *p = NULL;
    int rc = qd_pipeline_open(job, pt_be, NULL, &p, &err);
    if (rc) fprintf(stderr, "open: %s\n", err.msg);
    int passes = rc ? -1 : pt_run_all(p);
    qp_job_free(job);
    return passes > 0 ? 0 : -1;
}

static int same(const char *a, const char *b)
{
    char pa[4300], pb[4300];
    snprintf(pa, sizeof pa, "%s/%s/model.safetensors", T, a);
    snprintf(pb, sizeof pb, "%s/%s/model.safetensors", T, b);
    return pt_same_file(pa, pb);
}

static void test_stats_tokens(void)
{
    /* pt_job calibrates on 8 sequences of 32 tokens: 256; the default (8192) covers them. */
    CHECK_OK(run("all", 0));
    CHECK_OK(run("default", -1));
    CHECK_OK(run("256", 256));
    CHECK_OK(run("64", 64));
    CHECK_OK(run("40", 40));
    CHECK(same("all", "default"));
    CHECK(same("all", "256"));
    CHECK(same("64", "40"));     /* whole sequences: 40 tokens take two of them */
    CHECK(!same("all", "64"));   /* two sequences' statistics move the scales */
}

int main(void)
{
    qd_testgen_opts lo = pt_llama_opts(96, 2);
    if (pt_setup(2, 4000, 128, 3, &T, &tokens) || pt_setup_model("llama", &lo, model, sizeof model)) return 1;
    TEST_RUN(test_stats_tokens);
    return pt_teardown();
}
