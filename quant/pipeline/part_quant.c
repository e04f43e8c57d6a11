/* The quantize step's parts (part.h): one linear's quantization, packing, error and kernel
 * check, computed where the lead is or in another worker from the files the lead wrote. */
#define _GNU_SOURCE
#include "quant/pipeline/part.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "quant/core/clock.h"
#include "quant/core/confine.h"
#include "quant/core/log.h"
#include "quant/kernels/kernels.h"

/* The largest kernel-vs-float error (relative to the output's max) the per-layer kernel
 * check accepts: the CPU kernels accumulate in F32 like the float GEMM; CUDA's tensor-core
 * path rounds x to F16 (~1e-3). */
#define KCHECK_TOL 1e-2

void qd_qpart_out_free(qd_qpart_out *o)
{
    if (!o) return;
    qd_packed_free(&o->packed);
    qd_deq_free(&o->dq);
}

static double stage_add(qd_qpart_out *o, qd_stage s, double t0)
{
    double t = qd_clock_now_s();
    o->stage[s] += t - t0;
    return t;
}

int qd_qpart_compute(qd_pipeline *p, const qd_qpart_in *in, qd_gptq_shared *shared, qd_qpart_out *out,
                     qd_err *err)
{
    memset(out, 0, sizeof *out);
    out->res = in->res;
    qd_layer_result *res = &out->res;
    const qp_job *job = p->job;
    int64_t n = res->n, k = res->k;
    qd_qlayer layer;
    double h_err;
    double t = qd_clock_now_s();
    int rc = qd_pipeline_quantize_weight(p, in->gptq, in->w, n, k, in->h, shared, &layer, &out->dq, res, &h_err, err);
    /* The group's last linear: its factor's memory goes back before the error's buffers are
     * taken (the peak stays one k x k buffer at a time, as unshared). */
    if (shared && in->shared_last) qd_gptq_shared_free(shared);
    t = stage_add(out, QD_STAGE_QUANTIZE, t);
    if (rc) return qd_err_prefix(err, "%s", res->name);
    if (in->bias) {
        layer.bias = malloc((size_t)n * sizeof(float));
        if (!layer.bias) rc = qd_err_set(err, QD_ENOMEM, "out of memory");
        else memcpy(layer.bias, in->bias, (size_t)n * sizeof(float));
    }
    if (!rc) rc = p->fmt->pack(&layer, &out->packed, err);   /* checks the layer first */
    qd_qlayer_free(&layer);
    t = stage_add(out, QD_STAGE_PACK, t);
    if (rc) return qd_err_prefix(err, "%s", res->name);
    /* The error is measured against the weight before clipping (clipping is part of the
     * quantization error); GPTQ's own losses give its numerator when GPTQ saw that weight. */
    rc = qd_pipeline_rel_error(p, in->w_ref, out->dq.w, n, k, in->h, in->use_losses ? h_err : -1.0, &res->rel_error, err);
    t = stage_add(out, QD_STAGE_ERROR, t);
    if (rc) return rc;
    if (!isfinite(res->rel_error)) return qd_err_set(err, QD_ENUMERIC, "%s: quantization error is not finite", res->name);
    if (in->dx && in->drows > 0) {
        rc = qd_pipeline_rel_error_direct(p, in->w_ref, out->dq.w, n, k, in->dx, in->drows, &res->rel_error_direct, err);
        t = stage_add(out, QD_STAGE_ERROR, t);
        if (rc) return qd_err_prefix(err, "%s: direct error", res->name);
    }
    if (job->kernel_check && in->kx && in->krows > 0) {
        /* The packed weights through the dequantizing kernel vs the float matmul of the
         * quantizer's Q (what they must decode to), on real inputs of this layer. */
        rc = qd_kernel_check_layer(p->be, p->fmt, &out->packed, out->dq.w, in->kx, in->krows, &res->kernel_max_err, err);
        t = stage_add(out, QD_STAGE_KERNEL_CHECK, t);
        if (rc) return qd_err_prefix(err, "%s", res->name);   /* its words start with "kernel check: " */
        res->kernel_checked = 1;
        if (!(res->kernel_max_err <= KCHECK_TOL))
            return qd_err_set(err, QD_EBACKEND, "%s: kernel check failed: the %s kernel differs from the reference by %.3g (relative), over %.0e",
                              res->name, p->be->name, res->kernel_max_err, KCHECK_TOL);
    }
    return 0;
}

/* ---- files ---- */

void qd_qpart_name_hessian(char *buf, size_t cap, int block, int group)
{
    snprintf(buf, cap, "b%04d-quantize-h%03d.part", block, group);
}

void qd_qpart_name_in(char *buf, size_t cap, int block, int index)
{
    snprintf(buf, cap, "b%04d-quantize-%04d.in.part", block, index);
}

void qd_qpart_name_out(char *buf, size_t cap, int block, int index)
{
    snprintf(buf, cap, "b%04d-quantize-%04d.out.part", block, index);
}

int qd_qpart_write_hessian(int dirfd, int block, int group, const qd_gptq_hessian *h, qd_err *err)
{
    size_t kk = (size_t)(h->k * h->k);
    float *host = h->be->device < 0 ? h->h : malloc(kk * sizeof(float));
    if (!host) return qd_err_set(err, QD_ENOMEM, "out of memory for a [%lld, %lld] Hessian", (long long)h->k, (long long)h->k);
    int rc = host == h->h ? 0 : qd_backend_download(h->be, host, h->h, kk * sizeof(float));
    if (rc) rc = qd_err_set(err, rc, "Hessian: %s", h->be->err.msg);
    cJSON *meta = cJSON_CreateObject();
    if (!rc && !meta) rc = qd_err_set(err, QD_ENOMEM, "out of memory");
    if (!rc) {
        cJSON_AddNumberToObject(meta, "k", (double)h->k);
        cJSON_AddNumberToObject(meta, "n_seen", (double)h->n_seen);
        cJSON_AddBoolToObject(meta, "bf16", h->bf16);
        char name[64];
        qd_qpart_name_hessian(name, sizeof name, block, group);
        qd_part_arr a = {"h", host, kk * sizeof(float)};
        rc = qd_part_file_write(dirfd, name, meta, &a, 1, NULL, err);
    }
    cJSON_Delete(meta);
    if (host != h->h) free(host);
    return rc;
}

/* The result's numbers travel as doubles in an array (exact), its strings in the meta. */
enum { R_DAMP, R_FALLBACK, R_SECONDS, R_REL, R_REL_DIRECT, R_KCHECKED, R_KMAX, R_ROUTED, R_BLOCK, R_N, R_K, R_COUNT };

static void res_pack(const qd_layer_result *r, double *v)
{
    v[R_DAMP] = r->damp; v[R_FALLBACK] = r->fallback; v[R_SECONDS] = r->seconds; v[R_REL] = r->rel_error;
    v[R_REL_DIRECT] = r->rel_error_direct; v[R_KCHECKED] = r->kernel_checked; v[R_KMAX] = r->kernel_max_err;
    v[R_ROUTED] = (double)r->routed_tokens; v[R_BLOCK] = r->block; v[R_N] = (double)r->n; v[R_K] = (double)r->k;
}

static void res_unpack(qd_layer_result *r, const double *v)
{
    r->damp = v[R_DAMP]; r->fallback = (int)v[R_FALLBACK]; r->seconds = v[R_SECONDS]; r->rel_error = v[R_REL];
    r->rel_error_direct = v[R_REL_DIRECT]; r->kernel_checked = (int)v[R_KCHECKED]; r->kernel_max_err = v[R_KMAX];
    r->routed_tokens = (int64_t)v[R_ROUTED]; r->block = (int)v[R_BLOCK]; r->n = (int64_t)v[R_N]; r->k = (int64_t)v[R_K];
}

static void res_strings_put(cJSON *meta, const qd_layer_result *r)
{
    cJSON_AddStringToObject(meta, "name", r->name);
    cJSON_AddStringToObject(meta, "method", r->method);
    cJSON_AddStringToObject(meta, "note", r->note);
}

static int res_strings_get(const cJSON *meta, qd_layer_result *r, qd_err *err)
{
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(meta, "name");
    const cJSON *me = cJSON_GetObjectItemCaseSensitive(meta, "method");
    const cJSON *no = cJSON_GetObjectItemCaseSensitive(meta, "note");
    if (!cJSON_IsString(nm) || !cJSON_IsString(me) || !cJSON_IsString(no))
        return qd_err_set(err, QD_EFORMAT, "part file: name, method or note missing");
    snprintf(r->name, sizeof r->name, "%s", nm->valuestring);
    snprintf(r->method, sizeof r->method, "%s", me->valuestring);
    snprintf(r->note, sizeof r->note, "%s", no->valuestring);
    return 0;
}

static int64_t meta_int(const cJSON *meta, const char *key, int64_t dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(meta, key);
    return cJSON_IsNumber(v) ? (int64_t)v->valuedouble : dflt;
}

int qd_qpart_write_in(int dirfd, int block, int index, int group, const qd_qpart_in *in, int64_t n, int64_t k,
                      uint64_t *checksum, qd_err *err)
{
    cJSON *meta = cJSON_CreateObject();
    if (!meta) return qd_err_set(err, QD_ENOMEM, "out of memory");
    char hname[64], name[64];
    qd_qpart_name_hessian(hname, sizeof hname, block, group);
    qd_qpart_name_in(name, sizeof name, block, index);
    cJSON_AddStringToObject(meta, "step", "quantize");
    cJSON_AddNumberToObject(meta, "index", index);
    cJSON_AddNumberToObject(meta, "linear", in->linear);
    cJSON_AddNumberToObject(meta, "gptq", in->gptq);
    cJSON_AddNumberToObject(meta, "use_losses", in->use_losses);
    cJSON_AddNumberToObject(meta, "krows", (double)(in->kx ? in->krows : 0));
    cJSON_AddNumberToObject(meta, "drows", (double)(in->dx ? in->drows : 0));
    cJSON_AddStringToObject(meta, "hessian", hname);
    res_strings_put(meta, &in->res);
    double rv[R_COUNT];
    res_pack(&in->res, rv);
    size_t nk = (size_t)(n * k) * sizeof(float);
    qd_part_arr a[6];
    int na = 0;
    a[na++] = (qd_part_arr){"res", rv, sizeof rv};
    a[na++] = (qd_part_arr){"w", in->w, nk};
    if (in->w_ref != in->w) a[na++] = (qd_part_arr){"w_ref", in->w_ref, nk};
    if (in->bias) a[na++] = (qd_part_arr){"bias", in->bias, (size_t)n * sizeof(float)};
    if (in->kx && in->krows > 0) a[na++] = (qd_part_arr){"kx", in->kx, (size_t)(in->krows * k) * sizeof(float)};
    if (in->dx && in->drows > 0) a[na++] = (qd_part_arr){"dx", in->dx, (size_t)(in->drows * k) * sizeof(float)};
    int rc = qd_part_file_write(dirfd, name, meta, a, na, checksum, err);
    cJSON_Delete(meta);
    return rc;
}

static int packed_arrays(const qd_packed *pk, qd_part_arr *a)
{
    int na = 0;
    a[na++] = (qd_part_arr){"qweight", pk->qweight, (size_t)(pk->qweight_shape[0] * pk->qweight_shape[1]) * 4};
    if (pk->qzeros) a[na++] = (qd_part_arr){"qzeros", pk->qzeros, (size_t)(pk->qzeros_shape[0] * pk->qzeros_shape[1]) * 4};
    a[na++] = (qd_part_arr){"scales", pk->scales, (size_t)(pk->scales_shape[0] * pk->scales_shape[1]) * 2};
    if (pk->g_idx) a[na++] = (qd_part_arr){"g_idx", pk->g_idx, (size_t)pk->g_idx_len * 4};
    if (pk->bias) a[na++] = (qd_part_arr){"pbias", pk->bias, (size_t)pk->bias_len * 2};
    return na;
}

static void packed_meta_put(cJSON *meta, const qd_packed *pk)
{
    double v[] = {(double)pk->n, (double)pk->k, pk->bits, (double)pk->group_size, (double)pk->n_groups, pk->sym,
                  (double)pk->qweight_shape[0], (double)pk->qweight_shape[1], (double)pk->qzeros_shape[0],
                  (double)pk->qzeros_shape[1], (double)pk->scales_shape[0], (double)pk->scales_shape[1],
                  (double)pk->g_idx_len, (double)pk->bias_len, pk->qzeros != NULL, pk->g_idx != NULL, pk->bias != NULL};
    cJSON_AddItemToObject(meta, "packed", cJSON_CreateDoubleArray(v, (int)(sizeof v / sizeof v[0])));
}

/* A copy of f's array `name` of `bytes` into a malloc'd buffer. */
static void *arr_dup(const qd_part_file *f, const char *name, uint64_t bytes, int *rc, qd_err *err)
{
    if (*rc) return NULL;
    const void *src = qd_part_file_arr(f, name, bytes, err);
    void *dst = src ? malloc(bytes ? bytes : 1) : NULL;
    if (!src) *rc = QD_EFORMAT;
    else if (!dst) *rc = qd_err_set(err, QD_ENOMEM, "out of memory");
    else memcpy(dst, src, bytes);
    return dst;
}

static int packed_meta_get(const qd_part_file *f, qd_packed *pk, qd_err *err)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(f->meta, "packed");
    double v[17];
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != 17) return qd_err_set(err, QD_EFORMAT, "part file: no packed layer");
    for (int i = 0; i < 17; i++) {
        const cJSON *x = cJSON_GetArrayItem(a, i);
        if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > 1e12)
            return qd_err_set(err, QD_EFORMAT, "part file: packed layer field %d out of range", i);
        v[i] = x->valuedouble;
    }
    memset(pk, 0, sizeof *pk);
    pk->n = (int64_t)v[0]; pk->k = (int64_t)v[1]; pk->bits = (int)v[2]; pk->group_size = (int64_t)v[3];
    pk->n_groups = (int64_t)v[4]; pk->sym = (int)v[5];
    pk->qweight_shape[0] = (int64_t)v[6]; pk->qweight_shape[1] = (int64_t)v[7];
    pk->qzeros_shape[0] = (int64_t)v[8]; pk->qzeros_shape[1] = (int64_t)v[9];
    pk->scales_shape[0] = (int64_t)v[10]; pk->scales_shape[1] = (int64_t)v[11];
    pk->g_idx_len = (int64_t)v[12]; pk->bias_len = (int64_t)v[13];
    int rc = 0;
    pk->qweight = arr_dup(f, "qweight", (uint64_t)(pk->qweight_shape[0] * pk->qweight_shape[1]) * 4, &rc, err);
    if (v[14]) pk->qzeros = arr_dup(f, "qzeros", (uint64_t)(pk->qzeros_shape[0] * pk->qzeros_shape[1]) * 4, &rc, err);
    pk->scales = arr_dup(f, "scales", (uint64_t)(pk->scales_shape[0] * pk->scales_shape[1]) * 2, &rc, err);
    if (v[15]) pk->g_idx = arr_dup(f, "g_idx", (uint64_t)pk->g_idx_len * 4, &rc, err);
    if (v[16]) pk->bias = arr_dup(f, "pbias", (uint64_t)pk->bias_len * 2, &rc, err);
    if (rc) qd_packed_free(pk);
    return rc;
}

/* Writes part `index`'s output, computed from the input whose checksum is in_sum. */
static int write_out(int dirfd, int block, int index, uint64_t in_sum, const qd_qpart_out *o, const char *worker,
                     qd_err *err)
{
    cJSON *meta = cJSON_CreateObject();
    if (!meta) return qd_err_set(err, QD_ENOMEM, "out of memory");
    char name[64], sum[24];
    qd_qpart_name_out(name, sizeof name, block, index);
    snprintf(sum, sizeof sum, "%016llx", (unsigned long long)in_sum);
    cJSON_AddStringToObject(meta, "in_checksum", sum);
    cJSON_AddStringToObject(meta, "worker", worker ? worker : "local");
    res_strings_put(meta, &o->res);
    packed_meta_put(meta, &o->packed);
    double rv[R_COUNT];
    res_pack(&o->res, rv);
    qd_part_arr a[8];
    int na = 0;
    a[na++] = (qd_part_arr){"res", rv, sizeof rv};
    a[na++] = (qd_part_arr){"stage", o->stage, sizeof o->stage};
    a[na++] = (qd_part_arr){"q", o->dq.w, (size_t)(o->res.n * o->res.k) * sizeof(float)};
    na += packed_arrays(&o->packed, a + na);
    int rc = qd_part_file_write(dirfd, name, meta, a, na, NULL, err);
    cJSON_Delete(meta);
    return rc;
}

int qd_qpart_read_out(qd_pipeline *p, int dirfd, int block, int index, uint64_t in_checksum, int64_t n, int64_t k,
                      qd_qpart_out *out, char *worker, qd_err *err)
{
    (void)p;
    memset(out, 0, sizeof *out);
    char name[64], sum[24];
    qd_qpart_name_out(name, sizeof name, block, index);
    snprintf(sum, sizeof sum, "%016llx", (unsigned long long)in_checksum);
    qd_part_file f;
    int rc = qd_part_file_read(dirfd, name, &f, err);
    if (rc) return rc;
    const cJSON *ic = cJSON_GetObjectItemCaseSensitive(f.meta, "in_checksum");
    const cJSON *wk = cJSON_GetObjectItemCaseSensitive(f.meta, "worker");
    if (!cJSON_IsString(ic) || strcmp(ic->valuestring, sum))
        rc = qd_err_set(err, QD_EFORMAT, "part file %s: computed from another input", name);
    if (!rc) rc = res_strings_get(f.meta, &out->res, err);
    const double *rv = rc ? NULL : qd_part_file_arr(&f, "res", R_COUNT * sizeof(double), err);
    const void *st = rc || !rv ? NULL : qd_part_file_arr(&f, "stage", sizeof out->stage, err);
    if (!rc && (!rv || !st)) rc = QD_EFORMAT;
    if (!rc) {
        res_unpack(&out->res, rv);
        memcpy(out->stage, st, sizeof out->stage);
        if (out->res.n != n || out->res.k != k)
            rc = qd_err_set(err, QD_EFORMAT, "part file %s: shape [%lld, %lld], expected [%lld, %lld]", name,
                            (long long)out->res.n, (long long)out->res.k, (long long)n, (long long)k);
    }
    if (!rc) out->dq.w = arr_dup(&f, "q", (uint64_t)(n * k) * sizeof(float), &rc, err);
    if (!rc) rc = packed_meta_get(&f, &out->packed, err);
    if (!rc && (out->packed.n != n || out->packed.k != k))
        rc = qd_err_set(err, QD_EFORMAT, "part file %s: packed shape differs", name);
    if (!rc) snprintf(worker, 64, "%s", cJSON_IsString(wk) ? wk->valuestring : "?");
    qd_part_file_free(&f);
    if (rc) qd_qpart_out_free(out);
    return rc;
}

/* ---- a part run by any worker ---- */

/* Reads the Hessian file `name` into a fresh accumulator on be. */
static int read_hessian(int dirfd, const char *name, qd_backend *be, int64_t k, qd_gptq_hessian *h, qd_err *err)
{
    qd_part_file f;
    int rc = qd_part_file_read(dirfd, name, &f, err);
    if (rc) return rc;
    size_t kk = (size_t)(k * k) * sizeof(float);
    const float *src = qd_part_file_arr(&f, "h", kk, err);
    if (!src || meta_int(f.meta, "k", -1) != k) rc = src ? qd_err_set(err, QD_EFORMAT, "part file %s: not a [%lld, %lld] Hessian", name, (long long)k, (long long)k) : QD_EFORMAT;
    if (!rc) rc = qd_gptq_hessian_init(h, be, k, err);
    if (!rc) {
        h->n_seen = meta_int(f.meta, "n_seen", 0);
        h->bf16 = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(f.meta, "bf16"));
        if (be->device < 0) memcpy(h->h, src, kk);
        else if (qd_backend_upload(be, h->h, src, kk)) rc = qd_err_set(err, QD_EBACKEND, "Hessian: %s", be->err.msg);
    }
    qd_part_file_free(&f);
    return rc;
}

/* The job's output/.quantd/parts, opened beneath the allowed roots. */
static int parts_dir_open(const qp_job *job, int *fd, qd_err *err)
{
    int out_fd = -1, ck_fd = -1;
    char shown[4200];
    int rc = qd_confine_dir_open(job->output, 0, &out_fd, NULL, err);
    snprintf(shown, sizeof shown, "%s/.quantd", job->output);
    if (!rc) rc = qd_confine_subdir_open(out_fd, ".quantd", 0, &ck_fd, NULL, shown, err);
    snprintf(shown, sizeof shown, "%s/.quantd/parts", job->output);
    if (!rc) rc = qd_confine_subdir_open(ck_fd, "parts", 0, fd, NULL, shown, err);
    if (out_fd >= 0) close(out_fd);
    if (ck_fd >= 0) close(ck_fd);
    return rc;
}

int qd_qpart_run_file(qd_pipeline *p, int dirfd, int block, int index, const char *worker, qd_err *err)
{
    char name[64];
    qd_qpart_name_in(name, sizeof name, block, index);
    qd_part_file f;
    int rc = qd_part_file_read(dirfd, name, &f, err);
    if (rc) return rc;
    qd_qpart_in in;
    memset(&in, 0, sizeof in);
    qd_gptq_hessian h;
    memset(&h, 0, sizeof h);
    qd_qpart_out out;
    memset(&out, 0, sizeof out);
    const double *rv = qd_part_file_arr(&f, "res", R_COUNT * sizeof(double), err);
    rc = rv ? res_strings_get(f.meta, &in.res, err) : QD_EFORMAT;
    if (!rc) {
        res_unpack(&in.res, rv);
        int64_t n = in.res.n, k = in.res.k;
        if (n <= 0 || k <= 0 || n > (1 << 24) || k > (1 << 24)) rc = qd_err_set(err, QD_EFORMAT, "part file %s: bad shape", name);
        in.linear = (int)meta_int(f.meta, "linear", -1);
        in.gptq = (int)meta_int(f.meta, "gptq", 0);
        in.use_losses = (int)meta_int(f.meta, "use_losses", 0);
        in.krows = meta_int(f.meta, "krows", 0);
        in.drows = meta_int(f.meta, "drows", 0);
        size_t nk = (size_t)(n * k) * sizeof(float);
        if (!rc) in.w = qd_part_file_arr(&f, "w", nk, err);
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(f.meta, "arrays");
        in.w_ref = cJSON_HasObjectItem(a, "w_ref") ? qd_part_file_arr(&f, "w_ref", nk, err) : in.w;
        if (cJSON_HasObjectItem(a, "bias")) in.bias = qd_part_file_arr(&f, "bias", (size_t)n * sizeof(float), err);
        if (in.krows > 0) in.kx = qd_part_file_arr(&f, "kx", (size_t)(in.krows * k) * sizeof(float), err);
        if (in.drows > 0) in.dx = qd_part_file_arr(&f, "dx", (size_t)(in.drows * k) * sizeof(float), err);
        if (!rc && (!in.w || !in.w_ref || (cJSON_HasObjectItem(a, "bias") && !in.bias) || (in.krows > 0 && !in.kx) ||
                    (in.drows > 0 && !in.dx)))
            rc = QD_EFORMAT;
        const cJSON *hn = cJSON_GetObjectItemCaseSensitive(f.meta, "hessian");
        if (!rc && (!cJSON_IsString(hn) || strchr(hn->valuestring, '/')))
            rc = qd_err_set(err, QD_EFORMAT, "part file %s: no Hessian named", name);
        if (!rc) rc = read_hessian(dirfd, hn->valuestring, p->be, k, &h, err);
    }
    in.h = &h;
    if (!rc) rc = qd_qpart_compute(p, &in, NULL, &out, err);
    if (!rc) rc = write_out(dirfd, block, index, f.checksum, &out, worker, err);
    qd_qpart_out_free(&out);
    qd_gptq_hessian_free(&h);
    qd_part_file_free(&f);
    return rc;
}

int qd_pipeline_part_run(const qp_job *job, qd_backend *be, int block, const char *step, int index,
                         const char *worker, double *seconds, qd_err *err)
{
    double t0 = qd_clock_now_s();
    if (seconds) *seconds = 0;
    if (!step || strcmp(step, "quantize"))
        return qd_err_set(err, QD_EINVAL, "part step \"%s\" is not one this build runs (quantize)", step ? step : "");
    if (block < 0 || index < 0) return qd_err_set(err, QD_EINVAL, "part %d of block %d: out of range", index, block);
    qd_pipeline *p = calloc(1, sizeof *p);
    if (!p) return qd_err_set(err, QD_ENOMEM, "out of memory");
    p->job = job;
    p->be = be;
    p->out_fd = p->ckpt_fd = p->parts_fd = -1;
    int dirfd = -1;
    int rc = qd_pipeline_quant_setup(p, err);
    if (!rc) rc = parts_dir_open(job, &dirfd, err);
    if (!rc) {
        /* An output already there for this very input (an earlier attempt's) is kept; the
         * lead checks it whole when it reads it, and computes it itself if it is damaged. */
        char in_name[64], out_name[64], sum[24];
        qd_qpart_name_in(in_name, sizeof in_name, block, index);
        qd_qpart_name_out(out_name, sizeof out_name, block, index);
        snprintf(sum, sizeof sum, "%016llx", (unsigned long long)qd_part_file_checksum(dirfd, in_name));
        cJSON *meta = qd_part_file_meta(dirfd, out_name);
        const cJSON *ic = cJSON_GetObjectItemCaseSensitive(meta, "in_checksum");
        int have = cJSON_IsString(ic) && !strcmp(ic->valuestring, sum);
        cJSON_Delete(meta);
        if (have) {
            QD_LOG(QD_LOG_INFO, "part_kept", "job=%s block=%d step=%s part=%d", job->id, block, step, index);
            close(dirfd);
            free(p);
            return 0;
        }
        rc = qd_qpart_run_file(p, dirfd, block, index, worker, err);
    }
    if (dirfd >= 0) close(dirfd);
    free(p);
    if (seconds) *seconds = qd_clock_now_s() - t0;
    if (!rc) QD_LOG(QD_LOG_INFO, "part_done", "job=%s block=%d step=%s part=%d worker=%s seconds=%.3f", job->id, block,
                    step, index, worker ? worker : "local", qd_clock_now_s() - t0);
    return rc;
}
