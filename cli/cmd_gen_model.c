/* quantctl gen-model: writes a small random HF checkpoint (quant/model/testgen.h) for demos
 * and tests on a machine without real models. The weights are seeded, so the same options
 * always give the same files. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/quantctl.h"
#include "quant/model/testgen.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: quantctl gen-model --out DIR [--arch llama|opt] [--layers N] [--hidden H] [--seed S]\n"
               "                         [--intermediate I] [--heads N] [--kv-heads N] [--vocab V]\n"
               "                         [--max-pos P] [--dtype f32|f16|bf16] [--experts E [--top-k K]]\n"
               "Writes config.json + model.safetensors of a random model (default: llama, 2 layers,\n"
               "hidden 64). A 7B-shaped block: --layers 1 --hidden 4096 --intermediate 11008 --heads 32\n"
               "--kv-heads 32 --max-pos 4096 --dtype f16. --experts makes a Mixtral (llama only) of E\n"
               "experts of width --intermediate, K per token (default 2); a Mixtral-8x7B-shaped block:\n"
               "--layers 1 --hidden 4096 --intermediate 14336 --heads 32 --kv-heads 8 --experts 8.\n");
}

int cmd_gen_model(int argc, char **argv, const qd_runtime_opts *rt)
{
    static const struct option opts[] = {
        {"out", required_argument, 0, 'o'}, {"arch", required_argument, 0, 'a'},
        {"layers", required_argument, 0, 'l'}, {"hidden", required_argument, 0, 'H'},
        {"seed", required_argument, 0, 's'}, {"help", no_argument, 0, 'h'},
        {"intermediate", required_argument, 0, 'I'}, {"heads", required_argument, 0, 'N'},
        {"kv-heads", required_argument, 0, 'K'}, {"vocab", required_argument, 0, 'V'},
        {"max-pos", required_argument, 0, 'P'}, {"dtype", required_argument, 0, 'D'},
        {"experts", required_argument, 0, 'E'}, {"top-k", required_argument, 0, 'k'}, {0, 0, 0, 0},
    };
    long inter = 0, heads = 0, kv = 0, vocab = 0, max_pos = 0, experts = 0, top_k = 0;
    const char *dtype = NULL;
    const char *out = NULL, *arch = "llama";
    long layers = 0, hidden = 0, seed = -1;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "o:a:l:H:s:hI:N:K:V:P:D:E:k:", opts, NULL)) != -1) {
        switch (c) {
        case 'I': inter = strtol(optarg, NULL, 10); break;
        case 'N': heads = strtol(optarg, NULL, 10); break;
        case 'K': kv = strtol(optarg, NULL, 10); break;
        case 'V': vocab = strtol(optarg, NULL, 10); break;
        case 'P': max_pos = strtol(optarg, NULL, 10); break;
        case 'D': dtype = optarg; break;
        case 'E': experts = strtol(optarg, NULL, 10); break;
        case 'k': top_k = strtol(optarg, NULL, 10); break;
        case 'o': out = optarg; break;
        case 'a': arch = optarg; break;
        case 'l': layers = strtol(optarg, NULL, 10); break;
        case 'H': hidden = strtol(optarg, NULL, 10); break;
        case 's': seed = strtol(optarg, NULL, 10); break;
        case 'h': usage(stdout); return QCTL_OK;
        default: usage(stderr); return QCTL_USAGE;
        }
    }
    if (!out || optind != argc) { usage(stderr); return QCTL_USAGE; }
    qd_arch_family fam;
    if (!strcmp(arch, "llama")) fam = QD_ARCH_LLAMA;
    else if (!strcmp(arch, "opt")) fam = QD_ARCH_OPT;
    else { fprintf(stderr, "quantctl gen-model: --arch '%s' is not llama or opt\n", arch); return QCTL_USAGE; }
    qd_testgen_opts o = qd_testgen_defaults(fam);
    if (layers < 0 || layers > 64 || hidden < 0 || hidden > 4096 || (hidden && hidden % 32)) {
        fprintf(stderr, "quantctl gen-model: --layers must be 1..64 and --hidden a multiple of 32 up to 4096\n");
        return QCTL_USAGE;
    }
    if (layers) o.n_layers = layers;
    if (hidden) {
        o.hidden = hidden;
        o.intermediate = hidden * 5 / 2 / 32 * 32;
    }
    if (seed >= 0) o.seed = (uint64_t)seed;
    if (inter < 0 || heads < 0 || kv < 0 || vocab < 0 || max_pos < 0 || inter > 65536 || vocab > 1000000 || max_pos > 1 << 20) {
        fprintf(stderr, "quantctl gen-model: sizes must be positive (intermediate <= 65536, vocab <= 1000000)\n");
        return QCTL_USAGE;
    }
    if (inter) o.intermediate = inter;
    if (experts < 0 || experts > 256 || top_k < 0 || top_k > experts || (experts && fam != QD_ARCH_LLAMA)) {
        fprintf(stderr, "quantctl gen-model: --experts must be 0..256 (llama only) and --top-k 1..experts\n");
        return QCTL_USAGE;
    }
    o.n_experts = experts;
    o.top_k = top_k;
    if (heads) { o.n_heads = heads; o.n_kv_heads = heads; }
    if (kv) o.n_kv_heads = kv;
    if (vocab) o.vocab = vocab;
    if (max_pos) o.max_pos = max_pos;
    if (o.hidden % o.n_heads || o.n_heads % o.n_kv_heads) {
        fprintf(stderr, "quantctl gen-model: heads must divide hidden and kv-heads must divide heads\n");
        return QCTL_USAGE;
    }
    if (dtype) {
        if (!strcmp(dtype, "f32")) o.dtype = QD_DTYPE_F32;
        else if (!strcmp(dtype, "f16")) o.dtype = QD_DTYPE_F16;
        else if (!strcmp(dtype, "bf16")) o.dtype = QD_DTYPE_BF16;
        else { fprintf(stderr, "quantctl gen-model: --dtype '%s' is not f32, f16 or bf16\n", dtype); return QCTL_USAGE; }
    }
    qd_err err = {0};
    if (qd_testgen_write(out, &o, &err)) {
        fprintf(stderr, "quantctl gen-model: %s\n", err.msg);
        return QCTL_FAIL;
    }
    printf("%s\n", out);
    return QCTL_OK;
}
