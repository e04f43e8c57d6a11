/* The disk estimate counts a learned position table only for an architecture that stores
 * one (OPT's embed_positions, [max_position_embeddings + 2, hidden]), as the architecture
 * table says (qd_model_config_pos_rows): a RoPE model (llama) stores none, so its
 * max_position_embeddings, however large (a 1M-token context), adds nothing to the disk
 * figure. Both models' config.json are rewritten with a large max_position_embeddings; the
 * estimate reads config.json alone. */
#include <stdio.h>
#include <string.h>

#include "pipeline_testlib.h"

#define BIG_POS 1048576

/* Sets config.json's max_position_embeddings in dir. */
static int set_max_pos(const char *dir, long long v)
{
    const char *path = test_path(dir, "config.json");
    cJSON *c = pt_read_json(path);
    if (!c) return -1;
    cJSON_DeleteItemFromObjectCaseSensitive(c, "max_position_embeddings");
    cJSON_AddNumberToObject(c, "max_position_embeddings", (double)v);
    char *text = cJSON_Print(c);
    cJSON_Delete(c);
    qd_err err = {0};
    int rc = text ? qd_fs_write_atomic(path, text, strlen(text), &err) : -1;
    cJSON_free(text);
    return rc;
}

/* disk_bytes of an RTN job on the model in dir with max_position_embeddings pos. */
static long long disk_at(const char *dir, long long pos)
{
    if (set_max_pos(dir, pos)) return -1;
    qp_job *job = pt_job(dir, test_path(test_tmpdir(), "out"), "rtn", "gptq", NULL, NULL);
    qd_pipeline_estimate est;
    qd_err err = {0};
    long long d = -1;
    if (job && qd_pipeline_estimate_job(job, &est, &err) == 0) d = (long long)est.disk_bytes;
    else fprintf(stderr, "estimate of %s: %s\n", dir, err.msg);
    qp_job_free(job);
    return d;
}

static void test_llama_no_positions(void)
{
    const char *dir = test_fresh_dir("llama");
    qd_testgen_opts o = pt_llama_opts(128, 2);
    if (pt_gen_model(dir, &o)) { CHECK(0); return; }
    qd_model_config cfg;
    qd_err err = {0};
    CHECK_OK(qd_model_config_load(dir, &cfg, &err));
    CHECK_INT(qd_model_config_pos_rows(&cfg), 0);
    long long small = disk_at(dir, 128), big = disk_at(dir, BIG_POS);
    CHECK(small > 0);
    /* Before: BIG_POS x 64 x 4 bytes (268 MB) more, on a model whose figure is under 1 MB. */
    CHECK_INT(big, small);
}

static void test_opt_learned_positions(void)
{
    const char *dir = test_fresh_dir("opt");
    qd_testgen_opts o = qd_testgen_defaults(QD_ARCH_OPT);
    if (pt_gen_model(dir, &o)) { CHECK(0); return; }
    qd_model_config cfg;
    qd_err err = {0};
    CHECK_OK(qd_model_config_load(dir, &cfg, &err));
    CHECK_INT(qd_model_config_pos_rows(&cfg), o.max_pos + 2);
    long long small = disk_at(dir, o.max_pos), big = disk_at(dir, BIG_POS);
    CHECK(small > 0);
    /* The table's rows grow by BIG_POS - max_pos, hidden F32 values each. */
    CHECK_INT(big - small, (long long)(BIG_POS - o.max_pos) * o.hidden * 4);
}

int main(void)
{
    test_tmpdir();
    TEST_RUN(test_llama_no_positions);
    TEST_RUN(test_opt_learned_positions);
    return test_finish();
}
