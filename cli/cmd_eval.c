/* quantctl eval: perplexity of a float or quantized (gptq, gptq_v2, awq) checkpoint.
 *
 *   quantctl eval --model DIR (--text FILE | --tokens FILE) --seq-len N
 *                 [--max-windows M] [--threads T] [--batch-rows R] [--act-mib A] [--ref-model DIR]
 *                 [--backend cpu|cuda:N]
 *
 * --text is read as one string and tokenized once with the model's tokenizer, BOS first
 * exactly when the tokenizer adds it by default (qd_eval_text_tokens, the job's eval rule);
 * --tokens is a pre-tokenized file (JSON ids, {"tokens": [...]}, or .bin). The stream is cut
 * into consecutive windows of N tokens (remainder dropped) and evaluated the GPTQ way
 * (quant/model/eval.h). One JSON line goes to stdout:
 *   {"ppl":..., "mean_nll":..., "tokens":..., "predicted":..., "windows":..., "seq_len":...,
 *    "seconds":..., "tokens_per_s":..., "model":"...", "arch":"...", "quant":"..."} */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/quantctl.h"
#include "quant/backend/backend.h"
#include "quant/model/eval.h"
#include "quant/model/model.h"
#include "quant/model/token_file.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: quantctl eval --model DIR (--text FILE | --tokens FILE) --seq-len N\n"
               "                     [--max-windows M] [--threads T] [--batch-rows R] [--act-mib A]\n"
               "                     [--ref-model DIR] [--backend cpu|cuda:N]\n"
               "  --model DIR        HF checkpoint (config.json + safetensors), float or GPTQ/AWQ\n"
               "  --text FILE        UTF-8 text, tokenized once with the model's tokenizer (BOS first when\n"
               "                     the tokenizer adds one by default, as transformers does)\n"
               "  --tokens FILE      token ids: JSON array, {\"tokens\": [...]}, or raw uint32 .bin\n"
               "  --seq-len N        window length (<= max_position_embeddings)\n"
               "  --max-windows M    evaluate only the first M windows\n"
               "  --threads T        CPU threads (default 2)\n"
               "  --backend B        cpu (default) or cuda:N\n"
               "  --batch-rows R     tokens per batch (default 4096)\n"
               "  --act-mib A        MiB of hidden states held while each block is loaded once for\n"
               "                     all of them (default 1024); a longer stream takes several passes\n"
               "  --ref-model DIR    also run DIR (e.g. the float model) on the same windows and report\n"
               "                     ref_ppl, kl_mean / kl_max (KL(P_ref || P) per token, nats) and top1_agree\n");
}

static int parse_i64(const char *opt, const char *s, long long min, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || end == s || v < min) {
        fprintf(stderr, "quantctl eval: %s: '%s' is not an integer >= %lld\n", opt, s, min);
        return -1;
    }
    *out = v;
    return 0;
}

int cmd_eval(int argc, char **argv, const qd_runtime_opts *rt)
{
    const char *model = NULL, *text = NULL, *tokens = NULL, *refdir = NULL, *backend = "cpu";
    long long seq = 0, maxw = 0, threads = 2, brows = 0, act_mib = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return QCTL_OK; }
        if (i + 1 >= argc) { fprintf(stderr, "quantctl eval: %s needs a value\n", a); usage(stderr); return QCTL_USAGE; }
        const char *v = argv[++i];
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--text")) text = v;
        else if (!strcmp(a, "--ref-model")) refdir = v;
        else if (!strcmp(a, "--tokens")) tokens = v;
        else if (!strcmp(a, "--backend")) backend = v;
        else if (!strcmp(a, "--seq-len")) { if (parse_i64(a, v, 2, &seq)) return QCTL_USAGE; }
        else if (!strcmp(a, "--max-windows")) { if (parse_i64(a, v, 0, &maxw)) return QCTL_USAGE; }
        else if (!strcmp(a, "--threads")) { if (parse_i64(a, v, 1, &threads)) return QCTL_USAGE; }
        else if (!strcmp(a, "--batch-rows")) { if (parse_i64(a, v, 1, &brows)) return QCTL_USAGE; }
        else if (!strcmp(a, "--act-mib")) { if (parse_i64(a, v, 1, &act_mib)) return QCTL_USAGE; }
        else { fprintf(stderr, "quantctl eval: unknown option '%s'\n", a); usage(stderr); return QCTL_USAGE; }
    }
    if (!model || !seq || (!text == !tokens)) {
        fprintf(stderr, "quantctl eval: --model, --seq-len and exactly one of --text / --tokens are required\n");
        usage(stderr);
        return QCTL_USAGE;
    }
    qd_err err = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = text ? qd_eval_text_tokens(model, text, &ids, &n, &err) : qd_token_file_read(tokens, &ids, &n, &err);
    if (rc) { fprintf(stderr, "quantctl eval: %s\n", err.msg); free(ids); return QCTL_USAGE; }

    qd_backend *be = NULL;
    qd_model *m = NULL, *ref = NULL;
    if ((rc = !strcmp(backend, "cpu") ? qd_backend_cpu_open((int)threads, rt, &be, &err)
                                      : qd_backend_open(backend, rt, &be, &err)) ||
        (rc = qd_model_open(model, be, &m, &err)) ||
        (refdir && (rc = qd_model_open(refdir, be, &ref, &err)))) {
        fprintf(stderr, "quantctl eval: %s\n", err.msg);
        free(ids);
        qd_model_close(m);
        qd_backend_close(be);
        return rc == QD_EIO || rc == QD_ENOMEM || rc == QD_EBACKEND ? QCTL_FAIL : QCTL_USAGE;
    }
    qd_eval_opts o = qd_eval_opts_default(seq);
    o.max_windows = maxw;
    o.batch_rows = brows;
    o.act_bytes = (uint64_t)act_mib << 20;
    qd_eval_result r;
    rc = qd_eval_ppl_vs(m, ref, ids, n, &o, &r, &err);
    int status = QCTL_OK;
    if (rc) {
        fprintf(stderr, "quantctl eval: %s\n", err.msg);
        status = rc == QD_EINVAL ? QCTL_USAGE : QCTL_FAIL;
    } else {
        const qd_model_config *c = qd_model_cfg(m);
        printf("{\"ppl\":%.6f,\"mean_nll\":%.8f,\"tokens\":%lld,\"predicted\":%lld,\"windows\":%lld,\"seq_len\":%lld,"
               "\"seconds\":%.3f,\"tokens_per_s\":%.1f,\"threads\":%lld,\"stream_tokens\":%zu,\"arch\":\"%s\",\"quant\":\"%s\",\"backend\":\"%s\"",
               r.ppl, r.mean_nll, (long long)r.tokens, (long long)r.predicted, (long long)r.windows, (long long)r.seq_len,
               r.seconds, r.seconds > 0 ? (double)r.tokens / r.seconds : 0.0, threads, n, c->architecture,
               c->quantized ? c->quant_format : "none", backend);
        if (r.has_ref)
            printf(",\"ref_ppl\":%.6f,\"kl_mean\":%.8f,\"kl_max\":%.6f,\"top1_agree\":%.6f",
                   r.ref_ppl, r.kl_mean, r.kl_max, r.top1_agree);
        printf("}\n");
        fflush(stdout);
    }
    qd_model_close(ref);
    qd_model_close(m);
    qd_backend_close(be);
    free(ids);
    return status;
}
