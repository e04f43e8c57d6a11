/* The model runtime on tiny random checkpoints from testgen (runs everywhere): the whole
 * forward against an independent naive scalar implementation written here (llama with GQA,
 * explicit head_dim, Qwen2 biases, tied/untied; OPT pre-/post-LN with project_in/out), the
 * causal mask, batching, F16 vs F32 and sharded vs single-file checkpoints, block hooks
 * and weight get/set, and the errors for bad checkpoints. */
#include <stdlib.h>

#include "quant/core/fsutil.h"
#include "quant/core/safetensors.h"
#include "quant/model/block.h"
#include "quant/model/eval.h"
#include "quant/model/testgen.h"
#include "test_util.h"

static qd_backend *be;

/* ---- naive reference ---- */

static float *rd(const st_model *st, const char *name)
{
    const st_tensor *t = st_model_find(st, name);
    if (!t) return NULL;
    float *p = malloc(t->numel * sizeof *p);
    qd_err err = {0};
    if (st_tensor_read_f32(t, p, &err)) { free(p); return NULL; }
    return p;
}

static float *rdf(const st_model *st, const char *fmt, int i, const char *what)
{
    char name[256];
    snprintf(name, sizeof name, fmt, i, what);
    return rd(st, name);
}

static void ref_linear(const float *x, int T, const float *w, const float *b, int N, int K, float *y)
{
    for (int t = 0; t < T; t++)
        for (int n = 0; n < N; n++) {
            double s = b ? b[n] : 0.0;
            for (int k = 0; k < K; k++) s += (double)x[t * K + k] * w[n * K + k];
            y[t * N + n] = (float)s;
        }
}

static void ref_norm(const float *x, int T, int H, const float *w, const float *b, int ln, float eps, float *y)
{
    for (int t = 0; t < T; t++) {
        double mean = 0, var = 0;
        if (ln) { for (int i = 0; i < H; i++) mean += x[t * H + i]; mean /= H; }
        for (int i = 0; i < H; i++) { double d = x[t * H + i] - mean; var += d * d; }
        double inv = 1.0 / sqrt(var / H + eps);
        for (int i = 0; i < H; i++) y[t * H + i] = (float)((x[t * H + i] - mean) * inv * w[i] + (b ? b[i] : 0.0));
    }
}

/* Naive forward of one sequence: logits [T, vocab]. */
static void ref_forward(const char *dir, const qd_model_config *c, const int32_t *ids, int T, float *logits)
{
    qd_err err = {0};
    st_model *st = NULL;
    if (st_model_open(dir, &st, &err)) { fprintf(stderr, "%s\n", err.msg); return; }
    int H = (int)c->hidden, F = (int)c->intermediate, nh = (int)c->n_heads, nkv = (int)c->n_kv_heads, hd = (int)c->head_dim;
    int pd = (int)c->word_embed_proj_dim, V = (int)c->vocab, llama = c->family == QD_ARCH_LLAMA;
    int QD = nh * hd, KVD = nkv * hd, big = F > QD ? F : QD;
    if (big < H) big = H;
    float *h = calloc((size_t)T * H, 4), *xn = calloc((size_t)T * big, 4), *q = calloc((size_t)T * QD, 4);
    float *k = calloc((size_t)T * KVD, 4), *v = calloc((size_t)T * KVD, 4), *att = calloc((size_t)T * QD, 4);
    float *f1 = calloc((size_t)T * big, 4), *f2 = calloc((size_t)T * big, 4), *o = calloc((size_t)T * big, 4);
    float *E = rd(st, llama ? "model.embed_tokens.weight" : "model.decoder.embed_tokens.weight");
    if (llama) {
        for (int t = 0; t < T; t++) memcpy(h + t * H, E + ids[t] * H, H * 4);
    } else {
        for (int t = 0; t < T; t++) memcpy(f1 + t * pd, E + ids[t] * pd, pd * 4);
        if (pd != H) {
            float *pin = rd(st, "model.decoder.project_in.weight");
            ref_linear(f1, T, pin, NULL, H, pd, h);
            free(pin);
        } else {
            memcpy(h, f1, (size_t)T * H * 4);
        }
        float *P = rd(st, "model.decoder.embed_positions.weight");
        for (int t = 0; t < T; t++) for (int i = 0; i < H; i++) h[t * H + i] += P[(t + 2) * H + i];
        free(P);
    }
    const char *pf = llama ? "model.layers.%d.%s" : "model.decoder.layers.%d.%s";
    int pre = llama || c->do_layer_norm_before;
    for (int L = 0; L < c->n_layers; L++) {
        float *n0w = rdf(st, pf, L, llama ? "input_layernorm.weight" : "self_attn_layer_norm.weight");
        float *n0b = llama ? NULL : rdf(st, pf, L, "self_attn_layer_norm.bias");
        float *n1w = rdf(st, pf, L, llama ? "post_attention_layernorm.weight" : "final_layer_norm.weight");
        float *n1b = llama ? NULL : rdf(st, pf, L, "final_layer_norm.bias");
        float *wq = rdf(st, pf, L, "self_attn.q_proj.weight"), *bq = rdf(st, pf, L, "self_attn.q_proj.bias");
        float *wk = rdf(st, pf, L, "self_attn.k_proj.weight"), *bk = rdf(st, pf, L, "self_attn.k_proj.bias");
        float *wv = rdf(st, pf, L, "self_attn.v_proj.weight"), *bv = rdf(st, pf, L, "self_attn.v_proj.bias");
        float *wo = rdf(st, pf, L, llama ? "self_attn.o_proj.weight" : "self_attn.out_proj.weight");
        float *bo = rdf(st, pf, L, llama ? "self_attn.o_proj.bias" : "self_attn.out_proj.bias");
        if (pre) ref_norm(h, T, H, n0w, n0b, !llama, c->norm_eps, xn);
        else memcpy(xn, h, (size_t)T * H * 4);
        ref_linear(xn, T, wq, bq, QD, H, q);
        ref_linear(xn, T, wk, bk, KVD, H, k);
        ref_linear(xn, T, wv, bv, KVD, H, v);
        if (llama) {
            for (int t = 0; t < T; t++)
                for (int which = 0; which < 2; which++) {
                    float *x = which ? k + t * KVD : q + t * QD;
                    int heads = which ? nkv : nh;
                    for (int hh = 0; hh < heads; hh++)
                        for (int i = 0; i < hd / 2; i++) {
                            double fr = pow((double)c->rope_theta, -2.0 * i / hd), a = t * fr;
                            float *p = x + hh * hd;
                            double x0 = p[i], x1 = p[i + hd / 2];
                            p[i] = (float)(x0 * cos(a) - x1 * sin(a));
                            p[i + hd / 2] = (float)(x1 * cos(a) + x0 * sin(a));
                        }
                }
        }
        for (int hh = 0; hh < nh; hh++) {
            int kh = hh / (nh / nkv);
            for (int t = 0; t < T; t++) {
                double s[512], mx = -1e30, sum = 0;
                for (int j = 0; j <= t; j++) {
                    double d = 0;
                    for (int i = 0; i < hd; i++) d += (double)q[t * QD + hh * hd + i] * k[j * KVD + kh * hd + i];
                    s[j] = d / sqrt((double)hd);
                    if (s[j] > mx) mx = s[j];
                }
                for (int j = 0; j <= t; j++) { s[j] = exp(s[j] - mx); sum += s[j]; }
                for (int i = 0; i < hd; i++) {
                    double a = 0;
                    for (int j = 0; j <= t; j++) a += s[j] / sum * v[j * KVD + kh * hd + i];
                    att[t * QD + hh * hd + i] = (float)a;
                }
            }
        }
        ref_linear(att, T, wo, bo, H, QD, o);
        for (int i = 0; i < T * H; i++) h[i] += o[i];
        if (!pre) ref_norm(h, T, H, n0w, n0b, 1, c->norm_eps, h);
        if (pre) ref_norm(h, T, H, n1w, n1b, !llama, c->norm_eps, xn);
        else memcpy(xn, h, (size_t)T * H * 4);
        if (llama) {
            float *wg = rdf(st, pf, L, "mlp.gate_proj.weight"), *wu = rdf(st, pf, L, "mlp.up_proj.weight");
            float *wd = rdf(st, pf, L, "mlp.down_proj.weight");
            ref_linear(xn, T, wg, NULL, F, H, f1);
            ref_linear(xn, T, wu, NULL, F, H, f2);
            for (int i = 0; i < T * F; i++) f1[i] = (float)(f1[i] / (1.0 + exp(-(double)f1[i])) * f2[i]);
            ref_linear(f1, T, wd, NULL, H, F, o);
            free(wg); free(wu); free(wd);
        } else {
            float *w1 = rdf(st, pf, L, "fc1.weight"), *b1 = rdf(st, pf, L, "fc1.bias");
            float *w2 = rdf(st, pf, L, "fc2.weight"), *b2 = rdf(st, pf, L, "fc2.bias");
            ref_linear(xn, T, w1, b1, F, H, f1);
            for (int i = 0; i < T * F; i++) if (f1[i] < 0) f1[i] = 0;
            ref_linear(f1, T, w2, b2, H, F, o);
            free(w1); free(b1); free(w2); free(b2);
        }
        for (int i = 0; i < T * H; i++) h[i] += o[i];
        if (!pre) ref_norm(h, T, H, n1w, n1b, 1, c->norm_eps, h);
        free(n0w); free(n0b); free(n1w); free(n1b);
        free(wq); free(bq); free(wk); free(bk); free(wv); free(bv); free(wo); free(bo);
    }
    float *fw = rd(st, llama ? "model.norm.weight" : "model.decoder.final_layer_norm.weight");
    float *fb = llama ? NULL : rd(st, "model.decoder.final_layer_norm.bias");
    if (fw) ref_norm(h, T, H, fw, fb, !llama, c->norm_eps, xn);
    else memcpy(xn, h, (size_t)T * H * 4);
    const float *hn = xn;
    if (!llama && pd != H) {
        float *pout = rd(st, "model.decoder.project_out.weight");
        ref_linear(xn, T, pout, NULL, pd, H, f1);
        hn = f1;
        free(pout);
    }
    float *lm = c->tie_word_embeddings ? NULL : rd(st, "lm_head.weight");
    ref_linear(hn, T, lm ? lm : E, NULL, V, pd, logits);
    free(lm); free(fw); free(fb); free(E);
    free(h); free(xn); free(q); free(k); free(v); free(att); free(f1); free(f2); free(o);
    st_model_close(st);
}

/* ---- helpers ---- */

static const char *gen(const char *name, const qd_testgen_opts *o)
{
    const char *dir = test_path(test_tmpdir(), name);
    qd_err err = {0};
    int rc = qd_testgen_write(dir, o, &err);
    if (rc) fprintf(stderr, "testgen %s: %s\n", name, err.msg);
    CHECK_OK(rc);
    return dir;
}

static void make_ids(int32_t *ids, int n, int vocab, uint64_t seed)
{
    test_rng r;
    test_rng_seed(&r, seed);
    for (int i = 0; i < n; i++) ids[i] = (int32_t)(test_rng_u64(&r) % (uint64_t)vocab);
}

/* Opens dir, runs the forward on T random ids and compares with the naive reference. */
static void check_vs_ref(const char *dir, int T)
{
    qd_err err = {0};
    qd_model *m = NULL;
    int rc = qd_model_open(dir, be, &m, &err);
    if (rc) fprintf(stderr, "%s\n", err.msg);
    CHECK_OK(rc);
    if (!m) return;
    const qd_model_config *c = qd_model_cfg(m);
    int32_t ids[64];
    make_ids(ids, T, (int)c->vocab, 7);
    float *a = malloc((size_t)T * c->vocab * 4), *b = malloc((size_t)T * c->vocab * 4);
    CHECK_OK(qd_model_forward(m, ids, 1, T, a, &err));
    ref_forward(dir, c, ids, T, b);
    double d = test_max_abs_diff(a, b, (size_t)T * c->vocab), mx = 0;
    for (int i = 0; i < T * c->vocab; i++) if (fabs(b[i]) > mx) mx = fabs(b[i]);
    fprintf(stderr, "  %s: max |logit - ref| = %.3g (max |logit| %.3g)\n", dir, d, mx);
    CHECK(mx > 0.1);
    CHECK(d <= 2e-4 * (1 + mx));
    free(a);
    free(b);
    qd_model_close(m);
}

/* ---- tests ---- */

static void test_llama_gqa_untied(void)
{
    qd_testgen_opts o = qd_testgen_defaults(QD_ARCH_LLAMA);
    check_vs_ref(gen("llama_gqa", &o), 24);
}

static void test_qwen2_bias_tied(void)
{
    qd_testgen_opts o = qd_testgen_defaults(QD_ARCH_LLAMA);
    o.architecture = "Qwen2ForCausalLM";
    o.tie_word_embeddings = 1;
    o.n_kv_heads = 1;
    const char *dir = gen("qwen2", &o);
    qd_err err = {0};
    qd_model *m = NULL;
    CHECK_OK(qd_model_open(dir, be, &m, &err));
    if (m) {
        CHECK(qd_model_linear(m, 0)->has_bias);
        CHECK(!qd_model_linear(m, 3)->has_bias);
        qd_model_close(m);
    }
    check_vs_ref(dir, 20);
}

static void test_llama_head_dim_bias(void)
{
    qd_testgen_opts o = qd_testgen_defaults(QD_ARCH_LLAMA);
    o.head_dim = 32;          /* heads * head_dim = 128 != hidden 64 */
    o.attention_bias = 1;
    o.rope_theta = 500000.0f;
    o.n_layers = 3;
    check_vs_ref(gen("llama_hd", &o), 16);
}

/* gen-model's Mixtral: a MixtralForCausalLM the model loader opens with its router and every
 * expert's three linears (its logits equal transformers' within 1e-6, checked by hand; the
 * Mixtral forward itself is held to transformers' goldens in test_model_families). */
static void test_mixtral_gen(void)
{
    qd_testgen_opts o = qd_testgen_defaults(QD_ARCH_LLAMA);
    o.n_experts = 4;
    o.top_k = 2;
    const char *dir = gen("mixtral", &o);
    qd_err err = {0};
    qd_model *m = NULL;
    CHECK_OK(qd_model_open(dir, be, &m, &err));
    if (!m) return;
    const qd_model_config *c = qd_model_cfg(m);
    CHECK_INT(c->n_experts, 4);
    CHECK_INT(c->moe_intermediate, o.intermediate);
    CHECK_STR(qd_model_moe_router(m), "block_sparse_moe.gate");
    CHECK(qd_model_linear_find(m, "block_sparse_moe.experts.3.w2") >= 0);
    CHECK_INT(qd_model_n_linears(m), 4 + 4 * 3);
    int32_t ids[12];
    make_ids(ids, 12, (int)c->vocab, 3);
    float *logits = malloc((size_t)(12 * c->vocab) * sizeof *logits);
    CHECK_OK(qd_model_forward(m, ids, 1, 12, logits, &err));
    int finite = 1;
    for (int64_t i = 0; i < 12 * c->vocab; i++) finite &= isfinite(logits[i]) != 0;
    CHECK(finite);
    free(logits);
    qd_model_close(m);
}

static void test_opt_project(void)
{
    qd_testgen_opts o = qd_testgen_defaults(QD_ARCH_OPT);
    o.word_embed_proj_dim = 32;
    o.tie_word_embeddings = 1;
    const char *dir = gen("opt_proj", &o);
    check_vs_ref(dir, 24);
    qd_err err = {0};
    qd_model *m = NULL;
    CHECK_OK(qd_model_open(dir, be, &m, &err));
    if (m) {
        CHECK_STR(qd_model_arch_name(m), "opt");
        const qd_input_group *g = qd_model_group(m, 3);
        CHECK_STR(g->prev, "fc1");
        CHECK_INT(g->prev_kind, QD_PREV_LINEAR);
        CHECK_INT(g->k, o.intermediate);
        CHECK_INT(qd_model_group(m, 0)->prev_index, 0);
        char pfx[64];
        CHECK_OK(qd_model_block_prefix(m, 1, pfx, sizeof pfx));
        CHECK_STR(pfx, "model.decoder.layers.1.");
        qd_model_close(m);
    }
}

static void test_opt_post_ln_untied(void)
{
    qd_testgen_opts o = qd_testgen_defaults(QD_ARCH_OPT);
    o.post_ln = 1;
    o.word_embed_proj_dim = 48;
    check_vs_ref(gen("opt_post", &o), 12);
}

static void test_causal_and_batch(void)
{
    qd_testgen_opts o = qd_testgen_defaults(QD_ARCH_LLAMA);
    const char *dir = gen("llama_causal", &o);
    qd_err err = {0};
    qd_model *m = NULL;
    CHECK_OK(qd_model_open(dir, be, &m, &err));
    if (!m) return;
    int T = 20, V = (int)o.vocab;
    int32_t ids[40];
    make_ids(ids, T, V, 3);
    memcpy(ids + T, ids, T * sizeof *ids);
    for (int t = 12; t < T; t++) ids[T + t] = (ids[t] + 5) % V;   /* same prefix, other tail */
    float *one = malloc((size_t)T * V * 4), *two = malloc((size_t)2 * T * V * 4);
    CHECK_OK(qd_model_forward(m, ids, 1, T, one, &err));
    CHECK_OK(qd_model_forward(m, ids, 2, T, two, &err));
    /* Batch row 0 equals the single forward; batch row 1 agrees up to position 11 only. */
    CHECK(test_max_abs_diff(one, two, (size_t)T * V) < 1e-5);
    CHECK(test_max_abs_diff(one, two + T * V, (size_t)12 * V) < 1e-5);
    CHECK(test_max_abs_diff(one + 12 * V, two + T * V + 12 * V, (size_t)V) > 1e-3);
    free(one);
    free(two);
    qd_model_close(m);
}

static void logits_of(const char *dir, int T, float *out)
{
    qd_err err = {0};
    qd_model *m = NULL;
    CHECK_OK(qd_model_open(dir, be, &m, &err));
    if (!m) return;
    int32_t ids[64];
    make_ids(ids, T, (int)qd_model_cfg(m)->vocab, 11);
    CHECK_OK(qd_model_forward(m, ids, 1, T, out, &err));
    qd_model_close(m);
}

static void test_dtypes_and_shards(void)
{
    qd_testgen_opts o = qd_testgen_defaults(QD_ARCH_LLAMA);
    o.round_f16 = 1;
    int T = 16, V = (int)o.vocab;
    float *a = malloc((size_t)T * V * 4), *b = malloc((size_t)T * V * 4), *c = malloc((size_t)T * V * 4);
    logits_of(gen("f32", &o), T, a);
    o.dtype = QD_DTYPE_F16;
    logits_of(gen("f16", &o), T, b);
    CHECK(test_max_abs_diff(a, b, (size_t)T * V) == 0.0);   /* identical weights, identical math */
    o.n_shards = 3;
    logits_of(gen("f16_sharded", &o), T, c);
    CHECK(test_max_abs_diff(b, c, (size_t)T * V) == 0.0);
    CHECK(qd_fs_exists(test_path(test_path(test_tmpdir(), "f16_sharded"), "model.safetensors.index.json")));
    o.n_shards = 1;
    o.dtype = QD_DTYPE_BF16;
    o.round_f16 = 0;
    logits_of(gen("bf16", &o), T, c);
    double d = test_max_abs_diff(a, c, (size_t)T * V);
    CHECK(d > 0.0 && d < 0.5);   /* BF16 rounding moves logits a little, not a lot */
    free(a);
    free(b);
    free(c);
}

/* ---- hooks ---- */

typedef struct hook_state {
    int calls[QD_MAX_GROUPS];
    int64_t rows, k[QD_MAX_GROUPS];
    double sum[QD_MAX_GROUPS];
    const float *w_override;
    int override_linear;
} hook_state;

static int on_input(void *ud, int block, int group, const qd_input_group *g, const float *x, int64_t rows)
{
    hook_state *s = ud;
    s->calls[group]++;
    s->rows = rows;
    s->k[group] = g->k;
    for (int64_t i = 0; i < rows * g->k; i++) s->sum[group] += x[i];
    return 0;
}

static int on_override(void *ud, int block, int linear, const float **w, const float **b)
{
    hook_state *s = ud;
    if (linear == s->override_linear) *w = s->w_override;
    return 0;
}

static void test_block_hooks(void)
{
    qd_testgen_opts o = qd_testgen_defaults(QD_ARCH_LLAMA);
    const char *dir = gen("llama_hooks", &o);
    qd_err err = {0};
    qd_model *m = NULL;
    CHECK_OK(qd_model_open(dir, be, &m, &err));
    if (!m) return;
    CHECK_INT(qd_model_n_linears(m), 7);
    CHECK_INT(qd_model_n_groups(m), 4);
    CHECK_INT(qd_model_linear_find(m, "mlp.down_proj"), 6);
    const qd_input_group *g0 = qd_model_group(m, 0), *g2 = qd_model_group(m, 2);
    CHECK_INT(g0->n_linears, 3);
    CHECK_STR(g0->prev, "input_layernorm");
    CHECK_INT(g2->n_linears, 2);
    CHECK_STR(g2->prev, "post_attention_layernorm");
    CHECK_INT(g2->prev_index, 1);
    CHECK_STR(qd_model_group(m, 1)->prev, "self_attn.v_proj");
    CHECK_STR(qd_model_group(m, 3)->prev, "mlp.up_proj");
    CHECK_INT(qd_model_linear(m, 1)->n, 32);   /* k_proj: 2 kv heads x 16 */

    int B = 2, T = 10, H = (int)o.hidden, R = B * T;
    int32_t ids[20];
    make_ids(ids, R, (int)o.vocab, 5);
    float *x = malloc((size_t)R * H * 4), *y1 = malloc((size_t)R * H * 4), *y2 = malloc((size_t)R * H * 4);
    CHECK_OK(qd_model_embed(m, ids, B, T, NULL, x, &err));
    qd_block_weights *bw = NULL;
    CHECK_OK(qd_block_load(m, 0, &bw, &err));
    hook_state s;
    memset(&s, 0, sizeof s);
    s.override_linear = -1;
    qd_block_hooks hooks = {.ud = &s, .input = on_input, .override = on_override};
    CHECK_OK(qd_block_forward(m, bw, x, y1, B, T, NULL, &hooks, &err));
    for (int g = 0; g < 4; g++) CHECK_INT(s.calls[g], 1);
    CHECK_INT(s.rows, R);
    CHECK_INT(s.k[3], o.intermediate);
    CHECK_INT(s.k[1], 64);

    /* Override down_proj with 2W: the same as setting 2W for good. */
    int di = 6;
    const qd_linear_info *L = qd_model_linear(m, di);
    float *w = malloc((size_t)(L->n * L->k) * 4);
    CHECK_OK(qd_block_linear_get(m, bw, di, w, NULL, &err));
    for (int64_t i = 0; i < L->n * L->k; i++) w[i] *= 2.0f;
    s.w_override = w;   /* CPU backend: host memory is backend memory */
    s.override_linear = di;
    CHECK_OK(qd_block_forward(m, bw, x, y1, B, T, NULL, &hooks, &err));
    CHECK_OK(qd_block_linear_set(m, bw, di, w, NULL, &err));
    CHECK_OK(qd_block_forward(m, bw, x, y2, B, T, NULL, NULL, &err));
    CHECK(test_max_abs_diff(y1, y2, (size_t)R * H) == 0.0);
    /* In place (y == x) gives the same. */
    memcpy(y1, x, (size_t)R * H * 4);
    CHECK_OK(qd_block_forward(m, bw, y1, y1, B, T, NULL, NULL, &err));
    CHECK(test_max_abs_diff(y1, y2, (size_t)R * H) == 0.0);

    /* Norm get/set round trip; scaling the MLP norm changes the output. */
    float *nw = malloc((size_t)H * 4);
    CHECK_OK(qd_block_norm_get(m, bw, 1, nw, NULL, &err));
    CHECK_STR(qd_model_norm_name(m, 1), "post_attention_layernorm");
    for (int i = 0; i < H; i++) nw[i] *= 0.5f;
    CHECK_OK(qd_block_norm_set(m, bw, 1, nw, NULL, &err));
    CHECK_OK(qd_block_forward(m, bw, x, y1, B, T, NULL, NULL, &err));
    CHECK(test_max_abs_diff(y1, y2, (size_t)R * H) > 1e-3);
    CHECK_ERR(qd_block_norm_set(m, bw, 1, nw, nw, &err));   /* RMSNorm has no bias */

    /* A hook error stops the forward. */
    CHECK_ERR(qd_block_linear_get(m, bw, 9, w, NULL, &err));
    CHECK(qd_block_bytes(m) > 0);
    free(nw);
    free(w);
    qd_block_free(m, bw);
    free(x);
    free(y1);
    free(y2);
    qd_model_close(m);
}

/* ---- errors ---- */

/* Evaluation against a reference model: itself gives KL 0, and a reference with another
 * vocabulary or too short a context is refused with a message, not compared. */
static void test_eval_vs_reference(void)
{
    qd_testgen_opts o = qd_testgen_defaults(QD_ARCH_LLAMA);
    char a_dir[1024];
    snprintf(a_dir, sizeof a_dir, "%s", gen("kl_a", &o));
    o.vocab = 96;
    char b_dir[1024];
    snprintf(b_dir, sizeof b_dir, "%s", gen("kl_b", &o));
    o.vocab = 128;
    o.max_pos = 32;
    const char *c_dir = gen("kl_c", &o);
    qd_err err = {0};
    qd_model *a = NULL, *b = NULL, *c = NULL;
    CHECK_OK(qd_model_open(a_dir, be, &a, &err));
    CHECK_OK(qd_model_open(b_dir, be, &b, &err));
    CHECK_OK(qd_model_open(c_dir, be, &c, &err));
    int32_t ids[256];
    make_ids(ids, 256, 96, 7);
    qd_eval_opts eo = qd_eval_opts_default(64);
    qd_eval_result r;
    CHECK_OK(qd_eval_ppl_vs(a, a, ids, 256, &eo, &r, &err));
    CHECK_INT(r.windows, 4);
    CHECK_NEAR(r.kl_mean, 0.0, 1e-9);
    CHECK_NEAR(r.top1_agree, 1.0, 0);
    CHECK_INT(qd_eval_ppl_vs(a, b, ids, 256, &eo, &r, &err), QD_EINVAL);
    CHECK_CONTAINS(err.msg, "cannot be compared");
    CHECK_INT(qd_eval_ppl_vs(a, c, ids, 256, &eo, &r, &err), QD_EINVAL);
    CHECK_CONTAINS(err.msg, "max positions 32");
    qd_model_close(a);
    qd_model_close(b);
    qd_model_close(c);
}

static void rewrite_config(const char *dir, const char *from, const char *to)
{
    char *buf = NULL;
    size_t len = 0;
    qd_err err = {0};
    const char *p = test_path(dir, "config.json");
    CHECK_OK(qd_fs_read_file(p, &buf, &len, &err));
    char *at = strstr(buf, from);
    CHECK(at != NULL);
    if (!at) { free(buf); return; }
    char out[8192];
    snprintf(out, sizeof out, "%.*s%s%s", (int)(at - buf), buf, to, at + strlen(from));
    CHECK_OK(qd_fs_write_atomic(p, out, strlen(out), &err));
    free(buf);
}

static void test_errors(void)
{
    qd_testgen_opts o = qd_testgen_defaults(QD_ARCH_LLAMA);
    qd_err err = {0};
    qd_model *m = NULL;

    const char *d1 = gen("bad_arch", &o);
    rewrite_config(d1, "LlamaForCausalLM", "GPTNeoXForCausalLM");
    CHECK_INT(qd_model_open(d1, be, &m, &err), QD_EUNSUPPORTED);
    CHECK_CONTAINS(err.msg, "GPTNeoXForCausalLM");

    const char *d2 = gen("bad_layers", &o);
    rewrite_config(d2, "\"num_hidden_layers\":\t2", "\"num_hidden_layers\":\t3");
    CHECK_INT(qd_model_open(d2, be, &m, &err), QD_ENOTFOUND);
    CHECK_CONTAINS(err.msg, "model.layers.2.self_attn.q_proj.weight");

    const char *d3 = gen("bad_shape", &o);
    rewrite_config(d3, "\"intermediate_size\":\t160", "\"intermediate_size\":\t128");
    CHECK_INT(qd_model_open(d3, be, &m, &err), QD_ESHAPE);
    CHECK_CONTAINS(err.msg, "model.layers.0.mlp.gate_proj.weight");
    CHECK_CONTAINS(err.msg, "[160, 64]");

    const char *d4 = test_path(test_tmpdir(), "bin_only");
    CHECK_OK(qd_fs_mkdir_p(d4, &err));
    CHECK_OK(qd_fs_write_atomic(test_path(d4, "pytorch_model.bin"), "x", 1, &err));
    CHECK_OK(qd_fs_write_atomic(test_path(d4, "config.json"), "{}", 2, &err));
    CHECK_INT(qd_model_open(d4, be, &m, &err), QD_EUNSUPPORTED);
    CHECK_CONTAINS(err.msg, "safetensors");

    const char *d5 = gen("bad_rope", &o);
    rewrite_config(d5, "\"hidden_act\"", "\"rope_scaling\": {\"rope_type\": \"su-made-up\", \"factor\": 8}, \"hidden_act\"");
    CHECK_INT(qd_model_open(d5, be, &m, &err), QD_EUNSUPPORTED);
    CHECK_CONTAINS(err.msg, "rope_scaling");

    /* Token ids outside the vocabulary are an error, not a wild read. */
    const char *d6 = gen("ok", &o);
    CHECK_OK(qd_model_open(d6, be, &m, &err));
    if (m) {
        int32_t ids[4] = {1, 2, 999, 3};
        float lg[4 * 128];
        CHECK_INT(qd_model_forward(m, ids, 1, 4, lg, &err), QD_EINVAL);
        CHECK_CONTAINS(err.msg, "999");
        qd_model_close(m);
    }
}

int main(void)
{
    qd_err err = {0};
    if (qd_backend_cpu_open(2, NULL, &be, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    TEST_RUN(test_llama_gqa_untied);
    TEST_RUN(test_qwen2_bias_tied);
    TEST_RUN(test_llama_head_dim_bias);
    TEST_RUN(test_mixtral_gen);
    TEST_RUN(test_opt_project);
    TEST_RUN(test_opt_post_ln_untied);
    TEST_RUN(test_causal_and_batch);
    TEST_RUN(test_dtypes_and_shards);
    TEST_RUN(test_block_hooks);
    TEST_RUN(test_errors);
    TEST_RUN(test_eval_vs_reference);
    qd_backend_close(be);
    return test_finish();
}
