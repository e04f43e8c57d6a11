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
               "Writes config.json + model.safetensors of a small random model (default: llama, 2 layers,\n"
               "hidden 64).\n");
}

int cmd_gen_model(int argc, char **argv)
{
    static const struct option opts[] = {
        {"out", required_argument, 0, 'o'}, {"arch", required_argument, 0, 'a'},
        {"layers", required_argument, 0, 'l'}, {"hidden", required_argument, 0, 'H'},
        {"seed", required_argument, 0, 's'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0},
    };
    const char *out = NULL, *arch = "llama";
    long layers = 0, hidden = 0, seed = -1;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "o:a:l:H:s:h", opts, NULL)) != -1) {
        switch (c) {
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
    qd_err err = {0};
    if (qd_testgen_write(out, &o, &err)) {
        fprintf(stderr, "quantctl gen-model: %s\n", err.msg);
        return QCTL_FAIL;
    }
    printf("%s\n", out);
    return QCTL_OK;
}
