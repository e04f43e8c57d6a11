/* The N-rank TP simulation (quant/tp/tp_sim.h): the paper's Algorithm 2 (naive, with the
 * all-gather) on a plain act-order MLP and Algorithm 3 (TP-aware, no all-gather) on the
 * permuted one agree with each other and with the unsharded MLP for tp = 1, 2, 4, 8, for the
 * llama gated MLP and OPT's relu MLP with biases; the all-gather moves exactly (tp - 1) x
 * M x ff activations; Algorithm 3 refuses a checkpoint whose down g_idx is not sorted. End
 * to end: the same on block 1 of a tiny llama quantized plain and tp_aware by the pipeline. */
#include "pipeline_testlib.h"

#include "quant/formats/format.h"
#include "quant/formats/qlayer.h"
#include "quant/tp/tp_layout.h"
#include "quant/tp/tp_sim.h"

/* Runs both algorithms and the reference; checks agreement and the collective counts. */
static void compare(const qd_tp_mlp *plain, const qd_tp_mlp *aware, int tp, int64_t M, uint64_t seed)
{
    const int64_t H = plain->hidden, F = plain->ff;
    test_rng r;
    test_rng_seed(&r, seed);
    float *x = malloc((size_t)(M * H) * sizeof *x), *y0 = malloc((size_t)(M * H) * sizeof *x);
    float *y2 = malloc((size_t)(M * H) * sizeof *x), *y3 = malloc((size_t)(M * H) * sizeof *x);
    test_fill_normal(&r, x, (size_t)(M * H), 1.0f);
    qd_err err = {0};
    qd_tp_comm_stats s2, s3;
    CHECK_OK(qd_tp_mlp_forward_ref(plain, x, M, y0, &err));
    if (qd_tp_sim_run(QD_TP_ALGO_NAIVE, plain, tp, x, M, y2, &s2, NULL, &err)) TEST_FAIL_("naive: %s", err.msg);
    if (qd_tp_sim_run(QD_TP_ALGO_AWARE, aware, tp, x, M, y3, &s3, NULL, &err)) TEST_FAIL_("aware: %s", err.msg);
    double e2 = pt_rel_err(y2, y0, M * H), e3 = pt_rel_err(y3, y0, M * H), e23 = pt_rel_err(y3, y2, M * H);
    test_checks++;
    if (!(e2 < 1e-5 && e3 < 1e-5 && e23 < 1e-5))
        TEST_FAIL_("tp=%d M=%lld: naive vs ref %.3g, aware vs ref %.3g, naive vs aware %.3g", tp, (long long)M, e2, e3, e23);
    CHECK_INT(s2.allgathers, 1);
    CHECK_INT(s3.allgathers, 0);
    CHECK_INT(s2.allgather_bytes, (uint64_t)(tp - 1) * (uint64_t)(M * F) * 4);
    CHECK_INT(s3.allgather_bytes, 0);
    CHECK_INT(s2.allgather_bytes / (uint64_t)M / 2, qd_tp_allgather_bytes_per_token(F, tp, 4) / 2);
    CHECK_INT(s3.allreduce_bytes, s2.allreduce_bytes);
    free(x);
    free(y0);
    free(y2);
    free(y3);
}

static void llama_mlp_all_tp(void)
{
    const qd_format *f = qd_format_find("gptq");
    test_rng r;
    test_rng_seed(&r, 21);
    const int64_t H = 64, F = 512, gs = 32;
    qd_packed gate, up, down;
    pt_rand_packed(&r, f, F, H, 4, gs, 0, NULL, &gate);
    pt_rand_packed(&r, f, F, H, 4, gs, 0, gate.g_idx, &up);
    pt_rand_packed(&r, f, H, F, 4, gs, 0, NULL, &down);
    qd_err err = {0};
    const qd_packed *cols[2] = {&gate, &up};
    qd_tp_mlp plain, aware;
    CHECK_OK(qd_tp_mlp_from_packed(f, cols, 2, &down, QD_TP_ACT_SILU_GLU, &plain, &err));
    /* Algorithm 3 needs the TP-aware checkpoint. */
    float x[64 * 2], y[64 * 2];
    memset(x, 0, sizeof x);
    CHECK_ERR(qd_tp_sim_run(QD_TP_ALGO_AWARE, &plain, 2, x, 2, y, NULL, NULL, &err));
    CHECK_CONTAINS(err.msg, "layout tp_aware");
    qd_packed *mcols[2] = {&gate, &up};
    CHECK_OK(qd_tp_layout_apply_pair(&down, mcols, 2, 8, NULL, &err));
    CHECK_OK(qd_tp_mlp_from_packed(f, cols, 2, &down, QD_TP_ACT_SILU_GLU, &aware, &err));
    for (int tp = 1; tp <= 8; tp *= 2) compare(&plain, &aware, tp, tp == 4 ? 1 : 7, 100 + (uint64_t)tp);
    CHECK_INT(qd_tp_allgather_bytes_per_token(28672, 8, 2), 7 * 28672 * 2);
    CHECK_INT(qd_tp_allgather_bytes_per_token(28672, 1, 2), 0);
    CHECK_ERR(qd_tp_sim_run(QD_TP_ALGO_NAIVE, &plain, 3, x, 2, y, NULL, NULL, &err));
    CHECK_CONTAINS(err.msg, "does not split over tp=3");
    qd_tp_mlp_free(&plain);
    qd_tp_mlp_free(&aware);
    qd_packed_free(&gate);
    qd_packed_free(&up);
    qd_packed_free(&down);
}

static void opt_relu_mlp_with_bias(void)
{
    const qd_format *f = qd_format_find("gptq_v2");
    test_rng r;
    test_rng_seed(&r, 22);
    const int64_t H = 64, F = 256, gs = 32;
    qd_packed fc1, fc2;
    pt_rand_packed(&r, f, F, H, 3, gs, 0.1f, NULL, &fc1);
    pt_rand_packed(&r, f, H, F, 3, gs, 0.1f, NULL, &fc2);
    qd_err err = {0};
    const qd_packed *cols[1] = {&fc1};
    qd_tp_mlp plain, aware;
    CHECK_OK(qd_tp_mlp_from_packed(f, cols, 1, &fc2, QD_TP_ACT_RELU, &plain, &err));
    qd_packed *mcols[1] = {&fc1};
    CHECK_OK(qd_tp_layout_apply_pair(&fc2, mcols, 1, 2, NULL, &err));
    CHECK_OK(qd_tp_mlp_from_packed(f, cols, 1, &fc2, QD_TP_ACT_RELU, &aware, &err));
    compare(&plain, &aware, 2, 5, 7);
    qd_tp_mlp_free(&plain);
    qd_tp_mlp_free(&aware);
    qd_packed_free(&fc1);
    qd_packed_free(&fc2);
}

static void pipeline_checkpoints(void)
{
    const char *T = test_tmpdir();
    char model[4096], tokens[4096], out_plain[4096], out_tp[4096];
    snprintf(model, sizeof model, "%s/llama", T);
    snprintf(tokens, sizeof tokens, "%s/tokens.json", T);
    snprintf(out_plain, sizeof out_plain, "%s/plain", T);
    snprintf(out_tp, sizeof out_tp, "%s/tp", T);
    qd_testgen_opts o = pt_llama_opts(256, 2);
    CHECK_OK(pt_gen_model(model, &o));
    CHECK_OK(pt_write_tokens(tokens, 4096, 128, 4));
    /* the plain job as tp_aware quantizes: act-order without static groups */
    qp_job *plain = pt_job(model, out_plain, "gptq", "gptq_v2", tokens, "\"desc_act\":true,\"static_groups\":false,\"bits\":4,");
    qp_job *tpj = pt_job(model, out_tp, "gptq", "gptq_v2", tokens, "\"desc_act\":true,\"bits\":4,\"tp\":4,\"layout\":\"tp_aware\",");
    CHECK(plain && tpj);
    qd_err err = {0};
    if (plain && qd_pipeline_run(plain, pt_be, NULL, &err)) TEST_FAIL_("plain job: %s", err.msg);
    if (tpj && qd_pipeline_run(tpj, pt_be, NULL, &err)) TEST_FAIL_("tp job: %s", err.msg);
    qd_model *mp = NULL, *mt = NULL;
    if (qd_model_open(out_plain, pt_be, &mp, &err)) TEST_FAIL_("open: %s", err.msg);
    if (qd_model_open(out_tp, pt_be, &mt, &err)) TEST_FAIL_("open: %s", err.msg);
    if (mp && mt) {
        qd_tp_mlp a, a_perm, b;
        CHECK_OK(qd_tp_mlp_load(mp, 1, 4, &a, &a_perm, &err));
        CHECK_OK(qd_tp_mlp_load(mt, 1, 4, &b, NULL, &err));
        /* The in-memory permutation of the plain checkpoint is what the pipeline wrote. */
        if (a_perm.w_down && b.w_down) {
            CHECK(memcmp(a_perm.w_down, b.w_down, (size_t)(b.ff * b.hidden) * sizeof(float)) == 0);
            CHECK(memcmp(a_perm.w_col[0], b.w_col[0], (size_t)(b.ff * b.hidden) * sizeof(float)) == 0);
            CHECK(memcmp(a_perm.g_idx_down, b.g_idx_down, (size_t)b.ff * sizeof(int32_t)) == 0);
            for (int tp = 1; tp <= 4; tp *= 2) compare(&a, &b, tp, 3, 50 + (uint64_t)tp);
        }
        qd_tp_mlp_free(&a);
        qd_tp_mlp_free(&a_perm);
        qd_tp_mlp_free(&b);
        CHECK_ERR(qd_tp_mlp_load(mp, 5, 4, &a, NULL, &err));
        CHECK_CONTAINS(err.msg, "layer 5 is not in 0..1");
    }
    qd_model_close(mp);
    qd_model_close(mt);
    qp_job_free(plain);
    qp_job_free(tpj);
}

int main(void)
{
    if (pt_setup(1, 0, 0, 0, NULL, NULL)) return 1;
    TEST_RUN(llama_mlp_all_tp);
    TEST_RUN(opt_relu_mlp_with_bias);
    TEST_RUN(pipeline_checkpoints);
    return pt_teardown();
}
