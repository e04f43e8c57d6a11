/* Golden checks on the real models in ../shared/data: logits of stories260K (F32, tied)
 * and tiny-llama-c4 (F16, GQA, untied) on the first 64 wiki ids to 1e-4, and GPTQ-style
 * perplexity on the first 40 windows of 512 of the prefix token files to 0.1%. The full
 * wikitext-2 perplexity runs only with QUANTD_LONG_TESTS=1 (it needs the tokenizer). */
#include <cjson/cJSON.h>
#include <stdlib.h>

#include "quant/core/fsutil.h"
#include "quant/model/eval.h"
#include "quant/model/model.h"
#include "quant/model/tokenizer/tokenizer.h"
#include "test_util.h"

static const char *data;
static qd_backend *be;

/* Reads a JSON array of ints, or an object whose "tokens" is one. */
static int32_t *read_ids(const char *path, size_t *n)
{
    char *buf = NULL;
    size_t len = 0;
    qd_err err = {0};
    if (qd_fs_read_file(path, &buf, &len, &err)) return NULL;
    cJSON *root = cJSON_Parse(buf);
    free(buf);
    const cJSON *a = cJSON_IsArray(root) ? root : cJSON_GetObjectItem(root, "tokens");
    int32_t *ids = NULL;
    if (cJSON_IsArray(a)) {
        *n = (size_t)cJSON_GetArraySize(a);
        ids = malloc(*n * sizeof *ids);
        size_t i = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, a) ids[i++] = (int32_t)e->valuedouble;
    }
    cJSON_Delete(root);
    return ids;
}

static void check_logits(const char *model)
{
    char dir[1024], gpath[1024];
    snprintf(dir, sizeof dir, "%s/models/%s", data, model);
    snprintf(gpath, sizeof gpath, "%s/goldens/%s/wiki_first64.logits.f32", data, model);
    qd_err err = {0};
    qd_model *m = NULL;
    CHECK_OK(qd_model_open(dir, be, &m, &err));
    if (!m) { fprintf(stderr, "%s\n", err.msg); return; }
    size_t n = 0;
    int32_t *ids = read_ids(test_path(data, "goldens/tok512/wiki_first4096.ids.json"), &n);
    CHECK(ids && n >= 64);
    char *gold = NULL;
    size_t glen = 0;
    CHECK_OK(qd_fs_read_file(gpath, &gold, &glen, &err));
    CHECK_INT(glen, 64 * 512 * 4);
    float *lg = malloc(64 * 512 * sizeof *lg);
    CHECK_OK(qd_model_forward(m, ids, 1, 64, lg, &err));
    double d = test_max_abs_diff(lg, (const float *)gold, 64 * 512);
    fprintf(stderr, "%s: max |logit - golden| = %.3g\n", model, d);
    CHECK(d <= 1e-4);
    free(lg);
    free(gold);
    free(ids);
    qd_model_close(m);
}

static void test_logits_stories(void) { check_logits("stories260K"); }
static void test_logits_tiny_llama(void) { check_logits("tiny-llama-c4"); }

static void check_ppl(const char *model, double want)
{
    char dir[1024], tpath[1024];
    snprintf(dir, sizeof dir, "%s/models/%s", data, model);
    snprintf(tpath, sizeof tpath, "%s/goldens/%s.wikitext2.tokens.json", data, model);
    qd_err err = {0};
    qd_model *m = NULL;
    CHECK_OK(qd_model_open(dir, be, &m, &err));
    size_t n = 0;
    int32_t *ids = read_ids(tpath, &n);
    CHECK_INT(n, 32768);
    qd_eval_opts o = qd_eval_opts_default(512);
    o.max_windows = 40;
    qd_eval_result r;
    CHECK_OK(qd_eval_ppl(m, ids, n, &o, &r, &err));
    fprintf(stderr, "%s: ppl %.4f (golden %.4f) in %.2fs\n", model, r.ppl, want, r.seconds);
    CHECK_INT(r.windows, 40);
    CHECK_INT(r.predicted, 40 * 511);
    CHECK_NEAR(r.ppl, want, want * 1e-3);
    /* Smaller batches must give the same numbers (batching is not allowed to leak). */
    o.batch_rows = 512;
    o.max_windows = 3;
    qd_eval_result r1, r2;
    CHECK_OK(qd_eval_ppl(m, ids, n, &o, &r1, &err));
    o.batch_rows = 2048;
    CHECK_OK(qd_eval_ppl(m, ids, n, &o, &r2, &err));
    CHECK_NEAR(r1.nll_sum, r2.nll_sum, 1e-6 * r1.nll_sum);
    /* Passes (act_bytes) change when each block is loaded, never what a batch computes: one
     * pass, one batch per pass with the blocks kept, and one batch per pass with every block
     * loaded again for each pass give the same sum to the last bit. */
    o.batch_rows = 1024;
    o.max_windows = 5;
    qd_eval_result p1, p2, p3;
    CHECK_OK(qd_eval_ppl(m, ids, n, &o, &p1, &err));
    o.act_bytes = 1;
    CHECK_OK(qd_eval_ppl(m, ids, n, &o, &p2, &err));
    o.cache_bytes = 1;
    CHECK_OK(qd_eval_ppl(m, ids, n, &o, &p3, &err));
    CHECK_NEAR(p2.nll_sum, p1.nll_sum, 0.0);
    CHECK_NEAR(p3.nll_sum, p1.nll_sum, 0.0);
    CHECK_INT(p3.predicted, 5 * 511);
    free(ids);
    qd_model_close(m);
}

static void test_ppl_stories(void) { check_ppl("stories260K", 123.3421); }
static void test_ppl_tiny_llama(void) { check_ppl("tiny-llama-c4", 29.4379); }

/* Against a reference model: a model against itself is at KL 0 with full top-1 agreement;
 * two different models (same tokenizer) are far apart, and ref_ppl is the reference's own
 * perplexity on the same windows. */
static void test_kl_vs_reference(void)
{
    char d1[1024], d2[1024];
    snprintf(d1, sizeof d1, "%s/models/stories260K", data);
    snprintf(d2, sizeof d2, "%s/models/tiny-llama-c4", data);
    qd_err err = {0};
    qd_model *a = NULL, *b = NULL;
    CHECK_OK(qd_model_open(d1, be, &a, &err));
    CHECK_OK(qd_model_open(d2, be, &b, &err));
    size_t n = 0;
    int32_t *ids = read_ids(test_path(data, "goldens/tiny-llama-c4.wikitext2.tokens.json"), &n);
    qd_eval_opts o = qd_eval_opts_default(256);
    o.max_windows = 3;
    qd_eval_result self, cross, plain;
    CHECK_OK(qd_eval_ppl_vs(a, a, ids, n, &o, &self, &err));
    CHECK(self.has_ref);
    CHECK_NEAR(self.kl_mean, 0.0, 1e-9);
    CHECK_NEAR(self.kl_max, 0.0, 1e-9);
    CHECK_NEAR(self.top1_agree, 1.0, 1e-12);
    CHECK_NEAR(self.ref_ppl, self.ppl, 1e-9 * self.ppl);
    CHECK_OK(qd_eval_ppl_vs(a, b, ids, n, &o, &cross, &err));
    CHECK_OK(qd_eval_ppl(b, ids, n, &o, &plain, &err));
    CHECK(!plain.has_ref);
    CHECK_NEAR(cross.ppl, self.ppl, 1e-9 * self.ppl);
    CHECK_NEAR(cross.ref_ppl, plain.ppl, 1e-9 * plain.ppl);
    CHECK(cross.kl_mean > 0.1 && cross.kl_max >= cross.kl_mean);
    CHECK(cross.top1_agree > 0.0 && cross.top1_agree < 1.0);
    free(ids);
    qd_model_close(a);
    qd_model_close(b);
}

/* Full wikitext-2 (809290 tokens): minutes of CPU, so opt-in. */
static void check_long(const char *model, double want)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/models/%s", data, model);
    qd_err err = {0};
    qd_tokenizer *tok = NULL;
    qd_model *m = NULL;
    CHECK_OK(qd_tokenizer_load(dir, &tok, &err));
    CHECK_OK(qd_model_open(dir, be, &m, &err));
    char *text = NULL;
    size_t len = 0;
    CHECK_OK(qd_fs_read_file(test_path(data, "text/wikitext-2-raw/wiki.test.raw"), &text, &len, &err));
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK_OK(qd_tokenizer_encode(tok, text, len, QD_TOK_BOS_ON, &ids, &n, &err));
    CHECK_INT(n, 809290);
    qd_eval_opts o = qd_eval_opts_default(512);
    qd_eval_result r;
    CHECK_OK(qd_eval_ppl(m, ids, n, &o, &r, &err));
    fprintf(stderr, "%s: full wikitext2 ppl %.4f (golden %.4f) in %.1fs\n", model, r.ppl, want, r.seconds);
    CHECK_INT(r.windows, 1580);
    CHECK_NEAR(r.ppl, want, want * 1e-3);
    free(ids);
    free(text);
    qd_model_close(m);
    qd_tokenizer_free(tok);
}

static void test_long_ppl(void)
{
    check_long("tiny-llama-c4", 28.1090);
    check_long("stories260K", 119.3718);
}

int main(void)
{
    data = test_shared_data();
    if (!data) { fprintf(stderr, "shared data absent; skipping\n"); return TEST_SKIP; }
    qd_err err = {0};
    if (qd_backend_cpu_open(2, NULL, &be, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    TEST_RUN(test_logits_stories);
    TEST_RUN(test_logits_tiny_llama);
    TEST_RUN(test_ppl_stories);
    TEST_RUN(test_ppl_tiny_llama);
    TEST_RUN(test_kl_vs_reference);
    const char *lt = getenv("QUANTD_LONG_TESTS");
    if (lt && !strcmp(lt, "1")) TEST_RUN(test_long_ppl);
    qd_backend_close(be);
    return test_finish();
}
