/* quantctl gen-model: writes a random HF checkpoint (quant/model/testgen.h) for demos and
 * tests on a machine without real models. The weights are seeded, so the same options
 * always give the same files. The files are written tensor by tensor, so a model of any
 * size (70B-shaped included) needs only a few MiB of memory; --shard-size splits it into
 * shards with an index as transformers does. --fp8-block BNxBK writes it (or, with --fp8-from,
 * a float checkpoint already on disk, such as tests/data/families/deepseek_v3) as the FP8
 * block checkpoints DeepSeek-V3 and Qwen3-*-FP8 ship (qd_testgen_fp8), and --dequant-out its
 * twin with those linears dequantized to F32, what torch computes from the FP8 one. */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/quantctl.h"
#include "quant/backend/backend.h"
#include "quant/job/job.h"
#include "quant/model/testgen.h"

/* Bounds that let every real dense or MoE shape through (Llama-3-405B: 126 layers, hidden
 * 16384, intermediate 53248, vocab 128256) and refuse typos that would fill a disk. */
#define GM_MAX_LAYERS 512
#define GM_MAX_HIDDEN 16384
#define GM_MAX_INTER 65536
#define GM_MAX_HEADS 1024
#define GM_MAX_VOCAB 1000000
#define GM_MAX_POS (1 << 20)
#define GM_MAX_EXPERTS 256

static void usage(FILE *f)
{
    fprintf(f, "usage: quantctl gen-model --out DIR [--arch llama|opt] [--layers N] [--hidden H] [--seed S]\n"
               "                         [--intermediate I] [--heads N] [--kv-heads N] [--vocab V]\n"
               "                         [--max-pos P] [--dtype f32|f16|bf16] [--experts E [--top-k K]]\n"
               "                         [--shard-size BYTES] [--fp8-block BNxBK [--fp8-from SRC]\n"
               "                         [--dequant-out DIR2]]\n"
               "Writes config.json + model.safetensors of a random model (default: llama, 2 layers,\n"
               "hidden 64). A 7B-shaped block: --layers 1 --hidden 4096 --intermediate 11008 --heads 32\n"
               "--kv-heads 32 --max-pos 4096 --dtype f16. --experts makes a Mixtral (llama only) of E\n"
               "experts of width --intermediate, K per token (default 2); a Mixtral-8x7B-shaped block:\n"
               "--layers 1 --hidden 4096 --intermediate 14336 --heads 32 --kv-heads 8 --experts 8.\n"
               "A 70B-shaped model: --layers 80 --hidden 8192 --intermediate 28672 --heads 64\n"
               "--kv-heads 8 --vocab 32000 --dtype f16 --shard-size 5GB (about 138 GB on disk).\n"
               "Limits: --layers 1..%d, --hidden a multiple of 32 up to %d, --intermediate up to %d,\n"
               "--vocab up to %d, --max-pos up to %d, --experts up to %d.\n"
               "--shard-size BYTES writes model-00001-of-0000N.safetensors ... and\n"
               "model.safetensors.index.json, each shard holding at most BYTES of tensor data (a larger\n"
               "tensor gets a shard of its own), as transformers' max_shard_size does. BYTES is a count\n"
               "or a number with a unit: KB, MB, GB, TB (powers of 1000; K, M, G, T mean the same) or\n"
               "KiB, MiB, GiB, TiB (powers of 1024): 2GB, 500M, 1.5GiB. Without it: one file.\n"
               "Tensors are made and written one at a time, in chunks, each file to a temporary name\n"
               "renamed into place when complete: memory stays at a few MiB whatever the model's size.\n"
               "--fp8-block BNxBK (e.g. 128x128) then rewrites every block linear as DeepSeek-V3's FP8\n"
               "checkpoints hold it: F8_E4M3 weight and F32 weight_scale_inv per BN x BK block, with\n"
               "quantization_config quant_method \"fp8\" (made in memory: for small models).\n"
               "--fp8-from SRC converts the float checkpoint SRC instead of generating one (no shape\n"
               "options then). --dequant-out DIR2 also writes the same checkpoint with those linears\n"
               "dequantized to F32 (code x scale), as torch's weight.to(float32) * scale gives.\n",
            GM_MAX_LAYERS, GM_MAX_HIDDEN, GM_MAX_INTER, GM_MAX_VOCAB, GM_MAX_POS, GM_MAX_EXPERTS);
}

/* Parses option opt's value s as an integer in min..max; prints the option's rule otherwise. */
static int opt_int(const char *opt, const char *s, long long min, long long max, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || end == s || v < min || v > max) {
        fprintf(stderr, "quantctl gen-model: %s must be %lld..%lld (got '%s')\n", opt, min, max, s);
        return -1;
    }
    *out = v;
    return 0;
}

/* --shard-size: the job's shard_size syntax (qp_size_parse), plus a bare K, M, G or T read as
 * KB, MB, GB or TB, since "2G" is what people type. */
static int opt_size(const char *s, uint64_t *out)
{
    char buf[64];
    size_t n = strlen(s);
    int bare = n > 1 && strchr("kmgtKMGT", s[n - 1]) && !isalpha((unsigned char)s[n - 2]);
    snprintf(buf, sizeof buf, "%s%s", s, bare ? "B" : "");
    if (n + 2 > sizeof buf || qp_size_parse(buf, out) || *out < 1) {
        fprintf(stderr, "quantctl gen-model: --shard-size must be a positive number of bytes, optionally with a unit "
                        "KB, MB, GB, TB, KiB, MiB, GiB or TiB, e.g. 2GB, 500M or 1.5GiB (got '%s')\n", s);
        return -1;
    }
    return 0;
}

/* The FP8-block copy of src in out (and its dequantized twin), qd_testgen_fp8. */
static int gen_fp8(const char *src, const char *out, long long bn, long long bk, const char *twin,
                   const qd_runtime_opts *rt)
{
    qd_err err = {0};
    qd_backend *be = NULL;
    int rc = qd_backend_cpu_open(1, rt, &be, &err);
    if (!rc) rc = qd_testgen_fp8(src, out, bn, bk, twin, be, &err);
    qd_backend_close(be);
    if (rc) {
        fprintf(stderr, "quantctl gen-model: %s\n", err.msg);
        return QCTL_FAIL;
    }
    printf("%s\n", out);
    return QCTL_OK;
}

int cmd_gen_model(int argc, char **argv, const qd_runtime_opts *rt)
{
    enum { OPT_SHARD_SIZE = 1000, OPT_FP8_BLOCK, OPT_FP8_FROM, OPT_DEQUANT_OUT };
    static const struct option opts[] = {
        {"out", required_argument, 0, 'o'}, {"arch", required_argument, 0, 'a'},
        {"layers", required_argument, 0, 'l'}, {"hidden", required_argument, 0, 'H'},
        {"seed", required_argument, 0, 's'}, {"help", no_argument, 0, 'h'},
        {"intermediate", required_argument, 0, 'I'}, {"heads", required_argument, 0, 'N'},
        {"kv-heads", required_argument, 0, 'K'}, {"vocab", required_argument, 0, 'V'},
        {"max-pos", required_argument, 0, 'P'}, {"dtype", required_argument, 0, 'D'},
        {"experts", required_argument, 0, 'E'}, {"top-k", required_argument, 0, 'k'},
        {"shard-size", required_argument, 0, OPT_SHARD_SIZE}, {"fp8-block", required_argument, 0, OPT_FP8_BLOCK},
        {"fp8-from", required_argument, 0, OPT_FP8_FROM}, {"dequant-out", required_argument, 0, OPT_DEQUANT_OUT},
        {0, 0, 0, 0},
    };
    /* 0: not given (the family's default). */
    long long layers = 0, hidden = 0, inter = 0, heads = 0, kv = 0, vocab = 0, max_pos = 0;
    long long experts = 0, top_k = 0, seed = -1;
    uint64_t shard_size = 0;
    const char *dtype = NULL, *out = NULL, *arch = "llama", *fp8_from = NULL, *dequant_out = NULL;
    long long bn = 0, bk = 0;
    int c, bad = 0, shaped = 0;
    optind = 1;
    while (!bad && (c = getopt_long(argc, argv, "o:a:l:H:s:hI:N:K:V:P:D:E:k:", opts, NULL)) != -1) {
        switch (c) {
        case 'l': bad = opt_int("--layers", optarg, 1, GM_MAX_LAYERS, &layers); break;
        case 'H': bad = opt_int("--hidden", optarg, 32, GM_MAX_HIDDEN, &hidden); break;
        case 'I': bad = opt_int("--intermediate", optarg, 1, GM_MAX_INTER, &inter); break;
        case 'N': bad = opt_int("--heads", optarg, 1, GM_MAX_HEADS, &heads); break;
        case 'K': bad = opt_int("--kv-heads", optarg, 1, GM_MAX_HEADS, &kv); break;
        case 'V': bad = opt_int("--vocab", optarg, 1, GM_MAX_VOCAB, &vocab); break;
        case 'P': bad = opt_int("--max-pos", optarg, 1, GM_MAX_POS, &max_pos); break;
        case 'E': bad = opt_int("--experts", optarg, 0, GM_MAX_EXPERTS, &experts); break;
        case 'k': bad = opt_int("--top-k", optarg, 1, GM_MAX_EXPERTS, &top_k); break;
        case 's': bad = opt_int("--seed", optarg, 0, INT64_MAX, &seed); break;
        case OPT_SHARD_SIZE: bad = opt_size(optarg, &shard_size); break;
        case OPT_FP8_BLOCK: {
            int end = 0;
            if (sscanf(optarg, "%lldx%lld%n", &bn, &bk, &end) != 2 || optarg[end] || bn < 1 || bk < 1 || bn > 65536 ||
                bk > 65536) {
                fprintf(stderr, "quantctl gen-model: --fp8-block must be ROWSxCOLUMNS, each 1..65536 (got '%s')\n", optarg);
                bad = 1;
            }
            break;
        }
        case OPT_FP8_FROM: fp8_from = optarg; break;
        case OPT_DEQUANT_OUT: dequant_out = optarg; break;
        case 'D': dtype = optarg; break;
        case 'o': out = optarg; break;
        case 'a': arch = optarg; break;
        case 'h': usage(stdout); return QCTL_OK;
        default: usage(stderr); return QCTL_USAGE;
        }
        shaped |= c != 'o' && c < OPT_FP8_BLOCK;   /* a shape, seed, dtype or shard option */
    }
    if (bad) return QCTL_USAGE;
    if (!out || optind != argc) { usage(stderr); return QCTL_USAGE; }
    if ((fp8_from || dequant_out) && !bn) {
        fprintf(stderr, "quantctl gen-model: --fp8-from and --dequant-out go with --fp8-block\n");
        return QCTL_USAGE;
    }
    if (fp8_from && shaped) {
        fprintf(stderr, "quantctl gen-model: --fp8-from converts a checkpoint as it is: no shape, seed or dtype options\n");
        return QCTL_USAGE;
    }
    if (fp8_from) return gen_fp8(fp8_from, out, bn, bk, dequant_out, rt);
    qd_arch_family fam;
    if (!strcmp(arch, "llama")) fam = QD_ARCH_LLAMA;
    else if (!strcmp(arch, "opt")) fam = QD_ARCH_OPT;
    else { fprintf(stderr, "quantctl gen-model: --arch '%s' is not llama or opt\n", arch); return QCTL_USAGE; }
    if (hidden % 32) {
        fprintf(stderr, "quantctl gen-model: --hidden must be a multiple of 32 (got %lld)\n", hidden);
        return QCTL_USAGE;
    }
    if (experts && fam != QD_ARCH_LLAMA) {
        fprintf(stderr, "quantctl gen-model: --experts is llama only (a Mixtral); --arch opt has none\n");
        return QCTL_USAGE;
    }
    if (top_k > experts) {
        fprintf(stderr, "quantctl gen-model: --top-k 1..experts: %lld is more than --experts %lld\n", top_k, experts);
        return QCTL_USAGE;
    }
    qd_testgen_opts o = qd_testgen_defaults(fam);
    if (layers) o.n_layers = layers;
    if (hidden) {
        o.hidden = hidden;
        o.intermediate = hidden * 5 / 2 / 32 * 32;
    }
    if (seed >= 0) o.seed = (uint64_t)seed;
    if (inter) o.intermediate = inter;
    o.n_experts = experts;
    o.top_k = top_k;
    if (heads) { o.n_heads = heads; o.n_kv_heads = heads; }
    if (kv) o.n_kv_heads = kv;
    if (vocab) o.vocab = vocab;
    if (max_pos) o.max_pos = max_pos;
    o.shard_size = shard_size;
    if (o.hidden % o.n_heads) {
        fprintf(stderr, "quantctl gen-model: --heads %lld must divide --hidden %lld\n", (long long)o.n_heads, (long long)o.hidden);
        return QCTL_USAGE;
    }
    if (o.n_heads % o.n_kv_heads) {
        fprintf(stderr, "quantctl gen-model: --kv-heads %lld must divide --heads %lld\n", (long long)o.n_kv_heads,
                (long long)o.n_heads);
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
    /* In place: the model is read through its mapping, which outlives the rename. */
    if (bn) return gen_fp8(out, out, bn, bk, dequant_out, rt);
    printf("%s\n", out);
    return QCTL_OK;
}
