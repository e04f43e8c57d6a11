/* The capture step's parts (part.h, docs/parallel.md): the float pass of a block quantized
 * without true-sequential cut into runs of its calibration batches. A part runs the float
 * block over its batches, on whichever worker is free, and records what each input hook
 * call saw (the group, the rows, their values); the lead then feeds those calls to its own
 * hooks in the order one pass would have made them, so every Hessian, kernel-check row and
 * direct-error row is the one the pass computes in memory, bit for bit, however the batches
 * were spread. A batch's forward does not depend on the others, and the cut is at batch
 * boundaries, so the bytes depend neither on the cut nor on the workers.
 *
 * The lead takes over only an output made by a backend like its own (a forward's bits
 * depend on the kernels, as GPTQ's do), and runs a part it could not use in memory. */
#include "quant/pipeline/part.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "quant/core/clock.h"
#include "quant/core/log.h"
#include "quant/core/safetensors.h"
#include "quant/pipeline/acts.h"

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
    int64_t nb = (p->n_seq + p->batch_seqs - 1) / p->batch_seqs;
    if (nb < 2) return 0;
    int P = nb < QD_CPART_MAX ? (int)nb : QD_CPART_MAX;
    for (int i = 0; i <= P; i++) {
        int64_t s = (int64_t)i * nb / P * p->batch_seqs;
        seq_starts[i] = s < p->n_seq ? s : p->n_seq;
    }
    return P;
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

int qd_cpart_write_in(qd_pipeline *p, int dirfd, int block, int index, int64_t seq0, int64_t seq1, const int *want,
                      uint64_t block_sum, uint64_t *checksum, qd_err *err)
{
    char bsum[24];
    snprintf(bsum, sizeof bsum, "%016llx", (unsigned long long)block_sum);
    char name[64];
    qd_cpart_name_in(name, sizeof name, block, index);
    const int64_t L = p->seq_len, H = p->hidden;
    uint64_t n = (uint64_t)((seq1 - seq0) * L * H);
    float *own = NULL;
    const float *x = qd_part_host_view(p->be, p->acts + seq0 * L * H, n * sizeof(float), &own);
    if (!x) return qd_err_set(err, QD_ENOMEM, "out of memory for a capture part's input");
    qd_part_farr fx;
    memset(&fx, 0, sizeof fx);
    cJSON *meta = cJSON_CreateObject(), *groups = cJSON_CreateArray();
    int rc = meta && groups ? 0 : qd_err_set(err, QD_ENOMEM, "out of memory");
    for (int g = 0; g < qd_model_n_groups(p->m) && !rc; g++)
        if (want[g] && !cJSON_AddItemToArray(groups, cJSON_CreateNumber(g))) rc = qd_err_set(err, QD_ENOMEM, "out of memory");
    if (!rc) {
        cJSON_AddStringToObject(meta, "step", "capture");
        cJSON_AddNumberToObject(meta, "index", index);
        cJSON_AddNumberToObject(meta, "block", block);
        cJSON_AddNumberToObject(meta, "seq0", (double)seq0);
        cJSON_AddNumberToObject(meta, "n_seq", (double)(seq1 - seq0));
        cJSON_AddNumberToObject(meta, "seq_len", (double)L);
        cJSON_AddNumberToObject(meta, "batch_seqs", (double)p->batch_seqs);
        cJSON_AddNumberToObject(meta, "hidden", (double)H);
        cJSON_AddStringToObject(meta, "compute", qp_compute_name(p->compute));
        cJSON_AddStringToObject(meta, "block_sum", bsum);
        cJSON_AddItemToObject(meta, "groups", groups);
        groups = NULL;
        rc = qd_part_farr_make("x", x, n, 0, &fx, err);
    }
    if (!rc && qd_part_farr_note(meta, &fx)) rc = qd_err_set(err, QD_ENOMEM, "out of memory");
    if (!rc) rc = qd_part_file_write(dirfd, name, meta, &fx.arr, 1, checksum, err);
    cJSON_Delete(groups);
    cJSON_Delete(meta);
    qd_part_farr_free(&fx);
    free(own);
    return rc;
}

static void rec_free(qd_capture_rec *r)
{
    free(r->call_group);
    free(r->call_rows);
    for (int g = 0; g < QD_MAX_GROUPS; g++) free(r->x[g]);
    memset(r, 0, sizeof *r);
}

/* The worker's side: the float block over the part's sequences, every wanted group's input
 * recorded, written as the output. p is a part runner's (qd_pipeline_part_run): its model,
 * activations and batch shape are set here for the run and cleared after. */
int qd_cpart_run_file(qd_pipeline *p, int dirfd, int block, int index, const char *worker, qd_err *err)
{
    char name[64];
    qd_cpart_name_in(name, sizeof name, block, index);
    qd_part_file f;
    int rc = qd_part_file_read(dirfd, name, &f, err);
    if (rc) return rc;
    double t0 = qd_clock_now_s();
    int64_t n_seq = meta_num(f.meta, "n_seq", -1), L = meta_num(f.meta, "seq_len", -1);
    int64_t bs = meta_num(f.meta, "batch_seqs", -1), H = meta_num(f.meta, "hidden", -1);
    const char *compute = meta_str(f.meta, "compute");
    const cJSON *groups = cJSON_GetObjectItemCaseSensitive(f.meta, "groups");
    if (n_seq <= 0 || L <= 0 || bs <= 0 || H <= 0 || n_seq > (1 << 20) || L > (1 << 24) || bs > (1 << 20) ||
        H > (1 << 20) || (double)n_seq * (double)L * (double)H > (double)(1ll << 36) || !cJSON_IsArray(groups) || !compute ||
        (strcmp(compute, "bf16") && strcmp(compute, "f32")) || meta_num(f.meta, "block", -1) != block)
        rc = qd_err_set(err, QD_EFORMAT, "part file %s: a bad shape, compute or group list", name);
    qd_model *m = NULL;
    qd_block_weights *bw = NULL;
    float *x = NULL;
    qd_capture_rec rec;
    memset(&rec, 0, sizeof rec);
    if (!rc) rc = qd_model_open(p->job->model, p->be, &m, err);
    if (!rc) rc = qd_model_set_compute_bf16(m, !strcmp(compute, "bf16"), err);
    if (!rc && (block >= qd_model_cfg(m)->n_layers || H != qd_model_cfg(m)->hidden))
        rc = qd_err_set(err, QD_EFORMAT, "part file %s: block %d or width %lld is not the model's", name, block, (long long)H);
    if (!rc && qd_model_block_is_moe(m, block))
        rc = qd_err_set(err, QD_EUNSUPPORTED, "part file %s: block %d has experts (its capture is not cut into parts)", name, block);
    /* The block's stored bytes must be the ones the lead holds: a model changed under the job
     * is refused, and the lead runs the part itself. */
    const char *bsum = meta_str(f.meta, "block_sum");
    unsigned long long want_sum = 0;
    uint64_t have_sum = 0;
    if (!rc && (!bsum || sscanf(bsum, "%16llx", &want_sum) != 1))
        rc = qd_err_set(err, QD_EFORMAT, "part file %s: no checksum of the block's weights", name);
    const int64_t rows = n_seq * L;
    const cJSON *gj;
    cJSON_ArrayForEach(gj, groups) {
        if (rc) break;
        int g = cJSON_IsNumber(gj) ? (int)gj->valuedouble : -1;
        if (g < 0 || g >= qd_model_n_groups(m) || rec.x[g]) {
            rc = qd_err_set(err, QD_EFORMAT, "part file %s: a bad group", name);
            break;
        }
        rec.cap[g] = rows;   /* a dense block's groups see every token once */
        if (!(rec.x[g] = malloc((size_t)(rows * qd_model_group(m, g)->k) * sizeof(float))))
            rc = qd_err_set(err, QD_ENOMEM, "out of memory for a capture part's %lld rows", (long long)rows);
    }
    uint64_t n = (uint64_t)(rows * (rc ? 0 : H));
    if (!rc && !(x = malloc(n * sizeof *x))) rc = qd_err_set(err, QD_ENOMEM, "out of memory for a capture part's input");
    if (!rc) rc = qd_part_farr_read(&f, "x", x, n, 0, err);
    if (!rc) rc = qd_block_load(m, block, &bw, err);
    if (!rc && (block_bytes_sum(m, block, &have_sum) || have_sum != want_sum))
        rc = qd_err_set(err, QD_EFORMAT, "part file %s: block %d's weights in the model's files are not the ones the "
                        "lead quantizes (changed under the job?)", name, block);
    if (!rc) {
        /* The run's shape on p for qd_capture_run; the CPU backend's memory is the host's. */
        p->m = m;
        p->acts = x;
        p->n_seq = n_seq;
        p->seq_len = L;
        p->hidden = H;
        p->batch_seqs = bs;
        qd_capture_ctx c;
        qd_capture_init(&c, p, err);
        c.rec = &rec;
        rc = qd_capture_run(p, bw, QD_BLOCK_ALL, NULL, &c, err);
        p->m = NULL;
        p->acts = NULL;
    }
    double secs = qd_clock_now_s() - t0;
    /* The output: the calls (group and rows, flattened) and each group's rows as they came. */
    cJSON *meta = rc ? NULL : cJSON_CreateObject();
    cJSON *calls = rc ? NULL : cJSON_CreateArray();
    if (!rc && (!meta || !calls)) rc = qd_err_set(err, QD_ENOMEM, "out of memory");
    for (int i = 0; i < rec.n_calls && !rc; i++)
        if (!cJSON_AddItemToArray(calls, cJSON_CreateNumber(rec.call_group[i])) ||
            !cJSON_AddItemToArray(calls, cJSON_CreateNumber((double)rec.call_rows[i])))
            rc = qd_err_set(err, QD_ENOMEM, "out of memory");
    qd_part_farr fa[QD_MAX_GROUPS];
    memset(fa, 0, sizeof fa);
    qd_part_arr arrs[QD_MAX_GROUPS];
    int na = 0;
    char desc[160], out[96], sum[24], an[QD_MAX_GROUPS][16];
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
    for (int g = 0; g < QD_MAX_GROUPS && !rc; g++) {
        if (!rec.x[g] || !rec.rows[g]) continue;
        snprintf(an[g], sizeof an[g], "x%d", g);
        rc = qd_part_farr_make(an[g], rec.x[g], (uint64_t)(rec.rows[g] * qd_model_group(m, g)->k), 0, &fa[na], err);
        if (!rc && qd_part_farr_note(meta, &fa[na])) rc = qd_err_set(err, QD_ENOMEM, "out of memory");
        if (!rc) arrs[na] = fa[na].arr, na++;
    }
    qd_cpart_name_out(out, sizeof out, block, index, f.checksum, desc);
    if (!rc) rc = qd_part_file_write(dirfd, out, meta, arrs, na, NULL, err);
    for (int i = 0; i < na; i++) qd_part_farr_free(&fa[i]);
    cJSON_Delete(calls);
    cJSON_Delete(meta);
    rec_free(&rec);
    qd_block_free(m, bw);
    qd_model_close(m);
    free(x);
    qd_part_file_free(&f);
    return rc;
}

/* Reads part `index`'s output and feeds its calls to c's hooks. Nothing reaches the hooks
 * unless the whole output checks: its checksum, input, maker, and calls that add up to the
 * part's rows of each wanted group (QD_EFORMAT otherwise, and the lead runs the part). */
static int cpart_take(qd_pipeline *p, int block, int index, uint64_t in_sum, int64_t rows, qd_capture_ctx *c,
                      char *worker, int *fed, qd_err *err)
{
    *fed = 0;
    char desc[160], name[96], sum[24];
    qd_part_maker_desc(p->be, desc, sizeof desc);
    qd_cpart_name_out(name, sizeof name, block, index, in_sum, desc);
    snprintf(sum, sizeof sum, "%016llx", (unsigned long long)in_sum);
    qd_part_file f;
    int rc = qd_part_file_read(p->parts_fd, name, &f, err);
    if (rc) return rc;
    const char *ic = meta_str(f.meta, "in_checksum"), *mb = meta_str(f.meta, "made_by"), *wk = meta_str(f.meta, "worker");
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(f.meta, "calls");
    if (!ic || strcmp(ic, sum)) rc = qd_err_set(err, QD_EFORMAT, "part file %s: computed from another input", name);
    else if (!mb || strcmp(mb, desc))
        rc = qd_err_set(err, QD_EFORMAT, "part file %s: made by \"%s\", not \"%s\"", name, mb ? mb : "?", desc);
    else if (!cJSON_IsArray(calls) || cJSON_GetArraySize(calls) % 2)
        rc = qd_err_set(err, QD_EFORMAT, "part file %s: no calls", name);
    /* The calls against the wanted groups: every group's rows, all of them, and no other. */
    int64_t seen[QD_MAX_GROUPS] = {0};
    const int ng = qd_model_n_groups(p->m);
    const cJSON *it = rc ? NULL : calls->child;
    while (it && !rc) {
        const cJSON *r = it->next;
        int g = cJSON_IsNumber(it) ? (int)it->valuedouble : -1;
        int64_t n = cJSON_IsNumber(r) ? (int64_t)r->valuedouble : -1;
        if (g < 0 || g >= ng || !c->want[g] || n <= 0 || n > rows - seen[g])
            rc = qd_err_set(err, QD_EFORMAT, "part file %s: a call of group %d, %lld rows, does not fit", name, g, (long long)n);
        else seen[g] += n;
        it = r->next;
    }
    const float *xs[QD_MAX_GROUPS] = {0};
    for (int g = 0; g < ng && !rc; g++) {
        if (!c->want[g]) continue;
        if (seen[g] != rows) {
            rc = qd_err_set(err, QD_EFORMAT, "part file %s: group %d saw %lld rows of %lld", name, g, (long long)seen[g],
                            (long long)rows);
            break;
        }
        char an[16];
        snprintf(an, sizeof an, "x%d", g);
        uint64_t cnt = (uint64_t)(rows * qd_model_group(p->m, g)->k);
        float *d = malloc(cnt * sizeof *d);
        if (!d) rc = qd_err_set(err, QD_ENOMEM, "out of memory reading %s", name);
        else rc = qd_part_farr_read(&f, an, d, cnt, 0, err);
        xs[g] = d;
    }
    int64_t at[QD_MAX_GROUPS] = {0};
    *fed = !rc;
    for (it = rc ? NULL : calls->child; it && !rc; it = it->next->next) {
        int g = (int)it->valuedouble;
        int64_t n = (int64_t)it->next->valuedouble;
        rc = qd_capture_replay(c, g, xs[g] + at[g] * qd_model_group(p->m, g)->k, n);
        at[g] += n;
    }
    if (!rc) snprintf(worker, 64, "%s", wk ? wk : "?");
    for (int g = 0; g < QD_MAX_GROUPS; g++) free((void *)xs[g]);
    qd_part_file_free(&f);
    return rc;
}

int qd_cpart_capture(qd_pipeline *p, const qd_block_weights *bw, int block, const int64_t *seq_starts, int P,
                     qd_capture_ctx *c, double *t_files, qd_err *err)
{
    *t_files = 0;
    double t0 = qd_clock_now_s();
    uint64_t *sums = calloc((size_t)P, sizeof *sums);
    const char **names = calloc((size_t)P, sizeof *names);
    char (*labels)[48] = calloc((size_t)P, 48);
    int rc = sums && names && labels ? 0 : qd_err_set(err, QD_ENOMEM, "out of memory");
    uint64_t block_sum = 0;
    if (!rc && block_bytes_sum(p->m, block, &block_sum)) {
        /* Nothing for a part to check its weights against: the pass stays here. */
        P = 0;
        rc = qd_capture_run(p, bw, QD_BLOCK_ALL, NULL, c, err);
    }
    for (int i = 0; i < P && !rc; i++) {
        snprintf(labels[i], 48, "sequences %lld..%lld", (long long)seq_starts[i], (long long)seq_starts[i + 1] - 1);
        names[i] = labels[i];
        rc = qd_cpart_write_in(p, p->parts_fd, block, i, seq_starts[i], seq_starts[i + 1], c->want, block_sum, &sums[i],
                               err);
    }
    double t_hook = qd_clock_now_s();
    if (!rc && P && p->hooks.fanout(p->hooks.ud, block, "capture", P, names)) rc = qd_err_set(err, QD_ECANCELLED, "cancelled");
    double t_read = qd_clock_now_s();
    if (P) p->cost.forward_passes++;
    /* In the pass's order: each part's calls, or the part run here when its output is no use. */
    double t_here = 0;
    for (int i = 0; i < P && !rc; i++) {
        qd_err e2 = {0};
        char worker[64];
        int64_t rows = (seq_starts[i + 1] - seq_starts[i]) * p->seq_len;
        int fed = 0;
        c->err = &e2;
        int got = cpart_take(p, block, i, sums[i], rows, c, worker, &fed, &e2);
        c->err = err;
        if (!got) continue;
        if (fed) {   /* some of it reached the hooks: a failure of the lead's own */
            rc = qd_err_set(err, got, "%s", e2.msg);
            break;
        }
        /* Nothing of it reached the hooks: computed here, in memory. */
        QD_LOG(QD_LOG_WARN, "part_recomputed", "job=%s block=%d step=capture part=%d why=\"%s\"", p->job->id, block, i,
               e2.msg);
        double th = qd_clock_now_s();
        c->seq0 = seq_starts[i];
        c->n_seq_max = seq_starts[i + 1];
        rc = qd_capture_run(p, bw, QD_BLOCK_ALL, NULL, c, err);
        p->cost.forward_passes--;   /* one pass, however it was cut */
        c->seq0 = 0;
        c->n_seq_max = 0;
        t_here += qd_clock_now_s() - th;
    }
    *t_files = (t_hook - t0) + (qd_clock_now_s() - t_read - t_here);
    /* Taken over: the step's files go (after a failure they stay until the block commits). */
    for (int i = 0; i < P && !rc; i++) {
        char name[64];
        qd_cpart_name_in(name, sizeof name, block, i);
        qd_part_file_remove(p->parts_fd, name);
    }
    if (!rc) qd_part_outputs_remove(p->parts_fd, block, "capture", P, sums);
    free(sums);
    free(names);
    free(labels);
    return rc;
}
