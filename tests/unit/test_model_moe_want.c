/* hooks->want (block.h): a capture pass into scratch runs only the experts whose inputs it
 * takes, each only up to the input it takes, and every input hook it keeps sees exactly the
 * rows and values the whole forward gives it. For each MoE family checkpoint under
 * tests/data/families (Mixtral, Qwen2-MoE's gated shared expert, Llama 4's sigmoid-scaled
 * input, DeepSeek-V3's shared expert), on its first MoE block:
 *   - an expert's gate/up input alone: no expert linear runs at all;
 *   - an expert's down input alone: its gate and up run, nothing else of any expert;
 *   - the shared expert's down input (where there is one): the same for it;
 * each time the wanted group's input is the whole forward's, bit for bit. */
#include <stdlib.h>
#include <string.h>

#include "quant/backend/backend.h"
#include "quant/model/block.h"
#include "quant/model/model.h"
#include "test_util.h"

enum { MAX_G = 1024, MAX_L = 2048 };

/* What one forward's hooks saw: each group's rows and a hash of its values (CPU backend:
 * host memory), and how often each linear ran. */
typedef struct seen {
    int64_t rows[MAX_G];
    uint64_t sum[MAX_G];
    int ran[MAX_L];
} seen;

/* FNV-1a over the bytes, continued from h (0: a fresh hash). */
static uint64_t fnv(const void *p, size_t n, uint64_t h)
{
    const unsigned char *b = p;
    if (!h) h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static int on_input(void *ud, int block, int group, const qd_input_group *g, const float *x, int64_t rows)
{
    seen *s = ud;
    (void)block;
    if (group >= MAX_G) return QD_EINVAL;
    s->sum[group] = fnv(x, (size_t)(rows * g->k) * sizeof(float), s->sum[group]);
    s->rows[group] += rows;
    return 0;
}

static int on_override(void *ud, int block, int linear, const float **w, const float **b)
{
    seen *s = ud;
    (void)block, (void)w, (void)b;
    if (linear < MAX_L) s->ran[linear]++;
    return 0;
}

static int run(qd_model *m, const qd_block_weights *bw, const float *x, float *y, int64_t batch, int64_t seq,
               const int *want, seen *s)
{
    memset(s, 0, sizeof *s);
    qd_block_hooks h = {.ud = s, .input = on_input, .override = on_override, .want = want};
    qd_err err = {0};
    int rc = qd_block_forward(m, bw, x, y, batch, seq, NULL, &h, &err);
    if (rc) TEST_FAIL_("forward: %s", err.msg);
    return rc;
}

/* Forward with only group g's input wanted: g's input is the whole run's, and the linears
 * that ran are exactly those `expect` marks (of the experts' linears; the attention's and
 * the router's run as before). */
static void check_want(qd_model *m, const qd_block_weights *bw, const float *x, float *y, int64_t batch, int64_t seq,
                       const seen *full, int g, const int *expect, const char *what)
{
    int want[MAX_G] = {0};
    want[g] = 1;
    seen s;
    if (run(m, bw, x, y, batch, seq, want, &s)) return;
    test_checks++;
    if (s.rows[g] != full->rows[g] || s.sum[g] != full->sum[g])
        TEST_FAIL_("%s: group %s saw %lld rows (hash %016llx), the whole forward %lld (%016llx)", what,
                   qd_model_group(m, g)->name, (long long)s.rows[g], (unsigned long long)s.sum[g],
                   (long long)full->rows[g], (unsigned long long)full->sum[g]);
    for (int li = 0; li < qd_model_n_linears(m) && li < MAX_L; li++) {
        if (qd_model_linear(m, li)->expert == -1) continue;   /* not an expert's */
        test_checks++;
        if ((s.ran[li] > 0) != expect[li])
            TEST_FAIL_("%s: expert linear %s ran %d times (expected %s)", what, qd_model_linear(m, li)->name, s.ran[li],
                       expect[li] ? "to run" : "not to");
    }
}

static void check_family(const char *name, qd_backend *be)
{
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/tests/data/families/%s", test_source_dir(), name);
    qd_model *m = NULL;
    qd_err err = {0};
    CHECK_OK(qd_model_open(dir, be, &m, &err));
    if (!m) return;
    qd_model_set_moe_calibrate_all(m, 0);
    int block = -1;
    for (int b = 0; b < qd_model_cfg(m)->n_layers && block < 0; b++)
        if (qd_model_block_is_moe(m, b)) block = b;
    CHECK(block >= 0);
    CHECK(qd_model_n_groups(m) <= MAX_G && qd_model_n_linears(m) <= MAX_L);
    qd_block_weights *bw = NULL;
    if (block >= 0) CHECK_OK(qd_block_load(m, block, &bw, &err));
    int64_t batch = 2, seq = 16, rows = batch * seq;
    size_t n = (size_t)(rows * qd_model_cfg(m)->hidden);
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    seen *full = calloc(1, sizeof *full);
    CHECK(x && y && full);
    if (!bw || !x || !y || !full || qd_model_n_groups(m) > MAX_G) goto out;
    test_rng r;
    test_rng_seed(&r, 11);
    test_fill_normal(&r, x, n, 1.0f);
    if (run(m, bw, x, y, batch, seq, NULL, full)) goto out;
    /* The routed expert of most rows in the whole run, and the shared expert's groups. */
    int gu = -1, dn = -1, sdn = -1;
    int64_t best = 0;
    for (int g = 0; g < qd_model_n_groups(m); g++) {
        const qd_input_group *G = qd_model_group(m, g);
        int e = qd_model_linear(m, G->linears[0])->expert;
        if (e == QD_SHARED_EXPERT && G->n_linears == 1) sdn = g;
        if (e < 0 || G->n_linears != 2 || full->rows[g] <= best) continue;
        best = full->rows[g];
        gu = g;
    }
    CHECK(gu >= 0);
    if (gu < 0) goto out;
    int e = qd_model_linear(m, qd_model_group(m, gu)->linears[0])->expert;
    for (int g = 0; g < qd_model_n_groups(m); g++) {
        const qd_input_group *G = qd_model_group(m, g);
        if (g != gu && G->n_linears == 1 && qd_model_linear(m, G->linears[0])->expert == e) dn = g;
    }
    CHECK(dn >= 0);
    int *expect = calloc(MAX_L, sizeof *expect);
    CHECK(expect != NULL);
    if (!expect || dn < 0) {
        free(expect);
        goto out;
    }
    check_want(m, bw, x, y, batch, seq, full, gu, expect, name);   /* gate/up input: nothing runs */
    const qd_input_group *G = qd_model_group(m, gu);
    for (int j = 0; j < G->n_linears; j++) expect[G->linears[j]] = 1;
    check_want(m, bw, x, y, batch, seq, full, dn, expect, name);   /* down input: its gate and up */
    if (sdn >= 0) {
        memset(expect, 0, MAX_L * sizeof *expect);
        for (int g = 0; g < qd_model_n_groups(m); g++) {
            const qd_input_group *S = qd_model_group(m, g);
            if (g != sdn && qd_model_linear(m, S->linears[0])->expert == QD_SHARED_EXPERT)
                for (int j = 0; j < S->n_linears; j++) expect[S->linears[j]] = 1;
        }
        check_want(m, bw, x, y, batch, seq, full, sdn, expect, name);
    }
    printf("%-12s block %d: expert %d's gate/up (%lld rows) and down%s checked\n", name, block, e, (long long)best,
           sdn >= 0 ? ", the shared expert's down" : "");
    free(expect);
out:
    free(x);
    free(y);
    free(full);
    qd_block_free(m, bw);
    qd_model_close(m);
}

int main(void)
{
    qd_backend *be = NULL;
    qd_err err = {0};
    CHECK_OK(qd_backend_cpu_open(1, NULL, &be, &err));
    if (!be) return test_finish();
    static const char *const fams[] = {"mixtral", "qwen2_moe", "llama4", "deepseek_v3", "olmoe"};
    for (size_t i = 0; i < sizeof fams / sizeof *fams; i++) check_family(fams[i], be);
    qd_backend_close(be);
    return test_finish();
}
