/* Sharded checkpoints as HF writes them: which tensors go into which shard, the shard file
 * names, and model.safetensors.index.json. The pipeline's output (quant/pipeline/output.c)
 * and the test-model generator (quant/model/testgen.c) both shard through here, so the two
 * cannot drift apart in naming or in the index they write. */
#include "quant/core/safetensors.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/core/fsutil.h"

static int plan_alloc(size_t n_shards_max, st_shard_plan *p)
{
    memset(p, 0, sizeof *p);
    p->start = malloc((n_shards_max + 1) * sizeof *p->start);
    return p->start ? 0 : QD_ENOMEM;
}

int st_shard_plan_by_size(const uint64_t *bytes, size_t n, uint64_t shard_size, st_shard_plan *out)
{
    if (plan_alloc(n ? n : 1, out)) return QD_ENOMEM;
    if (shard_size == 0) shard_size = UINT64_MAX;
    uint64_t cur = 0;
    for (size_t i = 0; i < n; i++) {
        /* transformers' rule: start a new shard when this tensor would overflow the current
         * one, unless the current one is empty (a tensor larger than shard_size then gets a
         * shard of its own). */
        if (i == 0 || (cur > 0 && cur + bytes[i] > shard_size)) {
            out->start[out->n_shards++] = i;
            cur = 0;
        }
        cur += bytes[i];
        out->total_bytes += bytes[i];
    }
    if (n == 0) out->start[out->n_shards++] = 0;
    out->start[out->n_shards] = n;
    return 0;
}

int st_shard_plan_by_count(const uint64_t *bytes, size_t n, size_t n_shards, st_shard_plan *out)
{
    if (n_shards > n) n_shards = n;
    if (n_shards < 1) n_shards = 1;
    if (plan_alloc(n_shards, out)) return QD_ENOMEM;
    out->n_shards = n_shards;
    for (size_t s = 0; s <= n_shards; s++) out->start[s] = s * n / n_shards;
    for (size_t i = 0; i < n; i++) out->total_bytes += bytes[i];
    return 0;
}

void st_shard_plan_free(st_shard_plan *p)
{
    if (!p) return;
    free(p->start);
    memset(p, 0, sizeof *p);
}

void st_shard_file_name(const st_shard_plan *p, size_t s, char *buf, size_t cap)
{
    if (p->n_shards <= 1) snprintf(buf, cap, "model.safetensors");
    else snprintf(buf, cap, "model-%05zu-of-%05zu.safetensors", s + 1, p->n_shards);
}

int st_shard_index_write(const char *dir, const st_shard_plan *p, const char *const *names, qd_err *err)
{
    cJSON *index = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(index, "metadata");
    cJSON_AddNumberToObject(meta, "total_size", (double)p->total_bytes);
    cJSON *map = cJSON_AddObjectToObject(index, "weight_map");
    char fname[64], path[4096];
    for (size_t s = 0; s < p->n_shards; s++) {
        st_shard_file_name(p, s, fname, sizeof fname);
        for (size_t i = p->start[s]; i < p->start[s + 1]; i++) cJSON_AddStringToObject(map, names[i], fname);
    }
    char *text = cJSON_Print(index);
    cJSON_Delete(index);
    if (!text) return qd_err_set(err, QD_ENOMEM, "%s: out of memory writing the shard index", dir);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    int rc = qd_fs_write_atomic(path, text, strlen(text), err);
    free(text);
    return rc;
}
