/* Forward parity with transformers, family by family (issue #16). Every directory under
 * tests/data/families/ is a tiny random checkpoint written by transformers' save_pretrained
 * together with transformers' own float32 eager logits on fixed ids (made by
 * tests/families/make_goldens.py; regenerate with `bash tests/families/run.sh BUILD`). This
 * test opens each one the way `quantctl logits` does (CPU backend, qd_model_open, one
 * forward over all ids at positions 0..n-1) and holds the result to the table below:
 *
 *   MATCH    max|ours - transformers| / max|transformers| <= 1e-4 over all [n, vocab] logits
 *   REFUSED  qd_model_open or the forward fails, with a message containing `needle`
 *   WRONG    quantd accepts the checkpoint and computes different logits: the silent wrong
 *            answer the issue is about. Printed loudly, and not a failure yet, so the table
 *            says what is true today; the entry flips to MATCH (or REFUSED) with the fix.
 *
 * A directory missing from the table fails the test, and so does a table entry without a
 * directory: nothing is skipped silently. An entry whose outcome changes (a REFUSED family
 * that now opens, a WRONG one that now matches) fails too, so the table is kept true. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdlib.h>

#include "quant/core/fsutil.h"
#include "quant/model/model.h"
#include "quant/model/token_file.h"
#include "test_util.h"

#define FAMILY_TOL 1e-4

typedef enum expect_kind { EXPECT_MATCH, EXPECT_REFUSED, EXPECT_WRONG } expect_kind;

typedef struct family_expect {
    const char *name;     /* directory under tests/data/families/ */
    expect_kind expect;
    const char *needle;   /* REFUSED: a substring the error message must contain */
} family_expect;

/* What quantd does with each family. Before RoPE was read from transformers 5's
 * `rope_parameters` and Mistral's window was honoured, seven of the MATCH rows below were
 * accepted with wrong logits (rel 1.1 to 1.4: theta 10000 and plain RoPE used, the window
 * ignored); qwen2_yarn checks that YaRN's factor is used as given (transformers derives it
 * from the context lengths only when it is absent). */
static const family_expect families[] = {
    {"llama", EXPECT_MATCH, NULL},
    {"llama_tied", EXPECT_MATCH, NULL},
    {"llama31", EXPECT_MATCH, NULL},
    {"llama31_legacy", EXPECT_MATCH, NULL},
    {"llama_linear", EXPECT_MATCH, NULL},
    {"llama_dynamic", EXPECT_MATCH, NULL},   /* 64 tokens past max_position_embeddings 48 */
    {"llama_yarn", EXPECT_MATCH, NULL},
    {"llama_head_dim", EXPECT_MATCH, NULL},
    {"mistral_window", EXPECT_MATCH, NULL},
    {"qwen2", EXPECT_MATCH, NULL},
    {"qwen2_yarn", EXPECT_MATCH, NULL},
    {"qwen3", EXPECT_MATCH, NULL},
    {"gemma2", EXPECT_MATCH, NULL},
    {"gemma3", EXPECT_MATCH, NULL},
    {"phi3", EXPECT_MATCH, NULL},
    {"phi3_longrope", EXPECT_MATCH, NULL},
    {"mixtral", EXPECT_MATCH, NULL},
    {"qwen2_moe", EXPECT_MATCH, NULL},
    {"qwen3_moe", EXPECT_MATCH, NULL},
    {"deepseek_v2", EXPECT_MATCH, NULL},
    {"deepseek_v3", EXPECT_MATCH, NULL},
    {"deepseek_v32", EXPECT_MATCH, NULL},   /* the DSA indexer: 8 of up to 64 causal keys per query */
    {"glm4_moe", EXPECT_MATCH, NULL},
    {"dots1", EXPECT_MATCH, NULL},
    {"olmoe", EXPECT_MATCH, NULL},
    {"minimax_m2", EXPECT_MATCH, NULL},
    {"ernie4_5_moe", EXPECT_MATCH, NULL},
    {"phimoe", EXPECT_MATCH, NULL},       /* LayerNorms, biases, sparsemixer top-2 routing */
    {"phimoe_longrope", EXPECT_MATCH, NULL},   /* short_factor always, long_mscale past the original context */
    {"lfm2", EXPECT_MATCH, NULL},
    {"granite4_h", EXPECT_MATCH, NULL},
    {"granite4_h_moe", EXPECT_MATCH, NULL},   /* experts (fused input_linear/output_linear) beside shared_mlp */
    {"falcon_h1", EXPECT_MATCH, NULL},   /* attention beside Mamba-2 in every layer, muP multipliers */
    {"falcon_h1_norm", EXPECT_MATCH, NULL},   /* gated RMSNorm after the gate, in_proj/out_proj biases */
    {"qwen3_next", EXPECT_MATCH, NULL},   /* Gated DeltaNet + gated attention, experts and a dense layer */
    {"qwen3_5", EXPECT_MATCH, NULL},
    {"qwen3_5_moe", EXPECT_MATCH, NULL},
    {"olmo2", EXPECT_MATCH, NULL},
    {"olmo3", EXPECT_MATCH, NULL},
    {"exaone4", EXPECT_MATCH, NULL},
    {"glm4", EXPECT_MATCH, NULL},
    {"smollm3", EXPECT_MATCH, NULL},     /* NoPE layer 1, windowed */
    {"granite", EXPECT_MATCH, NULL},     /* embedding, attention, residual, logit multipliers */
    {"ministral", EXPECT_MATCH, NULL},   /* window per layer_types */
    {"seed_oss", EXPECT_MATCH, NULL},    /* q/k/v, o_proj and MLP biases */
    {"ernie4_5", EXPECT_MATCH, NULL},    /* interleaved-pair RoPE, use_bias */
    {"apertus", EXPECT_MATCH, NULL},     /* xIELU in a non-gated MLP, q/k norms */
    {"hunyuan_dense", EXPECT_MATCH, NULL}, /* q/k norms after RoPE, NTK-alpha RoPE */
    {"ministral3", EXPECT_MATCH, NULL},  /* YaRN, Llama 4 query scale past the original context */
    /* Vision-language models' text towers, through the ConditionalGeneration classes on text ids. */
    {"qwen2_vl", EXPECT_MATCH, NULL},     /* M-RoPE; its own vision tower (LayerNorm, fc1/fc2) beside */
    {"qwen2_5_vl", EXPECT_MATCH, NULL},
    {"qwen3_vl", EXPECT_MATCH, NULL},
    {"gemma3_vl", EXPECT_MATCH, NULL},
    {"mistral3", EXPECT_MATCH, NULL},
    {"mistral3_tie_default", EXPECT_MATCH, NULL},   /* tie flag true (the default), lm_head stored: used */
    {"starcoder2", EXPECT_MATCH, NULL},
    {"phi2", EXPECT_MATCH, NULL},
    {"gpt_neox", EXPECT_MATCH, NULL},
    {"gpt_neox_seq", EXPECT_MATCH, NULL},
    {"cohere2", EXPECT_MATCH, NULL},
    {"gpt_oss", EXPECT_MATCH, NULL},
    {"llama4", EXPECT_MATCH, NULL},
    {"llama4_vl", EXPECT_MATCH, NULL},
    {"gpt_oss_mxfp4", EXPECT_MATCH, NULL},   /* the experts in MXFP4 blocks and E8M0 scales, as the Hub ships them */
};
#define N_FAMILIES (sizeof families / sizeof families[0])

static const char *expect_name(expect_kind k)
{
    return k == EXPECT_MATCH ? "MATCH" : k == EXPECT_REFUSED ? "REFUSED" : "WRONG";
}

static const family_expect *lookup(const char *name)
{
    for (size_t i = 0; i < N_FAMILIES; i++)
        if (!strcmp(families[i].name, name)) return &families[i];
    return NULL;
}

/* Reads meta.json's n_tokens and vocab, the shape logits.f32 must have. */
static int read_meta(const char *dir, int64_t *n, int64_t *vocab)
{
    char *buf = NULL;
    size_t len = 0;
    qd_err err = {0};
    if (qd_fs_read_file(test_path(dir, "meta.json"), &buf, &len, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    cJSON *root = cJSON_Parse(buf);
    free(buf);
    const cJSON *jn = cJSON_GetObjectItemCaseSensitive(root, "n_tokens");
    const cJSON *jv = cJSON_GetObjectItemCaseSensitive(root, "vocab");
    int ok = cJSON_IsNumber(jn) && cJSON_IsNumber(jv) && jn->valuedouble > 0 && jv->valuedouble > 0;
    if (ok) { *n = (int64_t)jn->valuedouble; *vocab = (int64_t)jv->valuedouble; }
    cJSON_Delete(root);
    return ok ? 0 : -1;
}

/* Outcome of one family: rc 0 with rel set, or the error that stopped it. */
typedef struct family_result {
    int rc;
    double rel;
    qd_err err;
} family_result;

static family_result run_family(const char *dir, qd_backend *be)
{
    family_result r = {0};
    int64_t n = 0, vocab = 0;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    char *gold = NULL;
    size_t glen = 0;
    float *logits = NULL;
    qd_model *m = NULL;
    r.rel = -1;
    /* Goldens first, so a broken data directory is a test failure, never a REFUSED. */
    CHECK_OK(read_meta(dir, &n, &vocab));
    CHECK_OK(qd_token_file_read(test_path(dir, "ids.json"), &ids, &n_ids, &r.err));
    CHECK_OK(qd_fs_read_file(test_path(dir, "logits.f32"), &gold, &glen, &r.err));
    CHECK_INT(n_ids, n);
    CHECK_INT(glen, (size_t)n * (size_t)vocab * sizeof(float));
    if (!ids || !gold || (int64_t)n_ids != n || glen != (size_t)n * (size_t)vocab * sizeof(float)) {
        r.rc = QD_EFORMAT;
        snprintf(r.err.msg, sizeof r.err.msg, "golden files in %.400s are unreadable or inconsistent", dir);
        goto done;
    }
    if ((r.rc = qd_model_open(dir, be, &m, &r.err))) goto done;
    if (qd_model_cfg(m)->vocab != vocab) {
        r.rc = QD_ESHAPE;
        snprintf(r.err.msg, sizeof r.err.msg, "config vocab %lld, goldens %lld", (long long)qd_model_cfg(m)->vocab,
                 (long long)vocab);
        goto done;
    }
    logits = malloc((size_t)n * (size_t)vocab * sizeof *logits);
    CHECK(logits != NULL);
    if (!logits) { r.rc = QD_ENOMEM; goto done; }
    if ((r.rc = qd_model_forward(m, ids, 1, n, logits, &r.err))) goto done;
    const float *ref = (const float *)gold;
    double num = 0, den = 0;
    for (size_t i = 0; i < (size_t)n * (size_t)vocab; i++) {
        double d = fabs((double)logits[i] - (double)ref[i]);
        /* NaN in ours must not pass as "no difference". */
        if (!(d <= num)) num = isnan(d) ? INFINITY : d;
        if (fabs((double)ref[i]) > den) den = fabs((double)ref[i]);
    }
    r.rel = den > 0 ? num / den : num;
done:
    qd_model_close(m);
    free(logits);
    free(gold);
    free(ids);
    return r;
}

static int cmp_name(const void *a, const void *b) { return strcmp(a, b); }

static void test_families(void)
{
    char root[4200];
    snprintf(root, sizeof root, "%s/tests/data/families", test_source_dir());
    DIR *d = opendir(root);
    CHECK(d != NULL);
    if (!d) { fprintf(stderr, "cannot open %s\n", root); return; }
    qd_err err = {0};
    qd_backend *be = NULL;
    CHECK_OK(qd_backend_cpu_open(2, NULL, &be, &err));
    if (!be) { closedir(d); return; }
    int seen[N_FAMILIES] = {0};
    int n_wrong = 0;
    /* Sorted, so the printed table reads the same on every file system. */
    char names[64][256];
    size_t n_names = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        if (n_names == sizeof names / sizeof names[0]) {
            TEST_FAIL_("more than %zu entries in %s", sizeof names / sizeof names[0], root);
            break;
        }
        snprintf(names[n_names++], sizeof names[0], "%s", e->d_name);
    }
    closedir(d);
    qsort(names, n_names, sizeof names[0], cmp_name);
    printf("%-16s %-8s %-8s %s\n", "family", "expect", "got", "rel error / message");
    for (size_t k = 0; k < n_names; k++) {
        char dir[4200 + 260];
        snprintf(dir, sizeof dir, "%s/%.255s", root, names[k]);
        DIR *sub = opendir(dir);
        if (!sub) continue;   /* a plain file (a README) is not a family */
        closedir(sub);
        const family_expect *x = lookup(names[k]);
        if (!x) {
            TEST_FAIL_("%s: family directory not in the table of test_model_families.c (add it as MATCH, "
                       "REFUSED or WRONG)", names[k]);
            continue;
        }
        seen[x - families] = 1;
        family_result r = run_family(dir, be);
        const char *got = r.rc ? "REFUSED" : r.rel <= FAMILY_TOL ? "MATCH" : "WRONG";
        if (r.rc)
            printf("%-16s %-8s %-8s %s\n", x->name, expect_name(x->expect), got, r.err.msg);
        else
            printf("%-16s %-8s %-8s rel %.3g%s\n", x->name, expect_name(x->expect), got, r.rel,
                   r.rel <= FAMILY_TOL ? "" : "   <== WRONG LOGITS: quantd accepts this checkpoint and disagrees "
                                              "with transformers");
        fflush(stdout);
        test_checks++;
        switch (x->expect) {
        case EXPECT_MATCH:
            if (r.rc) TEST_FAIL_("%s: expected MATCH, refused: %s", x->name, r.err.msg);
            else if (!(r.rel <= FAMILY_TOL))
                TEST_FAIL_("%s: expected MATCH, relative error %.3g > %g", x->name, r.rel, FAMILY_TOL);
            break;
        case EXPECT_REFUSED:
            if (!r.rc) TEST_FAIL_("%s: expected REFUSED (\"%s\"), but it ran (rel %.3g): update the table",
                                  x->name, x->needle, r.rel);
            else if (!strstr(r.err.msg, x->needle))
                TEST_FAIL_("%s: refused, but the message \"%s\" does not contain \"%s\"", x->name, r.err.msg, x->needle);
            break;
        case EXPECT_WRONG:
            if (r.rc) TEST_FAIL_("%s: expected WRONG, now refused (%s): update the table", x->name, r.err.msg);
            else if (r.rel <= FAMILY_TOL)
                TEST_FAIL_("%s: expected WRONG, now matches (rel %.3g): flip it to MATCH", x->name, r.rel);
            else n_wrong++;
            break;
        }
    }
    for (size_t i = 0; i < N_FAMILIES; i++) {
        test_checks++;
        if (!seen[i]) TEST_FAIL_("%s: in the table but %s/%s is missing", families[i].name, root, families[i].name);
    }
    if (n_wrong)
        printf("\n*** %d famil%s where quantd SILENTLY COMPUTES WRONG LOGITS (marked WRONG above; issue #16) ***\n\n",
               n_wrong, n_wrong == 1 ? "y" : "ies");
    qd_backend_close(be);
}

int main(void)
{
    TEST_RUN(test_families);
    return test_finish();
}
