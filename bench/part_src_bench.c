/* What a part pays to read its weight rows from the model's own files (quant/pipeline/
 * part_src.c): the checkpoint opened for every part, against kept open from one part to the
 * next, on a checkpoint of many shards. Build and run:
 *
 *   build/me/quantctl gen-model --out /tmp/shard --layers 32 --hidden 256 --intermediate 256 \
 *       --heads 4 --kv-heads 4 --experts 64 --vocab 512 --dtype bf16 --shard-size 1MB
 *   gcc -O2 -std=gnu11 -I. -o build/part_src_bench bench/part_src_bench.c build/me/libquant.a \
 *       build/me/libqadmit.a build/me/libqjob.a build/me/libqformats.a build/me/libqcore.a \
 *       $(pkg-config --libs openblas lapacke libcjson libpcre2-8) -lpthread -lm
 *   build/part_src_bench /tmp/shard [READS]     (default 50)
 *
 * Prints the median milliseconds of one part's read, each way. Results: bench/results/parts.md. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "quant/core/safetensors.h"
#include "quant/pipeline/part.h"
#include "quant/pipeline/pipeline.h"

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    if (argc < 2) { fprintf(stderr, "usage: %s MODEL_DIR [READS]\n", argv[0]); return 2; }
    int reads = argc > 2 ? atoi(argv[2]) : 50;
    if (reads < 1 || reads > 100000) reads = 50;
    qd_err err = {0};
    st_model *m = NULL;
    if (st_model_open(argv[1], &m, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    /* The last block's first expert's down projection: a tensor of the last shards. */
    const st_tensor *t = NULL;
    for (size_t i = 0; i < st_model_count(m); i++) {
        const st_tensor *c = st_model_tensor(m, i);
        if (c->ndim == 2 && strstr(c->name, "experts.0.w2") && (!t || strcmp(c->name, t->name) > 0)) t = c;
        if (c->ndim == 2 && !t && strstr(c->name, "down_proj")) t = c;
    }
    if (!t) { fprintf(stderr, "no 2-D tensor to read\n"); return 1; }
    int64_t n = t->shape[0], k = t->shape[1], r1 = n < 64 ? n : 64;
    st_tensor view;
    if (st_tensor_rows(t, 0, r1, &view, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    char json[1024];
    snprintf(json, sizeof json, "{\"src\":\"%s\",\"src_sum\":\"%016llx\"}", t->name,
             (unsigned long long)qd_part_checksum(view.data, (uint64_t)(view.end - view.begin)));
    cJSON *meta = cJSON_Parse(json);
    qp_job job;
    memset(&job, 0, sizeof job);
    job.model = argv[1];
    float *w = malloc((size_t)(n * k) * sizeof *w);
    double *ms = malloc((size_t)reads * sizeof *ms);
    printf("%s: %zu tensors; %lld rows of %s [%lld, %lld]\n", argv[1], st_model_count(m), (long long)r1, t->name,
           (long long)n, (long long)k);
    for (int kept = 0; kept < 2; kept++) {
        qd_pipeline_part_idle();
        for (int i = 0; i < reads; i++) {
            if (!kept) qd_pipeline_part_idle();   /* opened for every part, as before */
            double t0 = now_ms();
            if (qd_qpart_src_read(&job, NULL, meta, 0, r1, n, k, w, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
            ms[i] = now_ms() - t0;
        }
        qsort(ms, (size_t)reads, sizeof *ms, cmp_d);
        printf("%-28s median %.3f ms per part (min %.3f, max %.3f, %d reads)\n",
               kept ? "kept open between parts" : "opened for every part", ms[reads / 2], ms[0], ms[reads - 1], reads);
    }
    qd_pipeline_part_idle();
    cJSON_Delete(meta);
    st_model_close(m);
    free(w);
    free(ms);
    return 0;
}
