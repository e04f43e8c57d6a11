/* The quantize step's parts (part.h): one linear's quantization, packing, error and kernel
 * check, computed where the lead is or in another worker from the files the lead wrote. */
#define _GNU_SOURCE
#include "quant/pipeline/part.h"
#include "quant/formats/scheme.h"
#include "quant/formats/quantizer.h"

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

int qd_qpart_row_ranges(int64_t n, int64_t *starts, int max)
{
    int P = (int)((n + QD_PART_ROWS - 1) / QD_PART_ROWS);
    if (P < 1) P = 1;
    if (P > max) P = max;
    int64_t rows = (n + P - 1) / P;
    if (P > 1) rows = (rows + 63) / 64 * 64;
    int i = 0;
    for (int64_t r = 0; r < n && i < P; r += rows) starts[i++] = r;
    starts[i] = n;
    return i;
}

void qd_qpart_out_free(qd_qpart_out *o)
{
    if (!o) return;
    qd_qlayer_free(&o->layer);
    qd_deq_free(&o->dq);
}

void qd_qlinear_free(qd_qlinear *l)
{
    if (!l) return;
    qd_packed_free(&l->packed);
    qd_deq_free(&l->dq);
}

static double stage_add(double *stage, qd_stage s, double t0)
{
    double t = qd_clock_now_s();
    stage[s] += t - t0;
    return t;
}

int qd_qpart_compute(qd_pipeline *p, const qd_qpart_in *in, qd_gptq_shared *shared, qd_qpart_out *out,
                     qd_err *err)
{
    memset(out, 0, sizeof *out);
    out->res = in->res;
    qd_layer_result *res = &out->res;
    int64_t rows = in->r1 - in->r0, k = res->k;
    double h_err;
    double t = qd_clock_now_s();
    qd_quant_cfg qc = p->qcfg;
    if (in->bits > 0) {
        qc.bits = in->bits;
        qc.group_size = in->group_size;
    }
    int rc = in->gptq && in->dxx
                 ? qd_pipeline_quantize_weight_gptaq(p, &qc, in->global_scale, in->w, rows, k, in->h, in->dxx,
                                                     &out->layer, &out->dq, res, &h_err, err)
                 : qd_pipeline_quantize_weight(p, &qc, in->gptq, in->global_scale, in->w, rows, k, in->h, shared,
                                               &out->layer, &out->dq, res, &h_err, err);
    /* The group's last part: its factor's memory goes back before the error's buffers are
     * taken (the peak stays one k x k buffer at a time, as unshared). */
    if (shared && in->shared_last) qd_gptq_shared_free(shared);
    t = stage_add(out->stage, QD_STAGE_QUANTIZE, t);
    if (rc) return qd_err_prefix(err, "%s", res->name);
    /* The error is measured against the weight before clipping (clipping is part of the
     * quantization error); GPTQ's own losses give its numerator when GPTQ saw that weight. */
    rc = qd_pipeline_rel_traces_den(p, in->w_ref, out->dq.w, rows, k, in->h, in->use_losses ? h_err : -1.0,
                                    in->den_known ? in->den : -1.0, out->trace, err);
    stage_add(out->stage, QD_STAGE_ERROR, t);
    return rc;
}

/* The P parts' rows in one layer and one weight (P > 1). */
static int merge_rows(const qd_qpart_in *ins, qd_qpart_out *outs, int P, int64_t n, int64_t k, qd_qlayer *l,
                      float **q, qd_err *err)
{
    const qd_qlayer *f = &outs[0].layer;
    int rc = qd_qlayer_alloc(l, n, k, f->bits, f->sym, f->group_size, 0, err);
    *q = rc ? NULL : malloc((size_t)(n * k) * sizeof(float));
    if (!rc && !*q) rc = qd_err_set(err, QD_ENOMEM, "out of memory for a [%lld, %lld] layer", (long long)n, (long long)k);
    if (!rc && l->n_groups != f->n_groups) rc = qd_err_set(err, QD_EINVAL, "parts: %lld groups, expected %lld",
                                                           (long long)f->n_groups, (long long)l->n_groups);
    if (rc) { qd_qlayer_free(l); free(*q); *q = NULL; return rc; }
    memcpy(l->g_idx, f->g_idx, (size_t)k * sizeof *l->g_idx);
    l->grid = f->grid;
    l->scale_rule = f->scale_rule;
    l->global_scale = f->global_scale;
    l->row_block = f->row_block;
    for (int i = 0; i < P; i++) {
        const qd_qlayer *s = &outs[i].layer;
        int64_t r0 = ins[i].r0, rows = ins[i].r1 - ins[i].r0;
        if (s->n != rows || s->k != k || s->n_groups != l->n_groups || memcmp(s->g_idx, l->g_idx, (size_t)k * sizeof *l->g_idx)) {
            qd_qlayer_free(l); free(*q); *q = NULL;
            return qd_err_set(err, QD_EINVAL, "part %d of %s: its rows do not fit the others", i, ins[0].res.name);
        }
        memcpy(l->q + r0 * k, s->q, (size_t)(rows * k));
        memcpy(*q + r0 * k, outs[i].dq.w, (size_t)(rows * k) * sizeof(float));
        for (int64_t g = 0; g < l->n_groups; g++) {
            memcpy(l->scales + g * n + r0, s->scales + g * rows, (size_t)rows * sizeof(float));
            memcpy(l->zeros + g * n + r0, s->zeros + g * rows, (size_t)rows * sizeof(int32_t));
        }
    }
    return 0;
}

int qd_qpart_finish(qd_pipeline *p, const qd_qpart_in *ins, qd_qpart_out *outs, int P, const qd_qlinear_aux *aux,
                    qd_qlinear *done, qd_err *err)
{
    memset(done, 0, sizeof *done);
    const qp_job *job = p->job;
    qd_layer_result *res = &done->res;
    *res = outs[0].res;
    int64_t n = res->n, k = res->k;
    double t = qd_clock_now_s();
    qd_qlayer layer;
    memset(&layer, 0, sizeof layer);
    int rc = 0;
    double num = outs[0].trace[0], den = outs[0].trace[1];
    if (P == 1) {
        layer = outs[0].layer;
        memset(&outs[0].layer, 0, sizeof outs[0].layer);
        done->dq = outs[0].dq;
        memset(&outs[0].dq, 0, sizeof outs[0].dq);
    } else {
        /* Each part's traces carry its rows' 2 / rows: back to plain sums before adding. */
        num = den = 0;
        res->seconds = 0;
        for (int i = 0; i < P; i++) {
            double half = (double)(ins[i].r1 - ins[i].r0) / 2.0;
            num += outs[i].trace[0] * half;
            den += outs[i].trace[1] * half;
            res->seconds += outs[i].res.seconds;
            if (outs[i].res.damp > res->damp) res->damp = outs[i].res.damp;
            res->fallback |= outs[i].res.fallback;
            if (!res->note[0] && outs[i].res.note[0]) snprintf(res->note, sizeof res->note, "%s", outs[i].res.note);
        }
        rc = merge_rows(ins, outs, P, n, k, &layer, &done->dq.w, err);
    }
    if (!rc && aux->bias) {
        layer.bias = malloc((size_t)n * sizeof(float));
        if (!layer.bias) rc = qd_err_set(err, QD_ENOMEM, "out of memory");
        else memcpy(layer.bias, aux->bias, (size_t)n * sizeof(float));
    }
    if (!rc) rc = p->fmt->pack(&layer, &done->packed, err);   /* checks the layer first */
    /* A scheme's static activation scale, from the calibration inputs' range, as
     * compressed-tensors' static_minmax observer makes it: FP8 input_scale = amax / 448,
     * NVFP4 input_global_scale = 448 * 6 / amax. */
    const qd_scheme *sc = qp_job_scheme(job);
    if (!rc && sc && sc->act == QD_ACT_FP8_TENSOR)
        done->packed.input_scale = aux->act_amax > 0.0f ? aux->act_amax / QD_FP8_E4M3_MAX : 1.0f;
    if (!rc && sc && sc->act == QD_ACT_NVFP4) done->packed.input_scale = qd_quant_global_scale(aux->act_amax);
    qd_qlayer_free(&layer);
    t = qd_pipeline_cost_add(p, QD_STAGE_PACK, t);
    if (rc) return qd_err_prefix(err, "%s", res->name);
    res->rel_error = qd_pipeline_rel_ratio(num, den);
    if (!isfinite(res->rel_error)) return qd_err_set(err, QD_ENUMERIC, "%s: quantization error is not finite", res->name);
    if (aux->dx && aux->drows > 0) {
        rc = qd_pipeline_rel_error_direct(p, aux->w_ref, done->dq.w, n, k, aux->dx, aux->drows, &res->rel_error_direct, err);
        t = qd_pipeline_cost_add(p, QD_STAGE_ERROR, t);
        if (rc) return qd_err_prefix(err, "%s: direct error", res->name);
    }
    if (job->kernel_check && aux->kx && aux->krows > 0) {
        /* The packed weights through the dequantizing kernel vs the float matmul of the
         * quantizer's Q (what they must decode to), on real inputs of this layer. */
        rc = qd_kernel_check_layer(p->be, p->fmt, &done->packed, done->dq.w, aux->kx, aux->krows, &res->kernel_max_err, err);
        qd_pipeline_cost_add(p, QD_STAGE_KERNEL_CHECK, t);
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

void qd_qpart_name_out(char *buf, size_t cap, int block, int index, uint64_t in_checksum, const char *maker)
{
    snprintf(buf, cap, "b%04d-quantize-%04d-%016llx-%08llx.out.part", block, index, (unsigned long long)in_checksum,
             (unsigned long long)qd_part_maker_hash(maker));
}

const float *qd_part_host_view(qd_backend *be, const float *buf, size_t bytes, float **own)
{
    *own = NULL;
    if (be->device < 0) return buf;
    *own = malloc(bytes);
    if (*own && qd_backend_download(be, *own, buf, bytes)) { free(*own); *own = NULL; }
    return *own;
}

int qd_qpart_write_hessian(int dirfd, int block, int group, const qd_gptq_hessian *h, const qd_gptq_shared *sh,
                           qd_err *err)
{
    size_t kk = (size_t)(h->k * h->k) * sizeof(float);
    float *own_h = NULL;
    const float *hh = qd_part_host_view(h->be, h->h, kk, &own_h);
    cJSON *meta = cJSON_CreateObject();
    qd_part_farr fh_a;
    memset(&fh_a, 0, sizeof fh_a);
    qd_part_factor_w fw;
    memset(&fw, 0, sizeof fw);
    int rc = 0;
    if (!hh || !meta)
        rc = qd_err_set(err, QD_ENOMEM, "out of memory for a [%lld, %lld] Hessian", (long long)h->k, (long long)h->k);
    /* H is symmetric: stored as its upper triangle when the lower is its transpose (checked,
     * bit for bit). */
    if (!rc) rc = qd_part_farr_make("h", hh, (uint64_t)(h->k * h->k), h->k, &fh_a, err);
    if (!rc && qd_part_farr_note(meta, &fh_a)) rc = qd_err_set(err, QD_ENOMEM, "out of memory");
    qd_part_arr a[3] = {fh_a.arr};
    int na = 1;
    if (!rc && sh) rc = qd_part_factor_put(meta, sh, h->k, &fw, a, &na, err);
    if (!rc) {
        cJSON_AddNumberToObject(meta, "k", (double)h->k);
        cJSON_AddNumberToObject(meta, "n_seen", (double)h->n_seen);
        cJSON_AddBoolToObject(meta, "bf16", h->bf16);
        char name[64];
        qd_qpart_name_hessian(name, sizeof name, block, group);
        rc = qd_part_file_write(dirfd, name, meta, a, na, NULL, err);
    }
    qd_part_farr_free(&fh_a);
    qd_part_factor_w_free(&fw);
    cJSON_Delete(meta);
    free(own_h);
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

int qd_qpart_write_in(int dirfd, int block, int index, int group, const qd_qpart_in *in, uint64_t *checksum,
                      qd_err *err)
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
    cJSON_AddNumberToObject(meta, "r0", (double)in->r0);
    cJSON_AddNumberToObject(meta, "r1", (double)in->r1);
    if (in->global_scale != 0.0f) cJSON_AddNumberToObject(meta, "global_scale", (double)in->global_scale);
    if (in->bits > 0) {   /* job.target_bpw's choice for the linear */
        cJSON_AddNumberToObject(meta, "bits", in->bits);
        cJSON_AddNumberToObject(meta, "group_size", (double)in->group_size);
    }
    cJSON_AddStringToObject(meta, "hessian", hname);
    if (in->fac) {   /* the group's factor, made by a factor part */
        char fsum[24];
        snprintf(fsum, sizeof fsum, "%016llx", (unsigned long long)in->fac->checksum);
        cJSON_AddStringToObject(meta, "factor", in->fac->name);
        cJSON_AddStringToObject(meta, "factor_checksum", fsum);
    }
    res_strings_put(meta, &in->res);
    double rv[R_COUNT];
    res_pack(&in->res, rv);
    uint64_t n = (uint64_t)((in->r1 - in->r0) * in->res.k);
    /* Weights read from a half-precision checkpoint (GPTQ and RTN without AWQ's scales)
     * travel in half precision: exactly the values, in half the bytes. */
    /* Rows the model stores as they are are not written at all: the worker reads them from
     * the model's own files (part_src.c). */
    qd_part_farr w, w_ref;
    memset(&w, 0, sizeof w);
    memset(&w_ref, 0, sizeof w_ref);
    int rc = 0;
    if (in->src) {
        if (qd_qpart_src_note(meta, in)) rc = qd_err_set(err, QD_ENOMEM, "out of memory");
    } else {
        rc = qd_part_farr_make("w", in->w, n, 0, &w, err);
        if (!rc && in->w_ref != in->w) rc = qd_part_farr_make("w_ref", in->w_ref, n, 0, &w_ref, err);
        if (!rc && (qd_part_farr_note(meta, &w) || (in->w_ref != in->w && qd_part_farr_note(meta, &w_ref))))
            rc = qd_err_set(err, QD_ENOMEM, "out of memory");
    }
    /* With its error's denominator a trace part's and its factor a factor part's, GPTQ reads
     * only H's diagonal (qd_gptq_hessian.diag): the part gets that, not the Hessian file. */
    const int64_t k = in->res.k;
    float *hdiag = NULL;
    if (in->den_known && in->use_losses && in->gptq && in->fac && !in->dxx && in->h && in->h->h && in->h->be &&
        in->h->be->device < 0 && in->h->k == k && (hdiag = malloc((size_t)k * sizeof *hdiag))) {
        for (int64_t i = 0; i < k; i++) hdiag[i] = in->h->h[i * k + i];
        cJSON_AddNumberToObject(meta, "n_seen", (double)in->h->n_seen);
    }
    qd_part_arr a[5];
    int na = 0;
    a[na++] = (qd_part_arr){"res", rv, sizeof rv};
    if (in->den_known) a[na++] = (qd_part_arr){"den", &in->den, sizeof in->den};   /* a trace part's */
    if (hdiag) a[na++] = (qd_part_arr){"hdiag", hdiag, (uint64_t)k * sizeof *hdiag};
    if (!in->src) a[na++] = w.arr;
    if (!in->src && in->w_ref != in->w) a[na++] = w_ref.arr;
    if (!rc) rc = qd_part_file_write(dirfd, name, meta, a, na, checksum, err);
    qd_part_farr_free(&w);
    qd_part_farr_free(&w_ref);
    free(hdiag);
    cJSON_Delete(meta);
    return rc;
}

/* The grid fields of a layer travel with its shape: the lead rebuilds the rows' dequantized
 * values from the codes with them. */
enum { L_N, L_K, L_BITS, L_SYM, L_GROUP, L_GROUPS, L_GRID, L_RULE, L_GSCALE, L_ROWBLOCK, L_COUNT };

/* Writes part `index`'s output, computed from the input whose checksum is in_sum. The rows
 * dequantized are left out when decoding the codes (qd_qlayer_dequant_ref) gives them bit
 * for bit, as it does for every grid quantd has: the lead decodes them itself. */
static int write_out(int dirfd, int block, int index, uint64_t in_sum, const qd_qpart_out *o, const char *worker,
                     const char *maker, qd_err *err)
{
    cJSON *meta = cJSON_CreateObject();
    if (!meta) return qd_err_set(err, QD_ENOMEM, "out of memory");
    char name[96], sum[24];
    qd_qpart_name_out(name, sizeof name, block, index, in_sum, maker);
    snprintf(sum, sizeof sum, "%016llx", (unsigned long long)in_sum);
    cJSON_AddStringToObject(meta, "in_checksum", sum);
    cJSON_AddStringToObject(meta, "worker", worker ? worker : "local");
    cJSON_AddStringToObject(meta, "made_by", maker);
    res_strings_put(meta, &o->res);
    const qd_qlayer *l = &o->layer;
    double lv[L_COUNT] = {(double)l->n, (double)l->k, l->bits, l->sym, (double)l->group_size, (double)l->n_groups,
                          l->grid, l->scale_rule, l->global_scale, (double)l->row_block};
    cJSON_AddItemToObject(meta, "layer", cJSON_CreateDoubleArray(lv, L_COUNT));
    double rv[R_COUNT];
    res_pack(&o->res, rv);
    size_t nk = (size_t)(l->n * l->k), gn = (size_t)(l->n_groups * l->n);
    float *dec = malloc((nk ? nk : 1) * sizeof *dec);
    if (!dec) {
        cJSON_Delete(meta);
        return qd_err_set(err, QD_ENOMEM, "out of memory for a [%lld, %lld] part", (long long)l->n, (long long)l->k);
    }
    qd_qlayer_dequant_ref(l, dec);
    int from_codes = !memcmp(dec, o->dq.w, nk * sizeof *dec);
    free(dec);
    cJSON_AddBoolToObject(meta, "dq_from_codes", from_codes);
    qd_part_arr a[] = {
        {"res", rv, sizeof rv},
        {"stage", o->stage, sizeof o->stage},
        {"trace", o->trace, sizeof o->trace},
        {"q", l->q, nk},
        {"scales", l->scales, gn * sizeof(float)},
        {"zeros", l->zeros, gn * sizeof(int32_t)},
        {"g_idx", l->g_idx, (size_t)l->k * sizeof(int32_t)},
        {"dq", o->dq.w, nk * sizeof(float)},
    };
    int n_arr = (int)(sizeof a / sizeof a[0]) - from_codes;
    int rc = qd_part_file_write(dirfd, name, meta, a, n_arr, NULL, err);
    cJSON_Delete(meta);
    return rc;
}

/* A copy of f's array `name` of `bytes` into dst. */
static int arr_copy(const qd_part_file *f, const char *name, void *dst, uint64_t bytes, qd_err *err)
{
    const void *src = qd_part_file_arr(f, name, bytes, err);
    if (!src) return QD_EFORMAT;
    memcpy(dst, src, bytes);
    return 0;
}

int qd_qpart_read_out(int dirfd, int block, int index, uint64_t in_checksum, const qd_backend *be,
                      const qd_qpart_in *in, qd_qpart_out *out, char *worker, qd_err *err)
{
    memset(out, 0, sizeof *out);
    char name[96], sum[24], maker[160];
    qd_part_maker_desc(be, maker, sizeof maker);
    qd_qpart_name_out(name, sizeof name, block, index, in_checksum, maker);
    snprintf(sum, sizeof sum, "%016llx", (unsigned long long)in_checksum);
    qd_part_file f;
    int rc = qd_part_file_read(dirfd, name, &f, err);
    if (rc) return rc;
    const cJSON *ic = cJSON_GetObjectItemCaseSensitive(f.meta, "in_checksum");
    const cJSON *wk = cJSON_GetObjectItemCaseSensitive(f.meta, "worker");
    const cJSON *lv = cJSON_GetObjectItemCaseSensitive(f.meta, "layer");
    int64_t rows = in->r1 - in->r0, k = in->res.k;
    const cJSON *mb = cJSON_GetObjectItemCaseSensitive(f.meta, "made_by");
    if (!cJSON_IsString(ic) || strcmp(ic->valuestring, sum))
        rc = qd_err_set(err, QD_EFORMAT, "part file %s: computed from another input", name);
    else if (!cJSON_IsString(mb) || strcmp(mb->valuestring, maker))
        rc = qd_err_set(err, QD_EFORMAT, "part file %s: made by \"%.150s\", not \"%s\"", name,
                        cJSON_IsString(mb) ? mb->valuestring : "?", maker);
    else if (!cJSON_IsArray(lv) || cJSON_GetArraySize(lv) != L_COUNT)
        rc = qd_err_set(err, QD_EFORMAT, "part file %s: no layer", name);
    double v[L_COUNT] = {0};
    for (int i = 0; !rc && i < L_COUNT; i++) {
        const cJSON *x = cJSON_GetArrayItem(lv, i);
        if (!cJSON_IsNumber(x)) rc = qd_err_set(err, QD_EFORMAT, "part file %s: layer field %d", name, i);
        else v[i] = x->valuedouble;
    }
    /* The shape is the lead's, never the file's: a file of another shape is refused. */
    if (!rc && ((int64_t)v[0] != rows || (int64_t)v[1] != k || v[5] < 1 || v[5] > (double)k))
        rc = qd_err_set(err, QD_EFORMAT, "part file %s: layer [%g, %g], expected [%lld, %lld]", name, v[0], v[1],
                        (long long)rows, (long long)k);
    if (!rc) rc = res_strings_get(f.meta, &out->res, err);
    const double *rv = rc ? NULL : qd_part_file_arr(&f, "res", R_COUNT * sizeof(double), err);
    if (!rc && !rv) rc = QD_EFORMAT;
    if (!rc) {
        res_unpack(&out->res, rv);
        out->res.n = in->res.n;
        out->res.k = k;
        rc = qd_qlayer_alloc(&out->layer, rows, k, (int)v[2], (int)v[3], (int64_t)v[4], 0, err);
    }
    if (!rc && out->layer.n_groups != (int64_t)v[5])
        rc = qd_err_set(err, QD_EFORMAT, "part file %s: %g groups, expected %lld", name, v[5], (long long)out->layer.n_groups);
    if (!rc && (v[L_GRID] < 0 || v[L_GRID] > QD_GRID_FP4_E2M1 || v[L_GRID] != (int)v[L_GRID] || v[L_RULE] < 0 ||
                v[L_RULE] > QD_SCALE_E8M0 || v[L_RULE] != (int)v[L_RULE] || !(v[L_GSCALE] >= 0) || v[L_GSCALE] > 3.4e38 ||
                (v[L_RULE] == QD_SCALE_FP8_GLOBAL && !(v[L_GSCALE] > 0)) || !(v[L_ROWBLOCK] >= -1) ||
                v[L_ROWBLOCK] > (double)(1 << 24) || v[L_ROWBLOCK] != (int64_t)v[L_ROWBLOCK]))
        rc = qd_err_set(err, QD_EFORMAT, "part file %s: layer grid %g, scale rule %g, global scale %g, row block %g", name,
                        v[L_GRID], v[L_RULE], v[L_GSCALE], v[L_ROWBLOCK]);
    if (!rc) {
        out->layer.grid = (qd_grid)v[L_GRID];
        out->layer.scale_rule = (qd_scale_rule)v[L_RULE];
        out->layer.global_scale = (float)v[L_GSCALE];
        out->layer.row_block = (int64_t)v[L_ROWBLOCK];
    }
    int from_codes = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(f.meta, "dq_from_codes"));
    size_t nk = (size_t)(rows * k), gn = (size_t)(out->layer.n_groups * rows);
    if (!rc && !(out->dq.w = malloc(nk * sizeof(float)))) rc = qd_err_set(err, QD_ENOMEM, "out of memory");
    if (!rc) rc = arr_copy(&f, "stage", out->stage, sizeof out->stage, err);
    if (!rc) rc = arr_copy(&f, "trace", out->trace, sizeof out->trace, err);
    if (!rc) rc = arr_copy(&f, "q", out->layer.q, nk, err);
    if (!rc) rc = arr_copy(&f, "scales", out->layer.scales, gn * sizeof(float), err);
    if (!rc) rc = arr_copy(&f, "zeros", out->layer.zeros, gn * sizeof(int32_t), err);
    if (!rc) rc = arr_copy(&f, "g_idx", out->layer.g_idx, (size_t)k * sizeof(int32_t), err);
    /* Every column's group must be one of the layer's: the codes are decoded by it below. */
    for (int64_t c = 0; !rc && c < k; c++)
        if (out->layer.g_idx[c] < 0 || out->layer.g_idx[c] >= out->layer.n_groups)
            rc = qd_err_set(err, QD_EFORMAT, "part file %s: column %lld in group %d of %lld", name, (long long)c,
                            (int)out->layer.g_idx[c], (long long)out->layer.n_groups);
    if (!rc && !from_codes) rc = arr_copy(&f, "dq", out->dq.w, nk * sizeof(float), err);
    if (!rc && from_codes) qd_qlayer_dequant_ref(&out->layer, out->dq.w);   /* the worker checked it gives its bits */
    if (!rc) snprintf(worker, 64, "%s", cJSON_IsString(wk) ? wk->valuestring : "?");
    qd_part_file_free(&f);
    if (rc) qd_qpart_out_free(out);
    return rc;
}

/* ---- a part run by any worker ---- */

/* Reads the Hessian file `name` into a fresh accumulator on be, and its factorisation, when
 * the file has one, into *sh keyed to it. */
int qd_qpart_read_hessian(int dirfd, const char *name, uint64_t want_sum, const char *fac_name, uint64_t fac_sum,
                          qd_backend *be, int64_t k, qd_gptq_hessian *h, qd_gptq_shared *sh, qd_err *err)
{
    qd_part_file f;
    int rc = qd_part_file_read(dirfd, name, &f, err);
    if (rc) return rc;
    size_t kk = (size_t)(k * k) * sizeof(float);
    if (want_sum && f.checksum != want_sum)
        rc = qd_err_set(err, QD_EFORMAT, "part file %s: not the Hessian the part was made for (checksum)", name);
    else if (meta_int(f.meta, "k", -1) != k)
        rc = qd_err_set(err, QD_EFORMAT, "part file %s: not a [%lld, %lld] Hessian", name, (long long)k, (long long)k);
    if (!rc) rc = qd_gptq_hessian_init(h, be, k, err);
    /* On the CPU the accumulator is host memory and takes the decoded H directly. */
    float *tmp = !rc && be->device >= 0 ? malloc(kk) : NULL;
    if (!rc && be->device >= 0 && !tmp) rc = qd_err_set(err, QD_ENOMEM, "part file %s: out of memory", name);
    if (!rc) {
        h->n_seen = meta_int(f.meta, "n_seen", 0);
        h->bf16 = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(f.meta, "bf16"));
        rc = qd_part_farr_read(&f, "h", tmp ? tmp : h->h, (uint64_t)(k * k), k, err);
        if (!rc && tmp && qd_backend_upload(be, h->h, tmp, kk)) rc = qd_err_set(err, QD_EBACKEND, "Hessian: %s", be->err.msg);
    }
    free(tmp);
    if (!rc && sh && fac_name) {
        rc = qd_qpart_read_factor(dirfd, fac_name, fac_sum, be, h, sh, err);
    } else if (!rc && sh && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(f.meta, "factor"))) {
        rc = qd_part_factor_get(&f, name, be, h, sh, err);
    }
    qd_part_file_free(&f);
    return rc;
}

int qd_qpart_read_factor(int dirfd, const char *fac_name, uint64_t fac_sum, qd_backend *be, const qd_gptq_hessian *h,
                         qd_gptq_shared *sh, qd_err *err)
{
    /* The factor part's output: whole, the very file the lead checked. */
    qd_part_file ff;
    memset(&ff, 0, sizeof ff);
    int rc = qd_part_file_read(dirfd, fac_name, &ff, err);
    if (!rc && ff.checksum != fac_sum)
        rc = qd_err_set(err, QD_EFORMAT, "part file %s: not the factorisation the lead checked (checksum)", fac_name);
    if (!rc) rc = qd_part_factor_get(&ff, fac_name, be, h, sh, err);
    qd_part_file_free(&ff);
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
    qd_gptq_shared shared;
    memset(&shared, 0, sizeof shared);
    qd_qpart_out out;
    memset(&out, 0, sizeof out);
    float *w = NULL, *w_ref = NULL, *hdiag = NULL;   /* the rows decoded; H's diagonal alone */
    const double *rv = qd_part_file_arr(&f, "res", R_COUNT * sizeof(double), err);
    rc = rv ? res_strings_get(f.meta, &in.res, err) : QD_EFORMAT;
    if (!rc) {
        res_unpack(&in.res, rv);
        in.linear = (int)meta_int(f.meta, "linear", -1);
        in.gptq = (int)meta_int(f.meta, "gptq", 0);
        in.use_losses = (int)meta_int(f.meta, "use_losses", 0);
        in.r0 = meta_int(f.meta, "r0", -1);
        in.r1 = meta_int(f.meta, "r1", -1);
        in.bits = (int)meta_int(f.meta, "bits", 0);
        in.group_size = meta_int(f.meta, "group_size", 0);
        if (in.bits < 0 || in.bits > 8 || (in.bits > 0 && (in.group_size == 0 || in.group_size < -1)))
            rc = qd_err_set(err, QD_EFORMAT, "part file %s: bits %d, group_size %lld", name, in.bits, (long long)in.group_size);
        const cJSON *gsj = cJSON_GetObjectItemCaseSensitive(f.meta, "global_scale");
        in.global_scale = cJSON_IsNumber(gsj) ? (float)gsj->valuedouble : 0.0f;
        if (gsj && !(in.global_scale > 0.0f && isfinite(in.global_scale)))
            rc = qd_err_set(err, QD_EFORMAT, "part file %s: global_scale is not a positive number", name);
        int64_t n = in.res.n, k = in.res.k;
        if (!rc && (n <= 0 || k <= 0 || n > (1 << 24) || k > (1 << 24) || in.r0 < 0 || in.r1 <= in.r0 || in.r1 > n))
            rc = qd_err_set(err, QD_EFORMAT, "part file %s: bad shape or rows", name);
        uint64_t nw = rc ? 0 : (uint64_t)((in.r1 - in.r0) * k);
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(f.meta, "arrays");
        int has_ref = cJSON_HasObjectItem(a, "w_ref");
        if (!rc && cJSON_HasObjectItem(a, "den")) {
            const double *d = qd_part_file_arr(&f, "den", sizeof *d, err);
            if (!d) rc = QD_EFORMAT;
            else if (!(isfinite(*d) && *d >= 0)) rc = qd_err_set(err, QD_EFORMAT, "part file %s: den is %g", name, *d);
            else { in.den_known = 1; in.den = *d; }
        }
        if (!rc && (!(w = malloc(nw * sizeof *w)) || (has_ref && !(w_ref = malloc(nw * sizeof *w_ref)))))
            rc = qd_err_set(err, QD_ENOMEM, "part file %s: out of memory", name);
        if (!rc && cJSON_HasObjectItem(f.meta, "src")) rc = qd_qpart_src_read(p->job, p->m ? qd_model_tensors(p->m) : NULL, f.meta, in.r0, in.r1, n, k, w, err);
        else if (!rc) rc = qd_part_farr_read(&f, "w", w, nw, 0, err);
        if (!rc && has_ref) rc = qd_part_farr_read(&f, "w_ref", w_ref, nw, 0, err);
        in.w = w;
        in.w_ref = has_ref ? w_ref : w;
        const cJSON *hn = cJSON_GetObjectItemCaseSensitive(f.meta, "hessian");
        if (!rc && (!cJSON_IsString(hn) || strchr(hn->valuestring, '/')))
            rc = qd_err_set(err, QD_EFORMAT, "part file %s: no Hessian named", name);
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(f.meta, "factor");
        const cJSON *fs = cJSON_GetObjectItemCaseSensitive(f.meta, "factor_checksum");
        unsigned long long fsum = 0;
        if (!rc && fn && (!cJSON_IsString(fn) || strchr(fn->valuestring, '/') || !cJSON_IsString(fs) ||
                          sscanf(fs->valuestring, "%16llx", &fsum) != 1))
            rc = qd_err_set(err, QD_EFORMAT, "part file %s: a bad factor file name or checksum", name);
        if (!rc && cJSON_HasObjectItem(a, "hdiag")) {
            /* H's diagonal and the factor part's output: the Hessian file is not read. */
            const float *d = qd_part_file_arr(&f, "hdiag", (uint64_t)k * sizeof *d, err);
            int64_t ns = meta_int(f.meta, "n_seen", -1);
            if (!d) rc = QD_EFORMAT;
            else if (!fn || !in.den_known || !in.use_losses || !in.gptq || ns <= 0)
                rc = qd_err_set(err, QD_EFORMAT, "part file %s: H's diagonal without a factor part's output, a trace "
                                "part's denominator, GPTQ's losses or its rows seen", name);
            else if (!(hdiag = malloc((size_t)k * sizeof *hdiag)))
                rc = qd_err_set(err, QD_ENOMEM, "part file %s: out of memory", name);
            if (!rc) {
                memcpy(hdiag, d, (size_t)k * sizeof *hdiag);
                h.k = k;
                h.n_seen = ns;
                h.diag = hdiag;
                rc = qd_qpart_read_factor(dirfd, fn->valuestring, fsum, p->be, &h, &shared, err);
            }
            if (!rc && !shared.factored) {
                /* Every damping failed: RTN, whose error's numerator needs the whole H. */
                qd_gptq_shared_free(&shared);
                memset(&h, 0, sizeof h);
                rc = qd_qpart_read_hessian(dirfd, hn->valuestring, 0, fn->valuestring, fsum, p->be, k, &h, &shared, err);
            }
        } else if (!rc) {
            rc = qd_qpart_read_hessian(dirfd, hn->valuestring, 0, fn ? fn->valuestring : NULL, fsum, p->be, k, &h,
                                       &shared, err);
        }
    }
    in.h = &h;
    in.shared_last = 1;
    if (!rc) rc = qd_qpart_compute(p, &in, &shared, &out, err);
    qd_gptq_shared_free(&shared);
    char maker[160];
    qd_part_maker_desc(p->be, maker, sizeof maker);
    if (!rc) rc = write_out(dirfd, block, index, f.checksum, &out, worker, maker, err);
    qd_qpart_out_free(&out);
    qd_gptq_hessian_free(&h);
    qd_part_file_free(&f);
    free(w);
    free(w_ref);
    free(hdiag);
    return rc;
}

int qd_pipeline_part_run(const qp_job *job, qd_backend *be, int block, const char *step, int index,
                         const char *worker, const atomic_int *stop, double *seconds, qd_err *err)
{
    double t0 = qd_clock_now_s();
    if (seconds) *seconds = 0;
    int factor = step && !strcmp(step, "factor"), capture = step && !strcmp(step, "capture");
    if (!step || (strcmp(step, "quantize") && !factor && !capture))
        return qd_err_set(err, QD_EINVAL, "part step \"%s\" is not one this build runs (quantize, factor, capture)",
                          step ? step : "");
    if (block < 0 || index < 0) return qd_err_set(err, QD_EINVAL, "part %d of block %d: out of range", index, block);
    qd_pipeline *p = calloc(1, sizeof *p);
    if (!p) return qd_err_set(err, QD_ENOMEM, "out of memory");
    p->job = job;
    p->be = be;
    p->part_stop = stop;
    p->out_fd = p->ckpt_fd = p->parts_fd = -1;
    int dirfd = -1;
    int rc = qd_pipeline_quant_setup(p, err);
    if (!rc) rc = parts_dir_open(job, &dirfd, err);
    if (!rc) {
        /* An output already there for this very input (an earlier attempt's: outputs are
         * named by their input's checksum) is kept; the lead checks it whole when it reads
         * it, and computes it itself if it is damaged. */
        char in_name[64], out_name[96], sum[24], desc[160];
        if (factor) qd_fpart_name_in(in_name, sizeof in_name, block, index);
        else if (capture) qd_cpart_name_in(in_name, sizeof in_name, block, index);
        else qd_qpart_name_in(in_name, sizeof in_name, block, index);
        uint64_t in_sum = qd_part_file_checksum(dirfd, in_name);
        qd_part_maker_desc(be, desc, sizeof desc);
        if (factor) qd_fpart_name_out(out_name, sizeof out_name, block, index, in_sum, desc);
        else if (capture) qd_cpart_name_out(out_name, sizeof out_name, block, index, in_sum, desc);
        else qd_qpart_name_out(out_name, sizeof out_name, block, index, in_sum, desc);
        snprintf(sum, sizeof sum, "%016llx", (unsigned long long)in_sum);
        cJSON *meta = in_sum ? qd_part_file_meta(dirfd, out_name) : NULL;
        const cJSON *ic = cJSON_GetObjectItemCaseSensitive(meta, "in_checksum");
        int have = cJSON_IsString(ic) && !strcmp(ic->valuestring, sum);
        cJSON_Delete(meta);
        if (have) {
            QD_LOG(QD_LOG_INFO, "part_kept", "job=%s block=%d step=%s part=%d", job->id, block, step, index);
            close(dirfd);
            free(p);
            return 0;
        }
        rc = factor    ? qd_fpart_run_file(p, dirfd, block, index, worker, err)
             : capture ? qd_cpart_run_file(p, dirfd, block, index, worker, err)
                       : qd_qpart_run_file(p, dirfd, block, index, worker, err);
    }
    if (dirfd >= 0) close(dirfd);
    free(p);
    if (seconds) *seconds = qd_clock_now_s() - t0;
    if (!rc) QD_LOG(QD_LOG_INFO, "part_done", "job=%s block=%d step=%s part=%d worker=%s seconds=%.3f", job->id, block,
                    step, index, worker ? worker : "local", qd_clock_now_s() - t0);
    return rc;
}
