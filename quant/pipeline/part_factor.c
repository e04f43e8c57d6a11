/* The factorisation step's parts (part.h, docs/parallel.md): when one fan-out quantizes the
 * linears of several GPTQ input groups (a MoE block's experts, a block quantized without
 * true-sequential), each group's Hessian is factored by a part of its own, on whichever
 * worker is free, instead of one after another in the lead. The row parts of the group then
 * read the factor from that part's output.
 *
 * A factorisation's bits depend on the backend that makes it (OpenBLAS's kernels and its
 * LAPACK path for the thread count, the GPU model), so an output is named by its input's
 * checksum and by a hash of what made it (qd_part_maker_desc): the lead takes over only an
 * output made by a backend like its own, which is what it would have computed itself, and
 * factors the others' groups itself.
 *
 * The same step carries trace parts (part.h): the error's denominator tr(W H W^T) of a
 * quantize part's rows, which needs no factor, computed while one worker factors. */
#include "quant/pipeline/part.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "quant/algo/gptq.h"
#include "quant/core/clock.h"
#include "quant/pipeline/acts.h"

void qd_part_maker_desc(const qd_backend *be, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s gptq_form=%d", be->desc, (int)be->rt.gptq_form);
}

uint32_t qd_part_maker_hash(const char *desc)
{
    return (uint32_t)(qd_hash64(desc, strlen(desc), QD_HASH64_INIT) & 0xffffffffu);
}

void qd_fpart_name_in(char *buf, size_t cap, int block, int index)
{
    snprintf(buf, cap, "b%04d-factor-%04d.in.part", block, index);
}

void qd_fpart_name_out(char *buf, size_t cap, int block, int index, uint64_t in_checksum, const char *desc)
{
    snprintf(buf, cap, "b%04d-factor-%04d-%016llx-%08llx.out.part", block, index, (unsigned long long)in_checksum,
             (unsigned long long)qd_part_maker_hash(desc));
}

/* ---- a factorisation in a part file ---- */

int qd_part_factor_put(cJSON *meta, const qd_gptq_shared *sh, int64_t k, qd_part_factor_w *fw, qd_part_arr *a, int *na,
                       qd_err *err)
{
    memset(fw, 0, sizeof *fw);
    size_t kk = (size_t)(k * k) * sizeof(float);
    const float *fh = sh->fac ? qd_part_host_view(sh->be, sh->fac, kk, &fw->own) : NULL;
    if (sh->fac && !fh) return qd_err_set(err, QD_ENOMEM, "out of memory for a [%lld, %lld] factor", (long long)k, (long long)k);
    /* The factor is upper triangular: stored as its upper triangle when the lower holds
     * nothing but +0.0 (checked, bit for bit). */
    int rc = fh ? qd_part_farr_make("fac", fh, (uint64_t)(k * k), k, &fw->fac, err) : 0;
    if (!rc && fh && qd_part_farr_note(meta, &fw->fac)) rc = qd_err_set(err, QD_ENOMEM, "out of memory");
    if (rc) return rc;
    /* The factorisation's record; its doubles exactly, as an array. */
    double r[] = {sh->damp_opt, sh->damp_percent, sh->damp, sh->desc_act, sh->max_damp_retries, sh->ldl,
                  sh->factored, sh->damp_retries};
    memcpy(fw->rec, r, sizeof fw->rec);
    cJSON_AddItemToObject(meta, "factor", cJSON_CreateTrue());
    a[(*na)++] = (qd_part_arr){"factor_rec", fw->rec, sizeof fw->rec};
    if (fh) a[(*na)++] = fw->fac.arr;
    return 0;
}

void qd_part_factor_w_free(qd_part_factor_w *fw)
{
    qd_part_farr_free(&fw->fac);
    free(fw->own);
    memset(fw, 0, sizeof *fw);
}

int qd_part_factor_get(const qd_part_file *f, const char *name, qd_backend *be, const qd_gptq_hessian *h,
                       qd_gptq_shared *sh, qd_err *err)
{
    if (!cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(f->meta, "factor")))
        return qd_err_set(err, QD_EFORMAT, "part file %s: no factorisation in it", name);
    int64_t k = h->k;
    const double *rec = qd_part_file_arr(f, "factor_rec", 8 * sizeof(double), err);
    if (!rec) return QD_EFORMAT;
    const cJSON *arrs = cJSON_GetObjectItemCaseSensitive(f->meta, "arrays");
    int has_fac = cJSON_HasObjectItem(arrs, "fac");
    float *fac = has_fac ? malloc((size_t)(k * k) * sizeof *fac) : NULL;
    int rc = 0;
    if (has_fac && !fac) rc = qd_err_set(err, QD_ENOMEM, "part file %s: out of memory", name);
    else if (has_fac) rc = qd_part_farr_read(f, "fac", fac, (uint64_t)(k * k), k, err);
    if (!rc) {
        qd_gptq_shared r = {.k = k, .damp_opt = rec[0], .damp_percent = rec[1], .damp = rec[2], .desc_act = (int)rec[3],
                            .max_damp_retries = (int)rec[4], .ldl = (int)rec[5], .factored = (int)rec[6],
                            .damp_retries = (int)rec[7]};
        if (fac) rc = qd_gptq_shared_adopt(be, h, &r, fac, sh, err);
        else if (!r.factored) { *sh = r; sh->key = h; sh->n_seen = h->n_seen; sh->be = be; }   /* every damping failed: RTN */
        else rc = qd_err_set(err, QD_EFORMAT, "part file %s: a factorisation without its factor", name);
    }
    free(fac);
    return rc;
}

/* ---- the factorisation step's files ---- */

static const char *meta_str(const cJSON *meta, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(meta, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* A factor-step input's meta (NULL: *rc says why): its step, kind (NULL: a factorisation),
 * index and group, and the Hessian file it reads with that file's checksum; name (cap 64)
 * gets the input's file name. */
static cJSON *fstep_meta(int dirfd, int block, int index, int group, const char *kind, char *name, int *rc, qd_err *err)
{
    char hname[64], sum[24];
    qd_qpart_name_hessian(hname, sizeof hname, block, group);
    qd_fpart_name_in(name, 64, block, index);
    uint64_t hsum = qd_part_file_checksum(dirfd, hname);
    cJSON *meta = hsum ? cJSON_CreateObject() : NULL;
    *rc = !hsum ? qd_err_set(err, QD_EFORMAT, "part file %s: missing or unreadable", hname)
          : !meta ? qd_err_set(err, QD_ENOMEM, "out of memory") : 0;
    if (!meta) return NULL;
    snprintf(sum, sizeof sum, "%016llx", (unsigned long long)hsum);
    cJSON_AddStringToObject(meta, "step", "factor");
    if (kind) cJSON_AddStringToObject(meta, "kind", kind);
    cJSON_AddNumberToObject(meta, "index", index);
    cJSON_AddNumberToObject(meta, "group", group);
    cJSON_AddStringToObject(meta, "hessian", hname);
    cJSON_AddStringToObject(meta, "h_checksum", sum);
    return meta;
}

int qd_fpart_write_in(int dirfd, int block, int index, int group, int64_t k, uint64_t *checksum, qd_err *err)
{
    char name[64];
    int rc;
    cJSON *meta = fstep_meta(dirfd, block, index, group, NULL, name, &rc, err);
    if (!meta) return rc;
    cJSON_AddNumberToObject(meta, "k", (double)k);
    rc = qd_part_file_write(dirfd, name, meta, NULL, 0, checksum, err);
    cJSON_Delete(meta);
    return rc;
}

static int tpart_run(qd_pipeline *p, int dirfd, int block, int index, const qd_part_file *f, const char *name,
                     const char *worker, qd_err *err);

int qd_fpart_run_file(qd_pipeline *p, int dirfd, int block, int index, const char *worker, qd_err *err)
{
    char name[64];
    qd_fpart_name_in(name, sizeof name, block, index);
    qd_part_file f;
    int rc = qd_part_file_read(dirfd, name, &f, err);
    if (rc) return rc;
    const char *kind = meta_str(f.meta, "kind");
    if (kind && !strcmp(kind, "trace")) {
        rc = tpart_run(p, dirfd, block, index, &f, name, worker, err);
        qd_part_file_free(&f);
        return rc;
    }
    if (kind) {
        rc = qd_err_set(err, QD_EFORMAT, "part file %s: kind \"%.40s\" is not one this build runs (trace)", name, kind);
        qd_part_file_free(&f);
        return rc;
    }
    const char *hn = meta_str(f.meta, "hessian"), *hs = meta_str(f.meta, "h_checksum");
    const cJSON *kj = cJSON_GetObjectItemCaseSensitive(f.meta, "k");
    int64_t k = cJSON_IsNumber(kj) ? (int64_t)kj->valuedouble : -1;
    unsigned long long want = 0;
    if (!hn || strchr(hn, '/') || !hs || sscanf(hs, "%16llx", &want) != 1 || k <= 0 || k > (1 << 20))
        rc = qd_err_set(err, QD_EFORMAT, "part file %s: no Hessian named, or a bad width", name);
    qd_gptq_hessian h;
    memset(&h, 0, sizeof h);
    qd_gptq_shared sh;
    memset(&sh, 0, sizeof sh);
    double t0 = qd_clock_now_s();
    if (!rc) rc = qd_qpart_read_hessian(dirfd, hn, want, NULL, 0, p->be, k, &h, NULL, err);
    qd_gptq_opts go = qd_pipeline_gptq_opts(p);
    if (!rc) rc = qd_gptq_shared_make(p->be, &go, &h, &sh, err);
    double secs = qd_clock_now_s() - t0;
    cJSON *meta = rc ? NULL : cJSON_CreateObject();
    if (!rc && !meta) rc = qd_err_set(err, QD_ENOMEM, "out of memory");
    qd_part_factor_w fw;
    memset(&fw, 0, sizeof fw);
    qd_part_arr a[2];
    int na = 0;
    char desc[160], out[96], sum[24];
    qd_part_maker_desc(p->be, desc, sizeof desc);
    if (!rc) {
        snprintf(sum, sizeof sum, "%016llx", (unsigned long long)f.checksum);
        cJSON_AddStringToObject(meta, "step", "factor");
        cJSON_AddStringToObject(meta, "in_checksum", sum);
        cJSON_AddStringToObject(meta, "worker", worker ? worker : "local");
        cJSON_AddStringToObject(meta, "made_by", desc);
        cJSON_AddNumberToObject(meta, "k", (double)k);
        cJSON_AddNumberToObject(meta, "seconds", secs);
        rc = qd_part_factor_put(meta, &sh, k, &fw, a, &na, err);
    }
    qd_fpart_name_out(out, sizeof out, block, index, f.checksum, desc);
    if (!rc) rc = qd_part_file_write(dirfd, out, meta, a, na, NULL, err);
    qd_part_factor_w_free(&fw);
    cJSON_Delete(meta);
    qd_gptq_shared_free(&sh);
    qd_gptq_hessian_free(&h);
    qd_part_file_free(&f);
    return rc;
}

int qd_fpart_read_out(int dirfd, int block, int index, uint64_t in_checksum, const qd_backend *be, int64_t k,
                      qd_fpart_done *done, qd_err *err)
{
    memset(done, 0, sizeof *done);
    char desc[160], sum[24];
    qd_part_maker_desc(be, desc, sizeof desc);
    qd_fpart_name_out(done->name, sizeof done->name, block, index, in_checksum, desc);
    snprintf(sum, sizeof sum, "%016llx", (unsigned long long)in_checksum);
    /* Read whole: its checksum is checked here, before any row part is told to read it. */
    qd_part_file f;
    int rc = qd_part_file_read(dirfd, done->name, &f, err);
    if (rc) return rc;
    const char *ic = meta_str(f.meta, "in_checksum"), *mb = meta_str(f.meta, "made_by"), *wk = meta_str(f.meta, "worker");
    const cJSON *kj = cJSON_GetObjectItemCaseSensitive(f.meta, "k"), *sj = cJSON_GetObjectItemCaseSensitive(f.meta, "seconds");
    if (!ic || strcmp(ic, sum))
        rc = qd_err_set(err, QD_EFORMAT, "part file %s: computed from another input", done->name);
    else if (!mb || strcmp(mb, desc))
        rc = qd_err_set(err, QD_EFORMAT, "part file %s: made by \"%s\", not \"%s\"", done->name, mb ? mb : "?", desc);
    else if (!cJSON_IsNumber(kj) || (int64_t)kj->valuedouble != k || !cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(f.meta, "factor")))
        rc = qd_err_set(err, QD_EFORMAT, "part file %s: not a [%lld, %lld] factorisation", done->name, (long long)k, (long long)k);
    if (!rc) {
        done->checksum = f.checksum;
        done->seconds = cJSON_IsNumber(sj) && sj->valuedouble >= 0 ? sj->valuedouble : 0;
        snprintf(done->worker, sizeof done->worker, "%s", wk ? wk : "?");
    }
    qd_part_file_free(&f);
    return rc;
}

/* ---- trace parts ---- */

int qd_tpart_pays(const qd_backend *be, int64_t k, int64_t max_rows, int mode)
{
    if (mode >= 0) return mode;
    /* potrf: k^3 / 3 flops; a part's trace (a symmetric rank-rows update): rows k^2. The
     * factor outlasts the largest trace part when k > 3 rows (measured on one thread, k
     * 11008: potrf 3.8 s, 2048 rows' trace 2.1 s; bench/results/parts.md). */
    return be->device < 0 && max_rows > 0 && k > 3 * max_rows;
}

static int64_t meta_i64(const cJSON *meta, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(meta, key);
    return cJSON_IsNumber(v) ? (int64_t)v->valuedouble : -1;
}

int qd_tpart_write_in(int dirfd, int block, int index, int group, const qd_qpart_in *in, uint64_t *checksum,
                      qd_err *err)
{
    if (!in->src) return qd_err_set(err, QD_EINVAL, "trace part: %s's rows are not named in the model", in->res.name);
    char name[64];
    int rc;
    cJSON *meta = fstep_meta(dirfd, block, index, group, "trace", name, &rc, err);
    if (!meta) return rc;
    cJSON_AddStringToObject(meta, "linear", in->res.name);
    cJSON_AddNumberToObject(meta, "n", (double)in->res.n);
    cJSON_AddNumberToObject(meta, "k", (double)in->res.k);
    cJSON_AddNumberToObject(meta, "r0", (double)in->r0);
    cJSON_AddNumberToObject(meta, "r1", (double)in->r1);
    rc = qd_qpart_src_note(meta, in) ? qd_err_set(err, QD_ENOMEM, "out of memory") : 0;
    if (!rc) rc = qd_part_file_write(dirfd, name, meta, NULL, 0, checksum, err);
    cJSON_Delete(meta);
    return rc;
}

/* A trace part from its input f (read and checked whole): the rows from the model, the
 * Hessian from its file (its checksum the input's), the denominator into the output. */
static int tpart_run(qd_pipeline *p, int dirfd, int block, int index, const qd_part_file *f, const char *name,
                     const char *worker, qd_err *err)
{
    const char *hn = meta_str(f->meta, "hessian"), *hs = meta_str(f->meta, "h_checksum");
    int64_t n = meta_i64(f->meta, "n"), k = meta_i64(f->meta, "k"), r0 = meta_i64(f->meta, "r0"),
            r1 = meta_i64(f->meta, "r1");
    unsigned long long want = 0;
    if (!hn || strchr(hn, '/') || !hs || sscanf(hs, "%16llx", &want) != 1)
        return qd_err_set(err, QD_EFORMAT, "part file %s: no Hessian named", name);
    if (n <= 0 || k <= 0 || n > (1 << 24) || k > (1 << 20) || r0 < 0 || r1 <= r0 || r1 > n)
        return qd_err_set(err, QD_EFORMAT, "part file %s: bad shape or rows", name);
    double t0 = qd_clock_now_s();
    int64_t rows = r1 - r0;
    float *w = malloc((size_t)(rows * k) * sizeof *w);
    int rc = w ? 0 : qd_err_set(err, QD_ENOMEM, "part file %s: out of memory for [%lld, %lld] rows", name,
                                (long long)rows, (long long)k);
    if (!rc) {
        rc = qd_qpart_src_read(p->job, p->m ? qd_model_tensors(p->m) : NULL, f->meta, r0, r1, n, k, w, err);
        if (rc == QD_ENOTFOUND) rc = qd_err_set(err, QD_EFORMAT, "part file %s: names no rows of the model", name);
    }
    qd_gptq_hessian h;
    memset(&h, 0, sizeof h);
    if (!rc) rc = qd_qpart_read_hessian(dirfd, hn, want, NULL, 0, p->be, k, &h, NULL, err);
    double tr[2] = {0, 0};
    if (!rc) rc = qd_pipeline_rel_traces_den(p, w, NULL, rows, k, &h, 0.0, -1.0, tr, err);
    qd_gptq_hessian_free(&h);
    free(w);
    if (!rc && !(isfinite(tr[1]) && tr[1] >= 0))
        rc = qd_err_set(err, QD_ENUMERIC, "part file %s: the trace of the rows is %g", name, tr[1]);
    cJSON *meta = rc ? NULL : cJSON_CreateObject();
    if (!rc && !meta) rc = qd_err_set(err, QD_ENOMEM, "out of memory");
    char desc[160], out[96], sum[24];
    qd_part_maker_desc(p->be, desc, sizeof desc);
    if (!rc) {
        snprintf(sum, sizeof sum, "%016llx", (unsigned long long)f->checksum);
        cJSON_AddStringToObject(meta, "step", "factor");
        cJSON_AddStringToObject(meta, "kind", "trace");
        cJSON_AddStringToObject(meta, "in_checksum", sum);
        cJSON_AddStringToObject(meta, "worker", worker ? worker : "local");
        cJSON_AddStringToObject(meta, "made_by", desc);
        cJSON_AddNumberToObject(meta, "seconds", qd_clock_now_s() - t0);
        qd_fpart_name_out(out, sizeof out, block, index, f->checksum, desc);
        qd_part_arr a = {"den", &tr[1], sizeof tr[1]};
        rc = qd_part_file_write(dirfd, out, meta, &a, 1, NULL, err);
    }
    cJSON_Delete(meta);
    return rc;
}

int qd_tpart_read_out(int dirfd, int block, int index, uint64_t in_checksum, const qd_backend *be, double *den,
                      char *worker, double *seconds, qd_err *err)
{
    char desc[160], name[96], sum[24];
    qd_part_maker_desc(be, desc, sizeof desc);
    qd_fpart_name_out(name, sizeof name, block, index, in_checksum, desc);
    snprintf(sum, sizeof sum, "%016llx", (unsigned long long)in_checksum);
    qd_part_file f;
    int rc = qd_part_file_read(dirfd, name, &f, err);
    if (rc) return rc;
    const char *ic = meta_str(f.meta, "in_checksum"), *mb = meta_str(f.meta, "made_by"), *wk = meta_str(f.meta, "worker"),
               *kind = meta_str(f.meta, "kind");
    const cJSON *sj = cJSON_GetObjectItemCaseSensitive(f.meta, "seconds");
    const double *d = NULL;
    if (!ic || strcmp(ic, sum))
        rc = qd_err_set(err, QD_EFORMAT, "part file %s: computed from another input", name);
    else if (!mb || strcmp(mb, desc))
        rc = qd_err_set(err, QD_EFORMAT, "part file %s: made by \"%s\", not \"%s\"", name, mb ? mb : "?", desc);
    else if (!kind || strcmp(kind, "trace"))
        rc = qd_err_set(err, QD_EFORMAT, "part file %s: not a trace part's output", name);
    else if (!(d = qd_part_file_arr(&f, "den", sizeof *d, err)))
        rc = QD_EFORMAT;
    else if (!(isfinite(*d) && *d >= 0))
        rc = qd_err_set(err, QD_EFORMAT, "part file %s: the trace is %g", name, *d);
    if (!rc) {
        *den = *d;
        if (seconds) *seconds = cJSON_IsNumber(sj) && sj->valuedouble >= 0 ? sj->valuedouble : 0;
        if (worker) snprintf(worker, 64, "%s", wk ? wk : "?");
    }
    qd_part_file_free(&f);
    return rc;
}
