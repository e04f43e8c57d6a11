/* The TP-aware layout (quant/tp/tp_layout.h, seed 003): on random act-order GPTQ MLPs of
 * every bit width and both GPTQ formats the permuted checkpoint computes the same MLP, the
 * down projection's g_idx becomes k / group_size, the column layers' columns (qweight,
 * qzeros fields, scales, bias) follow P, the tensors still unpack through the format table
 * (the loaders' invariants), and bad shapes fail with errors that name the rule. End to end:
 * a tiny llama quantized with desc_act and layout tp_aware gives the same logits as the
 * plain layout, with sorted down g_idx and the `dynamic` override in its config. */
#include "pipeline_testlib.h"

#include "quant/formats/format.h"
#include "quant/formats/qlayer.h"
#include "quant/tp/tp_layout.h"
#include "quant/tp/tp_sim.h"

static void stable_argsort_matches_torch(void)
{
    const int32_t g[] = {2, 0, 1, 0, 2, 1, 0, 1};
    const int64_t want[] = {1, 3, 6, 2, 5, 7, 0, 4};
    int64_t p[8];
    qd_err err = {0};
    CHECK_OK(qd_tp_perm_from_g_idx(g, 8, p, &err));
    for (int i = 0; i < 8; i++) CHECK_INT(p[i], want[i]);
    const int32_t bad[] = {0, -1};
    CHECK_ERR(qd_tp_perm_from_g_idx(bad, 2, p, &err));
    CHECK_CONTAINS(err.msg, "negative");
}

/* One MLP (gate, up, down) of a format and bit width: permute, check everything. */
static void one_mlp(const char *fmt_name, int bits, int64_t gs, int tp, int with_bias)
{
    const qd_format *f = qd_format_find(fmt_name);
    CHECK(f != NULL);
    if (!f) return;
    test_rng r;
    test_rng_seed(&r, 1000 + (uint64_t)bits * 7 + (uint64_t)tp);
    const int64_t H = 64, F = 256;
    qd_packed gate, up, down, gate0, up0, down0;
    pt_rand_packed(&r, f, F, H, bits, gs, with_bias ? 1.0f : 0.0f, NULL, &gate);
    pt_rand_packed(&r, f, F, H, bits, gs, with_bias ? 1.0f : 0.0f, NULL, &up);
    pt_rand_packed(&r, f, H, F, bits, gs, with_bias ? 1.0f : 0.0f, NULL, &down);
    /* Gate and up share one input, so one g_idx (as the pipeline quantizes them). */
    memcpy(up.g_idx, gate.g_idx, (size_t)H * sizeof(int32_t));
    qd_err err = {0};
    qd_tp_mlp ref;
    const qd_packed *c0[2] = {&gate, &up};
    CHECK_OK(qd_tp_mlp_from_packed(f, c0, 2, &down, QD_TP_ACT_SILU_GLU, &ref, &err));
    /* Keep copies of the unpermuted tensors. */
    qd_qlayer ug, ud;
    memset(&ug, 0, sizeof ug);
    memset(&ud, 0, sizeof ud);
    CHECK_OK(f->unpack(&gate, &ug, &err));
    CHECK_OK(f->unpack(&down, &ud, &err));
    (void)gate0; (void)up0; (void)down0;
    int64_t qw_shape[2] = {down.qweight_shape[0], down.qweight_shape[1]};
    int64_t qz_shape[2] = {gate.qzeros_shape[0], gate.qzeros_shape[1]};

    int64_t *P = malloc((size_t)F * sizeof *P);
    qd_packed *cols[2] = {&gate, &up};
    if (qd_tp_layout_apply_pair(&down, cols, 2, tp, P, &err)) TEST_FAIL_("apply_pair: %s", err.msg);
    /* down's g_idx is sorted and exactly k / group_size; shapes and dtypes unchanged. */
    int sorted = 1;
    for (int64_t k = 0; k < F; k++) sorted &= down.g_idx[k] == (gs > 0 ? k / gs : 0);
    CHECK(sorted);
    CHECK_INT(down.qweight_shape[0], qw_shape[0]);
    CHECK_INT(down.qweight_shape[1], qw_shape[1]);
    CHECK_INT(gate.qzeros_shape[0], qz_shape[0]);
    CHECK_INT(gate.qzeros_shape[1], qz_shape[1]);
    /* The loaders' invariants: the tensors unpack (v1 zeros stay in [1, maxq]) and hold the
     * old codes at permuted places. */
    qd_qlayer pg, pd;
    memset(&pg, 0, sizeof pg);
    memset(&pd, 0, sizeof pd);
    CHECK_OK(f->unpack(&gate, &pg, &err));
    CHECK_OK(f->unpack(&down, &pd, &err));
    CHECK_OK(f->check(&pg, &err));
    CHECK_OK(f->check(&pd, &err));
    int moved_ok = 1;
    for (int64_t i = 0; i < F && pg.q && ug.q; i++) {
        for (int64_t k = 0; k < H; k++) moved_ok &= pg.q[i * H + k] == ug.q[P[i] * H + k];
        for (int64_t g = 0; g < pg.n_groups; g++) {
            moved_ok &= pg.zeros[g * F + i] == ug.zeros[g * F + P[i]];
            moved_ok &= pg.scales[g * F + i] == ug.scales[g * F + P[i]];
        }
        if (with_bias) moved_ok &= pg.bias[i] == ug.bias[P[i]];
    }
    for (int64_t o = 0; o < H && pd.q && ud.q; o++)
        for (int64_t i = 0; i < F; i++) moved_ok &= pd.q[o * F + i] == ud.q[o * F + P[i]];
    CHECK(moved_ok);
    /* The same function on random inputs. */
    qd_tp_mlp perm;
    CHECK_OK(qd_tp_mlp_from_packed(f, c0, 2, &down, QD_TP_ACT_SILU_GLU, &perm, &err));
    const int64_t M = 5;
    float x[5 * 64], y0[5 * 64], y1[5 * 64];
    test_fill_normal(&r, x, (size_t)(M * H), 1.0f);
    CHECK_OK(qd_tp_mlp_forward_ref(&ref, x, M, y0, &err));
    CHECK_OK(qd_tp_mlp_forward_ref(&perm, x, M, y1, &err));
    CHECK(pt_rel_err(y1, y0, M * H) < 1e-6);
    qd_tp_mlp_free(&ref);
    qd_tp_mlp_free(&perm);
    qd_qlayer_free(&ug);
    qd_qlayer_free(&ud);
    qd_qlayer_free(&pg);
    qd_qlayer_free(&pd);
    qd_packed_free(&gate);
    qd_packed_free(&up);
    qd_packed_free(&down);
    free(P);
}

static void permuted_mlp_same_function(void)
{
    one_mlp("gptq", 4, 32, 2, 0);
    one_mlp("gptq", 3, 32, 2, 1);
    one_mlp("gptq", 2, 64, 4, 0);
    one_mlp("gptq", 8, 32, 8, 1);
    one_mlp("gptq_v2", 4, 32, 4, 1);
    one_mlp("gptq_v2", 3, -1, 8, 0);
    one_mlp("gptq_v2", 4, 64, 1, 0);
}

static void validation_errors(void)
{
    qd_err err = {0};
    CHECK_ERR(qd_tp_layout_check_shard(256, 3, 4, 32, "mlp.down_proj", &err));
    CHECK_CONTAINS(err.msg, "do not split over tp=3");
    CHECK_ERR(qd_tp_layout_check_shard(256, 16, 4, 32, "mlp.down_proj", &err));
    CHECK_CONTAINS(err.msg, "tp x group_size = 512");
    CHECK_ERR(qd_tp_layout_check_shard(256, 16, 3, -1, "mlp.down_proj", &err));
    CHECK_CONTAINS(err.msg, "3-bit packed block");
    CHECK_OK(qd_tp_layout_check_shard(256, 8, 4, 32, "mlp.down_proj", &err));

    const qd_format *f = qd_format_find("gptq");
    test_rng r;
    test_rng_seed(&r, 5);
    qd_packed gate, down;
    pt_rand_packed(&r, f, 256, 64, 4, 32, 0, NULL, &gate);
    pt_rand_packed(&r, f, 64, 256, 4, 32, 0, NULL, &down);
    qd_packed *cols[1] = {&gate};
    int32_t *g0 = malloc(256 * sizeof *g0);
    memcpy(g0, down.g_idx, 256 * sizeof *g0);
    CHECK_ERR(qd_tp_layout_apply_pair(&down, cols, 1, 16, NULL, &err));
    CHECK_CONTAINS(err.msg, "group_size");
    CHECK(memcmp(g0, down.g_idx, 256 * sizeof *g0) == 0);   /* untouched */
    /* A column layer whose outputs do not match down's inputs. */
    qd_packed small;
    pt_rand_packed(&r, f, 128, 64, 4, 32, 0, NULL, &small);
    cols[0] = &small;
    CHECK_ERR(qd_tp_layout_apply_pair(&down, cols, 1, 2, NULL, &err));
    CHECK_CONTAINS(err.msg, "has 128 outputs");
    /* A permutation that does not come from this g_idx cannot give a trivial g_idx. */
    int64_t id[256];
    for (int i = 0; i < 256; i++) id[i] = i;
    CHECK_ERR(qd_tp_permute_rows(&down, id, &err));
    CHECK_CONTAINS(err.msg, "trivial g_idx");
    CHECK(memcmp(g0, down.g_idx, 256 * sizeof *g0) == 0);
    id[3] = 4;
    CHECK_ERR(qd_tp_permute_cols(&gate, id, &err));
    CHECK_CONTAINS(err.msg, "repeated");
    free(g0);
    qd_packed_free(&gate);
    qd_packed_free(&down);
    qd_packed_free(&small);
}

/* ---- end to end through the pipeline ---- */

static int run_job(qp_job *job, qd_err *err)
{
    return qd_pipeline_run(job, pt_be, NULL, err);
}

static void end_to_end_llama(void)
{
    const char *T = test_tmpdir();
    char model[4096], tokens[4096], out_plain[4096], out_tp[4096], out_bad[4096];
    snprintf(model, sizeof model, "%s/llama", T);
    snprintf(tokens, sizeof tokens, "%s/tokens.json", T);
    snprintf(out_plain, sizeof out_plain, "%s/plain", T);
    snprintf(out_tp, sizeof out_tp, "%s/tp", T);
    snprintf(out_bad, sizeof out_bad, "%s/bad", T);
    qd_testgen_opts o = pt_llama_opts(128, 2);   /* intermediate 128 = tp 2 x group 32 x 2 */
    CHECK_OK(pt_gen_model(model, &o));
    CHECK_OK(pt_write_tokens(tokens, 4096, 128, 3));
    /* the plain job as tp_aware quantizes: act-order without static groups */
    qp_job *plain = pt_job(model, out_plain, "gptq", "gptq", tokens, "\"desc_act\":true,\"static_groups\":false,\"bits\":4,");
    qp_job *tpj = pt_job(model, out_tp, "gptq", "gptq", tokens, "\"desc_act\":true,\"bits\":4,\"tp\":2,\"layout\":\"tp_aware\",");
    qp_job *bad = pt_job(model, out_bad, "gptq", "gptq", tokens, "\"desc_act\":true,\"bits\":4,\"tp\":8,\"layout\":\"tp_aware\",");
    CHECK(plain && tpj && bad);
    if (!plain || !tpj || !bad) goto done;
    qd_err err = {0};
    if (run_job(plain, &err)) TEST_FAIL_("plain job: %s", err.msg);
    memset(&err, 0, sizeof err);
    if (run_job(tpj, &err)) TEST_FAIL_("tp_aware job: %s", err.msg);
    /* tp 8: each rank would hold 16 of down_proj's 128 inputs, half a group of 32. */
    memset(&err, 0, sizeof err);
    CHECK_ERR(run_job(bad, &err));
    fprintf(stderr, "expected error: %s\n", err.msg);
    CHECK_CONTAINS(err.msg, "tp x group_size");
    CHECK_CONTAINS(err.msg, "mlp.down_proj");

    /* Same logits: only the layout differs. */
    int64_t n0 = 0, n1 = 0;
    float *l0 = pt_logits(out_plain, &n0), *l1 = pt_logits(out_tp, &n1);
    CHECK(l0 && l1 && n0 == n1);
    if (l0 && l1) {
        CHECK(pt_rel_err(l1, l0, n0) < 1e-5);
        CHECK(test_max_abs_diff(l1, l0, (size_t)n0) < 1e-3);
    }
    free(l0);
    free(l1);

    /* Tensors: every down_proj g_idx is k / group_size; gate/up differ from plain (the
     * permutation did something) but keep their shapes; attention is untouched. */
    st_model *sp = NULL, *st = NULL;
    CHECK_OK(st_model_open(out_plain, &sp, &err));
    CHECK_OK(st_model_open(out_tp, &st, &err));
    for (int b = 0; b < 2 && sp && st; b++) {
        char name[128];
        snprintf(name, sizeof name, "model.layers.%d.mlp.down_proj.g_idx", b);
        const st_tensor *gp = st_model_find(sp, name), *gt = st_model_find(st, name);
        CHECK(gp && gt && gt->dtype == QD_DTYPE_I32 && gt->ndim == 1 && gt->shape[0] == 128);
        if (gp && gt) {
            const int32_t *g = gt->data, *g_plain = gp->data;
            int triv = 1, plain_sorted = 1;
            for (int k = 0; k < 128; k++) triv &= g[k] == k / 32;
            for (int k = 1; k < 128; k++) plain_sorted &= g_plain[k] >= g_plain[k - 1];
            CHECK(triv);
            CHECK(!plain_sorted);   /* act-order really scattered it */
        }
        const char *same[] = {"self_attn.q_proj.qweight", "self_attn.o_proj.g_idx", "self_attn.k_proj.scales"};
        for (int i = 0; i < 3; i++) {
            snprintf(name, sizeof name, "model.layers.%d.%s", b, same[i]);
            const st_tensor *a = st_model_find(sp, name), *c = st_model_find(st, name);
            CHECK(a && c && a->numel == c->numel && !memcmp(a->data, c->data, (size_t)(c->end - c->begin)));
        }
        const char *shp[] = {"mlp.gate_proj.qweight", "mlp.up_proj.qzeros", "mlp.up_proj.scales", "mlp.down_proj.qweight"};
        for (int i = 0; i < 4; i++) {
            snprintf(name, sizeof name, "model.layers.%d.%s", b, shp[i]);
            const st_tensor *a = st_model_find(sp, name), *c = st_model_find(st, name);
            CHECK(a && c && a->dtype == c->dtype && a->ndim == 2 && c->ndim == 2 && a->shape[0] == c->shape[0] &&
                  a->shape[1] == c->shape[1]);
            if (a && c && i == 0) CHECK(memcmp(a->data, c->data, (size_t)(c->end - c->begin)) != 0);
        }
    }
    st_model_close(sp);
    st_model_close(st);

    /* Config: a `dynamic` override with desc_act false for the down projections. */
    cJSON *cfg = pt_read_json(test_path(out_tp, "config.json"));
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(cfg, "quantization_config");
    const cJSON *dyn = cJSON_GetObjectItemCaseSensitive(q, "dynamic");
    const cJSON *ov = cJSON_GetObjectItemCaseSensitive(dyn, "+:model\\.layers\\.\\d+\\.mlp\\.down_proj$");
    CHECK(cJSON_IsObject(ov));
    CHECK(cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(ov, "desc_act")));
    CHECK(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(q, "desc_act")));
    cJSON_Delete(cfg);
    cJSON *pcfg = pt_read_json(test_path(out_plain, "config.json"));
    CHECK(!cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(pcfg, "quantization_config"), "dynamic"));
    cJSON_Delete(pcfg);
    cJSON *rep = pt_read_json(test_path(out_tp, "quantd_report.json"));
    const cJSON *note = cJSON_GetObjectItemCaseSensitive(rep, "layout_note");
    CHECK(cJSON_IsString(note));
    if (cJSON_IsString(note)) {
        CHECK_CONTAINS(note->valuestring, "tp=2");
        CHECK_CONTAINS(note->valuestring, "Attention layers keep the plain");
    }
    cJSON_Delete(rep);
done:
    qp_job_free(plain);
    qp_job_free(tpj);
    qp_job_free(bad);
}

int main(void)
{
    if (pt_setup(1, 0, 0, 0, NULL, NULL)) return 1;
    TEST_RUN(stable_argsort_matches_torch);
    TEST_RUN(permuted_mlp_same_function);
    TEST_RUN(validation_errors);
    TEST_RUN(end_to_end_llama);
    return pt_teardown();
}
