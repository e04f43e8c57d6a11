/* target_bpw's block-output estimate: what one input group's quantization error does to the
 * block's output, the residual stream every later block reads.
 *
 * Why past the layer: the sum of each linear's own error (tr(D H D^T) / tr(W H W^T) times
 * its output features) ranks wide groups too cheap end to end on SmolLM2-135M (uniform g192
 * 1.31x g64 by that sum, 1.57x by KL), and the plan made from it lost to uniform g64 at the
 * same size. The block's output is where the errors of different linears meet on one scale:
 * a q/k/v or gate/up error is seen through the attention or the activation function and
 * the projections after it, an o_proj error through the MLP too, and all of them relative
 * to the residual stream they are added to.
 *
 * Why per token: the next block reads each token through its RMSNorm (LayerNorm), which
 * divides it by its own size, so an error matters relative to its token's residual stream;
 * a ratio of sums would be ruled by the few tokens with a very large stream (the first
 * token, attention sinks). */
#include "quant/pipeline/pipeline_internal.h"

#include <stdlib.h>
#include <string.h>

double qd_bpw_token_rel_err2(const float *y, const float *yq, int64_t rows, int64_t hidden)
{
    double sum = 0;
    int64_t used = 0;
    for (int64_t r = 0; r < rows; r++) {
        double num = 0, den = 0;
        for (int64_t j = 0; j < hidden; j++) {
            double d = (double)yq[r * hidden + j] - (double)y[r * hidden + j];
            num += d * d;
            den += (double)y[r * hidden + j] * (double)y[r * hidden + j];
        }
        if (den > 0) {
            sum += num / den;
            used++;
        }
    }
    return used ? sum / (double)used : 0.0;
}

typedef struct override_ctx {
    const float *const *w;   /* [QD_MAX_LINEARS]: backend weight to compute with, or NULL */
} override_ctx;

static int override_linear(void *ud, int block, int linear, const float **w, const float **b)
{
    const override_ctx *o = ud;
    (void)block;
    (void)b;   /* a linear's bias is not quantized */
    if (linear >= 0 && linear < QD_MAX_LINEARS && o->w[linear]) *w = o->w[linear];
    return 0;
}

int qd_pipeline_bpw_block_forward(qd_pipeline *p, const qd_block_weights *bw, const float *const *w, int64_t n_seq,
                                  float *y, qd_err *err)
{
    override_ctx o = {w};
    qd_block_hooks hooks = {.ud = &o, .override = override_linear};
    const int64_t L = p->seq_len, hidden = p->hidden;
    if (n_seq > p->n_seq) n_seq = p->n_seq;
    /* The batches qd_capture_run uses, so each projection has the shape it has there. */
    for (int64_t s0 = 0; s0 < n_seq; s0 += p->batch_seqs) {
        int64_t nb = n_seq - s0 < p->batch_seqs ? n_seq - s0 : p->batch_seqs;
        size_t off = (size_t)(s0 * L * hidden);
        int rc = qd_block_forward(p->m, bw, p->acts + off, y + off, nb, L, NULL, w ? &hooks : NULL, err);
        if (rc) return rc;
    }
    return 0;
}
