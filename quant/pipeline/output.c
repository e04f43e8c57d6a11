/* Output directory writer (see output.h). */
#include "quant/pipeline/output.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cjson/cJSON.h>

#include "quant/core/confine.h"
#include "quant/core/fsutil.h"
#include "quant/core/jsonfile.h"
#include "quant/core/safetensors.h"
#include "quant/formats/format.h"

#define QUANTD_VERSION_STRING "quantd 0.1.0"

static uint64_t tensor_bytes(const qd_out_tensor *t)
{
    uint64_t n = qd_dtype_size(t->dtype);
    for (int d = 0; d < t->ndim; d++) n *= (uint64_t)t->shape[d];
    return n;
}

static int write_one_shard(const char *path, const qd_out_tensor *t, size_t a, size_t b, qd_err *err)
{
    st_writer *w = NULL;
    int rc = st_writer_init(&w);
    if (rc) return qd_err_set(err, rc, "out of memory");
    for (size_t i = a; i < b && !rc; i++)
        rc = st_writer_add(w, t[i].name, t[i].dtype, t[i].ndim, t[i].shape, t[i].data, err);
    if (!rc) rc = st_writer_write(w, path, err);
    st_writer_free(w);
    return rc;
}

/* An FP8-block source checkpoint (DeepSeek-V3 and the like, quantization_config quant_method
 * "fp8") stores each FP8 linear's scales as "<linear>.weight_scale_inv". The block checkpoints
 * copy every tensor of a block that the job does not replace, so those scales reach the
 * output list, where they mean nothing: the linear was quantized (its weight replaced by the
 * format's tensors) or written in float, and the output's quantization_config is the job's.
 * They are left out here. A linear the job leaves in float is written dequantized
 * (pipeline_blockfile.c), so an F8_E4M3 weight still beside its scales means a block file
 * written otherwise: refused by name, since written as it is it would be read as FP8 codes
 * without their scales. */
static int name_cmp(const void *a, const void *b)
{
    return strcmp((*(const qd_out_tensor *const *)a)->name, (*(const qd_out_tensor *const *)b)->name);
}

static int drop_fp8_scales(const qd_out_tensor *t, size_t n, qd_out_tensor **kept, size_t *n_kept, qd_err *err)
{
    static const char suffix[] = ".weight_scale_inv";
    const size_t sl = sizeof suffix - 1;
    size_t n_scales = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l = strlen(t[i].name);
        n_scales += l > sl && !strcmp(t[i].name + l - sl, suffix);
    }
    *kept = NULL;
    *n_kept = n;
    if (!n_scales) return 0;
    const qd_out_tensor **order = malloc(n * sizeof *order);
    qd_out_tensor *out = malloc(n * sizeof *out);
    if (!order || !out) { free((void *)order); free(out); return qd_err_set(err, QD_ENOMEM, "out of memory"); }
    for (size_t i = 0; i < n; i++) order[i] = &t[i];
    qsort(order, n, sizeof *order, name_cmp);
    size_t m = 0;
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        size_t l = strlen(t[i].name);
        if (!(l > sl && !strcmp(t[i].name + l - sl, suffix))) { out[m++] = t[i]; continue; }
        /* "<linear>.weight": the scale's name without its last 10 characters ("_scale_inv"). */
        char w[1024];
        if (l - 10 >= sizeof w) { out[m++] = t[i]; continue; }
        memcpy(w, t[i].name, l - 10);
        w[l - 10] = 0;
        size_t lo = 0, hi = n;
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            int c = strcmp(order[mid]->name, w);
            if (c == 0) { lo = mid; break; }
            if (c < 0) lo = mid + 1; else hi = mid;
        }
        if (lo < n && !strcmp(order[lo]->name, w) && order[lo]->dtype == QD_DTYPE_F8_E4M3)
            rc = qd_err_set(err, QD_EUNSUPPORTED, "tensor '%s': a linear left in float whose source weight is FP8 "
                            "(F8_E4M3 with weight_scale_inv) would be written as FP8 codes without their scales; "
                            "quantize it (take it out of modules_to_not_convert)", w);
    }
    free((void *)order);
    if (rc) { free(out); return rc; }
    *kept = out;
    *n_kept = m;
    return 0;
}

int qd_output_write_shards(const char *dir, const qd_out_tensor *t_in, size_t n_in, uint64_t shard_size, qd_err *err)
{
    qd_out_tensor *kept = NULL;
    size_t n = n_in;
    int drc = drop_fp8_scales(t_in, n_in, &kept, &n, err);
    if (drc) return drc;
    const qd_out_tensor *t = kept ? kept : t_in;
    uint64_t *bytes = malloc((n ? n : 1) * sizeof *bytes);
    const char **names = malloc((n ? n : 1) * sizeof *names);
    st_shard_plan plan = {0};
    int rc = bytes && names ? 0 : qd_err_set(err, QD_ENOMEM, "out of memory");
    for (size_t i = 0; i < n && !rc; i++) {
        bytes[i] = tensor_bytes(&t[i]);
        names[i] = t[i].name;
    }
    if (!rc && st_shard_plan_by_size(bytes, n, shard_size, &plan)) rc = qd_err_set(err, QD_ENOMEM, "out of memory");
    char fname[64], path[4096];
    for (size_t s = 0; s < plan.n_shards && !rc; s++) {
        st_shard_file_name(&plan, s, fname, sizeof fname);
        snprintf(path, sizeof path, "%s/%s", dir, fname);
        rc = write_one_shard(path, t, plan.start[s], plan.start[s + 1], err);
    }
    if (!rc && plan.n_shards > 1) rc = st_shard_index_write(dir, &plan, names, err);
    st_shard_plan_free(&plan);
    free(names);
    free(bytes);
    free(kept);
    return rc;
}

void qd_output_regex_escape(const char *in, char *out, size_t cap)
{
    size_t o = 0;
    for (; *in && o + 3 < cap; in++) {
        if (strchr(".^$*+?()[]{}|\\", *in)) out[o++] = '\\';
        out[o++] = *in;
    }
    out[o] = 0;
}

int qd_output_declare_float_roots(cJSON *q, const char *const *roots, size_t n_roots)
{
    if (!n_roots) return 0;
    cJSON *ign = cJSON_GetObjectItemCaseSensitive(q, "ignore");
    cJSON *mnc = cJSON_GetObjectItemCaseSensitive(q, "modules_to_not_convert");
    const cJSON *method = cJSON_GetObjectItemCaseSensitive(q, "quant_method");
    cJSON *dyn = NULL;
    if (mnc && !cJSON_IsArray(mnc)) {
        cJSON_DeleteItemFromObjectCaseSensitive(q, "modules_to_not_convert");
        mnc = cJSON_AddArrayToObject(q, "modules_to_not_convert");
        if (!mnc) return QD_ENOMEM;
    }
    if (cJSON_IsString(method) && !strcmp(method->valuestring, "gptq")) {
        dyn = cJSON_GetObjectItemCaseSensitive(q, "dynamic");
        if (!dyn && !(dyn = cJSON_AddObjectToObject(q, "dynamic"))) return QD_ENOMEM;
    }
    char esc[200], buf[300];
    for (size_t i = 0; i < n_roots; i++) {
        qd_output_regex_escape(roots[i], esc, sizeof esc);
        if (cJSON_IsArray(ign)) {
            snprintf(buf, sizeof buf, "re:(model\\.)?%s\\..*", esc);
            cJSON_AddItemToArray(ign, cJSON_CreateString(buf));
        }
        if (mnc) {
            cJSON_AddItemToArray(mnc, cJSON_CreateString(roots[i]));
            snprintf(buf, sizeof buf, "model.%s", roots[i]);
            cJSON_AddItemToArray(mnc, cJSON_CreateString(buf));
        }
        if (dyn) {
            snprintf(buf, sizeof buf, "-:(model\\.)?%s\\..*", esc);
            cJSON_AddItemToObject(dyn, buf, cJSON_CreateObject());
        }
    }
    return 0;
}

cJSON *qd_output_quant_config(const qp_job *job, const char *const *float_modules, size_t n_float,
                              const char *const *trivial_g_idx, size_t n_trivial, const char *awq_note)
{
    /* The format's own keys, and how it declares the layers left in float, come from its
     * descriptor; "meta" (what quantd did) is common to all. */
    const qd_format *fmt = qd_format_at((size_t)job->format);
    if (!fmt) return NULL;
    qd_fmt_config_in in = {
        .s = {.bits = job->bits, .group_size = job->group_size, .sym = job->sym, .desc_act = job->desc_act,
              .static_groups = job->static_groups},
        .damp_percent = job->damp_percent, .true_sequential = job->true_sequential,
        .float_modules = float_modules, .n_float = n_float, .trivial_g_idx = trivial_g_idx, .n_trivial = n_trivial,
        .scheme = qp_job_scheme(job),
    };
    cJSON *q = fmt->quant_config(&in);
    if (!q) return NULL;
    int v1_asym = fmt->zero_offset > 0 && !job->sym;
    cJSON *meta = cJSON_AddObjectToObject(q, "meta");
    cJSON_AddStringToObject(meta, "quantizer", QUANTD_VERSION_STRING);
    cJSON_AddStringToObject(meta, "method", qp_method_name(job->method));
    cJSON_AddStringToObject(meta, "format", fmt->name);
    if (job->method != QP_METHOD_RTN) {
        cJSON_AddNumberToObject(meta, "calibration_samples", (double)job->calibration.samples);
        cJSON_AddNumberToObject(meta, "calibration_seq_len", (double)job->calibration.seq_len);
    }
    if (v1_asym)
        cJSON_AddStringToObject(meta, "zero_point_rule", "asymmetric zeros kept in [1, 2^bits - 1] so the v1 zero-minus-one encoding never stores -1");
    if (job->layout == QP_LAYOUT_TP_AWARE) {
        cJSON_AddStringToObject(meta, "layout", "tp_aware");
        cJSON_AddNumberToObject(meta, "tp", job->tp);
    }
    if (awq_note && awq_note[0]) cJSON_AddStringToObject(meta, "awq", awq_note);
    return q;
}

const char *qd_output_dtype_name(qd_dtype t)
{
    switch (t) {
    case QD_DTYPE_F32: return "float32";
    case QD_DTYPE_F16: return "float16";
    case QD_DTYPE_BF16: return "bfloat16";
    default: return NULL;
    }
}

qd_dtype qd_output_float_dtype(const st_model *src)
{
    /* The dtype holding the most bytes of floating-point weights, so a checkpoint whose
     * norms alone are F32 (some converters keep them so) still reads as its bulk dtype. */
    uint64_t bytes[QD_DTYPE_COUNT] = {0};
    for (size_t i = 0; i < st_model_count(src); i++) {
        const st_tensor *t = st_model_tensor(src, i);
        if (qd_output_dtype_name(t->dtype)) bytes[t->dtype] += t->end - t->begin;
    }
    qd_dtype best = QD_DTYPE_INVALID;
    static const qd_dtype order[] = {QD_DTYPE_F32, QD_DTYPE_BF16, QD_DTYPE_F16};
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++)
        if (bytes[order[i]] && (best == QD_DTYPE_INVALID || bytes[order[i]] > bytes[best])) best = order[i];
    return best;
}

int qd_output_write_config(const char *src_dir, const char *out_dir, const cJSON *qcfg, qd_dtype float_dtype,
                           qd_err *err)
{
    const char *dtype = qd_output_dtype_name(float_dtype);
    if (!dtype)
        return qd_err_set(err, QD_EINVAL, "output config: the model's weights are %s, not F32, F16 or BF16",
                          qd_dtype_name(float_dtype));
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", src_dir);
    cJSON *cfg = NULL;
    /* Copied keys keep their literals: 10.0 stays 10.0 for loaders that check types. */
    int rc = qd_json_read_object_literal(path, QD_INPUT_JSON, &cfg, err);
    if (rc) return rc;
    cJSON_DeleteItemFromObjectCaseSensitive(cfg, "quantization_config");
    /* Both spellings, equal, naming the dtype the copied float tensors (embeddings, norms,
     * lm_head, linears left in float) are stored in: transformers 5 reads `dtype`, older
     * transformers and vLLM `torch_dtype`. A copied key that disagreed with the tensors, or
     * with the other spelling, would make a loader pick a dtype the file does not hold. */
    cJSON_DeleteItemFromObjectCaseSensitive(cfg, "torch_dtype");
    cJSON_DeleteItemFromObjectCaseSensitive(cfg, "dtype");
    cJSON_AddStringToObject(cfg, "dtype", dtype);
    cJSON_AddStringToObject(cfg, "torch_dtype", dtype);
    cJSON_AddItemToObject(cfg, "quantization_config", cJSON_Duplicate(qcfg, 1));
    char *text = cJSON_Print(cfg);
    cJSON_Delete(cfg);
    if (!text) return qd_err_set(err, QD_ENOMEM, "out of memory");
    snprintf(path, sizeof path, "%s/config.json", out_dir);
    rc = qd_fs_write_atomic(path, text, strlen(text), err);
    free(text);
    if (rc) return rc;
    text = cJSON_Print(qcfg);
    if (!text) return qd_err_set(err, QD_ENOMEM, "out of memory");
    snprintf(path, sizeof path, "%s/quantize_config.json", out_dir);
    rc = qd_fs_write_atomic(path, text, strlen(text), err);
    free(text);
    return rc;
}

int qd_output_copy_aux(const char *src_dir, const char *out_dir, qd_err *err)
{
    static const struct { const char *name; qd_input_kind kind; } files[] = {
        {"tokenizer.json", QD_INPUT_TOKENIZER}, {"tokenizer_config.json", QD_INPUT_JSON},
        {"special_tokens_map.json", QD_INPUT_JSON}, {"tokenizer.model", QD_INPUT_TOKENIZER},
        {"vocab.json", QD_INPUT_TOKENIZER}, {"merges.txt", QD_INPUT_TOKENIZER},
        {"added_tokens.json", QD_INPUT_JSON}, {"generation_config.json", QD_INPUT_JSON}};
    char src[4096], dst[4096];
    int dfd = open(out_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return qd_err_set(err, QD_EIO, "%s: cannot open the output directory: %s", out_dir, strerror(errno));
    int rc = 0;
    for (size_t i = 0; i < sizeof files / sizeof files[0] && !rc; i++) {
        snprintf(src, sizeof src, "%s/%s", src_dir, files[i].name);
        /* Present in any form: a link out of the roots, a FIFO or a device is refused by name
         * (qd_input_copy_at copies regular files only), never skipped. */
        if (!qd_input_exists(src)) continue;
        snprintf(dst, sizeof dst, "%s/%s", out_dir, files[i].name);
        rc = qd_input_copy_at(src, files[i].kind, dfd, files[i].name, dst, err);
    }
    close(dfd);
    return rc;
}
