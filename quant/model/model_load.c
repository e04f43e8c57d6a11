/* Opening a checkpoint and materialising weights: config + architecture lookup, up-front
 * validation of every tensor the forward needs (presence and shape, named in the error),
 * and loading one block's linears and norms as F32 backend memory — converting F16/BF16
 * from the mmapped files, dequantizing packed GPTQ/AWQ linears read through the format
 * table with the CPU kernel's decoder, or an FP8-block source checkpoint's F8_E4M3 linears
 * with their weight_scale_inv blocks (model_fp8.c). Every float value loaded is scanned for NaN and
 * infinity as it is converted (quant/core/finite.h), the embeddings, positions and a large
 * lm_head at open: a non-finite value fails the load naming the tensor and the element. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/core/confine.h"
#include "quant/core/finite.h"
#include "quant/core/fsutil.h"
#include "quant/core/log.h"
#include "quant/core/parallel.h"
#include "quant/formats/fmt_gptq_dynamic.h"
#include "quant/formats/format.h"
#include "quant/kernels/kernels.h"
#include "quant/model/model_fp8.h"
#include "quant/model/model_internal.h"

/* lm_head is kept converted in backend memory when it is at most this big; larger ones
 * are converted in chunks of rows each time logits are computed. */
#define QD_LM_HEAD_KEEP_BYTES (256ull << 20)
#define QD_LM_CHUNK_BYTES (64ull << 20)

const char *qd_model_tname(const qd_model *m, const char *canonical)
{
    if (m->strip_prefix && !strncmp(canonical, "model.", 6)) return canonical + 6;
    if (m->text_prefix) {
        /* A vision-language checkpoint's text tower (see find_text_tower): the name is
         * built in one of a few buffers of the thread's, each used until it comes round
         * again (a caller uses the name at once or copies it). */
        static _Thread_local char ring[8][320];
        static _Thread_local unsigned next;
        char *b = ring[next++ % 8];
        if (!strncmp(canonical, "model.", 6)) snprintf(b, sizeof ring[0], "%s%s", m->text_prefix, canonical + 6);
        else if (!strncmp(canonical, "lm_head.", 8)) snprintf(b, sizeof ring[0], "%s%s", m->lm_prefix, canonical);
        else return canonical;
        return b;
    }
    return canonical;
}

const st_tensor *qd_model_tfind(const qd_model *m, const char *canonical)
{
    return st_model_find(m->st, qd_model_tname(m, canonical));
}

int64_t qd_model_dim(const qd_model *m, qd_dim d)
{
    switch (d) {
    case QD_DIM_HIDDEN: return m->cfg.hidden;
    case QD_DIM_Q: return m->cfg.n_heads * m->cfg.head_dim;
    case QD_DIM_KV: return m->cfg.n_kv_heads * m->cfg.head_dim;
    case QD_DIM_FF: return m->cfg.intermediate;
    case QD_DIM_QKV: return (m->cfg.n_heads + 2 * m->cfg.n_kv_heads) * m->cfg.head_dim;
    case QD_DIM_FF2: return 2 * m->cfg.intermediate;
    case QD_DIM_QLORA: return m->cfg.q_lora_rank;
    case QD_DIM_QHEADS: return m->cfg.n_heads * (m->cfg.qk_nope_dim + m->cfg.qk_rope_dim);
    case QD_DIM_KVA: return m->cfg.kv_lora_rank + m->cfg.qk_rope_dim;
    case QD_DIM_KVLORA: return m->cfg.kv_lora_rank;
    case QD_DIM_KVB: return m->cfg.n_heads * (m->cfg.qk_nope_dim + m->cfg.v_head_dim);
    case QD_DIM_VO: return m->cfg.n_heads * m->cfg.v_head_dim;
    case QD_DIM_IDXQ: return m->cfg.index_heads * m->cfg.index_head_dim;
    case QD_DIM_Q2: return 2 * m->cfg.n_heads * m->cfg.head_dim;
    case QD_DIM_GDN_QKVZ: return 2 * m->cfg.gdn_k_heads * m->cfg.gdn_k_dim + 2 * m->cfg.gdn_v_heads * m->cfg.gdn_v_dim;
    case QD_DIM_GDN_BA: return 2 * m->cfg.gdn_v_heads;
    case QD_DIM_GDN_QKV: return 2 * m->cfg.gdn_k_heads * m->cfg.gdn_k_dim + m->cfg.gdn_v_heads * m->cfg.gdn_v_dim;
    case QD_DIM_GDN_V: return m->cfg.gdn_v_heads * m->cfg.gdn_v_dim;
    case QD_DIM_GDN_H: return m->cfg.gdn_v_heads;
    case QD_DIM_HIDDEN3: return 3 * m->cfg.hidden;
    case QD_DIM_SSM_INNER: return m->cfg.mixer.ssm_heads * m->cfg.mixer.ssm_head_dim;
    case QD_DIM_SSM_IN: {
        const qd_mixer_config *x = &m->cfg.mixer;
        int64_t inner = x->ssm_heads * x->ssm_head_dim;
        return 2 * inner + 2 * x->ssm_groups * x->ssm_state + x->ssm_heads;
    }
    }
    return 0;
}

void *qd_model_scratch(qd_model *m, int slot, size_t bytes, qd_err *err)
{
    if (bytes == 0) bytes = 16;
    if (m->scratch[slot] && m->scratch_cap[slot] >= bytes) return m->scratch[slot];
    qd_backend_free(m->be, m->scratch[slot]);
    m->scratch_cap[slot] = 0;
    m->scratch[slot] = qd_backend_alloc(m->be, bytes);
    if (!m->scratch[slot]) {
        qd_err_set(err, QD_ENOMEM, "model: cannot allocate %zu bytes of %s scratch memory", bytes, m->be->name);
        return NULL;
    }
    m->scratch_cap[slot] = bytes;
    return m->scratch[slot];
}

/* Checks a tensor's shape against the expected one; the error names both. */
static int check_shape(const st_tensor *t, const char *name, int ndim, const int64_t *shape, qd_err *err)
{
    int ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == shape[i];
    if (ok) return 0;
    char got[128] = "", want[128] = "";
    for (int i = 0; i < t->ndim; i++)
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    for (int i = 0; i < ndim; i++)
        snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", i ? ", " : "", (long long)shape[i]);
    return qd_err_set(err, QD_ESHAPE, "tensor '%s': shape [%s] does not match [%s] from config.json", name, got, want);
}

static int is_float(qd_dtype t) { return t == QD_DTYPE_F32 || t == QD_DTYPE_F16 || t == QD_DTYPE_BF16; }

/* Finds a float tensor and checks its shape. */
static int find_float(const qd_model *m, const char *canonical, int ndim, const int64_t *shape,
                      const st_tensor **out, qd_err *err)
{
    const char *name = qd_model_tname(m, canonical);
    const st_tensor *t = st_model_find(m->st, name);
    if (!t) return qd_err_set(err, QD_ENOTFOUND, "%s: tensor '%s' is missing", m->dir, name);
    if (t->dtype == QD_DTYPE_F8_E4M3 && !m->cfg.source_fp8 && !m->cfg.quantized)
        return qd_err_set(err, QD_EFORMAT, "tensor '%s': dtype F8_E4M3, but config.json's quantization_config does not "
                          "say how it is scaled (quant_method \"fp8\" with weight_block_size, as DeepSeek-V3 ships, or "
                          "a compressed-tensors format)", name);
    if (!is_float(t->dtype))
        return qd_err_set(err, QD_EFORMAT, "tensor '%s': dtype %s is not F32, F16 or BF16", name, qd_dtype_name(t->dtype));
    int rc = check_shape(t, name, ndim, shape, err);
    if (rc) return rc;
    *out = t;
    return 0;
}

int qd_model_find_float(const qd_model *m, const char *canonical, int ndim, const int64_t *shape, const st_tensor **out,
                        qd_err *err)
{
    return find_float(m, canonical, ndim, shape, out, err);
}

/* The refusal of a loaded tensor (name, of shape[ndim]) whose element `at` (flat) is v, not
 * finite. A NaN or infinity in any weight (a norm, a bias, an embedding, a router) makes
 * every output it reaches NaN; found where it is read, it is named, rather than surfacing as
 * a kernel check's mismatch or a quantized model that produces NaN. */
int qd_model_refuse_nonfinite(const char *name, int ndim, const int64_t *shape, int64_t at, float v, qd_err *err)
{
    char idx[96] = "";
    int64_t rest = at;
    for (int d = ndim - 1; d >= 0; d--) {
        int64_t dim = shape[d] > 0 ? shape[d] : 1;
        char one[24], tmp[96];
        snprintf(one, sizeof one, "%lld", (long long)(rest % dim));
        snprintf(tmp, sizeof tmp, "[%s]%s", one, idx);
        snprintf(idx, sizeof idx, "%s", tmp);
        rest /= dim;
    }
    return qd_err_set(err, QD_ENUMERIC, "tensor '%s': element %s is %s, not a finite number: the checkpoint is "
                      "damaged (every output computed from it would be NaN)", name, idx[0] ? idx : "[0]",
                      isnan(v) ? "NaN" : v > 0 ? "+inf" : "-inf");
}

/* x holds t's values as F32 (host memory): 0 when all are finite. */
static int check_finite(const st_tensor *t, const float *x, qd_err *err)
{
    int64_t i = qd_f32_first_nonfinite(x, (int64_t)t->numel);
    return i < 0 ? 0 : qd_model_refuse_nonfinite(t->name, t->ndim, t->shape, i, x[i], err);
}

/* A large tensor converted (and scanned) on the backend's CPU threads, each share a
 * contiguous range of elements (the pages of the mapped file fault in on them too): into dst
 * when it is given (host memory), else a chunk at a time into a buffer of the share's own,
 * for tensors that are only scanned. */
#define SCAN_CHUNK 4096
typedef struct convert_share {
    const st_tensor *t;
    float *dst;
    int failed;
    int64_t bad[QD_PARALLEL_MAX_THREADS];   /* each share's first non-finite element, or -1 */
} convert_share;

static void convert_range(void *ctx, int th, int64_t lo, int64_t hi)
{
    convert_share *c = ctx;
    size_t esz = qd_dtype_size(c->t->dtype);
    const unsigned char *src = c->t->data;
    float chunk[SCAN_CHUNK];
    for (int64_t a = lo; a < hi && c->bad[th] < 0; a += c->dst ? hi - lo : SCAN_CHUNK) {
        int64_t n = c->dst ? hi - lo : (hi - a < SCAN_CHUNK ? hi - a : SCAN_CHUNK);
        float *out = c->dst ? c->dst + a : chunk;
        if (qd_convert_to_f32(c->t->dtype, src + (size_t)a * esz, out, (size_t)n) != 0) {
            c->failed = 1;   /* any share's failure: the caller converts again to name the error */
            return;
        }
        int64_t i = qd_f32_first_nonfinite(out, n);
        if (i >= 0) c->bad[th] = a + i;
    }
}

#define CONVERT_PARALLEL_MIN ((int64_t)1 << 20)

/* Converts t on the backend's threads (into dst, or only scanning it when dst is NULL);
 * returns 1 when it did (0: too small, one thread, or a misaligned mapping: the caller
 * converts it itself), with *bad its first non-finite element or -1. */
static int convert_parallel(qd_model *m, const st_tensor *t, float *dst, int64_t *bad)
{
    if (m->be->n_threads <= 1 || (int64_t)t->numel < CONVERT_PARALLEL_MIN || !t->data ||
        (uintptr_t)t->data % qd_dtype_size(t->dtype) != 0)
        return 0;
    convert_share *c = malloc(sizeof *c);
    if (!c) return 0;
    c->t = t;
    c->dst = dst;
    c->failed = 0;
    for (int i = 0; i < QD_PARALLEL_MAX_THREADS; i++) c->bad[i] = -1;
    qd_parallel_for(m->be->n_threads, (int64_t)t->numel, SCAN_CHUNK, convert_range, c);
    *bad = -1;
    for (int i = 0; i < QD_PARALLEL_MAX_THREADS; i++)
        if (c->bad[i] >= 0 && (*bad < 0 || c->bad[i] < *bad)) *bad = c->bad[i];
    int done = !c->failed;
    free(c);
    return done;
}

/* Reads t's values without keeping them, and refuses a non-finite one (the embeddings, the
 * learned positions and a large lm_head, which are converted row by row where they are
 * used). */
static int scan_tensor(qd_model *m, const st_tensor *t, qd_err *err)
{
    int64_t bad = -1;
    if (!convert_parallel(m, t, NULL, &bad)) {
        size_t esz = qd_dtype_size(t->dtype);
        float *chunk = malloc(SCAN_CHUNK * sizeof *chunk);
        if (!chunk) return qd_err_set(err, QD_ENOMEM, "tensor '%s': out of memory", t->name);
        for (int64_t a = 0; a < (int64_t)t->numel && bad < 0; a += SCAN_CHUNK) {
            int64_t n = (int64_t)t->numel - a < SCAN_CHUNK ? (int64_t)t->numel - a : SCAN_CHUNK;
            if (qd_convert_to_f32(t->dtype, (const unsigned char *)t->data + (size_t)a * esz, chunk, (size_t)n) != 0) {
                free(chunk);
                return qd_err_set(err, QD_EFORMAT, "tensor '%s': cannot convert %s to F32", t->name,
                                  qd_dtype_name(t->dtype));
            }
            int64_t i = qd_f32_first_nonfinite(chunk, n);
            if (i >= 0) bad = a + i;
        }
        free(chunk);
    }
    if (bad < 0) return 0;
    float v = 0;
    qd_convert_to_f32(t->dtype, (const unsigned char *)t->data + (size_t)bad * qd_dtype_size(t->dtype), &v, 1);
    return qd_model_refuse_nonfinite(t->name, t->ndim, t->shape, bad, v, err);
}

/* Converts t into backend memory dst (numel floats), refusing a non-finite value: directly
 * on the CPU backend, through a host buffer elsewhere. */
static int tensor_to_backend(qd_model *m, const st_tensor *t, float *dst, qd_err *err)
{
    int64_t bad = -1;
    if (m->be->device < 0 && convert_parallel(m, t, dst, &bad))
        return bad < 0 ? 0 : qd_model_refuse_nonfinite(t->name, t->ndim, t->shape, bad, dst[bad], err);
    if (m->be->device < 0) {
        int rc = st_tensor_read_f32(t, dst, err);
        return rc ? rc : check_finite(t, dst, err);
    }
    float *host = malloc(t->numel * sizeof *host);
    if (!host) return qd_err_set(err, QD_ENOMEM, "tensor '%s': out of memory", t->name);
    int rc = st_tensor_read_f32(t, host, err);
    if (!rc) rc = check_finite(t, host, err);
    if (!rc && (rc = qd_backend_upload(m->be, dst, host, t->numel * sizeof *host)))
        qd_err_set(err, rc, "tensor '%s': upload failed: %s", t->name, m->be->err.msg);
    free(host);
    return rc;
}

int qd_model_load_f32(qd_model *m, const char *canonical, int ndim, const int64_t *shape,
                      float **out, qd_err *err)
{
    const st_tensor *t = NULL;
    int rc = find_float(m, canonical, ndim, shape, &t, err);
    if (rc) return rc;
    float *p = qd_backend_alloc(m->be, t->numel * sizeof(float));
    if (!p) return qd_err_set(err, QD_ENOMEM, "tensor '%s': cannot allocate %llu floats", t->name, (unsigned long long)t->numel);
    if ((rc = tensor_to_backend(m, t, p, err))) { qd_backend_free(m->be, p); return rc; }
    *out = p;
    return 0;
}

/* A norm's weight as the multiplier the forward uses: offset + w (Gemma's (1 + w)), summed
 * in float32 as transformers does. */
static int load_norm(qd_model *m, const char *canonical, int64_t len, float **out, qd_err *err)
{
    float off = m->cfg.norm_offset;
    if (off == 0.0f) return qd_model_load_f32(m, canonical, 1, &len, out, err);
    const st_tensor *t = NULL;
    int rc = find_float(m, canonical, 1, &len, &t, err);
    if (rc) return rc;
    float *host = malloc((size_t)len * sizeof *host);
    float *p = host ? qd_backend_alloc(m->be, (size_t)len * sizeof(float)) : NULL;
    if (!p) { free(host); return qd_err_set(err, QD_ENOMEM, "tensor '%s': out of memory", t->name); }
    if (!(rc = st_tensor_read_f32(t, host, err)) && !(rc = check_finite(t, host, err))) {
        for (int64_t i = 0; i < len; i++) host[i] += off;
        if ((rc = qd_backend_upload(m->be, p, host, (size_t)len * sizeof *host)))
            qd_err_set(err, rc, "tensor '%s': upload failed: %s", t->name, m->be->err.msg);
    }
    free(host);
    if (rc) { qd_backend_free(m->be, p); return rc; }
    *out = p;
    return 0;
}

/* ---- packed (quantized) linears ---- */

/* The format descriptor's read() finds "<base>.<suffix>" among the model's tensors. */
static const st_tensor *model_lookup(const void *m, const char *name) { return qd_model_tfind(m, name); }

/* Dequantizes linear `base` (canonical name without suffix) of shape [n, k] into host or
 * backend-on-CPU memory w: the checkpoint's format descriptor reads its tensors, and the
 * CPU kernel's bulk decoder (bit for bit the descriptor's dequant_ref) decodes them on the
 * backend's CPU threads (one for a GPU backend). */
static int load_packed(qd_model *m, const char *base, int64_t n, int64_t k, float *w, qd_err *err)
{
    qd_fmt_named ctx = {model_lookup, m, base};
    return qd_model_load_packed_find(m, qd_fmt_find_named, &ctx, base, n, k, w, err);
}

int qd_model_load_packed_find(qd_model *m, qd_fmt_find_fn find, void *ud, const char *base, int64_t n, int64_t k,
                              float *w, qd_err *err)
{
    const qd_format *fmt = qd_format_find(m->cfg.quant_format);
    if (!fmt) return qd_err_set(err, QD_EUNSUPPORTED, "%s: quantization format '%s' is not in the format table", m->dir, m->cfg.quant_format);
    qd_fmt_detected d = {.bits = m->cfg.quant_bits, .group_size = m->cfg.quant_group_size, .sym = m->cfg.quant_sym,
                         .desc_act = m->cfg.quant_desc_act, .grid = (qd_grid)m->cfg.quant_grid,
                         .scale_rule = (qd_scale_rule)m->cfg.quant_scale_rule, .row_block = m->cfg.quant_row_block};
    qd_packed p;
    int rc = fmt->read(find, ud, n, k, &d, &p, err);
    if (!rc && m->gptq_rules) {
        /* A mixed GPTQ checkpoint: the widths read from the tensors are the ones its rules give. */
        char name[512];
        snprintf(name, sizeof name, "%s", qd_model_tname(m, base));   /* a module name: no ".weight" */
        if ((rc = qd_gptq_dynamic_agree(m->gptq_rules, name, p.bits, p.group_size, k, err))) {
            qd_packed_free(&p);
            return rc;   /* the message names the module */
        }
    }
    if (!rc) {
        rc = qd_kernel_dequant_cpu(fmt, &p, w, m->be->n_threads, QD_KCPU_AUTO, err);
        qd_packed_free(&p);
    }
    if (rc) return qd_err_prefix(err, "%s (%s)", qd_model_tname(m, base), fmt->name);
    /* A scale that is not finite dequantizes to weights that are not. */
    int64_t i = qd_f32_first_nonfinite(w, n * k), shape[2] = {n, k};
    char name[600];
    snprintf(name, sizeof name, "%s (%s, dequantized)", qd_model_tname(m, base), fmt->name);
    return i < 0 ? 0 : qd_model_refuse_nonfinite(name, 2, shape, i, w[i], err);
}

/* Loads linear li of block `block` into new backend memory w (and bias b when present). */
static int load_linear(qd_model *m, int block, int li, float **w_out, float **b_out, qd_err *err)
{
    const qd_linear_info *L = &m->lin[li];
    char base[512], name[600];
    snprintf(base, sizeof base, m->arch->block_fmt, block);
    strncat(base, L->name, sizeof base - strlen(base) - 1);
    snprintf(name, sizeof name, "%s.weight", base);
    int64_t shape[2] = {L->n, L->k};
    int rc;
    float *w = qd_backend_alloc(m->be, (size_t)(L->n * L->k) * sizeof(float)), *b = NULL;
    if (!w) return qd_err_set(err, QD_ENOMEM, "%s: cannot allocate its F32 weight", name);
    const st_tensor *wt = qd_model_tfind(m, name);
    if (!wt && L->expert >= 0 && qd_gptoss_fused_present(m, block)) {
        /* gpt-oss, Llama 4: a slice of the block's fused 3-D expert tensors, with its bias
         * where the experts have one (gpt-oss). */
        float *host = w, *hb = NULL;
        rc = 0;
        if (m->be->device >= 0 && !(host = malloc((size_t)(L->n * L->k) * sizeof *host))) {
            rc = qd_err_set(err, QD_ENOMEM, "%s: out of memory", base);
            goto fail;
        }
        /* Granite's and Llama 4's fused experts have no biases. */
        if (L->has_bias) {
            b = qd_backend_alloc(m->be, (size_t)L->n * sizeof(float));
            hb = !b ? NULL : m->be->device >= 0 ? malloc((size_t)L->n * sizeof *hb) : b;
            if (!hb) rc = qd_err_set(err, QD_ENOMEM, "%s: out of memory", base);
        }
        if (!rc) rc = qd_gptoss_load_expert(m, block, li, host, hb, err);
        if (!rc && host != w && (rc = qd_backend_upload(m->be, w, host, (size_t)(L->n * L->k) * sizeof *host)))
            qd_err_set(err, rc, "%s: upload failed: %s", base, m->be->err.msg);
        if (!rc && hb != b && (rc = qd_backend_upload(m->be, b, hb, (size_t)L->n * sizeof *hb)))
            qd_err_set(err, rc, "%s: upload failed: %s", base, m->be->err.msg);
        if (host != w) free(host);
        if (hb != b) free(hb);
        if (rc) { qd_backend_free(m->be, b); goto fail; }
        *w_out = w;
        *b_out = b;
        return 0;
    }
    if (wt && wt->dtype == QD_DTYPE_F8_E4M3 && m->cfg.source_fp8) {
        /* An FP8-block source linear: dequantized here, block scale by block scale. */
        float *host = w;
        if (m->be->device >= 0 && !(host = malloc((size_t)(L->n * L->k) * sizeof *host))) {
            rc = qd_err_set(err, QD_ENOMEM, "%s: out of memory", base);
            goto fail;
        }
        rc = qd_fp8_load(m, name, wt, L->n, L->k, host, err);
        if (!rc && host != w && (rc = qd_backend_upload(m->be, w, host, (size_t)(L->n * L->k) * sizeof *host)))
            qd_err_set(err, rc, "tensor '%s': upload failed: %s", wt->name, m->be->err.msg);
        if (host != w) free(host);
        if (rc) goto fail;
    } else if (wt && !(wt->dtype == QD_DTYPE_F8_E4M3 && m->cfg.quantized)) {
        const st_tensor *t;
        if ((rc = find_float(m, name, 2, shape, &t, err)) || (rc = tensor_to_backend(m, t, w, err))) goto fail;
        /* Converted: its mapped pages need not stay resident (a job maps the whole model
         * and reads each block once; the page cache keeps the bytes). */
        st_tensor_release(t);
    } else if (m->cfg.quantized) {
        /* Packed, or an F8_E4M3 `weight` of a quantized checkpoint: a float-quantized format
         * (compressed-tensors FP8, whose main tensor is "weight") reads it with its scales. */
        float *host = w;
        if (m->be->device >= 0 && !(host = malloc((size_t)(L->n * L->k) * sizeof *host))) {
            rc = qd_err_set(err, QD_ENOMEM, "%s: out of memory", base);
            goto fail;
        }
        rc = load_packed(m, base, L->n, L->k, host, err);
        if (!rc && host != w) rc = qd_backend_upload(m->be, w, host, (size_t)(L->n * L->k) * sizeof *host);
        if (host != w) free(host);
        if (rc) goto fail;
    } else {
        rc = qd_err_set(err, QD_ENOTFOUND, "%s: tensor '%s' is missing", m->dir, qd_model_tname(m, name));
        goto fail;
    }
    if (L->has_bias) {
        snprintf(name, sizeof name, "%s.bias", base);
        if ((rc = qd_model_load_f32(m, name, 1, &L->n, &b, err))) goto fail;
    }
    *w_out = w;
    *b_out = b;
    return 0;
fail:
    qd_backend_free(m->be, w);
    return rc;
}

/* The routings that read a router bias (DeepSeek-V3's and ERNIE's e_score_correction_bias,
 * gpt-oss's router.bias) where the architecture stores one. */
static int router_bias_used(const qd_model *m)
{
    return m->arch->router_bias && (m->cfg.moe_scoring == QD_MOE_SIGMOID_GROUPED || m->cfg.moe_scoring == QD_MOE_SOFTMAX_BIAS ||
                                    m->cfg.moe_scoring == QD_MOE_TOPK_SOFTMAX);
}

/* MoE: the router [n_experts, hidden] and Qwen2-MoE's shared-expert gate [1, hidden], in
 * float (loaders never quantize them). */
static int load_router(qd_model *m, int block, qd_block_weights *bw, qd_err *err)
{
    char name[512];
    int n = snprintf(name, sizeof name, m->arch->block_fmt, block);
    snprintf(name + n, sizeof name - n, "%s.weight", m->arch->router);
    int64_t rs[2] = {m->cfg.n_experts, m->cfg.hidden}, gs[2] = {1, m->cfg.hidden};
    int rc = qd_model_load_f32(m, name, 2, rs, &bw->router_w, err);
    if (!rc && m->cfg.shared_intermediate > 0 && m->arch->shared_gate) {
        snprintf(name + n, sizeof name - n, "%s.weight", m->arch->shared_gate);
        rc = qd_model_load_f32(m, name, 2, gs, &bw->shared_gate_w, err);
    }
    if (!rc && router_bias_used(m)) {
        int64_t bs[2] = {1, m->cfg.n_experts};
        snprintf(name + n, sizeof name - n, "%s", m->arch->router_bias);
        rc = m->arch->router_bias_2d ? qd_model_load_f32(m, name, 2, bs, &bw->router_bias, err)
                                     : qd_model_load_f32(m, name, 1, &m->cfg.n_experts, &bw->router_bias, err);
    }
    return rc;
}

/* A Gated DeltaNet layer's float parameters (block.h): into bw, or when bw is NULL only
 * found and checked (validate_blocks). The gated norm's weight is used as stored (the
 * model's norm_offset is its other norms'). */
static int gdn_params(qd_model *m, int block, qd_block_weights *bw, qd_err *err)
{
    const qd_model_config *c = &m->cfg;
    char name[512];
    int n = snprintf(name, sizeof name, m->arch->block_fmt, block);
    int64_t conv[3] = {qd_model_dim(m, QD_DIM_GDN_QKV), 1, c->gdn_conv}, nv = c->gdn_v_heads, dv = c->gdn_v_dim;
    static const char *const names[4] = {"linear_attn.conv1d.weight", "linear_attn.A_log", "linear_attn.dt_bias",
                                         "linear_attn.norm.weight"};
    const int64_t *shapes[4] = {conv, &nv, &nv, &dv};
    float *tmp[4] = {0};
    float **dst[4] = {bw ? &bw->gdn_conv_w : &tmp[0], bw ? &bw->gdn_a_log : &tmp[1], bw ? &bw->gdn_dt_bias : &tmp[2],
                      bw ? &bw->gdn_norm_w : &tmp[3]};
    for (int i = 0; i < 4; i++) {
        snprintf(name + n, sizeof name - n, "%s", names[i]);
        const st_tensor *t;
        int rc = bw ? qd_model_load_f32(m, name, i ? 1 : 3, shapes[i], dst[i], err)
                    : find_float(m, name, i ? 1 : 3, shapes[i], &t, err);
        if (rc) return rc;
    }
    return 0;
}

uint64_t qd_block_bytes(const qd_model *m)
{
    uint64_t n = 0;
    for (int i = 0; i < m->n_lin; i++) n += (uint64_t)(m->lin[i].n * m->lin[i].k + (m->lin[i].has_bias ? m->lin[i].n : 0));
    for (int i = 0; i < QD_MAX_NORMS; i++)
        if (m->arch->norms[i]) n += (uint64_t)m->cfg.hidden * (qd_model_norm_has_bias(m) ? 2 : 1);
    if (m->cfg.qk_norm == QD_QK_NORM_WHOLE) n += (uint64_t)((m->cfg.n_heads + m->cfg.n_kv_heads) * m->cfg.head_dim);
    else if (m->cfg.qk_norm) n += (uint64_t)m->cfg.head_dim * 2;
    n += (uint64_t)(m->cfg.q_lora_rank + m->cfg.kv_lora_rank);
    n += (uint64_t)m->cfg.n_experts * (m->cfg.hidden + 1) + (m->cfg.shared_intermediate > 0 ? m->cfg.hidden : 0);
    if (m->arch->gdn)
        n += (uint64_t)(qd_model_dim(m, QD_DIM_GDN_QKV) * m->cfg.gdn_conv + 2 * m->cfg.gdn_v_heads + m->cfg.gdn_v_dim);
    if (m->arch->sinks) n += (uint64_t)m->cfg.n_heads;
    return n * sizeof(float) + qd_mixer_bytes(m) + qd_dsa_bytes(m);
}

void qd_block_free(qd_model *m, qd_block_weights *bw)
{
    if (!bw) return;
    for (int i = 0; i < QD_MAX_LINEARS; i++) { qd_backend_free(m->be, bw->w[i]); qd_backend_free(m->be, bw->b[i]); }
    for (int i = 0; i < QD_MAX_NORMS; i++) { qd_backend_free(m->be, bw->norm_w[i]); qd_backend_free(m->be, bw->norm_b[i]); }
    for (int i = 0; i < 2; i++) qd_backend_free(m->be, bw->qk_norm_w[i]);
    qd_backend_free(m->be, bw->router_w);
    qd_backend_free(m->be, bw->shared_gate_w);
    qd_backend_free(m->be, bw->router_bias);
    qd_backend_free(m->be, bw->sinks);
    for (int i = 0; i < 2; i++) qd_backend_free(m->be, bw->mla_norm_w[i]);
    for (int i = 0; i < 4; i++) qd_backend_free(m->be, bw->dsa_w[i]);
    qd_backend_free(m->be, bw->gdn_conv_w);
    qd_backend_free(m->be, bw->gdn_a_log);
    qd_backend_free(m->be, bw->gdn_dt_bias);
    qd_backend_free(m->be, bw->gdn_norm_w);
    for (int i = 0; i < QD_MIXER_PARAMS; i++) qd_backend_free(m->be, bw->mixer_w[i]);
    free(bw);
}

int qd_block_load(qd_model *m, int block, qd_block_weights **out, qd_err *err)
{
    return qd_block_load_some(m, block, 1, out, err);
}

int qd_block_linear_load(qd_model *m, qd_block_weights *bw, int li, qd_err *err)
{
    if (li < 0 || li >= m->n_lin) return qd_err_set(err, QD_EINVAL, "linear index %d is outside [0, %d)", li, m->n_lin);
    if (bw->w[li] || !qd_model_block_has_linear(m, bw->block, li)) return 0;
    return load_linear(m, bw->block, li, &bw->w[li], &bw->b[li], err);
}

void qd_block_linear_unload(qd_model *m, qd_block_weights *bw, int li)
{
    if (li < 0 || li >= m->n_lin) return;
    qd_backend_free(m->be, bw->w[li]);
    qd_backend_free(m->be, bw->b[li]);
    bw->w[li] = bw->b[li] = NULL;
}

int qd_block_load_some(qd_model *m, int block, int linears, qd_block_weights **out, qd_err *err)
{
    if (block < 0 || block >= m->cfg.n_layers)
        return qd_err_set(err, QD_EINVAL, "block %d is outside [0, %lld)", block, (long long)m->cfg.n_layers);
    qd_block_weights *bw = calloc(1, sizeof *bw);
    if (!bw) return qd_err_set(err, QD_ENOMEM, "block %d: out of memory", block);
    bw->block = block;
    int rc = 0;
    for (int i = 0; i < m->n_lin && !rc && linears; i++)
        if (qd_model_block_has_linear(m, block, i)) rc = load_linear(m, block, i, &bw->w[i], &bw->b[i], err);
    for (int i = 0; i < QD_MAX_NORMS && !rc; i++) {
        if (!m->arch->norms[i]) continue;
        char name[512];
        int n = snprintf(name, sizeof name, m->arch->block_fmt, block);
        snprintf(name + n, sizeof name - n, "%s.weight", m->arch->norms[i]);
        rc = load_norm(m, name, m->cfg.hidden, &bw->norm_w[i], err);
        if (!rc && qd_model_norm_has_bias(m)) {
            snprintf(name + n, sizeof name - n, "%s.bias", m->arch->norms[i]);
            rc = qd_model_load_f32(m, name, 1, &m->cfg.hidden, &bw->norm_b[i], err);
        }
    }
    static const char *const qk_names[2] = {"self_attn.q_norm.weight", "self_attn.k_norm.weight"};
    int attn_layer = qd_model_block_mixer(m, block) == QD_MIXER_ATTENTION;
    for (int i = 0; i < 2 && m->cfg.qk_norm && attn_layer && !rc; i++) {
        char name[512];
        int n = snprintf(name, sizeof name, m->arch->block_fmt, block);
        snprintf(name + n, sizeof name - n, "%s", m->arch->qk_norms[i] ? m->arch->qk_norms[i] : qk_names[i]);
        /* Per head [head_dim], or OLMo 2's over the whole projection [n_heads (q) or n_kv (k) * head_dim]. */
        int64_t len = m->cfg.qk_norm == QD_QK_NORM_WHOLE ? (i ? m->cfg.n_kv_heads : m->cfg.n_heads) * m->cfg.head_dim
                                                         : m->cfg.head_dim;
        rc = load_norm(m, name, len, &bw->qk_norm_w[i], err);
    }
    for (int i = 0; i < 2 && !rc; i++) {
        if (!m->arch->mla_norms[i]) continue;
        char name[512];
        int n = snprintf(name, sizeof name, m->arch->block_fmt, block);
        snprintf(name + n, sizeof name - n, "%s.weight", m->arch->mla_norms[i]);
        rc = load_norm(m, name, i ? m->cfg.kv_lora_rank : m->cfg.q_lora_rank, &bw->mla_norm_w[i], err);
    }
    if (!rc && m->arch->sinks) {
        char name[512];
        int n = snprintf(name, sizeof name, m->arch->block_fmt, block);
        snprintf(name + n, sizeof name - n, "%s", m->arch->sinks);
        rc = qd_model_load_f32(m, name, 1, &m->cfg.n_heads, &bw->sinks, err);
    }
    if (!rc && m->arch->lin_idx_q) rc = qd_dsa_load(m, block, bw, err);   /* DeepSeek-V3.2's indexer */
    if (!rc && qd_model_block_is_moe(m, block)) rc = load_router(m, block, bw, err);
    if (!rc && qd_model_block_mixer(m, block) == QD_MIXER_GATED_DELTANET) rc = gdn_params(m, block, bw, err);
    else if (!rc && !attn_layer) rc = qd_mixer_load(m, block, bw, err);   /* LFM2, Granite-4.0-H */
    if (!rc && m->arch->xielu) rc = qd_xielu_load(m, block, bw, err);
    if (rc) { qd_block_free(m, bw); return rc; }
    *out = bw;
    return 0;
}

/* ---- get/set ---- */

static int xfer(qd_model *m, int up, void *be_ptr, void *host, size_t bytes, const char *what, qd_err *err)
{
    int rc = up ? qd_backend_upload(m->be, be_ptr, host, bytes) : qd_backend_download(m->be, host, be_ptr, bytes);
    if (rc) return qd_err_set(err, rc, "%s: %s failed: %s", what, up ? "upload" : "download", m->be->err.msg);
    return 0;
}

int qd_block_linear_get(qd_model *m, const qd_block_weights *bw, int li, float *w_host, float *b_host, qd_err *err)
{
    if (li < 0 || li >= m->n_lin) return qd_err_set(err, QD_EINVAL, "linear index %d is outside [0, %d)", li, m->n_lin);
    const qd_linear_info *L = &m->lin[li];
    int rc = 0;
    if (w_host) rc = xfer(m, 0, bw->w[li], w_host, (size_t)(L->n * L->k) * sizeof(float), L->name, err);
    if (!rc && b_host && bw->b[li]) rc = xfer(m, 0, bw->b[li], b_host, (size_t)L->n * sizeof(float), L->name, err);
    return rc;
}

int qd_block_linear_set(qd_model *m, qd_block_weights *bw, int li, const float *w_host, const float *b_host, qd_err *err)
{
    if (li < 0 || li >= m->n_lin) return qd_err_set(err, QD_EINVAL, "linear index %d is outside [0, %d)", li, m->n_lin);
    const qd_linear_info *L = &m->lin[li];
    if (b_host && !bw->b[li]) return qd_err_set(err, QD_EINVAL, "%s has no bias to set", L->name);
    int rc = 0;
    if (w_host) rc = xfer(m, 1, bw->w[li], (void *)w_host, (size_t)(L->n * L->k) * sizeof(float), L->name, err);
    if (!rc && b_host) rc = xfer(m, 1, bw->b[li], (void *)b_host, (size_t)L->n * sizeof(float), L->name, err);
    return rc;
}

int qd_block_norm_get(qd_model *m, const qd_block_weights *bw, int ni, float *w_host, float *b_host, qd_err *err)
{
    if (ni < 0 || ni >= QD_MAX_NORMS || !m->arch->norms[ni]) return qd_err_set(err, QD_EINVAL, "norm index %d is outside [0, %d)", ni, QD_MAX_NORMS);
    size_t bytes = (size_t)m->cfg.hidden * sizeof(float);
    int rc = 0;
    if (w_host) rc = xfer(m, 0, bw->norm_w[ni], w_host, bytes, m->arch->norms[ni], err);
    if (!rc && b_host && bw->norm_b[ni]) rc = xfer(m, 0, bw->norm_b[ni], b_host, bytes, m->arch->norms[ni], err);
    return rc;
}

int qd_block_norm_set(qd_model *m, qd_block_weights *bw, int ni, const float *w_host, const float *b_host, qd_err *err)
{
    if (ni < 0 || ni >= QD_MAX_NORMS || !m->arch->norms[ni]) return qd_err_set(err, QD_EINVAL, "norm index %d is outside [0, %d)", ni, QD_MAX_NORMS);
    if (b_host && !bw->norm_b[ni]) return qd_err_set(err, QD_EINVAL, "%s has no bias to set", m->arch->norms[ni]);
    size_t bytes = (size_t)m->cfg.hidden * sizeof(float);
    int rc = 0;
    if (w_host) rc = xfer(m, 1, bw->norm_w[ni], (void *)w_host, bytes, m->arch->norms[ni], err);
    if (!rc && b_host) rc = xfer(m, 1, bw->norm_b[ni], (void *)b_host, bytes, m->arch->norms[ni], err);
    return rc;
}

/* ---- open / close ---- */

/* Checks that every linear of every block is present (float or packed) with the right
 * shape, and every norm, so problems surface at open time, named. */
static int validate_blocks(qd_model *m, qd_err *err)
{
    char name[600];
    for (int b = 0; b < m->cfg.n_layers; b++) {
        int n = snprintf(name, sizeof name, m->arch->block_fmt, b);
        int fused = qd_model_block_is_moe(m, b) && qd_gptoss_fused_present(m, b);
        if (fused) {
            int rc = qd_gptoss_check(m, b, err);
            if (rc) return rc;
        }
        if (m->arch->lin_idx_q) {
            int rc = qd_dsa_load(m, b, NULL, err);
            if (rc) return rc;
        }
        if (m->arch->sinks) {
            const st_tensor *t;
            snprintf(name + n, sizeof name - n, "%s", m->arch->sinks);
            int rc = find_float(m, name, 1, &m->cfg.n_heads, &t, err);
            if (rc) return rc;
        }
        for (int i = 0; i < m->n_lin; i++) {
            const qd_linear_info *L = &m->lin[i];
            int64_t shape[2] = {L->n, L->k};
            const st_tensor *t;
            int rc;
            if (!qd_model_block_has_linear(m, b, i)) continue;
            if (fused && L->expert >= 0) continue;   /* checked as the fused tensors */
            snprintf(name + n, sizeof name - n, "%s.weight", L->name);
            const st_tensor *wt = qd_model_tfind(m, name);
            if (wt && wt->dtype == QD_DTYPE_F8_E4M3 && m->cfg.source_fp8) {
                const st_tensor *sc;
                if ((rc = qd_fp8_check(m, name, wt, L->n, L->k, &sc, err))) return rc;
            } else if (wt && wt->dtype == QD_DTYPE_F8_E4M3 && m->cfg.quantized) {
                /* The quantized format's own tensors: its read() checks them at load. */
                if ((rc = check_shape(wt, wt->name, 2, shape, err))) return rc;
            } else if (wt) {
                if ((rc = find_float(m, name, 2, shape, &t, err))) return rc;
            } else {
                /* Packed: the format's main tensor names the linear (format descriptor). */
                const qd_format *qf = m->cfg.quantized ? qd_format_find(m->cfg.quant_format) : NULL;
                if (qf) snprintf(name + n, sizeof name - n, "%s.%s", L->name, qf->main_tensor);
                if (!qf || !qd_model_tfind(m, name)) {
                    snprintf(name + n, sizeof name - n, "%s.weight", L->name);
                    return qd_err_set(err, QD_ENOTFOUND, "%s: tensor '%s' is missing", m->dir, qd_model_tname(m, name));
                }
            }
            if (L->has_bias) {
                snprintf(name + n, sizeof name - n, "%s.bias", L->name);
                if ((rc = find_float(m, name, 1, &L->n, &t, err))) return rc;
            }
        }
        if (qd_model_block_is_moe(m, b)) {
            const st_tensor *t;
            int64_t rs[2] = {m->cfg.n_experts, m->cfg.hidden}, gs[2] = {1, m->cfg.hidden};
            int rc;
            snprintf(name + n, sizeof name - n, "%s.weight", m->arch->router);
            if ((rc = find_float(m, name, 2, rs, &t, err))) return rc;
            snprintf(name + n, sizeof name - n, "%s.weight", m->arch->shared_gate ? m->arch->shared_gate : "");
            if (m->cfg.shared_intermediate > 0 && m->arch->shared_gate && (rc = find_float(m, name, 2, gs, &t, err)))
                return rc;
            snprintf(name + n, sizeof name - n, "%s", m->arch->router_bias ? m->arch->router_bias : "");
            int64_t bs[2] = {1, m->cfg.n_experts};
            if (router_bias_used(m) && (rc = m->arch->router_bias_2d ? find_float(m, name, 2, bs, &t, err)
                                                                     : find_float(m, name, 1, &m->cfg.n_experts, &t, err)))
                return rc;
        }
        if (qd_model_block_mixer(m, b) != QD_MIXER_ATTENTION) {
            int rc = qd_model_block_mixer(m, b) == QD_MIXER_GATED_DELTANET ? gdn_params(m, b, NULL, err)
                                                                            : qd_mixer_validate(m, b, err);
            if (rc) return rc;
        }
        for (int i = 0; i < 2; i++) {
            const st_tensor *t;
            int64_t len = i ? m->cfg.kv_lora_rank : m->cfg.q_lora_rank;
            int rc;
            if (!m->arch->mla_norms[i]) continue;
            snprintf(name + n, sizeof name - n, "%s.weight", m->arch->mla_norms[i]);
            if ((rc = find_float(m, name, 1, &len, &t, err))) return rc;
        }
        for (int i = 0; i < QD_MAX_NORMS; i++) {
            const st_tensor *t;
            int rc;
            if (!m->arch->norms[i]) continue;
            snprintf(name + n, sizeof name - n, "%s.weight", m->arch->norms[i]);
            if ((rc = find_float(m, name, 1, &m->cfg.hidden, &t, err))) return rc;
            if (qd_model_norm_has_bias(m)) {
                snprintf(name + n, sizeof name - n, "%s.bias", m->arch->norms[i]);
                if ((rc = find_float(m, name, 1, &m->cfg.hidden, &t, err))) return rc;
            }
        }
    }
    return 0;
}

/* Appends one expert's gate, up and down linears (named prefix + the arch's expert
 * names, width ff) and its two input groups: gate/up read the MLP's normed input (not
 * folded into the norm, which the router and the other experts also read), down reads the
 * expert's act(gate) * up and folds into up's rows. */
static void describe_expert(qd_model *m, int expert, const char *prefix, int64_t ff)
{
    const qd_arch *a = m->arch;
    static const char *const shared_lin[3] = {"gate_proj", "up_proj", "down_proj"};
    int l0 = m->n_lin, g0 = m->n_grp;
    for (int j = 0; j < 3; j++) {
        qd_linear_info *L = &m->lin[l0 + j];
        snprintf(m->lin_names[l0 + j], sizeof m->lin_names[0], "%s%s", prefix,
                 expert == QD_SHARED_EXPERT ? shared_lin[j] : a->expert_lin[j]);
        L->name = m->lin_names[l0 + j];
        L->n = j < 2 ? ff : m->cfg.hidden;
        L->k = j < 2 ? m->cfg.hidden : ff;
        L->has_bias = expert != QD_SHARED_EXPERT && a->expert_bias;
        L->group = g0 + (j == 2);
        L->expert = expert;
        L->dense_mlp = 0;
        L->layer_mixer = -1;
    }
    for (int j = 0; j < 2; j++) {
        qd_input_group *G = &m->grp[g0 + j];
        if (expert == QD_SHARED_EXPERT) snprintf(m->grp_names[g0 + j], sizeof m->grp_names[0], "shared.%s", j ? "out" : "in");
        else snprintf(m->grp_names[g0 + j], sizeof m->grp_names[0], "expert.%d.%s", expert, j ? "out" : "in");
        G->name = m->grp_names[g0 + j];
        G->n_linears = j ? 1 : 2;
        G->linears[0] = j ? l0 + 2 : l0;
        G->linears[1] = l0 + 1;
        G->k = j ? ff : m->cfg.hidden;
        /* down's input folds into up's rows where it is act(gate) * up; gpt-oss's clamped
         * (up + 1) * glu(gate) is not linear in up: no fold. */
        int fold = j && m->cfg.swiglu_limit == 0.0f;
        G->prev_kind = fold ? QD_PREV_LINEAR : QD_PREV_NONE;
        G->prev = fold ? m->lin[l0 + 1].name : NULL;
        G->prev_index = fold ? l0 + 1 : -1;
        G->prev_row0 = 0;
        G->prev_rows = fold ? ff : 0;
        G->wave = a->n_groups + j;   /* after the attention's waves: every expert's in, then out */
    }
    m->n_lin += 3;
    m->n_grp += 2;
}

static void describe_moe(qd_model *m)
{
    const qd_model_config *c = &m->cfg;
    char prefix[64];
    for (int e = 0; e < c->n_experts; e++) {
        snprintf(prefix, sizeof prefix, m->arch->expert_fmt, e);
        describe_expert(m, e, prefix, c->moe_intermediate);
    }
    if (c->shared_intermediate > 0) describe_expert(m, QD_SHARED_EXPERT, m->arch->shared_prefix, c->shared_intermediate);
}

static void describe_block(qd_model *m)
{
    const qd_arch *a = m->arch;
    const qd_model_config *c = &m->cfg;
    m->n_lin = a->n_linears;
    m->n_grp = a->n_groups;
    for (int i = 0; i < a->n_linears; i++) {
        const qd_arch_linear *al = &a->linears[i];
        qd_linear_info *L = &m->lin[i];
        L->name = al->name;
        L->n = qd_model_dim(m, al->n_dim);
        L->k = qd_model_dim(m, al->k_dim);
        L->has_bias = al->bias == QD_BIAS_QKV ? c->qkv_bias : al->bias == QD_BIAS_O ? c->o_bias
                    : al->bias == QD_BIAS_MIXER ? c->mixer.proj_bias : al->bias == QD_BIAS_MLP ? c->mlp_bias : 0;
        L->group = al->group;
        L->expert = -1;
        /* A MoE model's own MLP linears are its dense layers' (DeepSeek), or every layer's
         * beside the experts (Granite's shared_mlp). */
        L->dense_mlp = c->n_experts > 0 && i >= a->lin_mlp0 && !a->moe_beside_mlp;
        L->layer_mixer = al->mixer - 1;
    }
    for (int g = 0; g < a->n_groups; g++) {
        qd_input_group *G = &m->grp[g];
        G->name = a->groups[g].name;
        G->wave = g;
        G->n_linears = 0;
        for (int i = 0; i < a->n_linears; i++)
            if (a->linears[i].group == g) {
                G->linears[G->n_linears++] = i;
                G->k = m->lin[i].k;
            }
        G->prev_kind = a->groups[g].prev_kind;
        G->prev = a->groups[g].prev;
        G->prev_index = -1;
        /* A post-LN block normalises after the residual add, so no norm sits directly in
         * front of a linear's input. */
        if (G->prev_kind == QD_PREV_NORM && !c->do_layer_norm_before) {
            G->prev_kind = QD_PREV_NONE;
            G->prev = NULL;
        }
        /* OPT's fc2 reads fc1 through its activation: ReLU is positively homogeneous
         * (relu(s x) = s relu(x) for s > 0), so the fold into fc1's rows is exact; GELU is not. */
        if (c->family == QD_ARCH_OPT && G->prev_kind == QD_PREV_LINEAR && !strcmp(G->prev, "fc1") &&
            strcmp(c->activation, "relu")) {
            G->prev_kind = QD_PREV_NONE;
            G->prev = NULL;
        }
        if (G->prev_kind == QD_PREV_NORM)
            for (int i = 0; i < QD_MAX_NORMS; i++) if (a->norms[i] && !strcmp(a->norms[i], G->prev)) G->prev_index = i;
        if (G->prev_kind == QD_PREV_LINEAR)
            for (int i = 0; i < a->n_linears; i++) if (!strcmp(a->linears[i].name, G->prev)) G->prev_index = i;
        G->prev_row0 = 0;
        G->prev_rows = G->prev_kind == QD_PREV_LINEAR ? m->lin[G->prev_index].n : 0;
        if (G->prev_kind == QD_PREV_LINEAR && a->groups[g].prev_tail) {
            G->prev_rows = qd_model_dim(m, a->groups[g].prev_tail_dim);
            G->prev_row0 = m->lin[G->prev_index].n - G->prev_rows;
        }
        if (G->prev_kind == QD_PREV_LINEAR && a->groups[g].prev_part) {   /* LFM2: C, in_proj's second third */
            G->prev_rows = qd_model_dim(m, a->groups[g].prev_tail_dim);
            G->prev_row0 = (a->groups[g].prev_part - 1) * G->prev_rows;
        }
    }
    m->lin_exp0 = m->n_lin;
    m->grp_exp0 = m->n_grp;
    if (c->n_experts > 0) describe_moe(m);
}

/* A vision-language checkpoint's text tower: where its decoder's tensors are, as
 * transformers 5 saves them (model.language_model.*, lm_head), as the Hub's Qwen2.5-VL
 * files have them (model.*, beside visual.*), or as Gemma 3's and Mistral-3's do
 * (language_model.model.*, language_model.lm_head). The vision tower and projector are
 * never read. The lm_head: transformers ties it to the embeddings where the config says so
 * and the checkpoint has none; one the checkpoint has is used (transformers does not tie
 * one that differs from the embeddings), so a tie the config claims changes nothing then. */
static int find_text_tower(qd_model *m, qd_err *err)
{
    static const char *const prefixes[] = {"model.language_model.", "language_model.model.", "model."};
    char name[320];
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0] && !m->text_prefix; i++) {
        snprintf(name, sizeof name, "%s%s", prefixes[i], m->arch->embed + 6);
        if (st_model_find(m->st, name)) m->text_prefix = prefixes[i];
    }
    if (!m->text_prefix)
        return qd_err_set(err, QD_ENOTFOUND, "%s: %s: the text tower's embeddings are missing (model.language_model.%s, "
                          "language_model.model.%s or model.%s)", m->dir, m->cfg.architecture, m->arch->embed + 6,
                          m->arch->embed + 6, m->arch->embed + 6);
    m->lm_prefix = !strcmp(m->text_prefix, "language_model.model.") ? "language_model." : "";
    if (m->cfg.tie_word_embeddings && qd_model_tfind(m, m->arch->lm_head)) m->cfg.tie_word_embeddings = 0;
    return 0;
}

/* Embedding, positions, final norm, projections and lm_head. */
static int open_globals(qd_model *m, qd_err *err)
{
    const qd_model_config *c = &m->cfg;
    const qd_arch *a = m->arch;
    int64_t pd = c->word_embed_proj_dim;
    int64_t shape[2] = {c->vocab, pd};
    int rc = find_float(m, a->embed, 2, shape, &m->t_embed, err);
    if (rc) return rc;
    if ((rc = scan_tensor(m, m->t_embed, err))) return rc;
    if (a->embed_pos) {
        int64_t ps[2] = {c->max_pos + c->pos_offset, c->hidden};
        if ((rc = find_float(m, a->embed_pos, 2, ps, &m->t_pos, err)) || (rc = scan_tensor(m, m->t_pos, err))) return rc;
    }
    if (c->family == QD_ARCH_LLAMA || c->do_layer_norm_before) {
        char name[256];
        snprintf(name, sizeof name, "%s.weight", a->final_norm);
        if ((rc = load_norm(m, name, c->hidden, &m->final_w, err))) return rc;
        if (qd_model_norm_has_bias(m)) {
            snprintf(name, sizeof name, "%s.bias", a->final_norm);
            if ((rc = qd_model_load_f32(m, name, 1, &c->hidden, &m->final_b, err))) return rc;
        }
    }
    if (pd != c->hidden) {
        if (!a->project_in)
            return qd_err_set(err, QD_EUNSUPPORTED, "%s: word_embed_proj_dim differs from hidden_size but %s has no projections", m->dir, a->name);
        int64_t s_in[2] = {c->hidden, pd}, s_out[2] = {pd, c->hidden};
        if ((rc = qd_model_load_f32(m, a->project_in, 2, s_in, &m->proj_in, err)) ||
            (rc = qd_model_load_f32(m, a->project_out, 2, s_out, &m->proj_out, err)))
            return rc;
    }
    if (c->tie_word_embeddings) {
        m->t_lm_head = m->t_embed;
    } else if ((rc = find_float(m, a->lm_head, 2, shape, &m->t_lm_head, err))) {
        return rc;
    }
    if (c->lm_head_bias && a->lm_head_bias && (rc = qd_model_load_f32(m, a->lm_head_bias, 1, &c->vocab, &m->lm_bias, err)))
        return rc;
    uint64_t lm_bytes = (uint64_t)c->vocab * pd * sizeof(float);
    if (lm_bytes <= QD_LM_HEAD_KEEP_BYTES) {
        m->lm_head = qd_backend_alloc(m->be, lm_bytes);
        if (!m->lm_head) return qd_err_set(err, QD_ENOMEM, "lm_head: cannot allocate %llu bytes", (unsigned long long)lm_bytes);
        if ((rc = tensor_to_backend(m, m->t_lm_head, m->lm_head, err))) return rc;
        m->lm_chunk = c->vocab;
    } else {
        m->lm_chunk = (int64_t)(QD_LM_CHUNK_BYTES / ((uint64_t)pd * sizeof(float)));
        if (m->lm_chunk < 1) m->lm_chunk = 1;
        if (m->t_lm_head != m->t_embed && (rc = scan_tensor(m, m->t_lm_head, err))) return rc;
    }
    return 0;
}

int qd_model_open(const char *dir, qd_backend *be, qd_model **out, qd_err *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    char ipath[4096];
    snprintf(ipath, sizeof ipath, "%s/model.safetensors.index.json", dir);
    if (!qd_input_exists(path) && !qd_input_exists(ipath)) {
        char bin[4096];
        snprintf(bin, sizeof bin, "%s/pytorch_model.bin", dir);
        char binidx[4096];
        snprintf(binidx, sizeof binidx, "%s/pytorch_model.bin.index.json", dir);
        if (qd_fs_exists(bin) || qd_fs_exists(binidx))
            return qd_err_set(err, QD_EUNSUPPORTED, "%s: only pytorch_model.bin is present; pickle checkpoints are not loaded, convert the model to safetensors first (e.g. save_pretrained(..., safe_serialization=True))", dir);
    }
    qd_model *m = calloc(1, sizeof *m);
    if (!m) return qd_err_set(err, QD_ENOMEM, "%s: out of memory", dir);
    m->be = be;
    int rc;
    if (!(m->dir = strdup(dir))) { rc = qd_err_set(err, QD_ENOMEM, "%s: out of memory", dir); goto fail; }
    if ((rc = qd_model_config_load_quant(dir, &m->cfg, &m->gptq_rules, err))) goto fail;
    if (!(m->cfg.quantized && m->cfg.quant_bits == 0 && !strncmp(m->cfg.quant_format, "gptq", 4))) {
        cJSON_Delete(m->gptq_rules);
        m->gptq_rules = NULL;
    }
    if (!(m->arch = qd_arch_for(&m->cfg))) {
        rc = qd_err_set(err, QD_EUNSUPPORTED, "%s: architecture %s is not supported", dir, m->cfg.architecture);
        goto fail;
    }
    if ((rc = st_model_open(dir, &m->st, err))) goto fail;
    /* Some OPT checkpoints were saved from the base model and lack the "model." prefix. */
    if (!m->cfg.multimodal && !st_model_find(m->st, m->arch->embed) && st_model_find(m->st, m->arch->embed + 6))
        m->strip_prefix = 1;
    if (m->cfg.multimodal && (rc = find_text_tower(m, err))) goto fail;
    if (m->cfg.n_experts > 0) {
        m->lin_names = calloc(QD_MAX_LINEARS, sizeof *m->lin_names);
        m->grp_names = calloc(QD_MAX_GROUPS, sizeof *m->grp_names);
        if (!m->lin_names || !m->grp_names) { rc = qd_err_set(err, QD_ENOMEM, "%s: out of memory", dir); goto fail; }
    }
    describe_block(m);
    if ((rc = open_globals(m, err)) || (rc = validate_blocks(m, err))) goto fail;
    QD_LOG(QD_LOG_DEBUG, "model open", "dir=%s arch=%s layers=%lld hidden=%lld quant=%s", dir, m->cfg.architecture,
           (long long)m->cfg.n_layers, (long long)m->cfg.hidden, m->cfg.quantized ? m->cfg.quant_format : "none");
    *out = m;
    return 0;
fail:
    qd_model_close(m);
    return rc;
}

void qd_model_trim(qd_model *m)
{
    if (!m) return;
    for (int i = 0; i < QD_SCRATCH_COUNT; i++) {
        qd_backend_free(m->be, m->scratch[i]);
        m->scratch[i] = NULL;
        m->scratch_cap[i] = 0;
    }
}

void qd_model_close(qd_model *m)
{
    if (!m) return;
    qd_model_trim(m);
    if (m->be) {
        qd_backend_free(m->be, m->final_w);
        qd_backend_free(m->be, m->final_b);
        qd_backend_free(m->be, m->proj_in);
        qd_backend_free(m->be, m->proj_out);
        qd_backend_free(m->be, m->lm_head);
        qd_backend_free(m->be, m->lm_bias);
    }
    st_model_close(m->st);
    free(m->lin_names);
    free(m->grp_names);
    cJSON_Delete(m->gptq_rules);
    free(m->dir);
    free(m);
}

void qd_model_set_moe_calibrate_all(qd_model *m, int on) { m->moe_calibrate_all = on; }

int qd_model_set_compute_bf16(qd_model *m, int on, qd_err *err)
{
    if (on && !m->be->ops->gemm_nt_bf16)
        return qd_err_set(err, QD_EUNSUPPORTED, "compute bf16: the %s backend has no bfloat16 products (use \"compute\": "
                          "\"f32\", or the cpu backend)", m->be->name);
    if (on && !m->be->bf16_native && !m->compute_bf16)
        QD_LOG(QD_LOG_WARN, "compute_bf16_emulated",
               "backend=%s: no bfloat16 unit (%s): the bf16 products run as F32 products on rounded copies, "
               "no faster than \"compute\": \"f32\" (a few percent slower)", m->be->name,
               m->be->device < 0 ? "no AMX-BF16 tiles, or QUANTD_CPU_KERNEL is not auto" : "compute capability below 8.0");
    m->compute_bf16 = on ? 1 : 0;
    return 0;
}

/* ---- accessors ---- */

const qd_model_config *qd_model_cfg(const qd_model *m) { return &m->cfg; }
int qd_model_mlp_gated(const qd_model *m)
{
    return m->cfg.family == QD_ARCH_LLAMA && !m->cfg.mlp_plain && !m->arch->mlp_ungated;
}
const st_model *qd_model_tensors(const qd_model *m) { return m->st; }
qd_backend *qd_model_backend(const qd_model *m) { return m->be; }
const char *qd_model_dir(const qd_model *m) { return m->dir; }
const char *qd_model_arch_name(const qd_model *m) { return m->arch->name; }
int qd_model_n_linears(const qd_model *m) { return m->n_lin; }
const qd_linear_info *qd_model_linear(const qd_model *m, int i) { return i >= 0 && i < m->n_lin ? &m->lin[i] : NULL; }
int qd_model_n_groups(const qd_model *m) { return m->n_grp; }
int qd_model_block_is_moe(const qd_model *m, int block)
{
    return m->cfg.n_experts > 0 && block >= m->cfg.first_dense && !(block < QD_CFG_MAX_LAYERS && m->cfg.layer_dense[block]);
}
int qd_model_group_same_input(const qd_model *m, int block, int g)
{
    int rel = g - m->grp_exp0;
    if (!m->moe_calibrate_all || m->cfg.moe_scoring == QD_MOE_SIGMOID_INPUT || !qd_model_block_is_moe(m, block) ||
        rel < 0 || g >= m->n_grp || rel % 2)
        return g;
    return m->grp_exp0;
}
int qd_model_block_has_linear(const qd_model *m, int block, int li)
{
    if (li < 0 || li >= m->n_lin) return 0;
    /* A hybrid's attention and recurrent projections: the layers of their mixer only. */
    if (li < m->arch->n_linears && m->arch->linears[li].mixer != QD_ON_EVERY_LAYER)
        return m->arch->linears[li].mixer == QD_ON_MIXER(qd_model_block_mixer(m, block));
    if (m->lin[li].expert != -1) return qd_model_block_is_moe(m, block);
    if (m->lin[li].dense_mlp) return !qd_model_block_is_moe(m, block);
    return 1;
}
const qd_input_group *qd_model_group(const qd_model *m, int g) { return g >= 0 && g < m->n_grp ? &m->grp[g] : NULL; }
const char *qd_model_norm_name(const qd_model *m, int i) { return i >= 0 && i < QD_MAX_NORMS ? m->arch->norms[i] : NULL; }
int qd_model_norm_has_bias(const qd_model *m) { return m->arch->layernorm && !m->arch->norm_no_bias; }
float qd_model_norm_offset(const qd_model *m) { return m->cfg.norm_offset; }
const char *qd_model_moe_router(const qd_model *m) { return m->cfg.n_experts > 0 ? m->arch->router : NULL; }
const char *qd_model_moe_shared_gate(const qd_model *m)
{
    return m->cfg.n_experts > 0 && m->cfg.shared_intermediate > 0 ? m->arch->shared_gate : NULL;
}

const char *qd_model_block_conv(const qd_model *m, int block)
{
    return qd_model_block_mixer(m, block) == QD_MIXER_GATED_DELTANET ? "linear_attn.conv1d" : NULL;
}

int qd_model_tensor_replaced(const qd_model *m, const char *rel) { return qd_fused_experts_replaced(m, rel); }

int qd_model_linear_find(const qd_model *m, const char *name)
{
    for (int i = 0; i < m->n_lin; i++) if (!strcmp(m->lin[i].name, name)) return i;
    return -1;
}

int qd_model_outside_text(const qd_model *m, const char *name, char *root, size_t cap)
{
    if (!m->text_prefix || !strncmp(name, m->text_prefix, strlen(m->text_prefix))) return 0;
    size_t lp = strlen(m->lm_prefix);
    if (!strncmp(name, m->lm_prefix, lp) && !strncmp(name + lp, "lm_head.", 8)) return 0;
    const char *s = !strncmp(name, "model.", 6) ? name + 6 : name;
    size_t n = strcspn(s, ".");
    snprintf(root, cap, "%.*s", (int)n, s);
    return 1;
}

int qd_model_block_prefix(const qd_model *m, int block, char *buf, size_t cap)
{
    int n = snprintf(buf, cap, m->arch->block_fmt, block);
    if (n < 0 || (size_t)n >= cap) return QD_EINVAL;
    const char *s = qd_model_tname(m, buf);
    if (s != buf) memmove(buf, s, strlen(s) + 1);
    return 0;
}
