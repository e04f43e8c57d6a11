/* Checkpoint state and model fingerprints (see state.h). */
#include "quant/pipeline/state.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <cjson/cJSON.h>

#include "quant/core/confine.h"
#include "quant/core/fsutil.h"
#include "quant/core/jsonfile.h"
#include "quant/job/hash.h"
#include "quant/pipeline/admission.h"
#include "quant/pipeline/pipeline.h"

void qd_state_init(qd_ckpt_state *s)
{
    memset(s, 0, sizeof *s);
    s->version = QD_STATE_VERSION;
}

void qd_state_free(qd_ckpt_state *s)
{
    if (!s) return;
    free(s->layers);
    s->layers = NULL;
    s->n_layers = s->cap_layers = 0;
    free(s->blocks);
    s->blocks = NULL;
    s->n_blocks_cost = s->cap_blocks_cost = 0;
}

int qd_state_add_layer(qd_ckpt_state *s, const qd_layer_result *r)
{
    if (s->n_layers == s->cap_layers) {
        size_t cap = s->cap_layers ? 2 * s->cap_layers : 16;
        qd_layer_result *l = realloc(s->layers, cap * sizeof *l);
        if (!l) return QD_ENOMEM;
        s->layers = l;
        s->cap_layers = cap;
    }
    s->layers[s->n_layers++] = *r;
    return 0;
}

int qd_state_add_block_cost(qd_ckpt_state *s, const qd_block_cost *c)
{
    for (size_t i = 0; i < s->n_blocks_cost; i++)
        if (s->blocks[i].block == c->block) { s->blocks[i] = *c; return 0; }
    if (s->n_blocks_cost == s->cap_blocks_cost) {
        size_t cap = s->cap_blocks_cost ? 2 * s->cap_blocks_cost : 16;
        qd_block_cost *b = realloc(s->blocks, cap * sizeof *b);
        if (!b) return QD_ENOMEM;
        s->blocks = b;
        s->cap_blocks_cost = cap;
    }
    s->blocks[s->n_blocks_cost++] = *c;
    return 0;
}

static void copy_str(char *dst, size_t cap, const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    dst[0] = 0;
    if (cJSON_IsString(v) && v->valuestring) snprintf(dst, cap, "%s", v->valuestring);
}

static double get_num(const cJSON *o, const char *key, double def)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsBool(v)) return cJSON_IsTrue(v) ? 1.0 : 0.0;   /* fallback, kernel_checked are written as bools */
    return cJSON_IsNumber(v) ? v->valuedouble : def;
}

/* A byte count: def when absent, 0 for a negative or non-finite number (a hand-edited file). */
static uint64_t get_bytes(const cJSON *o, const char *key, uint64_t def)
{
    double v = get_num(o, key, (double)def);
    return v >= 0 && v < 1.8e19 ? (uint64_t)v : 0;
}

int qd_state_load(const char *path, qd_ckpt_state *s, qd_err *err)
{
    cJSON *root = NULL;
    qd_state_init(s);
    int rc = qd_json_read_object(path, QD_INPUT_JSON, &root, err);
    if (rc) return rc;
    s->version = (int)get_num(root, "version", -1);
    if (s->version != QD_STATE_VERSION) {
        cJSON_Delete(root);
        return qd_err_set(err, QD_EMISMATCH, "%s: checkpoint state version %d, this build reads %d", path, s->version, QD_STATE_VERSION);
    }
    const cJSON *fp = cJSON_GetObjectItemCaseSensitive(root, "fingerprint");
    copy_str(s->fp.model, sizeof s->fp.model, fp, "model");
    copy_str(s->fp.options, sizeof s->fp.options, fp, "options");
    copy_str(s->fp.calib, sizeof s->fp.calib, fp, "calib");
    copy_str(s->fp.backend, sizeof s->fp.backend, fp, "backend");
    s->next_block = (int)get_num(root, "next_block", -1);
    s->n_blocks = (int)get_num(root, "n_blocks", -1);
    s->acts_block = (int)get_num(root, "acts_block", s->next_block);
    s->cross_backend = (int)get_num(root, "cross_backend", 0);
    s->seconds = get_num(root, "seconds", 0);
    copy_str(s->awq_note, sizeof s->awq_note, root, "awq_note");
    s->fence = (uint64_t)get_num(root, "fence", 0);
    s->peak_rss_bytes = get_bytes(root, "peak_rss_bytes", 0);
    s->peak_disk_bytes = get_bytes(root, "peak_disk_bytes", 0);
    copy_str(s->compute, sizeof s->compute, root, "compute");
    if (s->compute[0] && strcmp(s->compute, "f32") != 0 && strcmp(s->compute, "bf16") != 0) {
        cJSON_Delete(root);
        return qd_err_set(err, QD_EFORMAT, "%s: compute \"%s\" is neither f32 nor bf16", path, s->compute);
    }
    if (s->next_block < 0 || s->n_blocks <= 0 || s->next_block > s->n_blocks || !s->fp.model[0] ||
        s->acts_block < 0 || s->acts_block > s->next_block) {
        cJSON_Delete(root);
        return qd_err_set(err, QD_EFORMAT, "%s: incomplete checkpoint state", path);
    }
    const cJSON *layers = cJSON_GetObjectItemCaseSensitive(root, "layers"), *l;
    cJSON_ArrayForEach(l, layers) {
        qd_layer_result r;
        memset(&r, 0, sizeof r);
        copy_str(r.name, sizeof r.name, l, "name");
        copy_str(r.method, sizeof r.method, l, "method");
        copy_str(r.note, sizeof r.note, l, "note");
        copy_str(r.worker, sizeof r.worker, l, "worker");
        r.n_parts = (int)get_num(l, "parts", 0);
        r.part_seconds_max = get_num(l, "part_seconds_max", 0);
        r.block = (int)get_num(l, "block", 0);
        r.n = (int64_t)get_num(l, "n", 0);
        r.k = (int64_t)get_num(l, "k", 0);
        r.damp = get_num(l, "damp", 0);
        r.fallback = (int)get_num(l, "fallback", 0);
        r.rel_error = get_num(l, "rel_error", 0);
        r.rel_error_direct = get_num(l, "rel_error_direct", -1);
        r.seconds = get_num(l, "seconds", 0);
        r.kernel_checked = (int)get_num(l, "kernel_checked", 0);
        r.kernel_max_err = get_num(l, "kernel_max_err", 0);
        r.routed_tokens = (int64_t)get_num(l, "routed_tokens", -1);
        if (qd_state_add_layer(s, &r)) { cJSON_Delete(root); return qd_err_set(err, QD_ENOMEM, "out of memory"); }
    }
    /* Per-block costs (absent in checkpoints written before they were kept). */
    const cJSON *blocks = cJSON_GetObjectItemCaseSensitive(root, "blocks"), *b;
    cJSON_ArrayForEach(b, blocks) {
        qd_block_cost c;
        qd_block_cost_from_json(b, &c);
        if (qd_state_add_block_cost(s, &c)) { cJSON_Delete(root); return qd_err_set(err, QD_ENOMEM, "out of memory"); }
    }
    cJSON_Delete(root);
    return 0;
}

cJSON *qd_layer_result_to_json(const qd_layer_result *r)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "name", r->name);
    cJSON_AddStringToObject(o, "method", r->method);
    cJSON_AddNumberToObject(o, "block", r->block);
    cJSON_AddNumberToObject(o, "n", (double)r->n);
    cJSON_AddNumberToObject(o, "k", (double)r->k);
    qd_json_add_exact(o, "damp", r->damp);
    cJSON_AddBoolToObject(o, "fallback", r->fallback);
    qd_json_add_exact(o, "rel_error", r->rel_error);
    if (r->rel_error_direct >= 0) qd_json_add_exact(o, "rel_error_direct", r->rel_error_direct);
    cJSON_AddNumberToObject(o, "seconds", r->seconds);
    cJSON_AddBoolToObject(o, "kernel_checked", r->kernel_checked);
    qd_json_add_exact(o, "kernel_max_err", r->kernel_max_err);
    if (r->note[0]) cJSON_AddStringToObject(o, "note", r->note);
    if (r->routed_tokens >= 0) cJSON_AddNumberToObject(o, "routed_tokens", (double)r->routed_tokens);
    if (r->worker[0]) cJSON_AddStringToObject(o, "worker", r->worker);
    if (r->n_parts > 1) {
        cJSON_AddNumberToObject(o, "parts", r->n_parts);
        cJSON_AddNumberToObject(o, "part_seconds_max", r->part_seconds_max);
    }
    return o;
}

int qd_state_progress(const char *output, int *next_block, int *n_blocks, qd_err *err)
{
    char path[4200];
    if (snprintf(path, sizeof path, "%s/.quantd/state.json", output) >= (int)sizeof path)
        return qd_err_set(err, QD_EINVAL, "%s: the output path is too long", output);
    qd_ckpt_state s;
    int rc = qd_state_load(path, &s, err);
    if (rc == 0) {
        *next_block = s.next_block;
        *n_blocks = s.n_blocks;
    }
    qd_state_free(&s);
    return rc;
}

int qd_state_save(const char *path, const qd_ckpt_state *s, qd_err *err)
{
    cJSON *root = cJSON_CreateObject();
    if (!root) return qd_err_set(err, QD_ENOMEM, "out of memory");
    cJSON_AddNumberToObject(root, "version", QD_STATE_VERSION);
    cJSON *fp = cJSON_AddObjectToObject(root, "fingerprint");
    cJSON_AddStringToObject(fp, "model", s->fp.model);
    cJSON_AddStringToObject(fp, "options", s->fp.options);
    cJSON_AddStringToObject(fp, "calib", s->fp.calib);
    cJSON_AddStringToObject(fp, "backend", s->fp.backend);
    cJSON_AddNumberToObject(root, "next_block", s->next_block);
    cJSON_AddNumberToObject(root, "n_blocks", s->n_blocks);
    cJSON_AddNumberToObject(root, "acts_block", s->acts_block);
    cJSON_AddNumberToObject(root, "cross_backend", s->cross_backend);
    cJSON_AddNumberToObject(root, "seconds", s->seconds);
    cJSON_AddStringToObject(root, "awq_note", s->awq_note);
    cJSON_AddNumberToObject(root, "fence", (double)s->fence);
    cJSON_AddNumberToObject(root, "peak_rss_bytes", (double)s->peak_rss_bytes);
    cJSON_AddNumberToObject(root, "peak_disk_bytes", (double)s->peak_disk_bytes);
    if (s->compute[0]) cJSON_AddStringToObject(root, "compute", s->compute);
    cJSON *arr = cJSON_AddArrayToObject(root, "layers");
    for (size_t i = 0; i < s->n_layers; i++) cJSON_AddItemToArray(arr, qd_layer_result_to_json(&s->layers[i]));
    cJSON *blocks = cJSON_AddArrayToObject(root, "blocks");
    for (size_t i = 0; i < s->n_blocks_cost; i++) cJSON_AddItemToArray(blocks, qd_block_cost_to_json(&s->blocks[i]));
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!text) return qd_err_set(err, QD_ENOMEM, "out of memory");
    int rc = qd_fs_write_atomic(path, text, strlen(text), err);
    free(text);
    return rc;
}

int qd_fingerprint_check(const qd_fingerprint *have, const qd_fingerprint *want, qd_err *err)
{
    if (strcmp(have->model, want->model) != 0)
        return qd_err_set(err, QD_EMISMATCH, "checkpoint was made from different model files (fingerprint %.12s, now %.12s); remove the output directory or set \"overwrite\": true", have->model, want->model);
    if (strcmp(have->options, want->options) != 0)
        return qd_err_set(err, QD_EMISMATCH, "checkpoint was made with different job options (bits, group size, method, calibration settings, ...); resubmit the original job or set \"overwrite\": true");
    if (strcmp(have->calib, want->calib) != 0)
        return qd_err_set(err, QD_EMISMATCH, "checkpoint was made with different calibration data; restore the original data or set \"overwrite\": true");
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int hash_file_edges(qp_sha256 *h, const char *path, const char *name, qd_err *err)
{
    int fd;
    uint64_t size;
    int rc = qd_input_open(path, QD_INPUT_WEIGHTS, &fd, &size, err);
    if (rc) return rc;
    FILE *f = fdopen(fd, "rb");
    if (!f) { close(fd); return qd_err_set(err, QD_ENOMEM, "%s: %s", path, strerror(errno)); }
    qp_sha256_update(h, name, strlen(name) + 1);
    qp_sha256_update(h, &size, sizeof size);
    enum { EDGE = 1 << 20 };
    static const size_t chunk = EDGE;
    char *buf = malloc(chunk);
    if (!buf) { fclose(f); return qd_err_set(err, QD_ENOMEM, "out of memory"); }
    /* The safetensors header sits at the start, so the first MiB covers it for any model
     * with a header under 1 MiB; larger headers are read whole. */
    uint64_t hdr = 0;
    if (fread(&hdr, 8, 1, f) == 1 && hdr < (1ull << 30)) {
        uint64_t first = 8 + hdr > chunk ? 8 + hdr : chunk;
        if (first > size) first = size;
        fseek(f, 0, SEEK_SET);
        for (uint64_t done = 0; done < first;) {
            size_t want = first - done > chunk ? chunk : (size_t)(first - done);
            size_t got = fread(buf, 1, want, f);
            if (got == 0) break;
            qp_sha256_update(h, buf, got);
            done += got;
        }
    }
    if (size > chunk) {
        fseek(f, (long)(size - chunk), SEEK_SET);
        size_t got = fread(buf, 1, chunk, f);
        qp_sha256_update(h, buf, got);
    }
    free(buf);
    fclose(f);
    return 0;
}

int qd_fingerprint_model_dir(const char *dir, char hex[65], qd_err *err)
{
    qp_sha256 h;
    qp_sha256_init(&h);
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *cfg = NULL;
    size_t len = 0;
    int rc = qd_input_read(path, QD_INPUT_JSON, &cfg, &len, err);
    if (rc) return rc;
    qp_sha256_update(&h, cfg, len);
    free(cfg);
    DIR *d = opendir(dir);
    if (!d) return qd_err_set(err, QD_EIO, "%s: %s", dir, strerror(errno));
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 12 || strcmp(e->d_name + l - 12, ".safetensors") != 0) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            char **nn = realloc(names, cap * sizeof *nn);
            if (!nn) { rc = qd_err_set(err, QD_ENOMEM, "out of memory"); break; }
            names = nn;
        }
        if (!(names[n] = strdup(e->d_name))) { rc = qd_err_set(err, QD_ENOMEM, "out of memory"); break; }
        n++;
    }
    closedir(d);
    if (!rc && n) qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 0; i < n && !rc; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        rc = hash_file_edges(&h, path, names[i], err);
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    if (rc) return rc;
    uint8_t dig[32];
    qp_sha256_final(&h, dig);
    for (int i = 0; i < 32; i++) sprintf(hex + 2 * i, "%02x", dig[i]);
    hex[64] = 0;
    return 0;
}
