/* GPTQ-style perplexity over a token stream (see eval.h): passes of windows run block by
 * block (each block loaded once per pass, every batch of the pass through it), logits
 * computed one window at a time so the [rows, vocab] buffer stays small. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "quant/core/clock.h"
#include "quant/model/block.h"
#include "quant/model/eval.h"
#include "quant/model/rope.h"

qd_eval_opts qd_eval_opts_default(int64_t seq_len)
{
    qd_eval_opts o;
    memset(&o, 0, sizeof o);
    o.seq_len = seq_len;
    return o;
}

/* Runs the nw windows of L tokens at ids through every block of m into h [nw*L, hidden],
 * block-major: every batch of bw windows goes through block i before block i+1, so each
 * block is loaded (for a packed checkpoint: dequantized) once per call, not once per batch.
 * The batches are the ones a batch-major loop would run (same windows, same order), so the
 * hidden states are the same bit for bit. blocks[i] stays loaded after the call when keep. */
static int eval_hidden(qd_model *m, qd_block_weights **blocks, int keep, const int32_t *ids, int64_t nw,
                       int64_t bw, int64_t L, float *h, qd_err *err)
{
    const qd_model_config *c = qd_model_cfg(m);
    const int64_t stride = L * c->hidden;
    int rc = 0;
    for (int64_t w0 = 0; w0 < nw && !rc; w0 += bw)
        rc = qd_model_embed(m, ids + w0 * L, nw - w0 < bw ? nw - w0 : bw, L, NULL, h + w0 * stride, err);
    for (int i = 0; i < c->n_layers && !rc; i++) {
        if (!blocks[i] && (rc = qd_block_load(m, i, &blocks[i], err))) break;
        for (int64_t w0 = 0; w0 < nw && !rc; w0 += bw) {
            float *hb = h + w0 * stride;
            rc = qd_block_forward(m, blocks[i], hb, hb, nw - w0 < bw ? nw - w0 : bw, L, NULL, NULL, err);
        }
        if (!keep) { qd_block_free(m, blocks[i]); blocks[i] = NULL; }
    }
    return rc;
}

/* Per-window comparison on the host: rows of V logits, KL(P_r || P) per row summed into
 * *kl, the largest into *kl_max, argmax agreements into *agree. */
static void eval_kl_rows(const float *lq, const float *lr, int64_t rows, int64_t V, double *kl,
                         double *kl_max, int64_t *agree)
{
    for (int64_t t = 0; t < rows; t++) {
        const float *q = lq + t * V, *r = lr + t * V;
        int64_t aq = 0, ar = 0;
        for (int64_t v = 1; v < V; v++) {
            if (q[v] > q[aq]) aq = v;
            if (r[v] > r[ar]) ar = v;
        }
        double sq = 0, sr = 0;
        for (int64_t v = 0; v < V; v++) {
            sq += exp((double)q[v] - q[aq]);
            sr += exp((double)r[v] - r[ar]);
        }
        double lse_q = q[aq] + log(sq), lse_r = r[ar] + log(sr), d = 0;
        for (int64_t v = 0; v < V; v++) {
            double lpr = r[v] - lse_r;
            d += exp(lpr) * (lpr - (q[v] - lse_q));
        }
        if (d < 0) d = 0;                 /* rounding: KL is never negative */
        *kl += d;
        if (d > *kl_max) *kl_max = d;
        *agree += aq == ar;
    }
}

int qd_eval_ppl(qd_model *m, const int32_t *ids, size_t n, const qd_eval_opts *o,
                qd_eval_result *out, qd_err *err)
{
    return qd_eval_ppl_vs(m, NULL, ids, n, o, out, err);
}

int qd_eval_ppl_vs(qd_model *m, qd_model *ref, const int32_t *ids, size_t n, const qd_eval_opts *o,
                   qd_eval_result *out, qd_err *err)
{
    const qd_model_config *c = qd_model_cfg(m);
    qd_backend *be = qd_model_backend(m);
    int64_t L = o->seq_len, hid = c->hidden, V = c->vocab;
    if (L < 2) return qd_err_set(err, QD_EINVAL, "eval: seq_len %lld must be at least 2", (long long)L);
    if (L > qd_rope_max_seq(c))
        return qd_err_set(err, QD_EINVAL, "eval: seq_len %lld is beyond the model's max_position_embeddings %lld",
                          (long long)L, (long long)qd_rope_max_seq(c));
    const qd_model_config *rcfg = ref ? qd_model_cfg(ref) : NULL;
    qd_backend *rbe = ref ? qd_model_backend(ref) : NULL;
    if (ref && (rcfg->vocab != V || rcfg->max_pos < L))
        return qd_err_set(err, QD_EINVAL, "eval: the reference model (vocab %lld, max positions %lld) cannot be "
                          "compared with this one (vocab %lld) on windows of %lld",
                          (long long)rcfg->vocab, (long long)rcfg->max_pos, (long long)V, (long long)L);
    int64_t nw = (int64_t)(n / (size_t)L);
    if (o->max_windows > 0 && nw > o->max_windows) nw = o->max_windows;
    if (nw < 1)
        return qd_err_set(err, QD_EINVAL, "eval: %zu tokens do not make one window of %lld", n, (long long)L);
    int64_t brows = o->batch_rows > 0 ? o->batch_rows : 4096;
    int64_t bw = brows / L < 1 ? 1 : brows / L;
    if (bw > nw) bw = nw;
    /* A pass holds the hidden states of pw windows (a whole number of batches) for every
     * block; a stream longer than the activation budget takes several passes, and each pass
     * loads every block once. */
    uint64_t act = o->act_bytes ? o->act_bytes : QD_EVAL_ACT_BYTES_DEFAULT;
    uint64_t win_bytes = (uint64_t)L * (uint64_t)(hid + (ref ? rcfg->hidden : 0)) * sizeof(float);
    int64_t pw = (int64_t)(act / win_bytes) / bw * bw;
    if (pw < bw) pw = bw;
    if (pw > nw) pw = nw;
    /* Blocks stay loaded between passes when they fit the cache; one pass needs no keeping. */
    uint64_t cache = o->cache_bytes ? o->cache_bytes : (1ull << 30);
    int keep = pw < nw && qd_block_bytes(m) * (uint64_t)c->n_layers <= cache;
    int rkeep = ref && pw < nw && qd_block_bytes(ref) * (uint64_t)rcfg->n_layers <= cache;

    double t0 = qd_clock_now_s();
    int rc = 0;
    qd_block_weights **blocks = calloc((size_t)c->n_layers, sizeof *blocks);
    qd_block_weights **rblocks = ref ? calloc((size_t)rcfg->n_layers, sizeof *rblocks) : NULL;
    double *nll = malloc((size_t)L * sizeof *nll);
    float *h = qd_backend_alloc(be, (size_t)(pw * L * hid) * sizeof(float));
    float *lg = qd_backend_alloc(be, (size_t)(L * V) * sizeof(float));
    int32_t *tg = qd_backend_alloc(be, (size_t)L * sizeof(int32_t));
    float *rh = ref ? qd_backend_alloc(rbe, (size_t)(pw * L * rcfg->hidden) * sizeof(float)) : NULL;
    float *rlg = ref ? qd_backend_alloc(rbe, (size_t)(L * V) * sizeof(float)) : NULL;
    int32_t *rtg = ref ? qd_backend_alloc(rbe, (size_t)L * sizeof(int32_t)) : NULL;
    float *hq = ref ? malloc((size_t)(L * V) * sizeof(float)) : NULL;    /* host logits */
    float *hr = ref ? malloc((size_t)(L * V) * sizeof(float)) : NULL;
    if (!blocks || !nll || !h || !lg || !tg || (ref && (!rblocks || !rh || !rlg || !rtg || !hq || !hr))) {
        rc = qd_err_set(err, QD_ENOMEM, "eval: cannot allocate activations for %lld windows of %lld", (long long)pw, (long long)L);
        goto done;
    }
    double sum = 0.0, rsum = 0.0, kl = 0.0, kl_max = 0.0;
    int64_t agree = 0;
    for (int64_t w0 = 0; w0 < nw && !rc; w0 += pw) {
        int64_t b = nw - w0 < pw ? nw - w0 : pw;
        const int32_t *wid = ids + w0 * L;
        if ((rc = eval_hidden(m, blocks, keep, wid, b, bw, L, h, err))) break;
        if (ref && (rc = eval_hidden(ref, rblocks, rkeep, wid, b, bw, L, rh, err))) break;
        for (int64_t j = 0; j < b && !rc; j++) {
            if ((rc = qd_model_logits(m, h + j * L * hid, L - 1, lg, err))) break;
            if ((rc = qd_backend_upload(be, tg, wid + j * L + 1, (size_t)(L - 1) * sizeof(int32_t))) ||
                (rc = be->ops->nll_rows(be, lg, tg, L - 1, V, nll))) {
                qd_err_set(err, rc, "eval: nll: %s", be->err.msg);
                break;
            }
            for (int64_t t = 0; t < L - 1; t++) sum += nll[t];
            if (!ref) continue;
            if ((rc = qd_model_logits(ref, rh + j * L * rcfg->hidden, L - 1, rlg, err))) break;
            if ((rc = qd_backend_upload(rbe, rtg, wid + j * L + 1, (size_t)(L - 1) * sizeof(int32_t))) ||
                (rc = rbe->ops->nll_rows(rbe, rlg, rtg, L - 1, V, nll)) ||
                (rc = qd_backend_download(be, hq, lg, (size_t)((L - 1) * V) * sizeof(float))) ||
                (rc = qd_backend_download(rbe, hr, rlg, (size_t)((L - 1) * V) * sizeof(float)))) {
                qd_err_set(err, rc, "eval: reference: %s", rbe->err.msg[0] ? rbe->err.msg : be->err.msg);
                break;
            }
            for (int64_t t = 0; t < L - 1; t++) rsum += nll[t];
            eval_kl_rows(hq, hr, L - 1, V, &kl, &kl_max, &agree);
        }
        if (!rc && o->progress && o->progress(o->ud, w0 + b, nw))
            rc = qd_err_set(err, QD_ECANCELLED, "eval: cancelled after %lld of %lld windows", (long long)(w0 + b), (long long)nw);
    }
    if (!rc) {
        memset(out, 0, sizeof *out);
        out->windows = nw;
        out->seq_len = L;
        out->tokens = nw * L;
        out->predicted = nw * (L - 1);
        out->nll_sum = sum;
        out->mean_nll = sum / (double)out->predicted;
        out->ppl = exp(out->mean_nll);
        if (ref) {
            out->has_ref = 1;
            out->ref_ppl = exp(rsum / (double)out->predicted);
            out->kl_mean = kl / (double)out->predicted;
            out->kl_max = kl_max;
            out->top1_agree = (double)agree / (double)out->predicted;
        }
        out->seconds = qd_clock_now_s() - t0;
    }
done:
    if (blocks) for (int i = 0; i < c->n_layers; i++) qd_block_free(m, blocks[i]);
    if (rblocks) for (int i = 0; i < rcfg->n_layers; i++) qd_block_free(ref, rblocks[i]);
    free(blocks);
    free(rblocks);
    free(nll);
    free(hq);
    free(hr);
    qd_backend_free(be, h);
    qd_backend_free(be, lg);
    qd_backend_free(be, tg);
    if (ref) {
        qd_backend_free(rbe, rh);
        qd_backend_free(rbe, rlg);
        qd_backend_free(rbe, rtg);
    }
    return rc;
}
