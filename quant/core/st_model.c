/* HuggingFace checkpoints as one set of tensors: a directory holding model.safetensors,
 * or model.safetensors.index.json plus the shards its weight_map names. Every shard is
 * opened and validated up front, every weight_map entry is checked against its shard, and
 * names are looked up by binary search over one name-sorted index across all shards. A
 * directory with only pytorch_model.bin is refused with advice to convert it, since
 * unpickling is both unsafe and out of scope. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE   /* qsort_r */
#endif
#include "quant/core/st_internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "quant/core/confine.h"
#include "quant/core/fsutil.h"

typedef struct st_mentry {
    const st_tensor *t;          /* owned by shards[shard] */
    size_t shard;
} st_mentry;

struct st_model {
    char *dir;                   /* owned */
    st_file **shards;            /* owned */
    char **shard_names;          /* owned basenames, sorted */
    size_t nshards;
    st_mentry *all;              /* owned; shard order, then data order */
    size_t n;
    size_t *by_name;             /* owned indices into all, sorted by tensor name */
};

static char *path_join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

void st_model_close(st_model *m)
{
    if (!m) return;
    for (size_t i = 0; i < m->nshards; i++) {
        st_file_close(m->shards ? m->shards[i] : NULL);
        free(m->shard_names ? m->shard_names[i] : NULL);
    }
    free(m->shards);
    free(m->shard_names);
    free(m->all);
    free(m->by_name);
    free(m->dir);
    free(m);
}

static int cmp_str_ptr(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static long shard_index(const st_model *m, const char *name)
{
    size_t lo = 0, hi = m->nshards;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(m->shard_names[mid], name);
        if (c == 0) return (long)mid;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}

static int cmp_by_name(const void *a, const void *b, void *ctx)
{
    const st_mentry *all = ctx;
    return strcmp(all[*(const size_t *)a].t->name, all[*(const size_t *)b].t->name);
}

/* Lists every tensor of every shard and sorts a name index; a name in two shards is an
 * error, since which copy a loader takes would be arbitrary. */
static int build_index(st_model *m, qd_err *err)
{
    size_t total = 0;
    for (size_t s = 0; s < m->nshards; s++) total += st_file_count(m->shards[s]);
    m->all = malloc((total ? total : 1) * sizeof *m->all);
    m->by_name = malloc((total ? total : 1) * sizeof *m->by_name);
    if (!m->all || !m->by_name) return qd_err_set(err, QD_ENOMEM, "%s: out of memory indexing tensors", m->dir);
    for (size_t s = 0; s < m->nshards; s++)
        for (size_t i = 0; i < st_file_count(m->shards[s]); i++) {
            m->all[m->n].t = st_file_tensor(m->shards[s], i);
            m->all[m->n].shard = s;
            m->by_name[m->n] = m->n;
            m->n++;
        }
    if (m->n) qsort_r(m->by_name, m->n, sizeof *m->by_name, cmp_by_name, m->all);
    for (size_t i = 1; i < m->n; i++) {
        const st_mentry *a = &m->all[m->by_name[i - 1]], *b = &m->all[m->by_name[i]];
        if (strcmp(a->t->name, b->t->name) == 0)
            return qd_err_set(err, QD_EFORMAT, "%s: tensor '%s' appears in both %s and %s", m->dir, a->t->name,
                              m->shard_names[a->shard], m->shard_names[b->shard]);
    }
    return 0;
}

static int open_shard(st_model *m, size_t i, qd_err *err)
{
    char *p = path_join(m->dir, m->shard_names[i]);
    if (!p) return qd_err_set(err, QD_ENOMEM, "%s: out of memory", m->dir);
    int rc = st_file_open(p, &m->shards[i], err);
    free(p);
    return rc;
}

static int open_single(st_model *m, const char *path, qd_err *err)
{
    m->shards = calloc(1, sizeof *m->shards);
    m->shard_names = calloc(1, sizeof *m->shard_names);
    if (!m->shards || !m->shard_names) return qd_err_set(err, QD_ENOMEM, "%s: out of memory", path);
    m->nshards = 1;
    m->shard_names[0] = strdup(base_name(path));
    if (!m->shard_names[0]) return qd_err_set(err, QD_ENOMEM, "%s: out of memory", path);
    int rc = st_file_open(path, &m->shards[0], err);
    if (rc) return rc;
    return build_index(m, err);
}

/* A shard name must be a plain file name in the same directory: an index that says
 * "../x" or "/etc/x" is refused rather than followed. */
static int shard_name_ok(const char *s)
{
    return s[0] && !strchr(s, '/') && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

static int open_index(st_model *m, const char *ipath, qd_err *err)
{
    char *text = NULL;
    size_t len = 0;
    const char **keys = NULL;
    cJSON *root = NULL;
    int rc = qd_input_read(ipath, QD_INPUT_JSON, &text, &len, err);
    if (rc) return rc;
    root = cJSON_ParseWithLength(text, len);
    if (!root || !cJSON_IsObject(root)) {
        rc = qd_err_set(err, QD_EFORMAT, "%s: not a JSON object", ipath);
        goto done;
    }
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(wm)) {
        rc = qd_err_set(err, QD_EFORMAT, "%s: has no \"weight_map\" object", ipath);
        goto done;
    }
    size_t nkeys = (size_t)cJSON_GetArraySize(wm);
    keys = malloc((nkeys ? nkeys : 1) * sizeof *keys);
    char **names = malloc((nkeys ? nkeys : 1) * sizeof *names);
    if (!keys || !names) { free(names); rc = qd_err_set(err, QD_ENOMEM, "%s: out of memory", ipath); goto done; }
    size_t k = 0;
    for (const cJSON *e = wm->child; e; e = e->next) {
        if (!cJSON_IsString(e) || !shard_name_ok(e->valuestring)) {
            free(names);
            rc = qd_err_set(err, QD_EFORMAT, "%s: weight_map entry '%s' is not a shard file name in the same directory",
                            ipath, e->string ? e->string : "");
            goto done;
        }
        keys[k] = e->string;
        names[k++] = e->valuestring;
    }
    /* cJSON keeps duplicate keys, so look for them here. */
    qsort(keys, k, sizeof *keys, cmp_str_ptr);
    for (size_t i = 1; i < k; i++)
        if (strcmp(keys[i - 1], keys[i]) == 0) {
            free(names);
            rc = qd_err_set(err, QD_EFORMAT, "%s: weight_map lists tensor '%s' twice", ipath, keys[i]);
            goto done;
        }
    qsort(names, k, sizeof *names, cmp_str_ptr);
    size_t u = 0;
    for (size_t i = 0; i < k; i++)
        if (u == 0 || strcmp(names[u - 1], names[i]) != 0) names[u++] = names[i];
    m->shards = calloc(u ? u : 1, sizeof *m->shards);
    m->shard_names = calloc(u ? u : 1, sizeof *m->shard_names);
    if (!m->shards || !m->shard_names) { free(names); rc = qd_err_set(err, QD_ENOMEM, "%s: out of memory", ipath); goto done; }
    m->nshards = u;
    for (size_t i = 0; i < u; i++)
        if (!(m->shard_names[i] = strdup(names[i]))) {
            free(names);
            rc = qd_err_set(err, QD_ENOMEM, "%s: out of memory", ipath);
            goto done;
        }
    free(names);
    for (size_t i = 0; i < u; i++)
        if ((rc = open_shard(m, i, err))) {
            if (rc == QD_ENOTFOUND) qd_err_prefix(err, "%s: weight_map names a missing shard", ipath);
            goto done;
        }
    for (const cJSON *e = wm->child; e; e = e->next) {
        long s = shard_index(m, e->valuestring);
        if (s < 0 || !st_file_find(m->shards[s], e->string)) {
            rc = qd_err_set(err, QD_EFORMAT, "%s: weight_map puts tensor '%s' in %s, but that shard has no such tensor",
                            ipath, e->string, e->valuestring);
            goto done;
        }
    }
    rc = build_index(m, err);
done:
    cJSON_Delete(root);
    free(keys);
    free(text);
    return rc;
}

int st_model_open(const char *dir, st_model **out, qd_err *err)
{
    *out = NULL;
    st_model *m = calloc(1, sizeof *m);
    if (!m || !(m->dir = strdup(dir))) { free(m); return qd_err_set(err, QD_ENOMEM, "%s: out of memory", dir); }
    struct stat st;
    int rc;
    char *single = NULL, *index = NULL;
    if (stat(dir, &st) != 0) {
        rc = qd_err_set(err, errno == ENOENT ? QD_ENOTFOUND : QD_EIO, "%s: cannot open model: %s", dir, strerror(errno));
        goto done;
    }
    if (S_ISREG(st.st_mode)) {   /* a lone .safetensors file is a one-shard model */
        rc = open_single(m, dir, err);
        goto done;
    }
    single = path_join(dir, "model.safetensors");
    index = path_join(dir, "model.safetensors.index.json");
    if (!single || !index) { rc = qd_err_set(err, QD_ENOMEM, "%s: out of memory", dir); goto done; }
    /* Same preference as transformers: the single file first, then the index. */
    if (qd_input_exists(single)) rc = open_single(m, single, err);
    else if (qd_input_exists(index)) rc = open_index(m, index, err);
    else {
        char *bin = path_join(dir, "pytorch_model.bin"), *binidx = path_join(dir, "pytorch_model.bin.index.json");
        int has_bin = (bin && qd_fs_exists(bin)) || (binidx && qd_fs_exists(binidx));
        free(bin);
        free(binidx);
        if (has_bin)
            rc = qd_err_set(err, QD_EUNSUPPORTED,
                            "%s: has only pytorch_model.bin; quantd reads safetensors only, so convert the checkpoint to "
                            "safetensors first (e.g. in Python: AutoModelForCausalLM.from_pretrained(dir)"
                            ".save_pretrained(out, safe_serialization=True))", dir);
        else
            rc = qd_err_set(err, QD_ENOTFOUND, "%s: no model.safetensors or model.safetensors.index.json", dir);
    }
done:
    free(single);
    free(index);
    if (rc) { st_model_close(m); return rc; }
    *out = m;
    return 0;
}

size_t st_model_count(const st_model *m) { return m->n; }

const st_tensor *st_model_tensor(const st_model *m, size_t i) { return i < m->n ? m->all[i].t : NULL; }

static const st_mentry *model_find(const st_model *m, const char *name)
{
    size_t lo = 0, hi = m->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const st_mentry *e = &m->all[m->by_name[mid]];
        int c = strcmp(e->t->name, name);
        if (c == 0) return e;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

const st_tensor *st_model_find(const st_model *m, const char *name)
{
    const st_mentry *e = model_find(m, name);
    return e ? e->t : NULL;
}

const char *st_model_shard_of(const st_model *m, const char *name)
{
    const st_mentry *e = model_find(m, name);
    return e ? m->shard_names[e->shard] : NULL;
}

int st_model_read_f32(const st_model *m, const char *name, int ndim, const int64_t *shape,
                      float *dst, qd_err *err)
{
    const st_mentry *e = model_find(m, name);
    if (!e) return qd_err_set(err, QD_ENOTFOUND, "%s: tensor '%s' not found", m->dir, name);
    const st_tensor *t = e->t;
    int same = ndim < 0 || ndim == t->ndim;
    for (int i = 0; same && ndim >= 0 && i < ndim; i++) same = shape[i] == t->shape[i];
    if (!same) {
        char have[160], want[160];
        st_shape_format(t->shape, t->ndim, have, sizeof have);
        st_shape_format(shape, ndim, want, sizeof want);
        return qd_err_set(err, QD_ESHAPE, "%s: tensor '%s' has shape %s but %s was expected", m->shard_names[e->shard],
                          name, have, want);
    }
    int rc = st_tensor_read_f32(t, dst, err);
    if (rc) qd_err_prefix(err, "%s", m->shard_names[e->shard]);
    return rc;
}
