/* quantctl check-serving DIR --engine vllm --gpu hopper|ampere|blackwell --tp N [--json]: which vLLM
 * kernel will serve each linear of a quantized checkpoint (quantd's or another tool's, any
 * format the format table reads) at that tensor-parallel degree, and why
 * (quant/formats/serving.c holds the rules with their vLLM sources). Exit 0 when every
 * quantized layer gets a fast kernel (Machete, Marlin, or an FP8 / W4A8 / FP4 GEMM), 1 otherwise,
 * 2 on bad usage. The activations a checkpoint declares are not read here yet: the rules take
 * them as quantd writes each format (serving.c act_of). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/quantctl.h"
#include "quant/backend/backend.h"
#include <cjson/cJSON.h>
#include "quant/core/jsonfile.h"
#include "quant/core/safetensors.h"
#include "quant/formats/fmt_gptq_dynamic.h"
#include "quant/formats/format.h"
#include "quant/tp/tp_serving.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: quantctl check-serving DIR --engine vllm --gpu hopper|ampere|blackwell --tp N [--json]\n"
               "Reports, per linear of the quantized checkpoint DIR as vLLM fuses and shards it at TP N, the\n"
               "kernel that will serve it (Machete, Marlin, CUTLASS FP8, block FP8, CutlassW4A8, FP4 GEMM,\n"
               "Exllama, fallback, will not load) and why. --gpu: hopper (H100/H200, sm90), ampere (A100,\n"
               "sm80), blackwell (B200, sm100).\n"
               "Exit: 0 every quantized layer gets a fast kernel (all but Exllama, fallback and will not load),\n"
               "1 otherwise, 2 bad usage or input.\n");
}

typedef struct float_ctx {
    const qd_model *m;
    const cJSON *qcfg;   /* GPTQ with `dynamic` overrides: config.json's quantization_config */
} float_ctx;

/* A linear stored as "<name>.weight" is unquantized in the checkpoint, unless a
 * "<name>.weight_scale" goes with it: compressed-tensors float-quantized (FP8) keeps the
 * quantized weight under the plain name. */
static int ckpt_is_float(void *ud, int block, int li)
{
    const float_ctx *c = ud;
    char prefix[160], name[400];
    qd_model_block_prefix(c->m, block, prefix, sizeof prefix);
    int o = snprintf(name, sizeof name, "%s%s.weight", prefix, qd_model_linear(c->m, li)->name);
    if (!st_model_find(qd_model_tensors(c->m), name)) return 0;
    if (o < 0 || (size_t)o + sizeof "_scale" > sizeof name) return 1;
    strcat(name, "_scale");
    return st_model_find(qd_model_tensors(c->m), name) == NULL;
}

/* A layer's stored bits and group size, as the reader takes them: the packed tensor holds
 * K * bits / 32 words along axis `pk` (compressed-tensors' weight_packed: columns; GPTQ's
 * qweight: rows), the scales one group per entry along axis `sk`. */
static int stored_layer_quant(const float_ctx *c, int block, int li, const char *packed, const char *scales, int pk,
                              int sk, int *bits, int64_t *gs)
{
    const qd_linear_info *L = qd_model_linear(c->m, li);
    char prefix[160], name[400];
    qd_model_block_prefix(c->m, block, prefix, sizeof prefix);
    snprintf(name, sizeof name, "%s%s.%s", prefix, L->name, packed);
    const st_tensor *wp = st_model_find(qd_model_tensors(c->m), name);
    snprintf(name, sizeof name, "%s%s.%s", prefix, L->name, scales);
    const st_tensor *ws = st_model_find(qd_model_tensors(c->m), name);
    if (!wp || !ws || wp->ndim != 2 || ws->ndim != 2 || L->k <= 0 || ws->shape[sk] < 1) return -1;
    *bits = (int)(wp->shape[pk] * 32 / L->k);
    *gs = ws->shape[sk] == 1 ? -1 : L->k / ws->shape[sk];
    return 0;
}

/* A mixed compressed-tensors checkpoint (job.target_bpw). */
static int ckpt_layer_quant(void *ud, int block, int li, int *bits, int64_t *gs)
{
    return stored_layer_quant(ud, block, li, "weight_packed", "weight_scale", 1, 1, bits, gs);
}

/* A mixed GPTQ checkpoint (`dynamic` overrides of bits or group size); what vLLM builds comes
 * from the rules (gptq_row_quant), and the two are compared. */
static int gptq_layer_quant(void *ud, int block, int li, int *bits, int64_t *gs)
{
    return stored_layer_quant(ud, block, li, "qweight", "scales", 0, 0, bits, gs);
}

/* What vLLM builds the layer it names vllm_name with: the first `dynamic` rule that re.match-es
 * the name (a "-:" rule: 0 bits, left unquantized). */
static int gptq_row_quant(void *ud, const char *vllm_name, int *bits, int64_t *gs)
{
    const float_ctx *c = ud;
    qd_err err = {0};
    int rc = qd_gptq_dynamic_lookup(c->qcfg, vllm_name, bits, gs, &err);
    if (rc < 0) return rc;
    if (rc == QD_GPTQ_DYN_SKIP) *bits = 0;
    return 0;
}

int cmd_check_serving(int argc, char **argv, const qd_runtime_opts *rt)
{
    const char *dir = NULL, *engine = NULL, *gpu = NULL;
    long tp = 0;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return QCTL_OK; }
        if (!strcmp(a, "--json")) { json = 1; continue; }
        if (a[0] != '-') {
            if (dir) { fprintf(stderr, "quantctl check-serving: one directory only ('%s')\n", a); return QCTL_USAGE; }
            dir = a;
            continue;
        }
        if (i + 1 >= argc) { fprintf(stderr, "quantctl check-serving: %s needs a value\n", a); return QCTL_USAGE; }
        const char *v = argv[++i];
        if (!strcmp(a, "--engine")) engine = v;
        else if (!strcmp(a, "--gpu")) gpu = v;
        else if (!strcmp(a, "--tp")) {
            char *end;
            errno = 0;
            tp = strtol(v, &end, 10);
            if (errno || *end || tp < 1 || tp > 1024) {
                fprintf(stderr, "quantctl check-serving: --tp: '%s' is not an integer in 1..1024\n", v);
                return QCTL_USAGE;
            }
        } else {
            fprintf(stderr, "quantctl check-serving: unknown option '%s' (see --help)\n", a);
            return QCTL_USAGE;
        }
    }
    if (!dir || !engine || !gpu || !tp) {
        fprintf(stderr, "quantctl check-serving: DIR, --engine, --gpu and --tp are required (see --help)\n");
        return QCTL_USAGE;
    }
    if (strcmp(engine, "vllm")) {
        fprintf(stderr, "quantctl check-serving: --engine: '%s' is not supported (vllm)\n", engine);
        return QCTL_USAGE;
    }
    int cc = qd_srv_gpu_cc(gpu);
    if (!cc) { fprintf(stderr, "quantctl check-serving: --gpu: '%s' is not one of hopper, ampere, blackwell\n", gpu); return QCTL_USAGE; }
    qd_err err = {0};
    qd_backend *be = NULL;
    qd_model *m = NULL;
    if (qd_backend_cpu_open(1, rt, &be, &err) || qd_model_open(dir, be, &m, &err)) {
        fprintf(stderr, "quantctl check-serving: %s\n", err.msg);
        qd_backend_close(be);
        return QCTL_USAGE;
    }
    const qd_model_config *cfg = qd_model_cfg(m);
    if (!cfg->quantized) {
        fprintf(stderr, "quantctl check-serving: %s is not a quantized checkpoint (no quantization_config)\n", dir);
        qd_model_close(m);
        qd_backend_close(be);
        return QCTL_USAGE;
    }
    const qd_format *f = qd_format_find(cfg->quant_format);
    /* vLLM keeps a g_idx for desc_act GPTQ (has_g_idx = desc_act); compressed-tensors'
     * actorder "weight" has none. */
    qd_serving_quant q = {cfg->quant_format, cfg->quant_bits, cfg->quant_sym, cfg->quant_group_size,
                          f && f->act_order == QD_FMT_ACT_ORDER_G_IDX && cfg->quant_desc_act, cfg->quant_act, NULL, NULL, NULL, 0};
    float_ctx fc = {m, NULL};
    cJSON *root = NULL;
    if (cfg->quant_bits == 0) {   /* mixed bits per layer (qd_fmt_detected.mixed) */
        q.layer_quant = ckpt_layer_quant;
        q.layer_ud = &fc;
    }
    if (cfg->quant_bits == 0 && f && f->has_g_idx) {
        /* GPTQ: the `dynamic` rules as vLLM matches them against its own layer names. */
        char path[4200];
        snprintf(path, sizeof path, "%s/config.json", dir);
        if (qd_json_read_object(path, QD_INPUT_JSON, &root, &err)) {
            fprintf(stderr, "quantctl check-serving: %s\n", err.msg);
            qd_model_close(m);
            qd_backend_close(be);
            return QCTL_USAGE;
        }
        fc.qcfg = cJSON_GetObjectItemCaseSensitive(root, "quantization_config");
        q.layer_quant = gptq_layer_quant;
        q.row_quant = gptq_row_quant;
    }
    qd_serving_report rep;
    int rc = qd_tp_serving_check(m, &q, ckpt_is_float, &fc, (int)tp, cc, &rep, &err);
    if (rc) {
        fprintf(stderr, "quantctl check-serving: %s\n", err.msg);
        cJSON_Delete(root);
        qd_model_close(m);
        qd_backend_close(be);
        return QCTL_FAIL;
    }
    for (size_t i = 0; i < rep.n; i++) {
        const qd_serving_row *r = &rep.rows[i];
        const char *k = r->is_float ? "float" : qd_srv_kernel_name(r->choice.kernel);
        if (json)
            printf("{\"layer\":\"%s\",\"kernel\":\"%s\",\"fast\":%s}\n", r->name, k,
                   r->is_float || r->choice.fast ? "true" : "false");
        else
            printf("%-60s %-14s %s\n", r->name, k, r->is_float ? "left in float, served unquantized" : r->choice.why);
    }
    if (cfg->quant_bits == 0)
        printf("%s: format %s, mixed bits and group sizes per layer, %s%s; vllm on %s at tp %ld: %zu of %zu layers without "
               "a fast kernel\n", rep.n_slow ? "FAIL" : "OK", cfg->quant_format, cfg->quant_sym ? "symmetric" : "asymmetric",
               q.g_idx ? ", act-order g_idx" : "", gpu, tp, rep.n_slow, rep.n);
    else
        printf("%s: format %s, %d-bit, %s, group %lld%s; vllm on %s at tp %ld: %zu of %zu layers without a fast kernel\n",
               rep.n_slow ? "FAIL" : "OK", cfg->quant_format, cfg->quant_bits, cfg->quant_sym ? "symmetric" : "asymmetric",
               (long long)cfg->quant_group_size, q.g_idx ? ", act-order g_idx" : "", gpu, tp, rep.n_slow, rep.n);
    int status = rep.n_slow ? QCTL_FAIL : QCTL_OK;
    qd_tp_serving_report_free(&rep);
    cJSON_Delete(root);
    qd_model_close(m);
    qd_backend_close(be);
    return status;
}
