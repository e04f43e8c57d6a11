/* The block's two halves (qd_block_forward_part): attention then MLP on the kept residual
 * stream computes bit for bit what the whole block does, for every family checkpoint under
 * tests/data/families/ (dense, Gemma's extra norms, Phi-3's fused projections, MoE routing)
 * and the real tiny-llama-c4 in ../shared/data; the pipeline's true-sequential passes rely
 * on it (byte-identical output to the whole-block passes), and so on the attention half's
 * end computed from its output projection's input alone (qd_block_attn_finish), and the MLP
 * half's end from its last projection's input (qd_block_mlp_finish, dense models). Also: every
 * family's input groups are its attention groups followed by its MLP groups. A parallel block
 * (Phi, GPT-NeoX) has no halves and refuses them (check_parallel). */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "quant/backend/backend.h"
#include "quant/core/fsutil.h"
#include "quant/model/block.h"
#include "quant/model/model.h"
#include "test_util.h"

/* Input hook: keeps the output projection's input (CPU backend: host memory). */
typedef struct ctx_keep {
    int group;
    float *ctx;
    int64_t rows;
} ctx_keep;

static int keep_ctx(void *ud, int block, int group, const qd_input_group *g, const float *x, int64_t rows)
{
    ctx_keep *k = ud;
    (void)block;
    if (group != k->group) return 0;
    k->ctx = malloc((size_t)(rows * g->k) * sizeof(float));
    if (!k->ctx) return QD_ENOMEM;
    memcpy(k->ctx, x, (size_t)(rows * g->k) * sizeof(float));
    k->rows = rows;
    return 0;
}

/* A parallel block (Phi, GPT-NeoX use_parallel_residual; Falcon-H1, whose attention and mixer
 * read scaled copies of one norm): its MLP reads the block's input,
 * which the residual stream between halves does not hold, so it has no halves: every group
 * is QD_BLOCK_ALL (the pipeline then runs it whole), and asking for a half or a half's end
 * is refused rather than computed wrong. */
static void check_parallel(qd_model *m, const char *dir)
{
    qd_err err = {0};
    for (int g = 0; g < qd_model_n_groups(m); g++) CHECK(qd_model_group_part(m, g) == QD_BLOCK_ALL);
    const qd_model_config *c = qd_model_cfg(m);
    int64_t batch = 2, seq = 12, rows = batch * seq;
    size_t n = (size_t)(rows * c->hidden);
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *x), *y2 = malloc(n * sizeof *x);
    test_rng r;
    test_rng_seed(&r, 7);
    test_fill_normal(&r, x, n, 1.0f);
    qd_block_weights *bw = NULL;
    CHECK_OK(qd_block_load(m, 0, &bw, &err));
    if (bw) {
        CHECK_OK(qd_block_forward(m, bw, x, y, batch, seq, NULL, NULL, &err));
        CHECK_OK(qd_block_forward_part(m, bw, QD_BLOCK_ALL, x, y2, batch, seq, NULL, NULL, &err));
        if (memcmp(y, y2, n * sizeof *y) != 0) TEST_FAIL_("%s: QD_BLOCK_ALL differs from the block forward", dir);
        else test_checks++;
        CHECK_INT(qd_block_forward_part(m, bw, QD_BLOCK_ATTN, x, y2, batch, seq, NULL, NULL, &err), QD_EINVAL);
        CHECK_INT(qd_block_forward_part(m, bw, QD_BLOCK_MLP, x, y2, batch, seq, NULL, NULL, &err), QD_EINVAL);
        CHECK_INT(qd_block_attn_finish(m, bw, x, x, y2, rows, &err), QD_EINVAL);
        CHECK_INT(qd_block_mlp_finish(m, bw, x, x, y2, rows, &err), QD_EINVAL);
    }
    qd_block_free(m, bw);
    free(x); free(y); free(y2);
}

static void check_model(const char *dir, qd_backend *be)
{
    qd_err err = {0};
    qd_model *m = NULL;
    int rc = qd_model_open(dir, be, &m, &err);
    if (rc) { TEST_FAIL_("%s: %s", dir, err.msg); return; }
    if (qd_model_cfg(m)->parallel_block) {
        check_parallel(m, dir);
        qd_model_close(m);
        return;
    }
    /* Groups: attention first, then MLP, both present. */
    int ng = qd_model_n_groups(m), switches = 0;
    for (int g = 1; g < ng; g++) switches += qd_model_group_part(m, g) != qd_model_group_part(m, g - 1);
    CHECK(qd_model_group_part(m, 0) == QD_BLOCK_ATTN);
    CHECK(qd_model_group_part(m, ng - 1) == QD_BLOCK_MLP);
    CHECK_INT(switches, 1);
    const qd_model_config *c = qd_model_cfg(m);
    int64_t batch = 2, seq = 12, rows = batch * seq, hid = c->hidden;
    size_t n = (size_t)(rows * hid);
    float *x = malloc(n * sizeof *x), *y_all = malloc(n * sizeof *x), *mid = malloc(n * sizeof *x), *y = malloc(n * sizeof *x);
    test_rng r;
    test_rng_seed(&r, 7);
    test_fill_normal(&r, x, n, 1.0f);
    int blocks = c->n_layers < 2 ? c->n_layers : 2;
    for (int b = 0; b < blocks; b++) {
        qd_block_weights *bw = NULL;
        CHECK_OK(qd_block_load(m, b, &bw, &err));
        if (!bw) break;
        CHECK_OK(qd_block_forward(m, bw, x, y_all, batch, seq, NULL, NULL, &err));
        CHECK_OK(qd_block_forward_part(m, bw, QD_BLOCK_ATTN, x, mid, batch, seq, NULL, NULL, &err));
        CHECK_OK(qd_block_forward_part(m, bw, QD_BLOCK_MLP, mid, y, batch, seq, NULL, NULL, &err));
        if (memcmp(y, y_all, n * sizeof *y) != 0) TEST_FAIL_("%s block %d: attention + MLP halves differ from the whole block", dir, b);
        else test_checks++;
        /* The halves really split: the residual stream is neither the input nor the output. */
        CHECK(memcmp(mid, x, n * sizeof *x) != 0 && memcmp(mid, y_all, n * sizeof *x) != 0);
        /* The attention half's end from the output projection's input alone (the pipeline's
         * true-sequential passes): the same residual stream, bit for bit. */
        ctx_keep k = {.group = qd_model_block_attn_out_group(m, b)};   /* a hybrid's mixer: its out_proj */
        qd_block_hooks hooks = {.ud = &k, .input = keep_ctx};
        CHECK_OK(qd_block_forward_part(m, bw, QD_BLOCK_ATTN, x, y, batch, seq, NULL, &hooks, &err));
        int has_o = qd_model_block_has_linear(m, b, qd_model_group(m, k.group)->linears[0]);
        if (!has_o) {
            /* A hybrid's recurrent layer (Qwen3-Next's Gated DeltaNet) has no o_proj: the hook
             * never sees its group, and the finish is refused rather than run without it. */
            CHECK(k.ctx == NULL);
            CHECK(qd_block_attn_finish(m, bw, x, x, y, rows, &err) == QD_EINVAL);
        } else {
            CHECK(k.ctx != NULL && k.rows == rows);
        }
        if (k.ctx) {
            CHECK_OK(qd_block_attn_finish(m, bw, k.ctx, x, y, rows, &err));
            if (memcmp(y, mid, n * sizeof *y) != 0) TEST_FAIL_("%s block %d: attention finish differs from the attention half", dir, b);
            else test_checks++;
        }
        free(k.ctx);
        /* The MLP half's end from its last projection's input alone (a dense model). */
        ctx_keep ka = {.group = qd_model_mlp_out_group(m)};
        if (ka.group >= 0) {
            qd_block_hooks ha = {.ud = &ka, .input = keep_ctx};
            CHECK_OK(qd_block_forward_part(m, bw, QD_BLOCK_MLP, mid, y, batch, seq, NULL, &ha, &err));
            CHECK(ka.ctx != NULL && ka.rows == rows);
            if (ka.ctx) {
                memset(y, 0, n * sizeof *y);
                CHECK_OK(qd_block_mlp_finish(m, bw, ka.ctx, mid, y, rows, &err));
                if (memcmp(y, y_all, n * sizeof *y) != 0) TEST_FAIL_("%s block %d: MLP finish differs from the MLP half", dir, b);
                else test_checks++;
            }
            free(ka.ctx);
        } else {
            CHECK(qd_block_mlp_finish(m, bw, mid, mid, y, rows, &err) == QD_EINVAL);   /* experts */
        }
        qd_block_free(m, bw);
    }
    free(x); free(y_all); free(mid); free(y);
    qd_model_close(m);
}

int main(void)
{
    qd_err err = {0};
    qd_backend *be = NULL;
    CHECK_OK(qd_backend_cpu_open(2, NULL, &be, &err));
    if (!be) return test_finish();
    char root[4096], dir[4400];
    snprintf(root, sizeof root, "%s/tests/data/families", test_source_dir());
    DIR *d = opendir(root);
    CHECK(d != NULL);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        snprintf(dir, sizeof dir, "%s/%s", root, e->d_name);
        check_model(dir, be);
        n++;
    }
    if (d) closedir(d);
    CHECK(n >= 19);
    snprintf(dir, sizeof dir, "%s/../shared/data/models/tiny-llama-c4", test_source_dir());
    if (qd_fs_exists(dir)) check_model(dir, be);
    qd_backend_close(be);
    return test_finish();
}
