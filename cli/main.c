/* quantctl entry point: finds the command in the table and runs it. */
#include <stdio.h>
#include <string.h>

#include "cli/quantctl.h"
#include "startup/runtime_env.h"

static const qctl_command commands[] = {
    {"layer", "quantize one linear layer (GPTQ, AWQ or RTN) and pack it", cmd_layer},
    {"gen-layer", "generate a test linear layer and correlated calibration inputs", cmd_gen_layer},
    {"tokenize", "tokenize text with a model's tokenizer", cmd_tokenize},
    {"eval", "measure perplexity of a float or quantized model", cmd_eval},
    {"quantize", "run a quantization job (JSON spec) in the foreground, resumable", cmd_quantize},
    {"estimate", "a job's pre-flight estimate: peak RAM, disk, activations (--json)", cmd_estimate},
    {"submit", "submit a job to the daemon's queue (flags or a JSON file; Redis or HTTP)", cmd_submit},
    {"status", "show a job's status, or every job's", cmd_status},
    {"watch", "follow a job's progress until it finishes", cmd_watch},
    {"cancel", "cancel a queued or running job", cmd_cancel},
    {"list", "list jobs (--state S to filter)", cmd_list},
    {"gen-model", "write a small random llama or OPT model (for demos and tests)", cmd_gen_model},
    {"logits", "write a model's float32 logits for a token sequence (for comparisons)", cmd_logits},
    {"check-serving", "which vLLM kernel serves each layer of a checkpoint at a TP degree (--gpu, --tp)", cmd_check_serving},
    {"dequant", "write every block linear as the loader decodes it (F32 safetensors, for comparisons)", cmd_dequant},
    {"tp-sim", "simulate N tensor-parallel ranks on one MLP: naive vs TP-aware layout", cmd_tp_sim},
    {"selftest", "check the dequantizing kernels against the reference (--device cpu|cuda:N)", cmd_selftest},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: quantctl COMMAND [options]   (quantctl COMMAND --help for each)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\nexit status: 0 success, 1 the work failed, 2 bad usage or bad input\n");
}

int main(int argc, char **argv)
{
    qd_runtime_opts rt;
    qst_startup(argv, &rt);
    if (argc < 2) { usage(stderr); return QCTL_USAGE; }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return QCTL_OK;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 1, argv + 1, &rt);
    fprintf(stderr, "quantctl: unknown command '%s' (see quantctl --help)\n", argv[1]);
    return QCTL_USAGE;
}
