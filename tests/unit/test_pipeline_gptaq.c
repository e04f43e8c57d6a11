/* job.gptaq end to end on a tiny dense Llama: GPTAQ's output differs from plain GPTQ's
 * (the float stream's inputs reach the updates), the report says which inputs were used,
 * true-sequential or not, with act order, with target_bpw's bits per layer; a run interrupted at any block resumes (the float
 * stream recomputed) to the same bytes; and the cases it does not run in are refused by
 * name: another method, a mixture of experts. */
#include <stdio.h>

#include "pipeline_testlib.h"

static const char *T;
static const char *tokens;
static char llama_dir[4096];

static int on_progress(void *ud, const qd_progress *p)
{
    int *at = ud;   /* at[0]: block, at[1]: 0 calibrate / 1 checkpoint, at[2]: fired */
    if (!at[2] && p->block == at[0] && !strcmp(p->stage, at[1] ? "checkpoint" : "calibrate")) {
        at[2] = 1;
        return 1;
    }
    return 0;
}

/* The report's "gptaq" record and every quantized layer's method. */
static void check_report(const char *out, int gptaq)
{
    cJSON *j = pt_read_json(test_path(out, "quantd_report.json"));
    CHECK(j != NULL);
    if (!j) return;
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(j, "gptaq");
    CHECK_INT(g != NULL, gptaq);
    if (g) {
        CHECK_NEAR(cJSON_GetObjectItemCaseSensitive(g, "alpha")->valuedouble, 0.25, 0);
        CHECK_CONTAINS(cJSON_GetObjectItemCaseSensitive(g, "asymmetric_inputs")->valuestring, "float model");
        CHECK_CONTAINS(cJSON_GetObjectItemCaseSensitive(g, "hessian_inputs")->valuestring, "quantized model");
    }
    const cJSON *l;
    int n = 0;
    cJSON_ArrayForEach(l, cJSON_GetObjectItemCaseSensitive(j, "layers")) {
        CHECK_STR(cJSON_GetObjectItemCaseSensitive(l, "method")->valuestring, gptaq ? "gptaq" : "gptq");
        n++;
    }
    CHECK_INT(n, 3 * 7);
    cJSON_Delete(j);
}

static void differs_case(const char *name, const char *extra)
{
    char a[4096], b[4096], ex[512];
    snprintf(a, sizeof a, "%s/%s-gptq", T, name);
    snprintf(b, sizeof b, "%s/%s-gptaq", T, name);
    snprintf(ex, sizeof ex, "%s\"gptaq\":true,", extra);
    qp_job *ja = pt_run_job(name, llama_dir, a, "gptq", "gptq", tokens, extra);
    qp_job *jb = pt_run_job(name, llama_dir, b, "gptq", "gptq", tokens, ex);
    if (ja && jb) {
        CHECK(!pt_same_file(test_path(a, "model.safetensors"), test_path(b, "model.safetensors")));
        check_report(a, 0);
        check_report(b, 1);
        /* Both stay close to the float model (GPTAQ is no worse by much on a random model). */
        double ea = pt_logits_rel(llama_dir, a), eb = pt_logits_rel(llama_dir, b);
        fprintf(stderr, "%s: logits rel error gptq %.4f gptaq %.4f\n", name, ea, eb);
        CHECK(ea >= 0 && eb >= 0 && eb < 2 * ea + 0.05);
    }
    qp_job_free(ja);
    qp_job_free(jb);
}

static void test_differs_from_gptq(void)
{
    differs_case("seq", "");
    differs_case("allatonce", "\"true_sequential\":false,");
    differs_case("actorder", "\"desc_act\":true,\"bits\":3,");
}

/* The report's bits and group size per layer ("bpw" layers), as "name=bits/group;" pairs. */
static void bpw_layers(const char *out, char *buf, size_t cap)
{
    buf[0] = 0;
    cJSON *j = pt_read_json(test_path(out, "quantd_report.json"));
    const cJSON *l;
    size_t o = 0;
    cJSON_ArrayForEach(l, cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "bpw"), "layers")) {
        if (o >= cap) break;
        o += (size_t)snprintf(buf + o, cap - o, "%s=%d/%d;", cJSON_GetObjectItemCaseSensitive(l, "name")->valuestring,
                              cJSON_GetObjectItemCaseSensitive(l, "bits")->valueint,
                              cJSON_GetObjectItemCaseSensitive(l, "group_size")->valueint);
    }
    cJSON_Delete(j);
}

/* With target_bpw: the plan (made with GPTQ's estimate, before the float stream matters) is
 * the same with and without GPTAQ, every layer takes its planned bits and group through
 * GPTAQ's update, and the output differs from plain GPTQ's of that plan. */
static void test_target_bpw(void)
{
    const char *plan = "\"target_bpw\":5.0,\"bpw_bits\":[4,8],\"bpw_group_sizes\":[32,64],";
    char a[4096], b[4096], ex[512], la[8192], lb[8192];
    snprintf(a, sizeof a, "%s/bpw-gptq", T);
    snprintf(b, sizeof b, "%s/bpw-gptaq", T);
    snprintf(ex, sizeof ex, "%s\"gptaq\":true,", plan);
    qp_job *ja = pt_run_job("bpw gptq", llama_dir, a, "gptq", "compressed-tensors", tokens, plan);
    qp_job *jb = pt_run_job("bpw gptaq", llama_dir, b, "gptq", "compressed-tensors", tokens, ex);
    if (ja && jb) {
        bpw_layers(a, la, sizeof la);
        bpw_layers(b, lb, sizeof lb);
        CHECK(strstr(la, "=8/") && strstr(la, "=4/"));   /* a mixed plan */
        CHECK_STR(lb, la);
        check_report(b, 1);
        CHECK(!pt_same_file(test_path(a, "model.safetensors"), test_path(b, "model.safetensors")));
        double ea = pt_logits_rel(llama_dir, a), eb = pt_logits_rel(llama_dir, b);
        fprintf(stderr, "target_bpw: logits rel error gptq %.4f gptaq %.4f\n", ea, eb);
        CHECK(ea >= 0 && eb >= 0 && eb < 2 * ea + 0.05);
    }
    qp_job_free(ja);
    qp_job_free(jb);
}

/* Interrupted at block b's calibration or checkpoint, resumed: the same bytes (acts_every 2:
 * block 1 resumes from the embedding with block 0 replayed, block 2 from block 2's acts). */
static void test_resume_same_bytes(void)
{
    char ref[4096], out[4096];
    const char *extra = "\"gptaq\":true,\"checkpoint\":{\"acts_every\":2},";
    snprintf(ref, sizeof ref, "%s/resume-ref", T);
    qp_job *job = pt_run_job("resume ref", llama_dir, ref, "gptq", "gptq", tokens, extra);
    qp_job_free(job);
    for (int stage = 0; stage < 2; stage++)
        for (int b = 0; b < 3; b++) {
            snprintf(out, sizeof out, "%s/resume-%d-%d", T, stage, b);
            job = pt_job(llama_dir, out, "gptq", "gptq", tokens, extra);
            if (!job) { CHECK(0); return; }
            int at[3] = {b, stage, 0};
            qd_pipeline_hooks hooks = {.ud = at, .progress = on_progress};
            qd_err err = {0};
            CHECK_INT(qd_pipeline_run(job, pt_be, &hooks, &err), QD_ECANCELLED);
            CHECK(at[2]);
            memset(&err, 0, sizeof err);
            CHECK_OK(qd_pipeline_run(job, pt_be, NULL, &err));
            test_checks++;
            if (!pt_same_file(test_path(ref, "model.safetensors"), test_path(out, "model.safetensors")))
                TEST_FAIL_("%s: differs from the uninterrupted run", out);
            check_report(out, 1);
            qp_job_free(job);
        }
}

static void test_refusals(void)
{
    char json[16384], out[4096], moe_dir[4096];
    qp_job *job = NULL;
    qp_err pe = {0};
    snprintf(out, sizeof out, "%s/refused", T);
    const char *methods[] = {"rtn", "awq", "awq+gptq"};
    for (int i = 0; i < 3; i++) {
        snprintf(json, sizeof json, "{\"model\":\"%s\",\"output\":\"%s\",\"method\":\"%s\",\"gptaq\":true,"
                 "\"calibration\":{\"path\":\"%s\"}}", llama_dir, out, methods[i], tokens);
        memset(&pe, 0, sizeof pe);
        CHECK_ERR(qp_job_parse(json, strlen(json), &job, &pe));
        CHECK_CONTAINS(pe.msg, "job.gptaq");
        CHECK_CONTAINS(pe.msg, methods[i]);
    }
    qd_testgen_opts mo = pt_llama_opts(64, 2);
    mo.n_experts = 4;
    if (pt_setup_model("moe", &mo, moe_dir, sizeof moe_dir)) { CHECK(0); return; }
    job = pt_job(moe_dir, out, "gptq", "gptq", tokens, "\"gptaq\":true,");
    if (!job) { CHECK(0); return; }
    qd_err err = {0};
    CHECK_INT(qd_pipeline_run(job, pt_be, NULL, &err), QD_EUNSUPPORTED);
    CHECK_CONTAINS(err.msg, "job.gptaq");
    CHECK_CONTAINS(err.msg, "mixture of experts");
    CHECK(!qd_fs_exists(out));
    qp_job_free(job);
}

int main(void)
{
    qd_testgen_opts lo = pt_llama_opts(128, 3);
    lo.dtype = QD_DTYPE_BF16;   /* the streams rounded to BF16 between blocks */
    if (pt_setup(2, 4000, 128, 3, &T, &tokens) || pt_setup_model("llama", &lo, llama_dir, sizeof llama_dir)) return 1;
    TEST_RUN(test_differs_from_gptq);
    TEST_RUN(test_target_bpw);
    TEST_RUN(test_resume_same_bytes);
    TEST_RUN(test_refusals);
    return pt_teardown();
}
