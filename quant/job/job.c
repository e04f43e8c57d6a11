/* Job spec: enum names, defaults, validation and parsing (serialising lives in
 * job_json.c). Validation reads one field at a time so the first error names exactly one
 * field; the rules between fields run after every field has its final value. */
#include "quant/job/job.h"
#include "quant/job/jsonutil.h"
#include "quant/formats/format.h"
#include "quant/formats/quantizer.h"
#include "quant/formats/scheme.h"
#include "quant/formats/serving.h"

#include <ctype.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* NULL-terminated so that the field table (below) can hand them out as they are. */
static const char *const method_names[] = { "gptq", "awq", "rtn", "awq+gptq", NULL };
static const char *const style_names[] = { "gptq", "awq", NULL };
static const char *const backend_names[] = { "auto", "cpu", "cuda", NULL };
static const char *const layout_names[] = { "plain", "tp_aware", NULL };
static const char *const compute_names[] = { "f32", "bf16", "auto", NULL };
/* In qd_scale_search's order. */
static const char *const scale_search_names[] = { "minmax", "mse", NULL };
static const char *const serve_engine_names[] = { "vllm", NULL };
static const char *const serve_gpu_names[] = { "hopper", "ampere", "blackwell", NULL };

#define NAME_OF(tbl, v) ((unsigned)(v) < sizeof(tbl) / sizeof(tbl[0]) ? tbl[v] : NULL)

const char *qp_method_name(qp_method m) { return NAME_OF(method_names, m); }
const char *qp_format_name(qp_format f)
{
    const qd_format *d = qd_format_at((size_t)f);
    return (int)f >= 0 && d ? d->name : NULL;
}
const char *qp_calib_style_name(qp_calib_style s) { return NAME_OF(style_names, s); }
const char *qp_backend_name(qp_backend_choice b) { return NAME_OF(backend_names, b); }
const char *qp_layout_name(qp_layout l) { return NAME_OF(layout_names, l); }
const char *qp_compute_name(qp_compute c) { return NAME_OF(compute_names, c); }

static int lookup(const char *const *tbl, size_t n, const char *s)
{
    for (size_t i = 0; s && i < n; i++)
        if (strcmp(tbl[i], s) == 0) return (int)i;
    return -1;
}

int qp_method_parse(const char *s, qp_method *out)
{
    int i = lookup(method_names, 4, s);
    if (i < 0) return QP_EINVAL;
    *out = (qp_method)i;
    return 0;
}

int qp_format_parse(const char *s, qp_format *out)
{
    int i = qd_format_index(qd_format_find(s));
    if (i < 0) return QP_EINVAL;
    *out = (qp_format)i;
    return 0;
}

static int method_uses_awq(qp_method m) { return m == QP_METHOD_AWQ || m == QP_METHOD_AWQ_GPTQ; }
static int method_uses_gptq(qp_method m) { return m == QP_METHOD_GPTQ || m == QP_METHOD_AWQ_GPTQ; }

static unsigned method_bit(qp_method m)
{
    switch (m) {
    case QP_METHOD_GPTQ: return QD_FMT_METHOD_GPTQ;
    case QP_METHOD_AWQ: return QD_FMT_METHOD_AWQ;
    case QP_METHOD_RTN: return QD_FMT_METHOD_RTN;
    case QP_METHOD_AWQ_GPTQ: return QD_FMT_METHOD_AWQ_GPTQ;
    }
    return 0;
}

/* The format a job gets when it names none, from the format table's default rule (AWQ's
 * own format where it can hold the weights, GPTQ's otherwise). */
static qp_format default_format(qp_method m, int bits)
{
    int i = qd_format_default(method_bit(m), bits);
    return i < 0 ? QP_FORMAT_GPTQ : (qp_format)i;
}

static int64_t default_seq_len(qp_calib_style s) { return s == QP_CALIB_AWQ ? 512 : 2048; }

int qp_job_init_defaults(qp_job *job, qp_method method)
{
    memset(job, 0, sizeof *job);
    job->version = QP_JOB_VERSION;
    job->method = method;
    job->bits = 4;
    job->group_size = 128;
    job->sym = !method_uses_awq(method);   /* AutoAWQ quantizes with a zero point */
    /* Act-order with static groups: GPTQ's most accurate columns order, stored in the plain
     * layout (groups contiguous, g_idx k / group_size), so every format and kernel takes it.
     * llm-compressor's GPTQModifier defaults to the same (actorder "static"). */
    job->desc_act = method_uses_gptq(method);
    job->static_groups = job->desc_act;
    /* GPTQ searches each group's range by its error under the Hessian's diagonal: lower KL at
     * every width measured (docs/methods.md, scale search). AWQ's clip search does its own;
     * RTN's unweighted search measured mixed, so it stays min-max. */
    job->scale_search = method == QP_METHOD_GPTQ ? QD_SCALE_SEARCH_MSE : QD_SCALE_SEARCH_MINMAX;
    job->true_sequential = 1;
    job->damp_percent = 0.01;
    job->format = default_format(method, job->bits);
    job->calibration.samples = 128;
    job->calibration.style = method_uses_awq(method) ? QP_CALIB_AWQ : QP_CALIB_GPTQ;
    job->calibration.seq_len = default_seq_len(job->calibration.style);
    job->calibration.seed = 0;
    job->calibration.shards = 1;
    job->eval.seq_len = 2048;
    job->eval.max_windows = 0;
    job->shard_size = QP_JOB_SHARD_DEFAULT;
    job->priority = 0;
    job->workers = QP_JOB_WORKERS_ALL;
    job->backend = QP_BACKEND_AUTO;
    job->tp = 1;
    job->layout = QP_LAYOUT_PLAIN;
    job->compute = QP_COMPUTE_AUTO;
    job->kernel_check = 1;
    job->kernel_check_rows = QP_KERNEL_CHECK_ROWS_DEFAULT;
    job->checkpoint.acts_every = QP_CKPT_ACTS_EVERY_DEFAULT;
    job->moe.calibrate_all_experts = 1;
    job->moe.min_tokens = QP_MOE_MIN_TOKENS_DEFAULT;
    job->awq.stats_tokens = QP_AWQ_STATS_TOKENS_DEFAULT;
    job->calibration.field = strdup("text");
    return job->calibration.field ? 0 : QP_ENOMEM;
}

int qp_job_acts_every(const qp_job *job)
{
    return job->layout == QP_LAYOUT_TP_AWARE ? 1 : job->checkpoint.acts_every;
}

/* The combinations a mixed-bit job (target_bpw) is refused with, by name, and each
 * candidate against the format's rules. */
static int bpw_validate(const qp_job *job, qp_err *err)
{
    const qd_format *fd = qd_format_at((size_t)job->format);
    if (!(job->target_bpw > 1.0 && job->target_bpw <= 16.0))
        return qp_err_set(err, QP_EINVAL, "job.target_bpw: must be above 1 and at most 16, got %g", job->target_bpw);
    /* compressed-tensors: one config group per candidate; gptq, gptq_v2: `dynamic` overrides. */
    if (strcmp(fd->name, "compressed-tensors") && strcmp(fd->name, "gptq") && strcmp(fd->name, "gptq_v2"))
        return qp_err_set(err, QP_EUNSUPPORTED, "job.target_bpw: format %s cannot hold mixed bits per layer in quantd (its "
                          "per-module overrides are not written); use format compressed-tensors, gptq or gptq_v2",
                          fd->name);
    if (method_uses_awq(job->method))
        return qp_err_set(err, QP_EUNSUPPORTED, "job.target_bpw: method %s searches one scale per input group for one bit "
                          "width; use method gptq or rtn", qp_method_name(job->method));
    if (job->scheme)
        return qp_err_set(err, QP_EUNSUPPORTED, "job.target_bpw: not with a scheme (%s); give format compressed-tensors "
                          "and bpw_bits instead", qd_scheme_at((size_t)job->scheme - 1)->name);
    if (job->desc_act && !job->static_groups)
        return qp_err_set(err, QP_EUNSUPPORTED, "job.target_bpw: not with desc_act true and static_groups false (a "
                          "scattered g_idx per layer group size is not implemented); leave static_groups true");
    if (job->layout != QP_LAYOUT_PLAIN)
        return qp_err_set(err, QP_EUNSUPPORTED, "job.target_bpw: not with layout %s", qp_layout_name(job->layout));
    int nb = job->n_bpw_bits, ng = job->n_bpw_group_sizes;
    for (int i = 0; i < nb + ng; i++) {
        qd_fmt_settings fs = {.bits = i < nb ? job->bpw_bits[i] : job->bits,
                              .group_size = i < nb ? job->group_size : job->bpw_group_sizes[i - nb], .sym = job->sym,
                              .desc_act = 0, .static_groups = job->static_groups};
        const char *field = "format";
        char why[QP_ERR_MSG_MAX];
        if (qd_format_check_settings(fd, &fs, &field, why, sizeof why))
            return qp_err_set(err, QP_EINVAL, "job.%s[%d]: %s", i < nb ? "bpw_bits" : "bpw_group_sizes", i < nb ? i : i - nb,
                              why);
    }
    return 0;
}

int qp_job_validate(const qp_job *job, qp_err *err)
{
    if (job->version < 1 || job->version > QP_JOB_VERSION)
        return qp_err_set(err, QP_EUNSUPPORTED, "job.version: %d is not a version this quantd understands (1 to %d)",
                          job->version, QP_JOB_VERSION);
    if (!qpj_name_valid(job->id, QP_JOB_ID_MAX))
        return qp_err_set(err, QP_EINVAL,
                          "job.id: \"%s\" must be 1 to %d letters, digits, '.', '_' or '-', not starting with '.' or '-'",
                          job->id, QP_JOB_ID_MAX);
    if (!job->model || !job->model[0])
        return qp_err_set(err, QP_ENOTFOUND, "job.model: required (the Hugging Face model directory)");
    if (!job->output || !job->output[0])
        return qp_err_set(err, QP_ENOTFOUND, "job.output: required (the directory to write the quantized model to)");
    if (!qp_method_name(job->method))
        return qp_err_set(err, QP_EINVAL, "job.method: invalid value %d", (int)job->method);
    if (job->bits != 2 && job->bits != 3 && job->bits != 4 && job->bits != 8)
        return qp_err_set(err, QP_EINVAL, "job.bits: %d is not one of 2, 3, 4, 8", job->bits);
    if (job->group_size == 0 || job->group_size < -1)
        return qp_err_set(err, QP_EINVAL,
                          "job.group_size: must be -1 (one group per column) or a positive integer, got %d",
                          job->group_size);
    if (!(job->damp_percent > 0.0 && job->damp_percent < 1.0))
        return qp_err_set(err, QP_EINVAL, "job.damp_percent: must be greater than 0 and less than 1, got %g",
                          job->damp_percent);
    if (!qp_format_name(job->format))
        return qp_err_set(err, QP_EINVAL, "job.format: invalid value %d", (int)job->format);
    if (job->gptaq && job->method != QP_METHOD_GPTQ)
        return qp_err_set(err, QP_EINVAL, "job.gptaq: only with method gptq (GPTAQ corrects GPTQ's updates), not %s",
                          qp_method_name(job->method));
    if (job->scheme < 0 || (size_t)job->scheme > qd_scheme_count())
        return qp_err_set(err, QP_EINVAL, "job.scheme: invalid value %d", job->scheme);
    {
        const qd_scheme *sc = qp_job_scheme(job);
        const qd_format *fd = qd_format_at((size_t)job->format);
        if (!sc && fd->grid != QD_GRID_INT) {
            char names[160] = "";
            size_t o = 0;
            for (size_t i = 0; i < qd_scheme_count() && o < sizeof names; i++)
                if (!strcmp(qd_scheme_at(i)->format, fd->name))
                    o += (size_t)snprintf(names + o, sizeof names - o, "%s%s", o ? ", " : "", qd_scheme_at(i)->name);
            return qp_err_set(err, QP_EINVAL, "job.format: %s is written through a scheme (%s); set job.scheme instead "
                              "of job.format", fd->name, names);
        }
        if (sc && (strcmp(sc->format, fd->name) || sc->bits != job->bits || sc->group_size != job->group_size ||
                   sc->sym != job->sym))
            return qp_err_set(err, QP_EINVAL, "job.scheme: %s means format %s, %d bits, group_size %lld, sym %s; the job "
                              "says format %s, %d bits, group_size %d, sym %s", sc->name, sc->format, sc->bits,
                              (long long)sc->group_size, sc->sym ? "true" : "false", fd->name, job->bits,
                              job->group_size, job->sym ? "true" : "false");
    }
    if (!qd_scale_search_name((qd_scale_search)job->scale_search))
        return qp_err_set(err, QP_EINVAL, "job.scale_search: invalid value %d", job->scale_search);
    /* AWQ's own searches pick each group's range by the output error on calibration
     * activations (and fake-quantize with min-max while they do): a weight-only search on
     * top would undo what they measured. */
    if (job->scale_search == QD_SCALE_SEARCH_MSE && method_uses_awq(job->method))
        return qp_err_set(err, QP_EINVAL, "job.scale_search: mse is not used with method %s: AWQ's clip search already "
                          "chooses each group's range by the output error on calibration data; leave scale_search "
                          "minmax", qp_method_name(job->method));
    if (job->scale_search == QD_SCALE_SEARCH_MSE && qp_job_scheme(job) && qp_job_scheme(job)->row_block != 1)
        return qp_err_set(err, QP_EINVAL, "job.scale_search: mse searches each row's scale, and scheme %s shares one "
                          "scale across rows; leave scale_search minmax", qp_job_scheme(job)->name);
    if (job->desc_act && !method_uses_gptq(job->method))
        return qp_err_set(err, QP_EINVAL,
                          "job.desc_act: only methods gptq and awq+gptq quantize columns in activation order; "
                          "method %s has no act-order, so leave desc_act false", qp_method_name(job->method));
    {
        /* What the format can hold comes from its descriptor (quant/formats). */
        qd_fmt_settings fs = {.bits = job->bits, .group_size = job->group_size, .sym = job->sym,
                              .desc_act = job->desc_act, .static_groups = job->static_groups};
        const char *field = "format";
        char why[QP_ERR_MSG_MAX];
        if (qd_format_check_settings(qd_format_at((size_t)job->format), &fs, &field, why, sizeof why))
            return qp_err_set(err, QP_EINVAL, "job.%s: %s", field, why);
    }
    if (job->target_bpw == 0 && (job->n_bpw_bits || job->n_bpw_group_sizes))
        return qp_err_set(err, QP_EINVAL, "job.%s: given without target_bpw (the candidates of a mixed-bit job)",
                          job->n_bpw_bits ? "bpw_bits" : "bpw_group_sizes");
    if (job->target_bpw != 0) {
        int rc = bpw_validate(job, err);
        if (rc) return rc;
    }
    if (job->serve.enabled && (strcmp(job->serve.engine, "vllm") || !qd_srv_gpu_cc(job->serve.gpu) || job->serve.tp < 1))
        return qp_err_set(err, QP_EINVAL, "job.serve: engine \"%s\", gpu \"%s\", tp %d: needs engine vllm, gpu hopper, "
                          "ampere or blackwell and tp >= 1", job->serve.engine, job->serve.gpu, job->serve.tp);
    const qp_job_calib *c = &job->calibration;
    if (job->method != QP_METHOD_RTN && (!c->path || !c->path[0]))
        return qp_err_set(err, QP_ENOTFOUND,
                          "job.calibration.path: required for method %s (a JSONL or text file of calibration text)",
                          qp_method_name(job->method));
    if (!c->field || !c->field[0])
        return qp_err_set(err, QP_EINVAL, "job.calibration.field: must not be empty");
    if (c->samples < 1 || c->samples > 1000000)
        return qp_err_set(err, QP_EINVAL, "job.calibration.samples: must be a positive integer (at most 1000000), got %lld",
                          (long long)c->samples);
    if (c->seq_len < 1 || c->seq_len > 1048576)
        return qp_err_set(err, QP_EINVAL, "job.calibration.seq_len: must be a positive integer (at most 1048576), got %lld",
                          (long long)c->seq_len);
    if (c->seed > (uint64_t)QPJ_INT_MAX)
        return qp_err_set(err, QP_EINVAL, "job.calibration.seed: must be an integer from 0 to %lld", QPJ_INT_MAX);
    if (!qp_calib_style_name(c->style))
        return qp_err_set(err, QP_EINVAL, "job.calibration.style: invalid value %d", (int)c->style);
    if (job->eval.enabled) {
        if (!job->eval.path || !job->eval.path[0])
            return qp_err_set(err, QP_ENOTFOUND, "job.eval.path: required when eval is given (a text file such as wiki.test.raw)");
        if (job->eval.seq_len < 1 || job->eval.seq_len > 1048576)
            return qp_err_set(err, QP_EINVAL, "job.eval.seq_len: must be a positive integer (at most 1048576), got %lld",
                              (long long)job->eval.seq_len);
        if (job->eval.max_windows < 0)
            return qp_err_set(err, QP_EINVAL, "job.eval.max_windows: must be 0 (all windows) or a positive integer, got %lld",
                              (long long)job->eval.max_windows);
    }
    for (size_t i = 0; i < job->n_modules_to_not_convert; i++)
        if (!job->modules_to_not_convert[i] || !job->modules_to_not_convert[i][0])
            return qp_err_set(err, QP_EINVAL, "job.modules_to_not_convert[%zu]: must be a non-empty string", i);
    if (job->shard_size < 1 || job->shard_size > (uint64_t)QPJ_INT_MAX)
        return qp_err_set(err, QP_EINVAL, "job.shard_size: must be a positive number of bytes");
    if (!qp_backend_name(job->backend))
        return qp_err_set(err, QP_EINVAL, "job.backend: invalid value %d", (int)job->backend);
    if (job->workers < QP_JOB_WORKERS_ALL || job->workers > QP_JOB_WORKERS_MAX)
        return qp_err_set(err, QP_EINVAL, "job.workers: must be \"all\" or a whole number of workers from 1 to %d, got %d",
                          QP_JOB_WORKERS_MAX, job->workers);
    if (job->tp < 1)
        return qp_err_set(err, QP_EINVAL, "job.tp: must be an integer >= 1, got %d", job->tp);
    if (!qp_layout_name(job->layout))
        return qp_err_set(err, QP_EINVAL, "job.layout: invalid value %d", (int)job->layout);
    if (!qp_compute_name(job->compute))
        return qp_err_set(err, QP_EINVAL, "job.compute: invalid value %d", (int)job->compute);
    if (job->layout == QP_LAYOUT_TP_AWARE && !(method_uses_gptq(job->method) && job->desc_act))
        return qp_err_set(err, QP_EINVAL,
                          "job.layout: tp_aware reorders act-order GPTQ weights, so it needs method gptq or awq+gptq "
                          "with desc_act true (this job has method %s, desc_act %s)",
                          qp_method_name(job->method), job->desc_act ? "true" : "false");
    if (job->layout == QP_LAYOUT_TP_AWARE && qd_format_at((size_t)job->format)->act_order != QD_FMT_ACT_ORDER_G_IDX)
        return qp_err_set(err, QP_EINVAL,
                          "job.layout: tp_aware reorders the g_idx of act-order weights, and format %s stores none; "
                          "use format gptq or gptq_v2", qp_format_name(job->format));
    return 0;
}

/* ---- parsing ------------------------------------------------------------ */

/* Every field, in the order of the canonical form (job.h, qp_job_field). The keys each
 * object accepts come from here (check_keys), so a key the table lacks is refused. The
 * defaults and examples are not used by the parser (qp_job_init_defaults fills the defaults):
 * tests/unit/test_job_fields.c checks them against it, and docs/jobs.md against the table. */
static const qp_job_field job_fields[] = {
    /* name                     type                 default         awq's      values          example  rtn/awq's */
    {"version",                 "integer",           "1",            NULL,      NULL,           NULL, NULL},
    {"id",                      "string",            "derived",      NULL,      NULL,           "\"my-job-1\"", NULL},
    {"model",                   "string",            "required",     NULL,      NULL,           "\"/models/other\"", NULL},
    {"output",                  "string",            "required",     NULL,      NULL,           "\"/out/other\"", NULL},
    {"method",                  "string",            "\"gptq\"",     NULL,      method_names,   "\"rtn\"", NULL},
    {"bits",                    "integer",           "4",            NULL,      NULL,           "8", NULL},
    {"group_size",              "integer",           "128",          NULL,      NULL,           "32", NULL},
    {"sym",                     "bool",              "true",         "false",   NULL,           "false", NULL},
    {"desc_act",                "bool",              "true",         NULL,      NULL,           "false", "false"},
    {"static_groups",           "bool",              "true",         NULL,      NULL,           "false", "false"},
    {"true_sequential",         "bool",              "true",         NULL,      NULL,           "false", NULL},
    {"gptaq",                   "bool",              "false",        NULL,      NULL,           "true", NULL},
    {"damp_percent",            "number",            "0.01",         NULL,      NULL,           "0.1", NULL},
    {"scale_search",            "string",            "\"mse\"",      "\"minmax\"", scale_search_names, "\"minmax\"", "\"minmax\""},
    {"format",                  "string",            "\"gptq\"",     "\"awq_gemm\"", NULL,      "\"gptq_v2\"", NULL},
    {"scheme",                  "string",            "null",         NULL,      NULL,           "\"W4A16\"", NULL},
    {"calibration",             "object",            "required",     NULL,      NULL,           "{\"path\":\"other.jsonl\"}", NULL},
    {"calibration.path",        "string",            "required",     NULL,      NULL,           "\"other.jsonl\"", NULL},
    {"calibration.field",       "string",            "\"text\"",     NULL,      NULL,           "\"content\"", NULL},
    {"calibration.samples",     "integer",           "128",          NULL,      NULL,           "64", NULL},
    {"calibration.seq_len",     "integer",           "2048",         "512",     NULL,           "1024", NULL},
    {"calibration.seed",        "integer",           "0",            NULL,      NULL,           "7", NULL},
    {"calibration.style",       "string",            "\"gptq\"",     "\"awq\"",  style_names,    "\"awq\"", NULL},
    {"calibration.shards",      "integer",           "1",            NULL,      NULL,           "2", NULL},
    {"eval",                    "object",            "null",         NULL,      NULL,           "{\"path\":\"wiki.test.raw\"}", NULL},
    {"eval.path",               "string",            "required",     NULL,      NULL,           "\"other.raw\"", NULL},
    {"eval.seq_len",            "integer",           "2048",         NULL,      NULL,           "512", NULL},
    {"eval.max_windows",        "integer",           "0",            NULL,      NULL,           "8", NULL},
    {"modules_to_not_convert",  "array of strings",  "[]",           NULL,      NULL,           "[\"lm_head\"]", NULL},
    {"shard_size",              "integer or string", "4000000000",   NULL,      NULL,           "\"500MB\"", NULL},
    {"overwrite",               "bool",              "false",        NULL,      NULL,           "true", NULL},
    {"priority",                "integer",           "0",            NULL,      NULL,           "5", NULL},
    {"workers",                 "integer or string", "\"all\"",      NULL,      NULL,           "2", NULL},
    {"backend",                 "string",            "\"auto\"",     NULL,      backend_names,  "\"cpu\"", NULL},
    {"tp",                      "integer",           "1",            NULL,      NULL,           "2", NULL},
    {"layout",                  "string",            "\"plain\"",    NULL,      layout_names,   "\"tp_aware\"", NULL},
    {"compute",                 "string",            "\"auto\"",     NULL,      compute_names,  "\"bf16\"", NULL},
    {"kernel_check",            "bool",              "true",         NULL,      NULL,           "false", NULL},
    {"kernel_check_rows",       "integer",           "64",           NULL,      NULL,           "256", NULL},
    {"error_direct_rows",       "integer",           "0",            NULL,      NULL,           "16", NULL},
    {"moe",                     "object",            "{}",           NULL,      NULL,           "{\"min_tokens\":8}", NULL},
    {"moe.calibrate_all_experts", "bool",            "true",         NULL,      NULL,           "false", NULL},
    {"moe.min_tokens",          "integer",           "32",           NULL,      NULL,           "8", NULL},
    {"moe.awq_shared_input",    "bool",              "false",        NULL,      NULL,           "true", NULL},
    {"awq",                     "object",            "{}",           NULL,      NULL,           "{\"stats_tokens\":0}", NULL},
    {"awq.stats_tokens",        "integer",           "8192",         NULL,      NULL,           "0", NULL},
    {"checkpoint",              "object",            "{}",           NULL,      NULL,           "{\"acts_every\":1}", NULL},
    {"checkpoint.acts_every",   "integer",           "4",            NULL,      NULL,           "1", NULL},
    {"serve",                   "object",            "null",         NULL,      NULL,           "{\"engine\":\"vllm\",\"gpu\":\"hopper\"}", NULL},
    {"serve.engine",            "string",            "required",     NULL,      serve_engine_names, NULL, NULL},
    {"serve.gpu",               "string",            "required",     NULL,      serve_gpu_names, "\"ampere\"", NULL},
    {"serve.tp",                "integer",           "1",            NULL,      NULL,           "2", NULL},
    {"target_bpw",              "number",            "null",         NULL,      NULL,           "4.25", NULL},
    {"bpw_bits",                "array of integers", "null",         NULL,      NULL,           "[4]", NULL},
    {"bpw_group_sizes",         "array of integers", "null",         NULL,      NULL,           "[64, 128]", NULL},
};
#define N_JOB_FIELDS (sizeof job_fields / sizeof job_fields[0])

const qp_job_field *qp_job_fields(size_t *n)
{
    *n = N_JOB_FIELDS;
    return job_fields;
}

const qp_job_field *qp_job_field_find(const char *name)
{
    for (size_t i = 0; name && i < N_JOB_FIELDS; i++)
        if (!strcmp(job_fields[i].name, name)) return &job_fields[i];
    return NULL;
}

const char *qp_job_field_value(const qp_job_field *f, size_t i)
{
    if (f && f->values) {
        for (size_t k = 0; k < i; k++)
            if (!f->values[k]) return NULL;
        return f->values[i];
    }
    /* The format names live in the format table, which grows without this file. */
    if (f && !strcmp(f->name, "format")) return i < qd_format_count() ? qd_format_at(i)->name : NULL;
    if (f && !strcmp(f->name, "scheme")) return i < qd_scheme_count() ? qd_scheme_at(i)->name : NULL;
    return NULL;
}

/* Refuses a key of obj (the object at path: "job", "job.moe") that the table does not list
 * under that object, naming it (qpj_check_keys). */
static int check_keys(const cJSON *obj, const char *path, qp_err *err)
{
    const char *parent = strcmp(path, "job") ? path + 4 : "";   /* "job.moe" -> "moe" */
    size_t plen = strlen(parent), n = 0;
    const char *keys[N_JOB_FIELDS + 1];
    for (size_t i = 0; i < N_JOB_FIELDS; i++) {
        const char *name = job_fields[i].name;
        if (plen && (strncmp(name, parent, plen) || name[plen] != '.')) continue;
        const char *leaf = plen ? name + plen + 1 : name;
        if (!strchr(leaf, '.')) keys[n++] = leaf;
    }
    keys[n] = NULL;
    return qpj_check_keys(obj, path, keys, err);
}

/* Reads a string field that must be one of names; *out is untouched when absent. */
static int get_enum(const cJSON *obj, const char *path, const char *name, const char *const *names,
                    size_t n, int *out, int *present, qp_err *err)
{
    char *s = NULL;
    int rc = qpj_get_str(obj, path, name, 1, &s, present, err);
    if (rc) return rc;
    if (!s) return 0;
    int i = lookup(names, n, s);
    if (i < 0) {
        char list[160] = "";
        for (size_t k = 0; k < n; k++) {
            strcat(list, names[k]);
            if (k + 1 < n) strcat(list, ", ");
        }
        rc = qp_err_set(err, QP_EINVAL, "%s.%s: \"%s\" is not one of %s", path, name, s, list);
        free(s);
        return rc;
    }
    free(s);
    *out = i;
    return 0;
}

/* job.format: one of the format table's names. */
static int get_format(const cJSON *obj, const char *path, int *out, int *present, qp_err *err)
{
    const char *names[32];
    size_t n = 0;
    for (size_t i = 0; i < qd_format_count() && n < 32; i++) names[n++] = qd_format_at(i)->name;
    return get_enum(obj, path, "format", names, n, out, present, err);
}

static int get_int32(const cJSON *obj, const char *path, const char *name, int64_t lo, int64_t hi,
                     const char *rule, int *out, int *present, qp_err *err)
{
    int64_t v = *out;
    int rc = qpj_get_int(obj, path, name, lo, hi, rule, &v, present, err);
    if (rc == 0) *out = (int)v;
    return rc;
}

static int parse_shard_size(const cJSON *root, qp_job *job, qp_err *err)
{
    const cJSON *v = qpj_field(root, "shard_size");
    if (!v) return 0;
    char desc[64];
    uint64_t bytes = 0;
    int ok = 0;
    if (cJSON_IsNumber(v)) {
        double x = v->valuedouble;
        ok = x >= 1 && x <= (double)QPJ_INT_MAX && x == (double)(uint64_t)x;
        bytes = ok ? (uint64_t)x : 0;
    } else if (cJSON_IsString(v)) {
        ok = qp_size_parse(v->valuestring, &bytes) == 0 && bytes >= 1 && bytes <= (uint64_t)QPJ_INT_MAX;
    }
    if (!ok)
        return qp_err_set(err, QP_EINVAL,
                          "job.shard_size: must be a positive number of bytes or a size like \"4GB\" or \"500MB\", got %s",
                          qpj_describe(v, desc, sizeof desc));
    job->shard_size = bytes;
    return 0;
}

/* "all" (every worker of the node, QP_JOB_WORKERS_ALL) or a count from 1 to QP_JOB_WORKERS_MAX. */
static int parse_workers(const cJSON *root, qp_job *job, qp_err *err)
{
    const cJSON *v = qpj_field(root, "workers");
    if (!v) return 0;
    char desc[64];
    if (cJSON_IsString(v) && !strcmp(v->valuestring, "all")) {
        job->workers = QP_JOB_WORKERS_ALL;
        return 0;
    }
    double x = cJSON_IsNumber(v) ? v->valuedouble : 0;
    if (!(x >= 1 && x <= QP_JOB_WORKERS_MAX && x == (double)(int)x))
        return qp_err_set(err, QP_EINVAL, "job.workers: must be \"all\" or a whole number of workers from 1 to %d, got %s",
                          QP_JOB_WORKERS_MAX, qpj_describe(v, desc, sizeof desc));
    job->workers = (int)x;
    return 0;
}

static int parse_modules(const cJSON *root, qp_job *job, qp_err *err)
{
    const cJSON *v = qpj_field(root, "modules_to_not_convert");
    if (!v) return 0;
    char desc[64];
    if (!cJSON_IsArray(v))
        return qp_err_set(err, QP_EINVAL, "job.modules_to_not_convert: must be an array of module names, got %s",
                          qpj_describe(v, desc, sizeof desc));
    size_t n = (size_t)cJSON_GetArraySize(v), i = 0;
    job->modules_to_not_convert = calloc(n ? n : 1, sizeof(char *));
    if (!job->modules_to_not_convert) return qp_err_set(err, QP_ENOMEM, "job.modules_to_not_convert: out of memory");
    for (const cJSON *e = v->child; e; e = e->next, i++) {
        if (!cJSON_IsString(e) || !e->valuestring[0])
            return qp_err_set(err, QP_EINVAL, "job.modules_to_not_convert[%zu]: must be a non-empty string, got %s",
                              i, qpj_describe(e, desc, sizeof desc));
        job->modules_to_not_convert[i] = strdup(e->valuestring);
        if (!job->modules_to_not_convert[i]) return qp_err_set(err, QP_ENOMEM, "job.modules_to_not_convert: out of memory");
        job->n_modules_to_not_convert = i + 1;
    }
    return 0;
}

static int parse_calibration(const cJSON *root, qp_job *job, qp_err *err)
{
    const cJSON *c = qpj_field(root, "calibration");
    qp_job_calib *cal = &job->calibration;
    int rc;
    if (c) {
        char desc[64];
        if (!cJSON_IsObject(c))
            return qp_err_set(err, QP_EINVAL, "job.calibration: must be an object like {\"path\": \"c4.jsonl\"}, got %s",
                              qpj_describe(c, desc, sizeof desc));
        const char *p = "job.calibration";
        int style = cal->style, has_seq = 0;
        if ((rc = check_keys(c, p, err)) ||
            (rc = qpj_get_str(c, p, "path", 0, &cal->path, NULL, err)) ||
            (rc = qpj_get_str(c, p, "field", 0, &cal->field, NULL, err)) ||
            (rc = qpj_get_int(c, p, "samples", 1, 1000000, "must be a positive integer (at most 1000000)",
                              &cal->samples, NULL, err)) ||
            (rc = qpj_get_int(c, p, "seq_len", 1, 1048576, "must be a positive integer (at most 1048576)",
                              &cal->seq_len, &has_seq, err)) ||
            (rc = get_enum(c, p, "style", style_names, 2, &style, NULL, err)) ||
            (rc = qpj_get_int(c, p, "shards", 1, 16, "must be an integer from 1 to 16", &cal->shards, NULL, err)))
            return rc;
        int64_t seed = 0;
        int has_seed = 0;
        if ((rc = qpj_get_int(c, p, "seed", 0, QPJ_INT_MAX, "must be a non-negative integer", &seed, &has_seed, err)))
            return rc;
        if (has_seed) cal->seed = (uint64_t)seed;
        cal->style = (qp_calib_style)style;
        if (!has_seq) cal->seq_len = default_seq_len(cal->style);
    }
    return 0;
}

static int parse_eval(const cJSON *root, qp_job *job, qp_err *err)
{
    const cJSON *e = qpj_field(root, "eval");
    if (!e) return 0;
    char desc[64];
    if (!cJSON_IsObject(e))
        return qp_err_set(err, QP_EINVAL, "job.eval: must be an object like {\"path\": \"wiki.test.raw\"}, got %s",
                          qpj_describe(e, desc, sizeof desc));
    const char *p = "job.eval";
    int rc;
    job->eval.enabled = 1;
    if ((rc = check_keys(e, p, err)) ||
        (rc = qpj_get_str(e, p, "path", 0, &job->eval.path, NULL, err)) ||
        (rc = qpj_get_int(e, p, "seq_len", 1, 1048576, "must be a positive integer (at most 1048576)",
                          &job->eval.seq_len, NULL, err)) ||
        (rc = qpj_get_int(e, p, "max_windows", 0, QPJ_INT_MAX, "must be 0 (all windows) or a positive integer",
                          &job->eval.max_windows, NULL, err)))
        return rc;
    if (!job->eval.path)
        return qp_err_set(err, QP_ENOTFOUND, "job.eval.path: required when eval is given (a text file such as wiki.test.raw)");
    return 0;
}

static int parse_moe(const cJSON *root, qp_job *job, qp_err *err)
{
    const cJSON *o = qpj_field(root, "moe");
    if (!o) return 0;
    char desc[64];
    if (!cJSON_IsObject(o))
        return qp_err_set(err, QP_EINVAL, "job.moe: must be an object like {\"calibrate_all_experts\": true}, got %s",
                          qpj_describe(o, desc, sizeof desc));
    const char *p = "job.moe";
    int rc;
    if ((rc = check_keys(o, p, err)) ||
        (rc = qpj_get_bool(o, p, "calibrate_all_experts", &job->moe.calibrate_all_experts, NULL, err)) ||
        (rc = qpj_get_int(o, p, "min_tokens", 0, QPJ_INT_MAX, "must be a non-negative integer", &job->moe.min_tokens,
                          NULL, err)) ||
        (rc = qpj_get_bool(o, p, "awq_shared_input", &job->moe.awq_shared_input, NULL, err)))
        return rc;
    return 0;
}

/* job.awq: {"stats_tokens": N}, for the AWQ methods only. */
static int parse_awq(const cJSON *root, qp_job *job, qp_err *err)
{
    const cJSON *o = qpj_field(root, "awq");
    if (!o) return 0;
    char desc[64];
    if (!cJSON_IsObject(o))
        return qp_err_set(err, QP_EINVAL, "job.awq: must be an object like {\"stats_tokens\": %d}, got %s",
                          QP_AWQ_STATS_TOKENS_DEFAULT, qpj_describe(o, desc, sizeof desc));
    if (!method_uses_awq(job->method))
        return qp_err_set(err, QP_EINVAL, "job.awq: given for method %s; it sets AWQ's scale search (methods awq and "
                          "awq+gptq): remove it", qp_method_name(job->method));
    const char *p = "job.awq";
    int rc;
    if ((rc = check_keys(o, p, err)) ||
        (rc = qpj_get_int(o, p, "stats_tokens", 0, QPJ_INT_MAX, "must be 0 (every token) or a positive integer",
                          &job->awq.stats_tokens, NULL, err)))
        return rc;
    return 0;
}

/* job.checkpoint: {"acts_every": N}. */
static int parse_checkpoint(const cJSON *root, qp_job *job, int *has_every, qp_err *err)
{
    const cJSON *o = qpj_field(root, "checkpoint");
    if (!o) return 0;
    char desc[64];
    if (!cJSON_IsObject(o))
        return qp_err_set(err, QP_EINVAL, "job.checkpoint: must be an object like {\"acts_every\": 4}, got %s",
                          qpj_describe(o, desc, sizeof desc));
    const char *p = "job.checkpoint";
    int rc;
    if ((rc = check_keys(o, p, err)) ||
        (rc = get_int32(o, p, "acts_every", 1, 1 << 20, "must be an integer >= 1 (1: every block)",
                        &job->checkpoint.acts_every, has_every, err)))
        return rc;
    return 0;
}

/* job.serve: {"engine": "vllm", "gpu": "hopper"|"ampere"|"blackwell", "tp": N}. */
static int parse_serve(const cJSON *root, qp_job *job, qp_err *err)
{
    const cJSON *e = qpj_field(root, "serve");
    if (!e) return 0;
    char desc[64];
    if (!cJSON_IsObject(e))
        return qp_err_set(err, QP_EINVAL, "job.serve: must be an object like {\"engine\": \"vllm\", \"gpu\": \"hopper\", "
                          "\"tp\": 1}, got %s", qpj_describe(e, desc, sizeof desc));
    const char *p = "job.serve";
    int rc, engine = -1, gpu = -1;
    job->serve.enabled = 1;
    job->serve.tp = 1;
    if ((rc = check_keys(e, p, err)) ||
        (rc = get_enum(e, p, "engine", serve_engine_names, 1, &engine, NULL, err)) ||
        (rc = get_enum(e, p, "gpu", serve_gpu_names, 3, &gpu, NULL, err)) ||
        (rc = get_int32(e, p, "tp", 1, 1024, "must be an integer >= 1 (at most 1024)", &job->serve.tp, NULL, err)))
        return rc;
    if (engine < 0) return qp_err_set(err, QP_ENOTFOUND, "job.serve.engine: required (vllm)");
    if (gpu < 0) return qp_err_set(err, QP_ENOTFOUND, "job.serve.gpu: required (hopper, ampere or blackwell)");
    snprintf(job->serve.engine, sizeof job->serve.engine, "%s", serve_engine_names[engine]);
    snprintf(job->serve.gpu, sizeof job->serve.gpu, "%s", serve_gpu_names[gpu]);
    return 0;
}

/* An array of 1 to QP_JOB_BPW_MAX distinct integers, each in [lo, hi] and not 0. */
static int parse_int_list(const cJSON *root, const char *key, int lo, int hi, int *out, int *n, qp_err *err)
{
    const cJSON *v = qpj_field(root, key);
    if (!v) return 0;
    char desc[64];
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) < 1 || cJSON_GetArraySize(v) > QP_JOB_BPW_MAX)
        return qp_err_set(err, QP_EINVAL, "job.%s: must be an array of 1 to %d integers, got %s", key, QP_JOB_BPW_MAX,
                          qpj_describe(v, desc, sizeof desc));
    int i = 0;
    for (const cJSON *e = v->child; e; e = e->next, i++) {
        double d = cJSON_IsNumber(e) ? e->valuedouble : 0;
        if (!cJSON_IsNumber(e) || d != (int)d || d < lo || d > hi || d == 0)
            return qp_err_set(err, QP_EINVAL, "job.%s[%d]: %s is not an integer from %d to %d (and not 0)", key, i,
                              qpj_describe(e, desc, sizeof desc), lo, hi);
        for (int j = 0; j < i; j++)
            if (out[j] == (int)d) return qp_err_set(err, QP_EINVAL, "job.%s: %d is listed twice", key, (int)d);
        out[i] = (int)d;
    }
    *n = i;
    return 0;
}

/* job.target_bpw, job.bpw_bits, job.bpw_group_sizes (the rules between them and the rest of
 * the job are qp_job_validate's). */
static int parse_bpw(const cJSON *root, qp_job *job, qp_err *err)
{
    const cJSON *t = qpj_field(root, "target_bpw");
    char desc[64];
    if (t) {
        if (!cJSON_IsNumber(t) || !(t->valuedouble > 1.0 && t->valuedouble <= 16.0))
            return qp_err_set(err, QP_EINVAL, "job.target_bpw: must be a number of bits per weight above 1 and at most 16, "
                              "got %s", qpj_describe(t, desc, sizeof desc));
        job->target_bpw = t->valuedouble;
    }
    int rc = parse_int_list(root, "bpw_bits", 2, 8, job->bpw_bits, &job->n_bpw_bits, err);
    if (!rc) rc = parse_int_list(root, "bpw_group_sizes", -1, 1 << 30, job->bpw_group_sizes, &job->n_bpw_group_sizes, err);
    return rc;
}

const qd_scheme *qp_job_scheme(const qp_job *job)
{
    return job && job->scheme > 0 ? qd_scheme_at((size_t)job->scheme - 1) : NULL;
}

/* job.scheme: a preset name (quant/formats/scheme.h) that sets bits, group_size, sym and
 * format. A field the job also gives must say the same, else it is refused with the reason:
 * a recipe that says "W4A16" and "bits": 8 is a mistake, not a choice. format is the
 * format index the job named (-1: none). */
static int parse_scheme(const cJSON *root, qp_job *job, int format, int has_sym, qp_err *err)
{
    const cJSON *v = qpj_field(root, "scheme");
    if (!v || cJSON_IsNull(v)) return 0;
    const char *names[32];
    size_t n = 0;
    const qp_job_field *fs = qp_job_field_find("scheme");
    for (const char *nm; n < 32 && (nm = qp_job_field_value(fs, n)); n++) names[n] = nm;
    int idx = 0;
    int rc = get_enum(root, "job", "scheme", names, n, &idx, NULL, err);
    if (rc) return rc;
    const qd_scheme *sc = qd_scheme_find(names[idx]);
    if (qd_scheme_act_static(sc) && job->method == QP_METHOD_RTN)
        return qp_err_set(err, QP_EINVAL, "job.scheme: %s declares a static activation scale measured on the "
                          "calibration data, and method rtn reads none; use method gptq or awq, or scheme %s (%s)",
                          sc->name, sc->act == QD_ACT_NVFP4 ? "NVFP4A16" : "FP8_DYNAMIC",
                          sc->act == QD_ACT_NVFP4 ? "activations left to the server" : "activations scaled per token");
    const cJSON *bits = qpj_field(root, "bits"), *gs = qpj_field(root, "group_size");
    if (bits && job->bits != sc->bits)
        return qp_err_set(err, QP_EINVAL, "job.bits: %d contradicts scheme %s (%d-bit weights: %s); remove bits or the "
                          "scheme", job->bits, sc->name, sc->bits, sc->summary);
    if (gs && job->group_size != sc->group_size)
        return qp_err_set(err, QP_EINVAL, "job.group_size: %d contradicts scheme %s (group_size %lld); remove group_size "
                          "or the scheme", job->group_size, sc->name, (long long)sc->group_size);
    if (has_sym && job->sym != sc->sym)
        return qp_err_set(err, QP_EINVAL, "job.sym: %s contradicts scheme %s (%s); remove sym or the scheme",
                          job->sym ? "true" : "false", sc->name, sc->sym ? "symmetric" : "with zero points");
    int want = qd_format_index(qd_format_find(sc->format));
    if (want < 0) return qp_err_set(err, QP_EINVAL, "job.scheme: %s names format %s, which is not in the table", sc->name, sc->format);
    if (format >= 0 && format != want)
        return qp_err_set(err, QP_EINVAL, "job.format: %s contradicts scheme %s (which writes %s); remove format or the "
                          "scheme", qp_format_name((qp_format)format), sc->name, sc->format);
    job->scheme = qd_scheme_index(sc) + 1;
    job->bits = sc->bits;
    job->group_size = (int)sc->group_size;
    job->sym = sc->sym;
    job->format = (qp_format)want;
    return 0;
}

/* Version 1 of the spec. A version 2 would get parse_v2, or parse_v1 plus an upgrade step. */
static int parse_v1(const cJSON *root, qp_job *job, qp_err *err)
{
    const char *p = "job";
    int rc, method = QP_METHOD_GPTQ, has_format = 0;
    if ((rc = check_keys(root, p, err)) ||
        (rc = get_enum(root, p, "method", method_names, 4, &method, NULL, err)))
        return rc;
    if (qp_job_init_defaults(job, (qp_method)method))
        return qp_err_set(err, QP_ENOMEM, "job: out of memory");

    char *id = NULL;
    int has_sym = 0, format = 0, backend = job->backend, layout = job->layout, compute = job->compute;
    if ((rc = qpj_get_str(root, p, "id", 0, &id, NULL, err))) return rc;
    if (id) {
        int ok = qpj_name_valid(id, QP_JOB_ID_MAX);
        if (ok) strcpy(job->id, id);
        free(id);
        if (!ok)
            return qp_err_set(err, QP_EINVAL,
                              "job.id: must be 1 to %d letters, digits, '.', '_' or '-', not starting with '.' or '-'",
                              QP_JOB_ID_MAX);
    }
    if ((rc = qpj_get_str(root, p, "model", 0, &job->model, NULL, err)) ||
        (rc = qpj_get_str(root, p, "output", 0, &job->output, NULL, err)))
        return rc;
    const cJSON *bits = qpj_field(root, "bits");
    if (bits) {
        char desc[64];
        double b = cJSON_IsNumber(bits) ? bits->valuedouble : 0;
        if (!(b == 2 || b == 3 || b == 4 || b == 8))
            return qp_err_set(err, QP_EINVAL, "job.bits: %s is not one of 2, 3, 4, 8",
                              qpj_describe(bits, desc, sizeof desc));
        job->bits = (int)b;
    }
    if ((rc = get_int32(root, p, "group_size", -1, 1 << 30, "must be -1 (one group per column) or a positive integer",
                        &job->group_size, NULL, err)))
        return rc;
    if (job->group_size == 0)
        return qp_err_set(err, QP_EINVAL, "job.group_size: must be -1 (one group per column) or a positive integer, got 0");
    int has_kcheck_rows = 0, has_acts_every = 0, has_static = 0, has_search = 0;
    if ((rc = qpj_get_bool(root, p, "sym", &job->sym, &has_sym, err)) ||
        (rc = qpj_get_bool(root, p, "desc_act", &job->desc_act, NULL, err)) ||
        (rc = qpj_get_bool(root, p, "static_groups", &job->static_groups, &has_static, err)) ||
        (rc = qpj_get_bool(root, p, "true_sequential", &job->true_sequential, NULL, err)) ||
        (rc = qpj_get_bool(root, p, "gptaq", &job->gptaq, NULL, err)) ||
        (rc = qpj_get_double(root, p, "damp_percent", "must be a number greater than 0 and less than 1",
                             &job->damp_percent, NULL, err)) ||
        (rc = get_enum(root, p, "scale_search", scale_search_names, 2, &job->scale_search, &has_search, err)) ||
        (rc = get_format(root, p, &format, &has_format, err)) ||
        (rc = parse_calibration(root, job, err)) ||
        (rc = parse_eval(root, job, err)) ||
        (rc = parse_moe(root, job, err)) ||
        (rc = parse_awq(root, job, err)) ||
        (rc = parse_checkpoint(root, job, &has_acts_every, err)) ||
        (rc = parse_serve(root, job, err)) ||
        (rc = parse_modules(root, job, err)) ||
        (rc = parse_shard_size(root, job, err)) ||
        (rc = qpj_get_bool(root, p, "overwrite", &job->overwrite, NULL, err)) ||
        (rc = get_int32(root, p, "priority", INT_MIN, INT_MAX, "must be an integer", &job->priority, NULL, err)) ||
        (rc = parse_workers(root, job, err)) ||
        (rc = get_enum(root, p, "backend", backend_names, 3, &backend, NULL, err)) ||
        (rc = get_int32(root, p, "tp", 1, 1024, "must be an integer >= 1 (at most 1024)", &job->tp, NULL, err)) ||
        (rc = get_enum(root, p, "layout", layout_names, 2, &layout, NULL, err)) ||
        (rc = get_enum(root, p, "compute", compute_names, 3, &compute, NULL, err)) ||
        (rc = qpj_get_bool(root, p, "kernel_check", &job->kernel_check, NULL, err)) ||
        (rc = get_int32(root, p, "kernel_check_rows", 1, 65536, "must be an integer from 1 to 65536",
                        &job->kernel_check_rows, &has_kcheck_rows, err)) ||
        (rc = get_int32(root, p, "error_direct_rows", 0, 1 << 24, "must be an integer from 0 (off) to 16777216",
                        &job->error_direct_rows, NULL, err)) ||
        (rc = parse_bpw(root, job, err)))
        return rc;
    if ((rc = parse_scheme(root, job, has_format ? format : -1, has_sym, err))) return rc;
    if (job->scheme) has_format = 1, format = job->format;
    /* The search's default (qp_job_init_defaults) is min-max where mse is not used: schemes
     * whose rows share one scale. */
    if (!has_search && job->scheme && qp_job_scheme(job)->row_block != 1) job->scale_search = QD_SCALE_SEARCH_MINMAX;
    if (has_kcheck_rows && !job->kernel_check)
        return qp_err_set(err, QP_EINVAL, "job.kernel_check_rows: given while kernel_check is false (remove one of them)");
    job->format = has_format ? (qp_format)format : default_format(job->method, job->bits);
    job->backend = (qp_backend_choice)backend;
    job->layout = (qp_layout)layout;
    job->compute = (qp_compute)compute;
    /* static_groups follows desc_act unless given; tp_aware reorders a scattered g_idx, which
     * static groups never make. */
    if (!has_static) job->static_groups = job->desc_act && job->layout != QP_LAYOUT_TP_AWARE;
    /* tp_aware reorders the MLP pair in the block file, so a block's forward cannot be redone
     * from it: its activations are kept after every block (qp_job_acts_every). */
    if (job->layout == QP_LAYOUT_TP_AWARE) {
        if (has_acts_every && job->checkpoint.acts_every > 1)
            return qp_err_set(err, QP_EINVAL, "job.checkpoint.acts_every: must be 1 with layout tp_aware (its block files hold "
                              "reordered weights that a resumed job cannot recompute activations from), got %d",
                              job->checkpoint.acts_every);
    }
    if (job->damp_percent <= 0.0 || job->damp_percent >= 1.0)
        return qp_err_set(err, QP_EINVAL, "job.damp_percent: must be a number greater than 0 and less than 1, got %g",
                          job->damp_percent);
    if (!job->model) return qp_err_set(err, QP_ENOTFOUND, "job.model: required (the Hugging Face model directory)");
    if (!job->output) return qp_err_set(err, QP_ENOTFOUND, "job.output: required (the directory to write the quantized model to)");
    if (!qpj_field(root, "calibration") && job->method != QP_METHOD_RTN)
        return qp_err_set(err, QP_ENOTFOUND,
                          "job.calibration: required for method %s (at least {\"path\": \"<jsonl or text file>\"})",
                          qp_method_name(job->method));
    if (!job->id[0]) {
        job->id_derived = 1;
        /* A placeholder that passes validation; the real id needs the validated spec. */
        strcpy(job->id, "j-pending");
    }
    if ((rc = qp_job_validate(job, err))) return rc;
    if (job->id_derived && (rc = qp_job_derive_id(job, job->id)))
        return qp_err_set(err, rc, "job.id: out of memory while deriving the id");
    return 0;
}

int qp_job_from_cjson(const cJSON *root, qp_job **out, qp_err *err)
{
    *out = NULL;
    char desc[64];
    if (!cJSON_IsObject(root))
        return qp_err_set(err, QP_EINVAL, "job: expected a JSON object, got %s", qpj_describe(root, desc, sizeof desc));
    int64_t version = 1;
    int rc = qpj_get_int(root, "job", "version", 1, INT_MAX, "must be a positive integer", &version, NULL, err);
    if (rc) return rc;
    if (version > QP_JOB_VERSION)
        return qp_err_set(err, QP_EUNSUPPORTED,
                          "job.version: %lld is newer than this quantd understands (it reads version %d); upgrade quantd",
                          (long long)version, QP_JOB_VERSION);
    qp_job *job = calloc(1, sizeof *job);
    if (!job) return qp_err_set(err, QP_ENOMEM, "job: out of memory");
    rc = parse_v1(root, job, err);
    if (rc) {
        qp_job_free(job);
        return rc;
    }
    *out = job;
    return 0;
}

int qp_job_parse(const char *json, size_t len, qp_job **out, qp_err *err)
{
    *out = NULL;
    if (len > QP_JOB_MAX_BYTES)
        return qp_err_set(err, QP_EINVAL, "job: payload is %zu bytes; the limit is %d", len, QP_JOB_MAX_BYTES);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    size_t off = end && end >= json ? (size_t)(end - json) : 0;
    if (root) {
        /* cJSON stops after the first value; anything but whitespace after it is an error. */
        while (off < len && isspace((unsigned char)json[off])) off++;
        if (off < len && json[off] != '\0') {
            cJSON_Delete(root);
            root = NULL;
        }
    }
    if (!root) {
        if (off > len) off = len;
        size_t line = 1, col = 1;
        for (size_t i = 0; i < off; i++) {
            if (json[i] == '\n') { line++; col = 1; } else col++;
        }
        if (len == 0 || off >= len)
            return qp_err_set(err, QP_EFORMAT, "job: invalid JSON: the text ends early (line %zu, column %zu)", line, col);
        char near[24];
        size_t k = 0;
        for (size_t i = off; i < len && k < 16 && json[i] != '\n'; i++)
            near[k++] = isprint((unsigned char)json[i]) ? json[i] : '?';
        near[k] = '\0';
        return qp_err_set(err, QP_EFORMAT, "job: invalid JSON at line %zu, column %zu, near '%s'", line, col, near);
    }
    int rc = qp_job_from_cjson(root, out, err);
    cJSON_Delete(root);
    return rc;
}

void qp_job_free(qp_job *job)
{
    if (!job) return;
    free(job->model);
    free(job->output);
    free(job->calibration.path);
    free(job->calibration.field);
    free(job->eval.path);
    for (size_t i = 0; i < job->n_modules_to_not_convert; i++) free(job->modules_to_not_convert[i]);
    free(job->modules_to_not_convert);
    free(job);
}
