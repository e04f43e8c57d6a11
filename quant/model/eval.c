/* GPTQ-style perplexity over a token stream (see eval.h): batches of windows run block by
 * block, logits computed one window at a time so the [rows, vocab] buffer stays small. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "quant/model/block.h"
#include "quant/model/eval.h"

qd_eval_opts qd_eval_opts_default(int64_t seq_len)
{
    qd_eval_opts o;
    memset(&o, 0, sizeof o);
    o.seq_len = seq_len;
    return o;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int qd_eval_ppl(qd_model *m, const int32_t *ids, size_t n, const qd_eval_opts *o,
                qd_eval_result *out, qd_err *err)
{
    const qd_model_config *c = qd_model_cfg(m);
    qd_backend *be = qd_model_backend(m);
    int64_t L = o->seq_len, hid = c->hidden, V = c->vocab;
    if (L < 2) return qd_err_set(err, QD_EINVAL, "eval: seq_len %lld must be at least 2", (long long)L);
    if (L > c->max_pos)
        return qd_err_set(err, QD_EINVAL, "eval: seq_len %lld is beyond the model's max_position_embeddings %lld",
                          (long long)L, (long long)c->max_pos);
    int64_t nw = (int64_t)(n / (size_t)L);
    if (o->max_windows > 0 && nw > o->max_windows) nw = o->max_windows;
    if (nw < 1)
        return qd_err_set(err, QD_EINVAL, "eval: %zu tokens do not make one window of %lld", n, (long long)L);
    int64_t brows = o->batch_rows > 0 ? o->batch_rows : 4096;
    int64_t bw = brows / L < 1 ? 1 : brows / L;
    if (bw > nw) bw = nw;
    uint64_t cache = o->cache_bytes ? o->cache_bytes : (1ull << 30);
    int keep = qd_block_bytes(m) * (uint64_t)c->n_layers <= cache;

    double t0 = now_s();
    int rc = 0;
    qd_block_weights **blocks = calloc((size_t)c->n_layers, sizeof *blocks);
    double *nll = malloc((size_t)L * sizeof *nll);
    float *h = qd_backend_alloc(be, (size_t)(bw * L * hid) * sizeof(float));
    float *lg = qd_backend_alloc(be, (size_t)(L * V) * sizeof(float));
    int32_t *tg = qd_backend_alloc(be, (size_t)L * sizeof(int32_t));
    if (!blocks || !nll || !h || !lg || !tg) {
        rc = qd_err_set(err, QD_ENOMEM, "eval: cannot allocate activations for %lld windows of %lld", (long long)bw, (long long)L);
        goto done;
    }
    double sum = 0.0;
    for (int64_t w0 = 0; w0 < nw && !rc; w0 += bw) {
        int64_t b = nw - w0 < bw ? nw - w0 : bw;
        const int32_t *wid = ids + w0 * L;
        if ((rc = qd_model_embed(m, wid, b, L, NULL, h, err))) break;
        for (int i = 0; i < c->n_layers && !rc; i++) {
            if (!blocks[i] && (rc = qd_block_load(m, i, &blocks[i], err))) break;
            rc = qd_block_forward(m, blocks[i], h, h, b, L, NULL, NULL, err);
            if (!keep) { qd_block_free(m, blocks[i]); blocks[i] = NULL; }
        }
        for (int64_t j = 0; j < b && !rc; j++) {
            if ((rc = qd_model_logits(m, h + j * L * hid, L - 1, lg, err))) break;
            if ((rc = qd_backend_upload(be, tg, wid + j * L + 1, (size_t)(L - 1) * sizeof(int32_t))) ||
                (rc = be->ops->nll_rows(be, lg, tg, L - 1, V, nll))) {
                qd_err_set(err, rc, "eval: nll: %s", be->err.msg);
                break;
            }
            for (int64_t t = 0; t < L - 1; t++) sum += nll[t];
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
        out->seconds = now_s() - t0;
    }
done:
    if (blocks) for (int i = 0; i < c->n_layers; i++) qd_block_free(m, blocks[i]);
    free(blocks);
    free(nll);
    qd_backend_free(be, h);
    qd_backend_free(be, lg);
    qd_backend_free(be, tg);
    return rc;
}
