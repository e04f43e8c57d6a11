/* The refusal hint names the settings that lower the short figure: fewer calibration
 * samples only when activations are a real share of the memory peak, checkpoint.acts_every
 * only when activation files are part of the disk figure; and the estimate's activation
 * parts follow the job (acts_every 1 keeps two files on a 3-block model, 4 none); a long
 * output directory is cut from its start so the hint stays in the message. */
#include <stdio.h>
#include <string.h>

#include "pipeline_testlib.h"
#include "quant/core/fsutil.h"

static void test_hint_text(void)
{
    char buf[512];
    qd_pipeline_estimate e = {.peak_ram_bytes = 10000000000ull, .acts_ram_bytes = 6000000000ull, .n_blocks = 32};
    qd_pipeline_estimate_hint(&e, 0, buf, sizeof buf);
    CHECK_CONTAINS(buf, "fewer calibration samples");
    CHECK_CONTAINS(buf, "6.00 GB");
    e.acts_ram_bytes = 1000000000ull;
    qd_pipeline_estimate_hint(&e, 0, buf, sizeof buf);
    CHECK(strstr(buf, "fewer calibration samples") == NULL);
    CHECK_CONTAINS(buf, "no job setting lowers");
    e.disk_bytes = 20000000000ull;
    e.acts_disk_bytes = 4000000000ull;
    qd_pipeline_estimate_hint(&e, 1, buf, sizeof buf);
    CHECK_CONTAINS(buf, "checkpoint.acts_every of 32");
    e.acts_disk_bytes = 0;
    qd_pipeline_estimate_hint(&e, 1, buf, sizeof buf);
    CHECK(strstr(buf, "acts_every") == NULL);
    CHECK_CONTAINS(buf, "another output directory");
}

static void test_parts_follow_job(const char *T)
{
    char model[4096], tokens[4096], out[4096];
    snprintf(model, sizeof model, "%s/llama", T);
    snprintf(tokens, sizeof tokens, "%s/calib.json", T);
    snprintf(out, sizeof out, "%s/out", T);
    qd_testgen_opts lo = pt_llama_opts(128, 3);
    if (pt_gen_model(model, &lo) || pt_write_tokens(tokens, 4000, 128, 3)) { CHECK(0); return; }
    qp_job *j1 = pt_job(model, out, "gptq", "gptq", tokens, "\"checkpoint\":{\"acts_every\":1},");
    qp_job *j4 = pt_job(model, out, "gptq", "gptq", tokens, NULL);
    qd_pipeline_estimate e1, e4;
    qd_err err = {0};
    if (!j1 || !j4) { CHECK(0); goto out; }
    CHECK_OK(qd_pipeline_estimate_job(j1, &e1, &err));
    CHECK_OK(qd_pipeline_estimate_job(j4, &e4, &err));
    CHECK(e1.acts_ram_bytes > 0 && e1.acts_ram_bytes < e1.peak_ram_bytes);
    CHECK(e1.acts_disk_bytes > 0);
    CHECK_INT((long long)e4.acts_disk_bytes, 0);
    CHECK((long long)(e1.disk_bytes - e4.disk_bytes) == (long long)e1.acts_disk_bytes);
out:
    qp_job_free(j1);
    qp_job_free(j4);
}

/* A disk refusal names a long output directory by its end, so the hint after it fits the
 * 512-byte error buffer whole (qd_fs_path_tail). */
static void test_path_tail(void)
{
    char buf[QD_ERR_MSG_MAX], path[4000];
    memset(path, 'a', sizeof path - 9);
    snprintf(path + sizeof path - 9, 9, "/out-dir");
    CHECK(qd_fs_path_tail("/short/dir", 100, buf, sizeof buf) != buf);   /* short: itself */
    const char *t = qd_fs_path_tail(path, 100, buf, sizeof buf);
    CHECK(t == buf);
    CHECK_INT((long)strlen(t), 100);
    CHECK(strncmp(t, "...", 3) == 0);
    CHECK(strcmp(t + strlen(t) - 8, "/out-dir") == 0);
    CHECK(qd_fs_path_tail(path, 4, buf, sizeof buf) == path);            /* no room: itself */
}

int main(void)
{
    const char *T = test_tmpdir();
    test_hint_text();
    test_path_tail();
    test_parts_follow_job(T);
    return test_finish();
}
