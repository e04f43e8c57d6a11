/* The job's "compute": "bf16" (proto/job.h, qp_compute): the block forward's projections and
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
static char model[4096], tokens[4096];

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
    CHECK_OK(run_logged(pt_be, "f32", NULL, log, sizeof log));
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

int main(void)
{
    qd_err err = {0};
    if (qd_backend_cpu_open(2, NULL, &pt_be, &err)) { fprintf(stderr, "cpu backend: %s\n", err.msg); return 1; }
    T = test_tmpdir();
    snprintf(model, sizeof model, "%s/llama", T);
    snprintf(tokens, sizeof tokens, "%s/calib.json", T);
    qd_testgen_opts lo = pt_llama_opts(96, 2);
    if (pt_gen_model(model, &lo) || pt_write_tokens(tokens, 4000, 128, 3)) { fprintf(stderr, "setup failed\n"); return 1; }
    fprintf(stderr, "AMX-BF16 tiles: %s\n", cpu_bf16_amx_usable() ? "used" : "not available");
    TEST_RUN(test_bf16_gptq);
    TEST_RUN(test_bf16_awq_gptq);
    TEST_RUN(test_bf16_refused);
#ifdef QUANTD_FAULT_HOOKS
    TEST_RUN(test_bf16_device_fault);
#endif
    qd_backend_close(pt_be);
    return test_finish();
}
