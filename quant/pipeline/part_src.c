/* A part's weight rows read from the model's own files (part.h): the lead names the stored
 * tensor and the checksum of its rows' bytes instead of writing the rows, and the worker
 * reads them from the checkpoint it opens beneath its own allowed roots. For a half-precision
 * model that is two of the three bytes per weight a quantize step's files carried. */
#include "quant/pipeline/part.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include "quant/core/safetensors.h"

static int plain_dtype(qd_dtype t) { return t == QD_DTYPE_BF16 || t == QD_DTYPE_F16 || t == QD_DTYPE_F32; }

/* Whether the rows of view converted to F32 are w's, bit for bit, and *sum the checksum of
 * their stored bytes: both from one copy of the bytes, so that a file changed in place while
 * it is read cannot pass the comparison with other bytes than the checksum names. */
static int rows_equal(const st_tensor *view, int64_t rows, int64_t k, const float *w, uint64_t *sum)
{
    const int64_t chunk = 16;
    size_t bytes = (size_t)(view->end - view->begin);
    unsigned char *raw = malloc(bytes ? bytes : 1);
    float *tmp = malloc((size_t)(chunk * k) * sizeof *tmp);
    int same = raw && tmp;
    if (same) {
        memcpy(raw, view->data, bytes);
        *sum = qd_part_checksum(raw, bytes);
    }
    st_tensor copy = *view;
    copy.data = raw;
    copy.mapped = 0;
    qd_err e = {0};
    for (int64_t r = 0; r < rows && same; r += chunk) {
        int64_t m = rows - r < chunk ? rows - r : chunk;
        st_tensor v;
        if (st_tensor_rows(&copy, r, r + m, &v, &e) || st_tensor_read_f32(&v, tmp, &e)) same = 0;
        else same = !memcmp(tmp, w + r * k, (size_t)(m * k) * sizeof *tmp);
    }
    free(raw);
    free(tmp);
    return same;
}

int qd_qpart_src_find(qd_pipeline *p, int block, qd_qpart_in *in)
{
    in->src = NULL;
    if (!in->w || in->w != in->w_ref) return 0;
    const qd_linear_info *L = qd_model_linear(p->m, in->linear);
    char name[600];
    if (qd_model_block_prefix(p->m, block, name, sizeof name)) return 0;
    size_t at = strlen(name);
    snprintf(name + at, sizeof name - at, "%s.weight", L->name);
    const st_tensor *t = st_model_find(qd_model_tensors(p->m), name);
    if (!t || !t->data || !t->mapped || t->ndim != 2 || t->shape[0] != in->res.n || t->shape[1] != in->res.k ||
        !plain_dtype(t->dtype))
        return 0;
    st_tensor view;
    qd_err e = {0};
    if (st_tensor_rows(t, in->r0, in->r1, &view, &e) ||
        !rows_equal(&view, in->r1 - in->r0, in->res.k, in->w, &in->src_sum))
        return 0;
    in->src = t;
    return 1;
}

int qd_qpart_src_note(cJSON *meta, const qd_qpart_in *in)
{
    char sum[24];
    snprintf(sum, sizeof sum, "%016llx", (unsigned long long)in->src_sum);
    if (!cJSON_AddStringToObject(meta, "src", in->src->name) || !cJSON_AddStringToObject(meta, "src_sum", sum))
        return QD_ENOMEM;
    return 0;
}

/* Rows r0..r1 of the tensor meta names in m, checked against the checksum meta gives. */
static int read_rows(const st_model *m, const char *name, const char *want, int64_t r0, int64_t r1, int64_t n, int64_t k,
                     float *w, qd_err *err)
{
    const st_tensor *t = st_model_find(m, name);
    st_tensor view;
    int rc = 0;
    if (!t || t->ndim != 2 || t->shape[0] != n || t->shape[1] != k || !plain_dtype(t->dtype))
        rc = qd_err_set(err, QD_EFORMAT, "part input: the model has no plain [%lld, %lld] tensor %.200s", (long long)n,
                        (long long)k, name);
    if (!rc) rc = st_tensor_rows(t, r0, r1, &view, err);
    /* The checksum and the conversion from one copy of the bytes, as the lead's. */
    size_t bytes = rc ? 0 : (size_t)(view.end - view.begin);
    unsigned char *raw = rc ? NULL : malloc(bytes ? bytes : 1);
    if (!rc && !raw) rc = qd_err_set(err, QD_ENOMEM, "part input: out of memory for rows of %.200s", name);
    char sum[24];
    if (!rc) {
        memcpy(raw, view.data, bytes);
        /* A model kept open for many parts keeps only the pages being read resident. */
        st_tensor_release(&view);
        snprintf(sum, sizeof sum, "%016llx", (unsigned long long)qd_part_checksum(raw, bytes));
        if (strcmp(sum, want))
            rc = qd_err_set(err, QD_EFORMAT, "part input: rows %lld..%lld of %.200s changed since the lead read them "
                            "(checksum %s, the lead's %.20s)", (long long)r0, (long long)r1, name, sum, want);
    }
    if (!rc) {
        view.data = raw;
        view.mapped = 0;
        rc = st_tensor_read_f32(&view, w, err);
    }
    free(raw);
    return rc;
}

/* The checkpoint this process last read part rows from, kept open for its next parts: opening
 * a checkpoint of many shards parses every shard's header (bench/results/parts.md), once per
 * part otherwise. Keyed by the job's model path. The rows' checksum still decides what is
 * used: rows that differ from the lead's in a checkpoint kept open (its files replaced since)
 * are read once more from a fresh open before the part is refused. */
static pthread_mutex_t src_lock = PTHREAD_MUTEX_INITIALIZER;
static st_model *src_model;
static char src_path[4096];

static int src_reopen(const char *path, qd_err *err)
{
    st_model_close(src_model);
    src_model = NULL;
    src_path[0] = 0;
    if (strlen(path) >= sizeof src_path) return qd_err_set(err, QD_EINVAL, "part input: model path too long");
    int rc = st_model_open(path, &src_model, err);
    if (!rc) snprintf(src_path, sizeof src_path, "%s", path);
    return rc;
}

void qd_pipeline_part_idle_files(void)
{
    pthread_mutex_lock(&src_lock);
    st_model_close(src_model);
    src_model = NULL;
    src_path[0] = 0;
    pthread_mutex_unlock(&src_lock);
}

void qd_pipeline_part_idle(void)
{
    qd_pipeline_part_idle_files();
    qd_cpart_cache_drop();
}

int qd_qpart_src_read(const qp_job *job, const st_model *open, const cJSON *meta, int64_t r0, int64_t r1, int64_t n,
                      int64_t k, float *w, qd_err *err)
{
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(meta, "src");
    const cJSON *cs = cJSON_GetObjectItemCaseSensitive(meta, "src_sum");
    if (!nm) return QD_ENOTFOUND;
    if (!cJSON_IsString(nm) || !cJSON_IsString(cs))
        return qd_err_set(err, QD_EFORMAT, "part input: src and src_sum must be strings");
    if (open) return read_rows(open, nm->valuestring, cs->valuestring, r0, r1, n, k, w, err);
    pthread_mutex_lock(&src_lock);
    int kept = src_model && !strcmp(src_path, job->model);
    int rc = kept ? 0 : src_reopen(job->model, err);
    if (!rc) rc = read_rows(src_model, nm->valuestring, cs->valuestring, r0, r1, n, k, w, err);
    if (rc && kept) {
        qd_err_clear(err);
        rc = src_reopen(job->model, err);
        if (!rc) rc = read_rows(src_model, nm->valuestring, cs->valuestring, r0, r1, n, k, w, err);
    }
    pthread_mutex_unlock(&src_lock);
    return rc;
}
