/* RoPE on interleaved pairs (ERNIE 4.5: dims (x0, x1), (x2, x3), ... turn together, pair i
 * by frequency i) through the backend's rotate-half op: each head of q and k is
 * de-interleaved ([evens | odds]) first, and rotate-half RoPE on that vector is the
 * interleaved rotation with its outputs in the same order. The attention scores are dot
 * products of q and k heads permuted alike, so they are transformers' exactly and the
 * values (never permuted) need nothing. model_mla.c does the same for DeepSeek's rope dims.
 * The permutation runs on the host: a gather of one float per index on the device would
 * cost as much index memory as q itself, and ERNIE's dense models are small. */
#include <stdlib.h>
#include <string.h>

#include "quant/model/model_internal.h"

static int deinterleave(qd_backend *be, float *x, int64_t rows, int64_t heads, int64_t hd, float *host, float *tmp)
{
    size_t bytes = (size_t)(rows * heads * hd) * sizeof(float);
    int rc = qd_backend_download(be, host, x, bytes);
    if (rc) return rc;
    for (int64_t h = 0; h < rows * heads; h++) {
        float *v = host + h * hd;
        for (int64_t i = 0; i < hd / 2; i++) { tmp[i] = v[2 * i]; tmp[hd / 2 + i] = v[2 * i + 1]; }
        memcpy(v, tmp, (size_t)hd * sizeof *v);
    }
    return qd_backend_upload(be, x, host, bytes);
}

int qd_fwd_rope_deinterleave(qd_model *m, float *q, float *k, int64_t rows, qd_err *err)
{
    const qd_model_config *c = &m->cfg;
    int64_t hd = c->head_dim;
    float *host = malloc((size_t)(rows * c->n_heads * hd) * sizeof *host);
    float *tmp = malloc((size_t)hd * sizeof *tmp);
    int rc = host && tmp ? 0 : QD_ENOMEM;
    if (rc) qd_err_set(err, rc, "rope pairs: out of memory for %lld rows", (long long)rows);
    else if ((rc = deinterleave(m->be, q, rows, c->n_heads, hd, host, tmp)) ||
             (rc = deinterleave(m->be, k, rows, c->n_kv_heads, hd, host, tmp)))
        qd_err_set(err, rc, "rope pairs: %s", m->be->err.msg);
    free(host);
    free(tmp);
    return rc;
}
