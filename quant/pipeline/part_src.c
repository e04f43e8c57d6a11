/* A part's weight rows read from the model's own files (part.h): the lead names the stored
 * tensor and the checksum of its rows' bytes instead of writing the rows, and the worker
 * reads them from the checkpoint it opens beneath its own allowed roots. For a half-precision
 * model that is two of the three bytes per weight a quantize step's files carried. */
#include "quant/pipeline/part.h"

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

int qd_qpart_src_read(const qp_job *job, const st_model *open, const cJSON *meta, int64_t r0, int64_t r1, int64_t n,
                      int64_t k, float *w, qd_err *err)
{
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(meta, "src");
    const cJSON *cs = cJSON_GetObjectItemCaseSensitive(meta, "src_sum");
    if (!nm) return QD_ENOTFOUND;
    if (!cJSON_IsString(nm) || !cJSON_IsString(cs))
        return qd_err_set(err, QD_EFORMAT, "part input: src and src_sum must be strings");
    st_model *sm = NULL;
    int rc = open ? 0 : st_model_open(job->model, &sm, err);
    if (rc) return rc;
    const st_tensor *t = st_model_find(open ? open : sm, nm->valuestring);
    st_tensor view;
    if (!t || t->ndim != 2 || t->shape[0] != n || t->shape[1] != k || !plain_dtype(t->dtype))
        rc = qd_err_set(err, QD_EFORMAT, "part input: the model has no plain [%lld, %lld] tensor %.200s", (long long)n,
                        (long long)k, nm->valuestring);
    if (!rc) rc = st_tensor_rows(t, r0, r1, &view, err);
    /* The checksum and the conversion from one copy of the bytes, as the lead's. */
    size_t bytes = rc ? 0 : (size_t)(view.end - view.begin);
    unsigned char *raw = rc ? NULL : malloc(bytes ? bytes : 1);
    if (!rc && !raw) rc = qd_err_set(err, QD_ENOMEM, "part input: out of memory for rows of %.200s", nm->valuestring);
    char sum[24];
    if (!rc) {
        memcpy(raw, view.data, bytes);
        snprintf(sum, sizeof sum, "%016llx", (unsigned long long)qd_part_checksum(raw, bytes));
        if (strcmp(sum, cs->valuestring))
            rc = qd_err_set(err, QD_EFORMAT, "part input: rows %lld..%lld of %.200s changed since the lead read them "
                            "(checksum %s, the lead's %.20s)", (long long)r0, (long long)r1, nm->valuestring, sum,
                            cs->valuestring);
    }
    if (!rc) {
        view.data = raw;
        view.mapped = 0;
        rc = st_tensor_read_f32(&view, w, err);
    }
    free(raw);
    st_model_close(sm);
    return rc;
}
