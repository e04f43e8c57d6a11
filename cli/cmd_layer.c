/* quantctl layer: quantize one linear layer (GPTQ, AWQ or RTN) from safetensors files, pack
 * it in a checkpoint format, and report how far what the file decodes to is from the float
 * layer. quantctl gen-layer: write a synthetic layer and LLM-like calibration inputs for
 * demos, tests and benchmarks.
 *
 * The report is one JSON object on the last line of stdout. Errors in the input (files,
 * shapes, options, non-finite values) exit 2 with one line on stderr naming the problem;
 * failures of the work itself exit 1. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "cli/quantctl.h"
#include "quant/algo/awq.h"
#include "quant/algo/gptq.h"
#include "quant/algo/hessian.h"
#include "quant/backend/backend.h"
#include "quant/core/clock.h"
#include "quant/core/dtype.h"
#include "quant/core/fsutil.h"
#include "quant/core/rng.h"
#include "quant/core/safetensors.h"
#include "quant/formats/format.h"
#include "quant/formats/scheme.h"
#include "quant/formats/qlayer.h"
#include "quant/formats/quantizer.h"

/* Prints "quantctl CMD: message" and returns code (QCTL_USAGE for bad input, QCTL_FAIL when
 * the work itself failed). */
static int layer_err(int code, const char *cmd, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int layer_err(int code, const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "quantctl %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return code;
}

/* Option parsing: "--name value" or "--name=value". Returns the value, or NULL when
 * argv[*i] is not this option; *missing is set when the value is absent. */
static const char *layer_opt(int argc, char **argv, int *i, const char *name, int *missing)
{
    size_t len = strlen(name);
    if (strncmp(argv[*i], name, len) != 0) return NULL;
    if (argv[*i][len] == '=') return argv[*i] + len + 1;
    if (argv[*i][len] != '\0') return NULL;
    if (*i + 1 >= argc) {
        *missing = 1;
        return NULL;
    }
    return argv[++*i];
}

static int layer_parse_i64(const char *s, int64_t *out)
{
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || errno) return -1;
    *out = v;
    return 0;
}

/* ---- loading ------------------------------------------------------------------------- */

typedef struct layer_tensor {
    st_file *file;
    const st_tensor *t;
    char path[1024];
    char name[256];
} layer_tensor;

/* Opens "FILE" (whose only tensor is taken) or "FILE:NAME". The error names the option. */
static int layer_open_tensor(const char *opt, const char *spec, layer_tensor *lt, char *msg, size_t msz)
{
    memset(lt, 0, sizeof *lt);
    qd_err err = {0};
    const char *name = NULL;
    snprintf(lt->path, sizeof lt->path, "%s", spec);
    if (!qd_fs_exists(spec)) {
        char *colon = strrchr(lt->path, ':');
        if (colon && colon != lt->path) {
            *colon = '\0';
            name = colon + 1;
            snprintf(lt->name, sizeof lt->name, "%s", name);
        }
    }
    if (st_file_open(lt->path, &lt->file, &err)) {
        snprintf(msg, msz, "%s %s: %s", opt, spec, err.msg);
        return -1;
    }
    if (name) {
        lt->t = st_file_find(lt->file, name);
        if (!lt->t) {
            snprintf(msg, msz, "%s %s: no tensor named '%s' in %s", opt, spec, name, lt->path);
            return -1;
        }
    } else {
        if (st_file_count(lt->file) != 1) {
            snprintf(msg, msz, "%s %s: the file holds %zu tensors; name one as FILE:NAME", opt, spec,
                     st_file_count(lt->file));
            return -1;
        }
        lt->t = st_file_tensor(lt->file, 0);
        snprintf(lt->name, sizeof lt->name, "%s", lt->t->name);
    }
    return 0;
}

/* Reads a rank-2 float tensor to F32 and checks every value is finite. */
static float *layer_read_2d(const char *opt, layer_tensor *lt, const char *shape_name, int64_t *rows,
                            int64_t *cols, char *msg, size_t msz)
{
    const st_tensor *t = lt->t;
    if (t->dtype != QD_DTYPE_F32 && t->dtype != QD_DTYPE_F16 && t->dtype != QD_DTYPE_BF16) {
        snprintf(msg, msz, "%s %s: tensor '%s' has dtype %s; expected F32, F16 or BF16", opt, lt->path,
                 t->name, qd_dtype_name(t->dtype));
        return NULL;
    }
    if (t->ndim != 2 || t->shape[0] <= 0 || t->shape[1] <= 0) {
        snprintf(msg, msz, "%s %s: tensor '%s' has rank %d; expected a non-empty %s", opt, lt->path,
                 t->name, t->ndim, shape_name);
        return NULL;
    }
    *rows = t->shape[0];
    *cols = t->shape[1];
    float *x = malloc((size_t)t->numel * sizeof *x);
    qd_err err = {0};
    if (!x) {
        snprintf(msg, msz, "%s %s: out of memory for %llu values", opt, lt->path, (unsigned long long)t->numel);
        return NULL;
    }
    if (st_tensor_read_f32(t, x, &err)) {
        snprintf(msg, msz, "%s %s: %s", opt, lt->path, err.msg);
        free(x);
        return NULL;
    }
    for (uint64_t i = 0; i < t->numel; i++)
        if (!isfinite(x[i])) {
            snprintf(msg, msz, "%s %s: tensor '%s' element [%lld, %lld] is %g (not finite)", opt, lt->path,
                     t->name, (long long)(i / (uint64_t)*cols), (long long)(i % (uint64_t)*cols), (double)x[i]);
            free(x);
            return NULL;
        }
    return x;
}

/* ---- error measurement --------------------------------------------------------------- */

/* ||W X^T - Q X^T||_F^2 and ||W X^T||_F^2 through backend gemms over chunks of X's rows:
 * M = [W; W - Q] times X_chunk^T. */
static int layer_output_errors(qd_backend *be, const float *w, const float *q, int64_t n, int64_t k,
                               const float *x, int64_t t, double *num, double *den, char *msg, size_t msz)
{
    const int64_t chunk = 256;
    int rc = QD_ENOMEM;
    float *m = qd_backend_alloc(be, (size_t)(2 * n * k) * sizeof(float));
    float *xc = qd_backend_alloc(be, (size_t)(chunk * k) * sizeof(float));
    float *y = qd_backend_alloc(be, (size_t)(2 * n * chunk) * sizeof(float));
    float *yh = malloc((size_t)(2 * n * chunk) * sizeof(float));
    float *mh = malloc((size_t)(2 * n * k) * sizeof(float));
    *num = *den = 0.0;
    if (!m || !xc || !y || !yh || !mh) {
        snprintf(msg, msz, "out of memory measuring the output error");
        goto out;
    }
    memcpy(mh, w, (size_t)(n * k) * sizeof(float));
    for (int64_t i = 0; i < n * k; i++) mh[n * k + i] = w[i] - q[i];
    if ((rc = qd_backend_upload(be, m, mh, (size_t)(2 * n * k) * sizeof(float)))) goto be_fail;
    for (int64_t r0 = 0; r0 < t; r0 += chunk) {
        int64_t c = t - r0 < chunk ? t - r0 : chunk;
        if ((rc = qd_backend_upload(be, xc, x + r0 * k, (size_t)(c * k) * sizeof(float)))) goto be_fail;
        if ((rc = be->ops->gemm(be, 0, 1, 2 * n, c, k, 1.0f, m, k, xc, k, 0.0f, y, c))) goto be_fail;
        if ((rc = qd_backend_download(be, yh, y, (size_t)(2 * n * c) * sizeof(float)))) goto be_fail;
        for (int64_t i = 0; i < n * c; i++) *den += (double)yh[i] * yh[i];
        for (int64_t i = n * c; i < 2 * n * c; i++) *num += (double)yh[i] * yh[i];
    }
    rc = 0;
    goto out;
be_fail:
    snprintf(msg, msz, "measuring the output error: %s", be->err.msg);
out:
    qd_backend_free(be, m);
    qd_backend_free(be, xc);
    qd_backend_free(be, y);
    free(yh);
    free(mh);
    return rc;
}

/* ---- quantctl layer ------------------------------------------------------------------ */

static void layer_help(FILE *f)
{
    fprintf(f,
        "usage: quantctl layer --weight W.safetensors[:NAME] --inputs X.safetensors[:NAME]\n"
        "                      --method gptq|awq|rtn --bits B --group-size G --out OUT.safetensors\n"
        "                      [--sym] [--desc-act] [--static-groups] [--damp 0.01]\n"
        "                      [--scale-search minmax|mse]\n"
        "                      [--format NAME] [--block-size 128] [--backend cpu]\n"
        "       quantctl layer --weight ... --inputs ... --method M --scheme NAME --out OUT.safetensors\n"
        "\n"
        "Quantizes one nn.Linear weight W [N, K] with calibration activations X [T, K] (F32, F16\n"
        "or BF16), writes the packed tensors as the format names them (gptq: qweight, qzeros,\n"
        "scales, g_idx; compressed-tensors: weight_packed, ...; awq also writes input_scales [K],\n"
        "the per-channel scales s the layer's input\n"
        "must be divided by) and prints a one-line JSON report as the last line of stdout:\n"
        "rel_output_error = ||W X^T - Q X^T||_F / ||W X^T||_F with Q what the file decodes to,\n"
        "rel_weight_error, seconds (the quantization proper), damp, fallback and the options.\n"
        "\n"
        "  --method        gptq, awq or rtn\n"
        "  --bits          2, 3, 4 or 8 (as the format allows: awq_gemm 4, compressed-tensors 4 or 8)\n"
        "  --group-size    a positive group length along K, or -1 for one group\n"
        "  --sym           symmetric quantization (default asymmetric; gptq v1 keeps zeros >= 1)\n"
        "  --desc-act      GPTQ act-order (columns by decreasing Hessian diagonal)\n"
        "  --static-groups GPTQ group parameters from the unpermuted weights, found up front\n"
        "  --damp          GPTQ damping fraction of mean(diag H), in (0, 1); default 0.01\n"
        "  --scale-search  minmax (default) or mse: each group's range searched by its error\n"
        "                  weighted with H's diagonal (gptq) or 1 (rtn); docs/methods.md\n"
        "  --format        a name of the format table (gptq, gptq_v2, awq_gemm, compressed-tensors);\n"
        "                  default as a job's: awq_gemm for awq at 4 bits, else gptq\n"
        "  --scheme        a scheme (W4A16, FP8_DYNAMIC, FP8_BLOCK, NVFP4A16, MXFP4A16, ...): sets bits,\n"
        "                  group size, symmetry, the grid and the format; the float formats need it\n"
        "  --block-size    GPTQ lazy-update block (default 128)\n"
        "  --backend       cpu (default) or cuda:N\n"
        "\nexit status: 0 success, 1 the work failed, 2 bad usage or bad input\n");
}

typedef struct layer_args {
    const char *weight, *inputs, *method, *format, *out, *backend, *scheme;
    int bits;
    int64_t group_size;
    int have_bits, have_group;
    int sym, desc_act, static_groups;
    int scale_search;            /* qd_scale_search */
    double damp;
    int64_t block_size;
} layer_args;

static int layer_parse(int argc, char **argv, layer_args *a)
{
    memset(a, 0, sizeof *a);
    a->damp = 0.01;
    a->block_size = 128;
    a->backend = "cpu";
    for (int i = 1; i < argc; i++) {
        int missing = 0;
        const char *v;
        const char *arg = argv[i];
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) return 1;
        if (!strcmp(arg, "--sym")) { a->sym = 1; continue; }
        if (!strcmp(arg, "--desc-act")) { a->desc_act = 1; continue; }
        if (!strcmp(arg, "--static-groups")) { a->static_groups = 1; continue; }
        if ((v = layer_opt(argc, argv, &i, "--weight", &missing))) { a->weight = v; continue; }
        if ((v = layer_opt(argc, argv, &i, "--inputs", &missing))) { a->inputs = v; continue; }
        if ((v = layer_opt(argc, argv, &i, "--method", &missing))) { a->method = v; continue; }
        if ((v = layer_opt(argc, argv, &i, "--format", &missing))) { a->format = v; continue; }
        if ((v = layer_opt(argc, argv, &i, "--scheme", &missing))) { a->scheme = v; continue; }
        if ((v = layer_opt(argc, argv, &i, "--out", &missing))) { a->out = v; continue; }
        if ((v = layer_opt(argc, argv, &i, "--backend", &missing))) { a->backend = v; continue; }
        if ((v = layer_opt(argc, argv, &i, "--scale-search", &missing))) {
            if ((a->scale_search = qd_scale_search_parse(v)) < 0)
                return -layer_err(QCTL_USAGE, "layer", "--scale-search: '%s' is not minmax or mse", v);
            continue;
        }
        if ((v = layer_opt(argc, argv, &i, "--bits", &missing))) {
            int64_t b;
            if (layer_parse_i64(v, &b) || b < 0 || b > 64)
                return -layer_err(QCTL_USAGE, "layer", "--bits: '%s' is not a number of bits", v);
            a->bits = (int)b;
            a->have_bits = 1;
            continue;
        }
        if ((v = layer_opt(argc, argv, &i, "--group-size", &missing))) {
            if (layer_parse_i64(v, &a->group_size))
                return -layer_err(QCTL_USAGE, "layer", "--group-size: '%s' is not an integer", v);
            a->have_group = 1;
            continue;
        }
        if ((v = layer_opt(argc, argv, &i, "--block-size", &missing))) {
            if (layer_parse_i64(v, &a->block_size) || a->block_size < 1 || a->block_size > 4096)
                return -layer_err(QCTL_USAGE, "layer", "--block-size: '%s' is not in 1..4096", v);
            continue;
        }
        if ((v = layer_opt(argc, argv, &i, "--damp", &missing))) {
            char *end = NULL;
            a->damp = strtod(v, &end);
            if (!*v || *end || !(a->damp > 0.0 && a->damp < 1.0))
                return -layer_err(QCTL_USAGE, "layer", "--damp: '%s' is not a fraction in (0, 1)", v);
            continue;
        }
        if (missing) return -layer_err(QCTL_USAGE, "layer", "%s needs a value", arg);
        return -layer_err(QCTL_USAGE, "layer", "unknown option '%s' (see quantctl layer --help)", arg);
    }
    if (a->scheme) {
        /* A scheme is the whole recipe: the fields it sets may not also be given. */
        const qd_scheme *sc = qd_scheme_find(a->scheme);
        if (!sc) return -layer_err(QCTL_USAGE, "layer", "--scheme: '%s' is not a scheme (see docs/schemes.md)", a->scheme);
        if (a->have_bits || a->have_group || a->sym || a->format)
            return -layer_err(QCTL_USAGE, "layer", "--scheme %s sets --bits, --group-size, --sym and --format; give "
                              "none of them with it", sc->name);
        a->bits = sc->bits;
        a->group_size = sc->group_size;
        a->sym = sc->sym;
        a->format = sc->format;
        a->have_bits = a->have_group = 1;
    }
    if (!a->weight) return -layer_err(QCTL_USAGE, "layer", "--weight is required");
    if (!a->inputs) return -layer_err(QCTL_USAGE, "layer", "--inputs is required");
    if (!a->method) return -layer_err(QCTL_USAGE, "layer", "--method is required (gptq, awq or rtn)");
    if (strcmp(a->method, "gptq") && strcmp(a->method, "awq") && strcmp(a->method, "rtn"))
        return -layer_err(QCTL_USAGE, "layer", "--method: '%s' is not one of gptq, awq, rtn", a->method);
    if (!a->have_bits) return -layer_err(QCTL_USAGE, "layer", "--bits is required");
    if (a->bits != 2 && a->bits != 3 && a->bits != 4 && a->bits != 8)
        return -layer_err(QCTL_USAGE, "layer", "--bits: %d is not one of 2, 3, 4, 8", a->bits);
    if (!a->have_group) return -layer_err(QCTL_USAGE, "layer", "--group-size is required");
    if (a->group_size == 0 || a->group_size < -1)
        return -layer_err(QCTL_USAGE, "layer", "--group-size: %lld must be -1 or positive", (long long)a->group_size);
    if (!a->out) return -layer_err(QCTL_USAGE, "layer", "--out is required");
    if (!a->format) {
        unsigned mb = !strcmp(a->method, "awq") ? QD_FMT_METHOD_AWQ
                      : !strcmp(a->method, "rtn") ? QD_FMT_METHOD_RTN : QD_FMT_METHOD_GPTQ;
        int fi = qd_format_default(mb, a->bits);
        a->format = qd_format_at(fi < 0 ? 0 : (size_t)fi)->name;
    }
    if (strcmp(a->method, "gptq") && (a->desc_act || a->static_groups))
        return -layer_err(QCTL_USAGE, "layer", "--desc-act and --static-groups apply to --method gptq only");
    if (!strcmp(a->method, "awq") && a->scale_search == QD_SCALE_SEARCH_MSE)
        return -layer_err(QCTL_USAGE, "layer", "--scale-search mse is not used with --method awq: AWQ's clip search "
                          "already chooses each group's range");
    return 0;
}

/* What one method produced: the layer, and for AWQ the input scales. */
typedef struct layer_outcome {
    qd_qlayer layer;
    float *input_scales;        /* [K] AWQ only */
    double seconds, hessian_seconds;
    double damp, damp_percent;
    int damp_retries, fallback;
    int64_t dead_columns;
    double awq_alpha;
    int64_t awq_rows_reverted;
} layer_outcome;

static int layer_quantize(qd_backend *be, const layer_args *a, const qd_quant_cfg *qc, const float *w,
                          int64_t n, int64_t k, const float *x, int64_t t, layer_outcome *o,
                          char *msg, size_t msz)
{
    qd_err err = {0};
    int rc;
    if (!strcmp(a->method, "rtn")) {
        double t0 = qd_clock_now_s();
        rc = qd_rtn_quantize_qlayer(qc, w, n, k, &o->layer, NULL, &err);
        o->seconds = qd_clock_now_s() - t0;
        if (rc) snprintf(msg, msz, "rtn: %s", err.msg);
        return rc;
    }
    if (!strcmp(a->method, "gptq")) {
        qd_gptq_opts go = qd_gptq_opts_default();
        go.quant = *qc;
        go.damp_percent = a->damp;
        go.desc_act = a->desc_act;
        go.static_groups = a->static_groups;
        go.block_size = a->block_size;
        qd_gptq_hessian acc;
        double t0 = qd_clock_now_s();
        rc = qd_gptq_hessian_init(&acc, be, k, &err);
        if (!rc) rc = qd_gptq_hessian_add(&acc, x, t, &err);
        o->hessian_seconds = qd_clock_now_s() - t0;
        qd_gptq_result res;
        if (!rc) rc = qd_gptq_quantize(be, &go, w, n, k, &acc, &res, &err);
        qd_gptq_hessian_free(&acc);
        if (rc) {
            snprintf(msg, msz, "gptq: %s", err.msg);
            return rc;
        }
        o->layer = res.layer;                 /* take ownership */
        memset(&res.layer, 0, sizeof res.layer);
        o->seconds = res.seconds;
        o->damp = res.damp;
        o->damp_percent = res.damp_percent;
        o->damp_retries = res.damp_retries;
        o->fallback = res.fallback_rtn;
        o->dead_columns = res.dead_columns;
        qd_gptq_result_free(&res);
        return 0;
    }
    /* AWQ: search s (and clipping) on the backend, then RTN of clamp(W diag(s)). */
    qd_awq_opts ao = qd_awq_opts_default();
    float *dw = qd_backend_alloc(be, (size_t)(n * k) * sizeof(float));
    float *dx = qd_backend_alloc(be, (size_t)(t * k) * sizeof(float));
    float *ws = malloc((size_t)(n * k) * sizeof(float));
    qd_awq_result ar;
    memset(&ar, 0, sizeof ar);
    rc = QD_ENOMEM;
    if (!dw || !dx || !ws) {
        snprintf(msg, msz, "awq: out of memory");
        goto awq_out;
    }
    if ((rc = qd_backend_upload(be, dw, w, (size_t)(n * k) * sizeof(float))) ||
        (rc = qd_backend_upload(be, dx, x, (size_t)(t * k) * sizeof(float)))) {
        snprintf(msg, msz, "awq: upload failed: %s", be->err.msg);
        goto awq_out;
    }
    double t0 = qd_clock_now_s();
    rc = qd_awq_linear(be, qc, &ao, dw, n, k, dx, t, k, &ar, &err);
    if (!rc) {
        memcpy(ws, w, (size_t)(n * k) * sizeof(float));
        rc = qd_awq_apply(ar.scales.s, ar.clip.max ? &ar.clip : NULL, ws, n, k, &err);
    }
    o->seconds = qd_clock_now_s() - t0;
    if (!rc) rc = qd_rtn_quantize_qlayer(qc, ws, n, k, &o->layer, NULL, &err);
    if (rc) {
        snprintf(msg, msz, "awq: %s", err.msg);
        goto awq_out;
    }
    o->input_scales = malloc((size_t)k * sizeof(float));
    if (!o->input_scales) {
        rc = QD_ENOMEM;
        snprintf(msg, msz, "awq: out of memory");
        goto awq_out;
    }
    memcpy(o->input_scales, ar.scales.s, (size_t)k * sizeof(float));
    o->awq_alpha = ar.scales.best_alpha;
    o->awq_rows_reverted = ar.clip.rows_reverted;
awq_out:
    qd_awq_result_free(&ar);
    qd_backend_free(be, dw);
    qd_backend_free(be, dx);
    free(ws);
    return rc;
}

/* A placeholder layer with valid codes and zeros, so the format's own check can reject
 * shapes, bits and group sizes before any compute is spent. */
static int layer_precheck_format(const qd_format *f, const qd_quant_cfg *qc, int64_t n, int64_t k, int bits, int sym,
                                 int64_t gs, char *msg, size_t msz)
{
    qd_qlayer l;
    qd_err err = {0};
    if (qd_qlayer_alloc(&l, n, k, bits, sym, gs, 0, &err)) {
        snprintf(msg, msz, "%s", err.msg);
        return -1;
    }
    qd_qlayer_set_grid(&l, qc);
    l.global_scale = 1.0f;
    for (int64_t i = 0; i < l.n_groups * n; i++) {
        l.scales[i] = 1.0f;
        l.zeros[i] = qc->grid == QD_GRID_INT ? 1 << (bits - 1) : 0;
    }
    int rc = f->check(&l, &err);
    qd_qlayer_free(&l);
    if (rc) snprintf(msg, msz, "--format %s: %s", f->name, err.msg);
    return rc ? -1 : 0;
}

int cmd_layer(int argc, char **argv, const qd_runtime_opts *rt)
{
    layer_args a;
    int prc = layer_parse(argc, argv, &a);
    if (prc == 1) { layer_help(stdout); return QCTL_OK; }
    if (prc < 0) return -prc;

    const qd_format *fmt = qd_format_find(a.format);
    if (!fmt) {
        char names[256] = "";
        for (size_t i = 0; i < qd_format_count(); i++)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "", qd_format_at(i)->name);
        return layer_err(QCTL_USAGE, "layer", "--format: '%s' is not one of %s", a.format, names);
    }
    if (!(fmt->bits_mask & (1u << a.bits)))
        return layer_err(QCTL_USAGE, "layer", "--format %s cannot hold %d-bit weights", fmt->name, a.bits);
    if (fmt->grid != QD_GRID_INT && !a.scheme)
        return layer_err(QCTL_USAGE, "layer", "--format %s is written through a scheme: use --scheme", fmt->name);
    if (a.desc_act && !a.static_groups && fmt->act_order != QD_FMT_ACT_ORDER_G_IDX && a.group_size > 0)
        return layer_err(QCTL_USAGE, "layer", "--format %s has no g_idx, so --desc-act needs --static-groups", fmt->name);

    char msg[8192] = "";
    int status = QCTL_USAGE;
    layer_tensor lw, lx;
    memset(&lw, 0, sizeof lw);
    memset(&lx, 0, sizeof lx);
    float *w = NULL, *x = NULL, *qdec = NULL;
    qd_backend *be = NULL;
    layer_outcome oc;
    memset(&oc, 0, sizeof oc);
    qd_packed packed;
    memset(&packed, 0, sizeof packed);
    qd_fmt_tensor ftens[QD_FMT_MAX_TENSORS];
    int n_ftens = 0;
    st_writer *sw = NULL;
    int64_t n = 0, k = 0, t = 0, kx = 0;

    if (layer_open_tensor("--weight", a.weight, &lw, msg, sizeof msg)) goto done;
    if (!(w = layer_read_2d("--weight", &lw, "[N, K] weight", &n, &k, msg, sizeof msg))) goto done;
    if (layer_open_tensor("--inputs", a.inputs, &lx, msg, sizeof msg)) goto done;
    if (!(x = layer_read_2d("--inputs", &lx, "[T, K] activation matrix", &t, &kx, msg, sizeof msg))) goto done;
    if (kx != k) {
        snprintf(msg, sizeof msg, "--inputs %s: activations have %lld features but the weight [%lld, %lld] has K = %lld",
                 a.inputs, (long long)kx, (long long)n, (long long)k, (long long)k);
        goto done;
    }
    qd_quant_cfg qc = qd_quant_cfg_default();
    qc.bits = a.bits;
    qc.sym = a.sym;
    qc.group_size = a.group_size;
    qc.zero_min1 = !a.sym && fmt->zero_offset == 1;
    qc.scale_search = (qd_scale_search)a.scale_search;
    const qd_scheme *sc = a.scheme ? qd_scheme_find(a.scheme) : NULL;
    if (sc) {
        qc.grid = sc->grid;
        qc.scale_rule = sc->scale_rule;
        qc.row_block = sc->row_block;
    }
    if (layer_precheck_format(fmt, &qc, n, k, a.bits, a.sym, a.group_size, msg, sizeof msg)) goto done;

    qd_err err = {0};
    status = QCTL_FAIL;
    if (qd_backend_open(a.backend, rt, &be, &err)) {
        snprintf(msg, sizeof msg, "--backend: %s", err.msg);
        status = QCTL_USAGE;
        goto done;
    }
    if (layer_quantize(be, &a, &qc, w, n, k, x, t, &oc, msg, sizeof msg)) goto done;

    /* Pack, then decode the packed tensors: the error is measured on what the file holds. */
    if (fmt->check(&oc.layer, &err) || fmt->pack(&oc.layer, &packed, &err)) {
        snprintf(msg, sizeof msg, "--format %s: %s", fmt->name, err.msg);
        goto done;
    }
    qdec = malloc((size_t)(n * k) * sizeof *qdec);
    if (!qdec) { snprintf(msg, sizeof msg, "out of memory"); goto done; }
    if (fmt->dequant_ref(&packed, qdec, &err)) {
        snprintf(msg, sizeof msg, "decoding the packed layer: %s", err.msg);
        goto done;
    }
    /* AWQ's packed weights act on X / s: the effective weight is Q diag(s)^-1. */
    if (oc.input_scales)
        for (int64_t r = 0; r < n; r++)
            for (int64_t c = 0; c < k; c++) qdec[r * k + c] /= oc.input_scales[c];

    double num = 0, den = 0, wnum = 0, wden = 0;
    if (layer_output_errors(be, w, qdec, n, k, x, t, &num, &den, msg, sizeof msg)) goto done;
    for (int64_t i = 0; i < n * k; i++) {
        double d = (double)w[i] - qdec[i];
        wnum += d * d;
        wden += (double)w[i] * w[i];
    }

    if (st_writer_init(&sw)) { snprintf(msg, sizeof msg, "out of memory"); goto done; }
    int64_t shp[2];
    /* The tensors as the format names them; copies, since the descriptor may own them. */
    int wrc = fmt->tensors(&packed, ftens, &n_ftens, &err);
    for (int ti = 0; ti < n_ftens && !wrc; ti++) {
        int64_t fshape[2] = {ftens[ti].shape[0], ftens[ti].shape[1]};
        wrc = st_writer_add(sw, ftens[ti].suffix, ftens[ti].dtype, ftens[ti].ndim, fshape, ftens[ti].data, &err);
    }
    if (!wrc && oc.input_scales) {
        shp[0] = k;
        wrc = st_writer_add(sw, "input_scales", QD_DTYPE_F32, 1, shp, oc.input_scales, &err);
    }
    char buf[64];
    st_writer_set_metadata(sw, "quant_method", a.method);
    st_writer_set_metadata(sw, "checkpoint_format", fmt->name);
    snprintf(buf, sizeof buf, "%d", a.bits);
    st_writer_set_metadata(sw, "bits", buf);
    snprintf(buf, sizeof buf, "%lld", (long long)a.group_size);
    st_writer_set_metadata(sw, "group_size", buf);
    st_writer_set_metadata(sw, "sym", a.sym ? "true" : "false");
    st_writer_set_metadata(sw, "desc_act", a.desc_act ? "true" : "false");
    if (!wrc) wrc = st_writer_write(sw, a.out, &err);
    if (wrc) {
        snprintf(msg, sizeof msg, "--out %s: %s", a.out, err.msg);
        goto done;
    }

    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "method", a.method);
    cJSON_AddStringToObject(j, "format", fmt->name);
    cJSON_AddNumberToObject(j, "bits", a.bits);
    cJSON_AddNumberToObject(j, "group_size", (double)a.group_size);
    cJSON_AddBoolToObject(j, "sym", a.sym);
    cJSON_AddBoolToObject(j, "desc_act", a.desc_act);
    cJSON_AddBoolToObject(j, "static_groups", a.static_groups);
    cJSON_AddStringToObject(j, "scale_search", qd_scale_search_name((qd_scale_search)a.scale_search));
    cJSON_AddNumberToObject(j, "damp_percent", a.damp);
    cJSON_AddNumberToObject(j, "n", (double)n);
    cJSON_AddNumberToObject(j, "k", (double)k);
    cJSON_AddNumberToObject(j, "rows", (double)t);
    cJSON_AddNumberToObject(j, "rel_output_error", den > 0 ? sqrt(num / den) : 0.0);
    cJSON_AddNumberToObject(j, "rel_weight_error", wden > 0 ? sqrt(wnum / wden) : 0.0);
    cJSON_AddNumberToObject(j, "seconds", oc.seconds);
    if (!strcmp(a.method, "gptq")) {
        cJSON_AddNumberToObject(j, "hessian_seconds", oc.hessian_seconds);
        if (oc.fallback) cJSON_AddNullToObject(j, "damp");     /* no damping made H^-1 factorisable */
        else cJSON_AddNumberToObject(j, "damp", oc.damp);
        cJSON_AddNumberToObject(j, "damp_percent_used", oc.damp_percent);
        cJSON_AddNumberToObject(j, "damp_retries", oc.damp_retries);
        cJSON_AddNumberToObject(j, "dead_columns", (double)oc.dead_columns);
    } else {
        cJSON_AddNullToObject(j, "damp");
    }
    cJSON_AddBoolToObject(j, "fallback", oc.fallback);
    if (oc.input_scales) {
        cJSON_AddNumberToObject(j, "awq_best_alpha", oc.awq_alpha);
        cJSON_AddNumberToObject(j, "awq_clip_rows_reverted", (double)oc.awq_rows_reverted);
    }
    cJSON_AddStringToObject(j, "backend", be->name);
    cJSON_AddNumberToObject(j, "threads", be->n_threads);
    cJSON_AddStringToObject(j, "out", a.out);
    char *s = cJSON_PrintUnformatted(j);
    if (s) printf("%s\n", s);
    fflush(stdout);
    cJSON_free(s);
    cJSON_Delete(j);
    status = QCTL_OK;

done:
    if (status != QCTL_OK) {
        if (status == QCTL_USAGE) layer_err(QCTL_USAGE, "layer", "%s", msg);
        else layer_err(QCTL_FAIL, "layer", "%s", msg);
    }
    st_writer_free(sw);
    qd_fmt_tensors_free(ftens, n_ftens);
    qd_packed_free(&packed);
    qd_qlayer_free(&oc.layer);
    free(oc.input_scales);
    free(qdec);
    free(w);
    free(x);
    st_file_close(lw.file);
    st_file_close(lx.file);
    qd_backend_close(be);
    return status;
}

/* ---- quantctl gen-layer -------------------------------------------------------------- */

typedef struct gen_rng { uint64_t s; } gen_rng;

static uint64_t gen_u64(gen_rng *r) { return qd_splitmix64(&r->s); }

static double gen_uniform(gen_rng *r) { return ((double)(gen_u64(r) >> 11) + 0.5) / 9007199254740992.0; }

static float gen_normal(gen_rng *r)
{
    double u = gen_uniform(r), v = gen_uniform(r);
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

static void gen_help(FILE *f)
{
    fprintf(f,
        "usage: quantctl gen-layer --n N --k K --rows T [--seed S] [--dtype f32|f16|bf16] --out DIR\n"
        "\n"
        "Writes DIR/W.safetensors (tensor 'weight' [N, K], N(0, 1/K) with per-row scale spread)\n"
        "and DIR/X.safetensors (tensor 'inputs' [T, K]): LLM-like activations, low-rank correlated\n"
        "features plus noise, log-normal channel magnitudes and a few outlier channels.\n");
}

int cmd_gen_layer(int argc, char **argv, const qd_runtime_opts *rt)
{
    int64_t n = 0, k = 0, t = 0, seed = 1;
    const char *out = NULL, *dtype_s = "f32";
    for (int i = 1; i < argc; i++) {
        int missing = 0;
        const char *v;
        int64_t *dst = NULL;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { gen_help(stdout); return QCTL_OK; }
        if ((v = layer_opt(argc, argv, &i, "--n", &missing))) dst = &n;
        else if ((v = layer_opt(argc, argv, &i, "--k", &missing))) dst = &k;
        else if ((v = layer_opt(argc, argv, &i, "--rows", &missing))) dst = &t;
        else if ((v = layer_opt(argc, argv, &i, "--seed", &missing))) dst = &seed;
        else if ((v = layer_opt(argc, argv, &i, "--out", &missing))) { out = v; continue; }
        else if ((v = layer_opt(argc, argv, &i, "--dtype", &missing))) { dtype_s = v; continue; }
        else if (missing) return layer_err(QCTL_USAGE, "gen-layer", "%s needs a value", argv[i]);
        else return layer_err(QCTL_USAGE, "gen-layer", "unknown option '%s' (see quantctl gen-layer --help)", argv[i]);
        if (layer_parse_i64(v, dst)) return layer_err(QCTL_USAGE, "gen-layer", "%s: '%s' is not an integer", argv[i - 1], v);
    }
    if (n <= 0 || k <= 0 || t <= 0)
        return layer_err(QCTL_USAGE, "gen-layer", "--n, --k and --rows are required and must be positive");
    if (n > (1 << 20) || k > (1 << 20) || t > (1 << 24) || n * k > ((int64_t)1 << 31) || t * k > ((int64_t)1 << 31))
        return layer_err(QCTL_USAGE, "gen-layer", "sizes too large (N*K and T*K must stay below 2^31)");
    if (!out) return layer_err(QCTL_USAGE, "gen-layer", "--out DIR is required");
    qd_dtype dt = !strcmp(dtype_s, "f32") ? QD_DTYPE_F32 : !strcmp(dtype_s, "f16") ? QD_DTYPE_F16
                : !strcmp(dtype_s, "bf16") ? QD_DTYPE_BF16 : QD_DTYPE_INVALID;
    if (dt == QD_DTYPE_INVALID) return layer_err(QCTL_USAGE, "gen-layer", "--dtype: '%s' is not f32, f16 or bf16", dtype_s);

    qd_err err = {0};
    if (qd_fs_mkdir_p(out, &err)) return layer_err(QCTL_FAIL, "gen-layer", "--out %s: %s", out, err.msg);
    gen_rng rng = {(uint64_t)seed * 0x2545f4914f6cdd1dull + 1};
    const int64_t rank = k < 64 ? k : 64;
    int status = QCTL_FAIL;
    float *w = malloc((size_t)(n * k) * sizeof(float));
    float *x = malloc((size_t)(t * k) * sizeof(float));
    float *f = malloc((size_t)(t * rank) * sizeof(float));
    float *b = malloc((size_t)(rank * k) * sizeof(float));
    float *chan = malloc((size_t)k * sizeof(float));
    void *conv = malloc((size_t)(n > t ? n : t) * (size_t)k * 4);
    qd_backend *be = NULL;
    st_writer *sw = NULL;
    if (!w || !x || !f || !b || !chan || !conv) { layer_err(QCTL_FAIL, "gen-layer", "out of memory"); goto out; }

    /* Weights: N(0, 1/K), each output row with its own spread (0.5x to 2x). */
    float wstd = 1.0f / sqrtf((float)k);
    for (int64_t r = 0; r < n; r++) {
        float rs = wstd * (float)exp(0.35 * gen_normal(&rng));
        for (int64_t c = 0; c < k; c++) w[r * k + c] = rs * gen_normal(&rng);
    }
    /* Activations: X = F B + 0.3 E, then log-normal channel magnitudes and outliers. */
    for (int64_t i = 0; i < t * rank; i++) f[i] = gen_normal(&rng);
    float bstd = 1.0f / sqrtf((float)rank);
    for (int64_t i = 0; i < rank * k; i++) b[i] = bstd * gen_normal(&rng);
    for (int64_t c = 0; c < k; c++) chan[c] = (float)exp(0.5 * gen_normal(&rng));
    int64_t n_out = k / 256 > 2 ? k / 256 : 2;
    for (int64_t i = 0; i < n_out && i < k; i++) {
        int64_t c = (int64_t)(gen_u64(&rng) % (uint64_t)k);
        chan[c] = 15.0f + 15.0f * (float)gen_uniform(&rng);
    }
    if (qd_backend_open("cpu", rt, &be, &err)) { layer_err(QCTL_FAIL, "gen-layer", "%s", err.msg); goto out; }
    if (be->ops->gemm(be, 0, 0, t, k, rank, 1.0f, f, rank, b, k, 0.0f, x, k)) {
        layer_err(QCTL_FAIL, "gen-layer", "%s", be->err.msg);
        goto out;
    }
    for (int64_t r = 0; r < t; r++)
        for (int64_t c = 0; c < k; c++) x[r * k + c] = chan[c] * (x[r * k + c] + 0.3f * gen_normal(&rng));

    char path[4096];
    int64_t shp[2];
    const struct { const char *file, *name; const float *data; int64_t rows; } outs[2] = {
        {"W.safetensors", "weight", w, n}, {"X.safetensors", "inputs", x, t}};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", out, outs[i].file);
        shp[0] = outs[i].rows;
        shp[1] = k;
        if (qd_convert_from_f32(dt, outs[i].data, conv, (size_t)(outs[i].rows * k))) {
            layer_err(QCTL_FAIL, "gen-layer", "cannot convert to %s", dtype_s);
            goto out;
        }
        st_writer_free(sw);
        sw = NULL;
        if (st_writer_init(&sw) || st_writer_add(sw, outs[i].name, dt, 2, shp, conv, &err) ||
            st_writer_write(sw, path, &err)) {
            layer_err(QCTL_FAIL, "gen-layer", "%s: %s", path, err.msg);
            goto out;
        }
    }
    cJSON *j = cJSON_CreateObject();
    snprintf(path, sizeof path, "%s/W.safetensors", out);
    cJSON_AddStringToObject(j, "weight", path);
    snprintf(path, sizeof path, "%s/X.safetensors", out);
    cJSON_AddStringToObject(j, "inputs", path);
    cJSON_AddNumberToObject(j, "n", (double)n);
    cJSON_AddNumberToObject(j, "k", (double)k);
    cJSON_AddNumberToObject(j, "rows", (double)t);
    cJSON_AddNumberToObject(j, "seed", (double)seed);
    cJSON_AddStringToObject(j, "dtype", dtype_s);
    char *js = cJSON_PrintUnformatted(j);
    if (js) printf("%s\n", js);
    cJSON_free(js);
    cJSON_Delete(j);
    status = QCTL_OK;
out:
    st_writer_free(sw);
    qd_backend_close(be);
    free(w); free(x); free(f); free(b); free(chan); free(conv);
    return status;
}
