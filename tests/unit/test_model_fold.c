/* AWQ's scale folding leaves every family's block computing the same function (issue #16):
 * on transformers' own tiny checkpoints (tests/data/families), block 0 is run on random
 * hidden states, random scales in [0.5, 2] are folded into each input group through
 * qd_block_fold_scales — Gemma's (1 + w) norms, Phi-3's fused qkv_proj / gate_up_proj
 * rows, grouped-query o_proj — and the block's output must not move (relative 1e-5), while
 * the weights did. Folding the scales into Gemma's stored w instead of its multiplier
 * (1 + w), the error other tools make, is shown to change the output. */
#include <math.h>
#include <stdlib.h>

#include "quant/model/block.h"
#include "quant/model/model.h"
#include "pipeline_testlib.h"
#include "test_util.h"

static qd_backend *be;

static double rel_diff(const float *a, const float *b, size_t n)
{
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) { d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]); r += (double)b[i] * b[i]; }
    return sqrt(d / r);
}

/* Runs block 0 of `bw` on x (seq tokens, one sequence) into y. */
static int run(qd_model *m, qd_block_weights *bw, const float *x, float *y, int64_t seq)
{
    qd_err err = {0};
    int rc = qd_block_forward(m, bw, x, y, 1, seq, NULL, NULL, &err);
    if (rc) fprintf(stderr, "forward: %s\n", err.msg);
    return rc;
}

/* Scales for group g: random, tied within each KV channel class where the group's input
 * comes from fewer channels (grouped-query o_proj). */
static void scales_for(const qd_model *m, const qd_input_group *G, test_rng *rng, float *s)
{
    const qd_model_config *c = qd_model_cfg(m);
    int64_t rep = G->prev_kind == QD_PREV_LINEAR && G->prev_rows != G->k ? c->n_heads / c->n_kv_heads : 1;
    for (int64_t ch = 0; ch < G->k; ch++) {
        int64_t h = ch / c->head_dim, d = ch % c->head_dim;
        int64_t first = rep > 1 ? (h / rep) * rep * c->head_dim + d : ch;
        s[ch] = first == ch ? 0.5f + 1.5f * test_rng_uniform(rng) : s[first];
    }
}

static void check_family_block(const char *name, int block, int groups_expected)
{
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/%s", pt_families_dir(), name);
    qd_err err = {0};
    qd_model *m = NULL;
    CHECK_OK(qd_model_open(dir, be, &m, &err));
    if (!m) { fprintf(stderr, "%s: %s\n", name, err.msg); return; }
    const qd_model_config *c = qd_model_cfg(m);
    int64_t seq = 40, hid = c->hidden;   /* longer than the tiny models' window of 16 */
    test_rng rng;
    test_rng_seed(&rng, 7);
    float *x = malloc((size_t)(seq * hid) * sizeof *x), *y0 = malloc((size_t)(seq * hid) * sizeof *y0);
    float *y1 = malloc((size_t)(seq * hid) * sizeof *y1), *s = malloc((size_t)hid * 8 * sizeof *s);
    test_fill_normal(&rng, x, (size_t)(seq * hid), 1.0f);
    qd_block_weights *bw = NULL;
    CHECK_OK(qd_block_load(m, block, &bw, &err));
    if (!bw || run(m, bw, x, y0, seq)) goto out;
    int folded = 0;
    for (int g = 0; g < qd_model_n_groups(m); g++) {
        const qd_input_group *G = qd_model_group(m, g);
        if (G->prev_kind == QD_PREV_NONE || !qd_model_block_has_linear(m, block, G->linears[0])) continue;
        scales_for(m, G, &rng, s);
        CHECK_OK(qd_block_fold_scales(m, bw, g, s, &err));
        folded++;
    }
    if (qd_model_block_is_moe(m, block)) {
        /* The experts' shared input: one scale for every expert's gate/up, the router (and
         * the shared expert's gate) into post_attention_layernorm. */
        for (int64_t i = 0; i < hid; i++) s[i] = 0.5f + 1.5f * test_rng_uniform(&rng);
        CHECK_OK(qd_block_fold_moe_input(m, bw, s, &err));
        folded++;
    } else {
        CHECK_INT(qd_block_fold_moe_input(m, bw, s, &err), QD_EUNSUPPORTED);
    }
    CHECK_INT(folded, groups_expected);
    float w0 = 0, w1 = 0;
    qd_block_weights *orig = NULL;
    CHECK_OK(qd_block_load(m, block, &orig, &err));
    /* The norm the first norm-folded group folds into: input_layernorm, except where nothing
     * folds there (Falcon-H1: it feeds two groups and takes neither's scales, so its
     * pre_ff_layernorm; DeepSeek-V3.2: its indexer's float wk reads that norm too). */
    int ni = 0, norm_folds = 0;
    for (int g = 0; g < qd_model_n_groups(m) && !norm_folds; g++) {
        const qd_input_group *G = qd_model_group(m, g);
        if (G->prev_kind == QD_PREV_NORM && qd_model_block_has_linear(m, block, G->linears[0])) {
            ni = G->prev_index;
            norm_folds = 1;
        }
    }
    if (!norm_folds && qd_model_block_is_moe(m, block)) ni = 1;   /* the experts' input: post_attention_layernorm */
    if (orig && qd_model_norm_name(m, ni)) {
        /* The fold moved the weights: that norm's multipliers differ. */
        float *a = malloc((size_t)hid * sizeof *a), *b = malloc((size_t)hid * sizeof *b);
        CHECK_OK(qd_block_norm_get(m, orig, ni, a, NULL, &err));
        CHECK_OK(qd_block_norm_get(m, bw, ni, b, NULL, &err));
        w0 = a[0];
        w1 = b[0];
        free(a);
        free(b);
    } else if (orig) {
        /* No norm before attention (OLMo 2, EXAONE 4): o_proj's scales moved v_proj's rows. */
        const qd_input_group *G = qd_model_group(m, qd_model_attn_out_group(m));
        const qd_linear_info *L = qd_model_linear(m, G->prev_index);
        float *a = malloc((size_t)(L->n * L->k) * sizeof *a), *b = malloc((size_t)(L->n * L->k) * sizeof *b);
        CHECK_OK(qd_block_linear_get(m, orig, G->prev_index, a, NULL, &err));
        CHECK_OK(qd_block_linear_get(m, bw, G->prev_index, b, NULL, &err));
        w0 = a[0];
        w1 = b[0];
        free(a);
        free(b);
    }
    CHECK(w0 != w1);
    if (run(m, bw, x, y1, seq) == 0) {
        double d = rel_diff(y1, y0, (size_t)(seq * hid));
        if (!(d < 1e-5)) TEST_FAIL_("%s: the folded block's output moved by %.3g", name, d);
        test_checks++;
        printf("%-8s block %d: %d groups folded, output moved by %.2e\n", name, block, folded, d);
    }
    /* Gemma: dividing the stored w (multiplier - 1) instead of the multiplier is wrong. */
    if (orig && qd_model_norm_offset(m) != 0.0f) {
        /* The group behind input_layernorm this block holds (a hybrid's recurrent layer has
         * its own projections there, not the attention's). */
        const qd_input_group *G = qd_model_group(m, 0);
        for (int g = 0; g < qd_model_n_groups(m); g++) {
            const qd_input_group *H = qd_model_group(m, g);
            if (H->prev_kind == QD_PREV_NORM && H->prev_index == 0 && qd_model_block_has_linear(m, block, H->linears[0])) {
                G = H;
                break;
            }
        }
        float *nw = malloc((size_t)hid * sizeof *nw);
        scales_for(m, G, &rng, s);
        CHECK_OK(qd_block_norm_get(m, orig, 0, nw, NULL, &err));
        for (int64_t i = 0; i < hid; i++) nw[i] = (nw[i] - 1.0f) / s[i] + 1.0f;
        CHECK_OK(qd_block_norm_set(m, orig, 0, nw, NULL, &err));
        CHECK_OK(be->ops->scale_cols(be, orig->w[G->linears[0]], qd_model_linear(m, G->linears[0])->n, G->k, s, 0));
        for (int j = 1; j < G->n_linears; j++)
            CHECK_OK(be->ops->scale_cols(be, orig->w[G->linears[j]], qd_model_linear(m, G->linears[j])->n, G->k, s, 0));
        if (run(m, orig, x, y1, seq) == 0) CHECK(rel_diff(y1, y0, (size_t)(seq * hid)) > 1e-2);
        free(nw);
    }
    qd_block_free(m, orig);
out:
    qd_block_free(m, bw);
    qd_model_close(m);
    free(x); free(y0); free(y1); free(s);
}

static void check_family(const char *name, int groups_expected) { check_family_block(name, 0, groups_expected); }

/* Falcon-H1: input_layernorm feeds q/k/v and mamba.in_proj, two groups (their inputs are the
 * norm's output times two different multipliers). Folding q/k/v's scales into the norm
 * alone — what a per-group fold would do — moves the block's output (mamba.in_proj reads the
 * divided norm too), which is why neither group folds (QD_PREV_NONE, refused below). */
static void check_falcon_h1_input_norm(void)
{
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/falcon_h1", pt_families_dir());
    qd_err err = {0};
    qd_model *m = NULL;
    CHECK_OK(qd_model_open(dir, be, &m, &err));
    if (!m) return;
    int64_t seq = 40, hid = qd_model_cfg(m)->hidden;
    test_rng rng;
    test_rng_seed(&rng, 11);
    float *x = malloc((size_t)(seq * hid) * sizeof *x), *y0 = malloc((size_t)(seq * hid) * sizeof *y0);
    float *y1 = malloc((size_t)(seq * hid) * sizeof *y1), *s = malloc((size_t)hid * sizeof *s);
    float *nw = malloc((size_t)hid * sizeof *nw);
    test_fill_normal(&rng, x, (size_t)(seq * hid), 1.0f);
    qd_block_weights *bw = NULL;
    CHECK_OK(qd_block_load(m, 0, &bw, &err));
    if (bw && run(m, bw, x, y0, seq) == 0) {
        for (int g = 0; g < qd_model_n_groups(m); g++) {
            const qd_input_group *G = qd_model_group(m, g);
            if (G->prev_kind == QD_PREV_NONE) CHECK_INT(qd_block_fold_scales(m, bw, g, s, &err), QD_EUNSUPPORTED);
        }
        const qd_input_group *G = qd_model_group(m, 0);   /* attn_in: q, k, v */
        for (int64_t i = 0; i < hid; i++) s[i] = 0.5f + 1.5f * test_rng_uniform(&rng);
        CHECK_OK(qd_block_norm_get(m, bw, 0, nw, NULL, &err));
        for (int64_t i = 0; i < hid; i++) nw[i] /= s[i];
        CHECK_OK(qd_block_norm_set(m, bw, 0, nw, NULL, &err));
        for (int j = 0; j < G->n_linears; j++)
            CHECK_OK(be->ops->scale_cols(be, bw->w[G->linears[j]], qd_model_linear(m, G->linears[j])->n, G->k, s, 0));
        if (run(m, bw, x, y1, seq) == 0) {
            double d = rel_diff(y1, y0, (size_t)(seq * hid));
            CHECK(d > 1e-2);
            printf("falcon_h1: q/k/v's scales folded into input_layernorm alone move the output by %.3g\n", d);
        }
    }
    qd_block_free(m, bw);
    qd_model_close(m);
    free(x); free(y0); free(y1); free(s); free(nw);
}

static void test_fold(void)
{
    check_family("llama", 4);
    check_family("qwen2", 4);            /* q/k/v biases */
    check_family("qwen3", 4);
    check_family("mistral_window", 4);
    check_family("gemma2", 4);           /* (1 + w), pre_feedforward_layernorm */
    check_family("gemma3", 4);
    check_family("phi3", 4);             /* v rows of qkv_proj, up rows of gate_up_proj */
    /* Post-norm blocks: q/k/v and gate/up read the residual stream (nothing to fold into),
     * o_proj folds into v_proj, down_proj into up_proj (GLM-4: the up rows of gate_up_proj,
     * and its pre-norms as Llama's). */
    check_family("olmo2", 2);
    check_family("olmo3", 2);
    check_family("exaone4", 2);
    check_family("glm4", 4);
    /* Granite's residual_multiplier scales o_proj's and down_proj's outputs: folding their
     * inputs into v_proj's and up_proj's rows stays exact. ERNIE's RoPE turns q and k
     * only, Seed-OSS's biases are divided with their rows. */
    check_family("smollm3", 4);
    check_family_block("smollm3", 1, 4);   /* the NoPE, windowed layer */
    check_family("granite", 4);
    check_family("ministral", 4);
    check_family("seed_oss", 4);
    check_family("ernie4_5", 4);
    check_family("apertus", 3);          /* down_proj's input follows xIELU: not scaled */
    check_family("hunyuan_dense", 4);    /* q/k norms after RoPE leave v_proj's fold alone */
    check_family("ministral3", 4);
    check_family("qwen2_vl", 4);         /* vision-language text towers: their own family's folds */
    check_family("qwen2_5_vl", 4);
    check_family("qwen3_vl", 4);
    check_family("gemma3_vl", 4);
    check_family("mistral3", 4);
    /* LayerNorm families: weight and bias divided. StarCoder2: input_layernorm, v_proj,
     * post_attention_layernorm (c_proj follows GELU: no fold). Phi's parallel block: q/k/v and
     * fc1 one group into input_layernorm, dense into v_proj. GPT-NeoX: the two norms only
     * (dense's v rows are spread over query_key_value's heads). */
    check_family("starcoder2", 3);
    check_family("phi2", 2);
    check_family("gpt_neox", 2);
    check_family("gpt_neox_seq", 2);
    /* Cohere2's parallel block: q/k/v and gate/up one group into the bias-less LayerNorm's
     * weight, o_proj into v_proj, down_proj into up_proj. */
    check_family("cohere2", 3);
    /* MoE: each expert's w2 into its own w3, and (+1) the experts' shared input into
     * post_attention_layernorm; Qwen2-MoE also the shared expert's down into its up. */
    check_family("mixtral", 2 + 8 + 1);
    check_family("qwen2_moe", 2 + 8 + 1 + 1);
    check_family("qwen3_moe", 2 + 8 + 1);
    /* DeepSeek: the latent attention folds only into input_layernorm (q_a_proj and
     * kv_a_proj_with_mqa); a dense layer's MLP as Llama's, a MoE layer's experts as above. */
    check_family_block("deepseek_v3", 0, 3);
    check_family_block("deepseek_v3", 1, 1 + 8 + 1 + 1);
    /* DeepSeek-V3.2: the indexer's float wk and weights_proj read input_layernorm's output
     * too, so nothing folds into that norm; the MLPs as V3's. */
    check_family_block("deepseek_v32", 0, 2);
    check_family_block("deepseek_v32", 1, 8 + 1 + 1);
    check_family_block("deepseek_v2", 0, 3);
    check_family_block("deepseek_v2", 1, 1 + 8 + 1 + 1);
    /* GLM-4.5 and dots.llm1: Llama attention; a dense layer as Llama's, a MoE layer's
     * experts and shared expert as DeepSeek's. OLMoE and MiniMax-M2 (q/k norms over the
     * whole projections, which the scales do not reach) as Qwen3-MoE. */
    check_family_block("glm4_moe", 0, 4);
    check_family_block("glm4_moe", 1, 2 + 8 + 1 + 1);
    check_family_block("dots1", 0, 4);
    check_family_block("dots1", 1, 2 + 8 + 1 + 1);
    check_family("olmoe", 2 + 8 + 1);
    check_family("minimax_m2", 2 + 8 + 1);
    check_family("phimoe", 2 + 8 + 1);   /* Mixtral's, LayerNorm weight and bias divided */
    check_family("phimoe_longrope", 2 + 8 + 1);
    /* ERNIE 4.5 MoE: dense, MoE, dense. */
    check_family_block("ernie4_5_moe", 0, 4);
    check_family_block("ernie4_5_moe", 1, 2 + 8 + 1 + 1);
    check_family_block("ernie4_5_moe", 2, 4);
    /* Hybrids: LFM2's short convolution folds in_proj into operator_norm and out_proj into
     * C's rows of in_proj (its second third); Granite's Mamba-2 in_proj into input_layernorm,
     * out_proj (behind the gated norm) not at all. Block 1 attends. */
    check_family_block("lfm2", 0, 4);
    check_family_block("lfm2", 1, 4);
    check_family_block("granite4_h", 0, 3);
    check_family_block("granite4_h", 1, 4);
    /* Granite-4 MoE: as granite4_h, but shared_mlp's input_linear reads the norm with the
     * router and the experts (no fold of its own); the experts' shared input folds into
     * post_attention_layernorm with the router's and shared_mlp.input_linear's columns (+1),
     * each expert's down into its up (8), shared_mlp's output_linear into its up rows. */
    check_family_block("granite4_h_moe", 0, 1 + 1 + 8 + 1);
    check_family_block("granite4_h_moe", 1, 2 + 1 + 8 + 1);
    /* Qwen3-Next, Qwen3.5: the Gated DeltaNet's projections and the gated attention's fold
     * into input_layernorm ((1 + w)); neither out_proj (behind the gated norm) nor o_proj
     * (behind the sigmoid gate) folds. Block 0 is a DeltaNet layer with experts, 1 gated
     * attention with experts, 2 (Qwen3-Next's mlp_only_layers) a DeltaNet layer with a dense
     * MLP. */
    check_family_block("qwen3_next", 0, 1 + 8 + 1 + 1);
    check_family_block("qwen3_next", 1, 1 + 8 + 1 + 1);
    check_family_block("qwen3_next", 2, 1 + 2);
    check_family_block("qwen3_5", 0, 1 + 2);
    check_family_block("qwen3_5", 1, 1 + 2);
    check_family_block("qwen3_5_moe", 0, 1 + 8 + 1 + 1);
    /* gpt-oss: input_layernorm, v_proj's rows and bias (sinks or not, the output is linear in
     * v), and the experts' shared input with the router's columns (its bias unchanged); the
     * experts' down_proj reads the clamped (up + 1) * glu(gate): no fold. Both layer kinds
     * (block 0 slides, block 1 is full). */
    check_family_block("gpt_oss", 0, 2 + 1);
    check_family_block("gpt_oss", 1, 2 + 1);
    /* Llama 4: block 0 dense (RoPE, chunks of 16 over the 40 tokens), 1 MoE without RoPE (the
     * query temperature from position 7), 2 MoE with RoPE. The experts' input is scaled by
     * the router's sigmoid after the norm, so the shared-input scale still folds (the router's
     * columns take it, its logits unchanged); each expert's and the shared expert's down_proj
     * into its own up_proj's rows. */
    check_family_block("llama4", 0, 4);
    check_family_block("llama4", 1, 2 + 8 + 1 + 1);
    check_family_block("llama4", 2, 2 + 8 + 1 + 1);
    check_family_block("llama4_vl", 0, 4);   /* the multimodal checkpoint's text tower */
    check_family_block("llama4_vl", 1, 2 + 8 + 1 + 1);
    /* Falcon-H1: o_proj into v_proj (attention_in_multiplier scales v before it), the MLP
     * into pre_ff_layernorm and up_proj (its gate multiplier acts after gate_proj, its down
     * multiplier after down_proj); q/k/v and mamba.in_proj share input_layernorm, and
     * mamba.out_proj reads the gated scan: none of those folds. */
    check_family_block("falcon_h1", 0, 3);
    check_family_block("falcon_h1", 2, 3);
    check_falcon_h1_input_norm();
}

int main(void)
{
    qd_err err = {0};
    if (qd_backend_cpu_open(1, NULL, &be, &err)) { fprintf(stderr, "cpu backend: %s\n", err.msg); return 1; }
    TEST_RUN(test_fold);
    qd_backend_close(be);
    return test_finish();
}
