/* The part peak (part_ram_bytes) counts the block a helper keeps loaded from its capture
 * parts beside the quantize or factor part it runs meanwhile (worker.c keeps it until a part
 * of another block, or 60 idle seconds): a dense block whose calibration is two forward
 * batches has its passes cut into capture parts, one of one batch has not, and the first's
 * part peak is at least the block's F32 weights more. The shape is one where a capture part
 * alone holds less than a quantize part and the block together. */
#include <stdio.h>

#include "pipeline_testlib.h"

/* part_ram_bytes of a GPTQ job on the model in dir at samples x 512 tokens; 0 on failure. */
static unsigned long long part_peak(const char *dir, int samples)
{
    pt_calib_samples = samples;
    pt_calib_seq_len = 512;
    qp_job *job = pt_job(dir, test_path(test_tmpdir(), "out"), "gptq", "gptq", test_path(dir, "ids.json"),
                         "\"workers\":2,");
    qd_pipeline_estimate est;
    qd_err err = {0};
    unsigned long long r = 0;
    if (job && qd_pipeline_estimate_job(job, &est, &err) == 0) r = est.part_ram_bytes;
    else fprintf(stderr, "estimate: %s\n", err.msg);
    qp_job_free(job);
    return r;
}

static void test_kept_block_counted(void)
{
    const char *dir = test_fresh_dir("llama");
    qd_testgen_opts o = pt_llama_opts(5632, 1);
    o.hidden = 2048;
    o.n_heads = 16;
    o.n_kv_heads = 16;
    o.max_pos = 1024;
    if (pt_gen_model(dir, &o)) { CHECK(0); return; }
    unsigned long long params = 2048ull * 2048 * 4 + 3ull * 2048 * 5632;   /* q, k, v, o; gate, up, down */
    unsigned long long one = part_peak(dir, 8), cut = part_peak(dir, 16);   /* 4096 tokens: one batch; 8192: two */
    CHECK(one > 0 && cut > 0);
    fprintf(stderr, "part peak: one batch %.1f MiB, two batches %.1f MiB, the block's F32 weights %.1f MiB\n",
            one / 1048576.0, cut / 1048576.0, params * 4 / 1048576.0);
    CHECK(cut >= one + params * 4);
}

int main(void)
{
    TEST_RUN(test_kept_block_counted);
    return test_finish();
}
