/* Quantizing each family end to end (issue #16): GPTQ, AWQ and AWQ+GPTQ jobs on
 * transformers' tiny checkpoints (tests/data/families) write an output whose linears keep
 * the checkpoint's names (Phi-3's fused qkv_proj and gate_up_proj stay single linears),
 * whose AWQ-folded norms are stored the way the family's loader reads them (Gemma: w, not
 * the multiplier 1 + w), and whose logits, read back through the loader, stay close to the
 * float model's. At 8 bits the quantization error is small, so a wrong fold or a wrong
 * stored norm (errors of order one) cannot hide under the tolerance. */
#include "pipeline_testlib.h"

/* Falcon-H1 at 8 bits: about 3x the errors measured (0.034-0.054). */
#define FALCON_TOL8 0.16

static const char *T;
static const char *tokens;

static void run_family(const char *family, const char *method, const char *format, int bits, const char *linear,
                       double tol)
{
    /* GPT-NeoX keeps its blocks under gpt_neox.layers. */
    const char *prefix = !strncmp(family, "gpt_neox", 8) ? "gpt_neox.layers.1." : "model.layers.1.";
    char model[4200], out[4400], ex[128], name[256];
    snprintf(model, sizeof model, "%s/%s", pt_families_dir(), family);
    snprintf(out, sizeof out, "%s/%s-%s-%s-%d", T, family, method, format, bits);
    snprintf(ex, sizeof ex, "\"bits\":%d,", bits);
    qp_job *job = pt_run_job(family, model, out, method, format, tokens, ex);
    if (!job) return;
    qd_err err = {0};
    /* The checkpoint's own linear names, packed. */
    st_model *om = NULL;
    CHECK_OK(st_model_open(out, &om, &err));
    snprintf(name, sizeof name, "%s%s.qweight", prefix, linear);
    CHECK(om && st_model_find(om, name) != NULL);
    snprintf(name, sizeof name, "%s%s.weight", prefix, linear);
    CHECK(om && st_model_find(om, name) == NULL);
    st_model_close(om);
    /* config.json keeps the source's number literals: 10.0 stays 10.0 (transformers 5
     * refuses an int for a float field such as final_logit_softcapping). */
    char *src = pt_read(test_path(model, "config.json"), NULL), *dst = pt_read(test_path(out, "config.json"), NULL);
    CHECK(src && dst);
    for (const char *q = src; src && dst && *q; q++) {
        if (*q != ':') continue;
        const char *v = q + 1;
        while (*v == ' ') v++;
        size_t len = strspn(v, "0123456789+-.eE");
        if (len && memchr(v, '.', len)) {
            char lit[64];
            snprintf(lit, sizeof lit, "%.*s", (int)(len < 63 ? len : 63), v);
            if (!strstr(dst, lit)) TEST_FAIL_("%s: output config.json lost the literal %s", family, lit);
            test_checks++;
        }
    }
    free(src);
    free(dst);
    double rel = pt_logits_rel(model, out);
    CHECK(rel >= 0);
    if (rel >= 0) {
        printf("%-8s %-8s %-9s w%d  logits rel error %.4f\n", family, method, format, bits, rel);
        if (!(rel < tol)) TEST_FAIL_("%s %s/%s w%d: logits rel error %.4g >= %.4g", family, method, format, bits, rel, tol);
        test_checks++;
    }
    qp_job_free(job);
}

static void test_families(void)
{
    /* w8 tolerances are about 3x the errors measured (Gemma's checkpoints are the least
     * peaked: 0.007-0.009, Granite's residual_multiplier 0.22 keeps its blocks' share small:
     * 0.007-0.008); storing Gemma's folded multiplier instead of w gives 0.07-0.26. */
    static const struct { const char *family, *linear; double tol8; } fams[] = {
        {"gemma2", "mlp.down_proj", 0.03}, {"gemma3", "self_attn.q_proj", 0.03}, {"phi3", "self_attn.qkv_proj", 0.1},
        {"phi3_longrope", "mlp.gate_up_proj", 0.15}, {"qwen3", "self_attn.k_proj", 0.06}, {"mistral_window", "mlp.up_proj", 0.1},
        /* Qwen3.5: layer 1 is gated attention (q_proj with the output gate), layer 0 a Gated DeltaNet */
        {"qwen3_5", "self_attn.q_proj", 0.1},
        /* Post-norm blocks: AWQ scales only o_proj and down_proj (q/k/v, gate/up read the stream). */
        {"olmo2", "self_attn.k_proj", 0.06}, {"olmo3", "mlp.up_proj", 0.06}, {"exaone4", "self_attn.v_proj", 0.06},
        {"glm4", "mlp.gate_up_proj", 0.1},
        /* NoPE and windowed layer 1; Granite's multipliers (AWQ folds across residual_multiplier);
         * per-layer windows; every bias; interleaved RoPE. */
        {"smollm3", "self_attn.q_proj", 0.12}, {"granite", "mlp.down_proj", 0.03}, {"ministral", "mlp.gate_proj", 0.1},
        {"seed_oss", "self_attn.o_proj", 0.13}, {"ernie4_5", "self_attn.k_proj", 0.13}, {"apertus", "mlp.up_proj", 0.04},
        {"hunyuan_dense", "self_attn.v_proj", 0.07}, {"ministral3", "mlp.down_proj", 0.18},
    };
    for (size_t i = 0; i < sizeof fams / sizeof fams[0]; i++) {
        run_family(fams[i].family, "rtn", "gptq", 8, fams[i].linear, fams[i].tol8);
        run_family(fams[i].family, "gptq", "gptq", 8, fams[i].linear, fams[i].tol8);
        run_family(fams[i].family, "awq", "gptq", 8, fams[i].linear, fams[i].tol8);
        run_family(fams[i].family, "awq+gptq", "awq_gemm", 4, fams[i].linear, 0.8);
    }
}

/* The hybrids: layer 0 is a recurrent layer whose in_proj and out_proj are quantized linears
 * (as vLLM loads them) and whose convolution and SSM parameters stay in float; layer 1 attends.
 * Every method, at 8 bits (AWQ+GPTQ at 4); tolerances about 3x the errors measured (Granite's
 * logits, divided by logits_scaling 4, are the least peaked: 0.05-0.06 at 8 bits). */
static void test_hybrids(void)
{
    static const struct { const char *family, *linear, *mixer, *const floats[4]; double tol8; } fams[] = {
        {"lfm2", "self_attn.out_proj", "conv", {"conv.conv.weight", NULL}, 0.1},
        {"granite4_h", "self_attn.o_proj", "mamba",
         {"mamba.conv1d.weight", "mamba.A_log", "mamba.dt_bias", "mamba.norm.weight"}, 0.18},
    };
    static const char *const methods[][2] = {{"rtn", "gptq"}, {"gptq", "gptq"}, {"awq", "gptq"}, {"awq+gptq", "awq_gemm"}};
    for (size_t i = 0; i < sizeof fams / sizeof fams[0]; i++)
        for (size_t j = 0; j < sizeof methods / sizeof methods[0]; j++) {
            int bits = j == 3 ? 4 : 8;
            run_family(fams[i].family, methods[j][0], methods[j][1], bits, fams[i].linear, j == 3 ? 0.8 : fams[i].tol8);
            char out[4400], name[256];
            snprintf(out, sizeof out, "%s/%s-%s-%s-%d", T, fams[i].family, methods[j][0], methods[j][1], bits);
            qd_err err = {0};
            st_model *om = NULL;
            CHECK_OK(st_model_open(out, &om, &err));
            if (!om) continue;
            for (int k = 0; k < 2; k++) {
                snprintf(name, sizeof name, "model.layers.0.%s.%s.qweight", fams[i].mixer, k ? "out_proj" : "in_proj");
                if (!st_model_find(om, name)) TEST_FAIL_("%s %s: %s is not packed", fams[i].family, methods[j][0], name);
                else test_checks++;
            }
            for (int k = 0; k < 4 && fams[i].floats[k]; k++) {
                snprintf(name, sizeof name, "model.layers.0.%s", fams[i].floats[k]);
                const st_tensor *t = st_model_find(om, name);
                if (!t || (t->dtype != QD_DTYPE_BF16 && t->dtype != QD_DTYPE_F32))
                    TEST_FAIL_("%s %s: %s is not kept in float", fams[i].family, methods[j][0], name);
                else test_checks++;
            }
            /* An attention layer has no mixer, a recurrent one no attention. */
            snprintf(name, sizeof name, "model.layers.1.%s.in_proj.qweight", fams[i].mixer);
            CHECK(st_model_find(om, name) == NULL);
            snprintf(name, sizeof name, "model.layers.0.%s.qweight", fams[i].linear);
            CHECK(st_model_find(om, name) == NULL);
            st_model_close(om);
        }
}

/* Falcon-H1: attention and Mamba-2 in every layer, run whole by the pipeline (both read
 * input_layernorm's output, each times its own multiplier). Every method; in both layers
 * q/k/v/o, the mixer's in_proj and out_proj and the MLP are packed (vLLM's falcon_h1.py
 * builds them with the quant_config), the convolution, A_log, D and dt_bias stay float, and
 * there is no gated norm (mamba_rms_norm false). */
static void test_falcon_h1(void)
{
    static const char *const methods[][2] = {{"rtn", "gptq"}, {"gptq", "gptq"}, {"awq", "gptq"}, {"awq+gptq", "awq_gemm"}};
    static const char *const packed[] = {"self_attn.q_proj", "self_attn.o_proj", "mamba.in_proj", "mamba.out_proj",
                                         "feed_forward.gate_proj", "feed_forward.down_proj"};
    static const char *const floats[] = {"mamba.conv1d.weight", "mamba.conv1d.bias", "mamba.A_log", "mamba.D", "mamba.dt_bias"};
    for (size_t j = 0; j < sizeof methods / sizeof methods[0]; j++) {
        int bits = j == 3 ? 4 : 8;
        run_family("falcon_h1", methods[j][0], methods[j][1], bits, "mamba.in_proj", j == 3 ? 0.8 : FALCON_TOL8);
        char out[4400], name[256];
        snprintf(out, sizeof out, "%s/falcon_h1-%s-%s-%d", T, methods[j][0], methods[j][1], bits);
        qd_err err = {0};
        st_model *om = NULL;
        CHECK_OK(st_model_open(out, &om, &err));
        if (!om) continue;
        for (int layer = 0; layer < 3; layer++) {
            for (size_t k = 0; k < sizeof packed / sizeof packed[0]; k++) {
                snprintf(name, sizeof name, "model.layers.%d.%s.qweight", layer, packed[k]);
                if (!st_model_find(om, name)) TEST_FAIL_("falcon_h1 %s: %s is not packed", methods[j][0], name);
                else test_checks++;
            }
            for (size_t k = 0; k < sizeof floats / sizeof floats[0]; k++) {
                snprintf(name, sizeof name, "model.layers.%d.%s", layer, floats[k]);
                const st_tensor *t = st_model_find(om, name);
                if (!t || (t->dtype != QD_DTYPE_BF16 && t->dtype != QD_DTYPE_F32))
                    TEST_FAIL_("falcon_h1 %s: %s is not kept in float", methods[j][0], name);
                else test_checks++;
            }
            snprintf(name, sizeof name, "model.layers.%d.mamba.norm.weight", layer);
            CHECK(st_model_find(om, name) == NULL);
        }
        st_model_close(om);
    }
}

/* The LayerNorm families with a plain MLP, every method: StarCoder2 (LayerNorm folds with
 * bias), Phi's parallel block (q/k/v and fc1 one input group, run whole by the pipeline),
 * GPT-NeoX's per-head query_key_value, with and without the parallel residual; and Cohere2's
 * parallel block with SwiGLU (five linears in one input group). w8 errors measured
 * 0.014-0.023 (RTN the largest); the bars are about 3x. */
static void test_plain_mlp_families(void)
{
    static const struct { const char *family, *linear; double tol8; } fams[] = {
        {"starcoder2", "mlp.c_fc", 0.06}, {"phi2", "mlp.fc1", 0.06}, {"gpt_neox", "attention.query_key_value", 0.06},
        {"gpt_neox_seq", "mlp.dense_4h_to_h", 0.07}, {"cohere2", "mlp.up_proj", 0.06},
    };
    for (size_t i = 0; i < sizeof fams / sizeof fams[0]; i++) {
        run_family(fams[i].family, "rtn", "gptq", 8, fams[i].linear, fams[i].tol8);
        run_family(fams[i].family, "gptq", "gptq", 8, fams[i].linear, fams[i].tol8);
        run_family(fams[i].family, "awq", "gptq", 8, fams[i].linear, fams[i].tol8);
        run_family(fams[i].family, "awq+gptq", "awq_gemm", 4, fams[i].linear, 0.8);
    }
}

/* Vision-language models: the text tower is quantized under its own names, every other
 * tensor (vision tower, projector; Qwen-VL's 5-dimensional Conv3d) is in the output with the
 * source's dtype, shape and bytes, and the quantization config declares those modules in
 * float as the format's loaders read it. */
static void run_vlm(const char *family, const char *text_prefix, const char *root, const char *method,
                    const char *format, int bits, double tol)
{
    char model[4200], out[4400], ex[128], name[256];
    snprintf(model, sizeof model, "%s/%s", pt_families_dir(), family);
    snprintf(out, sizeof out, "%s/%s-%s-%s-%d", T, family, method, format, bits);
    snprintf(ex, sizeof ex, "\"bits\":%d,", bits);
    qp_job *job = pt_run_job(family, model, out, method, format, strcmp(method, "rtn") ? tokens : NULL, ex);
    if (!job) return;
    qd_err err = {0};
    st_model *om = NULL, *sm = NULL;
    CHECK_OK(st_model_open(out, &om, &err));
    CHECK_OK(st_model_open(model, &sm, &err));
    if (om && sm) {
        int ct = !strcmp(format, "compressed-tensors");
        snprintf(name, sizeof name, "%slayers.1.self_attn.q_proj.%s", text_prefix, ct ? "weight_packed" : "qweight");
        CHECK(st_model_find(om, name) != NULL);
        size_t n_same = 0;
        for (size_t i = 0; i < st_model_count(sm); i++) {
            const st_tensor *a = st_model_tensor(sm, i);
            if (!strncmp(a->name, text_prefix, strlen(text_prefix)) || strstr(a->name, "lm_head.")) continue;
            const st_tensor *b = st_model_find(om, a->name);
            int same = b && a->dtype == b->dtype && a->ndim == b->ndim && a->numel == b->numel &&
                       !memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim) &&
                       !memcmp(a->data, b->data, a->numel * qd_dtype_size(a->dtype));
            if (!same) TEST_FAIL_("%s %s: '%s' is not copied unchanged", family, method, a->name);
            test_checks++;
            n_same += same;
        }
        CHECK(n_same > 0);
    }
    st_model_close(om);
    st_model_close(sm);
    /* The float modules as the format declares them. */
    cJSON *cfg = pt_read_json(test_path(out, "config.json"));
    char *q = cfg ? cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(cfg, "quantization_config")) : NULL;
    CHECK(q != NULL);
    if (q) {
        char want[160];
        if (!strcmp(format, "compressed-tensors")) snprintf(want, sizeof want, "\"re:(model\\\\.)?%s\\\\..*\"", root);
        else if (!strcmp(format, "awq_gemm")) snprintf(want, sizeof want, "\"%s\",\"model.%s\"", root, root);
        else snprintf(want, sizeof want, "\"-:(model\\\\.)?%s\\\\..*\":{}", root);
        CHECK_CONTAINS(q, want);
    }
    free(q);
    cJSON_Delete(cfg);
    double rel = pt_logits_rel(model, out);
    CHECK(rel >= 0);
    if (rel >= 0) {
        printf("%-10s %-8s %-18s w%d  logits rel error %.4f\n", family, method, format, bits, rel);
        if (!(rel < tol)) TEST_FAIL_("%s %s/%s w%d: logits rel error %.4g >= %.4g", family, method, format, bits, rel, tol);
        test_checks++;
    }
    qp_job_free(job);
}

static void test_vlm(void)
{
    /* tol8: the 8-bit bound; Llama 4's top-1 routing flips on near ties move its logits by
     * about 0.1 (measured: RTN 0.097, GPTQ 0.147, AWQ+GPTQ 0.093; AWQ at 4 bits 0.509), as its
     * text-only model's in test_pipeline_moe, bounded at 0.2. */
    static const struct { const char *family, *prefix, *root; double tol8; } fams[] = {
        {"qwen2_vl", "model.", "visual", 0.1},                            /* the Hub's layout, as transformers 5 saves it */
        {"qwen2_5_vl", "model.", "visual", 0.1},                          /* likewise */
        {"qwen3_vl", "model.language_model.", "visual", 0.1},
        {"gemma3_vl", "language_model.model.", "vision_tower", 0.1},
        {"mistral3", "language_model.model.", "multi_modal_projector", 0.1},
        {"llama4_vl", "language_model.model.", "vision_model", 0.2},
    };
    for (size_t i = 0; i < sizeof fams / sizeof fams[0]; i++) {
        run_vlm(fams[i].family, fams[i].prefix, fams[i].root, "rtn", "compressed-tensors", 8, fams[i].tol8);
        run_vlm(fams[i].family, fams[i].prefix, fams[i].root, "gptq", "gptq", 8, fams[i].tol8);
        run_vlm(fams[i].family, fams[i].prefix, fams[i].root, "awq", "awq_gemm", 4, 0.8);   /* awq_gemm is 4-bit */
        run_vlm(fams[i].family, fams[i].prefix, fams[i].root, "awq+gptq", "gptq_v2", 8, fams[i].tol8);
    }
}

int main(void)
{
    if (pt_setup(2, 4000, 256, 3, &T, &tokens)) return 1;
    TEST_RUN(test_families);
    TEST_RUN(test_hybrids);
    TEST_RUN(test_falcon_h1);
    TEST_RUN(test_plain_mlp_families);
    TEST_RUN(test_vlm);
    return pt_teardown();
}
