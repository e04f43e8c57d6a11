/* Redoing finished blocks' forwards on resume. The checkpoint keeps the calibration
 * activations only after every job.checkpoint.acts_every-th block, because at 7B they are
 * most of the bytes a job writes; a resumed job starts from the last kept file and
 * runs the blocks after it again, each with the weights its run computed with:
 *   - the source block,
 *   - its AWQ folds (.quantd/folds-NNN.safetensors: each group's scales in folding order,
 *     folded again by the same function, so the F32 norms and float linears come out the
 *     same bits as the run's),
 *   - its quantized linears read from its block file, unpacked to codes, scales and zeros,
 *     and decoded as the quantizer decoded them for the forward: scale * (q - zero) in F32
 *     (qd_qlayer_dequant_ref; not the format's dequant_ref, which for compressed-tensors
 *     rounds each product to F16 as that package does).
 * The forward and the rounding to the activations' dtype are the run's own, so the inputs
 * of the next block, and the output of the job, are byte-identical to an uninterrupted run
 * (test_pipeline_resume). Layout tp_aware is excluded (its block files hold reordered MLP
 * pairs): its jobs keep activations after every block (quant/job/job.h). */
#include "quant/pipeline/pipeline_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/core/clock.h"
#include "quant/core/fsutil.h"
#include "quant/core/log.h"
#include "quant/core/safetensors.h"
#include "quant/pipeline/acts.h"

int qd_pipeline_fold(qd_pipeline *p, qd_block_weights *bw, int g, const float *s, int64_t k, qd_err *err)
{
    if (p->n_folds == p->cap_folds) {
        int cap = p->cap_folds ? 2 * p->cap_folds : 16;
        qd_fold_rec *nf = realloc(p->folds, (size_t)cap * sizeof *nf);
        if (!nf) return qd_err_set(err, QD_ENOMEM, "out of memory");
        p->folds = nf;
        p->cap_folds = cap;
    }
    float *copy = malloc((size_t)k * sizeof *copy);
    if (!copy) return qd_err_set(err, QD_ENOMEM, "out of memory");
    memcpy(copy, s, (size_t)k * sizeof *copy);
    p->folds[p->n_folds++] = (qd_fold_rec){.group = g, .k = k, .s = copy};
    return g >= 0 ? qd_block_fold_scales(p->m, bw, g, s, err) : qd_block_fold_moe_input(p->m, bw, s, err);
}

void qd_pipeline_folds_clear(qd_pipeline *p)
{
    for (int i = 0; i < p->n_folds; i++) free(p->folds[i].s);
    p->n_folds = 0;
}

/* Tensor i of the fold file: "fold.NNNN.G" (G the group, -1 for the MoE shared input); the
 * writer sorts names bytewise, and the zero-padded index keeps that the folding order. */
int qd_pipeline_folds_write(const qd_pipeline *p, const char *path, qd_err *err)
{
    st_writer *w = NULL;
    int rc = st_writer_init(&w);
    if (rc) return qd_err_set(err, rc, "out of memory");
    char name[64];
    for (int i = 0; i < p->n_folds && !rc; i++) {
        snprintf(name, sizeof name, "fold.%04d.%d", i, p->folds[i].group);
        rc = st_writer_add(w, name, QD_DTYPE_F32, 1, &p->folds[i].k, p->folds[i].s, err);
    }
    if (!rc) rc = st_writer_write(w, path, err);
    st_writer_free(w);
    return rc;
}

/* Applies the fold file of an AWQ job's block in its order (other methods fold nothing). */
static int replay_folds(qd_pipeline *p, qd_block_weights *bw, int block, qd_err *err)
{
    if (p->job->method != QP_METHOD_AWQ && p->job->method != QP_METHOD_AWQ_GPTQ) return 0;
    char path[QD_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/folds-%03d.safetensors", p->ckpt_dir, block);
    st_file *f = NULL;
    int rc = st_file_open(path, &f, err);
    float *s = NULL;
    for (size_t i = 0; i < (rc ? 0 : st_file_count(f)) && !rc; i++) {
        const st_tensor *t = st_file_tensor(f, i);
        int idx = -1, g = -2, used = 0;
        if (sscanf(t->name, "fold.%d.%d%n", &idx, &g, &used) != 2 || t->name[used] || idx != (int)i || g < -1 ||
            g >= qd_model_n_groups(p->m) || t->ndim != 1 || t->dtype != QD_DTYPE_F32 ||
            t->shape[0] != (g >= 0 ? qd_model_group(p->m, g)->k : p->hidden)) {
            rc = qd_err_set(err, QD_EFORMAT, "%s: tensor %zu (%s) is not the fold this block needs", path, i, t->name);
            break;
        }
        s = malloc((size_t)t->shape[0] * sizeof *s);   /* the mapping need not be aligned for floats */
        if (!s) { rc = qd_err_set(err, QD_ENOMEM, "out of memory"); break; }
        memcpy(s, t->data, (size_t)t->shape[0] * sizeof *s);
        rc = g >= 0 ? qd_block_fold_scales(p->m, bw, g, s, err) : qd_block_fold_moe_input(p->m, bw, s, err);
        free(s);
        s = NULL;
    }
    st_file_close(f);
    return rc;
}

static const st_tensor *file_lookup(const void *f, const char *name) { return st_file_find(f, name); }

/* The block's quantized linears, decoded from its block file into bw. */
static int replay_linears(qd_pipeline *p, qd_block_weights *bw, int block, qd_err *err)
{
    char path[QD_PATH_MAX + 64], prefix[160], base[400];
    snprintf(path, sizeof path, "%s/block-%03d.safetensors", p->ckpt_dir, block);
    st_file *f = NULL;
    int rc = st_file_open(path, &f, err);
    if (rc) return rc;
    qd_model_block_prefix(p->m, block, prefix, sizeof prefix);
    const qp_job *job = p->job;
    qd_fmt_detected d = {.bits = job->bits, .group_size = job->group_size, .sym = job->sym, .desc_act = job->desc_act};
    float *w = NULL;
    for (int li = 0; li < qd_model_n_linears(p->m) && !rc; li++) {
        qd_linear_plan plan;
        qd_pipeline_plan_linear(p, block, li, &plan);
        if (!plan.quantize) continue;   /* float or absent: the forward used bw's own weight */
        const qd_linear_info *L = qd_model_linear(p->m, li);
        snprintf(base, sizeof base, "%s%s", prefix, L->name);
        qd_fmt_named ctx = {file_lookup, f, base};
        qd_packed pk;
        memset(&pk, 0, sizeof pk);
        w = malloc((size_t)(L->n * L->k) * sizeof *w);
        if (!w) { rc = qd_err_set(err, QD_ENOMEM, "out of memory for %s", base); break; }
        qd_qlayer ql;
        memset(&ql, 0, sizeof ql);
        qd_quant_cfg lc = qd_pipeline_linear_qcfg(p, block, li);   /* target_bpw: the plan's */
        d.bits = lc.bits;
        d.group_size = lc.group_size;
        rc = p->fmt->read(qd_fmt_find_named, &ctx, L->n, L->k, &d, &pk, err);
        if (!rc) rc = p->fmt->unpack(&pk, &ql, err);
        if (!rc) qd_qlayer_dequant_ref(&ql, w);
        qd_qlayer_free(&ql);
        qd_packed_free(&pk);
        if (!rc) rc = qd_block_linear_set(p->m, bw, li, w, NULL, err);
        if (rc) qd_err_prefix(err, "%s (%s)", base, path);
        free(w);
        w = NULL;
    }
    st_file_close(f);
    return rc;
}

int qd_pipeline_replay(qd_pipeline *p, int from, int to, qd_err *err)
{
    double t0 = qd_clock_now_s();
    size_t n = (size_t)(p->n_seq * p->seq_len * p->hidden);
    int on_host = p->be->device < 0;
    float *host = on_host ? NULL : malloc(n * sizeof(float));
    int rc = on_host || host ? 0 : qd_err_set(err, QD_ENOMEM, "out of memory");
    for (int b = from; b < to && !rc; b++) {
        qd_block_weights *bw = NULL;
        float *y = NULL;
        rc = qd_block_load(p->m, b, &bw, err);
        if (!rc) rc = replay_folds(p, bw, b, err);
        if (!rc) rc = replay_linears(p, bw, b, err);
        if (!rc) {
            y = qd_backend_alloc(p->be, n * sizeof(float));
            if (!y) rc = qd_err_set(err, QD_ENOMEM, "out of memory for block %d's outputs", b);
        }
        if (!rc) rc = qd_capture_run(p, bw, QD_BLOCK_ALL, y, NULL, err);
        /* The rounding the run did before it wrote (or would have written) the file. */
        if (!rc && on_host) qd_acts_round(y, n, p->acts_dtype);
        if (!rc && !on_host) rc = qd_backend_download(p->be, host, y, n * sizeof(float));
        if (!rc && !on_host) {
            qd_acts_round(host, n, p->acts_dtype);
            rc = qd_backend_upload(p->be, y, host, n * sizeof(float));
        }
        qd_block_free(p->m, bw);
        if (rc) {
            qd_backend_free(p->be, y);
            qd_err_prefix(err, "resume: recomputing block %d's outputs", b);
            break;
        }
        qd_backend_free(p->be, p->acts);
        p->acts = y;
    }
    free(host);
    if (!rc)
        QD_LOG(QD_LOG_INFO, "resume_replay", "job=%s blocks=%d..%d seconds=%.2f", p->job->id, from, to - 1,
               qd_clock_now_s() - t0);
    return rc;
}
