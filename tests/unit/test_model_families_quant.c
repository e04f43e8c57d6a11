/* Every family quantizes to a model that still computes transformers' function (issue #16),
 * without Python. For each checkpoint under tests/data/families/ whose float forward quantd
 * accepts (test_model_families holds which ones, and that it equals transformers' logits),
 * RTN, GPTQ (act-order) and AWQ jobs run at 8 bits, group 32, through the whole pipeline
 * (calibration forwards with the family's RoPE, window and norms; AWQ's scales folded into
 * the family's norms and linears; packing; the output loaded back), and the quantized
 * model's logits on the family's ids must stay within FAMILY_Q8_TOL of transformers' float
 * logits (logits.f32), Frobenius-relative. Measured at 8 bits: 0.021-0.066 (Gemma 2/3 and
 * Phi-3, once their forwards landed: 0.006-0.076; SmolLM3, Granite, Ministral, Seed-OSS, ERNIE 4.5:
 * 0.007-0.056) on these peaked
 * tiny models (the bar leaves room for other CPUs' rounding; at 4 bits quantization alone
 * moves them by about 0.5, too coarse to tell a bug from quantization); a scale folded into
 * the wrong norm or a packing error moves them by order 1. Subtler errors (a window ignored
 * in calibration only) are for the exact check below.
 *
 * The exact check (the packed output dequantized in Python and run by transformers equals
 * quantd's forward within 1e-4) is tests/families/roundtrip.py, optional. A family quantd
 * refuses to open is listed as SKIP here; a job refused as unsupported (QD_EUNSUPPORTED) is
 * listed as REFUSED; anything else that fails is a failure. */
#include <dirent.h>
#include <math.h>

#include "pipeline_testlib.h"
#include "quant/core/log.h"

#define FAMILY_Q8_TOL 0.15
/* Mixture-of-experts families route each token to its top-k experts: an 8-bit perturbation
 * flips near-tied router choices, which moves whole rows of logits. Measured (8 bits, after
 * the MoE families landed): mixtral 0.133-0.161, qwen2_moe 0.078-0.128, qwen3_moe
 * 0.055-0.084, deepseek_v2 0.11-0.12, deepseek_v3 0.17-0.19 (layer 0 steers layer 1's grouped routing: see
 * test_pipeline_moe), glm4_moe 0.025-0.099, dots1 0.022-0.102, olmoe 0.021-0.055, minimax_m2
 * 0.106-0.142, ernie4_5_moe 0.085-0.122, qwen3_next 0.16-0.19, qwen3_5_moe 0.12-0.17, granite4_h_moe 0.07-0.09, RTN included, so this looser bar still
 * separates them from order-1 bugs. The dense Gated DeltaNet hybrid qwen3_5 measures 0.10-0.13 under
 * FAMILY_Q8_TOL: its decay (exp of -exp(A_log) softplus(a + dt_bias)) compounds the in_proj_a / in_proj_b
 * rows' error over the sequence. */
#define FAMILY_Q8_TOL_MOE 0.3
/* PhiMoE's sparsemixer gives each pick its own masked softmax, so a flipped pick moves its
 * whole weight (no softmax across the near-tied pair to soften it), and which logits the
 * mask keeps flips too: measured phimoe 0.13-0.20, phimoe_longrope 0.18-0.35 (its longer
 * mscale sharpens attention). Still apart from an order-1 bug. */
#define FAMILY_Q8_TOL_PHIMOE 0.45
/* DeepSeek-V3.2's indexer keeps 8 of up to 64 keys per query by a discrete top-k: an 8-bit
 * perturbation of q_a_proj / wq_b flips near-tied choices in every layer, on top of V3's
 * routing. Measured 0.32-0.42 (RTN, GPTQ, AWQ); transformers itself, given the same kind of
 * 8-bit group-32 round-to-nearest weights, moves 0.43 from its float logits. */
#define FAMILY_Q8_TOL_DSA 0.6

static const char *T;
static const char *tokens;

static int cmp_name(const void *a, const void *b) { return strcmp(a, b); }

/* Logits of the model in dir on ids (one sequence), or NULL with the reason in err. */
static float *forward(const char *dir, const int32_t *ids, int64_t n, int64_t *vocab, qd_err *err)
{
    qd_model *m = NULL;
    if (qd_model_open(dir, pt_be, &m, err)) return NULL;
    *vocab = qd_model_cfg(m)->vocab;
    float *lg = malloc((size_t)n * (size_t)*vocab * sizeof *lg);
    if (lg && qd_model_forward(m, ids, 1, n, lg, err)) { free(lg); lg = NULL; }
    qd_model_close(m);
    return lg;
}

static void run_family(const char *name, const char *dir, int *n_run)
{
    qd_err err = {0};
    int32_t *ids = NULL;
    size_t n_ids = 0;
    char *gold = NULL;
    size_t glen = 0;
    CHECK_OK(qd_token_file_read(test_path(dir, "ids.json"), &ids, &n_ids, &err));
    CHECK_OK(qd_fs_read_file(test_path(dir, "logits.f32"), &gold, &glen, &err));
    int64_t vocab = 0;
    float *fl = ids ? forward(dir, ids, (int64_t)n_ids, &vocab, &err) : NULL;
    if (!fl) {
        printf("%-16s SKIP     float model not supported: %s\n", name, err.msg);
        free(ids);
        free(gold);
        return;
    }
    free(fl);
    CHECK_INT(glen, n_ids * (size_t)vocab * sizeof(float));
    cJSON *root = pt_read_json(test_path(dir, "config.json"));
    /* A vision-language model's experts are its text tower's (Llama 4's text_config). */
    const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    if (!cJSON_IsObject(cfg)) cfg = root;
    const cJSON *ne = cJSON_GetObjectItemCaseSensitive(cfg, "num_local_experts");
    if (!cJSON_IsNumber(ne)) ne = cJSON_GetObjectItemCaseSensitive(cfg, "num_experts");
    if (!cJSON_IsNumber(ne)) ne = cJSON_GetObjectItemCaseSensitive(cfg, "n_routed_experts");   /* DeepSeek */
    double tol = cJSON_IsNumber(ne) && ne->valuedouble > 1 ? FAMILY_Q8_TOL_MOE : FAMILY_Q8_TOL;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(cfg, "model_type");
    if (cJSON_IsString(mt) && !strcmp(mt->valuestring, "phimoe")) tol = FAMILY_Q8_TOL_PHIMOE;
    if (cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(cfg, "index_topk"))) tol = FAMILY_Q8_TOL_DSA;
    cJSON_Delete(root);
    static const char *methods[][2] = {{"rtn", ""}, {"gptq", "\"desc_act\":true,"}, {"awq", ""}};
    for (size_t k = 0; k < 3 && glen == n_ids * (size_t)vocab * sizeof(float); k++) {
        char out[4600], extra[128];
        snprintf(out, sizeof out, "%.3000s/%.255s-%s", T, name, methods[k][0]);
        snprintf(extra, sizeof extra, "\"bits\":8,%s", methods[k][1]);
        qp_job *job = pt_job(dir, out, methods[k][0], "gptq", tokens, extra);
        CHECK(job != NULL);
        if (!job) continue;
        memset(&err, 0, sizeof err);
        int rc = qd_pipeline_run(job, pt_be, NULL, &err);
        qp_job_free(job);
        if (rc == QD_EUNSUPPORTED) {
            printf("%-16s %-5s REFUSED  %s\n", name, methods[k][0], err.msg);
            continue;
        }
        test_checks++;
        if (rc) { TEST_FAIL_("%s %s: job failed: %d %s", name, methods[k][0], rc, err.msg); continue; }
        int64_t v2 = 0;
        float *q = forward(out, ids, (int64_t)n_ids, &v2, &err);
        test_checks++;
        if (!q) { TEST_FAIL_("%s %s: output does not load or run: %s", name, methods[k][0], err.msg); continue; }
        double rel = pt_rel_err(q, (const float *)gold, (int64_t)n_ids * vocab);
        printf("%-16s %-5s rel %.4f\n", name, methods[k][0], rel);
        fflush(stdout);
        test_checks++;
        if (!(rel <= tol))
            TEST_FAIL_("%s %s: 8-bit logits rel %.4g from transformers' float logits > %g", name, methods[k][0], rel,
                       tol);
        CHECK(rel > 0);   /* quantized at all */
        (*n_run)++;
        free(q);
    }
    free(ids);
    free(gold);
}

/* This run's share of the families (argument "I/N": every N-th directory from the I-th, in
 * name order); all of them without an argument. */
static int shard_i = 0, shard_n = 1;

static void test_families_quant(void)
{
    char root[4200];
    snprintf(root, sizeof root, "%s/tests/data/families", test_source_dir());
    DIR *d = opendir(root);
    CHECK(d != NULL);
    if (!d) return;
    char names[256][256];
    size_t n_names = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n_names < sizeof names / sizeof names[0])
        if (e->d_name[0] != '.') snprintf(names[n_names++], sizeof names[0], "%s", e->d_name);
    closedir(d);
    qsort(names, n_names, sizeof names[0], cmp_name);
    int n_run = 0;
    for (size_t k = (size_t)shard_i; k < n_names; k += (size_t)shard_n) {
        char dir[4200 + 260];
        snprintf(dir, sizeof dir, "%s/%.255s", root, names[k]);
        if (!qd_fs_exists(test_path(dir, "config.json"))) continue;
        run_family(names[k], dir, &n_run);
    }
    /* More than 50 families run today: an empty run (or shard) is a broken test. */
    CHECK(n_run >= 50 / shard_n);
}

int main(int argc, char **argv)
{
    if (argc > 1 && (sscanf(argv[1], "%d/%d", &shard_i, &shard_n) != 2 || shard_n < 1 || shard_i < 0 ||
                     shard_i >= shard_n)) {
        fprintf(stderr, "usage: test_model_families_quant [I/N]\n");
        return 2;
    }
    if (pt_setup(2, 4000, 256, 7, &T, &tokens)) return 1;
    qd_log_set_level(QD_LOG_WARN);   /* 36 jobs' per-layer lines would bury the table */
    TEST_RUN(test_families_quant);
    return pt_teardown();
}
