/* The block checkpoint file: every tensor of a finished block as the output will hold it. */
#include "quant/pipeline/pipeline_internal.h"
#include "quant/pipeline/output.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/core/log.h"
#include "quant/core/safetensors.h"

/* ---- the block file: every tensor of block i as the output will hold it ---- */

typedef struct blockfile {
    st_writer *w;
    void **bufs;       /* converted copies to free after writing */
    size_t n_bufs, cap_bufs;
} blockfile;

static void *bf_keep(blockfile *b, void *ptr)
{
    if (!ptr) return NULL;
    if (b->n_bufs == b->cap_bufs) {
        size_t cap = b->cap_bufs ? 2 * b->cap_bufs : 32;
        void **nb = realloc(b->bufs, cap * sizeof *nb);
        if (!nb) { free(ptr); return NULL; }
        b->bufs = nb;
        b->cap_bufs = cap;
    }
    b->bufs[b->n_bufs++] = ptr;
    return ptr;
}

/* Adds host F32 data converted to dtype (F32, F16 or BF16). */
static int bf_add_f32(blockfile *b, const char *name, qd_dtype dtype, int ndim, const int64_t *shape,
                      const float *src, size_t n, qd_err *err)
{
    if (dtype != QD_DTYPE_F32 && dtype != QD_DTYPE_F16 && dtype != QD_DTYPE_BF16) dtype = QD_DTYPE_F32;
    void *buf = bf_keep(b, malloc(n * qd_dtype_size(dtype) + 1));
    if (!buf) return qd_err_set(err, QD_ENOMEM, "out of memory");
    qd_convert_from_f32(dtype, src, buf, n);
    return st_writer_add(b->w, name, dtype, ndim, shape, buf, err);
}

int qd_pipeline_write_block_file(qd_pipeline *p, qd_block_weights *bw, int block, qd_linear_out *outs,
                            const int *norm_modified, const char *path, qd_err *err)
{
    const st_model *sm = qd_model_tensors(p->m);
    char prefix[160], name[320];
    qd_model_block_prefix(p->m, block, prefix, sizeof prefix);
    size_t plen = strlen(prefix);
    blockfile b = {0};
    /* tp_aware jobs: reorder the MLP pair now, after the forward used the plain weights. */
    int rc = qd_pipeline_tp_apply_block(p, block, outs, err);
    if (rc) return rc;
    rc = st_writer_init(&b.w);
    if (rc) return qd_err_set(err, rc, "out of memory");
    int nl = qd_model_n_linears(p->m);
    /* Packed and modified tensors first; remember which source names they replace. */
    for (int li = 0; li < nl && !rc; li++) {
        const qd_linear_info *L = qd_model_linear(p->m, li);
        qd_linear_out *o = &outs[li];
        if (!qd_model_block_has_linear(p->m, block, li)) continue;
        if (o->quantized) {
            qd_packed *pk = &o->packed;
            /* The checkpoint tensors and their names are the format's (descriptor tensors()). */
            qd_fmt_tensor ft[QD_FMT_MAX_TENSORS];
            int nft = 0;
            rc = p->fmt->tensors(pk, ft, &nft, err);
            for (int ti = 0; ti < nft && !rc; ti++) {
                int64_t shape[2] = {ft[ti].shape[0], ft[ti].shape[1]};
                if (snprintf(name, sizeof name, "%s%s.%s", prefix, L->name, ft[ti].suffix) >= (int)sizeof name)
                    rc = qd_err_set(err, QD_EINVAL, "%s%s: a tensor name is longer than %zu bytes", prefix, L->name,
                                    sizeof name - 1);
                else
                    rc = st_writer_add(b.w, name, ft[ti].dtype, ft[ti].ndim, shape, ft[ti].data, err);
                /* The writer keeps pointers until st_writer_write: owned copies live as long. */
                if (ft[ti].owned) {
                    void *kept = bf_keep(&b, ft[ti].owned);   /* frees it when it cannot keep it */
                    ft[ti].owned = NULL;
                    if (!kept && !rc) rc = qd_err_set(err, QD_ENOMEM, "out of memory");
                }
            }
            qd_fmt_tensors_free(ft, nft);
            if (!rc && pk->bias) {
                snprintf(name, sizeof name, "%s%s.bias", prefix, L->name);
                rc = st_writer_add(b.w, name, QD_DTYPE_F16, 1, &pk->bias_len, pk->bias, err);
            }
        } else {
            snprintf(name, sizeof name, "%s%s.weight", prefix, L->name);
            const st_tensor *src = st_model_find(sm, name);
            /* A quantized source's linear kept in float (FP8 codes, or a packed layer with no
             * .weight at all) is written dequantized in the model's float dtype: its codes mean
             * nothing without the source's scales, which the output does not carry. */
            int src_float = src && (src->dtype == QD_DTYPE_F32 || src->dtype == QD_DTYPE_F16 || src->dtype == QD_DTYPE_BF16);
            if (!src_float && !o->w_float) {
                rc = qd_err_set(err, QD_ENOTFOUND, "%s: missing from the source model", name);
                break;
            }
            if (o->weight_modified || !src_float) {
                int64_t shape[2] = {L->n, L->k};
                qd_dtype dt = src_float ? src->dtype : qd_output_float_dtype(sm);
                rc = bf_add_f32(&b, name, dt, 2, shape, o->w_float, (size_t)(L->n * L->k), err);
            } else {
                rc = st_writer_add(b.w, name, src->dtype, src->ndim, src->shape, src->data, err);
            }
            if (!rc && L->has_bias) {
                snprintf(name, sizeof name, "%s%s.bias", prefix, L->name);
                src = st_model_find(sm, name);
                /* gpt-oss's experts: read from the fused tensors, written one by one. */
                if (!src && !src_float && o->bias) {
                    rc = bf_add_f32(&b, name, qd_output_float_dtype(sm), 1, &L->n, o->bias, (size_t)L->n, err);
                    continue;
                }
                if (!src) { rc = qd_err_set(err, QD_ENOTFOUND, "%s: missing from the source model", name); break; }
                if (o->bias_modified && o->bias)
                    rc = bf_add_f32(&b, name, src->dtype, 1, &L->n, o->bias, (size_t)L->n, err);
                else
                    rc = st_writer_add(b.w, name, src->dtype, src->ndim, src->shape, src->data, err);
            }
        }
    }
    /* Norms changed by AWQ folding. */
    for (int ni = 0; ni < QD_MAX_NORMS && !rc; ni++) {
        if (!norm_modified[ni]) continue;
        int64_t hidden = p->hidden;
        float *wv = bf_keep(&b, malloc((size_t)hidden * sizeof(float) * 2));
        if (!wv) { rc = qd_err_set(err, QD_ENOMEM, "out of memory"); break; }
        int has_b = qd_model_norm_has_bias(p->m);
        rc = qd_block_norm_get(p->m, bw, ni, wv, has_b ? wv + hidden : NULL, err);
        /* The block holds multipliers (Gemma: 1 + w); the checkpoint stores w. */
        float off = qd_model_norm_offset(p->m);
        for (int64_t i = 0; i < hidden && !rc && off != 0.0f; i++) wv[i] -= off;
        for (int part = 0; part < 1 + has_b && !rc; part++) {
            snprintf(name, sizeof name, "%s%s.%s", prefix, qd_model_norm_name(p->m, ni), part ? "bias" : "weight");
            const st_tensor *src = st_model_find(sm, name);
            if (!src) { rc = qd_err_set(err, QD_ENOTFOUND, "%s: missing from the source model", name); break; }
            rc = bf_add_f32(&b, name, src->dtype, 1, &hidden, wv + part * hidden, (size_t)hidden, err);
        }
    }
    /* A MoE block whose shared input AWQ scaled (norm 1, post_attention_layernorm, changed):
     * the router and the shared-expert gate took the scale on their columns. */
    const char *moe_w[2] = {NULL, NULL};
    const float *moe_src[2] = {bw->router_w, bw->shared_gate_w};
    if (qd_model_block_is_moe(p->m, block) && norm_modified[1]) {
        moe_w[0] = qd_model_moe_router(p->m);
        moe_w[1] = bw->shared_gate_w ? qd_model_moe_shared_gate(p->m) : NULL;
    }
    for (int j = 0; j < 2 && !rc; j++) {
        if (!moe_w[j] || !moe_src[j]) continue;
        snprintf(name, sizeof name, "%s%s.weight", prefix, moe_w[j]);
        const st_tensor *src = st_model_find(sm, name);
        if (!src || src->ndim != 2) { rc = qd_err_set(err, QD_ENOTFOUND, "%s: missing from the source model", name); break; }
        size_t n = (size_t)(src->shape[0] * src->shape[1]);
        float *wv = bf_keep(&b, malloc(n * sizeof(float)));
        if (!wv) { rc = qd_err_set(err, QD_ENOMEM, "out of memory"); break; }
        if ((rc = qd_backend_download(p->be, wv, moe_src[j], n * sizeof(float)))) {
            rc = qd_err_set(err, rc, "%s: %s", name, p->be->err.msg);
            break;
        }
        rc = bf_add_f32(&b, name, src->dtype, 2, src->shape, wv, n, err);
    }
    /* Every other tensor of the block is copied bit-exactly. */
    for (size_t i = 0; i < st_model_count(sm) && !rc; i++) {
        const st_tensor *t = st_model_tensor(sm, i);
        if (strncmp(t->name, prefix, plen) != 0) continue;
        const char *rest = t->name + plen;
        int taken = qd_model_tensor_replaced(p->m, rest);
        for (int li = 0; li < nl && !taken; li++) {
            const char *ln = qd_model_linear(p->m, li)->name;
            size_t l = strlen(ln);
            /* Every parameter of a linear (weight and bias, and a quantized source's qweight,
             * weight_packed, weight_scale, input_scale, weight_scale_inv, ...): the output
             * writes the linear's own tensors above. */
            if (strncmp(rest, ln, l) == 0 && rest[l] == '.' && !strchr(rest + l + 1, '.')) taken = 1;
        }
        for (int ni = 0; ni < QD_MAX_NORMS && !taken; ni++) {
            if (!norm_modified[ni]) continue;
            const char *nn = qd_model_norm_name(p->m, ni);
            size_t l = strlen(nn);
            if (strncmp(rest, nn, l) == 0 && rest[l] == '.') taken = 1;
        }
        for (int j = 0; j < 2 && !taken; j++) {
            if (!moe_w[j]) continue;
            size_t l = strlen(moe_w[j]);
            taken = strncmp(rest, moe_w[j], l) == 0 && !strcmp(rest + l, ".weight");
        }
        if (!taken) rc = st_writer_add(b.w, t->name, t->dtype, t->ndim, t->shape, t->data, err);
    }
    if (!rc) rc = st_writer_write(b.w, path, err);
    st_writer_free(b.w);
    for (size_t i = 0; i < b.n_bufs; i++) free(b.bufs[i]);
    free(b.bufs);
    return rc;
}
