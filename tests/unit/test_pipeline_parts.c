/* A block's quantize step run as parts (docs/parallel.md): with a fan-out hook that runs the
 * parts through qd_pipeline_part_run, as other workers would, in another order, the output
 * is the same bytes as the in-memory run, for every method and the options that change how
 * a linear is quantized (act order with static groups, tp_aware, bf16 compute, AWQ's
 * clipping, MoE experts); a part that nobody ran, or whose output file is damaged or
 * truncated, is computed by the lead and never used; a cancel inside the fan-out resumes to
 * the same bytes. */
#include <dirent.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "quant/algo/gptq.h"
#include "quant/algo/hessian.h"
#include "quant/formats/qlayer.h"
#include "quant/formats/quantizer.h"
#include "quant/pipeline/admission.h"
#include "quant/pipeline/part.h"
#include "quant/pipeline/state.h"

#include "pipeline_testlib.h"

static const char *T;
static const char *tokens;
static char llama_dir[4096];
static char wide_dir[4096];   /* intermediate 2112: gate/up of 2112 rows, two row ranges each */

/* FAN_CANCEL: a cancel at a fan-out before any part ran; FAN_CANCEL_AFTER: after every part
 * ran (the resumed run must keep their outputs, not compute them again). */
/* FAN_OTHER_MAKER: the parts run on a backend whose desc is not the lead's (another CPU,
 * thread count or GPU): their outputs are never taken over, the lead computes every part. */
/* FAN_STOP: each quantize fan-out's part 0 runs with its stop set (another copy finished):
 * GPTQ stops before its first column block, writes nothing, and the lead computes it. */
typedef enum fan_mode { FAN_ALL, FAN_SKIP_ODD, FAN_DAMAGE, FAN_CANCEL, FAN_CANCEL_AFTER, FAN_SWAP, FAN_OTHER_MAKER,
                        FAN_STOP, FAN_CAP_BAD, FAN_LEAD } fan_mode;
/* FAN_CAP_BAD: part 0 of each capture fan-out has its input edited (cap_edits, in turn) before
 * it runs: the worker refuses it naming what is wrong, writes nothing, and the lead runs it. */

typedef struct fan_ctx {
    const qp_job *job;
    fan_mode mode;
    int fanouts, parts, failed;
    int cancel_at;               /* FAN_CANCEL: the fan-out that cancels (0-based) */
    uint64_t max_bytes;          /* the most bytes seen in the parts directory (after the parts ran) */
    int kept_block, kept_n;      /* FAN_CANCEL_AFTER: the block whose parts' outputs were left */
    char kept_first[160];        /* the first part's name of that fan-out */
    ino_t kept_ino[64];          /* and their inodes (a rewrite makes a new one) */
    int kept;                    /* outputs the resumed run found and kept */
    /* The part files' compact forms (part.h): inputs whose weight rows travel in half
     * precision, Hessians and factors stored as their upper triangle, outputs whose
     * dequantized rows the lead decodes from the codes. */
    int ins, ins_half, ins_src, hess, hess_tri, facs, facs_tri, outs, outs_codes;
    int ins_diag;                /* quantize inputs carrying H's diagonal instead of naming H */
    /* The factor step (part_factor.c): its fan-outs, parts, the last one's size, and the
     * quantize fan-outs that followed one with other than one output a factor part (two,
     * FAN_OTHER_MAKER: the other maker's and the lead's), of those seen (after_factor: the
     * last fan-out was a factor step). */
    int factor_fanouts, factor_parts, factor_last_n, factor_outs_seen, factor_outs_bad, after_factor;
    int stopped;                 /* FAN_STOP: parts that stopped */
    /* The capture step (part_capture.c): its fan-outs, parts and files seen after they ran. */
    int capture_fanouts, capture_parts, cap_files;
    int cap_half[5], cap_y;      /* the capture fan-outs by the half they run (part_capture.c's
                                    names), and those with outputs */
    int cap_experts;             /* the capture fan-outs cut by a MoE block's experts */
    int cap_shards;              /* the most shards such a part sums its Hessians over */
    int cap_bad;                 /* FAN_CAP_BAD: the inputs edited and refused so far */
    int lead_hidden;             /* FAN_LEAD: state files hidden while the lead ran its own parts */
    int resumed;                 /* the run after a cancel: the failed attempt's outputs stay */
    int trace_parts;             /* the factor step's trace parts (inputs of kind "trace") */
} fan_ctx;

/* qd_pipeline_set_trace_parts for fan_case's runs (-1: the rule's). */
static int fan_trace = -1;

/* The test backend under another desc: the same computation, named as another maker's. */
static qd_backend other_maker;

static int enc_is(const cJSON *meta, const char *arr, const char *a, const char *b)
{
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(meta, "enc"), arr);
    return cJSON_IsString(e) && (!strcmp(e->valuestring, a) || (b && !strcmp(e->valuestring, b)));
}

/* Counts the forms of the files in the parts directory (after the parts ran). */
static void count_forms(fan_ctx *c)
{
    char dir[4400];
    snprintf(dir, sizeof dir, "%s/.quantd/parts", c->job->output);
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    DIR *d = fd >= 0 ? fdopendir(dup(fd)) : NULL;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        const char *nm = e->d_name;
        size_t l = strlen(nm);
        if (nm[0] == '.' || l < 6 || strcmp(nm + l - 5, ".part")) continue;
        cJSON *m = qd_part_file_meta(fd, nm);
        const cJSON *arrs = cJSON_GetObjectItemCaseSensitive(m, "arrays");
        if (strstr(nm, "-capture-")) {
            c->cap_files++;
        } else if (strstr(nm, "-factor-")) {
            if (strstr(nm, ".out.part") && cJSON_HasObjectItem(arrs, "fac")) {
                c->facs++;
                c->facs_tri += enc_is(m, "fac", "upper_zero", NULL);
            }
        } else if (strstr(nm, ".out.part")) {
            c->outs++;
            c->outs_codes += cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m, "dq_from_codes")) &&
                             !cJSON_HasObjectItem(arrs, "dq");
        } else if (strstr(nm, ".in.part")) {
            c->ins++;
            c->ins_half += enc_is(m, "w", "bf16", "f16");
            c->ins_src += cJSON_HasObjectItem(m, "src") && !cJSON_HasObjectItem(arrs, "w");
            c->ins_diag += cJSON_HasObjectItem(arrs, "hdiag");
        } else if (strstr(nm, "-h")) {
            c->hess++;
            c->hess_tri += enc_is(m, "h", "upper_sym", NULL);
            if (cJSON_HasObjectItem(arrs, "fac")) {
                c->facs++;
                c->facs_tri += enc_is(m, "fac", "upper_zero", NULL);
            }
        }
        cJSON_Delete(m);
    }
    if (d) closedir(d);
    if (fd >= 0) close(fd);
}

/* The path of part `index`'s output of step `step`: named by its input's checksum (part.h)
 * and, for a factor part, by the test backend's desc. */
static void out_path(const fan_ctx *c, const char *step, int block, int index, char *buf, size_t cap)
{
    char dir[4300], in[64], out[96], desc[160];
    snprintf(dir, sizeof dir, "%s/.quantd/parts", c->job->output);
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    int factor = !strcmp(step, "factor"), capture = !strcmp(step, "capture");
    if (factor) qd_fpart_name_in(in, sizeof in, block, index);
    else if (capture) qd_cpart_name_in(in, sizeof in, block, index);
    else qd_qpart_name_in(in, sizeof in, block, index);
    uint64_t sum = fd >= 0 ? qd_part_file_checksum(fd, in) : 0;
    qd_part_maker_desc(pt_be, desc, sizeof desc);
    if (factor) qd_fpart_name_out(out, sizeof out, block, index, sum, desc);
    else if (capture) qd_cpart_name_out(out, sizeof out, block, index, sum, desc);
    else qd_qpart_name_out(out, sizeof out, block, index, sum, desc);
    if (fd >= 0) close(fd);
    snprintf(buf, cap, "%s/%s", dir, out);
}

/* The outputs of step `what` ("-factor-", "-quantize-") in the parts directory. */
static int outs_of(const fan_ctx *c, const char *what)
{
    char dir[4400];
    snprintf(dir, sizeof dir, "%s/.quantd/parts", c->job->output);
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) n += strstr(e->d_name, what) && strstr(e->d_name, ".out.part");
    if (d) closedir(d);
    return n;
}
static int factor_outs(const fan_ctx *c) { return outs_of(c, "-factor-"); }
static int quantize_outs(const fan_ctx *c) { return outs_of(c, "-quantize-"); }

/* Flips a byte in the middle of path, or truncates it by 8 bytes. */
static void damage(const char *path, int truncate_it)
{
    struct stat st;
    if (stat(path, &st)) { CHECK(0); return; }
    if (truncate_it) { CHECK(truncate(path, st.st_size - 8) == 0); return; }
    int fd = open(path, O_RDWR);
    CHECK(fd >= 0);
    if (fd < 0) return;
    unsigned char b;
    off_t at = st.st_size / 2;
    CHECK(pread(fd, &b, 1, at) == 1);
    b ^= 0x5a;
    CHECK(pwrite(fd, &b, 1, at) == 1);
    close(fd);
}

/* The part files of blocks other than `block` left in the parts directory. */
static int stale_files(const fan_ctx *c, int block)
{
    char dir[4400], mine[32];
    snprintf(dir, sizeof dir, "%s/.quantd/parts", c->job->output);
    snprintf(mine, sizeof mine, "b%04d-", block);
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) n += e->d_name[0] != '.' && strncmp(e->d_name, mine, strlen(mine));
    if (d) closedir(d);
    return n;
}

/* The model's weights replaced under the running job: a copy of model.safetensors with every
 * byte after the header changed, renamed over it (the lead keeps the file it opened). */
static void swap_model(const char *dir)
{
    char path[4300], tmp[4400];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    snprintf(tmp, sizeof tmp, "%s/model.safetensors.new", dir);
    size_t n = 0;
    unsigned char *b = (unsigned char *)pt_read(path, &n);
    CHECK(b && n > 8);
    if (!b || n <= 8) return;
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = hl << 8 | b[i];
    for (size_t i = 8 + hl; i < n; i++) b[i] ^= 0x01;
    FILE *f = fopen(tmp, "wb");
    CHECK(f && fwrite(b, 1, n, f) == n);
    if (f) fclose(f);
    CHECK(rename(tmp, path) == 0);
    free(b);
}

/* Rewrites part file `name` in dirfd with edit applied to its meta, its arrays kept. */
static void part_rewrite_keep(int dirfd, const char *name, void (*edit)(cJSON *meta))
{
    qd_part_file f;
    qd_err err = {0};
    CHECK_OK(qd_part_file_read(dirfd, name, &f, &err));
    if (!f.meta) return;
    qd_part_arr arrs[16];
    int n = 0;
    const cJSON *a;
    cJSON_ArrayForEach(a, cJSON_GetObjectItemCaseSensitive(f.meta, "arrays")) {
        if (n == 16) break;
        uint64_t off = (uint64_t)cJSON_GetArrayItem(a, 0)->valuedouble, bytes = (uint64_t)cJSON_GetArrayItem(a, 1)->valuedouble;
        arrs[n++] = (qd_part_arr){a->string, f.data + off, bytes};
    }
    cJSON *meta = cJSON_Duplicate(f.meta, 1);
    cJSON_DeleteItemFromObject(meta, "arrays");
    edit(meta);
    /* The arrays' names are the old meta's: write before freeing it. */
    CHECK_OK(qd_part_file_write(dirfd, name, meta, arrs, n, NULL, &err));
    cJSON_Delete(meta);
    qd_part_file_free(&f);
}
static void cap_half_bad(cJSON *m) { cJSON_ReplaceItemInObject(m, "half", cJSON_CreateString("both")); }
static void cap_sum_bad(cJSON *m) { cJSON_ReplaceItemInObject(m, "block_sum", cJSON_CreateString("zz")); }
static void cap_group_bad(cJSON *m) { cJSON_ReplaceItemInObject(m, "groups", cJSON_CreateIntArray((const int[]){99}, 1)); }
static void cap_keep_bad(cJSON *m) { cJSON_ReplaceItemInObject(m, "keep_all", cJSON_CreateNumber(99)); }
static void cap_rows_bad(cJSON *m) { cJSON_ReplaceItemInObject(m, "n_seq", cJSON_CreateNumber(1 << 21)); }
static void cap_state_path(cJSON *m)
{
    cJSON *st = cJSON_CreateArray(), *pair = cJSON_CreateArray();
    cJSON_AddItemToArray(pair, cJSON_CreateString("../b0000-state-00.part"));
    cJSON_AddItemToArray(pair, cJSON_CreateString("0000000000000001"));
    cJSON_AddItemToArray(st, pair);
    cJSON_ReplaceItemInObject(m, "states", st);
}
static void cap_state_sum(cJSON *m)
{
    char nm[48];
    snprintf(nm, sizeof nm, "b%04d-state-00.part", (int)cJSON_GetObjectItem(m, "block")->valuedouble);
    cJSON *st = cJSON_CreateArray(), *pair = cJSON_CreateArray();
    cJSON_AddItemToArray(pair, cJSON_CreateString(nm));
    cJSON_AddItemToArray(pair, cJSON_CreateString("0000000000000001"));
    cJSON_AddItemToArray(st, pair);
    cJSON_ReplaceItemInObject(m, "states", st);
}
static void cap_width_bad(cJSON *m)
{
    cJSON_ReplaceItemInObject(m, "width", cJSON_CreateNumber(cJSON_GetObjectItem(m, "width")->valuedouble + 1));
}
static const struct { void (*edit)(cJSON *); const char *msg; } cap_edits[] = {
    {cap_half_bad, "a bad shape, compute, half"},    {cap_sum_bad, "checksum"},
    {cap_group_bad, "a bad group"},                  {cap_keep_bad, "bad shards, keep_rows or keep_all"},
    {cap_rows_bad, "a bad shape"},                   {cap_state_path, "a bad state file name"},
    {cap_state_sum, "state"},                        {cap_width_bad, "width"},
};

/* A MoE pass cut by experts: its inputs name the pass's one input file and carry linears. */
static void ex_xfile_edit(cJSON *m, int at, const char *v)
{
    cJSON *xf = cJSON_GetObjectItemCaseSensitive(m, "x_file");
    if (xf) cJSON_ReplaceItemInArray(xf, at, cJSON_CreateString(v));
}
static void ex_xfile_path(cJSON *m)
{
    char nm[48];
    snprintf(nm, sizeof nm, "../b%04d-capture-x.part", (int)cJSON_GetObjectItem(m, "block")->valuedouble);
    ex_xfile_edit(m, 0, nm);
}
static void ex_xfile_sum(cJSON *m) { ex_xfile_edit(m, 1, "0000000000000001"); }
static void ex_linear_bad(cJSON *m) { cJSON_ReplaceItemInObject(m, "linears", cJSON_CreateIntArray((const int[]){0}, 1)); }
static void ex_group_bad(cJSON *m) { cJSON_ReplaceItemInObject(m, "groups", cJSON_CreateIntArray((const int[]){0}, 1)); }
static void ex_shards_bad(cJSON *m) { cJSON_ReplaceItemInObject(m, "n_shards", cJSON_CreateNumber(99)); }
static void ex_output_bad(cJSON *m) { cJSON_ReplaceItemInObject(m, "y", cJSON_CreateTrue()); }
static const struct { void (*edit)(cJSON *); const char *msg; } ex_edits[] = {
    {ex_xfile_path, "a bad expert part"},           {ex_xfile_sum, "not the input the lead wrote"},
    {ex_linear_bad, "is not one of its experts'"},  {ex_group_bad, "is not an expert's"},
    {ex_shards_bad, "a bad expert part"},           {ex_output_bad, "a bad expert part"},
};
/* Renames block `block`'s state files (part_capture.c: bNNNN-state-XX.part) to hidden names
 * (hide) or back; returns how many it renamed. */
static int hide_states(const fan_ctx *c, int block, int hide)
{
    char dir[4400], prefix[32];
    snprintf(dir, sizeof dir, "%s/.quantd/parts", c->job->output);
    snprintf(prefix, sizeof prefix, "%sb%04d-state-", hide ? "" : "hidden-", block);
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, prefix, strlen(prefix))) continue;
        char from[4800], to[4800];
        snprintf(from, sizeof from, "%s/%s", dir, e->d_name);
        snprintf(to, sizeof to, "%s/%s", dir, hide ? "hidden-" : "");
        snprintf(to + strlen(to), sizeof to - strlen(to), "%s", e->d_name + (hide ? 0 : strlen("hidden-")));
        if (rename(from, to) == 0) n++;
    }
    closedir(d);
    return n;
}

static int ex_bad_next;   /* the next of ex_edits, over every MoE case's fan-outs */

/* FAN_CAP_BAD: part 0's input edited, run, refused with the edit's message, no output. */
static void cap_refused(fan_ctx *c, int block)
{
    char dir[4400], in[64], p[4400];
    snprintf(dir, sizeof dir, "%s/.quantd/parts", c->job->output);
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    CHECK(fd >= 0);
    if (fd < 0) return;
    qd_cpart_name_in(in, sizeof in, block, 0);
    cJSON *meta = qd_part_file_meta(fd, in);
    int ex = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(meta, "experts"));
    cJSON_Delete(meta);
    size_t k = ex ? (size_t)ex_bad_next++ % (sizeof ex_edits / sizeof *ex_edits)
                  : (size_t)c->cap_bad % (sizeof cap_edits / sizeof *cap_edits);
    part_rewrite_keep(fd, in, ex ? ex_edits[k].edit : cap_edits[k].edit);
    close(fd);
    qd_err err = {0};
    atomic_int stop = 0;
    int rc = qd_pipeline_part_run(c->job, pt_be, block, "capture", 0, "w1", &stop, NULL, &err);
    test_checks++;
    const char *want = ex ? ex_edits[k].msg : cap_edits[k].msg;
    if (rc == 0 || !strstr(err.msg, want))
        TEST_FAIL_("capture input edit %zu%s: rc %d, \"%s\" (wanted \"%s\")", k, ex ? " (experts)" : "", rc, err.msg, want);
    struct stat st;
    out_path(c, "capture", block, 0, p, sizeof p);
    CHECK(stat(p, &st) != 0);   /* refused: no output */
    c->cap_bad++;
}

static int on_fanout(void *ud, int block, const char *step, int n, const char *const *names)
{
    fan_ctx *c = ud;
    if (c->mode == FAN_SWAP && c->fanouts == 0) swap_model(c->job->model);
    CHECK_INT(stale_files(c, block), 0);   /* a committed block's parts are removed */
    int factor = !strcmp(step, "factor"), capture = !strcmp(step, "capture");
    CHECK(factor || capture || !strcmp(step, "quantize"));
    int after_factor = c->after_factor;
    c->after_factor = factor;
    CHECK(n > 1);
    if (capture) {
        c->capture_fanouts++;
        c->capture_parts += n;
        char dir[4400], in[64];
        snprintf(dir, sizeof dir, "%s/.quantd/parts", c->job->output);
        qd_cpart_name_in(in, sizeof in, block, 0);
        int fd = open(dir, O_RDONLY | O_DIRECTORY);
        cJSON *m = fd >= 0 ? qd_part_file_meta(fd, in) : NULL;
        const cJSON *h = cJSON_GetObjectItemCaseSensitive(m, "half");
        for (int i = 0; i < 5 && cJSON_IsString(h); i++)
            c->cap_half[i] += !strcmp(h->valuestring, (const char *[]){"all", "attn", "mlp", "act", "ctx"}[i]);
        c->cap_y += cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m, "y"));
        c->cap_experts += cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m, "experts"));
        const cJSON *ns = cJSON_GetObjectItemCaseSensitive(m, "n_shards");
        if (cJSON_IsNumber(ns) && ns->valuedouble > c->cap_shards) c->cap_shards = (int)ns->valuedouble;
        cJSON_Delete(m);
        if (fd >= 0) close(fd);
    } else if (factor) {
        c->factor_fanouts++;
        c->factor_parts += n;
        c->factor_last_n = n;
        char dir[4400], in[64];
        snprintf(dir, sizeof dir, "%s/.quantd/parts", c->job->output);
        int fd = open(dir, O_RDONLY | O_DIRECTORY);
        for (int i = 0; i < n && fd >= 0; i++) {
            qd_fpart_name_in(in, sizeof in, block, i);
            cJSON *m = qd_part_file_meta(fd, in);
            const cJSON *kind = cJSON_GetObjectItemCaseSensitive(m, "kind");
            c->trace_parts += cJSON_IsString(kind) && !strcmp(kind->valuestring, "trace");
            cJSON_Delete(m);
        }
        if (fd >= 0) close(fd);
    } else {
        int fo = factor_outs(c);
        if (after_factor && (c->mode == FAN_ALL || c->mode == FAN_OTHER_MAKER)) {
            c->factor_outs_seen++;
            c->factor_outs_bad += fo != (c->mode == FAN_OTHER_MAKER ? 2 : 1) * c->factor_last_n;
        }
        /* The earlier fan-outs' outputs are gone, every maker's (none after a failure here),
         * and so are the capture step's files once its calls were taken over. */
        if ((c->mode == FAN_ALL || c->mode == FAN_OTHER_MAKER) && !c->resumed) CHECK_INT(quantize_outs(c), 0);
        if (!c->resumed) CHECK_INT(outs_of(c, "-capture-"), 0);
    }
    for (int i = 0; i < n; i++) CHECK(names[i] && names[i][0]);
    if (c->mode == FAN_CANCEL && c->fanouts == c->cancel_at) { c->fanouts++; return 1; }
    c->fanouts++;
    if (capture && c->mode == FAN_CAP_BAD) cap_refused(c, block);
    /* Last part first, as workers finishing in any order would. */
    for (int i = n - 1; i >= 0; i--) {
        if (c->mode == FAN_SKIP_ODD && i % 2) continue;
        if (c->mode == FAN_CAP_BAD && capture && i == 0) continue;   /* refused above */
        char worker[32];
        snprintf(worker, sizeof worker, "w%d", 1 + i % 2);
        if (c->mode == FAN_LEAD && i % 2) snprintf(worker, sizeof worker, "lead");   /* the lead's own thread */
        qd_err err = {0};
        double secs = -1;
        qd_backend *be = c->mode == FAN_OTHER_MAKER ? &other_maker : pt_be;
        atomic_int stop = c->mode == FAN_STOP && !factor && !capture && i == 0;
        /* A capture part the lead takes itself runs on its own block: hidden, the block's
         * state files cannot be what it reads (nor the block another part of this process
         * kept with them applied: dropped). */
        int hidden = capture && c->mode == FAN_LEAD && !strcmp(worker, "lead") ? hide_states(c, block, 1) : 0;
        if (hidden) qd_cpart_cache_drop();
        int rc = qd_pipeline_part_run(c->job, be, block, step, i, worker, &stop, &secs, &err);
        if (hidden) CHECK_INT(hide_states(c, block, 0), hidden);
        c->lead_hidden += hidden;
        if (atomic_load(&stop)) {
            char p[4400];
            struct stat st;
            out_path(c, step, block, i, p, sizeof p);
            CHECK_INT(rc, QD_ECANCELLED);
            CHECK(stat(p, &st) != 0);   /* stopped: no output */
            c->stopped++;
            rc = 0;
        }
        if (rc) { c->failed++; fprintf(stderr, "part %d: %s\n", i, err.msg); }
        CHECK(secs >= 0);
        c->parts++;
    }
    if (c->mode == FAN_ALL) count_forms(c);
    if (capture && c->mode == FAN_ALL) CHECK_INT(outs_of(c, "-capture-"), n);   /* one output a part */
    for (int i = 0; i < n && i < 64; i++) {
        char p[4400];
        struct stat st;
        out_path(c, step, block, i, p, sizeof p);
        if (c->mode == FAN_CANCEL_AFTER && c->fanouts == c->cancel_at + 1) {
            CHECK(stat(p, &st) == 0);
            c->kept_ino[i] = st.st_ino;
            c->kept_block = block;
            c->kept_n = n < 64 ? n : 64;
            snprintf(c->kept_first, sizeof c->kept_first, "%s", names[0]);
        } else if (c->kept_n && block == c->kept_block && !strcmp(names[0], c->kept_first) && i < c->kept_n &&
                   stat(p, &st) == 0 && st.st_ino == c->kept_ino[i]) {
            c->kept++;
        }
    }
    if (c->mode == FAN_CANCEL_AFTER && c->fanouts == c->cancel_at + 1) return 1;
    if (c->kept_n && block == c->kept_block && !strcmp(names[0], c->kept_first)) c->kept_n = 0;   /* compared once */
    char dir[4400];
    snprintf(dir, sizeof dir, "%s/.quantd/parts", c->job->output);
    uint64_t bytes = qd_fs_tree_bytes(dir);
    if (bytes > c->max_bytes) c->max_bytes = bytes;
    if (c->mode == FAN_DAMAGE && n >= 2) {
        char p[4400];
        out_path(c, step, block, 0, p, sizeof p);
        damage(p, 0);
        out_path(c, step, block, 1, p, sizeof p);
        damage(p, 1);
    }
    return 0;
}

/* The layers of the report: name and rel_error, in order, and how many name a worker. */
static char *report_layers(const char *out, int *with_worker)
{
    cJSON *j = pt_read_json(test_path(out, "quantd_report.json"));
    const cJSON *l;
    size_t cap = 1 << 16, len = 0;
    char *s = calloc(cap, 1);
    *with_worker = 0;
    cJSON_ArrayForEach(l, cJSON_GetObjectItemCaseSensitive(j, "layers")) {
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(l, "name");
        const cJSON *re = cJSON_GetObjectItemCaseSensitive(l, "rel_error");
        const cJSON *ke = cJSON_GetObjectItemCaseSensitive(l, "kernel_max_err");
        *with_worker += cJSON_HasObjectItem(l, "worker");
        if (len + 300 < cap)
            len += (size_t)snprintf(s + len, cap - len, "%s %.17g %.17g\n", cJSON_IsString(nm) ? nm->valuestring : "?",
                                    cJSON_IsNumber(re) ? re->valuedouble : -1, cJSON_IsNumber(ke) ? ke->valuedouble : -1);
    }
    cJSON_Delete(j);
    return s;
}

static void check_same(const char *what, const char *ref, const char *out)
{
    static const char *files[] = {"model.safetensors", "config.json", "quantize_config.json"};
    for (int i = 0; i < 3; i++) {
        test_checks++;
        if (!pt_same_file(test_path(ref, files[i]), test_path(out, files[i])))
            TEST_FAIL_("%s: %s differs from the in-memory run", what, files[i]);
    }
    int wr = 0, wo = 0;
    char *a = report_layers(ref, &wr), *b = report_layers(out, &wo);
    test_checks++;
    if (!a || !b || strcmp(a, b)) TEST_FAIL_("%s: the report's layer figures differ:\n%s---\n%s", what, a, b);
    CHECK_INT(wr, 0);
    CHECK(wo > 0);   /* the parts' workers are recorded */
    free(a);
    free(b);
    CHECK(!qd_fs_exists(test_path(out, ".quantd")));
}

static int last_capture_fanouts, last_capture_parts;   /* the last fan_case's capture step */
static int last_trace_parts, last_ins_diag;

/* qd_pipeline_run with fan_trace applied. */
static int fan_run(const qp_job *job, const qd_pipeline_hooks *hooks, qd_err *err)
{
    qd_pipeline *p = NULL;
    int rc = qd_pipeline_open(job, pt_be, hooks, &p, err);
    if (!rc) qd_pipeline_set_trace_parts(p, fan_trace);
    while (!rc && qd_pipeline_next_block(p) < qd_pipeline_n_blocks(p)) rc = qd_pipeline_run_block(p, err);
    if (!rc) rc = qd_pipeline_finish(p, err);
    qd_pipeline_close(p);
    return rc;
}
static int last_cap_half[5], last_cap_y, last_cap_experts, last_cap_shards, last_lead_hidden;

/* Returns the factor fan-outs the run made. */
static int fan_case(const char *tag, const char *model, const char *method, const char *format, const char *extra,
                    fan_mode mode)
{
    char ref[4200], out[4200];
    snprintf(ref, sizeof ref, "%s/%s-ref", T, tag);
    snprintf(out, sizeof out, "%s/%s-fan%d%s", T, tag, (int)mode, fan_trace == 1 ? "-trace" : "");
    qp_job *job = qd_fs_exists(test_path(ref, "model.safetensors")) ? NULL
                  : pt_run_job(tag, model, ref, method, format, tokens, extra);
    qp_job_free(job);
    job = pt_job(model, out, method, format, tokens, extra);
    CHECK(job != NULL);
    if (!job) return 0;
    fan_ctx c = {.job = job, .mode = mode, .cancel_at = 1};
    qd_pipeline_hooks hooks = {.ud = &c, .fanout = on_fanout, .worker = "lead"};
    qd_err err = {0};
    int rc = fan_run(job, &hooks, &err);
    if (mode == FAN_CANCEL || mode == FAN_CANCEL_AFTER) {
        CHECK_INT(rc, QD_ECANCELLED);
        c.mode = FAN_ALL;
        c.resumed = 1;
        int n_kept = c.kept_n;
        rc = fan_run(job, &hooks, &err);
        CHECK_INT(c.kept_n, 0);   /* the fan-out came again */
        /* The block is run again from its start; the fan-out it had finished is not. */
        if (mode == FAN_CANCEL_AFTER) CHECK(n_kept > 1 && c.kept == n_kept);
    }
    if (rc) TEST_FAIL_("%s: %s", tag, err.msg);
    test_checks++;
    CHECK(c.fanouts > 0);
    CHECK(c.parts > 0);
    /* Every part that reads the model's files refuses them (a factor part reads only its
     * Hessian, a trace part the rows too): none is used. */
    if (mode == FAN_SWAP) CHECK_INT(c.failed, c.parts - (c.factor_parts - c.trace_parts));
    else CHECK_INT(c.failed, 0);
    /* Beside a quantize fan-out, each factor part's output once; with another maker, its
     * output and the lead's own. */
    if (c.factor_fanouts && (mode == FAN_ALL || mode == FAN_OTHER_MAKER)) {
        CHECK_INT(c.factor_outs_seen, c.factor_fanouts);
        CHECK_INT(c.factor_outs_bad, 0);
    }
    if (mode == FAN_OTHER_MAKER) CHECK(c.factor_fanouts > 0);
    if (mode == FAN_STOP) CHECK(c.stopped > 0);
    if (mode == FAN_OTHER_MAKER) {
        /* Every linear's parts are the lead's own: none a helper of another maker wrote. */
        cJSON *j = pt_read_json(test_path(out, "quantd_report.json"));
        const cJSON *l;
        int others = 0, n = 0;
        cJSON_ArrayForEach(l, cJSON_GetObjectItemCaseSensitive(j, "layers")) {
            const cJSON *w = cJSON_GetObjectItemCaseSensitive(l, "worker");
            n++;
            others += cJSON_IsString(w) && strstr(w->valuestring, "w");
        }
        cJSON_Delete(j);
        CHECK(n > 0);
        CHECK_INT(others, 0);
    }
    printf("%-22s mode %d: %d fan-outs, %d parts run by the hook, part files %llu bytes at most; inputs read from "
           "the model %d/%d, in half precision %d/%d, triangular Hessians %d/%d and factors %d/%d, outputs from codes "
           "%d/%d; factor fan-outs %d of %d parts\n", tag, (int)mode, c.fanouts, c.parts, (unsigned long long)c.max_bytes, c.ins_src, c.ins, c.ins_half,
           c.ins, c.hess_tri, c.hess, c.facs_tri, c.facs, c.outs_codes, c.outs, c.factor_fanouts, c.factor_parts);
    if (mode == FAN_ALL) {
        /* Every grid's rows decode from their codes bit for bit, and every Hessian is
         * symmetric and every factor upper triangular, so none of them travels whole; without
         * AWQ every part's weight rows are read from the model's own files, not written; AWQ's
         * scaled rows travel in half precision where they stay exact (and are read from the
         * model where its scales left them unchanged). */
        test_checks++;
        int awq = !strncmp(method, "awq", 3);
        int half_expected = model == wide_dir || !awq ? 0 : c.ins_half, src_expected = awq ? c.ins_src : c.ins;
        if (c.outs == 0 || c.outs_codes != c.outs || c.hess_tri != c.hess || c.facs_tri != c.facs ||
            c.ins_half != half_expected || c.ins_src != src_expected)
            TEST_FAIL_("%s: the part files' forms (see the line above; inputs read from the model expected %d, "
                       "in half precision %d)", tag, src_expected, half_expected);
    }
    /* The estimate's part files: never below what a fan-out held (checked where the weights,
     * not the files' headers, make the bytes). */
    qd_pipeline_estimate est;
    qd_err e2 = {0};
    CHECK_OK(qd_pipeline_estimate_job(job, &est, &e2));
    if (!strncmp(tag, "wide", 4) || ((!strncmp(tag, "cap", 3) || !strcmp(tag, "mixtral-gptq")) && mode == FAN_ALL)) {
        test_checks++;
        if (!(est.part_disk_bytes >= c.max_bytes && est.part_disk_bytes <= 4 * c.max_bytes))
            TEST_FAIL_("%s: the estimate's part files %llu against %llu held", tag, (unsigned long long)est.part_disk_bytes,
                       (unsigned long long)c.max_bytes);
    }
    check_same(tag, ref, out);
    qp_job_free(job);
    last_capture_fanouts = c.capture_fanouts;
    last_capture_parts = c.capture_parts;
    memcpy(last_cap_half, c.cap_half, sizeof last_cap_half);
    last_cap_y = c.cap_y;
    last_lead_hidden = c.lead_hidden;
    last_cap_experts = c.cap_experts;
    last_cap_shards = c.cap_shards;
    last_trace_parts = c.trace_parts;
    last_ins_diag = c.ins_diag;
    return c.factor_fanouts;
}

static void test_dense(void)
{
    fan_case("gptq", llama_dir, "gptq", "gptq", NULL, FAN_ALL);
    fan_case("gptq-act-static", llama_dir, "gptq", "gptq", "\"desc_act\":true,\"static_groups\":true,", FAN_ALL);
    /* One fan-out for the whole block: its four groups' Hessians factored by parts. */
    CHECK(fan_case("gptq-not-sequential", llama_dir, "gptq", "gptq_v2", "\"true_sequential\":false,", FAN_ALL) > 0);
    CHECK(fan_case("gptq-not-seq-act", llama_dir, "gptq", "gptq", "\"true_sequential\":false,\"desc_act\":true,"
                   "\"static_groups\":true,\"layout\":\"tp_aware\",\"tp\":2,", FAN_ALL) > 0);
    CHECK(fan_case("gptq-not-seq-bf16", llama_dir, "gptq", "gptq_v2", "\"true_sequential\":false,\"compute\":\"bf16\",",
                   FAN_ALL) > 0);
    fan_case("rtn", llama_dir, "rtn", "gptq_v2", "\"bits\":3,\"sym\":false,", FAN_ALL);
    fan_case("awq", llama_dir, "awq", "awq_gemm", NULL, FAN_ALL);
    fan_case("awq-gptq", llama_dir, "awq+gptq", "compressed-tensors", "\"sym\":false,", FAN_ALL);
    fan_case("gptq-bf16", llama_dir, "gptq", "gptq_v2", "\"compute\":\"bf16\",", FAN_ALL);
    fan_case("gptq-tp", llama_dir, "gptq", "gptq", "\"desc_act\":true,\"layout\":\"tp_aware\",\"tp\":2,", FAN_ALL);
    /* The float schemes: NVFP4's global scale travels with each part, FP8 per tensor is one
     * part a linear (one scale spans its rows), FP8's static input scale is the lead's. */
    fan_case("nvfp4", llama_dir, "gptq", "nvfp4-pack-quantized", "\"scheme\":\"NVFP4A16\",", FAN_ALL);
    fan_case("fp8-static", llama_dir, "gptq", "float-quantized", "\"scheme\":\"FP8\",", FAN_ALL);
    fan_case("mxfp4-awq", llama_dir, "awq", "mxfp4-pack-quantized", "\"scheme\":\"MXFP4A16\",", FAN_ALL);
    /* target_bpw: each part's file carries its linear's bits and group size. */
    fan_case("gptq-bpw", llama_dir, "gptq", "compressed-tensors",
             "\"target_bpw\":5.0,\"bpw_bits\":[4,8],\"bpw_group_sizes\":[32,64],", FAN_ALL);
}

static void test_moe(void)
{
    char model[4200];
    snprintf(model, sizeof model, "%s/mixtral", pt_families_dir());
    CHECK(fan_case("mixtral-gptq", model, "gptq", "gptq", "\"bits\":8,", FAN_ALL) > 0);   /* the experts' factors */
    /* The experts' down passes are cut by experts (1 a block), the same bytes when parts are
     * lost, damaged, or run by the lead itself on its own block. Their gate/up pass is not:
     * every expert's gate/up takes every token's normalised hidden state, one Hessian the
     * lead sums once and copies (qd_model_group_same_input), where each part would sum it. */
    CHECK_INT(last_cap_experts, 2);
    static const fan_mode modes[] = {FAN_SKIP_ODD, FAN_DAMAGE, FAN_LEAD, FAN_CANCEL_AFTER};
    for (size_t i = 0; i < sizeof modes / sizeof *modes; i++) {
        fan_case("mixtral-gptq", model, "gptq", "gptq", "\"bits\":8,", modes[i]);
        CHECK(last_cap_experts >= 2);
    }
    /* Each expert's Hessian from the tokens routed to it only: the parts' row counts differ,
     * and the gate/up passes are cut too (gate/up, then down: 2 a block). */
    fan_case("mixtral-routed", model, "gptq", "gptq", "\"bits\":8,\"moe\":{\"calibrate_all_experts\":false,\"min_tokens\":1},",
             FAN_DAMAGE);
    CHECK_INT(last_cap_experts, 2 * 2);
    /* Shared experts beside the routed ones, and a dense first layer (DeepSeek). */
    snprintf(model, sizeof model, "%s/qwen2_moe", pt_families_dir());
    fan_case("qwen2-moe-gptq", model, "gptq", "gptq", "\"bits\":8,", FAN_LEAD);
    CHECK(last_cap_experts >= 2);
    snprintf(model, sizeof model, "%s/deepseek_v3", pt_families_dir());
    fan_case("deepseek-v3-gptq", model, "gptq", "gptq", "\"bits\":8,", FAN_SKIP_ODD);
    CHECK(last_cap_experts >= 1);
    /* Fused expert tensors with biases and a clamped SwiGLU (gpt-oss, and its MXFP4 source);
     * a router that scales the experts' input, and a dense layer among MoE ones (Llama 4). */
    static const char *const fams[] = {"gpt_oss", "gpt_oss_mxfp4", "llama4"};
    for (size_t i = 0; i < sizeof fams / sizeof *fams; i++) {
        char tag[64];
        snprintf(model, sizeof model, "%s/%s", pt_families_dir(), fams[i]);
        snprintf(tag, sizeof tag, "%s-gptq", fams[i]);
        fan_case(tag, model, "gptq", "compressed-tensors", "\"bits\":8,", i % 2 ? FAN_LEAD : FAN_DAMAGE);
        if (last_cap_experts < 1) TEST_FAIL_("%s: no capture fan-out cut by experts", tag);
        test_checks++;
    }
    snprintf(model, sizeof model, "%s/mixtral", pt_families_dir());
    fan_case("mixtral-awq", model, "awq", "gptq", "\"bits\":8,", FAN_ALL);
    CHECK_INT(last_cap_experts, 0);   /* AWQ's passes stay in the lead */
}

/* Linears wider than QD_PART_ROWS go out as row ranges; the parts of one linear are
 * merged in the lead to the same bytes. */
static void test_row_ranges(void)
{
    fan_case("wide-gptq", wide_dir, "gptq", "gptq", NULL, FAN_ALL);
    fan_case("wide-act", wide_dir, "gptq", "gptq_v2", "\"desc_act\":true,\"static_groups\":true,", FAN_ALL);
    fan_case("wide-awq", wide_dir, "awq", "awq_gemm", NULL, FAN_ALL);
    fan_case("wide-rtn", wide_dir, "rtn", "compressed-tensors", "\"true_sequential\":false,", FAN_ALL);
    fan_case("wide-bpw", wide_dir, "gptq", "compressed-tensors",
             "\"target_bpw\":5.0,\"bpw_bits\":[4,8],\"bpw_group_sizes\":[32,64],", FAN_ALL);
    fan_case("wide-gptq", wide_dir, "gptq", "gptq", NULL, FAN_DAMAGE);
}

/* What row ranges rest on: GPTQ and RTN quantize every output row alone once H is known,
 * so rows quantized in ranges are the rows of the whole, bit for bit. */
static void test_rows_independent(void)
{
    const int64_t n = 300, k = 256, rows = 1024;
    test_rng rg;
    test_rng_seed(&rg, 7);
    float *w = malloc((size_t)(n * k) * sizeof(float)), *x = malloc((size_t)(rows * k) * sizeof(float));
    for (int64_t i = 0; i < n * k; i++) w[i] = test_rng_normal(&rg);
    for (int64_t i = 0; i < rows * k; i++) x[i] = test_rng_normal(&rg) * (float)(1 + i % k % 5);
    qd_err err = {0};
    qd_gptq_hessian h;
    CHECK_OK(qd_gptq_hessian_init(&h, pt_be, k, &err));
    CHECK_OK(qd_gptq_hessian_add(&h, x, rows, &err));
    for (int act = 0; act < 2; act++) {
        qd_gptq_opts o = qd_gptq_opts_default();
        o.quant.bits = 4;
        o.quant.group_size = 64;
        o.desc_act = act;
        qd_gptq_result whole;
        memset(&whole, 0, sizeof whole);
        CHECK_OK(qd_gptq_quantize(pt_be, &o, w, n, k, &h, &whole, &err));
        int64_t cut[] = {0, 64, 192, n};
        for (int r = 0; r < 3; r++) {
            qd_gptq_result part;
            memset(&part, 0, sizeof part);
            int64_t r0 = cut[r], m = cut[r + 1] - cut[r];
            CHECK_OK(qd_gptq_quantize(pt_be, &o, w + r0 * k, m, k, &h, &part, &err));
            test_checks++;
            if (!whole.deq || !part.deq || memcmp(whole.deq + r0 * k, part.deq, (size_t)(m * k) * sizeof(float)) ||
                memcmp(whole.layer.q + r0 * k, part.layer.q, (size_t)(m * k)))
                TEST_FAIL_("desc_act %d: rows %lld..%lld quantized alone differ from the whole", act, (long long)r0,
                           (long long)(r0 + m));
            qd_gptq_result_free(&part);
        }
        qd_gptq_result_free(&whole);
    }
    qd_gptq_hessian_free(&h);
    free(w);
    free(x);
}

/* A part input that names rows of the model's weights is checked before a row is used:
 * names and checksums that are not strings, a tensor the model lacks or of another shape,
 * rows outside it, rows whose bytes changed. */
static void test_src_refusals(void)
{
    qd_err err = {0};
    st_model *sm = NULL;
    CHECK_OK(st_model_open(llama_dir, &sm, &err));
    const char *name = "model.layers.0.self_attn.q_proj.weight";
    const st_tensor *t = sm ? st_model_find(sm, name) : NULL;
    CHECK(t != NULL && t->ndim == 2);
    if (!t || t->ndim != 2) { st_model_close(sm); return; }
    int64_t n = t->shape[0], k = t->shape[1];
    st_tensor view;
    CHECK_OK(st_tensor_rows(t, 0, 64, &view, &err));
    char good[24], json[512];
    snprintf(good, sizeof good, "%016llx", (unsigned long long)qd_part_checksum(view.data, (uint64_t)(view.end - view.begin)));
    float *w = malloc((size_t)(n * k) * sizeof *w);
    struct { const char *src, *sum; int64_t r1, n; int want; const char *msg; } cases[] = {
        {"\"model.layers.0.self_attn.q_proj.weight\"", good, 64, n, 0, NULL},
        {"5", good, 64, n, QD_EFORMAT, "must be strings"},
        {"{\"a\":1}", good, 64, n, QD_EFORMAT, "must be strings"},
        {"\"model.layers.0.self_attn.q_proj.weight\"", NULL, 64, n, QD_EFORMAT, "must be strings"},
        {"\"model.layers.0.self_attn.nope.weight\"", good, 64, n, QD_EFORMAT, "has no plain"},
        {"\"model.layers.0.self_attn.q_proj.weight\"", good, 64, n + 1, QD_EFORMAT, "has no plain"},
        {"\"model.layers.0.self_attn.q_proj.weight\"", good, n + 64, n, 0, NULL},   /* want: refused (rows) */
        {"\"model.layers.0.self_attn.q_proj.weight\"", "0000000000000000", 64, n, QD_EFORMAT, "changed since"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cases[i].sum) snprintf(json, sizeof json, "{\"src\":%s,\"src_sum\":\"%s\"}", cases[i].src, cases[i].sum);
        else snprintf(json, sizeof json, "{\"src\":%s}", cases[i].src);
        cJSON *meta = cJSON_Parse(json);
        qd_err e = {0};
        int rc = qd_qpart_src_read(NULL, sm, meta, 0, cases[i].r1, cases[i].n, k, w, &e);
        test_checks++;
        if (cases[i].r1 > n) {
            if (rc == 0) TEST_FAIL_("case %zu: rows past the tensor's end were read", i);
        } else if (rc != cases[i].want || (cases[i].msg && !strstr(e.msg, cases[i].msg))) {
            TEST_FAIL_("case %zu (%s): rc %d (%s), expected %d", i, json, rc, e.msg, cases[i].want);
        }
        cJSON_Delete(meta);
    }
    /* A worker keeps the checkpoint open between parts: rows read again after the model's
     * file was replaced come from the open file when their checksum names its bytes (the
     * lead's), and from a fresh open when it names the new file's. */
    char dir[4300], path[4400];
    snprintf(dir, sizeof dir, "%s/src-kept", T);
    qd_err e = {0};
    CHECK_OK(qd_fs_mkdir_p(dir, &e));
    size_t nb = 0;
    snprintf(path, sizeof path, "%s/model.safetensors", llama_dir);
    char *bytes = pt_read(path, &nb);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "wb");
    CHECK(bytes && f && fwrite(bytes, 1, nb, f) == nb);
    if (f) fclose(f);
    free(bytes);
    qp_job job;
    memset(&job, 0, sizeof job);
    job.model = dir;
    qd_pipeline_part_idle();
    snprintf(json, sizeof json, "{\"src\":\"%s\",\"src_sum\":\"%s\"}", name, good);
    cJSON *meta = cJSON_Parse(json);
    CHECK_OK(qd_qpart_src_read(&job, NULL, meta, 0, 64, n, k, w, &e));   /* opened, kept */
    swap_model(dir);
    CHECK_OK(qd_qpart_src_read(&job, NULL, meta, 0, 64, n, k, w, &e));   /* the kept file's bytes */
    st_model *sm2 = NULL;
    CHECK_OK(st_model_open(dir, &sm2, &e));
    const st_tensor *t2 = sm2 ? st_model_find(sm2, name) : NULL;
    char fresh[24] = "";
    if (t2 && !st_tensor_rows(t2, 0, 64, &view, &e))
        snprintf(fresh, sizeof fresh, "%016llx", (unsigned long long)qd_part_checksum(view.data, (uint64_t)(view.end - view.begin)));
    CHECK(strcmp(fresh, good) != 0);
    cJSON_Delete(meta);
    snprintf(json, sizeof json, "{\"src\":\"%s\",\"src_sum\":\"%s\"}", name, fresh);
    meta = cJSON_Parse(json);
    CHECK_OK(qd_qpart_src_read(&job, NULL, meta, 0, 64, n, k, w, &e));   /* reopened: the new file's */
    cJSON_Delete(meta);
    st_model_close(sm2);
    qd_pipeline_part_idle();
    free(w);
    st_model_close(sm);
}

/* Rewrites part file `name` in dirfd, valid, with its meta changed by edit and no arrays (the
 * checks these cases reach come before any array is read). */
static void part_rewrite(int dirfd, const char *name, void (*edit)(cJSON *meta))
{
    qd_part_file f;
    qd_err err = {0};
    CHECK_OK(qd_part_file_read(dirfd, name, &f, &err));
    if (!f.meta) return;
    edit(f.meta);
    CHECK_OK(qd_part_file_write(dirfd, name, f.meta, NULL, 0, NULL, &err));
    qd_part_file_free(&f);
}
static void edit_slash(cJSON *m) { cJSON_ReplaceItemInObject(m, "hessian", cJSON_CreateString("../b0000-quantize-h000.part")); }
static void edit_width(cJSON *m) { cJSON_ReplaceItemInObject(m, "k", cJSON_CreateNumber(1 << 21)); }
static void edit_sum(cJSON *m) { cJSON_ReplaceItemInObject(m, "h_checksum", cJSON_CreateString("zz")); }
static void edit_maker(cJSON *m) { cJSON_ReplaceItemInObject(m, "made_by", cJSON_CreateString("cuda elsewhere sm_90")); }
static void edit_input(cJSON *m) { cJSON_ReplaceItemInObject(m, "in_checksum", cJSON_CreateString("0000000000000001")); }

/* A job on the llama model writing to T/tag, its parts directory made and opened (*dirfd),
 * and a part runner's pipeline for it (*p, freed by the caller); NULL when it could not be. */
static qp_job *refusal_setup(const char *tag, int *dirfd, qd_pipeline **p)
{
    char out[4200], dir[4400];
    snprintf(out, sizeof out, "%s/%s", T, tag);
    qp_job *job = pt_job(llama_dir, out, "gptq", "gptq", tokens, NULL);
    CHECK(job != NULL);
    if (!job) return NULL;
    snprintf(dir, sizeof dir, "%s/.quantd/parts", out);
    qd_err err = {0};
    CHECK_OK(qd_fs_mkdir_p(dir, &err));
    *dirfd = open(dir, O_RDONLY | O_DIRECTORY);
    CHECK(*dirfd >= 0);
    *p = calloc(1, sizeof **p);
    (*p)->job = job;
    (*p)->be = pt_be;
    CHECK_OK(qd_pipeline_quant_setup(*p, &err));
    return job;
}

/* The factor step's files, as a worker and the lead read them: an input naming a path, a
 * width out of range, a checksum that is not one, or a Hessian changed since; an output
 * made from another input, or claiming another maker than its name says: each refused with
 * a message, never used. */
static void test_factor_refusals(void)
{
    int dirfd = -1;
    qd_pipeline *p = NULL;
    qp_job *job = refusal_setup("factor-refusals", &dirfd, &p);
    if (!job) return;
    qd_err err = {0};
    const int64_t k = 64, rows = 256;
    test_rng rg;
    test_rng_seed(&rg, 11);
    float *x = malloc((size_t)(rows * k) * sizeof *x);
    for (int64_t i = 0; i < rows * k; i++) x[i] = test_rng_normal(&rg);
    qd_gptq_hessian h;
    CHECK_OK(qd_gptq_hessian_init(&h, pt_be, k, &err));
    CHECK_OK(qd_gptq_hessian_add(&h, x, rows, &err));
    CHECK_OK(qd_qpart_write_hessian(dirfd, 0, 0, &h, NULL, &err));
    uint64_t sum = 0;
    char in[64], hname[64];
    qd_fpart_name_in(in, sizeof in, 0, 0);
    qd_qpart_name_hessian(hname, sizeof hname, 0, 0);
    /* The good case: run, and read back by the lead. */
    CHECK_OK(qd_fpart_write_in(dirfd, 0, 0, 0, k, &sum, &err));
    CHECK_OK(qd_fpart_run_file(p, dirfd, 0, 0, "w1", &err));
    qd_fpart_done done;
    CHECK_OK(qd_fpart_read_out(dirfd, 0, 0, sum, pt_be, k, &done, &err));
    CHECK_STR(done.worker, "w1");
    CHECK_INT(qd_fpart_read_out(dirfd, 0, 0, sum, &other_maker, k, &done, &err), QD_ENOTFOUND);   /* not its kind's */
    CHECK_INT(qd_fpart_read_out(dirfd, 0, 0, sum, pt_be, k + 1, &done, &err), QD_EFORMAT);
    CHECK(strstr(err.msg, "not a [65, 65] factorisation") != NULL);
    /* The output edited: another maker than its name, another input. */
    char oname[96], desc[160];
    qd_part_maker_desc(pt_be, desc, sizeof desc);
    qd_fpart_name_out(oname, sizeof oname, 0, 0, sum, desc);
    struct { void (*edit)(cJSON *); const char *msg; } outs[] = {{edit_maker, "made by \"cuda elsewhere"},
                                                                   {edit_input, "computed from another input"}};
    for (size_t i = 0; i < 2; i++) {
        CHECK_OK(qd_fpart_run_file(p, dirfd, 0, 0, "w1", &err));
        part_rewrite(dirfd, oname, outs[i].edit);
        qd_err e = {0};
        CHECK_INT(qd_fpart_read_out(dirfd, 0, 0, sum, pt_be, k, &done, &e), QD_EFORMAT);
        if (!strstr(e.msg, outs[i].msg)) TEST_FAIL_("factor output case %zu: \"%s\"", i, e.msg);
    }
    /* The input edited. */
    struct { void (*edit)(cJSON *); const char *msg; } ins[] = {{edit_slash, "no Hessian named"},
                                                                  {edit_width, "a bad width"},
                                                                  {edit_sum, "no Hessian named"}};
    for (size_t i = 0; i < 3; i++) {
        CHECK_OK(qd_fpart_write_in(dirfd, 0, 0, 0, k, &sum, &err));
        part_rewrite(dirfd, in, ins[i].edit);
        qd_err e = {0};
        CHECK_INT(qd_fpart_run_file(p, dirfd, 0, 0, "w1", &e), QD_EFORMAT);
        if (!strstr(e.msg, ins[i].msg)) TEST_FAIL_("factor input case %zu: \"%s\"", i, e.msg);
    }
    /* The Hessian changed after the input named it. */
    CHECK_OK(qd_fpart_write_in(dirfd, 0, 0, 0, k, &sum, &err));
    CHECK_OK(qd_gptq_hessian_add(&h, x, 8, &err));
    CHECK_OK(qd_qpart_write_hessian(dirfd, 0, 0, &h, NULL, &err));
    qd_err e = {0};
    CHECK_INT(qd_fpart_run_file(p, dirfd, 0, 0, "w1", &e), QD_EFORMAT);
    CHECK(strstr(e.msg, "not the Hessian the part was made for") != NULL);
    /* One pass removes every maker's outputs of those inputs, and nothing else. */
    qd_part_outputs_remove(dirfd, 0, "factor", 1, &sum);
    struct stat st;
    CHECK(fstatat(dirfd, hname, &st, 0) == 0);
    qd_gptq_hessian_free(&h);
    free(x);
    free(p);
    close(dirfd);
    qp_job_free(job);
}

/* Trace parts (part.h): the rule, and the bytes of runs whose factor fan-outs carry each
 * quantize part's error denominator, whether the trace parts are taken over, lost, damaged,
 * made by an unlike backend, or refused because the model changed under the job. */
static void test_trace_parts(void)
{
    qd_backend gpu = *pt_be;
    gpu.device = 0;
    CHECK_INT(qd_tpart_pays(pt_be, 11008, 2048, -1), 1);   /* a 7B down projection's factor */
    CHECK_INT(qd_tpart_pays(pt_be, 6144, 2048, -1), 0);
    CHECK_INT(qd_tpart_pays(pt_be, 4096, 2048, -1), 0);
    CHECK_INT(qd_tpart_pays(pt_be, 4096, 1024, -1), 1);
    CHECK_INT(qd_tpart_pays(&gpu, 11008, 2048, -1), 0);
    CHECK_INT(qd_tpart_pays(pt_be, 4096, 2048, 1), 1);
    CHECK_INT(qd_tpart_pays(pt_be, 11008, 2048, 0), 0);
    /* By the rule, none of these small blocks' fan-outs has them. */
    fan_case("gptq-rule", llama_dir, "gptq", "gptq", NULL, FAN_ALL);
    CHECK_INT(last_trace_parts, 0);
    fan_trace = 1;
    static const fan_mode modes[] = {FAN_ALL, FAN_SKIP_ODD, FAN_DAMAGE, FAN_OTHER_MAKER, FAN_CANCEL_AFTER, FAN_LEAD};
    for (size_t i = 0; i < sizeof modes / sizeof *modes; i++) {
        fan_case("wide-gptq", wide_dir, "gptq", "gptq", NULL, modes[i]);
        if (last_trace_parts < 4) TEST_FAIL_("wide-gptq mode %d: %d trace parts", (int)modes[i], last_trace_parts);
        /* the row parts then read H's diagonal from their inputs, not the Hessian file */
        if (modes[i] == FAN_ALL && last_ins_diag < 4) TEST_FAIL_("wide-gptq: %d inputs with H's diagonal", last_ins_diag);
    }
    fan_case("wide-act", wide_dir, "gptq", "gptq_v2", "\"desc_act\":true,\"static_groups\":true,", FAN_ALL);
    CHECK(last_trace_parts >= 4);
    fan_case("gptq", llama_dir, "gptq", "gptq", NULL, FAN_ALL);
    CHECK(last_trace_parts >= 3);   /* q/k/v */
    /* AWQ's scaled rows are not the model's: no trace parts, the same bytes. */
    fan_case("wide-awq", wide_dir, "awq", "awq_gemm", NULL, FAN_ALL);
    CHECK_INT(last_trace_parts, 0);
    char swap_dir[4200];
    qd_testgen_opts lo = pt_llama_opts(128, 3);
    lo.dtype = QD_DTYPE_BF16;
    if (!pt_setup_model("swap-trace", &lo, swap_dir, sizeof swap_dir)) {
        fan_case("swap-trace", swap_dir, "gptq", "gptq", NULL, FAN_SWAP);
        CHECK(last_trace_parts >= 3);
    } else {
        CHECK(0);
    }
    fan_trace = -1;
}

static void edit_rows(cJSON *m) { cJSON_ReplaceItemInObject(m, "r1", cJSON_CreateNumber(1 << 20)); }
static void edit_src_sum(cJSON *m) { cJSON_ReplaceItemInObject(m, "src_sum", cJSON_CreateString("0000000000000000")); }
static void edit_no_src(cJSON *m) { cJSON_DeleteItemFromObject(m, "src"); }
static void edit_kind(cJSON *m) { cJSON_ReplaceItemInObject(m, "kind", cJSON_CreateString("sum")); }
static void edit_no_factor(cJSON *m) { cJSON_DeleteItemFromObject(m, "factor"); }

/* A trace part's files: its denominator is the one qd_pipeline_rel_traces gives the rows;
 * an input naming a path, rows out of range, rows whose bytes changed, no rows, or a kind
 * this build does not run, and an output of another maker, input or kind: each refused with
 * a message, never used. */
static void test_trace_refusals(void)
{
    int dirfd = -1;
    qd_pipeline *p = NULL;
    qp_job *job = refusal_setup("trace-refusals", &dirfd, &p);
    if (!job) return;
    qd_err err = {0};
    st_model *sm = NULL;
    CHECK_OK(st_model_open(llama_dir, &sm, &err));
    const st_tensor *t = sm ? st_model_find(sm, "model.layers.0.self_attn.q_proj.weight") : NULL;
    CHECK(t != NULL && t->ndim == 2);
    if (!t || t->ndim != 2 || dirfd < 0) {
        st_model_close(sm);
        free(p);
        qp_job_free(job);
        if (dirfd >= 0) close(dirfd);
        return;
    }
    const int64_t n = t->shape[0], k = t->shape[1], rows = 256, r0 = 16, r1 = n < 48 ? n : 48;
    test_rng rg;
    test_rng_seed(&rg, 12);
    float *x = malloc((size_t)(rows * k) * sizeof *x), *w = malloc((size_t)(n * k) * sizeof *w);
    for (int64_t i = 0; i < rows * k; i++) x[i] = test_rng_normal(&rg);
    qd_gptq_hessian h;
    CHECK_OK(qd_gptq_hessian_init(&h, pt_be, k, &err));
    CHECK_OK(qd_gptq_hessian_add(&h, x, rows, &err));
    CHECK_OK(qd_qpart_write_hessian(dirfd, 0, 0, &h, NULL, &err));
    st_tensor view;
    CHECK_OK(st_tensor_rows(t, r0, r1, &view, &err));
    CHECK_OK(st_tensor_read_f32(&view, w, &err));
    qd_qpart_in in;
    memset(&in, 0, sizeof in);
    snprintf(in.res.name, sizeof in.res.name, "model.layers.0.self_attn.q_proj");
    in.res.n = n;
    in.res.k = k;
    in.r0 = r0;
    in.r1 = r1;
    in.w = in.w_ref = w;
    in.src = t;
    in.src_sum = qd_part_checksum(view.data, (uint64_t)(view.end - view.begin));
    /* What the quantize part would measure itself. */
    double tr[2];
    CHECK_OK(qd_pipeline_rel_traces(p, w, w, r1 - r0, k, &h, 0.0, tr, &err));
    CHECK(tr[1] > 0);
    /* The good case, as trace part 1 (after one factor part): run, read back by the lead. */
    uint64_t sum = 0;
    char in_name[64], oname[96], desc[160], worker[64];
    qd_fpart_name_in(in_name, sizeof in_name, 0, 1);
    CHECK_OK(qd_tpart_write_in(dirfd, 0, 1, 0, &in, &sum, &err));
    CHECK_OK(qd_fpart_run_file(p, dirfd, 0, 1, "w2", &err));
    double den = -1, secs = -1;
    CHECK_OK(qd_tpart_read_out(dirfd, 0, 1, sum, pt_be, &den, worker, &secs, &err));
    test_checks++;
    if (memcmp(&den, &tr[1], sizeof den)) TEST_FAIL_("trace part: %.17g, the rows' own %.17g", den, tr[1]);
    CHECK_STR(worker, "w2");
    CHECK(secs >= 0);
    CHECK_INT(qd_tpart_read_out(dirfd, 0, 1, sum, &other_maker, &den, worker, &secs, &err), QD_ENOTFOUND);
    /* A factor read where a trace is, and the other way round. */
    qd_fpart_done done;
    qd_err e = {0};
    CHECK_INT(qd_fpart_read_out(dirfd, 0, 1, sum, pt_be, k, &done, &e), QD_EFORMAT);
    /* The output edited. */
    qd_part_maker_desc(pt_be, desc, sizeof desc);
    qd_fpart_name_out(oname, sizeof oname, 0, 1, sum, desc);
    struct { void (*edit)(cJSON *); const char *msg; } outs[] = {{edit_maker, "made by \"cuda elsewhere"},
                                                                   {edit_input, "computed from another input"},
                                                                   {edit_kind, "not a trace part's output"}};
    for (size_t i = 0; i < sizeof outs / sizeof *outs; i++) {
        CHECK_OK(qd_fpart_run_file(p, dirfd, 0, 1, "w2", &err));
        part_rewrite(dirfd, oname, outs[i].edit);
        qd_err e2 = {0};
        CHECK_INT(qd_tpart_read_out(dirfd, 0, 1, sum, pt_be, &den, worker, &secs, &e2), QD_EFORMAT);
        if (!strstr(e2.msg, outs[i].msg)) TEST_FAIL_("trace output case %zu: \"%s\"", i, e2.msg);
    }
    /* The input edited. */
    struct { void (*edit)(cJSON *); const char *msg; } ins[] = {{edit_slash, "no Hessian named"},
                                                                  {edit_sum, "no Hessian named"},
                                                                  {edit_rows, "bad shape or rows"},
                                                                  {edit_src_sum, "changed since"},
                                                                  {edit_no_src, "names no rows of the model"},
                                                                  {edit_kind, "is not one this build runs"}};
    for (size_t i = 0; i < sizeof ins / sizeof *ins; i++) {
        CHECK_OK(qd_tpart_write_in(dirfd, 0, 1, 0, &in, &sum, &err));
        part_rewrite(dirfd, in_name, ins[i].edit);
        qd_err e2 = {0};
        int rc = qd_fpart_run_file(p, dirfd, 0, 1, "w2", &e2);
        test_checks++;
        if (!rc || !strstr(e2.msg, ins[i].msg)) TEST_FAIL_("trace input case %zu: rc %d \"%s\"", i, rc, e2.msg);
    }
    /* A row part given the trace and a factor part's output reads H's diagonal from its input
     * instead of the Hessian file: the same rows, bit for bit, as one that reads H and
     * factors it itself; without the factor's name its input is refused. */
    uint64_t fin = 0, qs[2] = {0, 0};
    qd_fpart_done fd;
    CHECK_OK(qd_fpart_write_in(dirfd, 0, 0, 0, k, &fin, &err));
    CHECK_OK(qd_fpart_run_file(p, dirfd, 0, 0, "w1", &err));
    CHECK_OK(qd_fpart_read_out(dirfd, 0, 0, fin, pt_be, k, &fd, &err));
    qd_qpart_in q = in;
    q.gptq = 1;
    q.use_losses = 1;
    q.h = &h;
    snprintf(q.res.method, sizeof q.res.method, "gptq");
    qd_qpart_out qo[2];
    for (int v = 0; v < 2; v++) {
        q.fac = v ? &fd : NULL;
        q.den_known = v;
        q.den = v ? den : 0;
        CHECK_OK(qd_qpart_write_in(dirfd, 0, 5 + v, 0, &q, &qs[v], &err));
        char qn[64];
        qd_qpart_name_in(qn, sizeof qn, 0, 5 + v);
        cJSON *m = qd_part_file_meta(dirfd, qn);
        CHECK_INT(cJSON_HasObjectItem(cJSON_GetObjectItemCaseSensitive(m, "arrays"), "hdiag"), v);
        cJSON_Delete(m);
        CHECK_OK(qd_qpart_run_file(p, dirfd, 0, 5 + v, "w1", &err));
        CHECK_OK(qd_qpart_read_out(dirfd, 0, 5 + v, qs[v], pt_be, &q, &qo[v], worker, &err));
    }
    test_checks++;
    if (!qo[0].dq.w || !qo[1].dq.w || memcmp(qo[0].dq.w, qo[1].dq.w, (size_t)((r1 - r0) * k) * sizeof(float)) ||
        memcmp(qo[0].trace, qo[1].trace, sizeof qo[0].trace))
        TEST_FAIL_("a row part from H's diagonal differs from one from H (traces %.17g %.17g, %.17g %.17g)",
                   qo[0].trace[0], qo[0].trace[1], qo[1].trace[0], qo[1].trace[1]);
    for (int v = 0; v < 2; v++) qd_qpart_out_free(&qo[v]);
    {
        char qn[64];
        qd_qpart_name_in(qn, sizeof qn, 0, 6);
        part_rewrite_keep(dirfd, qn, edit_no_factor);
        qd_err e2 = {0};
        CHECK_INT(qd_qpart_run_file(p, dirfd, 0, 6, "w1", &e2), QD_EFORMAT);
        CHECK(strstr(e2.msg, "H's diagonal without a factor part's output") != NULL);
    }
    /* Rows not named in the model: no trace part. */
    in.src = NULL;
    CHECK_INT(qd_tpart_write_in(dirfd, 0, 1, 0, &in, &sum, &e), QD_EINVAL);
    qd_gptq_hessian_free(&h);
    free(x);
    free(w);
    free(p);
    close(dirfd);
    st_model_close(sm);
    qd_pipeline_part_idle();
    qp_job_free(job);
}

/* Parts nobody ran, damaged or truncated outputs, a cancel: the lead computes them. */
static void test_lost_parts(void)
{
    fan_case("gptq", llama_dir, "gptq", "gptq", NULL, FAN_SKIP_ODD);
    fan_case("gptq", llama_dir, "gptq", "gptq", NULL, FAN_DAMAGE);
    fan_case("gptq", llama_dir, "gptq", "gptq", NULL, FAN_CANCEL);
    fan_case("gptq", llama_dir, "gptq", "gptq", NULL, FAN_CANCEL_AFTER);
    fan_case("gptq", llama_dir, "gptq", "gptq", NULL, FAN_STOP);
    fan_case("wide-gptq", wide_dir, "gptq", "gptq", NULL, FAN_CANCEL_AFTER);
    /* Factor parts lost, damaged, cancelled, or made by a backend unlike the lead's. */
    const char *nseq = "\"true_sequential\":false,";
    fan_case("gptq-not-sequential", llama_dir, "gptq", "gptq_v2", nseq, FAN_SKIP_ODD);
    fan_case("gptq-not-sequential", llama_dir, "gptq", "gptq_v2", nseq, FAN_DAMAGE);
    fan_case("gptq-not-sequential", llama_dir, "gptq", "gptq_v2", nseq, FAN_CANCEL_AFTER);
    fan_case("gptq-not-sequential", llama_dir, "gptq", "gptq_v2", nseq, FAN_OTHER_MAKER);
    /* The model's files changed under the job: every worker refuses its rows (their checksum
     * is not the lead's), the lead computes every part itself, and the bytes do not change. */
    char swap_dir[4200];
    qd_testgen_opts lo = pt_llama_opts(128, 3);
    lo.dtype = QD_DTYPE_BF16;
    if (pt_setup_model("swap", &lo, swap_dir, sizeof swap_dir)) { CHECK(0); return; }
    fan_case("swap", swap_dir, "gptq", "gptq", NULL, FAN_SWAP);
}

/* Runs a job through qd_pipeline_open without keeping the MLP activation (the last forward
 * is then the MLP half again, from the residual stream), with the fan-out hook or without. */
static void run_no_keep(const char *model, const char *out, fan_ctx *c)
{
    qp_job *job = pt_job(model, out, "gptq", "gptq", tokens, NULL);
    CHECK(job != NULL);
    if (!job) return;
    qd_err err = {0};
    qd_pipeline *p = NULL;
    if (c) c->job = job;
    qd_pipeline_hooks hooks = {.ud = c, .fanout = on_fanout, .worker = "lead"};
    CHECK_OK(qd_pipeline_open(job, pt_be, c ? &hooks : NULL, &p, &err));
    if (p) {
        qd_pipeline_set_keep_mlp_act(p, 0);
        pt_run_all(p);
    }
    if (c) c->job = NULL;
    qp_job_free(job);
}

/* The float pass cut into parts (part_capture.c): a calibration of 9 sequences of 1024
 * tokens is three forward batches (4, 4, 1), so each block's pass of a job without
 * true-sequential goes out as three capture parts; the bytes are the in-memory run's whether
 * the parts' records are taken over, lost, damaged, made by an unlike backend, or refused
 * because the model changed under the job. */
static void test_capture(void)
{
    char long_dir[4200], cal[4400];
    qd_testgen_opts o = pt_llama_opts(128, 2);
    o.dtype = QD_DTYPE_BF16;
    o.max_pos = 1024;
    snprintf(cal, sizeof cal, "%s/calib-long.json", T);
    if (pt_setup_model("long", &o, long_dir, sizeof long_dir) || pt_write_tokens(cal, 9 * 1024 + 64, 128, 7)) {
        CHECK(0);
        return;
    }
    const char *saved = tokens;
    tokens = cal;
    pt_calib_samples = 9;
    pt_calib_seq_len = 1024;
    const char *nseq = "\"true_sequential\":false,";
    /* Without true-sequential each block's float pass and its last forward (the whole
     * quantized block, the next block's inputs as the parts' outputs) are cut. */
    static const fan_mode modes[] = {FAN_ALL, FAN_SKIP_ODD, FAN_DAMAGE, FAN_OTHER_MAKER, FAN_CANCEL_AFTER};
    for (size_t i = 0; i < sizeof modes / sizeof *modes; i++) {
        fan_case("cap-gptq", long_dir, "gptq", "gptq_v2", nseq, modes[i]);
        test_checks++;
        if (last_capture_fanouts < 4 || last_capture_parts != 3 * last_capture_fanouts || last_cap_y < 2)
            TEST_FAIL_("cap-gptq mode %d: %d capture fan-outs of %d parts, %d with outputs (2 blocks of 2 x 3, the "
                       "forwards with outputs, expected)", (int)modes[i], last_capture_fanouts, last_capture_parts, last_cap_y);
    }
    fan_case("cap-gptq-bf16", long_dir, "gptq", "gptq_v2", "\"true_sequential\":false,\"compute\":\"bf16\",", FAN_ALL);
    CHECK_INT(last_capture_fanouts, 4);
    fan_case("cap-rtn", long_dir, "rtn", "gptq_v2", nseq, FAN_ALL);
    CHECK_INT(last_capture_fanouts, 4);
    /* True-sequential: the passes over the partly quantized block that run a linear before
     * their group's input (the output projection's, after q/k/v; the down projection's, after
     * gate/up) are cut, the parts reading the quantized linears from the block's state files;
     * so are the residual stream after the attention, the quantized output projection on the
     * kept context (half "ctx"), and the last forward, the down projection on the kept
     * activation (half "act"), whose parts give back those rows and the next block's inputs. */
    fan_case("cap-seq", long_dir, "gptq", "gptq", NULL, FAN_ALL);
    CHECK_INT(last_capture_fanouts, 8);
    CHECK_INT(last_cap_half[3], 2);
    CHECK_INT(last_cap_half[4], 2);
    /* Parts the lead takes itself run on its own block (no state file applied): the same bytes. */
    fan_case("cap-seq", long_dir, "gptq", "gptq", NULL, FAN_LEAD);
    CHECK_INT(last_cap_y, 4);
    CHECK(last_lead_hidden > 0);   /* its state files were hidden while it ran */
    static const fan_mode seq_modes[] = {FAN_SKIP_ODD, FAN_DAMAGE, FAN_CANCEL_AFTER};
    for (size_t i = 0; i < sizeof seq_modes / sizeof *seq_modes; i++)
        fan_case("cap-seq", long_dir, "gptq", "gptq", NULL, seq_modes[i]);
    fan_case("cap-seq-act", long_dir, "gptq", "gptq_v2", "\"desc_act\":true,\"static_groups\":true,", FAN_DAMAGE);
    CHECK_INT(last_capture_fanouts, 8);
    /* An attention context wider than the hidden size (head_dim 32 x 4 heads = 128): nothing
     * is kept, and the first MLP pass runs the attention half, its parts giving back the
     * residual stream between the halves. */
    char ctx_dir[4200];
    qd_testgen_opts oc = o;
    oc.head_dim = 32;
    if (pt_setup_model("long-ctx", &oc, ctx_dir, sizeof ctx_dir)) { CHECK(0); return; }
    fan_case("cap-seq-ctx", ctx_dir, "gptq", "gptq", NULL, FAN_ALL);
    CHECK(last_cap_half[1] >= 2);
    CHECK_INT(last_cap_half[4], 0);
    /* calibration.shards 3 (one shard a batch here): every Hessian is summed over each shard
     * and the shards' sums combined in order, in memory as in the parts, which then sum their
     * shard's Hessians themselves; every pass that fills a Hessian is cut. */
    pt_calib_extra = ",\"shards\":3";
    fan_case("cap-shards", long_dir, "gptq", "gptq_v2", nseq, FAN_ALL);
    CHECK_INT(last_capture_fanouts, 4);
    fan_case("cap-shards", long_dir, "gptq", "gptq_v2", nseq, FAN_DAMAGE);
    fan_case("cap-shards", long_dir, "gptq", "gptq_v2", nseq, FAN_OTHER_MAKER);
    fan_case("cap-shards", long_dir, "gptq", "gptq_v2", nseq, FAN_SKIP_ODD);
    fan_case("cap-shards", long_dir, "gptq", "gptq_v2", nseq, FAN_LEAD);
    fan_case("cap-shards-seq", long_dir, "gptq", "gptq", NULL, FAN_ALL);
    /* q/k/v, o, gate/up, down: a pass each, the residual stream from the context and the last
     * forward; two blocks */
    CHECK_INT(last_capture_fanouts, 12);
    fan_case("cap-shards-seq-bf16", long_dir, "gptq", "gptq", "\"compute\":\"bf16\",", FAN_ALL);
    fan_case("cap-shards-ctx", ctx_dir, "gptq", "gptq", NULL, FAN_DAMAGE);
    /* A MoE block's passes cut by experts with shards: each part sums its experts' Hessians a
     * shard at a time and combines them in order, as the lead's pass does. */
    char moe_dir[4200];
    snprintf(moe_dir, sizeof moe_dir, "%s/mixtral", pt_families_dir());
    int samples = pt_calib_samples, seq_len = pt_calib_seq_len;
    pt_calib_samples = 72;   /* its 128 positions: 3 forward batches of 32, 32 and 8 sequences */
    pt_calib_seq_len = 128;
    fan_case("cap-moe-shards", moe_dir, "gptq", "gptq", "\"bits\":8,", FAN_DAMAGE);
    CHECK_INT(last_cap_experts, 2);   /* the down passes (the gate/up ones: the lead's, above) */
    CHECK_INT(last_cap_shards, 3);
    fan_case("cap-moe-shards-routed", moe_dir, "gptq", "gptq", "\"bits\":8,\"moe\":{\"calibrate_all_experts\":false,\"min_tokens\":1},",
             FAN_DAMAGE);
    CHECK_INT(last_cap_experts, 2 * 2);
    CHECK_INT(last_cap_shards, 3);
    fan_case("cap-moe-shards", moe_dir, "gptq", "gptq", "\"bits\":8,", FAN_LEAD);
    /* Inputs an expert part must refuse, every edit once at least (2 fan-outs a run, 4 with
     * routed tokens only). */
    ex_bad_next = 0;
    fan_case("cap-moe-shards", moe_dir, "gptq", "gptq", "\"bits\":8,", FAN_CAP_BAD);
    fan_case("cap-moe-shards-act", moe_dir, "gptq", "gptq", "\"bits\":8,\"desc_act\":true,", FAN_CAP_BAD);
    fan_case("cap-moe-shards-routed", moe_dir, "gptq", "gptq",
             "\"bits\":8,\"moe\":{\"calibrate_all_experts\":false,\"min_tokens\":1},", FAN_CAP_BAD);
    CHECK(ex_bad_next >= (int)(sizeof ex_edits / sizeof *ex_edits));
    pt_calib_samples = samples;
    pt_calib_seq_len = seq_len;
    /* Inputs a worker must refuse (every edit once at least: 8 capture fan-outs). */
    fan_case("cap-shards-seq", long_dir, "gptq", "gptq", NULL, FAN_CAP_BAD);
    CHECK(last_capture_fanouts >= (int)(sizeof cap_edits / sizeof *cap_edits));
    pt_calib_extra = "";
    /* The sums' order is the job's: three shards give other last digits than one. */
    int wa = 0, wb = 0;
    char sa[4400], sb[4400];
    snprintf(sa, sizeof sa, "%s/cap-gptq-ref", T);
    snprintf(sb, sizeof sb, "%s/cap-shards-ref", T);
    char *la = report_layers(sa, &wa), *lb = report_layers(sb, &wb);
    CHECK(la && lb && strcmp(la, lb));
    free(la);
    free(lb);
    /* The MLP activation not kept: the last forward runs the MLP half from the residual
     * stream, its parts giving back the next block's inputs. */
    char ref[4200], out[4200];
    snprintf(ref, sizeof ref, "%s/cap-nokeep-ref", T);
    snprintf(out, sizeof out, "%s/cap-nokeep-fan", T);
    run_no_keep(long_dir, ref, NULL);
    fan_ctx fc = {.mode = FAN_ALL};
    run_no_keep(long_dir, out, &fc);
    CHECK_INT(fc.failed, 0);
    CHECK(fc.cap_half[2] >= 4 && fc.cap_y >= 2);   /* the down passes and the last forwards */
    check_same("cap-nokeep", ref, out);
    /* The model's files replaced at the first fan-out (the capture's): every part refuses. */
    char swap_dir[4200];
    if (pt_setup_model("long-swap", &o, swap_dir, sizeof swap_dir)) { CHECK(0); return; }
    fan_case("cap-swap", swap_dir, "gptq", "gptq_v2", nseq, FAN_SWAP);
    CHECK(last_capture_fanouts >= 1);
    tokens = saved;
    pt_calib_samples = 8;
    pt_calib_seq_len = 32;
}

int main(void)
{
    qd_testgen_opts lo = pt_llama_opts(128, 3);
    lo.dtype = QD_DTYPE_BF16;
    qd_testgen_opts wo = pt_llama_opts(2112, 2);
    if (pt_setup(1, 4000, 128, 3, &T, &tokens) || pt_setup_model("llama", &lo, llama_dir, sizeof llama_dir) ||
        pt_setup_model("wide", &wo, wide_dir, sizeof wide_dir))
        return 1;
    other_maker = *pt_be;
    snprintf(other_maker.desc, sizeof other_maker.desc, "cpu openblas=another-core threads=%d", pt_be->n_threads);
    TEST_RUN(test_rows_independent);
    TEST_RUN(test_dense);
    TEST_RUN(test_row_ranges);
    TEST_RUN(test_moe);
    TEST_RUN(test_capture);
    TEST_RUN(test_lost_parts);
    TEST_RUN(test_src_refusals);
    TEST_RUN(test_factor_refusals);
    TEST_RUN(test_trace_parts);
    TEST_RUN(test_trace_refusals);
    return pt_teardown();
}
