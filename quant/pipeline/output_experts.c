/* gpt-oss's quantized experts in the layout vLLM loads (see output.h). vLLM 0.32's
 * GptOssModel._load_weights_other (vllm/model_executor/models/gpt_oss.py) streams a
 * compressed-tensors checkpoint's experts one at a time under its own parameter names only
 * (_GPT_OSS_STREAMED_EXPERT_SUFFIX_TO_SHARD): mlp.experts.N.w13_weight_packed,
 * w13_weight_scale, w13_bias (shard gpt_oss_w13) and w2_weight_packed, w2_weight_scale,
 * w2_bias (gpt_oss_w2). GptOssRoutedExperts._load_packed_expert copies each into expert N's
 * slice of CompressedTensorsWNA16MoEMethod's buffers, which are N-first as the linears'
 * tensors are (compressed_tensors_moe_wna16.py get_weight_shape: w13 [2 FF, H b/32] and
 * scales [2 FF, H/gs], w2 [H, FF b/32] and [H, FF/gs]). w13's 2 FF rows hold the gate and
 * up projections interleaved, gate row f at 2f and up's at 2f + 1, as gpt-oss's own
 * gate_up_proj does and as the swigluoai activation reads them (fused_moe/activation.py:
 * SWIGLUOAI "expects gate/up *interleaved* in w13"). A per-expert gate_proj/up_proj/down_proj
 * name matches none of these and is skipped, and every other name under mlp.experts.N
 * (weight_shape, weight_zero_point) falls into the fused branch meant for 3-D tensors, which
 * cannot index it: so none is written. The pipeline refuses up front what cannot be written
 * so (pipeline_gptoss.c). */
#include "quant/pipeline/output.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int by_name(const void *a, const void *b)
{
    return strcmp((*(const qd_out_tensor *const *)a)->name, (*(const qd_out_tensor *const *)b)->name);
}

static const qd_out_tensor *lookup(const qd_out_tensor *const *sorted, size_t n, const char *name)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(sorted[mid]->name, name);
        if (!c) return sorted[mid];
        if (c < 0) lo = mid + 1; else hi = mid;
    }
    return NULL;
}

/* The expert tensor `name` split as "<base>mlp.experts.<N>.<proj>.<suffix>": 1 with base_len
 * (through "mlp.experts.<N>."), proj and suffix pointing into name; 0 for another name. */
static int split_expert(const char *name, size_t *base_len, const char **proj, const char **suffix)
{
    const char *e = strstr(name, "mlp.experts.");
    if (!e) return 0;
    const char *d = e + strlen("mlp.experts.");
    if (*d < '0' || *d > '9') return 0;
    while (*d >= '0' && *d <= '9') d++;
    if (*d != '.') return 0;
    *base_len = (size_t)(d + 1 - name);
    *proj = d + 1;
    const char *dot = strchr(*proj, '.');
    if (!dot) return 0;
    *suffix = dot + 1;
    return 1;
}

/* Keeps buffer b for the caller (freed by qd_output_owned_free). */
static int own(qd_output_owned *o, void *b)
{
    if (!b) return QD_ENOMEM;
    if (o->n == o->cap) {
        size_t nc = o->cap ? 2 * o->cap : 64;
        void **nb = realloc(o->bufs, nc * sizeof *nb);
        if (!nb) { free(b); return QD_ENOMEM; }
        o->bufs = nb;
        o->cap = nc;
    }
    o->bufs[o->n++] = b;
    return 0;
}

void qd_output_owned_free(qd_output_owned *o)
{
    for (size_t i = 0; o && i < o->n; i++) free(o->bufs[i]);
    if (o) { free(o->bufs); memset(o, 0, sizeof *o); }
}

/* gate's and up's rows interleaved into one tensor [2 rows, ...] named "<base><w13 suffix>". */
static int interleave(const qd_out_tensor *g, const qd_out_tensor *u, const char *base, size_t base_len,
                      const char *suffix, qd_out_tensor *out, qd_output_owned *o, qd_err *err)
{
    int ok = g->dtype == u->dtype && g->ndim == u->ndim && g->ndim >= 1 && g->ndim <= 2;
    for (int d = 0; ok && d < g->ndim; d++) ok = g->shape[d] == u->shape[d];
    if (!ok)
        return qd_err_set(err, QD_ESHAPE, "gpt-oss experts: '%s' and '%s' differ in dtype or shape, so they cannot be "
                          "fused into w13 (vLLM gives a layer's experts one scheme)", g->name, u->name);
    size_t row = qd_dtype_size(g->dtype) * (size_t)(g->ndim == 2 ? g->shape[1] : 1);
    size_t rows = (size_t)g->shape[0];
    unsigned char *buf = malloc(2 * rows * row);
    char *name = malloc(base_len + strlen(suffix) + 1);
    if (own(o, buf) || own(o, name)) return qd_err_set(err, QD_ENOMEM, "gpt-oss experts: out of memory");
    for (size_t r = 0; r < rows; r++) {
        memcpy(buf + (2 * r) * row, (const unsigned char *)g->data + r * row, row);
        memcpy(buf + (2 * r + 1) * row, (const unsigned char *)u->data + r * row, row);
    }
    memcpy(name, base, base_len);
    strcpy(name + base_len, suffix);
    *out = *g;
    out->name = name;
    out->shape[0] = 2 * g->shape[0];
    out->data = buf;
    return 0;
}

static int renamed(const qd_out_tensor *t, const char *base, size_t base_len, const char *suffix, qd_out_tensor *out,
                   qd_output_owned *o, qd_err *err)
{
    char *name = malloc(base_len + strlen(suffix) + 1);
    if (own(o, name)) return qd_err_set(err, QD_ENOMEM, "gpt-oss experts: out of memory");
    memcpy(name, base, base_len);
    strcpy(name + base_len, suffix);
    *out = *t;
    out->name = name;
    return 0;
}

int qd_output_gptoss_experts(const qd_out_tensor *t, size_t n, qd_out_tensor **out, size_t *n_out, qd_output_owned *o,
                             qd_err *err)
{
    static const char *const sfx[3] = {"weight_packed", "weight_scale", "bias"};
    *out = NULL;
    *n_out = 0;
    const qd_out_tensor **sorted = malloc((n ? n : 1) * sizeof *sorted);
    qd_out_tensor *res = malloc((n ? n : 1) * sizeof *res);
    if (!sorted || !res) {
        free((void *)sorted);
        free(res);
        return qd_err_set(err, QD_ENOMEM, "gpt-oss experts: out of memory");
    }
    for (size_t i = 0; i < n; i++) sorted[i] = &t[i];
    qsort(sorted, n, sizeof *sorted, by_name);
    size_t m = 0;
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        size_t bl;
        const char *proj, *suffix;
        if (!split_expert(t[i].name, &bl, &proj, &suffix)) { res[m++] = t[i]; continue; }
        size_t pl = (size_t)(suffix - 1 - proj);
        int gate = pl == 9 && !strncmp(proj, "gate_proj", 9), up = pl == 7 && !strncmp(proj, "up_proj", 7);
        int down = pl == 9 && !strncmp(proj, "down_proj", 9);
        int j = -1;
        for (int s = 0; s < 3; s++)
            if (!strcmp(suffix, sfx[s])) j = s;
        if (!(gate || up || down) || (j < 0 && strcmp(suffix, "weight_shape"))) {
            rc = qd_err_set(err, QD_EUNSUPPORTED, "gpt-oss experts: '%s' has no name vLLM's gpt-oss loader reads "
                            "(mlp.experts.N.w13_weight_packed, w13_weight_scale, w13_bias, w2_*: vllm/model_executor/"
                            "models/gpt_oss.py _GPT_OSS_STREAMED_EXPERT_SUFFIX_TO_SHARD)", t[i].name);
            break;
        }
        if (j < 0 || up) continue;   /* weight_shape: vLLM's buffers know the shape; up: fused with gate */
        char w13[40], other[512];
        if (down) {
            snprintf(w13, sizeof w13, "w2_%s", sfx[j]);
            rc = renamed(&t[i], t[i].name, bl, w13, &res[m++], o, err);
            continue;
        }
        snprintf(other, sizeof other, "%.*sup_proj.%s", (int)bl, t[i].name, sfx[j]);
        const qd_out_tensor *u = lookup(sorted, n, other);
        if (!u) {
            rc = qd_err_set(err, QD_ENOTFOUND, "gpt-oss experts: '%s' has no '%s' to fuse with into w13", t[i].name, other);
            break;
        }
        snprintf(w13, sizeof w13, "w13_%s", sfx[j]);
        rc = interleave(&t[i], u, t[i].name, bl, w13, &res[m++], o, err);
    }
    free((void *)sorted);
    if (rc) { free(res); return rc; }
    *out = res;
    *n_out = m;
    return 0;
}
