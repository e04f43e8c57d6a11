/* quantctl logits: the model's own forward over one token sequence, written as raw float32
 * logits, so that other implementations (the Python loaders of tests/interop/) can be
 * compared with ours token by token.
 *
 *   quantctl logits --model DIR --tokens FILE --out FILE [--first N] [--threads T]
 *
 * The ids (any form quant/model/token_file.h reads) are one sequence at positions 0..n-1
 * (the first N only with --first). A quantized checkpoint is dequantized through the format
 * table when its blocks load, so this is "our dequantized forward". The output is
 * little-endian float32 [n, vocab], row-major; one JSON line on stdout gives the shape. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/quantctl.h"
#include "quant/backend/backend.h"
#include "quant/model/model.h"
#include "quant/model/token_file.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: quantctl logits --model DIR --tokens FILE --out FILE [--first N] [--threads T]\n"
               "  --model DIR     HF checkpoint (config.json + safetensors), float or GPTQ/AWQ\n"
               "  --tokens FILE   token ids: JSON array, {\"tokens\": [...]}, or raw uint32 .bin\n"
               "  --out FILE      raw little-endian float32 logits [tokens, vocab]\n"
               "  --first N       use only the first N ids (default all)\n"
               "  --threads T     CPU threads (default 2)\n");
}

static int parse_pos(const char *opt, const char *s, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || end == s || v < 1) {
        fprintf(stderr, "quantctl logits: %s: '%s' is not a positive integer\n", opt, s);
        return -1;
    }
    *out = v;
    return 0;
}

/* Writes n floats to path; returns 0 or -1 with the reason on stderr. */
static int write_f32(const char *path, const float *x, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "quantctl logits: cannot create %s: %s\n", path, strerror(errno));
        return -1;
    }
    size_t w = fwrite(x, sizeof *x, n, f);
    if (fclose(f) != 0 || w != n) {
        fprintf(stderr, "quantctl logits: writing %s failed: %s\n", path, strerror(errno));
        return -1;
    }
    return 0;
}

int cmd_logits(int argc, char **argv, const qd_runtime_opts *rt)
{
    const char *model = NULL, *tokens = NULL, *out = NULL;
    long long first = 0, threads = 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return QCTL_OK; }
        if (i + 1 >= argc) { fprintf(stderr, "quantctl logits: %s needs a value\n", a); usage(stderr); return QCTL_USAGE; }
        const char *v = argv[++i];
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--tokens")) tokens = v;
        else if (!strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--first")) { if (parse_pos(a, v, &first)) return QCTL_USAGE; }
        else if (!strcmp(a, "--threads")) { if (parse_pos(a, v, &threads)) return QCTL_USAGE; }
        else { fprintf(stderr, "quantctl logits: unknown option '%s'\n", a); usage(stderr); return QCTL_USAGE; }
    }
    if (!model || !tokens || !out) {
        fprintf(stderr, "quantctl logits: --model, --tokens and --out are required\n");
        usage(stderr);
        return QCTL_USAGE;
    }
    qd_err err = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = qd_token_file_read(tokens, &ids, &n, &err);
    if (rc) { fprintf(stderr, "quantctl logits: %s\n", err.msg); free(ids); return QCTL_USAGE; }
    if (first && (size_t)first < n) n = (size_t)first;
    if (n == 0) { fprintf(stderr, "quantctl logits: %s holds no token ids\n", tokens); free(ids); return QCTL_USAGE; }

    qd_backend *be = NULL;
    qd_model *m = NULL;
    if ((rc = qd_backend_cpu_open((int)threads, rt, &be, &err)) || (rc = qd_model_open(model, be, &m, &err))) {
        fprintf(stderr, "quantctl logits: %s\n", err.msg);
        free(ids);
        qd_backend_close(be);
        return rc == QD_EIO || rc == QD_ENOMEM || rc == QD_EBACKEND ? QCTL_FAIL : QCTL_USAGE;
    }
    const qd_model_config *c = qd_model_cfg(m);
    int status = QCTL_OK;
    size_t vocab = (size_t)c->vocab;
    float *logits = malloc(n * vocab * sizeof *logits);
    if (!logits) {
        fprintf(stderr, "quantctl logits: out of memory for %zu x %zu logits\n", n, vocab);
        status = QCTL_FAIL;
    } else if ((rc = qd_model_forward(m, ids, 1, (int64_t)n, logits, &err))) {
        fprintf(stderr, "quantctl logits: %s\n", err.msg);
        status = rc == QD_EINVAL ? QCTL_USAGE : QCTL_FAIL;
    } else if (write_f32(out, logits, n * vocab)) {
        status = QCTL_FAIL;
    } else {
        printf("{\"tokens\":%zu,\"vocab\":%zu,\"out\":\"%s\",\"quant\":\"%s\"}\n", n, vocab, out,
               c->quantized ? c->quant_format : "none");
    }
    free(logits);
    qd_model_close(m);
    qd_backend_close(be);
    free(ids);
    return status;
}
