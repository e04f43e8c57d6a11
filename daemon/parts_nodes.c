/* Parts over several nodes (daemon.h, "parts over several nodes"; proto/redis.md, "Parts over
 * several nodes"; docs/parallel.md). When the checkpoint directory of a job is on a
 * filesystem that other nodes mount too, their daemons (with remote-parts on) take parts of
 * its fan-outs for their idle workers.
 *
 * The owner (the daemon holding the job) publishes a fan-out in Redis when another live node
 * offers its workers, and Redis is then the arbiter of every part: the owner claims a part by
 * script before it hands it to its own worker, as the other nodes do for theirs, so no part
 * runs twice at once. A claim carries a deadline that its daemon renews while the part runs;
 * one that lapses (its node died) is put back to pending by the owner's sync, which also
 * learns the other nodes' parts in flight and done. Whatever goes wrong here costs time,
 * never bytes: the lead reads every output back and recomputes what is missing or damaged,
 * so when Redis does not answer a claim the owner hands the part out all the same. */
#define _GNU_SOURCE
#include "daemon/daemon.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "quant/core/clock.h"
#include "quant/core/log.h"

/* Another node's part a worker of this node runs. */
typedef struct qdd_rpart {
    char job_id[QP_JOB_ID_MAX + 1];
    char owner[QP_NODE_MAX + 1];
    char fid[96];
    char *spec, *ckpt;         /* owned */
    char step[16];
    int block, index;
    uint64_t fence;
    int claiming;              /* the claim is not answered yet */
} qdd_rpart;

static void rpart_free(qdd_rpart *rp)
{
    if (!rp) return;
    free(rp->spec);
    free(rp->ckpt);
    free(rp);
}

static void fid_of(const qdd_daemon *d, const qdd_fanout *f, char *buf, size_t cap)
{
    /* Unique across this node's restarts too: the daemon's start time is in it. */
    snprintf(buf, cap, "%s:%lld:%" PRIu64, d->node, (long long)d->start_ms, f->id);
}

static void holder_of(const qdd_daemon *d, const qdd_worker *w, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s/%s", d->node, w->name);
}

static int neval(qdd_daemon *d, const char *script, int nk, const char **keys, int na, const char **args,
                 redisCallbackFn *cb, void *pd)
{
    int n = 3 + nk + na;
    const char **argv = malloc((size_t)n * sizeof *argv);
    size_t *lens = malloc((size_t)n * sizeof *lens);
    char nkbuf[16];
    int rc = -1;
    if (argv && lens) {
        snprintf(nkbuf, sizeof nkbuf, "%d", nk);
        int k = 0;
        argv[k++] = "EVAL";
        argv[k++] = script;
        argv[k++] = nkbuf;
        for (int i = 0; i < nk; i++) argv[k++] = keys[i];
        for (int i = 0; i < na; i++) argv[k++] = args[i];
        for (int i = 0; i < n; i++) lens[i] = strlen(argv[i]);
        rc = d->cmd.up ? qdd_rconn_cmdv(&d->cmd, cb, pd, n, argv, lens) : -1;
    }
    free(argv);
    free(lens);
    return rc;
}

static long long ttl_ms(const qdd_daemon *d) { return d->cfg->lease_ttl_ms; }

/* ---- the owner ------------------------------------------------------------------------------- */

void qdd_nparts_open(qdd_job *j, qdd_fanout *f)
{
    qdd_daemon *d = j->d;
    if (d->remote_nodes <= 0 || !d->cmd_ready) return;
    char key[QP_KEY_MAX], set[QP_KEY_MAX], chan[QP_KEY_MAX], fid[96], ttl[32], block[16], n[16], max[16], fence[32],
        lead[160], ckpt[4200];
    qp_key_fanout(&d->keys, j->id, key, sizeof key);
    qp_key_fanouts(&d->keys, set, sizeof set);
    qp_key_parts_channel(&d->keys, chan, sizeof chan);
    fid_of(d, f, fid, sizeof fid);
    /* The hash outlives a dead owner by a few leases only; the owner's sync extends it. */
    snprintf(ttl, sizeof ttl, "%lld", ttl_ms(d) * 4);
    snprintf(block, sizeof block, "%d", f->block);
    snprintf(n, sizeof n, "%d", f->n);
    snprintf(max, sizeof max, "%d", j->job->workers == QP_JOB_WORKERS_ALL ? 0 : j->job->workers);
    snprintf(fence, sizeof fence, "%" PRIu64, j->fence);
    holder_of(d, &d->workers[f->lead], lead, sizeof lead);
    snprintf(ckpt, sizeof ckpt, "%s/.quantd", j->job->output);
    int na = 3 + 2 * (11 + f->n);
    const char **args = malloc((size_t)na * sizeof *args);
    char (*pn)[16] = malloc((size_t)f->n * sizeof *pn);
    if (!args || !pn) {
        free(args);
        free(pn);
        return;
    }
    int k = 0;
    args[k++] = chan;
    args[k++] = j->id;
    args[k++] = ttl;
#define FIELD(name, v) do { args[k++] = name; args[k++] = v; } while (0)
    FIELD("fid", fid);
    FIELD("node", d->node);
    FIELD("job", j->id);
    FIELD("block", block);
    FIELD("step", f->step);
    FIELD("n", n);
    FIELD("max", max);
    FIELD("lead", lead);
    FIELD("fence", fence);
    FIELD("checkpoint_dir", ckpt);
    FIELD("spec", j->payload);
    for (int i = 0; i < f->n; i++) {
        snprintf(pn[i], sizeof pn[i], "p%d", i);
        FIELD(pn[i], "pending");
    }
#undef FIELD
    const char *keys[2] = {key, set};
    if (neval(d, qdd_lua_fanout_open, 2, keys, k, args, NULL, NULL) == 0) f->shared = 1;
    free(args);
    free(pn);
}

void qdd_nparts_close(qdd_job *j, qdd_fanout *f)
{
    qdd_daemon *d = j->d;
    char key[QP_KEY_MAX], set[QP_KEY_MAX], fid[96];
    qp_key_fanout(&d->keys, j->id, key, sizeof key);
    qp_key_fanouts(&d->keys, set, sizeof set);
    fid_of(d, f, fid, sizeof fid);
    const char *keys[2] = {key, set}, *args[2] = {fid, j->id};
    neval(d, qdd_lua_fanout_close, 2, keys, 2, args, NULL, NULL);
}

void qdd_nparts_local_done(qdd_job *j, qdd_worker *w, int index, int ok)
{
    qdd_daemon *d = j->d;
    char key[QP_KEY_MAX], chan[QP_KEY_MAX], fid[96], idx[16], holder[160];
    qp_key_fanout(&d->keys, j->id, key, sizeof key);
    qp_key_parts_channel(&d->keys, chan, sizeof chan);
    fid_of(d, j->fanout, fid, sizeof fid);
    snprintf(idx, sizeof idx, "%d", index);
    holder_of(d, w, holder, sizeof holder);
    const char *keys[1] = {key}, *args[6] = {fid, idx, holder, ok ? "1" : "0", chan, j->id};
    neval(d, qdd_lua_part_done, 1, keys, 6, args, NULL, NULL);
}

typedef struct claim_ctx {
    qdd_job *j;                /* a reference */
    int worker, index;
    uint64_t fanout;
} claim_ctx;

/* w reserved for its part: the part message goes out (the claim was granted, or Redis could
 * not say: then too, since a part run twice costs time, never bytes). */
static void send_reserved(qdd_worker *w)
{
    qdd_job *j = w->part_job;
    char ckpt[4200];
    snprintf(ckpt, sizeof ckpt, "%s/.quantd", j->job->output);
    w->part_claiming = 0;
    if (qdd_pool_send_part_msg(w, j->id, j->payload, ckpt, w->part_block, j->fanout->step, w->part_index, j->fence))
        qdd_parts_worker_gone(w->d, w);
    else
        qdd_parts_status(j);
}

/* The reservation of w ends without its part: the part is pending again in f. */
static void unreserve(qdd_worker *w, qdd_fanout *f)
{
    if (f) qdd_fanout_requeue(f, w->index);
    qdd_job *held = qdd_parts_release(w);
    if (held) qdd_job_unref(held);
}

static void on_claim(redisAsyncContext *ac, void *r, void *pd)
{
    (void)ac;
    claim_ctx *c = pd;
    qdd_job *j = c->j;
    qdd_daemon *d = j->d;
    qdd_worker *w = &d->workers[c->worker];
    redisReply *reply = r;
    qdd_fanout *f = j->fanout && j->fanout->id == c->fanout ? j->fanout : NULL;
    int mine = w->part_claiming && w->part_job == j && w->part_fanout == c->fanout && w->part_index == c->index;
    if (mine && (!f || !reply || d->stopping > QDD_STOP_DRAINING)) {
        unreserve(w, f);
    } else if (mine) {
        long long idx = reply->type == REDIS_REPLY_ARRAY && reply->elements >= 2 &&
                        reply->element[0]->type == REDIS_REPLY_INTEGER ? reply->element[0]->integer : -2;
        if (idx == -1) {
            /* Another node holds it (or it is done there): it is theirs. */
            const char *state = reply->element[1]->str ? reply->element[1]->str : "";
            unreserve(w, f);
            qdd_apply_result a = qdd_fanout_apply(f, c->index, state, d->node);
            if (a == QDD_APPLY_DONE || a == QDD_APPLY_FAILED)
                QD_LOG(QD_LOG_INFO, "part_done", "job=%s block=%d step=%s part=%d worker=%s lead=0 seconds=0 done=%d/%d",
                       j->id, f->block, f->step, c->index, f->holder[c->index], f->n_done, f->n);
            qdd_parts_status(j);
            if (qdd_fanout_complete(f)) qdd_parts_complete(j);
        } else {
            send_reserved(w);
        }
    }
    free(c);
    qdd_job_unref(j);
}

int qdd_nparts_grant(qdd_job *j, qdd_worker *w, int index)
{
    qdd_daemon *d = j->d;
    qdd_fanout *f = j->fanout;
    if (w->part_job) return -1;
    w->state = QDD_W_BUSY;   /* the lead already is, with its task */
    w->part_job = j;
    w->part_block = f->block;
    w->part_index = index;
    w->part_fanout = f->id;
    w->part_claiming = 1;
    j->refs++;
    qdd_fanout_start(f, index, w->index);
    char key[QP_KEY_MAX], lease[QP_KEY_MAX], fid[96], holder[160], ttl[32], idx[16], fence[32];
    qp_key_fanout(&d->keys, j->id, key, sizeof key);
    qp_key_lease(&d->keys, j->id, lease, sizeof lease);
    fid_of(d, f, fid, sizeof fid);
    holder_of(d, w, holder, sizeof holder);
    snprintf(ttl, sizeof ttl, "%lld", ttl_ms(d));
    snprintf(idx, sizeof idx, "%d", index);
    snprintf(fence, sizeof fence, "%" PRIu64, j->fence);
    const char *keys[2] = {key, lease}, *args[5] = {fid, holder, ttl, idx, fence};
    claim_ctx *c = malloc(sizeof *c);
    if (c) *c = (claim_ctx){j, w->index, index, f->id};
    if (c && neval(d, qdd_lua_part_claim, 2, keys, 5, args, on_claim, c) == 0) {
        j->refs++;
        return 0;
    }
    free(c);
    send_reserved(w);   /* Redis cannot say: the part goes out all the same */
    return 0;
}

typedef struct sync_ctx {
    qdd_job *j;                /* a reference */
    uint64_t fanout;
} sync_ctx;

static void on_sync(redisAsyncContext *ac, void *r, void *pd)
{
    (void)ac;
    sync_ctx *c = pd;
    qdd_job *j = c->j;
    qdd_daemon *d = j->d;
    redisReply *reply = r;
    qdd_fanout *f = j->fanout && j->fanout->id == c->fanout ? j->fanout : NULL;
    if (f) f->sync_inflight = 0;
    if (f && reply && reply->type == REDIS_REPLY_ARRAY && j->phase == QDD_JOB_RUNNING) {
        if (reply->elements == 0) {
            /* The hash is gone (Redis lost it): no other node can claim or report now, so the
             * parts they held are pending again and the fan-out stays on this node. */
            QD_LOG(QD_LOG_WARN, "parts_unshared", "job=%s block=%d (the fan-out's hash is gone from Redis)", j->id,
                   f->block);
            for (int i = 0; i < f->n; i++) qdd_fanout_apply(f, i, "pending", d->node);
            f->shared = 0;
        }
        for (size_t i = 0; i < reply->elements && (int)i < f->n; i++) {
            const char *s = reply->element[i]->str;
            if (!s) continue;
            qdd_apply_result a = qdd_fanout_apply(f, (int)i, s, d->node);
            const char *h = f->holder && f->holder[i] ? f->holder[i] : "?";
            if (a == QDD_APPLY_DONE)
                QD_LOG(QD_LOG_INFO, "part_done", "job=%s block=%d step=%s part=%zu worker=%s lead=0 seconds=0 done=%d/%d",
                       j->id, f->block, f->step, i, h, f->n_done, f->n);
            else if (a == QDD_APPLY_FAILED)
                QD_LOG(QD_LOG_WARN, "part_failed", "job=%s block=%d step=%s part=%zu worker=%s (the lead computes it)",
                       j->id, f->block, f->step, i, h);
            else if (a == QDD_APPLY_REQUEUED)
                QD_LOG(QD_LOG_WARN, "part_requeued", "job=%s block=%d part=%zu worker=%s node=%.*s (its claim lapsed; the "
                       "part is pending again)", j->id, f->block, i, h, (int)strcspn(h, "/"), h);
            else if (a == QDD_APPLY_REMOTE)
                QD_LOG(QD_LOG_INFO, "part_remote", "job=%s block=%d part=%zu worker=%s", j->id, f->block, i, h);
        }
        qdd_parts_status(j);
        if (qdd_fanout_complete(f)) qdd_parts_complete(j);
    }
    free(c);
    qdd_job_unref(j);
}

static void owner_sync(qdd_daemon *d)
{
    for (qdd_job *j = d->jobs; j; j = j->next) {
        qdd_fanout *f = j->fanout;
        if (!f || !f->shared || f->sync_inflight || j->phase != QDD_JOB_RUNNING) continue;
        char key[QP_KEY_MAX], fid[96], ttl[32];
        qp_key_fanout(&d->keys, j->id, key, sizeof key);
        fid_of(d, f, fid, sizeof fid);
        snprintf(ttl, sizeof ttl, "%lld", ttl_ms(d) * 4);
        const char *keys[1] = {key}, *args[2] = {fid, ttl};
        sync_ctx *c = malloc(sizeof *c);
        if (!c) return;
        *c = (sync_ctx){j, f->id};
        if (neval(d, qdd_lua_fanout_sync, 1, keys, 2, args, on_sync, c)) { free(c); continue; }
        j->refs++;
        f->sync_inflight = 1;
    }
}

/* ---- the other nodes ---------------------------------------------------------------------------- */

static int idle_for_parts(const qdd_worker *w)
{
    return w->state == QDD_W_IDLE && !w->exiting && !w->exited && !w->part_job && !w->rpart && !w->job;
}

static int refused_before(qdd_daemon *d, const char *id)
{
    for (int i = 0; i < d->n_refused; i++)
        if (!strcmp(d->refused[i], id)) return 1;
    int k = d->n_refused < 8 ? d->n_refused++ : 7;
    if (k == 7) memmove(d->refused[0], d->refused[1], sizeof d->refused[0] * 7);
    snprintf(d->refused[k], sizeof d->refused[k], "%s", id);
    return 0;
}

typedef struct rclaim_ctx {
    qdd_daemon *d;
    int worker;
    qdd_rpart *rp;
} rclaim_ctx;

static void rpart_drop(qdd_worker *w)
{
    rpart_free(w->rpart);
    w->rpart = NULL;
    if (!w->job && !w->part_job && w->state == QDD_W_BUSY) w->state = QDD_W_IDLE;
}

static void on_rclaim(redisAsyncContext *ac, void *r, void *pd)
{
    (void)ac;
    rclaim_ctx *c = pd;
    qdd_daemon *d = c->d;
    qdd_worker *w = &d->workers[c->worker];
    redisReply *reply = r;
    if (w->rpart == c->rp) {
        qdd_rpart *rp = c->rp;
        long long idx = reply && reply->type == REDIS_REPLY_ARRAY && reply->elements >= 2 &&
                        reply->element[0]->type == REDIS_REPLY_INTEGER ? reply->element[0]->integer : -2;
        if (idx >= 0 && idx < QP_PARTS_MAX && d->stopping <= QDD_STOP_DRAINING && !w->exited) {
            rp->index = (int)idx;
            rp->claiming = 0;
            if (qdd_pool_send_part_msg(w, rp->job_id, rp->spec, rp->ckpt, rp->block, rp->step, rp->index, rp->fence)) {
                rpart_drop(w);   /* the claim lapses; the owner puts it back */
            } else {
                QD_LOG(QD_LOG_INFO, "remote_part_start", "job=%s node=%s block=%d step=%s part=%d worker=%s", rp->job_id,
                       rp->owner, rp->block, rp->step, rp->index, w->name);
                d->scan_backoff_s = 0;
                d->next_scan_s = 0;   /* more idle workers may find more */
            }
        } else {
            rpart_drop(w);
        }
    }
    free(c);
}

typedef struct hash_ctx {
    qdd_daemon *d;
    char id[QP_JOB_ID_MAX + 1];
} hash_ctx;

static void on_fanout_hash(redisAsyncContext *ac, void *r, void *pd)
{
    (void)ac;
    hash_ctx *c = pd;
    qdd_daemon *d = c->d;
    redisReply *reply = r;
    d->scan_inflight--;
    if (!reply || reply->type != REDIS_REPLY_ARRAY || d->stopping || !d->cfg->remote_parts) goto out;
    const char *fid = NULL, *node = NULL, *spec = NULL, *ckpt = NULL, *step = NULL, *block = NULL, *fence = NULL;
    int open_parts = 0;
    for (size_t i = 0; i + 1 < reply->elements; i += 2) {
        const char *k = reply->element[i]->str, *v = reply->element[i + 1]->str;
        if (!k || !v) continue;
        if (!strcmp(k, "fid")) fid = v;
        else if (!strcmp(k, "node")) node = v;
        else if (!strcmp(k, "spec")) spec = v;
        else if (!strcmp(k, "checkpoint_dir")) ckpt = v;
        else if (!strcmp(k, "step")) step = v;
        else if (!strcmp(k, "block")) block = v;
        else if (!strcmp(k, "fence")) fence = v;
        else if (k[0] == 'p' && k[1] >= '0' && k[1] <= '9' && (!strncmp(v, "pending", 7) || !strncmp(v, "run ", 4)))
            open_parts++;
    }
    if (reply->elements == 0) {
        /* Its owner closed it, or died and the hash expired: the job leaves the set. */
        char set[QP_KEY_MAX];
        qp_key_fanouts(&d->keys, set, sizeof set);
        qdd_rconn_cmdf(&d->cmd, NULL, NULL, "SREM %s %s", set, c->id);
        goto out;
    }
    if (!fid || !node || !spec || !ckpt || !step || !block || !fence || !strcmp(node, d->node) || !open_parts ||
        strlen(step) >= sizeof((qdd_rpart *)0)->step || !qp_name_valid(node))
        goto out;
    qd_err err = {0};
    /* The checkpoint, and the model too: a part reads its weight rows from the model's own
     * files (part_src.c), so a node that cannot reach both at the same paths takes none. */
    cJSON *sj = cJSON_Parse(spec);
    const cJSON *mj = cJSON_GetObjectItemCaseSensitive(sj, "model");
    int ok = qdd_path_allowed(ckpt, d->cfg->allow_roots, d->cfg->n_allow_roots, &err) &&
             (!cJSON_IsString(mj) || qdd_path_allowed(mj->valuestring, d->cfg->allow_roots, d->cfg->n_allow_roots, &err));
    cJSON_Delete(sj);
    if (!ok) {
        if (!refused_before(d, c->id))
            QD_LOG(QD_LOG_WARN, "remote_parts_refused", "job=%s node=%s why=\"%s\" (this node takes no part of it)", c->id,
                   node, err.msg);
        goto out;
    }
    char key[QP_KEY_MAX], lease[QP_KEY_MAX], ttl[32], holder[160];
    qp_key_fanout(&d->keys, c->id, key, sizeof key);
    qp_key_lease(&d->keys, c->id, lease, sizeof lease);
    snprintf(ttl, sizeof ttl, "%lld", ttl_ms(d));
    for (int k = 0; k < d->n_workers && open_parts > 0; k++) {
        qdd_worker *w = &d->workers[k];
        if (!idle_for_parts(w)) continue;
        qdd_rpart *rp = calloc(1, sizeof *rp);
        rclaim_ctx *rc = malloc(sizeof *rc);
        if (!rp || !rc || !(rp->spec = strdup(spec)) || !(rp->ckpt = strdup(ckpt))) {
            rpart_free(rp);
            free(rc);
            break;
        }
        snprintf(rp->job_id, sizeof rp->job_id, "%s", c->id);
        snprintf(rp->owner, sizeof rp->owner, "%s", node);
        snprintf(rp->fid, sizeof rp->fid, "%s", fid);
        snprintf(rp->step, sizeof rp->step, "%s", step);
        rp->block = atoi(block);
        rp->fence = strtoull(fence, NULL, 10);
        rp->claiming = 1;
        holder_of(d, w, holder, sizeof holder);
        const char *keys[2] = {key, lease}, *args[5] = {fid, holder, ttl, "-1", fence};
        *rc = (rclaim_ctx){d, k, rp};
        w->rpart = rp;
        w->state = QDD_W_BUSY;
        if (neval(d, qdd_lua_part_claim, 2, keys, 5, args, on_rclaim, rc)) {
            rpart_drop(w);
            free(rc);
            break;
        }
        open_parts--;
    }
out:
    free(c);
}

static void on_fanouts(redisAsyncContext *ac, void *r, void *pd)
{
    (void)ac;
    qdd_daemon *d = pd;
    redisReply *reply = r;
    d->scan_inflight--;
    if (!reply || reply->type != REDIS_REPLY_ARRAY || d->stopping) return;
    for (size_t i = 0; i < reply->elements; i++) {
        const char *id = reply->element[i]->str;
        if (!id || !qp_name_valid(id)) continue;
        char key[QP_KEY_MAX];
        qp_key_fanout(&d->keys, id, key, sizeof key);
        hash_ctx *c = malloc(sizeof *c);
        if (!c) return;
        c->d = d;
        snprintf(c->id, sizeof c->id, "%s", id);
        if (qdd_rconn_cmdf(&d->cmd, on_fanout_hash, c, "HGETALL %s", key)) { free(c); return; }
        d->scan_inflight++;
    }
}

static void scan(qdd_daemon *d, double now)
{
    if (!d->cfg->remote_parts || d->stopping || !d->cmd_ready || d->scan_inflight || now < d->next_scan_s) return;
    int idle = 0;
    for (int k = 0; k < d->n_workers; k++) idle += idle_for_parts(&d->workers[k]);
    if (!idle) return;
    /* Every 0.5 s doubling to 5 s while nothing is found; a claim or a wake-up on the parts
     * channel starts over. */
    d->scan_backoff_s = d->scan_backoff_s <= 0 ? 0.5 : d->scan_backoff_s * 2 > 5 ? 5 : d->scan_backoff_s * 2;
    d->next_scan_s = now + d->scan_backoff_s;
    char set[QP_KEY_MAX];
    qp_key_fanouts(&d->keys, set, sizeof set);
    if (qdd_rconn_cmdf(&d->cmd, on_fanouts, d, "SMEMBERS %s", set) == 0) d->scan_inflight++;
}

static void on_rdone(redisAsyncContext *ac, void *r, void *pd)
{
    (void)ac;
    char *what = pd;
    redisReply *reply = r;
    if (reply && reply->type == REDIS_REPLY_INTEGER && reply->integer == 0)
        QD_LOG(QD_LOG_INFO, "remote_part_late", "%s (its fan-out closed or its claim lapsed: ignored)", what);
    free(what);
}

void qdd_nparts_done(qdd_daemon *d, qdd_worker *w, const qp_msg_part_done *p)
{
    qdd_rpart *rp = w->rpart;
    if (rp->claiming || strcmp(rp->job_id, p->job_id) || rp->block != p->block || rp->index != p->index) {
        QD_LOG(QD_LOG_WARN, "part_done_ignored", "job=%s block=%d part=%d worker=%s (not the part it holds)", p->job_id,
               p->block, p->index, w->name);
        return;
    }
    QD_LOG(QD_LOG_INFO, "remote_part_done", "job=%s node=%s block=%d step=%s part=%d worker=%s ok=%d seconds=%.3f",
           rp->job_id, rp->owner, rp->block, rp->step, rp->index, w->name, p->ok, p->seconds);
    char key[QP_KEY_MAX], chan[QP_KEY_MAX], idx[16], holder[160];
    qp_key_fanout(&d->keys, rp->job_id, key, sizeof key);
    qp_key_parts_channel(&d->keys, chan, sizeof chan);
    snprintf(idx, sizeof idx, "%d", rp->index);
    holder_of(d, w, holder, sizeof holder);
    const char *keys[1] = {key}, *args[6] = {rp->fid, idx, holder, p->ok ? "1" : "0", chan, rp->job_id};
    char *what = NULL;
    if (asprintf(&what, "job=%s node=%s block=%d part=%d worker=%s", rp->job_id, rp->owner, rp->block, rp->index,
                 w->name) < 0)
        what = NULL;
    if (neval(d, qdd_lua_part_done, 1, keys, 6, args, on_rdone, what)) free(what);
    rpart_drop(w);
    d->next_scan_s = 0;
}

void qdd_nparts_worker_gone(qdd_daemon *d, qdd_worker *w)
{
    (void)d;
    qdd_rpart *rp = w->rpart;
    if (!rp->claiming)
        QD_LOG(QD_LOG_WARN, "remote_part_lost", "job=%s node=%s block=%d part=%d worker=%s (its claim lapses; the owner "
               "puts it back)", rp->job_id, rp->owner, rp->block, rp->index, w->name);
    rpart_free(rp);
    w->rpart = NULL;   /* a claim in flight finds it gone */
}

/* ---- both ------------------------------------------------------------------------------------- */

static void renew_all(qdd_daemon *d)
{
    char key[QP_KEY_MAX], fid[96], idx[16], holder[160], ttl[32];
    snprintf(ttl, sizeof ttl, "%lld", ttl_ms(d));
    for (int k = 0; k < d->n_workers; k++) {
        qdd_worker *w = &d->workers[k];
        const char *job = NULL;
        int index = 0;
        if (w->rpart && !w->rpart->claiming) {
            job = w->rpart->job_id;
            snprintf(fid, sizeof fid, "%s", w->rpart->fid);
            index = w->rpart->index;
        } else if (w->part_job && !w->part_claiming && w->part_job->fanout && w->part_job->fanout->shared &&
                   w->part_job->fanout->id == w->part_fanout) {
            job = w->part_job->id;
            fid_of(d, w->part_job->fanout, fid, sizeof fid);
            index = w->part_index;
        }
        if (!job) continue;
        qp_key_fanout(&d->keys, job, key, sizeof key);
        snprintf(idx, sizeof idx, "%d", index);
        holder_of(d, w, holder, sizeof holder);
        const char *keys[1] = {key}, *args[4] = {fid, idx, holder, ttl};
        neval(d, qdd_lua_part_renew, 1, keys, 4, args, NULL, NULL);
    }
}

static void on_nodes(redisAsyncContext *ac, void *r, void *pd)
{
    (void)ac;
    qdd_daemon *d = pd;
    redisReply *reply = r;
    if (!reply || reply->type != REDIS_REPLY_INTEGER) return;
    if ((int)reply->integer != d->remote_nodes)
        QD_LOG(QD_LOG_INFO, "remote_nodes", "nodes=%lld (other live nodes that take parts)", reply->integer);
    d->remote_nodes = (int)reply->integer;
}

static void count_nodes(qdd_daemon *d)
{
    char set[QP_KEY_MAX], prefix[QP_KEY_MAX];
    qp_key_parts_nodes(&d->keys, set, sizeof set);
    /* The node key's name without the node: qp_key_node("x") minus "x". */
    qp_key_node(&d->keys, "x", prefix, sizeof prefix);
    prefix[strlen(prefix) - 1] = 0;
    qdd_rconn_cmdf(&d->cmd, NULL, NULL, d->cfg->remote_parts ? "SADD %s %s" : "SREM %s %s", set, d->node);
    const char *keys[1] = {set}, *args[2] = {prefix, d->node};
    neval(d, qdd_lua_parts_nodes, 1, keys, 2, args, on_nodes, d);
}

void qdd_nparts_tick(qdd_daemon *d)
{
    if (!d->cmd_ready || !d->cmd.up) return;
    double now = qd_clock_now_s();
    if (now >= d->next_nodes_s && !d->stopping) {
        d->next_nodes_s = now + (double)d->cfg->node_ttl_ms / 3000.0;
        count_nodes(d);
    }
    if (now >= d->next_parts_renew_s) {
        d->next_parts_renew_s = now + (double)d->cfg->lease_ttl_ms / 3000.0;
        renew_all(d);
    }
    owner_sync(d);
    scan(d, now);
}

static void on_parts_msg(void *pd, const char *channel, const char *payload, size_t len)
{
    (void)channel;
    (void)payload;
    (void)len;
    qdd_daemon *d = pd;
    /* A fan-out opened or a part ended somewhere: look now rather than at the backoff's end. */
    d->scan_backoff_s = 0;
    d->next_scan_s = 0;
    if (d->cmd_ready && d->cmd.up) {
        owner_sync(d);   /* a part of ours may be done elsewhere */
        scan(d, qd_clock_now_s());
    }
}

void qdd_nparts_start(qdd_daemon *d)
{
    char chan[QP_KEY_MAX];
    qp_key_parts_channel(&d->keys, chan, sizeof chan);
    qdd_rconn_subscribe(&d->sub, chan, on_parts_msg, d);
}
