/* quantctl dequant: every linear of every block as the model loader decodes it (a packed
 * checkpoint through its format descriptor's read() and dequant_ref), written as F32
 * tensors "<block prefix><linear>.weight" [N, K] in one safetensors file. This is "quantd's
 * own dequantization" that tests/formats/ct_check.py compares, weight by weight, with what
 * the compressed-tensors package decompresses from the same checkpoint.
 *
 *   quantctl dequant --model DIR --out FILE.safetensors [--threads T] */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/quantctl.h"
#include "quant/backend/backend.h"
#include "quant/core/safetensors.h"
#include "quant/model/block.h"
#include "quant/model/model.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: quantctl dequant --model DIR --out FILE.safetensors [--threads T]\n"
               "  --model DIR     HF checkpoint, float or quantized in any format of the format table\n"
               "  --out FILE      safetensors with every block linear's weight decoded to F32 [N, K]\n"
               "  --threads T     CPU threads (default 2)\n");
}

int cmd_dequant(int argc, char **argv, const qd_runtime_opts *rt)
{
    const char *model = NULL, *out = NULL;
    long threads = 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return QCTL_OK; }
        if (i + 1 >= argc) { fprintf(stderr, "quantctl dequant: %s needs a value (see --help)\n", a); return QCTL_USAGE; }
        const char *v = argv[++i];
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--threads")) {
            char *end;
            errno = 0;
            threads = strtol(v, &end, 10);
            if (errno || *end || threads < 1 || threads > 1024) {
                fprintf(stderr, "quantctl dequant: --threads: '%s' is not an integer in 1..1024\n", v);
                return QCTL_USAGE;
            }
        } else {
            fprintf(stderr, "quantctl dequant: unknown option '%s' (see --help)\n", a);
            return QCTL_USAGE;
        }
    }
    if (!model || !out) { fprintf(stderr, "quantctl dequant: --model and --out are required\n"); return QCTL_USAGE; }
    qd_err err = {0};
    qd_backend *be = NULL;
    qd_model *m = NULL;
    st_writer *w = NULL;
    int rc;
    if ((rc = qd_backend_cpu_open((int)threads, rt, &be, &err)) || (rc = qd_model_open(model, be, &m, &err))) {
        fprintf(stderr, "quantctl dequant: %s\n", err.msg);
        qd_backend_close(be);
        return QCTL_USAGE;
    }
    if ((rc = st_writer_init(&w))) qd_err_set(&err, rc, "out of memory");
    const int nl = qd_model_n_linears(m);
    int written = 0;
    for (int b = 0; !rc && b < (int)qd_model_cfg(m)->n_layers; b++) {
        qd_block_weights *bw = NULL;
        if ((rc = qd_block_load(m, b, &bw, &err))) break;
        char prefix[160], name[320];
        qd_model_block_prefix(m, b, prefix, sizeof prefix);
        for (int li = 0; !rc && li < nl; li++) {
            const qd_linear_info *L = qd_model_linear(m, li);
            if (!qd_model_block_has_linear(m, b, li)) continue;   /* DeepSeek: dense or MoE layer */
            float *host = malloc((size_t)(L->n * L->k) * sizeof *host);
            if (!host) { rc = qd_err_set(&err, QD_ENOMEM, "out of memory"); break; }
            rc = qd_block_linear_get(m, bw, li, host, NULL, &err);
            snprintf(name, sizeof name, "%s%s.weight", prefix, L->name);
            int64_t shape[2] = {L->n, L->k};
            if (!rc) rc = st_writer_add_copy(w, name, QD_DTYPE_F32, 2, shape, host, &err);
            if (!rc) written++;
            free(host);
        }
        qd_block_free(m, bw);
    }
    if (!rc) rc = st_writer_write(w, out, &err);
    st_writer_free(w);
    qd_model_close(m);
    qd_backend_close(be);
    if (rc) {
        fprintf(stderr, "quantctl dequant: %s\n", err.msg);
        return QCTL_FAIL;
    }
    printf("{\"out\":\"%s\",\"linears\":%d}\n", out, written);
    return QCTL_OK;
}
