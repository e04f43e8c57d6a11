/* The capture step's parts (part.h, docs/parallel.md): a forward pass of a block cut into
 * runs of its calibration batches. A part runs the block, as the lead holds it at that pass,
 * over its batches, on whichever worker is free, and records what each input hook call saw
 * (the group, the rows, their values), and, as the pass asks, the half's outputs (the next
 * block's inputs, or the residual stream after the attention). The lead then feeds the calls
 * to its own hooks in the order one pass would have made them, so every Hessian, kept input
 * and kernel-check row is the one the pass computes in memory, bit for bit, however the
 * batches were spread. A batch's forward does not depend on the others and the cut is at
 * batch boundaries, so the bytes depend neither on the cut nor on the workers.
 *
 * The block as the lead holds it: the model's weights (the part checks their stored bytes
 * against the lead's checksum) with the linears quantized so far replaced by the lead's
 * dequantized weights, from the block's state files (each linear written once a block).
 * The lead takes over only an output made by a backend like its own (a forward's bits depend
 * on the kernels, as GPTQ's do), and runs in memory a part it cannot use. */
#include "quant/pipeline/part.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "quant/core/clock.h"
#include "quant/core/log.h"
#include "quant/core/safetensors.h"
#include "quant/pipeline/acts.h"

/* The halves a part runs (qd_block_part's), "act": the last forward from the kept MLP
 * activation (qd_capture_out_from_act), and "ctx": the residual stream after the attention
 * from the kept context (qd_capture_mid_from_ctx). */
static const char *const half_names[] = {"all", "attn", "mlp", "act", "ctx"};
#define CPART_HALF_ACT 3
#define CPART_HALF_CTX 4
#define CPART_HALVES 5

void qd_cpart_name_in(char *buf, size_t cap, int block, int index)
{
    snprintf(buf, cap, "b%04d-capture-%04d.in.part", block, index);
}

void qd_cpart_name_out(char *buf, size_t cap, int block, int index, uint64_t in_checksum, const char *desc)
{
    snprintf(buf, cap, "b%04d-capture-%04d-%016llx-%08llx.out.part", block, index, (unsigned long long)in_checksum,
             (unsigned long long)qd_part_maker_hash(desc));
}

int qd_cpart_plan(const qd_pipeline *p, int block, int64_t *seq_starts)
{
    if (!p->hooks.fanout || p->be->device >= 0 || qd_model_block_is_moe(p->m, block) || p->batch_seqs <= 0) return 0;
    if (p->n_shards > 1) {   /* a part a shard: its Hessians summed in the part */
        memcpy(seq_starts, p->shard_starts, (size_t)(p->n_shards + 1) * sizeof *seq_starts);
        return p->n_shards;
    }
    int64_t nb = (p->n_seq + p->batch_seqs - 1) / p->batch_seqs;
    if (nb < 2) return 0;
    int P = nb < QD_CPART_MAX ? (int)nb : QD_CPART_MAX;
    for (int i = 0; i <= P; i++) {
        int64_t s = (int64_t)i * nb / P * p->batch_seqs;
        seq_starts[i] = s < p->n_seq ? s : p->n_seq;
    }
    return P;
}

int qd_cpart_pass_pays(const qd_pipeline *p, const int *present, qd_block_part half, int stop_group)
{
    if (stop_group < 0) return 1;   /* the whole half */
    for (int h = 0; h < stop_group; h++)
        if (present[h] && (half != QD_BLOCK_MLP || qd_model_group_part(p->m, h) == QD_BLOCK_MLP)) return 1;
    return 0;
}

/* The checksum of the stored bytes of every tensor of `block` in m's files (the lead's and
 * each part's, compared: a part refuses a model changed under the job). QD_EUNSUPPORTED when
 * a tensor is not in a file mapping. */
static int block_bytes_sum(const qd_model *m, int block, uint64_t *sum)
{
    char prefix[600];
    if (qd_model_block_prefix(m, block, prefix, sizeof prefix)) return QD_EINVAL;
    const size_t pl = strlen(prefix);
    const st_model *sm = qd_model_tensors(m);
    uint64_t h = QD_HASH64_INIT;
    for (size_t i = 0; i < st_model_count(sm); i++) {
        const st_tensor *t = st_model_tensor(sm, i);
        if (strncmp(t->name, prefix, pl)) continue;
        if (!t->data || !t->mapped) return QD_EUNSUPPORTED;
        uint64_t ts = qd_part_checksum(t->data, t->end - t->begin);
        h = qd_hash64(t->name, strlen(t->name), h);
        h = qd_hash64(&ts, sizeof ts, h);
    }
    *sum = h;
    return 0;
}

static int64_t meta_num(const cJSON *meta, const char *key, int64_t dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(meta, key);
    return cJSON_IsNumber(v) ? (int64_t)v->valuedouble : dflt;
}

static const char *meta_str(const cJSON *meta, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(meta, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* ---- the block's state: the linears quantized so far ---- */

/* Writes the linears `quantized` marks that no state file holds yet (their weights as bw
 * holds them) into a new state file. */
static int state_write(qd_pipeline *p, const qd_block_weights *bw, int block, const int *quantized, qd_cpart_state *st,
                       qd_err *err)
{
    int lis[QD_MAX_LINEARS], n = 0;
    for (int li = 0; li < qd_model_n_linears(p->m); li++)
        if (quantized[li] && !st->written[li]) lis[n++] = li;
    if (!n) return 0;
    if (st->n_files == QD_CPART_MAX_STATES) return qd_err_set(err, QD_EINVAL, "block %d: more than %d state files", block, QD_CPART_MAX_STATES);
    char *name = st->names[st->n_files];
    snprintf(name, sizeof st->names[0], "b%04d-state-%02d.part", block, st->n_files);
    qd_part_arr *arrs = calloc((size_t)n, sizeof *arrs);
    float **own = calloc((size_t)n, sizeof *own);
    char (*an)[16] = calloc((size_t)n, 16);
    cJSON *meta = cJSON_CreateObject(), *list = cJSON_CreateArray();
    int rc = arrs && own && an && meta && list ? 0 : qd_err_set(err, QD_ENOMEM, "out of memory");
    for (int i = 0; i < n && !rc; i++) {
        const qd_linear_info *L = qd_model_linear(p->m, lis[i]);
        size_t bytes = (size_t)(L->n * L->k) * sizeof(float);
        const float *w = qd_part_host_view(p->be, bw->w[lis[i]], bytes, &own[i]);
        if (!w) rc = qd_err_set(err, QD_ENOMEM, "out of memory for %s", L->name);
        snprintf(an[i], 16, "w%d", lis[i]);
        arrs[i] = (qd_part_arr){an[i], w, bytes};
        if (!rc && !cJSON_AddItemToArray(list, cJSON_CreateNumber(lis[i]))) rc = qd_err_set(err, QD_ENOMEM, "out of memory");
    }
    if (!rc) {
        cJSON_AddStringToObject(meta, "step", "state");
        cJSON_AddNumberToObject(meta, "block", block);
        cJSON_AddItemToObject(meta, "linears", list);
        list = NULL;
        rc = qd_part_file_write(p->parts_fd, name, meta, arrs, n, &st->sums[st->n_files], err);
    }
    if (!rc) {
        for (int i = 0; i < n; i++) st->written[lis[i]] = 1;
        st->n_files++;
    }
    for (int i = 0; own && i < n; i++) free(own[i]);
    free(own);
    free(arrs);
    free(an);
    cJSON_Delete(list);
    cJSON_Delete(meta);
    return rc;
}

/* The worker's side: each state file the input names, checked by its checksum, its linears
 * set into bw. */
static int state_apply(const cJSON *states, int skip, int dirfd, qd_model *m, qd_block_weights *bw, int block,
                       const char *in, qd_err *err)
{
    const cJSON *s;
    int rc = 0, at = 0;
    cJSON_ArrayForEach(s, states) {
        if (at++ < skip) continue;
        const cJSON *nj = cJSON_GetArrayItem(s, 0), *sj = cJSON_GetArrayItem(s, 1);
        unsigned long long want = 0;
        char prefix[24];
        snprintf(prefix, sizeof prefix, "b%04d-state-", block);
        if (!cJSON_IsString(nj) || strncmp(nj->valuestring, prefix, strlen(prefix)) || strchr(nj->valuestring, '/') ||
            !cJSON_IsString(sj) || sscanf(sj->valuestring, "%16llx", &want) != 1)
            return qd_err_set(err, QD_EFORMAT, "part file %s: a bad state file name or checksum", in);
        qd_part_file f;
        rc = qd_part_file_read(dirfd, nj->valuestring, &f, err);
        if (rc) return rc;
        if (f.checksum != want) rc = qd_err_set(err, QD_EFORMAT, "part file %s: not the state the lead wrote", nj->valuestring);
        const cJSON *l, *list = rc ? NULL : cJSON_GetObjectItemCaseSensitive(f.meta, "linears");
        if (!rc && !cJSON_IsArray(list)) rc = qd_err_set(err, QD_EFORMAT, "part file %s: no linears", nj->valuestring);
        cJSON_ArrayForEach(l, list) {
            int li = cJSON_IsNumber(l) ? (int)l->valuedouble : -1;
            if (li < 0 || li >= qd_model_n_linears(m)) {
                rc = qd_err_set(err, QD_EFORMAT, "part file %s: a bad linear", nj->valuestring);
                break;
            }
            const qd_linear_info *L = qd_model_linear(m, li);
            char an[16];
            snprintf(an, sizeof an, "w%d", li);
            const float *w = qd_part_file_arr(&f, an, (uint64_t)(L->n * L->k) * sizeof(float), err);
            rc = w ? qd_block_linear_set(m, bw, li, w, NULL, err) : QD_EFORMAT;
            if (rc) break;
        }
        qd_part_file_free(&f);
        if (rc) return rc;
    }
    return 0;
}

/* ---- the block a worker keeps between parts ---- */

/* The block this process last ran capture parts on, kept for its next ones: a pass's parts
 * and the block's later passes need it again, and loading it (its weights converted to F32,
 * its stored bytes checksummed) costs about a second for a 7B block. Keyed by the model, the
 * block and the compute; the state files it has applied must be the first ones a part lists
 * (the block's quantized linears only grow), else it is loaded anew. Dropped after the
 * worker's idle time (qd_pipeline_part_idle) or on any failure. */
static pthread_mutex_t blk_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    char model[4096];
    int block, bf16;
    const qd_backend *be;
    qd_model *m;
    qd_block_weights *bw;
    uint64_t sum;
    int n_states;
    char states[QD_CPART_MAX_STATES][48];
    uint64_t state_sums[QD_CPART_MAX_STATES];
    /* A MoE block for expert parts: loaded without its linears (qd_block_load_some); a part
     * loads those it sets from its input and unloads them when it ends (a batch cut's part
     * never takes such a block). */
    int partial;
} blk;

/* The block of the lead's pass being cut, while its fan-out runs: a part of it that the lead
 * takes itself (its fan-out hook runs parts in its own thread, under its own worker name)
 * runs on the lead's block as it holds it (no second copy of the block, nothing to load or
 * apply). Set and read under blk_lock. */
static struct {
    const char *job, *worker;
    int block, bf16;
    qd_model *m;
    const qd_block_weights *bw;
} lead_blk;

static void blk_drop(void)
{
    qd_block_free(blk.m, blk.bw);
    qd_model_close(blk.m);
    memset(&blk, 0, sizeof blk);
}

void qd_cpart_cache_drop(void)
{
    pthread_mutex_lock(&blk_lock);
    blk_drop();
    pthread_mutex_unlock(&blk_lock);
}

/* Whether the states blk applied are the first ones `states` lists. */
static int blk_states_prefix(const cJSON *states)
{
    if (cJSON_GetArraySize(states) < blk.n_states) return 0;
    for (int i = 0; i < blk.n_states; i++) {
        const cJSON *pair = cJSON_GetArrayItem(states, i);
        const cJSON *nj = cJSON_GetArrayItem(pair, 0), *sj = cJSON_GetArrayItem(pair, 1);
        unsigned long long sum = 0;
        if (!cJSON_IsString(nj) || strcmp(nj->valuestring, blk.states[i]) || !cJSON_IsString(sj) ||
            sscanf(sj->valuestring, "%16llx", &sum) != 1 || sum != blk.state_sums[i])
            return 0;
    }
    return 1;
}

/* blk holding `block` of p's model as the part's input asks (its stored bytes checked against
 * the lead's checksum, every listed state applied). Called with blk_lock held. */
static int blk_get(qd_pipeline *p, int block, int bf16, uint64_t want_sum, const cJSON *states, int experts, int dirfd,
                   const char *name, qd_err *err)
{
    const char *model = p->job->model;
    int hit = blk.m && blk.be == p->be && blk.block == block && blk.bf16 == bf16 && !strcmp(blk.model, model) &&
              blk.sum == want_sum && blk_states_prefix(states) && blk.partial == (experts != 0);
    int rc = 0;
    if (!hit) {
        blk_drop();
        if (strlen(model) >= sizeof blk.model) return qd_err_set(err, QD_EINVAL, "part file %s: model path too long", name);
        rc = qd_model_open(model, p->be, &blk.m, err);
        if (!rc) rc = qd_model_set_compute_bf16(blk.m, bf16, err);
        if (!rc && block >= qd_model_cfg(blk.m)->n_layers)
            rc = qd_err_set(err, QD_EFORMAT, "part file %s: block %d is not the model's", name, block);
        if (!rc && qd_model_block_is_moe(blk.m, block) != (experts != 0))
            rc = qd_err_set(err, QD_EFORMAT, "part file %s: block %d %s experts, its input says otherwise", name, block,
                            experts ? "has no" : "has");
        /* An expert cut's part runs only its experts, from inputs that never pass through the
         * other linears: they stay unloaded (their F32 copy is most of a MoE block's). */
        if (!rc) rc = qd_block_load_some(blk.m, block, !experts, &blk.bw, err);
        blk.partial = experts != 0;
        /* The block's stored bytes must be the ones the lead holds: a model changed under the
         * job is refused, and the lead runs the part itself. */
        if (!rc && (block_bytes_sum(blk.m, block, &blk.sum) || blk.sum != want_sum))
            rc = qd_err_set(err, QD_EFORMAT, "part file %s: block %d's weights in the model's files are not the ones "
                            "the lead quantizes (changed under the job?)", name, block);
        snprintf(blk.model, sizeof blk.model, "%s", model);
        blk.block = block;
        blk.bf16 = bf16;
        blk.be = p->be;
    }
    if (!rc) qd_model_set_moe_calibrate_all(blk.m, p->job->moe.calibrate_all_experts);
    if (!rc) rc = state_apply(states, blk.n_states, dirfd, blk.m, blk.bw, block, name, err);
    for (int i = blk.n_states; !rc && i < cJSON_GetArraySize(states); i++) {
        const cJSON *pair = cJSON_GetArrayItem(states, i);
        unsigned long long sum = 0;
        sscanf(cJSON_GetArrayItem(pair, 1)->valuestring, "%16llx", &sum);
        snprintf(blk.states[i], sizeof blk.states[i], "%s", cJSON_GetArrayItem(pair, 0)->valuestring);
        blk.state_sums[i] = sum;
        blk.n_states = i + 1;
    }
    if (rc) blk_drop();
    return rc;
}

/* ---- a part's input and its run ---- */

/* The first rows of a group c's hooks keep (the kernel check's, the direct error's). */
static int64_t keep_rows_of(const qd_capture_ctx *c)
{
    int64_t keep = 0;
    if (c->kcheck && c->kcheck->cap > keep) keep = c->kcheck->cap;
    if (c->direct && c->direct->cap > keep) keep = c->direct->cap;
    return keep;
}

/* The expert (or QD_SHARED_EXPERT) a MoE group's linears belong to; -1 for any other group. */
static int group_expert(const qd_model *m, int g)
{
    return qd_model_linear(m, qd_model_group(m, g)->linears[0])->expert;
}

/* Whether linear li is one of the experts' linears of the groups want marks (an MLP linear of
 * the same expert as one of them). */
static int linear_of_wanted_expert(const qd_model *m, const int *want, int li)
{
    const qd_linear_info *L = qd_model_linear(m, li);
    if (L->expert == -1 || qd_model_group_part(m, L->group) != QD_BLOCK_MLP) return 0;
    for (int g = 0; g < qd_model_n_groups(m); g++)
        if (want[g] && group_expert(m, g) == L->expert) return 1;
    return 0;
}

int qd_cpart_write_in(qd_pipeline *p, int dirfd, int block, int index, int64_t seq0, int64_t seq1,
                      const qd_capture_ctx *c, const qd_cpart_spec *spec, const qd_block_weights *bw,
                      const char *x_name, uint64_t x_sum, uint64_t block_sum, uint64_t *checksum, qd_err *err)
{
    char name[64], bsum[24];
    qd_cpart_name_in(name, sizeof name, block, index);
    snprintf(bsum, sizeof bsum, "%016llx", (unsigned long long)block_sum);
    const int64_t L = p->seq_len, H = p->hidden;
    const int act = spec->act_width > 0, ctx = spec->ctx_width > 0, ex = spec->experts;
    /* x's width: the activation's, the context's, or the hidden size */
    const int64_t W = act ? spec->act_width : ctx ? spec->ctx_width : H;
    uint64_t n = (uint64_t)((seq1 - seq0) * L * W), nm = (uint64_t)((seq1 - seq0) * L * H);
    float *own = NULL, *own_mid = NULL;
    /* An expert cut's parts read x from the pass's one file (x_name). The last forward and the
     * residual stream from the context also read the residual stream they add to: after the
     * attention (p->mid), or the block's input (p->acts). */
    const float *x = ex ? NULL : qd_part_host_view(p->be, spec->x + seq0 * L * W, n * sizeof(float), &own);
    const float *resid = act ? p->mid : ctx ? p->acts : NULL;
    const float *xm = resid && x ? qd_part_host_view(p->be, resid + seq0 * L * H, nm * sizeof(float), &own_mid) : NULL;
    if ((!ex && !x) || (resid && !xm)) {
        free(own);
        return qd_err_set(err, QD_ENOMEM, "out of memory for a capture part's input");
    }
    qd_part_farr fx, fm;
    memset(&fx, 0, sizeof fx);
    memset(&fm, 0, sizeof fm);
    const int nl = qd_model_n_linears(p->m);
    qd_part_arr *arrs = calloc((size_t)nl + 2, sizeof *arrs);
    char (*an)[16] = calloc((size_t)nl, 16);
    int na = 0;
    cJSON *meta = cJSON_CreateObject(), *groups = cJSON_CreateArray(), *states = cJSON_CreateArray();
    cJSON *lins = cJSON_CreateArray();
    int rc = meta && groups && states && lins && arrs && an ? 0 : qd_err_set(err, QD_ENOMEM, "out of memory");
    for (int g = 0; g < qd_model_n_groups(p->m) && !rc; g++)
        if (c->want[g] && !cJSON_AddItemToArray(groups, cJSON_CreateNumber(g))) rc = qd_err_set(err, QD_ENOMEM, "out of memory");
    for (int i = 0; !ex && spec->st && i < spec->st->n_files && !rc; i++) {
        char sum[24];
        snprintf(sum, sizeof sum, "%016llx", (unsigned long long)spec->st->sums[i]);
        cJSON *pair = cJSON_CreateArray();
        if (!pair || !cJSON_AddItemToArray(pair, cJSON_CreateString(spec->st->names[i])) ||
            !cJSON_AddItemToArray(pair, cJSON_CreateString(sum)) || !cJSON_AddItemToArray(states, pair))
            rc = qd_err_set(err, QD_ENOMEM, "out of memory");
    }
    /* An expert cut's part: its experts' linears quantized so far, as the lead holds them
     * (the CPU backend's memory is the host's: written in place). */
    for (int li = 0; ex && li < nl && !rc; li++) {
        if (!spec->quantized || !spec->quantized[li] || !linear_of_wanted_expert(p->m, c->want, li)) continue;
        const qd_linear_info *Li = qd_model_linear(p->m, li);
        snprintf(an[li], 16, "w%d", li);
        arrs[na++] = (qd_part_arr){an[li], bw->w[li], (uint64_t)(Li->n * Li->k) * sizeof(float)};
        if (!cJSON_AddItemToArray(lins, cJSON_CreateNumber(li))) rc = qd_err_set(err, QD_ENOMEM, "out of memory");
    }
    if (!rc) {
        cJSON_AddStringToObject(meta, "step", "capture");
        cJSON_AddNumberToObject(meta, "index", index);
        cJSON_AddNumberToObject(meta, "block", block);
        cJSON_AddNumberToObject(meta, "seq0", (double)seq0);
        cJSON_AddNumberToObject(meta, "n_seq", (double)(seq1 - seq0));
        cJSON_AddNumberToObject(meta, "seq_len", (double)L);
        cJSON_AddNumberToObject(meta, "batch_seqs", (double)p->batch_seqs);
        cJSON_AddNumberToObject(meta, "hidden", (double)H);
        cJSON_AddNumberToObject(meta, "width", (double)W);
        cJSON_AddStringToObject(meta, "compute", qp_compute_name(p->compute));
        cJSON_AddStringToObject(meta, "block_sum", bsum);
        cJSON_AddStringToObject(meta, "half", half_names[act ? CPART_HALF_ACT : ctx ? CPART_HALF_CTX : spec->half]);
        cJSON_AddNumberToObject(meta, "stop_after", c->stop_after);
        cJSON_AddBoolToObject(meta, "y", spec->y != NULL);
        /* With shards the part sums its Hessians and records only the rows the hooks keep: the
         * first ones (the kernel check's, the direct error's) and a kept group's every row. An
         * expert cut's part does so always, in the job's shards over every row ("n_shards"). */
        cJSON_AddBoolToObject(meta, "shards", p->n_shards > 1 || ex);
        cJSON_AddNumberToObject(meta, "keep_rows", (double)keep_rows_of(c));
        cJSON_AddNumberToObject(meta, "keep_all", c->xcap ? c->xcap_group : -1);
        cJSON_AddItemToObject(meta, "groups", groups);
        groups = NULL;
        cJSON_AddItemToObject(meta, "states", states);
        states = NULL;
        if (ex) {
            char xs[24];
            snprintf(xs, sizeof xs, "%016llx", (unsigned long long)x_sum);
            cJSON *xf = cJSON_CreateArray();
            if (!xf || !cJSON_AddItemToArray(xf, cJSON_CreateString(x_name)) || !cJSON_AddItemToArray(xf, cJSON_CreateString(xs)))
                rc = qd_err_set(err, QD_ENOMEM, "out of memory");
            cJSON_AddItemToObject(meta, "x_file", xf);
            cJSON_AddBoolToObject(meta, "experts", 1);
            cJSON_AddNumberToObject(meta, "n_shards", p->n_shards > 1 ? p->n_shards : 1);
            cJSON_AddItemToObject(meta, "linears", lins);
            lins = NULL;
        }
        if (!rc && !ex) rc = qd_part_farr_make("x", x, n, 0, &fx, err);
    }
    if (!rc && !ex && qd_part_farr_note(meta, &fx)) rc = qd_err_set(err, QD_ENOMEM, "out of memory");
    if (!rc && xm) rc = qd_part_farr_make("mid", xm, nm, 0, &fm, err);
    if (!rc && xm && qd_part_farr_note(meta, &fm)) rc = qd_err_set(err, QD_ENOMEM, "out of memory");
    if (!rc && !ex) {
        arrs[na++] = fx.arr;
        if (xm) arrs[na++] = fm.arr;
    }
    if (!rc) rc = qd_part_file_write(dirfd, name, meta, arrs, na, checksum, err);
    cJSON_Delete(lins);
    cJSON_Delete(states);
    cJSON_Delete(groups);
    cJSON_Delete(meta);
    qd_part_farr_free(&fx);
    qd_part_farr_free(&fm);
    free(arrs);
    free(an);
    free(own);
    free(own_mid);
    return rc;
}

static void rec_free(qd_capture_rec *r)
{
    free(r->call_group);
    free(r->call_rows);
    for (int g = 0; g < QD_MAX_GROUPS; g++) free(r->x[g]);
    memset(r, 0, sizeof *r);
}

/* What a part's input asks, read and checked. */
typedef struct cpart_in {
    int64_t n_seq, L, bs, H, W, rows, keep_rows;
    int half, stop_after, want_y, bf16, shards, keep_all;
    unsigned long long block_sum;
    const cJSON *groups, *states;
    /* An expert cut's part: its shards, the file x is in and its checksum, the linears it sets. */
    int experts, n_shards;
    const char *x_name;
    unsigned long long x_sum;
    const cJSON *linears;
} cpart_in;

static int cpart_in_read(const qd_part_file *f, const char *name, int block, cpart_in *in, qd_err *err)
{
    memset(in, 0, sizeof *in);
    in->n_seq = meta_num(f->meta, "n_seq", -1);
    in->L = meta_num(f->meta, "seq_len", -1);
    in->bs = meta_num(f->meta, "batch_seqs", -1);
    in->H = meta_num(f->meta, "hidden", -1);
    in->W = meta_num(f->meta, "width", -1);
    in->stop_after = (int)meta_num(f->meta, "stop_after", -2);
    const char *compute = meta_str(f->meta, "compute"), *half = meta_str(f->meta, "half"), *bsum = meta_str(f->meta, "block_sum");
    in->groups = cJSON_GetObjectItemCaseSensitive(f->meta, "groups");
    in->states = cJSON_GetObjectItemCaseSensitive(f->meta, "states");
    const cJSON *y = cJSON_GetObjectItemCaseSensitive(f->meta, "y");
    in->half = -1;
    for (int i = 0; half && i < CPART_HALVES; i++)
        if (!strcmp(half, half_names[i])) in->half = i;
    if (in->n_seq <= 0 || in->L <= 0 || in->bs <= 0 || in->H <= 0 || in->n_seq > (1 << 20) || in->L > (1 << 24) ||
        in->bs > (1 << 20) || in->H > (1 << 20) || (double)in->n_seq * (double)in->L * (double)in->H > (double)(1ll << 36) ||
        in->W <= 0 || in->W > (1 << 20) || (double)in->n_seq * (double)in->L * (double)in->W > (double)(1ll << 36) ||
        !cJSON_IsArray(in->groups) || !cJSON_IsArray(in->states) || !compute || (strcmp(compute, "bf16") && strcmp(compute, "f32")) ||
        in->half < 0 || in->stop_after < -1 || in->stop_after >= QD_MAX_GROUPS || !cJSON_IsBool(y) ||
        meta_num(f->meta, "block", -1) != block || !bsum || sscanf(bsum, "%16llx", &in->block_sum) != 1)
        return qd_err_set(err, QD_EFORMAT, "part file %s: a bad shape, compute, half, group list or checksum", name);
    /* A half's input is as wide as the hidden size; the last forward's is the activation and
     * the residual stream's from the context is the context: they record nothing and return
     * the block's outputs, or the residual stream after the attention. */
    if (in->half == CPART_HALF_ACT || in->half == CPART_HALF_CTX
            ? cJSON_GetArraySize(in->groups) || in->stop_after != -1 || !cJSON_IsTrue(y)
            : in->W != in->H)
        return qd_err_set(err, QD_EFORMAT, "part file %s: a bad group list, width or output for half %s", name, half);
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(f->meta, "shards");
    in->keep_rows = meta_num(f->meta, "keep_rows", -1);
    in->keep_all = (int)meta_num(f->meta, "keep_all", -2);
    if (!cJSON_IsBool(sh) || in->keep_rows < 0 || in->keep_all < -1 || in->keep_all >= QD_MAX_GROUPS)
        return qd_err_set(err, QD_EFORMAT, "part file %s: bad shards, keep_rows or keep_all", name);
    in->shards = cJSON_IsTrue(sh);
    in->want_y = cJSON_IsTrue(y);
    in->bf16 = !strcmp(compute, "bf16");
    in->rows = in->n_seq * in->L;
    in->experts = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(f->meta, "experts"));
    if (!in->experts) return 0;
    const cJSON *xf = cJSON_GetObjectItemCaseSensitive(f->meta, "x_file");
    const cJSON *xn = cJSON_GetArrayItem(xf, 0), *xs = cJSON_GetArrayItem(xf, 1);
    char prefix[24];
    snprintf(prefix, sizeof prefix, "b%04d-capture-x", block);
    in->n_shards = (int)meta_num(f->meta, "n_shards", -1);
    in->linears = cJSON_GetObjectItemCaseSensitive(f->meta, "linears");
    in->x_name = cJSON_IsString(xn) ? xn->valuestring : NULL;
    if (in->half != QD_BLOCK_MLP || in->want_y || !in->shards || in->keep_all != -1 || !cJSON_GetArraySize(in->groups) ||
        in->n_shards < 1 || in->n_shards > QD_CPART_MAX || !cJSON_IsArray(in->linears) || !in->x_name ||
        strncmp(in->x_name, prefix, strlen(prefix)) || strchr(in->x_name, '/') || !cJSON_IsString(xs) ||
        sscanf(xs->valuestring, "%16llx", &in->x_sum) != 1)
        return qd_err_set(err, QD_EFORMAT, "part file %s: a bad expert part (half, output, shards, linears or input file)",
                          name);
    return 0;
}

/* Checks the linears an expert cut's part lists (each one of its experts', once; listed[]
 * gets them) and, with set, loads each into bw (its bias, room for the weight) and sets its
 * weight from the part's arrays. */
static int expert_linears_set(const qd_part_file *f, const cJSON *linears, const int *want, qd_model *m,
                              qd_block_weights *bw, int set, unsigned char *listed, const char *name, qd_err *err)
{
    const cJSON *l;
    cJSON_ArrayForEach(l, linears) {
        int li = cJSON_IsNumber(l) ? (int)l->valuedouble : -1;
        if (li < 0 || li >= qd_model_n_linears(m) || listed[li] || !linear_of_wanted_expert(m, want, li))
            return qd_err_set(err, QD_EFORMAT, "part file %s: linear %d is not one of its experts'", name, li);
        listed[li] = 1;
        if (!set) continue;   /* the lead's own block holds them already */
        const qd_linear_info *L = qd_model_linear(m, li);
        char an[16];
        snprintf(an, sizeof an, "w%d", li);
        const float *w = qd_part_file_arr(f, an, (uint64_t)(L->n * L->k) * sizeof(float), err);
        int rc = w ? qd_block_linear_load(m, bw, li, err) : QD_EFORMAT;   /* its bias, and room for w */
        if (!rc && !bw->w[li]) rc = qd_err_set(err, QD_EFORMAT, "part file %s: linear %d is not block %d's", name, li, bw->block);
        if (!rc) rc = qd_block_linear_set(m, bw, li, w, NULL, err);
        if (rc) return rc;
    }
    return 0;
}

/* Reads an expert cut's x (rows x hidden floats) from the pass's file, which must be the one
 * the input names. */
static int expert_x_read(int dirfd, const cpart_in *in, float *x, qd_err *err)
{
    qd_part_file xf;
    int rc = qd_part_file_read(dirfd, in->x_name, &xf, err);
    if (rc) return rc;
    if (xf.checksum != in->x_sum) rc = qd_err_set(err, QD_EFORMAT, "part file %s: not the input the lead wrote", in->x_name);
    if (!rc) rc = qd_part_farr_read(&xf, "x", x, (uint64_t)(in->rows * in->H), 0, err);
    qd_part_file_free(&xf);
    return rc;
}

int qd_cpart_run_file(qd_pipeline *p, int dirfd, int block, int index, const char *worker, qd_err *err)
{
    char name[64];
    qd_cpart_name_in(name, sizeof name, block, index);
    qd_part_file f;
    int rc = qd_part_file_read(dirfd, name, &f, err);
    if (rc) return rc;
    double t0 = qd_clock_now_s();
    cpart_in in;
    rc = cpart_in_read(&f, name, block, &in, err);
    qd_model *m = NULL;
    qd_block_weights *bw = NULL;
    float *x = NULL, *y = NULL, *mid = NULL, *mid_in = NULL;
    qd_capture_rec rec;
    memset(&rec, 0, sizeof rec);
    qd_gptq_hessian hs[QD_MAX_GROUPS];
    memset(hs, 0, sizeof hs);
    int *want = calloc(QD_MAX_GROUPS, sizeof *want);
    unsigned char *listed = calloc(QD_MAX_LINEARS, 1);
    if (!rc && (!want || !listed)) rc = qd_err_set(err, QD_ENOMEM, "out of memory");
    pthread_mutex_lock(&blk_lock);
    /* A part of the lead's own pass, in the lead's process: its block as the lead holds it. */
    const int on_lead = !rc && lead_blk.m && !strcmp(lead_blk.job, p->job->id) && lead_blk.block == block &&
                        lead_blk.bf16 == in.bf16 && !strcmp(lead_blk.worker, worker ? worker : "local");
    if (!rc && cJSON_GetArraySize(in.states) > QD_CPART_MAX_STATES)
        rc = qd_err_set(err, QD_EFORMAT, "part file %s: more than %d state files", name, QD_CPART_MAX_STATES);
    if (!rc && on_lead) {
        m = lead_blk.m;
        bw = (qd_block_weights *)lead_blk.bw;   /* only read here: the part sets nothing into it */
    } else if (!rc) {
        rc = blk_get(p, block, in.bf16, in.block_sum, in.states, in.experts, dirfd, name, err);
        m = rc ? NULL : blk.m;
        bw = rc ? NULL : blk.bw;
    }
    if (!rc && in.H != qd_model_cfg(m)->hidden)
        rc = qd_err_set(err, QD_EFORMAT, "part file %s: width %lld is not the model's", name, (long long)in.H);
    const cJSON *gj, *groups = rc ? NULL : in.groups;
    cJSON_ArrayForEach(gj, groups) {
        int g = cJSON_IsNumber(gj) ? (int)gj->valuedouble : -1;
        if (g < 0 || g >= qd_model_n_groups(m) || rec.x[g]) {
            rc = qd_err_set(err, QD_EFORMAT, "part file %s: a bad group", name);
            break;
        }
        want[g] = 1;
        rec.cap[g] = in.rows;   /* a dense block's groups, and each expert, see every token at most once */
        rec.keep[g] = !in.shards || g == in.keep_all ? in.rows : in.keep_rows < in.rows ? in.keep_rows : in.rows;
        if (!(rec.x[g] = malloc((size_t)((rec.keep[g] ? rec.keep[g] : 1) * qd_model_group(m, g)->k) * sizeof(float))))
            rc = qd_err_set(err, QD_ENOMEM, "out of memory for a capture part's %lld rows", (long long)in.rows);
        if (!rc && in.shards) {   /* the shard's Hessian, summed here */
            rc = qd_gptq_hessian_init(&hs[g], p->be, qd_model_group(m, g)->k, err);
            hs[g].bf16 = in.bf16;
        }
    }
    if (!rc && in.keep_all >= 0 && !rec.x[in.keep_all])
        rc = qd_err_set(err, QD_EFORMAT, "part file %s: bad shards, keep_rows or keep_all (group %d is not one it records)",
                        name, in.keep_all);
    for (int g = 0; in.experts && !rc && g < qd_model_n_groups(m); g++)
        if (want[g] && (group_expert(m, g) == -1 || qd_model_group_part(m, g) != QD_BLOCK_MLP))
            rc = qd_err_set(err, QD_EFORMAT, "part file %s: group %d is not an expert's", name, g);
    /* Its experts' quantized linears, into the kept block (where the lead's own is not used). */
    if (in.experts && !rc) rc = expert_linears_set(&f, in.linears, want, m, bw, !on_lead, listed, name, err);
    const int from_act = in.half == CPART_HALF_ACT, from_ctx = in.half == CPART_HALF_CTX;
    if (!rc && from_act) {
        int dg = qd_model_mlp_out_group(m);
        if (dg < 0 || qd_model_group(m, dg)->k != in.W)
            rc = qd_err_set(err, QD_EFORMAT, "part file %s: activation width %lld is not the model's", name, (long long)in.W);
    }
    if (!rc && from_ctx && qd_model_group(m, qd_model_block_attn_out_group(m, block))->k != in.W)
        rc = qd_err_set(err, QD_EFORMAT, "part file %s: context width %lld is not the model's", name, (long long)in.W);
    size_t act_bytes = rc ? 0 : (size_t)(in.rows * in.H) * sizeof(float);
    if (!rc && (!(x = malloc((size_t)(in.rows * in.W) * sizeof(float))) || (in.want_y && !(y = malloc(act_bytes))) ||
                (in.half == QD_BLOCK_ATTN && !(mid = malloc(act_bytes))) ||
                ((from_act || from_ctx) && !(mid_in = malloc(act_bytes)))))
        rc = qd_err_set(err, QD_ENOMEM, "out of memory for a capture part's activations");
    if (!rc) rc = in.experts ? expert_x_read(dirfd, &in, x, err) : qd_part_farr_read(&f, "x", x, (uint64_t)(in.rows * in.W), 0, err);
    if (!rc && (from_act || from_ctx)) rc = qd_part_farr_read(&f, "mid", mid_in, (uint64_t)(in.rows * in.H), 0, err);
    if (!rc && from_ctx) {
        /* The output projection on the context, added to the block's input, batch by batch. */
        p->m = m;
        p->acts = mid_in;
        p->mid = y;
        p->n_seq = in.n_seq;
        p->seq_len = in.L;
        p->hidden = in.H;
        p->batch_seqs = in.bs;
        rc = qd_capture_mid_from_ctx(p, bw, x, in.W, err);
        p->m = NULL;
        p->acts = p->mid = NULL;
    } else if (!rc && from_act) {
        /* The down projection on the activation, added to the residual stream, batch by batch. */
        p->m = m;
        p->mid = mid_in;
        p->n_seq = in.n_seq;
        p->seq_len = in.L;
        p->hidden = in.H;
        p->batch_seqs = in.bs;
        rc = qd_capture_out_from_act(p, bw, x, in.W, y, err);
        p->m = NULL;
        p->mid = NULL;
    } else if (!rc) {
        /* The run's shape on p for qd_capture_run; the CPU backend's memory is the host's. */
        p->m = m;
        p->acts = x;
        p->mid = in.half == QD_BLOCK_MLP ? x : mid;
        p->n_seq = in.n_seq;
        p->seq_len = in.L;
        p->hidden = in.H;
        p->batch_seqs = in.bs;
        /* A batch cut's part is one shard at most (its Hessians a plain sum); an expert cut's
         * sums its Hessians over the job's shards of every row, as the lead's pass does. */
        p->n_shards = 0;
        if (in.experts) qd_pipeline_shards_plan(p, in.n_shards);
        if (in.experts && p->n_shards != in.n_shards)
            rc = qd_err_set(err, QD_EFORMAT, "part file %s: %d shards of %lld sequences", name, in.n_shards, (long long)in.n_seq);
        memset(p->moe_routed, 0, sizeof p->moe_routed);
        p->moe_routed_done = 0;
        qd_capture_ctx c;
        qd_capture_init(&c, p, err);
        c.rec = &rec;
        c.stop_after = in.stop_after;
        for (int g = 0; g < QD_MAX_GROUPS; g++) {
            c.want[g] = hs[g].h != NULL;
            c.acc[g] = hs[g].h ? &hs[g] : NULL;
        }
        if (!rc) rc = qd_capture_run(p, bw, (qd_block_part)in.half, y, &c, err);
        if (!rc && in.experts && !c.routed_seen)
            rc = qd_err_set(err, QD_EINVAL, "part file %s: the pass did not reach block %d's router", name, block);
        p->m = NULL;
        p->acts = p->mid = NULL;
    }
    double secs = qd_clock_now_s() - t0;
    /* The output: the calls (group and rows, flattened), each group's rows as they came, and
     * the half's outputs asked for. */
    cJSON *meta = rc ? NULL : cJSON_CreateObject();
    cJSON *calls = rc ? NULL : cJSON_CreateArray();
    if (!rc && (!meta || !calls)) rc = qd_err_set(err, QD_ENOMEM, "out of memory");
    for (int i = 0; i < rec.n_calls && !rc; i++)
        if (!cJSON_AddItemToArray(calls, cJSON_CreateNumber(rec.call_group[i])) ||
            !cJSON_AddItemToArray(calls, cJSON_CreateNumber((double)rec.call_rows[i])))
            rc = qd_err_set(err, QD_ENOMEM, "out of memory");
    qd_part_farr fa[2 * QD_MAX_GROUPS + 2];
    memset(fa, 0, sizeof fa);
    qd_part_arr arrs[2 * QD_MAX_GROUPS + 2];
    int na = 0;
    char desc[160], out[96], sum[24], an[QD_MAX_GROUPS][16], hn[QD_MAX_GROUPS][16];
    cJSON *hess = rc ? NULL : cJSON_CreateArray();
    if (!rc && !hess) rc = qd_err_set(err, QD_ENOMEM, "out of memory");
    for (int g = 0; g < QD_MAX_GROUPS && !rc; g++) {
        if (!hs[g].h) continue;
        /* The shard's Hessian: its rows seen and max |x| exactly, its upper triangle. */
        cJSON *e = cJSON_CreateArray();
        if (!e || !cJSON_AddItemToArray(e, cJSON_CreateNumber(g)) || !cJSON_AddItemToArray(e, cJSON_CreateNumber((double)hs[g].n_seen)) ||
            !cJSON_AddItemToArray(e, cJSON_CreateNumber((double)hs[g].x_amax)) || !cJSON_AddItemToArray(hess, e)) {
            rc = qd_err_set(err, QD_ENOMEM, "out of memory");
            break;
        }
        int64_t k = hs[g].k;
        snprintf(hn[g], sizeof hn[g], "h%d", g);
        rc = qd_part_farr_make(hn[g], hs[g].h, (uint64_t)(k * k), k, &fa[na], err);
        if (!rc && qd_part_farr_note(meta, &fa[na])) rc = qd_err_set(err, QD_ENOMEM, "out of memory");
        if (!rc) arrs[na] = fa[na].arr, na++;
    }
    if (!rc) {
        cJSON_AddItemToObject(meta, "hess", hess);
        hess = NULL;
    }
    qd_part_maker_desc(p->be, desc, sizeof desc);
    if (!rc) {
        snprintf(sum, sizeof sum, "%016llx", (unsigned long long)f.checksum);
        cJSON_AddStringToObject(meta, "step", "capture");
        cJSON_AddStringToObject(meta, "in_checksum", sum);
        cJSON_AddStringToObject(meta, "worker", worker ? worker : "local");
        cJSON_AddStringToObject(meta, "made_by", desc);
        cJSON_AddNumberToObject(meta, "seconds", secs);
        cJSON_AddItemToObject(meta, "calls", calls);
        calls = NULL;
    }
    if (!rc && in.experts) {   /* the tokens the router sent each expert */
        int ne = (int)qd_model_cfg(m)->n_experts;
        cJSON *routed = cJSON_CreateArray();
        for (int e = 0; routed && e < ne && e < QD_MAX_EXPERTS; e++)
            if (!cJSON_AddItemToArray(routed, cJSON_CreateNumber((double)p->moe_routed[e]))) {
                cJSON_Delete(routed);
                routed = NULL;
            }
        if (!routed || !cJSON_AddItemToObject(meta, "routed", routed)) rc = qd_err_set(err, QD_ENOMEM, "out of memory");
    }
    for (int g = 0; g < QD_MAX_GROUPS && !rc; g++) {
        if (!rec.x[g] || !rec.rows[g]) continue;
        snprintf(an[g], sizeof an[g], "x%d", g);
        rc = qd_part_farr_make(an[g], rec.x[g], (uint64_t)(rec.rows[g] * qd_model_group(m, g)->k), 0, &fa[na], err);
        if (!rc && qd_part_farr_note(meta, &fa[na])) rc = qd_err_set(err, QD_ENOMEM, "out of memory");
        if (!rc) arrs[na] = fa[na].arr, na++;
    }
    if (!rc && y) arrs[na++] = (qd_part_arr){"y", y, act_bytes};
    if (!rc && mid) arrs[na++] = (qd_part_arr){"mid", mid, act_bytes};
    qd_cpart_name_out(out, sizeof out, block, index, f.checksum, desc);
    if (!rc) rc = qd_part_file_write(dirfd, out, meta, arrs, na, NULL, err);
    for (int i = 0; i < 2 * QD_MAX_GROUPS + 2; i++) qd_part_farr_free(&fa[i]);
    for (int g = 0; g < QD_MAX_GROUPS; g++) qd_gptq_hessian_free(&hs[g]);
    cJSON_Delete(hess);
    cJSON_Delete(calls);
    cJSON_Delete(meta);
    rec_free(&rec);
    if (rc && m && !on_lead) blk_drop();   /* the kept block is in no known state */
    for (int li = 0; !rc && in.experts && !on_lead && li < QD_MAX_LINEARS; li++)
        if (listed[li]) qd_block_linear_unload(blk.m, blk.bw, li);   /* the kept block without linears again */
    pthread_mutex_unlock(&blk_lock);
    free(want);
    free(listed);
    free(x);
    free(y);
    free(mid);
    free(mid_in);
    qd_part_file_free(&f);
    return rc;
}

/* ---- the lead's side ---- */

/* Reads part `index`'s output and takes it over: its calls fed to c's hooks, its outputs
 * copied to the spec's places. Nothing is taken unless the whole output checks: its
 * checksum, input, maker, calls that add up to the part's rows of each wanted group, and the
 * outputs asked for (QD_EFORMAT or QD_ENOTFOUND otherwise, *fed 0: the lead runs the part). */
/* An expert cut's output: the rows each group's Hessian saw (its groups' experts see the
 * tokens routed to them, at most every row once), from its list of Hessians; -1 where none. */
static int expert_rows_seen(const cJSON *hess, const qd_capture_ctx *c, int ng, int64_t rows, int64_t *n_seen)
{
    for (int g = 0; g < ng; g++) n_seen[g] = -1;
    const cJSON *e;
    cJSON_ArrayForEach(e, hess) {
        const cJSON *gj = cJSON_GetArrayItem(e, 0), *nj = cJSON_GetArrayItem(e, 1);
        int g = cJSON_IsNumber(gj) ? (int)gj->valuedouble : -1;
        if (g < 0 || g >= ng || !c->want[g] || n_seen[g] >= 0 || !cJSON_IsNumber(nj) || !(nj->valuedouble >= 0) ||
            nj->valuedouble > (double)rows)
            return QD_EFORMAT;
        n_seen[g] = (int64_t)nj->valuedouble;
    }
    return 0;
}

/* An expert cut's routed-token counts: n_experts of them, the same as every other part's of
 * the pass (expect, when one was taken before). */
static int expert_routed_read(const cJSON *meta, int ne, const int64_t *expect, int64_t *got)
{
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(meta, "routed"), *v;
    if (!cJSON_IsArray(r) || cJSON_GetArraySize(r) != ne) return QD_EFORMAT;
    int e = 0;
    cJSON_ArrayForEach(v, r) {
        if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || (expect && (int64_t)v->valuedouble != expect[e])) return QD_EFORMAT;
        got[e++] = (int64_t)v->valuedouble;
    }
    return 0;
}

static int cpart_take(qd_pipeline *p, int block, int index, uint64_t in_sum, int64_t seq0, int64_t rows,
                      const qd_cpart_spec *spec, qd_capture_ctx *c, const int64_t *routed_expect, int64_t *routed,
                      int *fed, double *t_fed, qd_err *err)
{
    *fed = 0;
    char desc[160], name[96], sum[24];
    qd_part_maker_desc(p->be, desc, sizeof desc);
    qd_cpart_name_out(name, sizeof name, block, index, in_sum, desc);
    snprintf(sum, sizeof sum, "%016llx", (unsigned long long)in_sum);
    qd_part_file f;
    int rc = qd_part_file_read(p->parts_fd, name, &f, err);
    if (rc) return rc;
    const char *ic = meta_str(f.meta, "in_checksum"), *mb = meta_str(f.meta, "made_by");
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(f.meta, "calls");
    if (!ic || strcmp(ic, sum)) rc = qd_err_set(err, QD_EFORMAT, "part file %s: computed from another input", name);
    else if (!mb || strcmp(mb, desc))
        rc = qd_err_set(err, QD_EFORMAT, "part file %s: made by \"%s\", not \"%s\"", name, mb ? mb : "?", desc);
    else if (!cJSON_IsArray(calls) || cJSON_GetArraySize(calls) % 2)
        rc = qd_err_set(err, QD_EFORMAT, "part file %s: no calls", name);
    /* The calls against the wanted groups: every group's rows (with shards, only the rows the
     * hooks keep), all of them, and no other. */
    int64_t seen[QD_MAX_GROUPS] = {0}, want_rows[QD_MAX_GROUPS] = {0}, n_seen[QD_MAX_GROUPS];
    const int ng = qd_model_n_groups(p->m), shards = p->n_shards > 1 || spec->experts;
    const int64_t keep = keep_rows_of(c);
    const cJSON *hess = cJSON_GetObjectItemCaseSensitive(f.meta, "hess"), *e;
    for (int g = 0; g < ng; g++) n_seen[g] = rows;
    if (!rc && spec->experts && expert_rows_seen(hess, c, ng, rows, n_seen))
        rc = qd_err_set(err, QD_EFORMAT, "part file %s: a bad list of Hessians", name);
    if (!rc && spec->experts &&
        expert_routed_read(f.meta, (int)qd_model_cfg(p->m)->n_experts, routed_expect, routed))
        rc = qd_err_set(err, QD_EFORMAT, "part file %s: routed-token counts missing or unlike the pass's others", name);
    for (int g = 0; g < ng; g++) {
        int64_t r = n_seen[g] < 0 ? 0 : n_seen[g];
        want_rows[g] = !c->want[g] ? 0 : !shards || (c->xcap && g == c->xcap_group) ? r : keep < r ? keep : r;
    }
    const cJSON *it = rc ? NULL : calls->child;
    while (it && !rc) {
        const cJSON *r = it->next;
        int g = cJSON_IsNumber(it) ? (int)it->valuedouble : -1;
        int64_t n = cJSON_IsNumber(r) ? (int64_t)r->valuedouble : -1;
        if (g < 0 || g >= ng || !c->want[g] || n <= 0 || n > want_rows[g] - seen[g])
            rc = qd_err_set(err, QD_EFORMAT, "part file %s: a call of group %d, %lld rows, does not fit", name, g, (long long)n);
        else seen[g] += n;
        it = r->next;
    }
    const float *xs[QD_MAX_GROUPS] = {0};
    float *own[QD_MAX_GROUPS] = {0};
    const cJSON *encs = cJSON_GetObjectItemCaseSensitive(f.meta, "enc");
    for (int g = 0; g < ng && !rc; g++) {
        if (!c->want[g]) continue;
        if (seen[g] != want_rows[g]) {
            rc = qd_err_set(err, QD_EFORMAT, "part file %s: group %d saw %lld rows of %lld", name, g, (long long)seen[g],
                            (long long)want_rows[g]);
            break;
        }
        if (!want_rows[g]) continue;
        char an[16];
        snprintf(an, sizeof an, "x%d", g);
        uint64_t cnt = (uint64_t)(want_rows[g] * qd_model_group(p->m, g)->k);
        if (!cJSON_HasObjectItem(encs, an)) {   /* stored as F32: read in place */
            if (!(xs[g] = qd_part_file_arr(&f, an, cnt * sizeof(float), err))) rc = QD_EFORMAT;
            continue;
        }
        if (!(own[g] = malloc(cnt * sizeof(float)))) rc = qd_err_set(err, QD_ENOMEM, "out of memory reading %s", name);
        else rc = qd_part_farr_read(&f, an, own[g], cnt, 0, err);
        xs[g] = own[g];
    }
    size_t act_bytes = (size_t)(rows * p->hidden) * sizeof(float);
    const float *y = !rc && spec->y ? qd_part_file_arr(&f, "y", act_bytes, err) : NULL;
    const float *mid = !rc && spec->half == QD_BLOCK_ATTN ? qd_part_file_arr(&f, "mid", act_bytes, err) : NULL;
    if (!rc && ((spec->y && !y) || (spec->half == QD_BLOCK_ATTN && !mid))) rc = QD_EFORMAT;
    /* With shards, each wanted group's Hessian over the shard, whole: on the CPU decoded
     * straight into an accumulator (the lead's own while it is empty: a merge into an empty
     * one is a copy), on a device into host memory first. */
    float *hh[QD_MAX_GROUPS] = {0};
    qd_gptq_hessian ts[QD_MAX_GROUPS];
    memset(ts, 0, sizeof ts);
    int64_t hn[QD_MAX_GROUPS] = {0};
    float hamax[QD_MAX_GROUPS] = {0};
    unsigned char in_place[QD_MAX_GROUPS] = {0};
    if (!rc && shards && !cJSON_IsArray(hess)) rc = qd_err_set(err, QD_EFORMAT, "part file %s: no Hessians", name);
    const cJSON *hlist = rc || !shards ? NULL : hess;
    cJSON_ArrayForEach(e, hlist) {
        const cJSON *gj = cJSON_GetArrayItem(e, 0), *nj = cJSON_GetArrayItem(e, 1), *aj = cJSON_GetArrayItem(e, 2);
        int g = cJSON_IsNumber(gj) ? (int)gj->valuedouble : -1;
        if (g < 0 || g >= ng || !c->want[g] || !c->acc[g] || hh[g] || !cJSON_IsNumber(nj) ||
            (int64_t)nj->valuedouble != n_seen[g] ||
            !cJSON_IsNumber(aj) || !(aj->valuedouble >= 0)) {
            rc = qd_err_set(err, QD_EFORMAT, "part file %s: a Hessian of group %d that does not fit", name, g);
            break;
        }
        int64_t k = c->acc[g]->k;
        char an[16];
        snprintf(an, sizeof an, "h%d", g);
        hn[g] = n_seen[g];
        hamax[g] = (float)aj->valuedouble;
        if (p->be->device < 0 && c->acc[g]->n_seen == 0) {
            /* The whole Hessian, into the lead's empty one (a merge would copy it): decoded in
             * place, no second copy of it (an expert's is up to GBs) */
            in_place[g] = 1;
            rc = qd_part_farr_read(&f, an, c->acc[g]->h, (uint64_t)(k * k), k, err);
            continue;
        }
        if (p->be->device < 0) {
            rc = qd_gptq_hessian_init(&ts[g], p->be, k, err);
            if (!rc) rc = qd_part_farr_read(&f, an, ts[g].h, (uint64_t)(k * k), k, err);
            continue;
        }
        if (!(hh[g] = malloc((size_t)(k * k) * sizeof(float)))) rc = qd_err_set(err, QD_ENOMEM, "out of memory reading %s", name);
        else rc = qd_part_farr_read(&f, an, hh[g], (uint64_t)(k * k), k, err);
    }
    for (int g = 0; g < ng && !rc && shards; g++)
        if (c->want[g] && c->acc[g] && !hh[g] && !ts[g].h && !in_place[g])
            rc = qd_err_set(err, QD_EFORMAT, "part file %s: no Hessian of group %d", name, g);
    for (int g = 0; g < ng; g++) {   /* decoded in place: taken, or (nothing taken) zeroed again */
        if (!in_place[g]) continue;
        if (rc) {
            memset(c->acc[g]->h, 0, (size_t)(c->acc[g]->k * c->acc[g]->k) * sizeof(float));
        } else {
            c->acc[g]->n_seen = hn[g];
            if (hamax[g] > c->acc[g]->x_amax) c->acc[g]->x_amax = hamax[g];
        }
    }
    int64_t at[QD_MAX_GROUPS] = {0};
    *fed = !rc;
    double tf = qd_clock_now_s();
    for (int g = 0; g < ng && !rc; g++) {
        if (!hh[g] && !ts[g].h) continue;
        qd_gptq_hessian t = ts[g];
        memset(&ts[g], 0, sizeof ts[g]);
        if (!t.h) {
            rc = qd_gptq_hessian_init(&t, p->be, c->acc[g]->k, err);
            if (!rc) rc = qd_backend_upload(p->be, t.h, hh[g], (size_t)(t.k * t.k) * sizeof(float));
        }
        t.n_seen = hn[g];
        t.x_amax = hamax[g];
        if (!rc) rc = qd_gptq_hessian_merge(c->acc[g], &t, err);
        qd_gptq_hessian_free(&t);
    }
    c->no_hess = shards;
    for (it = rc ? NULL : calls->child; it && !rc; it = it->next->next) {
        int g = (int)it->valuedouble;
        int64_t n = (int64_t)it->next->valuedouble;
        rc = qd_capture_replay(c, g, xs[g] + at[g] * qd_model_group(p->m, g)->k, n);
        at[g] += n;
    }
    c->no_hess = 0;
    *t_fed += qd_clock_now_s() - tf;   /* the hooks' own work (the Hessians' sums): the pass's */
    size_t off = (size_t)(seq0 * p->seq_len * p->hidden);
    if (!rc && y) rc = qd_backend_upload(p->be, spec->y + off, y, act_bytes);
    if (!rc && mid) rc = qd_backend_upload(p->be, p->mid + off, mid, act_bytes);
    for (int g = 0; g < QD_MAX_GROUPS; g++) {
        free(own[g]);
        free(hh[g]);
        qd_gptq_hessian_free(&ts[g]);
    }
    qd_part_file_free(&f);
    return rc;
}

int qd_cpart_experts_pay(const qd_pipeline *p, int block, qd_block_part half, const float *y, const qd_capture_ctx *c)
{
    if (!p->hooks.fanout || p->be->device >= 0 || !qd_model_block_is_moe(p->m, block) || half != QD_BLOCK_MLP || y ||
        !c || c->rec || c->gq || c->xcap || !p->mid || p->batch_seqs <= 0)
        return 0;
    /* Hessians to sum: twins (qd_model_group_same_input) count once, the lead's pass sums
     * their one Hessian once and copies it, where each part would sum it again. */
    int n = 0;
    unsigned char seen[QD_MAX_GROUPS] = {0};
    for (int g = 0; g < qd_model_n_groups(p->m); g++) {
        if (c->absum[g]) return 0;
        if (!c->want[g]) continue;
        if (!c->acc[g] || group_expert(p->m, g) == -1 || qd_model_group_part(p->m, g) != QD_BLOCK_MLP) return 0;
        int kind = p->no_twins ? g : qd_model_group_same_input(p->m, block, g);
        n += !seen[kind];
        seen[kind] = 1;
    }
    return n >= 2;
}

/* An expert cut: the wanted groups, in index order, into P runs (starts[0..P] into gl). */
static int expert_cut(const qd_pipeline *p, const qd_capture_ctx *c, int *gl, int *starts)
{
    int n = 0;
    for (int g = 0; g < qd_model_n_groups(p->m); g++)
        if (c->want[g]) gl[n++] = g;
    int P = n < QD_CPART_MAX ? n : QD_CPART_MAX;
    for (int i = 0; i <= P; i++) starts[i] = i * n / P;
    return P;
}

/* c narrowed to part i's groups of an expert cut (its stop: the last of them, when c stops). */
static void expert_ctx(const qd_capture_ctx *c, const int *gl, const int *starts, int i, qd_capture_ctx *ci)
{
    *ci = *c;
    memset(ci->want, 0, sizeof ci->want);
    for (int j = starts[i]; j < starts[i + 1]; j++) ci->want[gl[j]] = 1;
    if (c->stop_after >= 0) ci->stop_after = gl[starts[i + 1] - 1];
}

/* The expert cut's one input file: the MLP half's input, p->mid, over every row. */
static void expert_x_name(char *buf, size_t cap, int block)
{
    snprintf(buf, cap, "b%04d-capture-x.part", block);
}

static int expert_x_write(qd_pipeline *p, int block, uint64_t *sum, qd_err *err)
{
    char name[48];
    expert_x_name(name, sizeof name, block);
    cJSON *meta = cJSON_CreateObject();
    if (!meta) return qd_err_set(err, QD_ENOMEM, "out of memory");
    cJSON_AddStringToObject(meta, "step", "capture-x");
    cJSON_AddNumberToObject(meta, "block", block);
    qd_part_arr a = {"x", p->mid, (uint64_t)(p->n_seq * p->seq_len * p->hidden) * sizeof(float)};
    int rc = qd_part_file_write(p->parts_fd, name, meta, &a, 1, sum, err);
    cJSON_Delete(meta);
    return rc;
}

int qd_cpart_run(qd_pipeline *p, const qd_block_weights *bw, int block, const int64_t *seq_starts, int P,
                 const qd_cpart_spec *spec, qd_capture_ctx *c, double *t_files, qd_err *err)
{
    *t_files = 0;
    double t0 = qd_clock_now_s();
    const int ex = spec->experts;
    int *gl = ex ? calloc(QD_MAX_GROUPS, sizeof *gl) : NULL, gs[QD_CPART_MAX + 1] = {0};
    qd_capture_ctx *ci = ex ? malloc(sizeof *ci) : NULL;
    if (ex && gl && ci) P = expert_cut(p, c, gl, gs);
    uint64_t *sums = calloc((size_t)P + 1, sizeof *sums);
    const char **names = calloc((size_t)P + 1, sizeof *names);
    char (*labels)[48] = calloc((size_t)P + 1, 48);
    int rc = sums && names && labels && (!ex || (gl && ci)) ? 0 : qd_err_set(err, QD_ENOMEM, "out of memory");
    /* The block's stored bytes, hashed once a block (kept in the state). */
    uint64_t block_sum = 0, x_sum = 0;
    int no_sum = 0;
    if (spec->st && spec->st->sum_known) {
        no_sum = spec->st->sum_known < 0;
        block_sum = spec->st->block_sum;
    } else {
        no_sum = block_bytes_sum(p->m, block, &block_sum) != 0;
        if (spec->st) {
            spec->st->sum_known = no_sum ? -1 : 1;
            spec->st->block_sum = block_sum;
        }
    }
    if (!rc && no_sum) {
        /* Nothing for a part to check its weights against: the pass stays here. */
        P = 0;
        rc = spec->act_width > 0   ? qd_capture_out_from_act(p, bw, spec->x, spec->act_width, spec->y, err)
             : spec->ctx_width > 0 ? qd_capture_mid_from_ctx(p, bw, spec->x, spec->ctx_width, err)
                                   : qd_capture_run(p, bw, spec->half, spec->y, c, err);
    }
    if (!rc && P && spec->st && !ex) rc = state_write(p, bw, block, spec->quantized, spec->st, err);
    char x_name[48];
    expert_x_name(x_name, sizeof x_name, block);
    if (!rc && P && ex) rc = expert_x_write(p, block, &x_sum, err);
    for (int i = 0; i < P && !rc; i++) {
        const qd_capture_ctx *cw = c;
        int64_t s0 = ex ? 0 : seq_starts[i], s1 = ex ? p->n_seq : seq_starts[i + 1];
        if (ex) {
            expert_ctx(c, gl, gs, i, ci);
            cw = ci;
            snprintf(labels[i], 48, "%.20s..%.20s", qd_model_group(p->m, gl[gs[i]])->name,
                     qd_model_group(p->m, gl[gs[i + 1] - 1])->name);
        } else {
            snprintf(labels[i], 48, "sequences %lld..%lld", (long long)s0, (long long)s1 - 1);
        }
        names[i] = labels[i];
        rc = qd_cpart_write_in(p, p->parts_fd, block, i, s0, s1, cw, spec, bw, x_name, x_sum, block_sum, &sums[i], err);
    }
    double t_hook = qd_clock_now_s();
    if (!rc && P) {
        /* A part the lead's process takes runs on the lead's block (lead_blk). */
        pthread_mutex_lock(&blk_lock);
        lead_blk.job = p->job->id;
        lead_blk.worker = p->hooks.worker ? p->hooks.worker : "local";
        lead_blk.block = block;
        lead_blk.bf16 = p->compute == QP_COMPUTE_BF16;
        lead_blk.m = p->m;
        lead_blk.bw = bw;
        pthread_mutex_unlock(&blk_lock);
        int stop = p->hooks.fanout(p->hooks.ud, block, "capture", P, names);
        pthread_mutex_lock(&blk_lock);
        memset(&lead_blk, 0, sizeof lead_blk);
        pthread_mutex_unlock(&blk_lock);
        if (stop) rc = qd_err_set(err, QD_ECANCELLED, "cancelled");
    }
    double t_read = qd_clock_now_s();
    if (P && spec->act_width <= 0 && spec->ctx_width <= 0) p->cost.forward_passes++;   /* as qd_capture_run counts it */
    /* In the pass's order: each part's calls, or the part run here when its output is no use. */
    double t_here = 0, t_fed = 0;
    int64_t *routed = ex ? calloc(2 * QD_MAX_EXPERTS, sizeof *routed) : NULL;   /* the first part's, and each */
    int have_routed = 0;
    if (!rc && ex && !routed) rc = qd_err_set(err, QD_ENOMEM, "out of memory");
    for (int i = 0; i < P && !rc; i++) {
        qd_err e2 = {0};
        int64_t rows = ex ? p->n_seq * p->seq_len : (seq_starts[i + 1] - seq_starts[i]) * p->seq_len;
        int fed = 0;
        qd_capture_ctx *ct = c;
        if (ex) {
            expert_ctx(c, gl, gs, i, ci);
            ct = ci;
        }
        ct->err = &e2;
        int got = cpart_take(p, block, i, sums[i], ex ? 0 : seq_starts[i], rows, spec, ct, have_routed ? routed : NULL,
                             routed ? routed + QD_MAX_EXPERTS : NULL, &fed, &t_fed, &e2);
        ct->err = err;
        if (!got && ex && !have_routed) {
            /* The routed-token counts, the block's first pass's that reaches the router. */
            int ne = (int)qd_model_cfg(p->m)->n_experts;
            memcpy(routed, routed + QD_MAX_EXPERTS, (size_t)ne * sizeof *routed);
            have_routed = 1;
            for (int e = 0; e < ne && !p->moe_routed_done; e++) p->moe_routed[e] += routed[e];
            p->moe_routed_done = 1;
        }
        if (!got) continue;
        if (fed) {   /* some of it reached the hooks: a failure of the lead's own */
            rc = qd_err_set(err, got, "%s", e2.msg);
            break;
        }
        /* Nothing of it was taken: computed here, in memory. */
        QD_LOG(QD_LOG_WARN, "part_recomputed", "job=%s block=%d step=capture part=%d why=\"%s\"", p->job->id, block, i,
               e2.msg);
        double th = qd_clock_now_s();
        if (spec->act_width > 0) {
            rc = qd_capture_out_from_act_range(p, bw, spec->x, spec->act_width, spec->y, seq_starts[i], seq_starts[i + 1], err);
        } else if (spec->ctx_width > 0) {
            rc = qd_capture_mid_from_ctx_range(p, bw, spec->x, spec->ctx_width, seq_starts[i], seq_starts[i + 1], err);
        } else {
            ct->seq0 = ex ? 0 : seq_starts[i];
            ct->n_seq_max = ex ? 0 : seq_starts[i + 1];
            rc = qd_capture_run(p, bw, spec->half, spec->y, ct, err);
            p->cost.forward_passes--;   /* one pass, however it was cut */
            ct->seq0 = 0;
            ct->n_seq_max = 0;
        }
        if (!rc && ex && !have_routed) {   /* qd_capture_run counted them */
            memcpy(routed, p->moe_routed, (size_t)qd_model_cfg(p->m)->n_experts * sizeof *routed);
            have_routed = 1;
        }
        t_here += qd_clock_now_s() - th;
    }
    if (!rc && P && ex) c->routed_seen = 1;
    *t_files = (t_hook - t0) + (qd_clock_now_s() - t_read - t_here - t_fed);
    /* Taken over: the step's files go (after a failure they stay until the block commits; the
     * state files stay for the block's later passes). */
    for (int i = 0; i < P && !rc; i++) {
        char name[64];
        qd_cpart_name_in(name, sizeof name, block, i);
        qd_part_file_remove(p->parts_fd, name);
    }
    if (!rc && P && ex) qd_part_file_remove(p->parts_fd, x_name);
    if (!rc && P) qd_part_outputs_remove(p->parts_fd, block, "capture", P, sums);
    free(routed);
    free(gl);
    free(ci);
    free(sums);
    free(names);
    free(labels);
    return rc;
}
