/* Llama 4's chunked attention on a sequence that ends inside a chunk, against transformers:
 * the golden (tests/data/families/llama4) is 64 tokens in 4 whole chunks of 16, which the
 * forward runs as one attention over 4 sequences; its first 40 tokens (chunks 16, 16, 8)
 * take the per-chunk path, and by causality transformers' logits for them are the golden's
 * first 40 rows. Two copies in a batch check that each sequence is chunked on its own. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quant/core/fsutil.h"
#include "quant/model/model.h"
#include "quant/model/token_file.h"
#include "test_util.h"

static void test_partial_chunk(void)
{
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/tests/data/families/llama4", test_source_dir());
    qd_err err = {0};
    qd_backend *be = NULL;
    qd_model *m = NULL;
    int32_t *ids = NULL, two[80];
    size_t n_ids = 0, glen = 0;
    char *gold = NULL;
    CHECK_OK(qd_backend_cpu_open(2, NULL, &be, &err));
    CHECK_OK(qd_token_file_read(test_path(dir, "ids.json"), &ids, &n_ids, &err));
    CHECK_OK(qd_fs_read_file(test_path(dir, "logits.f32"), &gold, &glen, &err));
    CHECK_OK(be ? qd_model_open(dir, be, &m, &err) : -1);
    if (!m || !ids || !gold || n_ids < 40) goto out;
    int64_t V = qd_model_cfg(m)->vocab, n = 40;
    CHECK_INT(glen, n_ids * (size_t)V * sizeof(float));
    memcpy(two, ids, 40 * sizeof *two);
    memcpy(two + 40, ids, 40 * sizeof *two);
    float *lg = malloc((size_t)(2 * n * V) * sizeof *lg);
    CHECK_OK(qd_model_forward(m, two, 2, n, lg, &err));
    const float *ref = (const float *)gold;
    double num = 0, den = 0;
    for (int64_t b = 0; b < 2; b++)
        for (int64_t i = 0; i < n * V; i++) {
            double d = fabs((double)lg[b * n * V + i] - (double)ref[i]);
            if (!(d <= num)) num = isnan(d) ? INFINITY : d;
            if (fabs((double)ref[i]) > den) den = fabs((double)ref[i]);
        }
    printf("llama4 40 tokens (chunks 16, 16, 8), batch 2: rel %.3g\n", num / den);
    CHECK(num / den <= 1e-4);
    free(lg);
out:
    qd_model_close(m);
    qd_backend_close(be);
    free(ids);
    free(gold);
}

int main(void)
{
    TEST_RUN(test_partial_chunk);
    return test_finish();
}
