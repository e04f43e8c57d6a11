/* The vLLM serving rules (see serving.h), read from vLLM's source through the code index;
 * each rule names the file it comes from. vLLM changes these over time: the table follows
 * the newer tree where versions differ (noted per rule), and ../shared/ref/compressed-tensors.md
 * section 2 has the versions read. Activations are assumed float16 (bfloat16 differs only
 * for Exllama, which takes float16 alone).
 *
 * How vLLM picks a kernel for a packed linear:
 *   compressed-tensors -> CompressedTensorsWNA16, then the mixed-precision chain
 *     (kernels/mixed_precision/__init__.py, choose_mp_linear_kernel): Machete, Marlin,
 *     Exllama, in that order; none -> "Failed to find a kernel", the model does not load.
 *   gptq / gptq_v2     -> gptq_marlin when is_gptq_marlin_compatible (gptq_marlin.py:
 *     4/8-bit, symmetric, Marlin's group sizes), then the same chain without Exllama;
 *     otherwise the gptq method: exllama's gptq_gemm, or, with act-order on a
 *     row-parallel layer, its slow dequantize-and-matmul path (gptq.py).
 *   awq_gemm           -> awq_marlin when 4-bit and Marlin takes the layer (awq_marlin.py),
 *     otherwise the awq GEMM (awq.py), slow.
 * Before any kernel, the layer must shard (the load rules). */
#include "quant/formats/serving.h"

#include <stdio.h>
#include <string.h>

typedef struct srv_ctx {
    const qd_srv_layer *l;
    int64_t k_shard, n_shard;   /* what one rank holds */
    int zp;                     /* zero points stored (asymmetric) */
} srv_ctx;

/* One rule: `refuses` returns 1 (with why) when the kernel cannot take the layer. */
typedef struct srv_rule {
    const char *id;
    qd_srv_kernel kernel;       /* QD_SRV_NO_LOAD: a load rule, before any kernel */
    const char *source;         /* vLLM file */
    int (*refuses)(const srv_ctx *c, char *why, size_t cap);
} srv_rule;

/* Values per packed unit: 32/b words for 2/4/8 bits; 3 bits packs 32 values in 3 words. */
static int pack_unit(int bits) { return 32 % bits == 0 ? 32 / bits : 32; }

static int is_ct(const srv_ctx *c) { return !strcmp(c->l->format, "compressed-tensors"); }
static int is_awq(const srv_ctx *c) { return !strcmp(c->l->format, "awq_gemm"); }

/* ---- load rules ---- */
static int load_shard(const srv_ctx *c, char *why, size_t cap)
{
    const qd_srv_layer *l = c->l;
    if (l->row_parallel && l->in_features % l->tp) {
        snprintf(why, cap, "in_features %lld does not split over %d ranks", (long long)l->in_features, l->tp);
        return 1;
    }
    if (!l->row_parallel && (l->out_per_shard <= 0 || l->out_per_shard * l->tp < l->out_features)) {
        snprintf(why, cap, "out_features %lld does not split over %d ranks", (long long)l->out_features, l->tp);
        return 1;
    }
    return 0;
}

static int load_group(const srv_ctx *c, char *why, size_t cap)
{
    const qd_srv_layer *l = c->l;
    if (!l->row_parallel || l->group_size <= 0 || l->group_size >= l->in_features || c->k_shard % l->group_size == 0)
        return 0;
    snprintf(why, cap, "a shard of %lld input features is not whole groups of %lld (scales are sharded by group)",
             (long long)c->k_shard, (long long)l->group_size);
    return 1;
}

static int load_packed(const srv_ctx *c, char *why, size_t cap)
{
    const int per = pack_unit(c->l->bits);
    /* Tensors packed along N (gptq qzeros, awq qweight/qzeros, compressed-tensors' zero
     * point) shard by whole words on column-parallel layers; along K on row-parallel ones. */
    int packs_n = is_ct(c) ? c->zp : 1;
    if (!c->l->row_parallel && packs_n && c->n_shard % per) {
        snprintf(why, cap, "a shard of %lld output features is not whole %d-value packed words", (long long)c->n_shard, per);
        return 1;
    }
    if (c->l->row_parallel && !is_awq(c) && c->k_shard % per) {
        snprintf(why, cap, "a shard of %lld input features is not whole %d-value packed words", (long long)c->k_shard, per);
        return 1;
    }
    return 0;
}

/* ---- Machete ---- */
static int machete_gpu(const srv_ctx *c, char *why, size_t cap)
{
    if (c->l->gpu_cc == 90) return 0;
    snprintf(why, cap, "needs compute capability 9.0 (Hopper)");
    return 1;
}
static int machete_actorder(const srv_ctx *c, char *why, size_t cap)
{
    if (!(c->l->g_idx && c->l->row_parallel && c->l->tp > 1)) return 0;
    snprintf(why, cap, "act-order (g_idx) on a row-parallel layer split over %d ranks", c->l->tp);
    return 1;
}
static int machete_type(const srv_ctx *c, char *why, size_t cap)
{
    if (c->l->bits == 4 || c->l->bits == 8) return 0;   /* uint4/uint8 with zero points, uint4b8/uint8b128 without */
    snprintf(why, cap, "%d-bit weights (4 or 8)", c->l->bits);
    return 1;
}
static int machete_group(const srv_ctx *c, char *why, size_t cap)
{
    int64_t g = c->l->group_size;
    if (g == -1 || g == 64 || g == 128) return 0;
    snprintf(why, cap, "group size %lld (-1, 64 or 128; older vLLM: -1 or 128)", (long long)g);
    return 1;
}
static int machete_k(const srv_ctx *c, char *why, size_t cap)
{
    if (c->k_shard % 64 == 0) return 0;
    snprintf(why, cap, "input features per shard %lld not a multiple of 64", (long long)c->k_shard);
    return 1;
}
static int machete_n(const srv_ctx *c, char *why, size_t cap)
{
    if (c->n_shard % 128 == 0) return 0;
    snprintf(why, cap, "output features per shard %lld not a multiple of 128", (long long)c->n_shard);
    return 1;
}

/* ---- Marlin ---- */
static int marlin_gpu(const srv_ctx *c, char *why, size_t cap)
{
    if (c->l->gpu_cc >= 80) return 0;
    snprintf(why, cap, "needs compute capability 8.0 or newer");
    return 1;
}
static int marlin_type(const srv_ctx *c, char *why, size_t cap)
{
    if (c->zp ? c->l->bits == 4 : (c->l->bits == 4 || c->l->bits == 8)) return 0;
    snprintf(why, cap, "%d-bit %s weights (with zero points only 4-bit uint4; symmetric 4 or 8)", c->l->bits,
             c->zp ? "asymmetric" : "symmetric");
    return 1;
}
static int marlin_group(const srv_ctx *c, char *why, size_t cap)
{
    int64_t g = c->l->group_size;
    if (g == -1 || g == 32 || g == 64 || g == 128) return 0;
    snprintf(why, cap, "group size %lld (-1, 32, 64 or 128)", (long long)g);
    return 1;
}
static int marlin_n(const srv_ctx *c, char *why, size_t cap)
{
    if (c->n_shard % 64 == 0) return 0;
    snprintf(why, cap, "output features per shard %lld not a multiple of 64 (newer vLLM zero-pads some shapes)",
             (long long)c->n_shard);
    return 1;
}
static int marlin_k(const srv_ctx *c, char *why, size_t cap)
{
    if (c->k_shard % 128 == 0) return 0;
    snprintf(why, cap, "input features per shard %lld not a multiple of 128 (newer vLLM zero-pads some shapes)",
             (long long)c->k_shard);
    return 1;
}

/* ---- Exllama (compressed-tensors chain) ---- */
static int exllama_actorder(const srv_ctx *c, char *why, size_t cap) { return machete_actorder(c, why, cap); }
static int exllama_type(const srv_ctx *c, char *why, size_t cap)
{
    if (!c->zp && (c->l->bits == 4 || c->l->bits == 8)) return 0;
    snprintf(why, cap, "%s %d-bit weights (symmetric uint4b8/uint8b128 only)", c->zp ? "asymmetric" : "symmetric",
             c->l->bits);
    return 1;
}
static int exllama_n(const srv_ctx *c, char *why, size_t cap)
{
    if (c->n_shard % pack_unit(c->l->bits) == 0) return 0;
    snprintf(why, cap, "output features per shard %lld not a multiple of %d", (long long)c->n_shard, pack_unit(c->l->bits));
    return 1;
}

#define MP_DIR "vllm/model_executor/layers/quantization/kernels/mixed_precision/"
#define UT_DIR "vllm/model_executor/layers/quantization/utils/"

/* The table: rules in the order vLLM applies them. */
static const srv_rule rules[] = {
    {"load.shard", QD_SRV_NO_LOAD, "vllm/distributed/utils.py (divide)", load_shard},
    {"load.group", QD_SRV_NO_LOAD, UT_DIR "marlin_utils.py (verify_group_size_divides_partition); gptq.py create_weights", load_group},
    {"load.packed", QD_SRV_NO_LOAD, "vllm/model_executor/parameter.py (PackedvLLMParameter shards whole words)", load_packed},
    {"machete.gpu", QD_SRV_MACHETE, MP_DIR "machete.py (is_device_capability(90))", machete_gpu},
    {"machete.actorder", QD_SRV_MACHETE, MP_DIR "machete.py (has_g_idx and partitioned input features)", machete_actorder},
    {"machete.type", QD_SRV_MACHETE, UT_DIR "machete_utils.py (query_machete_supported_quant_types)", machete_type},
    {"machete.group", QD_SRV_MACHETE, UT_DIR "machete_utils.py (query_machete_supported_group_sizes)", machete_group},
    {"machete.k", QD_SRV_MACHETE, UT_DIR "machete_utils.py (check_machete_supports_shape: block 64)", machete_k},
    {"machete.n", QD_SRV_MACHETE, UT_DIR "machete_utils.py (check_machete_supports_shape: block 128)", machete_n},
    {"marlin.gpu", QD_SRV_MARLIN, UT_DIR "marlin_utils.py (query_marlin_supported_quant_types: capability)", marlin_gpu},
    {"marlin.type", QD_SRV_MARLIN, UT_DIR "marlin_utils.py (query_marlin_supported_quant_types: has_zp -> uint4)", marlin_type},
    {"marlin.group", QD_SRV_MARLIN, UT_DIR "marlin_utils.py (MARLIN_SUPPORTED_GROUP_SIZES)", marlin_group},
    {"marlin.n", QD_SRV_MARLIN, UT_DIR "marlin_utils.py (GPTQ_MARLIN_MIN_THREAD_N = 64)", marlin_n},
    {"marlin.k", QD_SRV_MARLIN, UT_DIR "marlin_utils.py (GPTQ_MARLIN_MIN_THREAD_K = 128)", marlin_k},
    {"exllama.actorder", QD_SRV_EXLLAMA, MP_DIR "exllama.py (has_g_idx and partitioned input features)", exllama_actorder},
    {"exllama.type", QD_SRV_EXLLAMA, MP_DIR "exllama.py (SUPPORTED_QUANT_TYPES)", exllama_type},
    {"exllama.n", QD_SRV_EXLLAMA, MP_DIR "exllama.py (output features a multiple of the pack factor)", exllama_n},
};
#define N_RULES (sizeof rules / sizeof rules[0])

const char *qd_srv_kernel_name(qd_srv_kernel k)
{
    switch (k) {
    case QD_SRV_MACHETE: return "Machete";
    case QD_SRV_MARLIN: return "Marlin";
    case QD_SRV_EXLLAMA: return "Exllama";
    case QD_SRV_FALLBACK: return "fallback";
    case QD_SRV_NO_LOAD: return "will not load";
    }
    return "?";
}

int qd_srv_gpu_cc(const char *gpu)
{
    if (!gpu) return 0;
    if (!strcmp(gpu, "hopper")) return 90;
    if (!strcmp(gpu, "ampere")) return 80;
    return 0;
}

/* Appends "[id] reason (source); " to why. */
static void note(char *why, size_t cap, const srv_rule *r, const char *reason)
{
    size_t o = strlen(why);
    if (o < cap) snprintf(why + o, cap - o, "%s%s: %s [%s]", o ? "; " : "", r->id, reason, r->source);
}

/* First rule of kernel k that refuses, noted in why; 0 when k takes the layer. */
static int kernel_refuses(qd_srv_kernel k, const srv_ctx *c, char *why, size_t cap)
{
    char reason[256];
    for (size_t i = 0; i < N_RULES; i++)
        if (rules[i].kernel == k && rules[i].refuses(c, reason, sizeof reason)) {
            note(why, cap, &rules[i], reason);
            return 1;
        }
    return 0;
}

/* Puts head in front of s (truncating the end when it does not fit). */
static void prepend(char *s, size_t cap, const char *head)
{
    size_t h = strlen(head), n = strlen(s);
    if (h >= cap) h = cap - 1;
    if (h + n >= cap) n = cap - 1 - h;
    memmove(s + h, s, n);
    memcpy(s, head, h);
    s[h + n] = 0;
}

static void choose(qd_srv_choice *out, qd_srv_kernel k, const char *path)
{
    out->kernel = k;
    out->fast = k == QD_SRV_MACHETE || k == QD_SRV_MARLIN;
    char head[320];
    snprintf(head, sizeof head, "%s via %s%s", qd_srv_kernel_name(k), path, out->why[0] ? "; refused: " : "");
    prepend(out->why, sizeof out->why, head);
}

int qd_srv_choose(const qd_srv_layer *l, qd_srv_choice *out)
{
    memset(out, 0, sizeof *out);
    if (!l || !l->format || l->tp < 1 || l->bits < 1 || l->bits > 8 || l->in_features <= 0 || l->out_features <= 0) {
        out->kernel = QD_SRV_NO_LOAD;
        snprintf(out->why, sizeof out->why, "invalid layer description");
        return -1;
    }
    srv_ctx c = {l, l->row_parallel ? l->in_features / l->tp : l->in_features,
                 l->row_parallel ? l->out_features : l->out_per_shard, !l->sym};
    char reason[256];
    for (size_t i = 0; i < N_RULES; i++)
        if (rules[i].kernel == QD_SRV_NO_LOAD && rules[i].refuses(&c, reason, sizeof reason)) {
            note(out->why, sizeof out->why, &rules[i], reason);
            out->kernel = QD_SRV_NO_LOAD;
            prepend(out->why, sizeof out->why, "will not load: ");
            return 0;
        }
    char *w = out->why;
    const size_t cap = sizeof out->why;
    if (is_ct(&c)) {
        const char *path = "compressed-tensors CompressedTensorsWNA16 "
                           "[vllm/model_executor/layers/quantization/compressed_tensors/schemes/compressed_tensors_wNa16.py]";
        if (!kernel_refuses(QD_SRV_MACHETE, &c, w, cap)) choose(out, QD_SRV_MACHETE, path);
        else if (!kernel_refuses(QD_SRV_MARLIN, &c, w, cap)) choose(out, QD_SRV_MARLIN, path);
        else if (!kernel_refuses(QD_SRV_EXLLAMA, &c, w, cap)) choose(out, QD_SRV_EXLLAMA, path);
        else {
            prepend(out->why, cap, "will not load: no mixed-precision kernel takes it (choose_mp_linear_kernel, "
                    MP_DIR "__init__.py); refused: ");
            out->kernel = QD_SRV_NO_LOAD;
        }
        return 0;
    }
    if (is_awq(&c)) {
        const char *path = "awq_marlin [vllm/model_executor/layers/quantization/awq_marlin.py]";
        if (!kernel_refuses(QD_SRV_MARLIN, &c, w, cap)) choose(out, QD_SRV_MARLIN, path);
        else choose(out, QD_SRV_FALLBACK, "awq GEMM [vllm/model_executor/layers/quantization/awq.py]");
        return 0;
    }
    /* gptq, gptq_v2: gptq_marlin takes symmetric 4/8-bit with Marlin's group sizes. */
    const char *path = "gptq_marlin [vllm/model_executor/layers/quantization/gptq_marlin.py]";
    if (c.zp || (l->bits != 4 && l->bits != 8)) {
        note(w, cap, &(srv_rule){"gptq_marlin.type", QD_SRV_MARLIN,
                                 "vllm/model_executor/layers/quantization/gptq_marlin.py (is_gptq_marlin_compatible: sym, 4/8-bit)",
                                 NULL},
             c.zp ? "asymmetric weights" : "not 4 or 8 bits");
    } else if (!kernel_refuses(QD_SRV_MACHETE, &c, w, cap)) {
        choose(out, QD_SRV_MACHETE, path);
        return 0;
    } else if (!kernel_refuses(QD_SRV_MARLIN, &c, w, cap)) {
        choose(out, QD_SRV_MARLIN, path);
        return 0;
    }
    if (l->g_idx && l->row_parallel && l->tp > 1)
        choose(out, QD_SRV_FALLBACK, "gptq without exllama (act-order on a row-parallel split) "
               "[vllm/model_executor/layers/quantization/gptq.py]");
    else
        choose(out, QD_SRV_EXLLAMA, "gptq (exllama gptq_gemm) [vllm/model_executor/layers/quantization/gptq.py]");
    return 0;
}

/* For tests: the table's rule ids, in order. */
size_t qd_srv_rule_count(void) { return N_RULES; }
const char *qd_srv_rule_id(size_t i) { return i < N_RULES ? rules[i].id : NULL; }

/* What setting fixes each refusal, for the job pre-flight's message. */
static const struct { const char *id, *fix; } fixes[] = {
    {"load.shard", "a tp that divides the layer's features"},
    {"load.group", "a group_size that divides in_features / tp (e.g. 64 or 32), or a smaller tp"},
    {"load.packed", "a tp whose shards hold whole packed words"},
    {"gptq_marlin.type", "sym true with 4 or 8 bits (or format compressed-tensors)"},
    {"machete.gpu", "gpu hopper (Machete)"},
    {"machete.actorder", "static_groups true or desc_act false"},
    {"machete.group", "group_size 128, 64 or -1 (Machete)"},
    {"marlin.type", "sym true, or 4 bits (Marlin takes zero points at 4 bits only)"},
    {"marlin.group", "group_size 128, 64, 32 or -1"},
    {"machete.k", "a tp whose input shards are multiples of 64"},
    {"machete.n", "a tp whose output shards are multiples of 128"},
    {"marlin.n", "a tp whose output shards are multiples of 64"},
    {"marlin.k", "a tp whose input shards are multiples of 128"},
};

void qd_srv_fix_hint(const char *why, char *out, size_t cap)
{
    size_t o = 0;
    out[0] = 0;
    for (size_t i = 0; i < sizeof fixes / sizeof fixes[0] && o < cap; i++) {
        char key[48];
        snprintf(key, sizeof key, "%s:", fixes[i].id);
        if (strstr(why, key)) o += (size_t)snprintf(out + o, cap - o, "%s%s", o ? "; or " : "", fixes[i].fix);
    }
    if (!o) snprintf(out, cap, "other quantization settings or another tp");
}
