/* Fan-outs of a block's step over the node's workers (daemon.h, "fan-outs"; proto/wire.md, the
 * parts messages). The first half is the pure bookkeeping of one fan-out (which part is
 * pending, in flight where, or done, and which parts to hand out next), tested directly by
 * tests/unit/test_daemon_fanout.c; the second is the daemon's side: the messages, the
 * scheduling after the tasks, a dead helper's part back to pending, and the status field
 * `parts`.
 *
 * Nothing here decides bytes: a part that fails, or whose worker dies, or whose fan-out is
 * dropped, is recomputed by the lead (the pipeline reads every output back), so the daemon
 * only has to end every fan-out with parts_done and never lose track of a busy worker. */
#define _GNU_SOURCE
#include "daemon/daemon.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>

#include "quant/core/log.h"

/* ---- one fan-out's bookkeeping (pure) ---------------------------------------------------- */

int qdd_fanout_open(qdd_fanout **out, uint64_t id, int lead, int block, const char *step, int n,
                    const char *const *names, int n_names)
{
    *out = NULL;
    if (n < 1 || n > QP_PARTS_MAX || n_names < 0 || n_names > n || !step || strlen(step) >= sizeof((qdd_fanout *)0)->step)
        return QD_EINVAL;
    qdd_fanout *f = calloc(1, sizeof *f);
    if (!f) return QD_ENOMEM;
    f->id = id;
    f->lead = lead;
    f->block = block;
    snprintf(f->step, sizeof f->step, "%s", step);
    f->n = n;
    f->state = calloc((size_t)n, sizeof *f->state);
    f->worker = malloc((size_t)n * sizeof *f->worker);
    f->names = calloc((size_t)n, sizeof *f->names);
    f->hand_ms = calloc((size_t)n, sizeof *f->hand_ms);
    f->backed = calloc((size_t)n, sizeof *f->backed);
    f->backup = -1;
    int bad = !f->state || !f->worker || !f->names || !f->hand_ms || !f->backed;
    for (int i = 0; !bad && i < n; i++) f->worker[i] = -1;
    for (int i = 0; !bad && names && i < n_names; i++)
        if (names[i] && names[i][0]) bad = !(f->names[i] = strdup(names[i]));
    if (bad) {
        qdd_fanout_free(f);
        return QD_ENOMEM;
    }
    *out = f;
    return 0;
}

void qdd_fanout_free(qdd_fanout *f)
{
    if (!f) return;
    for (int i = 0; f->names && i < f->n; i++) free(f->names[i]);
    for (int i = 0; f->holder && i < f->n; i++) free(f->holder[i]);
    free(f->holder);
    free(f->hand_ms);
    free(f->backed);
    free(f->names);
    free(f->worker);
    free(f->state);
    free(f);
}

int qdd_fanout_held_by(const qdd_fanout *f, int worker)
{
    for (int i = 0; i < f->n; i++)
        if (f->state[i] == QDD_PART_INFLIGHT && f->worker[i] == worker) return i;
    return -1;
}

int qdd_fanout_helpers(const qdd_fanout *f)
{
    /* A worker holds one part at a time, so parts in flight count the workers. */
    return f->n_inflight - f->n_remote - (qdd_fanout_held_by(f, f->lead) >= 0);
}

void qdd_fanout_start(qdd_fanout *f, int index, int worker)
{
    if (index < 0 || index >= f->n || f->state[index] != QDD_PART_PENDING) return;
    f->state[index] = QDD_PART_INFLIGHT;
    f->worker[index] = worker;
    f->hand_ms[index] = f->now_ms;
    f->n_inflight++;
}

void qdd_fanout_backup_start(qdd_fanout *f, int index)
{
    if (index < 0 || index >= f->n || f->state[index] != QDD_PART_INFLIGHT || f->backup >= 0) return;
    f->backup = index;
    f->backed[index] = 1;
}

int qdd_fanout_finish(qdd_fanout *f, int index, int worker)
{
    if (index < 0 || index >= f->n) return 0;
    int backup = index == f->backup && worker == f->lead;
    if (backup) f->backup = -1;
    if (f->state[index] != QDD_PART_INFLIGHT || (!backup && f->worker[index] != worker)) return 0;
    /* The helper's copy won: the lead's, still running, reports late. */
    if (index == f->backup) f->backup = -1;
    if (!backup) {
        uint64_t took = f->now_ms > f->hand_ms[index] ? f->now_ms - f->hand_ms[index] : 0;
        if (took > f->done_max_ms) f->done_max_ms = took;
        f->n_timed++;
    }
    f->state[index] = QDD_PART_DONE;
    f->worker[index] = -1;
    f->n_inflight--;
    f->n_done++;
    return 1;
}

int qdd_fanout_other_copy(const qdd_fanout *f, int index, int worker)
{
    if (index < 0 || index >= f->n || f->backup != index || f->state[index] != QDD_PART_INFLIGHT) return -1;
    if (worker == f->lead && f->worker[index] >= 0 && f->worker[index] != f->lead) return f->worker[index];
    if (worker != f->lead && f->worker[index] == worker) return f->lead;
    return -1;
}

void qdd_fanout_backup_failed(qdd_fanout *f, int index)
{
    if (index == f->backup) f->backup = -1;
}

int qdd_fanout_requeue(qdd_fanout *f, int worker)
{
    int i = qdd_fanout_held_by(f, worker);
    if (i < 0) return -1;
    if (i == f->backup) {
        /* The lead runs a copy already: the part is the lead's now, not pending again. */
        f->worker[i] = f->lead;
        f->backup = -1;
        return i;
    }
    f->state[i] = QDD_PART_PENDING;
    f->worker[i] = -1;
    f->n_inflight--;
    return i;
}

int qdd_fanout_complete(const qdd_fanout *f) { return f->n_done == f->n; }

qdd_apply_result qdd_fanout_apply(qdd_fanout *f, int index, const char *state, const char *self_node)
{
    if (index < 0 || index >= f->n || !state) return QDD_APPLY_NONE;
    const char *sp = strchr(state, ' ');
    size_t kw = sp ? (size_t)(sp - state) : strlen(state);
    char holder[160] = "";
    if (sp) {
        const char *h = sp + 1, *e = strchr(h, ' ');
        size_t hl = e ? (size_t)(e - h) : strlen(h);
        if (hl >= sizeof holder) return QDD_APPLY_NONE;
        memcpy(holder, h, hl);
        holder[hl] = 0;
    }
    size_t sl = strlen(self_node);
    int remote = f->state[index] == QDD_PART_INFLIGHT && f->worker[index] == QDD_PART_REMOTE;
    int pending = f->state[index] == QDD_PART_PENDING;
    /* A part in flight on this node's own worker: its messages (part_done, a death) decide,
     * not Redis. (A claim of a worker of ours that died is another holder until it lapses.) */
    if (holder[0] && !strncmp(holder, self_node, sl) && holder[sl] == '/' && f->state[index] == QDD_PART_INFLIGHT &&
        !remote)
        return QDD_APPLY_NONE;
#define KW(s) (kw == sizeof(s) - 1 && !strncmp(state, s, kw))
    if (KW("pending") || KW("expired")) {
        if (!remote) return QDD_APPLY_NONE;
        f->state[index] = QDD_PART_PENDING;
        f->worker[index] = -1;
        f->n_inflight--;
        f->n_remote--;
        return KW("expired") ? QDD_APPLY_REQUEUED : QDD_APPLY_NONE;
    }
    if (!holder[0] || (!pending && !remote)) return QDD_APPLY_NONE;
    if (!f->holder && !(f->holder = calloc((size_t)f->n, sizeof *f->holder))) return QDD_APPLY_ENOMEM;
    if (!f->holder[index] || strcmp(f->holder[index], holder)) {
        char *c = strdup(holder);
        if (!c) return QDD_APPLY_ENOMEM;
        free(f->holder[index]);
        f->holder[index] = c;
    }
    if (KW("run")) {
        if (remote) return QDD_APPLY_NONE;
        f->state[index] = QDD_PART_INFLIGHT;
        f->worker[index] = QDD_PART_REMOTE;
        f->n_inflight++;
        f->n_remote++;
        return QDD_APPLY_REMOTE;
    }
    if (KW("done") || KW("failed")) {
        if (remote) { f->n_inflight--; f->n_remote--; }
        f->state[index] = QDD_PART_DONE;
        f->worker[index] = -1;
        f->n_done++;
        return KW("done") ? QDD_APPLY_DONE : QDD_APPLY_FAILED;
    }
#undef KW
    return QDD_APPLY_NONE;
}

int qdd_fanout_plan(const qdd_fanout *f, int lead_free, int max_workers, const int *idle, int n_idle,
                    qdd_part_grant *grants, int cap)
{
    int n = 0, next = 0, helpers = qdd_fanout_helpers(f);
    /* The pending parts in index order, so a fan-out runs its parts roughly in the order the
     * lead listed them (its names, and its status, read best that way). */
#define NEXT_PENDING() do { while (next < f->n && f->state[next] != QDD_PART_PENDING) next++; } while (0)
    NEXT_PENDING();
    /* The lead first: it always makes progress itself, with or without helpers. */
    int lead_idle = lead_free && qdd_fanout_held_by(f, f->lead) < 0 && f->backup < 0;
    if (lead_idle && next < f->n && n < cap) {
        grants[n++] = (qdd_part_grant){f->lead, next++, 0};
        NEXT_PENDING();
        lead_idle = 0;
    }
    for (int k = 0; k < n_idle && next < f->n && n < cap && helpers < max_workers - 1; k++) {
        if (idle[k] == f->lead || qdd_fanout_held_by(f, idle[k]) >= 0) continue;
        grants[n++] = (qdd_part_grant){idle[k], next++, 0};
        helpers++;
        NEXT_PENDING();
    }
#undef NEXT_PENDING
    /* Nothing left to hand out: rather than wait on a helper far slower than the parts done
     * so far, the lead runs a copy of its part, so a straggler holds the block back by about
     * twice a part plus the lead's time for it, not for as long as it takes. (A copy started
     * too early costs the lead one part's time: it cannot be called back.) */
    if (lead_idle && next >= f->n && n < cap && !f->shared && f->n_timed > 0) {
        int best = -1;
        for (int i = 0; i < f->n; i++)
            if (f->state[i] == QDD_PART_INFLIGHT && f->worker[i] >= 0 && f->worker[i] != f->lead && !f->backed[i] &&
                f->now_ms > f->hand_ms[i] && f->now_ms - f->hand_ms[i] > 2 * f->done_max_ms &&
                (best < 0 || f->hand_ms[i] < f->hand_ms[best]))
                best = i;
        if (best >= 0) grants[n++] = (qdd_part_grant){f->lead, best, 1};
    }
    return n;
}

/* ---- the daemon's side ---------------------------------------------------------------------- */

/* The status field: the parts of j in flight on this node's workers and on other nodes
 * (worker "<node>/<worker>"), written when it changes. */
void qdd_parts_status(qdd_job *j)
{
    qdd_daemon *d = j->d;
    cJSON *a = cJSON_CreateArray();
    for (int k = 0; a && k < d->n_workers; k++) {
        const qdd_worker *w = &d->workers[k];
        if (w->part_job != j) continue;
        const qdd_fanout *f = j->fanout && j->fanout->id == w->part_fanout ? j->fanout : NULL;
        cJSON *o = cJSON_CreateObject();
        if (!o || !cJSON_AddItemToArray(a, o)) { cJSON_Delete(o); break; }
        cJSON_AddStringToObject(o, "worker", w->name);
        cJSON_AddNumberToObject(o, "block", w->part_block);
        cJSON_AddStringToObject(o, "step", f ? f->step : "quantize");
        cJSON_AddNumberToObject(o, "part", w->part_index);
        if (f && w->part_index < f->n && f->names[w->part_index]) cJSON_AddStringToObject(o, "layer", f->names[w->part_index]);
    }
    const qdd_fanout *f = j->fanout;
    for (int i = 0; a && f && f->n_remote && i < f->n; i++) {
        if (f->state[i] != QDD_PART_INFLIGHT || f->worker[i] != QDD_PART_REMOTE) continue;
        cJSON *o = cJSON_CreateObject();
        if (!o || !cJSON_AddItemToArray(a, o)) { cJSON_Delete(o); break; }
        cJSON_AddStringToObject(o, "worker", f->holder && f->holder[i] ? f->holder[i] : "?");
        cJSON_AddNumberToObject(o, "block", f->block);
        cJSON_AddStringToObject(o, "step", f->step);
        cJSON_AddNumberToObject(o, "part", i);
        if (f->names[i]) cJSON_AddStringToObject(o, "layer", f->names[i]);
    }
    char *s = a && cJSON_GetArraySize(a) ? cJSON_PrintUnformatted(a) : NULL;
    cJSON_Delete(a);
    int same = (!s && !j->st.parts) || (s && j->st.parts && !strcmp(s, j->st.parts));
    if (!same) {
        qp_status_set_str(&j->st.parts, s);
        if (j->phase == QDD_JOB_RUNNING && !j->lost) qdd_jobs_status_write(d, &j->st, QP_SF_PARTS, QP_EVENT_PROGRESS);
    }
    cJSON_free(s);
}

/* w no longer holds a part (the caller drops the reference when done with the job). */
qdd_job *qdd_parts_release(qdd_worker *w)
{
    qdd_job *j = w->part_job;
    w->part_job = NULL;
    w->part_fanout = 0;
    w->part_claiming = 0;
    if (!w->job && w->state == QDD_W_BUSY) w->state = QDD_W_IDLE;
    return j;
}

static void fanout_close(qdd_job *j)
{
    if (j->fanout && j->fanout->shared) qdd_nparts_close(j, j->fanout);
    qdd_fanout_free(j->fanout);
    j->fanout = NULL;
}

static void on_parts(qdd_daemon *d, qdd_worker *w, const qp_msg_parts *p)
{
    qdd_job *j = w->job;
    const char *why = NULL;
    if (!j || strcmp(j->id, p->job_id)) why = "the worker runs no task of that job";
    else if (j->phase != QDD_JOB_RUNNING || j->lost || j->cancel_req) why = "the job is not running here";
    else if (p->fence != j->fence) why = "its fence is not the job's lease";
    else if (d->stopping > QDD_STOP_DRAINING) why = "the daemon is stopping";
    qdd_fanout *f = NULL;
    if (!why && qdd_fanout_open(&f, ++d->fanout_seq, w->index, p->block, p->step, p->n,
                                (const char *const *)p->names.v, p->names.n))
        why = "out of memory";
    if (why) {
        /* The lead then runs every part itself: only time is lost. */
        QD_LOG(QD_LOG_WARN, "parts_refused", "job=%s block=%d step=%s worker=%s why=\"%s\"", p->job_id, p->block, p->step,
               w->name, why);
        qdd_pool_send_parts_done(w, p->job_id, p->block, p->step);
        return;
    }
    if (j->fanout)
        QD_LOG(QD_LOG_WARN, "parts_replaced", "job=%s block=%d done=%d/%d (a newer fan-out from the lead)", j->id,
               j->fanout->block, j->fanout->n_done, j->fanout->n);
    fanout_close(j);
    j->fanout = f;
    qdd_nparts_open(j, f);
    QD_LOG(QD_LOG_INFO, "parts_open", "job=%s block=%d step=%s parts=%d lead=%s workers=%d shared=%d", j->id, p->block,
           p->step, p->n, w->name, j->job->workers, f->shared);
}

void qdd_parts_complete(qdd_job *j)
{
    qdd_fanout *f = j->fanout;
    qdd_worker *lead = &j->d->workers[f->lead];
    if (lead->job == j) qdd_pool_send_parts_done(lead, j->id, f->block, f->step);
    QD_LOG(QD_LOG_INFO, "parts_done", "job=%s block=%d step=%s parts=%d", j->id, f->block, f->step, f->n);
    fanout_close(j);
}

static void on_part_done(qdd_daemon *d, qdd_worker *w, const qp_msg_part_done *p)
{
    if (w->rpart) {
        qdd_nparts_done(d, w, p);
        return;
    }
    qdd_job *j = w->part_job;
    if (!j || strcmp(j->id, p->job_id) || w->part_block != p->block || w->part_index != p->index) {
        QD_LOG(QD_LOG_WARN, "part_done_ignored", "job=%s block=%d part=%d worker=%s (not the part it holds)", p->job_id,
               p->block, p->index, w->name);
        return;
    }
    uint64_t fid = w->part_fanout;
    int other = -1;
    if (j->fanout && j->fanout->id == fid && j->fanout->shared) qdd_nparts_local_done(j, w, p->index, p->ok);
    qdd_parts_release(w);
    qdd_fanout *f = j->fanout;
    if (f) f->now_ms = uv_now(d->loop);
    if (f && f->id == fid && !p->ok && f->backup == p->index && w->index == f->lead) {
        /* A failed backup changes nothing: the helper's copy still runs. */
        QD_LOG(QD_LOG_WARN, "part_backup_failed", "job=%s block=%d step=%s part=%d err=\"%s\"", j->id, p->block, p->step,
               p->index, p->error ? p->error : "");
        qdd_fanout_backup_failed(f, p->index);
    } else if (f && f->id == fid && (other = qdd_fanout_other_copy(f, p->index, w->index), 1) &&
               qdd_fanout_finish(f, p->index, w->index)) {
        if (p->ok)
            QD_LOG(QD_LOG_INFO, "part_done", "job=%s block=%d step=%s part=%d worker=%s lead=%d seconds=%.3f done=%d/%d",
                   j->id, p->block, p->step, p->index, w->name, w->index == f->lead, p->seconds, f->n_done, f->n);
        /* The other copy of a part done well is stopped: the lead goes on with the block, or
         * the straggler takes other work (its report comes late, ignored). */
        if (p->ok && other >= 0 && !qdd_pool_send_part_stop(&d->workers[other], j->id, p->block, p->step, p->index))
            QD_LOG(QD_LOG_INFO, "part_stop", "job=%s block=%d step=%s part=%d worker=%s (its copy by %s finished first)",
                   j->id, p->block, p->step, p->index, d->workers[other].name, w->name);
        else if (!p->ok)
            QD_LOG(QD_LOG_WARN, "part_failed", "job=%s block=%d step=%s part=%d worker=%s err=\"%s\" (the lead computes it)",
                   j->id, p->block, p->step, p->index, w->name, p->error ? p->error : "");
        if (qdd_fanout_complete(f)) qdd_parts_complete(j);
    } else {
        QD_LOG(QD_LOG_INFO, "part_late", "job=%s block=%d part=%d worker=%s ok=%d (its fan-out is gone)", j->id, p->block,
               p->index, w->name, p->ok);
    }
    qdd_parts_status(j);
    qdd_job_unref(j);
}

void qdd_parts_on_msg(qdd_daemon *d, qdd_worker *w, const qp_msg *m)
{
    if (m->type == QP_MSG_PARTS) on_parts(d, w, &m->parts);
    else if (m->type == QP_MSG_PART_DONE) on_part_done(d, w, &m->part_done);
}

/* The memory the node's estimates hold now: every running job's, and each part a helper
 * runs (its job's part_mem). */
static uint64_t mem_in_use(const qdd_daemon *d)
{
    uint64_t used = 0;
    for (const qdd_job *j = d->jobs; j; j = j->next)
        if (j->phase == QDD_JOB_RUNNING) used += j->mem;
    for (int k = 0; k < d->n_workers; k++) {
        const qdd_worker *w = &d->workers[k];
        if (w->part_job && w->part_job->worker != k) used += w->part_job->part_mem;
    }
    return used;
}

void qdd_parts_schedule(qdd_daemon *d, qdd_job *const *jobs, int n)
{
    int idle[QDD_MAX_WORKERS];
    qdd_part_grant g[QDD_MAX_WORKERS + 1];
    uint64_t limit = d->cfg->memory_limit_mb > 0 ? (uint64_t)d->cfg->memory_limit_mb << 20 : 0;
    uint64_t used = limit ? mem_in_use(d) : 0;
    for (int i = 0; i < n; i++) {
        qdd_job *j = jobs[i];
        qdd_fanout *f = j->fanout;
        if (!f || j->phase != QDD_JOB_RUNNING || j->lost || j->cancel_req || j->worker != f->lead) continue;
        const qdd_worker *lead = &d->workers[f->lead];
        int lead_free = lead->job == j && !lead->part_job && !lead->exiting && !lead->exited;
        int n_idle = 0;
        for (int k = 0; k < d->n_workers && n_idle < QDD_MAX_WORKERS; k++) {
            const qdd_worker *w = &d->workers[k];
            if (k != f->lead && w->state == QDD_W_IDLE && !w->exiting && !w->exited && !w->part_job) idle[n_idle++] = k;
        }
        int max = j->job->workers == QP_JOB_WORKERS_ALL ? d->n_workers : j->job->workers;
        f->now_ms = uv_now(d->loop);
        int ng = qdd_fanout_plan(f, lead_free, max, idle, n_idle, g, QDD_MAX_WORKERS + 1), sent = 0;
        /* Under memory-limit-mb a helper takes a part only while the node's estimates, its
         * part's included, stay within the limit; the lead's own part is in its job's. */
        for (int k = 0; limit && k < ng; k++) {
            if (g[k].worker == f->lead) continue;
            if (used + j->part_mem <= limit) { used += j->part_mem; continue; }
            if (!f->mem_held) QD_LOG(QD_LOG_INFO, "parts_held_back", "job=%s block=%d reason=memory part_mem_mb=%llu limit_mb=%lld",
                                     j->id, f->block, (unsigned long long)(j->part_mem >> 20), (long long)d->cfg->memory_limit_mb);
            f->mem_held = 1;
            memmove(&g[k], &g[k + 1], (size_t)(ng - k - 1) * sizeof g[0]);
            ng--;
            k--;
        }
        for (int k = 0; k < ng; k++) {
            qdd_worker *w = &d->workers[g[k].worker];
            if (g[k].backup) {
                if (qdd_pool_send_part(w, j, f->block, f->step, g[k].index)) continue;
                w->part_fanout = f->id;
                qdd_fanout_backup_start(f, g[k].index);
                QD_LOG(QD_LOG_INFO, "part_backup", "job=%s block=%d step=%s part=%d lead=%s helper=%s (no part pending; the "
                       "lead runs a copy of the part held longest)", j->id, f->block, f->step, g[k].index, w->name,
                       d->workers[f->worker[g[k].index]].name);
                sent++;
                continue;
            }
            if (f->shared) {
                /* Redis decides: another node may hold it (parts_nodes.c). */
                sent += qdd_nparts_grant(j, w, g[k].index) == 0;
                continue;
            }
            if (qdd_pool_send_part(w, j, f->block, f->step, g[k].index)) continue;
            w->part_fanout = f->id;
            qdd_fanout_start(f, g[k].index, w->index);
            sent++;
        }
        if (sent) qdd_parts_status(j);
    }
}

void qdd_parts_worker_gone(qdd_daemon *d, qdd_worker *w)
{
    if (w->rpart) qdd_nparts_worker_gone(d, w);
    if (!w->part_job) return;
    uint64_t fid = w->part_fanout;
    int block = w->part_block;
    qdd_job *j = qdd_parts_release(w);
    if (j->fanout && j->fanout->id == fid) {
        int i = qdd_fanout_requeue(j->fanout, w->index);
        if (i >= 0 && j->fanout->state[i] == QDD_PART_INFLIGHT)
            QD_LOG(QD_LOG_WARN, "part_requeued", "job=%s block=%d part=%d worker=%s (the worker is gone; the lead's backup "
                   "of it goes on)", j->id, block, i, w->name);
        else if (i >= 0)
            QD_LOG(QD_LOG_WARN, "part_requeued", "job=%s block=%d part=%d worker=%s (the worker is gone; the part is pending again)",
                   j->id, block, i, w->name);
    }
    qdd_parts_status(j);
    qdd_job_unref(j);
}

void qdd_parts_drop(qdd_job *j, qdd_worker *lead)
{
    qdd_job *held = lead && lead->part_job == j ? qdd_parts_release(lead) : NULL;
    if (j->fanout) {
        if (!qdd_fanout_complete(j->fanout))
            QD_LOG(QD_LOG_INFO, "parts_dropped", "job=%s block=%d done=%d/%d in_flight=%d (the lead's task ended)", j->id,
                   j->fanout->block, j->fanout->n_done, j->fanout->n, j->fanout->n_inflight);
        fanout_close(j);
    }
    qdd_parts_status(j);
    if (held) qdd_job_unref(held);   /* the caller holds a reference of its own */
}

void qdd_parts_cancel(qdd_job *j, const char *reason)
{
    qdd_daemon *d = j->d;
    for (int k = 0; k < d->n_workers; k++) {
        qdd_worker *w = &d->workers[k];
        if (w->part_job == j && w->job != j) qdd_pool_send_cancel(w, j->id, reason);
    }
}

int qdd_parts_in_flight(const qdd_job *j)
{
    int n = 0;
    for (int k = 0; k < j->d->n_workers; k++) n += j->d->workers[k].part_job == j;
    return n;
}
