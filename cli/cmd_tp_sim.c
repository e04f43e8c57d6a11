/* quantctl tp-sim: runs the seed paper's Algorithm 2 (naive: all-gather between the MLP's
 * column- and row-parallel layers) and Algorithm 3 (TP-aware: no all-gather) over N
 * simulated ranks on one MLP of a quantized GPTQ checkpoint, and checks both against the
 * unsharded MLP (quant/tp/tp_sim.h).
 *
 *   quantctl tp-sim --model OUT_DIR --tp N [--layer i] [--rows M] [--seed S]
 *
 * Algorithm 2 runs on the MLP as the checkpoint stores it; Algorithm 3 on the same MLP after
 * the TP-aware permutation (tp_layout.h, in memory; a checkpoint written with layout
 * tp_aware is already permuted, so then both run on the written tensors and the naive one
 * has P2 = identity). Prints one JSON object: errors, the bytes the all-gather moved per
 * token (F32 as simulated, and FP16 as served), and times. Exit 0 when both agree with the
 * unsharded MLP within 1e-4 relative error, 1 otherwise, 2 on bad usage or input. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli/quantctl.h"
#include "quant/backend/backend.h"
#include "quant/core/rng.h"
#include "quant/model/model.h"
#include "quant/tp/tp_sim.h"

static int usage(const char *msg)
{
    fprintf(stderr, "quantctl tp-sim: %s\nusage: quantctl tp-sim --model OUT_DIR --tp N [--layer i] [--rows M] [--seed S]\n", msg);
    return QCTL_USAGE;
}

static double rel_err(const float *a, const float *b, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

int cmd_tp_sim(int argc, char **argv, const qd_runtime_opts *rt)
{
    const char *model = NULL;
    long tp = 0, layer = 0, rows = 4;
    unsigned long long seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (i + 1 >= argc) return usage("every option takes a value");
        char *end = NULL;
        if (!strcmp(a, "--model")) model = argv[++i];
        else if (!strcmp(a, "--tp")) tp = strtol(argv[++i], &end, 10);
        else if (!strcmp(a, "--layer")) layer = strtol(argv[++i], &end, 10);
        else if (!strcmp(a, "--rows")) rows = strtol(argv[++i], &end, 10);
        else if (!strcmp(a, "--seed")) seed = strtoull(argv[++i], &end, 10);
        else return usage("unknown option");
        if (end && *end) return usage("option value is not an integer");
    }
    if (!model) return usage("--model is required");
    if (tp < 1 || tp > 256) return usage("--tp must be in 1..256");
    if (rows < 1 || rows > 4096) return usage("--rows must be in 1..4096");
    qd_err err = {0};
    qd_backend *be = NULL;
    qd_model *m = NULL;
    if (qd_backend_cpu_open(1, rt, &be, &err) || qd_model_open(model, be, &m, &err)) {
        fprintf(stderr, "quantctl tp-sim: %s\n", err.msg);
        qd_backend_close(be);
        return QCTL_USAGE;
    }
    qd_tp_mlp plain, aware;
    int rc = qd_tp_mlp_load(m, (int)layer, (int)tp, &plain, &aware, &err);
    qd_model_close(m);
    if (rc) {
        fprintf(stderr, "quantctl tp-sim: %s\n", err.msg);
        qd_backend_close(be);
        return QCTL_USAGE;
    }
    const int64_t H = plain.hidden, M = rows;
    float *x = malloc((size_t)(M * H) * sizeof *x), *y0 = malloc((size_t)(M * H) * sizeof *x);
    float *y2 = malloc((size_t)(M * H) * sizeof *x), *y3 = malloc((size_t)(M * H) * sizeof *x);
    int status = QCTL_FAIL;
    if (!x || !y0 || !y2 || !y3) {
        fprintf(stderr, "quantctl tp-sim: out of memory\n");
        goto done;
    }
    /* splitmix64 + Box-Muller inputs, reproducible from --seed. */
    uint64_t s = seed;
    for (int64_t i = 0; i < M * H; i++) {
        uint64_t z[2];
        for (int j = 0; j < 2; j++) z[j] = qd_splitmix64(&s);
        double u1 = ((z[0] >> 11) + 1.0) / 9007199254740993.0, u2 = (z[1] >> 11) / 9007199254740992.0;
        x[i] = (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
    }
    qd_tp_comm_stats s2, s3;
    if (qd_tp_mlp_forward_ref(&plain, x, M, y0, &err) || qd_tp_sim_run(QD_TP_ALGO_NAIVE, &plain, (int)tp, x, M, y2, &s2, rt, &err) ||
        qd_tp_sim_run(QD_TP_ALGO_AWARE, &aware, (int)tp, x, M, y3, &s3, rt, &err)) {
        fprintf(stderr, "quantctl tp-sim: %s\n", err.msg);
        goto done;
    }
    double e2 = rel_err(y2, y0, M * H), e3 = rel_err(y3, y0, M * H), e23 = rel_err(y3, y2, M * H);
    int already = 1;
    for (int64_t k = 1; plain.g_idx_down && k < plain.ff; k++) already &= plain.g_idx_down[k] >= plain.g_idx_down[k - 1];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model", model);
    cJSON_AddNumberToObject(o, "layer", (double)layer);
    cJSON_AddNumberToObject(o, "tp", (double)tp);
    cJSON_AddNumberToObject(o, "rows", (double)M);
    cJSON_AddNumberToObject(o, "hidden", (double)H);
    cJSON_AddNumberToObject(o, "intermediate", (double)plain.ff);
    cJSON_AddBoolToObject(o, "checkpoint_already_tp_aware", already);
    cJSON_AddNumberToObject(o, "rel_err_naive_vs_unsharded", e2);
    cJSON_AddNumberToObject(o, "rel_err_tp_aware_vs_unsharded", e3);
    cJSON_AddNumberToObject(o, "rel_err_naive_vs_tp_aware", e23);
    cJSON_AddNumberToObject(o, "naive_allgather_bytes_per_token_f32", (double)s2.allgather_bytes / (double)M);
    cJSON_AddNumberToObject(o, "naive_allgather_bytes_per_token_fp16", (double)qd_tp_allgather_bytes_per_token(plain.ff, (int)tp, 2));
    cJSON_AddNumberToObject(o, "tp_aware_allgather_bytes_per_token", (double)s3.allgather_bytes / (double)M);
    cJSON_AddNumberToObject(o, "allreduce_bytes_per_token_f32", (double)s2.allreduce_bytes / (double)M);
    cJSON_AddNumberToObject(o, "naive_seconds", s2.seconds);
    cJSON_AddNumberToObject(o, "tp_aware_seconds", s3.seconds);
    int ok = e2 < 1e-4 && e3 < 1e-4 && e23 < 1e-4;
    cJSON_AddBoolToObject(o, "ok", ok);
    char *text = cJSON_PrintUnformatted(o);
    if (text) printf("%s\n", text);
    free(text);
    cJSON_Delete(o);
    status = ok ? QCTL_OK : QCTL_FAIL;
done:
    free(x);
    free(y0);
    free(y2);
    free(y3);
    qd_tp_mlp_free(&plain);
    qd_tp_mlp_free(&aware);
    qd_backend_close(be);
    return status;
}
