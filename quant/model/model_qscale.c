/* Ministral 3's query scale after RoPE (transformers' get_llama_4_attn_scale): row t of q
 * times 1 + beta ln(1 + floor(pos_t / orig)), in float32 as torch computes it; Llama 4's
 * attn_temperature_tuning on its NoPE layers, 1 + attn_scale ln(1 + floor((pos_t + 1) /
 * floor_scale)). Below the
 * original context the factor is exactly 1, so positions are looked at first and q is only
 * touched (on the host: this is for long sequences, rare in calibration) when a token lies
 * past it. */
#include <math.h>
#include <stdlib.h>

#include "quant/model/model_internal.h"

int qd_fwd_q_pos_scale(qd_model *m, float *q, int64_t rows, const int32_t *pos_be, qd_err *err)
{
    const qd_model_config *c = &m->cfg;
    int64_t width = c->n_heads * c->head_dim;
    int32_t *pos = malloc((size_t)rows * sizeof *pos);
    float *hq = NULL;
    int rc = pos ? qd_backend_download(m->be, pos, pos_be, (size_t)rows * sizeof *pos) : QD_ENOMEM;
    int past = 0;
    /* Llama 4's temperature counts positions from 1 (pos + 1), Ministral 3's from 0. */
    int64_t shift = c->q_pos_scale_nope ? 1 : 0;
    for (int64_t t = 0; !rc && t < rows; t++) past |= pos[t] + shift >= c->q_pos_scale_orig;
    if (!rc && past) {
        hq = malloc((size_t)(rows * width) * sizeof *hq);
        rc = hq ? qd_backend_download(m->be, hq, q, (size_t)(rows * width) * sizeof *hq) : QD_ENOMEM;
        for (int64_t t = 0; !rc && t < rows; t++) {
            float s = 1.0f + c->q_pos_scale_beta * logf(1.0f + floorf((float)(pos[t] + shift) / (float)c->q_pos_scale_orig));
            for (int64_t i = 0; i < width; i++) hq[t * width + i] *= s;
        }
        if (!rc) rc = qd_backend_upload(m->be, q, hq, (size_t)(rows * width) * sizeof *hq);
    }
    if (rc) qd_err_set(err, rc, "block query scale: %s", rc == QD_ENOMEM ? "out of memory" : m->be->err.msg);
    free(pos);
    free(hq);
    return rc;
}
