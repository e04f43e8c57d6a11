/* Job spec out: canonical JSON, the derived id, deep copy, and size strings ("4GB").
 *
 * Canonical means: every field present (the later additions only away from their defaults),
 * in the order of qp_job_fields (job.c), defaults filled, compact, numbers printed by cJSON
 * (which round-trips doubles). Two specs that mean the same job produce the same bytes,
 * which is what the id and the checkpoint fingerprint rely on; so never reorder the
 * additions below without bumping QP_JOB_VERSION. */
#include "quant/job/job.h"
#include "quant/formats/quantizer.h"
#include "quant/formats/scheme.h"
#include "quant/job/hash.h"
#include "quant/job/jsonutil.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static cJSON *calib_to_cjson(const qp_job_calib *c, unsigned flags)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    int rc = 0;
    if (!(flags & QP_JOB_JSON_OUTPUT_ONLY)) rc |= qpj_add_str(o, "path", c->path);
    rc |= qpj_add_str(o, "field", c->field ? c->field : "text");
    rc |= qpj_add_num(o, "samples", (double)c->samples);
    rc |= qpj_add_num(o, "seq_len", (double)c->seq_len);
    rc |= qpj_add_num(o, "seed", (double)c->seed);
    rc |= qpj_add_str(o, "style", qp_calib_style_name(c->style));
    /* Only when not 1: a job that leaves it out keeps the fingerprint it had before it existed. */
    if (c->shards > 1) rc |= qpj_add_num(o, "shards", (double)c->shards);
    if (rc) { cJSON_Delete(o); return NULL; }
    return o;
}

static cJSON *eval_to_cjson(const qp_job_eval *e)
{
    if (!e->enabled) return cJSON_CreateNull();
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    int rc = qpj_add_str(o, "path", e->path) | qpj_add_num(o, "seq_len", (double)e->seq_len) |
             qpj_add_num(o, "max_windows", (double)e->max_windows);
    if (rc) { cJSON_Delete(o); return NULL; }
    return o;
}

static int add_item(cJSON *o, const char *name, cJSON *v)
{
    if (!v || !cJSON_AddItemToObject(o, name, v)) { cJSON_Delete(v); return QP_ENOMEM; }
    return 0;
}

cJSON *qp_job_to_cjson(const qp_job *job, unsigned flags)
{
    const int all = !(flags & QP_JOB_JSON_OUTPUT_ONLY);
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    int rc = qpj_add_num(o, "version", job->version ? job->version : QP_JOB_VERSION);
    if (all && !(flags & QP_JOB_JSON_NO_ID)) rc |= qpj_add_str(o, "id", job->id);
    if (all) rc |= qpj_add_str(o, "model", job->model);
    if (all) rc |= qpj_add_str(o, "output", job->output);
    rc |= qpj_add_str(o, "method", qp_method_name(job->method));
    rc |= qpj_add_num(o, "bits", job->bits);
    rc |= qpj_add_num(o, "group_size", job->group_size);
    rc |= qpj_add_bool(o, "sym", job->sym);
    rc |= qpj_add_bool(o, "desc_act", job->desc_act);
    rc |= qpj_add_bool(o, "static_groups", job->static_groups);
    rc |= qpj_add_bool(o, "true_sequential", job->true_sequential);
    /* Only when on, so that the jobs written before it keep their derived ids. */
    if (job->gptaq) rc |= qpj_add_bool(o, "gptaq", 1);
    rc |= qpj_add_num(o, "damp_percent", job->damp_percent);
    /* When mse, and always for method gptq (whose default it is): a gptq job's form then
     * names its search, so one written before mse was gptq's default (no key: min-max) never
     * shares a fingerprint with one that searches. Other methods' min-max jobs keep their ids. */
    if (job->scale_search || job->method == QP_METHOD_GPTQ)
        rc |= qpj_add_str(o, "scale_search", qd_scale_search_name((qd_scale_search)job->scale_search));
    rc |= qpj_add_str(o, "format", qp_format_name(job->format));
    /* Only when given, so that the jobs written before it keep their derived ids. */
    if (job->scheme) rc |= qpj_add_str(o, "scheme", qd_scheme_at((size_t)job->scheme - 1)->name);
    rc |= add_item(o, "calibration", calib_to_cjson(&job->calibration, flags));
    if (all) rc |= add_item(o, "eval", eval_to_cjson(&job->eval));
    cJSON *mods = cJSON_CreateArray();
    for (size_t i = 0; mods && i < job->n_modules_to_not_convert; i++) {
        cJSON *s = cJSON_CreateString(job->modules_to_not_convert[i]);
        if (!s || !cJSON_AddItemToArray(mods, s)) { cJSON_Delete(s); rc |= QP_ENOMEM; }
    }
    rc |= add_item(o, "modules_to_not_convert", mods);
    rc |= qpj_add_num(o, "shard_size", (double)job->shard_size);
    if (all) rc |= qpj_add_bool(o, "overwrite", job->overwrite);
    if (all) rc |= qpj_add_num(o, "priority", job->priority);
    /* Only when not "all", so that the jobs written before it keep their derived ids. */
    if (all && job->workers != QP_JOB_WORKERS_ALL) rc |= qpj_add_num(o, "workers", job->workers);
    if (all) rc |= qpj_add_str(o, "backend", qp_backend_name(job->backend));
    rc |= qpj_add_num(o, "tp", job->tp);
    rc |= qpj_add_str(o, "layout", qp_layout_name(job->layout));
    if (job->compute != QP_COMPUTE_AUTO) rc |= qpj_add_str(o, "compute", qp_compute_name(job->compute));
    if (all) rc |= qpj_add_bool(o, "kernel_check", job->kernel_check);
    if (all && job->kernel_check_rows != QP_KERNEL_CHECK_ROWS_DEFAULT)
        rc |= qpj_add_num(o, "kernel_check_rows", job->kernel_check_rows);
    if (all && job->error_direct_rows) rc |= qpj_add_num(o, "error_direct_rows", job->error_direct_rows);
    /* Only when not the defaults, so that a dense model's job keeps the id it always had. */
    if (!job->moe.calibrate_all_experts || job->moe.min_tokens != QP_MOE_MIN_TOKENS_DEFAULT || job->moe.awq_shared_input) {
        cJSON *m = cJSON_CreateObject();
        if (m) {
            rc |= qpj_add_bool(m, "calibrate_all_experts", job->moe.calibrate_all_experts);
            rc |= qpj_add_num(m, "min_tokens", (double)job->moe.min_tokens);
            if (job->moe.awq_shared_input) rc |= qpj_add_bool(m, "awq_shared_input", 1);
        }
        rc |= add_item(o, "moe", m);
    }
    if (job->awq.stats_tokens != QP_AWQ_STATS_TOKENS_DEFAULT) {
        cJSON *a = cJSON_CreateObject();
        if (a) rc |= qpj_add_num(a, "stats_tokens", (double)job->awq.stats_tokens);
        rc |= add_item(o, "awq", a);
    }
    if (all && job->checkpoint.acts_every != QP_CKPT_ACTS_EVERY_DEFAULT) {
        cJSON *c = cJSON_CreateObject();
        if (c) rc |= qpj_add_num(c, "acts_every", job->checkpoint.acts_every);
        rc |= add_item(o, "checkpoint", c);
    }
    /* Only when given: specs without it keep their canonical form and derived id. */
    if (all && job->serve.enabled) {
        cJSON *sv = cJSON_CreateObject();
        if (sv) {
            rc |= qpj_add_str(sv, "engine", job->serve.engine);
            rc |= qpj_add_str(sv, "gpu", job->serve.gpu);
            rc |= qpj_add_num(sv, "tp", job->serve.tp);
        }
        rc |= add_item(o, "serve", sv);
    }
    /* Only when given: specs without it keep their canonical form and derived id. */
    if (job->target_bpw != 0) {
        rc |= qpj_add_num(o, "target_bpw", job->target_bpw);
        if (job->n_bpw_bits) rc |= add_item(o, "bpw_bits", cJSON_CreateIntArray(job->bpw_bits, job->n_bpw_bits));
        if (job->n_bpw_group_sizes)
            rc |= add_item(o, "bpw_group_sizes", cJSON_CreateIntArray(job->bpw_group_sizes, job->n_bpw_group_sizes));
    }
    if (rc) { cJSON_Delete(o); return NULL; }
    return o;
}

char *qp_job_to_json(const qp_job *job, unsigned flags)
{
    cJSON *o = qp_job_to_cjson(job, flags);
    if (!o) return NULL;
    char *s = qpj_print(o, (flags & QP_JOB_JSON_PRETTY) != 0);
    cJSON_Delete(o);
    return s;
}

int qp_job_derive_id(const qp_job *job, char id[QP_JOB_ID_MAX + 1])
{
    char *s = qp_job_to_json(job, QP_JOB_JSON_NO_ID);
    if (!s) return QP_ENOMEM;
    char hex[65];
    qp_sha256_hex(s, strlen(s), hex);
    free(s);
    memcpy(id, "j-", 2);
    memcpy(id + 2, hex, 16);
    id[18] = '\0';
    return 0;
}

qp_job *qp_job_dup(const qp_job *src)
{
    qp_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    *j = *src;
    j->model = qpj_strdup(src->model);
    j->output = qpj_strdup(src->output);
    j->calibration.path = qpj_strdup(src->calibration.path);
    j->calibration.field = qpj_strdup(src->calibration.field);
    j->eval.path = qpj_strdup(src->eval.path);
    j->modules_to_not_convert = NULL;
    j->n_modules_to_not_convert = 0;
    int bad = (src->model && !j->model) || (src->output && !j->output) ||
              (src->calibration.path && !j->calibration.path) ||
              (src->calibration.field && !j->calibration.field) || (src->eval.path && !j->eval.path);
    if (!bad && src->n_modules_to_not_convert) {
        j->modules_to_not_convert = calloc(src->n_modules_to_not_convert, sizeof(char *));
        bad = !j->modules_to_not_convert;
        for (size_t i = 0; !bad && i < src->n_modules_to_not_convert; i++) {
            j->modules_to_not_convert[i] = qpj_strdup(src->modules_to_not_convert[i]);
            bad = !j->modules_to_not_convert[i];
            j->n_modules_to_not_convert = i + 1;
        }
    }
    if (bad) {
        qp_job_free(j);
        return NULL;
    }
    return j;
}

int qp_size_parse(const char *s, uint64_t *out)
{
    if (!s) return QP_EINVAL;
    while (isspace((unsigned char)*s)) s++;
    if (!isdigit((unsigned char)*s) && *s != '.') return QP_EINVAL;
    char *end = NULL;
    double x = strtod(s, &end);
    if (end == s || !isfinite(x) || x < 0) return QP_EINVAL;
    while (isspace((unsigned char)*end)) end++;
    static const struct { const char *unit; double mult; } units[] = {
        { "", 1 }, { "b", 1 },
        { "kb", 1e3 }, { "mb", 1e6 }, { "gb", 1e9 }, { "tb", 1e12 },
        { "kib", 1024.0 }, { "mib", 1048576.0 }, { "gib", 1073741824.0 }, { "tib", 1099511627776.0 },
    };
    char unit[8];
    size_t n = strlen(end);
    while (n && isspace((unsigned char)end[n - 1])) n--;
    if (n >= sizeof unit) return QP_EINVAL;
    for (size_t i = 0; i < n; i++) unit[i] = (char)tolower((unsigned char)end[i]);
    unit[n] = '\0';
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(unit, units[i].unit) != 0) continue;
        double bytes = x * units[i].mult;
        /* Plain byte counts must be whole; with a unit, round ("1.1GB" is 1100000000.0000002
         * in binary floating point). */
        if (bytes > 9007199254740991.0) return QP_EINVAL;
        /* (adding 0.5 and truncating rounds a non-negative value without libm's round) */
        if (units[i].mult == 1 ? bytes != (double)(uint64_t)bytes : (bytes = (double)(uint64_t)(bytes + 0.5), 0))
            return QP_EINVAL;
        *out = (uint64_t)bytes;
        return 0;
    }
    return QP_EINVAL;
}
