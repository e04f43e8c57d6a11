/* The job's "compute": "bf16" (quant/job/job.h, qp_compute): the block forward's projections and
 * the GPTQ Hessians take bfloat16 inputs (quant/backend/cpu/cpu_bf16.h); quantization stays
 * F32. Checked here on a generated Llama:
 *   - a bf16 job's output differs from the f32 job's (the setting reaches the arithmetic)
 *     and is as close to the float model (logits) as the f32 job's;
 *   - the portable path (runtime cpu_kernel "portable", no AMX tiles) gives an output as
 *     good, byte-identical to the tiles' where this CPU has none;
 *   - where the products are emulated (no AMX tiles, or the portable path) the job logs the
 *     warning compute_bf16_emulated, and an f32 job does not;
 *   - a GPTQ+AWQ job runs with it too;
 *   - a backend without bfloat16 products refuses the job, naming the setting, before it
 *     writes anything;
 *   - (test builds, QUANTD_FAULT_HOOKS) a device fault in a bf16 product fails the job
 *     with QD_EBACKEND, and the job resumes to the uninterrupted job's bytes.
 *   - "auto" (the default) resolves to bf16 exactly on a bfloat16 checkpoint where the
 *     backend's bf16 products are native (be->bf16_native, flipped here to stand for AMX or
 *     a GPU), giving the bytes of an explicit bf16 job, and to f32 otherwise; the report says
 *     which; a resumed job keeps what the checkpoint ran with (a checkpoint from before auto:
 *     f32), whatever the machine resolves now; a checkpoint naming another compute is refused.
 * Resume under bf16 is test_pipeline_resume's test_resume_gptq_bf16. */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "quant/backend/backend_fault.h"
#include "quant/backend/cpu/cpu_bf16.h"
#include "quant/core/runtime.h"

#include "pipeline_testlib.h"

static const char *T;
static const char *tokens;
static char model[4096], model16[4096];

/* Runs the job into T/name; err (optional) gets the failure. */
static int run_err(qd_backend *be, const char *name, const char *method, const char *format, const char *extra,
                   qd_err *err)
{
    char out[4200];
    snprintf(out, sizeof out, "%s/%s", T, name);
    qp_job *job = pt_job(model, out, method, format, tokens, extra);
    if (!job) return -1;
    qd_err local = {0};
    if (!err) err = &local;
    int rc = qd_pipeline_run(job, be, NULL, err);
    if (rc) fprintf(stderr, "%s: %s\n", name, err->msg);
    qp_job_free(job);
    return rc;
}

static int run(qd_backend *be, const char *name, const char *method, const char *format, const char *extra)
{
    return run_err(be, name, method, format, extra, NULL);
}

/* run() with this process's stderr (where the log goes) in T/name.log, read into log[cap]. */
static int run_logged(qd_backend *be, const char *name, const char *extra, char *log, size_t cap)
{
    char path[4300];
    snprintf(path, sizeof path, "%s/%s.log", T, name);
    fflush(stderr);
    int saved = dup(2), fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (saved < 0 || fd < 0 || dup2(fd, 2) < 0) return -1;
    close(fd);
    int rc = run(be, name, "gptq", "gptq", extra);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    log[0] = 0;
    FILE *f = fopen(path, "r");
    if (f) {
        log[fread(log, 1, cap - 1, f)] = 0;
        fclose(f);
    }
    return rc;
}

static int same(const char *a, const char *b)
{
    char pa[4300], pb[4300];
    snprintf(pa, sizeof pa, "%s/%s/model.safetensors", T, a);
    snprintf(pb, sizeof pb, "%s/%s/model.safetensors", T, b);
    return pt_same_file(pa, pb);
}

static double rel(const char *name)
{
    char d[4200];
    snprintf(d, sizeof d, "%s/%s", T, name);
    return pt_logits_rel(model, d);
}

static void test_bf16_gptq(void)
{
    qd_runtime_opts rt = qd_runtime_opts_default();
    rt.cpu_kernel = QD_CPU_KERNEL_PORTABLE;
    qd_backend *portable = NULL;
    qd_err err = {0};
    CHECK_OK(qd_backend_cpu_open(2, &rt, &portable, &err));
    if (!portable) return;
    /* Where the products are emulated (the portable path), the job warns that bf16 gains nothing. */
    static char log[1 << 16];
    CHECK_OK(run_logged(pt_be, "f32", "\"compute\":\"f32\",", log, sizeof log));
    CHECK(strstr(log, "compute_bf16_emulated") == NULL);
    CHECK_OK(run_logged(pt_be, "bf16", "\"compute\":\"bf16\",", log, sizeof log));
    CHECK((strstr(log, "compute_bf16_emulated") != NULL) == !cpu_bf16_amx_usable());
    CHECK_OK(run_logged(portable, "bf16-portable", "\"compute\":\"bf16\",", log, sizeof log));
    CHECK_CONTAINS(log, "compute_bf16_emulated backend=cpu: no bfloat16 unit");
    CHECK(!same("f32", "bf16"));
    if (!cpu_bf16_amx_usable()) CHECK(same("bf16", "bf16-portable"));
    double e32 = rel("f32"), e16 = rel("bf16"), ep = rel("bf16-portable");
    fprintf(stderr, "logits rel. error to float: f32 job %.5f, bf16 job %.5f, bf16 portable %.5f\n", e32, e16, ep);
    CHECK(e32 > 0 && e16 > 0 && ep > 0);
    CHECK(e16 < 1.15 * e32 && ep < 1.15 * e32);
    qd_backend_close(portable);
}

static void test_bf16_awq_gptq(void)
{
    CHECK_OK(run(pt_be, "awqg-f32", "awq+gptq", "compressed-tensors", "\"sym\":false,"));
    CHECK_OK(run(pt_be, "awqg-bf16", "awq+gptq", "compressed-tensors", "\"sym\":false,\"compute\":\"bf16\","));
    CHECK(!same("awqg-f32", "awqg-bf16"));
    double e32 = rel("awqg-f32"), e16 = rel("awqg-bf16");
    fprintf(stderr, "awq+gptq: f32 job %.5f, bf16 job %.5f\n", e32, e16);
    CHECK(e32 > 0 && e16 > 0 && e16 < 1.15 * e32);
}

static void test_bf16_refused(void)
{
    /* The CPU backend with its bf16 ops taken out: what a backend lacking them looks like. */
    qd_backend_ops ops = *pt_be->ops;
    ops.gemm_nt_bf16 = NULL;
    ops.hessian_accum_bf16 = NULL;
    qd_backend be = *pt_be;
    be.ops = &ops;
    char out[4200];
    snprintf(out, sizeof out, "%s/refused", T);
    qp_job *job = pt_job(model, out, "gptq", "gptq", tokens, "\"compute\":\"bf16\",");
    if (!job) { CHECK(0); return; }
    qd_err err = {0};
    CHECK_INT(qd_pipeline_run(job, &be, NULL, &err), QD_EUNSUPPORTED);
    CHECK_CONTAINS(err.msg, "compute bf16: the cpu backend has no bfloat16 products");
    CHECK(!qd_fs_exists(out));
    qp_job_free(job);
}

#ifdef QUANTD_FAULT_HOOKS
/* A device fault in a bf16 job (the fault hook counts gemm_nt_bf16 and hessian_accum_bf16
 * as gemm calls) fails the job with QD_EBACKEND naming the op (the Hessian's inside the
 * capture forward's hook, so the forward must keep the hook's words); the same
 * job on a sound backend then finishes from the checkpoint with the uninterrupted job's
 * bytes. Tried at call 1, 2, 4, ... until the job no longer reaches the call: faults in the
 * first block, in later blocks and in the last forward. */
static void test_bf16_device_fault(void)
{
    const char *extra = "\"compute\":\"bf16\",";
    char ref[4300];
    snprintf(ref, sizeof ref, "%s/bf16/model.safetensors", T);
    if (!qd_fs_exists(ref)) CHECK_OK(run(pt_be, "bf16", "gptq", "gptq", extra));
    int n_failed = 0, in_gemm = 0, in_hessian = 0, finished = 0;
    for (long at = 1; at <= (1L << 20) && !finished; at *= 2) {
        char spec[32], name[64];
        snprintf(spec, sizeof spec, "gemm:%ld", at);
        snprintf(name, sizeof name, "fault-%ld", at);
        qd_backend *be = NULL;
        qd_err err = {0};
        CHECK_OK(qd_backend_cpu_open(2, NULL, &be, &err));
        if (!be) return;
        CHECK_OK(qd_backend_fault_wrap(be, spec, &err));
        int rc = run_err(be, name, "gptq", "gptq", extra, &err);
        qd_backend_close(be);
        if (!rc) {
            finished = 1;
        } else {
            n_failed++;
            CHECK_INT(rc, QD_EBACKEND);
            CHECK_CONTAINS(err.msg, "injected device fault");
            in_gemm += strstr(err.msg, "gemm_nt_bf16 failed") != NULL;
            in_hessian += strstr(err.msg, "hessian_accum_bf16 failed") != NULL;
            CHECK_OK(run(pt_be, name, "gptq", "gptq", extra));
        }
        CHECK(same(name, "bf16"));
    }
    fprintf(stderr, "device faults: %d jobs failed and resumed; in gemm_nt_bf16 %d, in hessian_accum_bf16 %d\n",
            n_failed, in_gemm, in_hessian);
    CHECK(finished);
    CHECK(n_failed >= 4);
    CHECK(in_gemm >= 1 && in_hessian >= 1);
}
#endif

/* ---- "compute": "auto" ---- */

static void test_auto_resolve(void)
{
    qd_backend_ops ops = *pt_be->ops;
    qd_backend be = *pt_be;
    be.ops = &ops;
    const char *why = NULL;
    be.bf16_native = 1;
    CHECK_INT(qd_pipeline_compute_resolve(QP_COMPUTE_AUTO, QD_DTYPE_BF16, &be, &why), QP_COMPUTE_BF16);
    CHECK_CONTAINS(why, "bf16 products on a bfloat16 unit");
    CHECK_INT(qd_pipeline_compute_resolve(QP_COMPUTE_AUTO, QD_DTYPE_F16, &be, &why), QP_COMPUTE_F32);
    CHECK_CONTAINS(why, "not bfloat16");
    CHECK_INT(qd_pipeline_compute_resolve(QP_COMPUTE_AUTO, QD_DTYPE_F32, &be, NULL), QP_COMPUTE_F32);
    CHECK_INT(qd_pipeline_compute_resolve(QP_COMPUTE_F32, QD_DTYPE_BF16, &be, &why), QP_COMPUTE_F32);
    CHECK_STR(why, "as the job says");
    be.bf16_native = 0;
    CHECK_INT(qd_pipeline_compute_resolve(QP_COMPUTE_AUTO, QD_DTYPE_BF16, &be, &why), QP_COMPUTE_F32);
    CHECK_CONTAINS(why, "emulated");
    CHECK_INT(qd_pipeline_compute_resolve(QP_COMPUTE_BF16, QD_DTYPE_F32, &be, NULL), QP_COMPUTE_BF16);
    be.bf16_native = 1;
    ops.gemm_nt_bf16 = NULL;   /* a backend without the products */
    CHECK_INT(qd_pipeline_compute_resolve(QP_COMPUTE_AUTO, QD_DTYPE_BF16, &be, NULL), QP_COMPUTE_F32);
}

/* The value of key in T/name/file, or "" (static buffer). */
static const char *json_str(const char *name, const char *file, const char *key)
{
    static char v[64];
    char path[4400];
    snprintf(path, sizeof path, "%s/%s/%s", T, name, file);
    cJSON *j = pt_read_json(path);
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, key);
    snprintf(v, sizeof v, "%s", cJSON_IsString(s) ? s->valuestring : "");
    cJSON_Delete(j);
    return v;
}

static int run16(const char *name, const char *extra, const qd_pipeline_hooks *hooks, qd_err *err)
{
    char out[4200];
    snprintf(out, sizeof out, "%s/%s", T, name);
    qp_job *job = pt_job(model16, out, "gptq", "gptq", tokens, extra);
    if (!job) return -1;
    int rc = qd_pipeline_run(job, pt_be, hooks, err);
    qp_job_free(job);
    return rc;
}

static void test_auto_job(void)
{
    int native = pt_be->bf16_native;
    qd_err err = {0};
    /* This machine as it is: bf16 exactly where its products are native. */
    CHECK_OK(run16("a16-here", NULL, NULL, &err));
    CHECK_STR(json_str("a16-here", "quantd_report.json", "compute"), native ? "bf16" : "f32");
    CHECK_OK(run16("a16-f32", "\"compute\":\"f32\",", NULL, &err));
    CHECK_OK(run16("a16-bf16", "\"compute\":\"bf16\",", NULL, &err));
    CHECK(!same("a16-f32", "a16-bf16"));
    CHECK_STR(json_str("a16-f32", "quantd_report.json", "compute"), "f32");
    CHECK_STR(json_str("a16-bf16", "quantd_report.json", "compute"), "bf16");
    pt_be->bf16_native = 0;
    CHECK_OK(run16("a16-off", NULL, NULL, &err));
    CHECK_STR(json_str("a16-off", "quantd_report.json", "compute"), "f32");
    CHECK(same("a16-off", "a16-f32"));
    pt_be->bf16_native = 1;   /* the emulated products standing in for native ones */
    CHECK_OK(run16("a16-on", NULL, NULL, &err));
    CHECK_STR(json_str("a16-on", "quantd_report.json", "compute"), "bf16");
    CHECK(same("a16-on", "a16-bf16"));
    /* A float32 checkpoint stays f32 on any backend. */
    CHECK_OK(run(pt_be, "a32-on", "gptq", "gptq", NULL));
    CHECK_STR(json_str("a32-on", "quantd_report.json", "compute"), "f32");
    pt_be->bf16_native = native;
}

static int cancel_block1(void *ud, const qd_progress *p)
{
    (void)ud;
    return p->block == 1 && !strcmp(p->stage, "calibrate");
}

/* A job stopped after block 0 on a machine that resolved auto one way and resumed on one
 * that resolves it the other way goes on as it started. */
static void test_auto_resume(void)
{
    int native = pt_be->bf16_native;
    qd_pipeline_hooks stop = {.progress = cancel_block1};
    qd_err err = {0};
    char state[4400];
    for (int first = 0; first < 2; first++) {
        char name[32];
        snprintf(name, sizeof name, "a16-resume-%d", first);
        pt_be->bf16_native = first;
        CHECK_INT(run16(name, NULL, &stop, &err), QD_ECANCELLED);
        CHECK_STR(json_str(name, ".quantd/state.json", "compute"), first ? "bf16" : "f32");
        pt_be->bf16_native = !first;
        CHECK_OK(run16(name, NULL, NULL, &err));
        CHECK_STR(json_str(name, "quantd_report.json", "compute"), first ? "bf16" : "f32");
        CHECK(same(name, first ? "a16-bf16" : "a16-f32"));
    }
    /* A checkpoint from before auto (no "compute" in its state) ran f32, and resumes so. */
    pt_be->bf16_native = 0;
    CHECK_INT(run16("a16-old", NULL, &stop, &err), QD_ECANCELLED);
    snprintf(state, sizeof state, "%s/a16-old/.quantd/state.json", T);
    cJSON *j = pt_read_json(state);
    cJSON_DeleteItemFromObjectCaseSensitive(j, "compute");
    char *text = j ? cJSON_PrintUnformatted(j) : NULL;
    CHECK(text && qd_fs_write_atomic(state, text, strlen(text), &err) == 0);
    free(text);
    cJSON_Delete(j);
    pt_be->bf16_native = 1;
    CHECK_OK(run16("a16-old", NULL, NULL, &err));
    CHECK(same("a16-old", "a16-f32"));
    /* A state naming anything else is refused, not guessed at. */
    CHECK_INT(run16("a16-bad", NULL, &stop, &err), QD_ECANCELLED);
    snprintf(state, sizeof state, "%s/a16-bad/.quantd/state.json", T);
    j = pt_read_json(state);
    cJSON_ReplaceItemInObjectCaseSensitive(j, "compute", cJSON_CreateString("fp8"));
    text = j ? cJSON_PrintUnformatted(j) : NULL;
    CHECK(text && qd_fs_write_atomic(state, text, strlen(text), &err) == 0);
    free(text);
    cJSON_Delete(j);
    qd_err e2 = {0};
    CHECK(run16("a16-bad", NULL, NULL, &e2) != 0);
    CHECK_CONTAINS(e2.msg, "compute \"fp8\" is neither f32 nor bf16");
    pt_be->bf16_native = native;
}

int main(void)
{
    if (pt_setup(2, 4000, 128, 3, &T, &tokens)) return 1;
    qd_testgen_opts lo = pt_llama_opts(96, 2);
    qd_testgen_opts lo16 = lo;
    lo16.dtype = QD_DTYPE_BF16;
    if (pt_setup_model("llama", &lo, model, sizeof model) || pt_setup_model("llama-bf16", &lo16, model16, sizeof model16))
        return 1;
    fprintf(stderr, "AMX-BF16 tiles: %s\n", cpu_bf16_amx_usable() ? "used" : "not available");
    TEST_RUN(test_bf16_gptq);
    TEST_RUN(test_bf16_awq_gptq);
    TEST_RUN(test_bf16_refused);
    TEST_RUN(test_auto_resolve);
    TEST_RUN(test_auto_job);
    TEST_RUN(test_auto_resume);
#ifdef QUANTD_FAULT_HOOKS
    TEST_RUN(test_bf16_device_fault);
#endif
    return pt_teardown();
}
