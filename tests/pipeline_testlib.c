/* Implementation of pipeline_testlib.h. */
#include "pipeline_testlib.h"

#include <stdio.h>
#include <string.h>

#include "quant/core/dtype.h"
#include "quant/formats/qlayer.h"

qd_backend *pt_be;
static char pt_tokens[4096];

int pt_setup(int threads, size_t n_tokens, int vocab, uint64_t seed, const char **tmp, const char **tokens)
{
    qd_err err = {0};
    if (qd_backend_cpu_open(threads, NULL, &pt_be, &err)) {
        fprintf(stderr, "cpu backend: %s\n", err.msg);
        return 1;
    }
    const char *T = test_tmpdir();
    if (tmp) *tmp = T;
    if (n_tokens > 0) {
        snprintf(pt_tokens, sizeof pt_tokens, "%s/calib.json", T);
        if (pt_write_tokens(pt_tokens, n_tokens, vocab, seed)) {
            fprintf(stderr, "setup failed: cannot write %s\n", pt_tokens);
            return 1;
        }
        if (tokens) *tokens = pt_tokens;
    }
    return 0;
}

int pt_setup_model(const char *name, const qd_testgen_opts *o, char *dir, size_t cap)
{
    if ((size_t)snprintf(dir, cap, "%s/%s", test_tmpdir(), name) >= cap) {
        fprintf(stderr, "setup failed: %s/%s is too long\n", test_tmpdir(), name);
        return 1;
    }
    if (pt_gen_model(dir, o)) {
        fprintf(stderr, "setup failed: cannot generate %s\n", dir);
        return 1;
    }
    return 0;
}

int pt_teardown(void)
{
    qd_backend_close(pt_be);
    pt_be = NULL;
    return test_finish();
}


/* A llama with GQA (4 heads, 2 kv heads), hidden 64, 3 layers; intermediate as given. */
qd_testgen_opts pt_llama_opts(int64_t inter, int n_layers)
{
    qd_testgen_opts o = qd_testgen_defaults(QD_ARCH_LLAMA);
    o.hidden = 64;
    o.intermediate = inter;
    o.n_layers = n_layers;
    o.n_heads = 4;
    o.n_kv_heads = 2;
    o.vocab = 128;
    o.max_pos = 128;
    o.seed = 11;
    return o;
}

/* Writes the model and a generation_config.json / tokenizer_config.json the output must copy. */
int pt_gen_model(const char *dir, const qd_testgen_opts *o)
{
    qd_err err = {0};
    int rc = qd_testgen_write(dir, o, &err);
    if (rc) { fprintf(stderr, "testgen %s: %s\n", dir, err.msg); return rc; }
    const char *gen = "{\"bos_token_id\": 1, \"eos_token_id\": 2}\n";
    const char *tokc = "{\"model_max_length\": 128, \"note\": \"pipeline test\"}\n";
    rc = qd_fs_write_atomic(test_path(dir, "generation_config.json"), gen, strlen(gen), &err);
    if (!rc) rc = qd_fs_write_atomic(test_path(dir, "tokenizer_config.json"), tokc, strlen(tokc), &err);
    return rc;
}

/* n random ids below vocab as a JSON token file. */
int pt_write_tokens(const char *path, size_t n, int vocab, uint64_t seed)
{
    test_rng r;
    test_rng_seed(&r, seed);
    int32_t *ids = malloc(n * sizeof *ids);
    if (!ids) return -1;
    for (size_t i = 0; i < n; i++) ids[i] = (int32_t)(test_rng_u64(&r) % (uint64_t)vocab);
    qd_err err = {0};
    int rc = qd_token_file_write_json(path, ids, n, &err);
    free(ids);
    return rc;
}

/* Parses a job; extra is spliced into the object (e.g. "\"bits\":8,"), without braces. */
int pt_calib_samples = 8, pt_calib_seq_len = 32;
const char *pt_calib_extra = "";

qp_job *pt_job(const char *model, const char *out, const char *method, const char *format,
                      const char *calib, const char *extra)
{
    char buf[8192];
    char cal[4400] = "";
    if (calib)
        snprintf(cal, sizeof cal, "\"calibration\":{\"path\":\"%s\",\"samples\":%d,\"seq_len\":%d%s},", calib,
                 pt_calib_samples, pt_calib_seq_len, pt_calib_extra);
    /* A scheme sets its own group size (a different one would contradict it). */
    const char *gs = extra && strstr(extra, "\"scheme\"") ? "" : ",\"group_size\":32";
    snprintf(buf, sizeof buf, "{%s%s\"model\":\"%s\",\"output\":\"%s\",\"method\":\"%s\",\"format\":\"%s\"%s}",
             cal, extra ? extra : "", model, out, method, format, gs);
    qp_job *job = NULL;
    qp_err perr;
    memset(&perr, 0, sizeof perr);
    if (qp_job_parse(buf, strlen(buf), &job, &perr) != 0) {
        fprintf(stderr, "job parse failed: %s\n  %s\n", perr.msg, buf);
        return NULL;
    }
    return job;
}

qp_job *pt_run_job(const char *what, const char *model, const char *out, const char *method, const char *format,
                   const char *calib, const char *extra)
{
    qp_job *job = pt_job(model, out, method, format, calib, extra);
    CHECK(job != NULL);
    if (!job) return NULL;
    qd_err err = {0};
    int rc = qd_pipeline_run(job, pt_be, NULL, &err);
    test_checks++;
    if (rc) {
        TEST_FAIL_("%s: %s/%s job failed: %d %s", what, method, format, rc, err.msg);
        qp_job_free(job);
        return NULL;
    }
    return job;
}

char *pt_read(const char *path, size_t *len)
{
    char *buf = NULL;
    size_t n = 0;
    qd_err err = {0};
    if (qd_fs_read_file(path, &buf, &n, &err)) return NULL;
    if (len) *len = n;
    return buf;
}

cJSON *pt_read_json(const char *path)
{
    size_t n = 0;
    char *buf = pt_read(path, &n);
    if (!buf) return NULL;
    cJSON *j = cJSON_ParseWithLength(buf, n);
    free(buf);
    return j;
}

/* 1 when both files exist and hold the same bytes. */
int pt_same_file(const char *a, const char *b)
{
    size_t na = 0, nb = 0;
    char *x = pt_read(a, &na), *y = pt_read(b, &nb);
    int same = x && y && na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return same;
}

/* Logits of the model in dir on fixed ids (batch 2 x 16), host, malloc'd; NULL on error. */
float *pt_logits(const char *dir, int64_t *n_out)
{
    qd_err err = {0};
    qd_model *m = NULL;
    if (qd_model_open(dir, pt_be, &m, &err)) { fprintf(stderr, "open %s: %s\n", dir, err.msg); return NULL; }
    int64_t vocab = qd_model_cfg(m)->vocab, B = 2, S = 16;
    int32_t ids[32];
    for (int i = 0; i < 32; i++) ids[i] = (i * 37 + 5) % (int)vocab;
    float *lg = malloc((size_t)(B * S * vocab) * sizeof(float));
    if (lg && qd_model_forward(m, ids, B, S, lg, &err)) {
        fprintf(stderr, "forward %s: %s\n", dir, err.msg);
        free(lg);
        lg = NULL;
    }
    *n_out = B * S * vocab;
    qd_model_close(m);
    return lg;
}

/* ||a - b|| / ||b||. */
double pt_rel_err(const float *a, const float *b, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

double pt_logits_rel(const char *ref_dir, const char *dir)
{
    int64_t n = 0, n2 = 0;
    float *a = pt_logits(ref_dir, &n), *b = pt_logits(dir, &n2);
    double rel = a && b && n == n2 ? pt_rel_err(b, a, n) : -1.0;
    free(a);
    free(b);
    return rel;
}

void pt_rand_packed(test_rng *r, const qd_format *f, int64_t n, int64_t k, int bits, int64_t gs, float bias_scale,
                    const int32_t *g_idx, qd_packed *out)
{
    qd_qlayer l;
    qd_err err = {0};
    memset(&l, 0, sizeof l);
    if (qd_qlayer_alloc(&l, n, k, bits, 0, gs, bias_scale > 0, &err)) { TEST_FAIL_("alloc: %s", err.msg); return; }
    int maxq = (1 << bits) - 1;
    for (int64_t i = 0; i < n * k; i++) l.q[i] = (uint8_t)(test_rng_u64(r) % (uint64_t)(maxq + 1));
    for (int64_t i = 0; i < l.n_groups * n; i++) {
        l.scales[i] = qd_f16_to_f32(qd_f32_to_f16(0.01f + 0.05f * test_rng_uniform(r)));
        l.zeros[i] = 1 + (int32_t)(test_rng_u64(r) % (uint64_t)maxq);   /* v1 cannot store 0 */
    }
    if (g_idx) {
        memcpy(l.g_idx, g_idx, (size_t)k * sizeof *g_idx);
    } else {
        int64_t *phi = malloc((size_t)k * sizeof *phi);
        for (int64_t i = 0; i < k; i++) phi[i] = i;
        for (int64_t i = k - 1; i > 0; i--) {
            int64_t j = (int64_t)(test_rng_u64(r) % (uint64_t)(i + 1)), t = phi[i];
            phi[i] = phi[j];
            phi[j] = t;
        }
        for (int64_t pos = 0; pos < k; pos++) l.g_idx[phi[pos]] = (int32_t)(gs > 0 ? pos / gs : 0);
        free(phi);
    }
    if (bias_scale > 0)
        for (int64_t i = 0; i < n; i++) l.bias[i] = qd_f16_to_f32(qd_f32_to_f16(bias_scale * test_rng_normal(r)));
    if (f->pack(&l, out, &err)) TEST_FAIL_("pack: %s", err.msg);
    qd_qlayer_free(&l);
}

int pt_patch_tensor(const char *dir, const char *name, uint32_t bits32, uint16_t bits16)
{
    const char *path = test_path(dir, "model.safetensors");
    FILE *f = fopen(path, "r+b");
    if (!f) return -1;
    uint64_t hn = 0;
    if (fread(&hn, 8, 1, f) != 1) { fclose(f); return -1; }
    char *h = malloc(hn + 1);
    if (!h || fread(h, 1, hn, f) != hn) { free(h); fclose(f); return -1; }
    h[hn] = 0;
    cJSON *j = cJSON_Parse(h);
    free(h);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, name);
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(t, "dtype");
    int rc = -1;
    if (cJSON_IsArray(off) && cJSON_IsString(dt)) {
        long pos = (long)(8 + hn + (uint64_t)cJSON_GetArrayItem(off, 0)->valuedouble);
        fseek(f, pos + 8, SEEK_SET);   /* a few elements in */
        if (!strcmp(dt->valuestring, "F32")) rc = fwrite(&bits32, 4, 1, f) == 1 ? 0 : -1;
        else rc = fwrite(&bits16, 2, 1, f) == 1 ? 0 : -1;
    } else {
        fprintf(stderr, "%s: no tensor %s\n", path, name);
    }
    cJSON_Delete(j);
    fclose(f);
    return rc;
}

int pt_patch_nan(const char *dir, const char *name) { return pt_patch_tensor(dir, name, 0x7FC00000u, 0x7FC0u); }

const char *pt_families_dir(void)
{
    static char buf[3900];
    snprintf(buf, sizeof buf, "%.3870s/tests/data/families", test_source_dir());
    return buf;
}

int pt_run_all(qd_pipeline *p)
{
    qd_err err = {0};
    int passes = -1;
    while (qd_pipeline_next_block(p) < qd_pipeline_n_blocks(p) && qd_pipeline_run_block(p, &err) == 0) {}
    CHECK_INT(qd_pipeline_next_block(p), qd_pipeline_n_blocks(p));
    char *cost = qd_pipeline_last_block_cost(p);
    cJSON *c = cost ? cJSON_Parse(cost) : NULL;
    const cJSON *fp = cJSON_GetObjectItemCaseSensitive(c, "forward_passes");
    if (cJSON_IsNumber(fp)) passes = fp->valueint;
    cJSON_Delete(c);
    free(cost);
    CHECK_OK(qd_pipeline_finish(p, &err));
    qd_pipeline_close(p);
    return passes;
}
