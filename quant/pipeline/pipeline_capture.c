/* Capturing a block's inputs: one pass of the calibration batches through the block with
 * an input hook that folds each group's activations into its Hessian, keeps its first rows
 * for the kernel check and the direct error, copies a whole group's input for AWQ, and can
 * stop the forward early once the wanted group's input has been seen. */
#include "quant/pipeline/pipeline_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/core/log.h"

/* sum[k] += |x[r][k]| over the rows, in double on the host (no backend op reduces |x|). */
static int capture_absum(qd_capture_ctx *c, int64_t k, const float *x, int64_t rows, double *sum)
{
    qd_backend *be = c->p->be;
    const int64_t chunk = 256;
    float *buf = malloc((size_t)(chunk * k) * sizeof *buf);
    if (!buf) return qd_err_set(c->err, QD_ENOMEM, "capture: out of memory");
    int rc = 0;
    for (int64_t r0 = 0; r0 < rows && !rc; r0 += chunk) {
        int64_t n = rows - r0 < chunk ? rows - r0 : chunk;
        rc = qd_backend_download(be, buf, x + r0 * k, (size_t)(n * k) * sizeof *buf);
        if (rc) rc = qd_err_set(c->err, rc, "capture: %s", be->err.msg);
        for (int64_t r = 0; r < n && !rc; r++)
            for (int64_t j = 0; j < k; j++) sum[j] += fabs((double)buf[r * k + j]);
    }
    free(buf);
    return rc;
}

/* GPTAQ's second stream: the float pass keeps group's rows; a later pass pairs its rows, in
 * the same order (the same batches, every row once), with those kept into the group's dXXT. */
static int capture_gptaq(qd_capture_ctx *c, int group, const qd_input_group *g, const float *x, int64_t rows)
{
    qd_gptaq_capture *gq = c->gq;
    qd_backend *be = c->p->be;
    int64_t at = gq->rows[group];
    if (gq->keeping ? !gq->keep[group] : !gq->dxx[group]) return 0;
    if (at + rows > gq->cap)
        return qd_err_set(c->err, QD_EINVAL, "gptaq: %s saw %lld rows, more than the %lld calibration rows", g->name,
                          (long long)(at + rows), (long long)gq->cap);
    gq->rows[group] = at + rows;
    if (gq->keeping) {
        int rc = be->ops->copy(be, gq->keep[group] + at * g->k, x, (size_t)(rows * g->k) * sizeof(float));
        return rc ? qd_err_set(c->err, rc, "capture: %s", be->err.msg) : 0;
    }
    return qd_gptaq_dxx_add_dev(gq->dxx[group], gq->keep[group] + at * g->k, x, rows, g->k, c->err);
}

/* A capture part: the call and its rows kept, on the host. */
static int capture_record(qd_capture_ctx *c, int group, const qd_input_group *g, const float *x, int64_t rows)
{
    qd_capture_rec *r = c->rec;
    if (!r->x[group]) return 0;
    if (r->keep[group] < r->cap[group]) {   /* only the first rows are wanted */
        if (r->rows[group] >= r->keep[group]) return 0;
        if (rows > r->keep[group] - r->rows[group]) rows = r->keep[group] - r->rows[group];
    }
    if (r->rows[group] + rows > r->cap[group])
        return qd_err_set(c->err, QD_EINVAL, "capture: %s saw %lld rows, more than the part's %lld", g->name,
                          (long long)(r->rows[group] + rows), (long long)r->cap[group]);
    if (r->n_calls == r->cap_calls) {
        int cap = r->cap_calls ? 2 * r->cap_calls : 64;
        int *cg = realloc(r->call_group, (size_t)cap * sizeof *cg);
        if (cg) r->call_group = cg;
        int64_t *cr = cg ? realloc(r->call_rows, (size_t)cap * sizeof *cr) : NULL;
        if (!cr) return qd_err_set(c->err, QD_ENOMEM, "capture: out of memory");
        r->call_rows = cr;
        r->cap_calls = cap;
    }
    int rc = qd_backend_download(c->p->be, r->x[group] + r->rows[group] * g->k, x, (size_t)(rows * g->k) * sizeof(float));
    if (rc) return qd_err_set(c->err, rc, "capture: %s", c->p->be->err.msg);
    r->call_group[r->n_calls] = group;
    r->call_rows[r->n_calls++] = rows;
    r->rows[group] += rows;
    return 0;
}

static int capture_input(void *ud, int block, int group, const qd_input_group *g, const float *x, int64_t rows)
{
    qd_capture_ctx *c = ud;
    (void)block;
    if (c->rec) {
        int rc = capture_record(c, group, g, x, rows);
        if (rc) return rc;
    } else if (c->gq) {
        int rc = capture_gptaq(c, group, g, x, rows);
        if (rc) return rc;
    }
    if (!c->no_hess && c->want[group] && c->acc[group] && !c->twin[group]) {
        int rc = qd_gptq_hessian_add_dev(c->acc[group], x, rows, g->k, c->err);
        if (rc) return rc;
    }
    qd_row_slices *keep[2] = {c->kcheck, c->direct};
    for (int i = 0; i < 2; i++) {
        qd_row_slices *sl = keep[i];
        if (!sl || !c->want[group] || !sl->x[group] || sl->rows[group] >= sl->cap) continue;
        qd_backend *be = c->p->be;
        int64_t take = sl->cap - sl->rows[group];
        if (take > rows) take = rows;
        int rc = qd_backend_download(be, sl->x[group] + sl->rows[group] * g->k, x, (size_t)(take * g->k) * sizeof(float));
        if (rc) return qd_err_set(c->err, rc, "capture: %s", be->err.msg);
        sl->rows[group] += take;
    }
    if (c->xcap && group == c->xcap_group) {
        qd_backend *be = c->p->be;
        int64_t take = c->xcap_max > 0 && c->xcap_max - c->xcap_rows < rows ? c->xcap_max - c->xcap_rows : rows;
        int rc = take > 0 ? be->ops->copy(be, c->xcap + c->xcap_rows * g->k, x, (size_t)(take * g->k) * sizeof(float)) : 0;
        if (rc) return qd_err_set(c->err, rc, "capture: %s", be->err.msg);
        c->xcap_rows += take;
    }
    if (!c->rec && c->absum[group]) {
        int rc = capture_absum(c, g->k, x, rows, c->absum[group]);
        if (rc) return rc;
        c->absum_rows[group] += rows;
    }
    if (group == c->stop_after) {
        c->stopped = 1;
        return QD_ECANCELLED;   /* ends this forward early; not an error (see run_batches) */
    }
    return 0;
}

/* MoE: the routed-token counts of the block's first pass that reaches the router. */
static void capture_routed(void *ud, int block, const int64_t *counts, int n_experts)
{
    qd_capture_ctx *c = ud;
    (void)block;
    c->routed_seen = 1;
    if (c->p->moe_routed_done) return;
    for (int e = 0; e < n_experts && e < QD_MAX_EXPERTS; e++) c->p->moe_routed[e] += counts[e];
}

/* The batches of sequences s0 .. s1 through the block (qd_capture_run's loop). */
static int capture_batches(qd_pipeline *p, const qd_block_weights *bw, qd_block_part part, float *y, qd_capture_ctx *c,
                           int64_t s0, int64_t s1, qd_err *err)
{
    qd_block_hooks hooks = {.ud = c, .routed = capture_routed, .input = capture_input, .override = NULL};
    /* Into scratch (no y) nobody reads the block's output: a MoE block runs only the experts
     * whose inputs this pass takes, each only up to them (block.h). */
    int want[QD_MAX_GROUPS] = {0};
    if (c && !y) {
        for (int g = 0; g < QD_MAX_GROUPS; g++)
            want[g] = c->want[g] || (c->xcap && g == c->xcap_group) || c->absum[g] || g == c->stop_after ||
                      (c->gq && (c->gq->keep[g] || c->gq->dxx[g]));
        hooks.want = want;
    }
    int64_t rows_per_seq = p->seq_len, hidden = p->hidden;
    for (; s0 < s1; s0 += p->batch_seqs) {
        int64_t nb = s1 - s0 < p->batch_seqs ? s1 - s0 : p->batch_seqs;
        size_t off = (size_t)(s0 * rows_per_seq * hidden);
        const float *x = p->acts + off;
        float *out = y ? y + off : NULL;
        float *scratch = NULL;
        if (!out) {
            scratch = qd_backend_alloc(p->be, (size_t)(nb * rows_per_seq * hidden) * sizeof(float));
            if (!scratch) return qd_err_set(err, QD_ENOMEM, "block forward: out of memory");
            out = scratch;
        }
        if (c) c->stopped = 0;
        const qd_block_hooks *h = c ? &hooks : NULL;
        int rc = 0;
        if (part == QD_BLOCK_ATTN) rc = qd_block_forward_part(p->m, bw, QD_BLOCK_ATTN, x, p->mid + off, nb, rows_per_seq, NULL, h, err);
        if (!rc) rc = part == QD_BLOCK_ALL ? qd_block_forward(p->m, bw, x, out, nb, rows_per_seq, NULL, h, err)
                                           : qd_block_forward_part(p->m, bw, QD_BLOCK_MLP, p->mid + off, out, nb, rows_per_seq, NULL, h, err);
        qd_backend_free(p->be, scratch);
        if (rc == QD_ECANCELLED && c && c->stopped) rc = 0;
        if (rc) return rc;
    }
    return 0;
}

/* With shards: each shard's batches fill Hessians of their own, folded into c's in shard order
 * (qd_gptq_hessian_merge). */
static int capture_shards(qd_pipeline *p, const qd_block_weights *bw, qd_block_part part, float *y, qd_capture_ctx *c,
                          int64_t s0, int64_t s1, qd_err *err)
{
    qd_gptq_hessian *keep[QD_MAX_GROUPS];
    memcpy(keep, c->acc, sizeof keep);
    int rc = 0;
    for (int s = 0; s < p->n_shards && !rc; s++) {
        int64_t a = p->shard_starts[s] > s0 ? p->shard_starts[s] : s0;
        int64_t b = p->shard_starts[s + 1] < s1 ? p->shard_starts[s + 1] : s1;
        if (a >= b) continue;
        qd_gptq_hessian tmp[QD_MAX_GROUPS];
        memset(tmp, 0, sizeof tmp);
        for (int g = 0; g < QD_MAX_GROUPS && !rc; g++) {
            if (!keep[g] || !c->want[g] || c->twin[g]) continue;
            rc = qd_gptq_hessian_init(&tmp[g], p->be, keep[g]->k, err);
            tmp[g].bf16 = keep[g]->bf16;
            c->acc[g] = &tmp[g];
        }
        if (!rc) rc = capture_batches(p, bw, part, y, c, a, b, err);
        memcpy(c->acc, keep, sizeof keep);
        for (int g = 0; g < QD_MAX_GROUPS; g++) {
            if (!rc && tmp[g].h) rc = qd_gptq_hessian_merge(keep[g], &tmp[g], err);
            qd_gptq_hessian_free(&tmp[g]);
        }
    }
    return rc;
}

/* c->twin for one pass of block `block`: each wanted group whose Hessian is still empty and
 * whose input is, call for call, that of a lower wanted group of the same kind (a MoE block's
 * experts' gate/up when every expert calibrates on every token: the one normalised hidden
 * state) is that group's twin. Not a group after the one the forward stops at (its calls
 * would not come: a MoE block's hooks come in group order), nor where the Hessians come
 * summed (no_hess). */
static void capture_twins(qd_pipeline *p, int block, qd_capture_ctx *c)
{
    memset(c->twin, 0, sizeof c->twin);
    if (c->no_hess || p->no_twins) return;
    int first[QD_MAX_GROUPS];
    int ng = qd_model_n_groups(p->m);
    for (int g = 0; g < ng; g++) first[g] = -1;
    for (int g = 0; g < ng; g++) {
        if (!c->want[g] || !c->acc[g] || c->acc[g]->n_seen || (c->stop_after >= 0 && g > c->stop_after)) continue;
        int kind = qd_model_group_same_input(p->m, block, g);   /* g itself: alone, or its kind's first */
        if (first[kind] < 0) first[kind] = g;
        else c->twin[g] = 1 + first[kind];
    }
}

/* Each twin's Hessian: its group's, copied (a merge into an empty accumulator is a copy). */
static int capture_twins_fill(qd_capture_ctx *c, qd_err *err)
{
    int rc = 0;
    for (int g = 0; g < QD_MAX_GROUPS && !rc; g++) {
        if (!c->twin[g]) continue;
        rc = qd_gptq_hessian_merge(c->acc[g], c->acc[c->twin[g] - 1], err);
        c->p->twins_copied++;
    }
    return rc;
}

/* Runs the block over every calibration batch: x = p->acts; y (backend, same shape) may be
 * NULL when only the hooks matter. */
int qd_capture_run(qd_pipeline *p, const qd_block_weights *bw, qd_block_part part, float *y, qd_capture_ctx *c,
                   qd_err *err)
{
    if (part != QD_BLOCK_ALL && !p->mid) return qd_err_set(err, QD_EINVAL, "block forward: no residual-stream buffer");
    p->cost.forward_passes++;
    int64_t n_seq = c && c->n_seq_max > 0 && c->n_seq_max < p->n_seq ? c->n_seq_max : p->n_seq;
    int64_t s0 = c ? c->seq0 : 0;
    int sums = 0;
    for (int g = 0; c && g < QD_MAX_GROUPS; g++) sums |= c->want[g] && c->acc[g];
    /* (A capture part's p has shards only when it sums them over every row: an expert cut's.) */
    if (c) capture_twins(p, bw->block, c);
    int rc = p->n_shards > 1 && sums ? capture_shards(p, bw, part, y, c, s0, n_seq, err)
                                                 : capture_batches(p, bw, part, y, c, s0, n_seq, err);
    if (!rc && c) rc = capture_twins_fill(c, err);
    if (c) memset(c->twin, 0, sizeof c->twin);
    if (rc) return rc;
    if (c && c->routed_seen) p->moe_routed_done = 1;
    return 0;
}

void qd_pipeline_shards_plan(qd_pipeline *p, int64_t shards)
{
    int64_t nb = p->batch_seqs > 0 ? (p->n_seq + p->batch_seqs - 1) / p->batch_seqs : 1;
    int64_t S = shards < nb ? shards : nb;
    if (S < 1) S = 1;
    if (S > 16) S = 16;
    p->n_shards = (int)S;
    for (int64_t s = 0; s <= S; s++) {
        int64_t at = s * nb / S * p->batch_seqs;
        p->shard_starts[s] = at < p->n_seq ? at : p->n_seq;
    }
}

/* A replayed call at the pass's stop group ends nothing: the part's forward stopped there. */
static int replay_input(qd_capture_ctx *c, int group, const qd_input_group *g, const float *x, int64_t rows)
{
    int rc = capture_input(c, -1, group, g, x, rows);
    return rc == QD_ECANCELLED && c->stopped ? 0 : rc;
}

int qd_capture_replay(qd_capture_ctx *c, int group, const float *x, int64_t rows)
{
    qd_pipeline *p = c->p;
    const qd_input_group *g = qd_model_group(p->m, group);
    if (p->be->device < 0) return replay_input(c, group, g, x, rows);
    /* A device backend's hooks read backend memory. */
    size_t bytes = (size_t)(rows * g->k) * sizeof(float);
    float *d = qd_backend_alloc(p->be, bytes);
    if (!d) return qd_err_set(c->err, QD_ENOMEM, "capture: out of memory");
    int rc = qd_backend_upload(p->be, d, x, bytes);
    if (rc) rc = qd_err_set(c->err, rc, "capture: %s", p->be->err.msg);
    if (!rc) rc = replay_input(c, group, g, d, rows);
    qd_backend_free(p->be, d);
    return rc;
}

int qd_capture_mid_from_ctx(qd_pipeline *p, const qd_block_weights *bw, const float *ctx, int64_t ko, qd_err *err)
{
    return qd_capture_mid_from_ctx_range(p, bw, ctx, ko, 0, p->n_seq, err);
}

int qd_capture_mid_from_ctx_range(qd_pipeline *p, const qd_block_weights *bw, const float *ctx, int64_t ko,
                                  int64_t s_begin, int64_t s_end, qd_err *err)
{
    if (!p->mid) return qd_err_set(err, QD_EINVAL, "block forward: no residual-stream buffer");
    const int64_t L = p->seq_len, hidden = p->hidden;
    /* The batches qd_capture_run uses, so each projection has the shape it had there. */
    for (int64_t s0 = s_begin; s0 < s_end; s0 += p->batch_seqs) {
        int64_t nb = s_end - s0 < p->batch_seqs ? s_end - s0 : p->batch_seqs;
        /* ctx may be p->mid itself when ko == hidden: each batch's context sits where
         * its residual stream goes, and is read before that is written. */
        int rc = qd_block_attn_finish(p->m, bw, ctx + s0 * L * ko, p->acts + s0 * L * hidden, p->mid + s0 * L * hidden,
                                      nb * L, err);
        if (rc) return rc;
    }
    return 0;
}

int qd_capture_out_from_act(qd_pipeline *p, const qd_block_weights *bw, const float *act, int64_t kd, float *y,
                            qd_err *err)
{
    return qd_capture_out_from_act_range(p, bw, act, kd, y, 0, p->n_seq, err);
}

int qd_capture_out_from_act_range(qd_pipeline *p, const qd_block_weights *bw, const float *act, int64_t kd, float *y,
                                  int64_t s_begin, int64_t s_end, qd_err *err)
{
    if (!p->mid) return qd_err_set(err, QD_EINVAL, "block forward: no residual-stream buffer");
    const int64_t L = p->seq_len, hidden = p->hidden;
    for (int64_t s0 = s_begin; s0 < s_end; s0 += p->batch_seqs) {
        int64_t nb = s_end - s0 < p->batch_seqs ? s_end - s0 : p->batch_seqs;
        int rc = qd_block_mlp_finish(p->m, bw, act + s0 * L * kd, p->mid + s0 * L * hidden, y + s0 * L * hidden,
                                     nb * L, err);
        if (rc) return rc;
    }
    return 0;
}

void qd_capture_init(qd_capture_ctx *c, qd_pipeline *p, qd_err *err)
{
    memset(c, 0, sizeof *c);
    c->p = p;
    c->stop_after = -1;
    c->xcap_group = -1;
    c->err = err;
}
