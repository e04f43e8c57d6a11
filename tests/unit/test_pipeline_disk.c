/* A job's output directory after its final write failed, and the disk figure of its resume
 * (issue #33):
 *   - a finish that fails after it wrote some outputs (the eval text gone by then) leaves
 *     the checkpoint alone: no model.safetensors, config.json or tokenizer file that would
 *     make the directory look like a finished model;
 *   - a finish whose weights write fails (a file size limit, EFBIG, standing in for ENOSPC)
 *     leaves the checkpoint alone too; the resumed job then finishes, and files a killed
 *     finish left (an old config.json, a .tmp.<pid>) are gone from the output;
 *   - the pre-flight's disk rule counts what the output directory already holds (the job's
 *     own checkpoint, which the resume reuses) against the estimate: a job whose checkpoint
 *     holds H bytes needs disk_bytes - H free, not disk_bytes. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "pipeline_testlib.h"

static const char *T, *tokens;
static char model[4096];

/* The entries of dir, sorted, space-separated, into buf. */
static const char *listing(const char *dir, char *buf, size_t cap)
{
    char cmd[4400];
    snprintf(cmd, sizeof cmd, "ls -A '%s' 2>/dev/null | LC_ALL=C sort | tr '\\n' ' '", dir);
    buf[0] = 0;
    FILE *f = popen(cmd, "r");
    if (f) {
        size_t n = fread(buf, 1, cap - 1, f);
        buf[n] = 0;
        pclose(f);
    }
    return buf;
}

/* Opens job and runs every block, leaving the finish to the caller. */
static qd_pipeline *run_blocks(const qp_job *job)
{
    qd_pipeline *p = NULL;
    qd_err err = {0};
    if (qd_pipeline_open(job, pt_be, NULL, &p, &err)) {
        fprintf(stderr, "open: %s\n", err.msg);
        return NULL;
    }
    while (qd_pipeline_next_block(p) < qd_pipeline_n_blocks(p))
        if (qd_pipeline_run_block(p, &err)) {
            fprintf(stderr, "block: %s\n", err.msg);
            qd_pipeline_close(p);
            return NULL;
        }
    return p;
}

/* The eval runs after the weights, configs and tokenizer files are written: its text
 * removed in between, the finish fails there. */
static void test_failed_finish_leaves_checkpoint(void)
{
    char out[4200], eval[4200], extra[4400], ls[1024];
    snprintf(out, sizeof out, "%s/q", test_fresh_dir("late"));
    snprintf(eval, sizeof eval, "%s/eval.txt", T);
    CHECK_OK(qd_fs_write_atomic(eval, "some text\n", 10, NULL));
    snprintf(extra, sizeof extra, "\"eval\":{\"path\":\"%s\",\"seq_len\":16},", eval);
    qp_job *job = pt_job(model, out, "gptq", "gptq", tokens, extra);
    qd_pipeline *p = job ? run_blocks(job) : NULL;
    CHECK(p != NULL);
    if (p) {
        unlink(eval);
        qd_err err = {0};
        CHECK_ERR(qd_pipeline_finish(p, &err));
        fprintf(stderr, "finish without the eval text -> %s\n", err.msg);
        qd_pipeline_close(p);
        CHECK_STR(listing(out, ls, sizeof ls), ".quantd ");
        CHECK(qd_fs_exists(test_path(out, ".quantd/state.json")));
    }
    qp_job_free(job);
}

/* The weights' write cut short by RLIMIT_FSIZE (EFBIG): nothing but the checkpoint stays;
 * with the limit lifted the same job resumes and finishes, and a finish's leftovers that a
 * kill would leave (an outdated config.json, a temp file) are not in the result. */
static void test_failed_write_then_resume(void)
{
    char out[4200], ls[1024];
    snprintf(out, sizeof out, "%s/q", test_fresh_dir("write"));
    qp_job *job = pt_job(model, out, "gptq", "gptq", tokens, NULL);
    qd_pipeline *p = job ? run_blocks(job) : NULL;
    CHECK(p != NULL);
    if (!p) { qp_job_free(job); return; }
    uint64_t block = qd_fs_file_size(test_path(out, ".quantd/block-000.safetensors"));
    CHECK(block > 0);
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = (rlim_t)(block + 4096);   /* every checkpoint file fits; the whole model does not */
    void (*was)(int) = signal(SIGXFSZ, SIG_IGN);
    CHECK_OK(setrlimit(RLIMIT_FSIZE, &lim));
    qd_err err = {0};
    int rc = qd_pipeline_finish(p, &err);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, was);
    CHECK(rc < 0);
    fprintf(stderr, "finish over the file size limit -> %s\n", err.msg);
    qd_pipeline_close(p);
    CHECK_STR(listing(out, ls, sizeof ls), ".quantd ");

    /* What a finish killed half way leaves, then the resume. */
    CHECK_OK(qd_fs_write_atomic(test_path(out, "config.json"), "{}", 2, NULL));
    CHECK_OK(qd_fs_write_atomic(test_path(out, "model.safetensors.tmp.12345"), "x", 1, NULL));
    p = NULL;
    memset(&err, 0, sizeof err);
    CHECK_OK(qd_pipeline_open(job, pt_be, NULL, &p, &err));
    if (p) {
        CHECK_INT(qd_pipeline_next_block(p), qd_pipeline_n_blocks(p));
        CHECK_OK(qd_pipeline_finish(p, &err));
        if (err.msg[0]) fprintf(stderr, "resumed finish: %s\n", err.msg);
        qd_pipeline_close(p);
    }
    CHECK_STR(listing(out, ls, sizeof ls),
              "config.json generation_config.json model.safetensors quantd_report.json quantize_config.json "
              "tokenizer_config.json ");
    char *cfg = pt_read(test_path(out, "config.json"), NULL);
    CHECK_CONTAINS(cfg, "quantization_config");
    free(cfg);
    qp_job_free(job);
}

/* The disk rule with what the output already holds. */
static void test_disk_rule_counts_held(void)
{
    qd_pipeline_estimate est = {.disk_bytes = 10000000000ull, .n_blocks = 8};
    qd_err err = {0};
    CHECK_OK(qd_pipeline_check_disk(&est, 10000000000ull, 0, "/out", &err));
    CHECK_INT(qd_pipeline_check_disk(&est, 6000000000ull, 0, "/out", &err), QD_EPREFLIGHT);
    CHECK_CONTAINS(err.msg, "not enough disk under /out: the job needs about 10.00 GB, 6.00 GB free");
    /* A checkpoint of 5 GB from the earlier attempt: 5 GB more is what it needs. */
    CHECK_OK(qd_pipeline_check_disk(&est, 6000000000ull, 5000000000ull, "/out", &err));
    CHECK_INT(qd_pipeline_check_disk(&est, 4000000000ull, 5000000000ull, "/out", &err), QD_EPREFLIGHT);
    CHECK_CONTAINS(err.msg, "the job needs about 5.00 GB more (10.00 GB in all, 5.00 GB of it already in the output "
                            "directory from an earlier attempt), 4.00 GB free");
    CHECK_CONTAINS(err.msg, "free space or choose another output directory");
    CHECK_INT(qd_pipeline_check_disk(&est, 0, 15000000ull, "/out", &err), QD_EPREFLIGHT);
    CHECK_CONTAINS(err.msg, "(10.00 GB in all, 15 MB of it already in the output directory");
    /* Holding more than the estimate (a larger earlier output that overwrite removes). */
    CHECK_OK(qd_pipeline_check_disk(&est, 0, 20000000000ull, "/out", &err));
}

int main(void)
{
    qd_testgen_opts o = pt_llama_opts(128, 3);
    if (pt_setup(2, 4000, 128, 3, &T, &tokens) || pt_setup_model("llama", &o, model, sizeof model)) return 1;
    TEST_RUN(test_failed_finish_leaves_checkpoint);
    TEST_RUN(test_failed_write_then_resume);
    TEST_RUN(test_disk_rule_counts_held);
    return pt_teardown();
}
