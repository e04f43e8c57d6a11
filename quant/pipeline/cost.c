/* Per-block cost records (see cost.h). */
#include "quant/pipeline/cost.h"

#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>

static const char *const stage_names[QD_STAGE_COUNT] = {
    "load", "calibrate", "awq_search", "quantize", "pack", "error", "kernel_check", "forward", "checkpoint",
};

const char *qd_stage_name(qd_stage s)
{
    return (unsigned)s < QD_STAGE_COUNT ? stage_names[s] : NULL;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

void qd_block_cost_set_coverage(qd_block_cost *c, int64_t *routed, int n)
{
    c->experts = n > 0 ? n : 0;
    if (n <= 0) return;
    qsort(routed, (size_t)n, sizeof *routed, cmp_i64);
    c->routed_min = routed[0];
    c->routed_median = routed[n / 2];
    c->routed_max = routed[n - 1];
}

cJSON *qd_block_cost_to_json(const qd_block_cost *c)
{
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddNumberToObject(o, "block", c->block);
    cJSON_AddNumberToObject(o, "seconds", c->seconds);
    cJSON *st = cJSON_AddObjectToObject(o, "stages");
    for (int s = 0; st && s < QD_STAGE_COUNT; s++) cJSON_AddNumberToObject(st, stage_names[s], c->stage[s]);
    cJSON_AddNumberToObject(o, "forward_passes", c->forward_passes);
    cJSON_AddNumberToObject(o, "bytes_written", (double)c->bytes_written);
    if (c->experts > 0) {
        cJSON *m = cJSON_AddObjectToObject(o, "moe_coverage");
        if (m) {
            cJSON_AddNumberToObject(m, "experts", c->experts);
            cJSON_AddNumberToObject(m, "min", (double)c->routed_min);
            cJSON_AddNumberToObject(m, "median", (double)c->routed_median);
            cJSON_AddNumberToObject(m, "max", (double)c->routed_max);
        }
    }
    if (!st) { cJSON_Delete(o); return NULL; }
    return o;
}

static double num(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : 0.0;
}

void qd_block_cost_from_json(const cJSON *o, qd_block_cost *c)
{
    memset(c, 0, sizeof *c);
    c->block = (int)num(o, "block");
    c->seconds = num(o, "seconds");
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(o, "stages");
    for (int s = 0; s < QD_STAGE_COUNT; s++) c->stage[s] = num(st, stage_names[s]);
    c->forward_passes = (int)num(o, "forward_passes");
    c->bytes_written = (uint64_t)num(o, "bytes_written");
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(o, "moe_coverage");
    if (cJSON_IsObject(m)) {
        c->experts = (int)num(m, "experts");
        c->routed_min = (int64_t)num(m, "min");
        c->routed_median = (int64_t)num(m, "median");
        c->routed_max = (int64_t)num(m, "max");
    }
}
