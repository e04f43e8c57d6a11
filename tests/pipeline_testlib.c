/* Implementation of pipeline_testlib.h. */
#include "pipeline_testlib.h"

#include <stdio.h>
#include <string.h>

qd_backend *pt_be;


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
qp_job *pt_job(const char *model, const char *out, const char *method, const char *format,
                      const char *calib, const char *extra)
{
    char buf[8192];
    char cal[4400] = "";
    if (calib) snprintf(cal, sizeof cal, "\"calibration\":{\"path\":\"%s\",\"samples\":8,\"seq_len\":32},", calib);
    snprintf(buf, sizeof buf, "{%s%s\"model\":\"%s\",\"output\":\"%s\",\"method\":\"%s\",\"format\":\"%s\",\"group_size\":32}",
             cal, extra ? extra : "", model, out, method, format);
    qp_job *job = NULL;
    qp_err perr;
    memset(&perr, 0, sizeof perr);
    if (qp_job_parse(buf, strlen(buf), &job, &perr) != 0) {
        fprintf(stderr, "job parse failed: %s\n  %s\n", perr.msg, buf);
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
