/* The jobs this node holds, and the Redis protocol around them (proto/redis.md): admission
 * (size limit, validation, allow-list, take script with duplicate refusal and lease), the
 * status hash + event + stream on every change, lease renewal and the cancel flag, the
 * scheduler of (job, block) tasks over the workers, retries, final states, hand-back on
 * SIGTERM, re-assertion after a reconnect, and reclaiming dead nodes' jobs. */
#define _GNU_SOURCE
#include "daemon/daemon.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cjson/cJSON.h>

#include "quant/core/log.h"
#include "quant/pipeline/admission.h"

#define ARGS_MAX 64

/* ---- small helpers ----------------------------------------------------------------------- */

static void job_free(qdd_job *j)
{
    qdd_fanout_free(j->fanout);
    free(j->payload);
    qp_job_free(j->job);
    qp_status_clear(&j->st);
    free(j->take_payload);
    free(j);
}

void qdd_job_unref(qdd_job *j)
{
    if (j && --j->refs == 0) job_free(j);
}

static void job_unlink(qdd_job *j)
{
    qdd_daemon *d = j->d;
    for (qdd_job **p = &d->jobs; *p; p = &(*p)->next)
        if (*p == j) { *p = j->next; break; }
    j->next = NULL;
    j->phase = QDD_JOB_GONE;
}

/* Unlinks j from the daemon's list and drops the list's reference. The caller always holds
 * a reference of its own (a pending reply's or the worker's task), which it drops last with
 * qdd_job_unref, so j stays valid after this and is freed in one place only. */
static void job_remove(qdd_job *j)
{
    job_unlink(j);
    j->refs--;
}

/* The same for a job nobody else references (a take that could not be sent; exit). */
static void job_discard(qdd_job *j)
{
    job_unlink(j);
    qdd_job_unref(j);
}

/* EVAL script with keys and args (args NUL-terminated). The callback gets pd; when pd is a
 * job, pass is_job so the job stays alive until the reply. */
static int eval(qdd_daemon *d, const char *script, int nk, const char **keys, int na, const char **args,
                redisCallbackFn *cb, void *pd, qdd_job *ref)
{
    const char *argv[ARGS_MAX + 3];
    size_t lens[ARGS_MAX + 3];
    char nkbuf[16];
    if (nk + na > ARGS_MAX) return -1;
    snprintf(nkbuf, sizeof nkbuf, "%d", nk);
    int n = 0;
    argv[n] = "EVAL"; lens[n++] = 4;
    argv[n] = script; lens[n++] = strlen(script);
    argv[n] = nkbuf; lens[n++] = strlen(nkbuf);
    for (int i = 0; i < nk; i++) { argv[n] = keys[i]; lens[n++] = strlen(keys[i]); }
    for (int i = 0; i < na; i++) { argv[n] = args[i]; lens[n++] = strlen(args[i]); }
    if (qdd_rconn_cmdv(&d->cmd, cb, pd, n, argv, lens)) return -1;
    if (ref) ref->refs++;
    return 0;
}

/* Writes the selected status fields, publishes the event and appends it to the stream. */
static void status_write(qdd_daemon *d, qp_status *st, unsigned which, qp_event_type type)
{
    /* After a reconnect and before the recovery (the node claim goes first), a running job's
     * progress would re-create its hash and hide from the recovery that Redis came back
     * empty; the recovery's own full write puts it back. Final states always go out. */
    if (d->awaiting_recovery && !d->recovering && !qp_state_is_final(st->state)) return;
    st->updated_ms = qdd_unix_ms();
    qp_fields f = {0};
    qp_err pe = {0};
    char skey[QP_KEY_MAX], xkey[QP_KEY_MAX], chan[QP_KEY_MAX], maxlen[16];
    if (qp_status_to_fields(st, which, &f, &pe)) {
        QD_LOG(QD_LOG_ERROR, "status_encode", "job=%s err=\"%s\"", st->id ? st->id : "?", pe.msg);
        return;
    }
    char *ev = qp_status_to_event(st, type);
    if (!ev || qp_key_status(&d->keys, st->id, skey, sizeof skey) ||
        qp_key_job_events(&d->keys, st->id, xkey, sizeof xkey)) {
        free(ev);
        qp_fields_free(&f);
        return;
    }
    qp_key_events_channel(&d->keys, chan, sizeof chan);
    snprintf(maxlen, sizeof maxlen, "%d", QP_STREAM_MAXLEN);
    const char *keys[2] = {skey, xkey};
    const char *args[ARGS_MAX];
    int na = 0;
    args[na++] = chan;
    args[na++] = maxlen;
    args[na++] = ev;
    for (size_t i = 0; i < f.n && na + 2 <= ARGS_MAX - 2; i++) {
        args[na++] = f.name[i];
        args[na++] = f.value[i];
    }
    eval(d, qdd_lua_status, 2, keys, na, args, NULL, NULL, NULL);
    free(ev);
    qp_fields_free(&f);
}

void qdd_jobs_status_write(qdd_daemon *d, qp_status *st, unsigned which, qp_event_type type)
{
    status_write(d, st, which, type);
}

static void set_str(char **field, const char *v) { qp_status_set_str(field, v); }

/* ---- final states ---------------------------------------------------------------------------- */

static void finish_send(qdd_job *j);

static void on_finish(redisAsyncContext *ac, void *r, void *pd)
{
    qdd_job *j = pd;
    redisReply *reply = r;
    if (reply && reply->type != REDIS_REPLY_ERROR) {
        if (reply->type == REDIS_REPLY_INTEGER && reply->integer > 0)
            QD_LOG(QD_LOG_WARN, "job_duplicate_refused", "job=%s count=%lld (pushed while it was live; in the failed list)",
                   j->id, reply->integer);
        j->final_sent = 1;
        if (j->phase == QDD_JOB_FINAL) job_remove(j);
    } else if (reply) {
        QD_LOG(QD_LOG_ERROR, "redis_error", "op=finish job=%s err=\"%s\"", j->id, reply->str);
    }
    /* No reply: Redis went away; qdd_jobs_recover sends it again. */
    qdd_job_unref(j);
}

static void finish_send(qdd_job *j)
{
    qdd_daemon *d = j->d;
    char proc[QP_KEY_MAX], lease[QP_KEY_MAX], skey[QP_KEY_MAX], xkey[QP_KEY_MAX], ckey[QP_KEY_MAX], ttl[32];
    qp_key_processing(&d->keys, d->node, proc, sizeof proc);
    qp_key_lease(&d->keys, j->id, lease, sizeof lease);
    qp_key_status(&d->keys, j->id, skey, sizeof skey);
    qp_key_job_events(&d->keys, j->id, xkey, sizeof xkey);
    qp_key_cancel(&d->keys, j->id, ckey, sizeof ckey);
    char queue[QP_KEY_MAX], failed[QP_KEY_MAX], at[32];
    qp_key_queue(&d->keys, queue, sizeof queue);
    qp_key_failed(&d->keys, failed, sizeof failed);
    snprintf(ttl, sizeof ttl, "%" PRId64, d->cfg->retention_s);
    snprintf(at, sizeof at, "%" PRId64, qdd_unix_ms());
    status_write(d, &j->st, QP_SF_ALL, QP_EVENT_STATE);
    const char *keys[7] = {proc, lease, skey, xkey, ckey, queue, failed};
    const char *args[5] = {j->payload, j->lease, ttl, j->id, at};
    eval(d, qdd_lua_finish, 7, keys, 5, args, on_finish, j, j);
}

/* Moves j to a final state (done, failed, cancelled) and releases it in Redis. */
static void job_final(qdd_job *j, qp_state state, const char *error)
{
    if (j->lost) { job_remove(j); return; }
    j->phase = QDD_JOB_FINAL;
    j->st.state = state;
    if (error) set_str(&j->st.error, error);
    set_str(&j->st.parts, NULL);   /* what helpers may still run of it is no longer the job's */
    if (state == QP_STATE_DONE) { j->st.progress = 1; set_str(&j->st.stage, "done"); j->st.eta_s = 0; }
    j->st.finished_ms = qdd_unix_ms();
    QD_LOG(state == QP_STATE_FAILED ? QD_LOG_WARN : QD_LOG_INFO, "job_final", "job=%s state=%s err=\"%s\"", j->id,
           qp_state_name(state), j->st.error ? j->st.error : "");
    finish_send(j);
}

/* ---- admission ------------------------------------------------------------------------------- */

/* Refuses a payload: into the failed list with the reason and, when it names a usable id
 * that is not live elsewhere, a failed status hash saying why. */
static void reject(qdd_daemon *d, const char *raw, size_t len, const char *id, const char *why)
{
    QD_LOG(QD_LOG_WARN, "job_rejected", "id=%s err=\"%s\"", id ? id : "-", why);
    char proc[QP_KEY_MAX], failed[QP_KEY_MAX];
    qp_key_processing(&d->keys, d->node, proc, sizeof proc);
    qp_key_failed(&d->keys, failed, sizeof failed);
    cJSON *rec = cJSON_CreateObject();
    char *rawz = strndup(raw, len);
    cJSON_AddStringToObject(rec, "payload", rawz ? rawz : "");
    cJSON_AddStringToObject(rec, "error", why);
    cJSON_AddNumberToObject(rec, "at_ms", (double)qdd_unix_ms());
    char *text = cJSON_PrintUnformatted(rec);
    cJSON_Delete(rec);
    if (text && rawz) {
        const char *keys[2] = {proc, failed};
        const char *args[2] = {rawz, text};
        eval(d, qdd_lua_reject, 2, keys, 2, args, NULL, NULL, NULL);
    }
    free(text);
    free(rawz);
    if (id && qp_name_valid(id)) {
        qp_status st;
        qp_status_init(&st);
        set_str(&st.id, id);
        st.state = QP_STATE_FAILED;
        set_str(&st.error, why);
        set_str(&st.node, d->node);
        st.submitted_ms = st.finished_ms = qdd_unix_ms();
        status_write(d, &st, QP_SF_ALL, QP_EVENT_STATE);
        char skey[QP_KEY_MAX], xkey[QP_KEY_MAX];
        qp_key_status(&d->keys, id, skey, sizeof skey);
        qp_key_job_events(&d->keys, id, xkey, sizeof xkey);
        qdd_rconn_cmdf(&d->cmd, NULL, NULL, "EXPIRE %s %lld", skey, (long long)d->cfg->retention_s);
        qdd_rconn_cmdf(&d->cmd, NULL, NULL, "EXPIRE %s %lld", xkey, (long long)d->cfg->retention_s);
        qp_status_clear(&st);
    }
}

static int check_path(qdd_daemon *d, const char *what, const char *path, char *why, size_t cap)
{
    if (!path) return 0;
    qd_err err = {0};
    if (path[0] != '/') {
        snprintf(why, cap, "job.%s: \"%s\" must be an absolute path", what, path);
        return -1;
    }
    if (!qdd_path_allowed(path, d->cfg->allow_roots, d->cfg->n_allow_roots, &err)) {
        snprintf(why, cap, "job.%s: %s", what, err.msg);
        return -1;
    }
    return 0;
}

static void on_take(redisAsyncContext *ac, void *r, void *pd)
{
    qdd_job *j = pd;
    qdd_daemon *d = j->d;
    redisReply *reply = r;
    if (!reply || reply->type != REDIS_REPLY_ARRAY || reply->elements < 2 ||
        reply->element[0]->type != REDIS_REPLY_STRING) {
        /* Redis went away (or refused): the payload is still in our processing list, and the
         * reconnect recovery puts it back on the queue; after an error reply the queue backs
         * off and runs that recovery itself (qdd_queue_error). */
        if (reply)
            qdd_queue_error(d, "EVAL take", reply->type == REDIS_REPLY_ERROR && reply->str ? reply->str : "unexpected reply", 1);
        job_remove(j);
        qdd_job_unref(j);
        qdd_maybe_pop(d);
        return;
    }
    qdd_queue_ok(d, NULL);
    const char *what = reply->element[0]->str;
    const char *v = reply->element[1]->type == REDIS_REPLY_STRING ? reply->element[1]->str : "";
    if (!strcmp(what, "dup")) {
        char why[512], node[QP_NODE_MAX + 1] = "?";
        uint64_t tok;
        qp_lease_value_parse(v, &tok, node);
        snprintf(why, sizeof why, "job id %s is already live (running on node %s); a duplicate is refused", j->id, node);
        char *raw = j->take_payload;   /* the raw payload rides here until taken */
        j->take_payload = NULL;
        reject(d, raw, strlen(raw), NULL, why);
        free(raw);
        job_remove(j);
    } else if (!strcmp(what, "gone")) {
        QD_LOG(QD_LOG_INFO, "job_gone", "job=%s (handed back before it was taken)", j->id);
        job_remove(j);
    } else if (!strcmp(what, "cancelled")) {
        /* Not leased, and the processing list still holds the raw payload: finish with it. */
        free(j->payload);
        j->payload = j->take_payload;
        j->take_payload = NULL;
        set_str(&j->st.node, d->node);
        j->st.submitted_ms = qdd_unix_ms();
        job_final(j, QP_STATE_CANCELLED, "cancelled while queued");
    } else {
        free(j->take_payload);
        j->take_payload = NULL;
        snprintf(j->lease, sizeof j->lease, "%s", v);
        char node[QP_NODE_MAX + 1];
        qp_lease_value_parse(j->lease, &j->fence, node);
        const char *sub = reply->elements > 2 && reply->element[2]->str ? reply->element[2]->str : "";
        const char *att = reply->elements > 3 && reply->element[3]->str ? reply->element[3]->str : "0";
        const char *prev = reply->elements > 4 && reply->element[4]->str ? reply->element[4]->str : "";
        if (reply->elements > 5 && reply->element[5]->type == REDIS_REPLY_INTEGER && reply->element[5]->integer > 0)
            QD_LOG(QD_LOG_WARN, "job_duplicate_refused", "job=%s count=%lld (queued copies of a job now live; in the failed list)",
                   j->id, reply->element[5]->integer);
        int resubmitted = !strcmp(prev, "done") || !strcmp(prev, "failed") || !strcmp(prev, "cancelled") || !prev[0];
        j->st.submitted_ms = !resubmitted && sub[0] ? strtoll(sub, NULL, 10) : qdd_unix_ms();
        j->st.attempts = resubmitted ? 0 : atoi(att);
        j->st.state = QP_STATE_QUEUED;
        set_str(&j->st.node, d->node);
        set_str(&j->st.stage, "queued");
        j->phase = QDD_JOB_WAITING;
        char skey[QP_KEY_MAX], idx[QP_KEY_MAX];
        qp_key_status(&d->keys, j->id, skey, sizeof skey);
        qp_key_index(&d->keys, idx, sizeof idx);
        if (resubmitted) qdd_rconn_cmdf(&d->cmd, NULL, NULL, "HDEL %s error output report finished_ms daemon_deaths", skey);
        qdd_rconn_cmdf(&d->cmd, NULL, NULL, "HSET %s %s %s", skey, QP_STATUS_FIELD_SPEC, j->payload);
        qdd_rconn_cmdf(&d->cmd, NULL, NULL, "ZADD %s %lld %s", idx, (long long)j->st.submitted_ms, j->id);
        status_write(d, &j->st, QP_SF_ALL, QP_EVENT_STATE);
        if (d->cfg->memory_limit_mb > 0 && j->mem > (uint64_t)d->cfg->memory_limit_mb << 20) {
            char why[256];
            snprintf(why, sizeof why, "the job needs about %" PRIu64 " MiB, over memory-limit-mb %" PRId64,
                     j->mem >> 20, d->cfg->memory_limit_mb);
            job_final(j, QP_STATE_FAILED, why);
        } else if (d->stopping) {
            qdd_jobs_handback_all(d);
        }
    }
    qdd_job_unref(j);
    qdd_jobs_schedule(d);
    qdd_maybe_pop(d);
}

void qdd_jobs_admit(qdd_daemon *d, const char *raw, size_t len)
{
    char why[1024];
    if (qdd_job_size_check(len, d->cfg->max_job_bytes, why, sizeof why)) {
        reject(d, raw, len, NULL, why);
        return;
    }
    qp_job *job = NULL;
    qp_err pe = {0};
    if (qp_job_parse(raw, len, &job, &pe)) {
        /* Say why in the job's own hash when the payload names a usable id. */
        cJSON *o = cJSON_ParseWithLength(raw, len);
        const cJSON *idv = cJSON_GetObjectItemCaseSensitive(o, "id");
        reject(d, raw, len, cJSON_IsString(idv) ? idv->valuestring : NULL, pe.msg);
        cJSON_Delete(o);
        return;
    }
    if (check_path(d, "model", job->model, why, sizeof why) || check_path(d, "output", job->output, why, sizeof why) ||
        check_path(d, "calibration.path", job->calibration.path, why, sizeof why) ||
        (job->eval.enabled && check_path(d, "eval.path", job->eval.path, why, sizeof why))) {
        reject(d, raw, len, job->id, why);
        qp_job_free(job);
        return;
    }
    /* The output must not be, contain or lie inside what the job reads, nor be or contain an
     * allow-root or the daemon's own files (overwrite removes it). */
    size_t n_roots = d->cfg->n_allow_roots;
    qd_protected_path *protect = calloc(n_roots + 2, sizeof *protect);
    int n_protect = 0;
    qd_err perr = {0};
    if (protect) {
        for (size_t i = 0; i < n_roots; i++) protect[n_protect++] = (qd_protected_path){d->cfg->allow_roots[i], "an allow-root"};
        if (d->cfg->config_file) protect[n_protect++] = (qd_protected_path){d->cfg->config_file, "the daemon's configuration file"};
        protect[n_protect++] = (qd_protected_path){d->worker_exe, "the worker executable"};
    }
    int overlap = !protect ? qd_err_set(&perr, QD_ENOMEM, "out of memory") : qd_job_paths_check(job, protect, n_protect, &perr);
    free(protect);
    if (overlap) {
        snprintf(why, sizeof why, "job.output: %s", perr.msg);
        reject(d, raw, len, job->id, why);
        qp_job_free(job);
        return;
    }
    qdd_job *j = calloc(1, sizeof *j);
    char *canon = qp_job_to_json(job, 0);
    char *rawz = strndup(raw, len);
    if (!j || !canon || !rawz) {
        free(j); free(canon); free(rawz);
        qp_job_free(job);
        QD_LOG(QD_LOG_ERROR, "job_admit", "err=\"out of memory\"");
        return;
    }
    j->d = d;
    j->refs = 1;
    j->job = job;
    j->payload = canon;
    j->take_payload = rawz;     /* carries the raw payload until the take reply */
    snprintf(j->id, sizeof j->id, "%s", job->id);
    qp_status_init(&j->st);
    set_str(&j->st.id, j->id);
    set_str(&j->st.output, job->output);
    j->worker = j->last_worker = -1;
    j->seq = ++d->seq;
    j->popped_ms = qdd_unix_ms();
    qd_pipeline_estimate est;
    qd_err err = {0};
    if (qd_pipeline_estimate_job(job, &est, &err) == 0) {
        j->mem = est.peak_ram_bytes + est.part_lead_bytes;   /* its passes may go out as capture parts */
        j->part_mem = est.part_ram_bytes;
        j->n_blocks = est.n_blocks;
        /* Published with the state from the take on, so the status shows what the job was
         * admitted under; the report's resources later set it beside the measured peaks. */
        cJSON *eo = qd_pipeline_estimate_to_json(&est);
        char *es = eo ? cJSON_PrintUnformatted(eo) : NULL;
        set_str(&j->st.estimate, es);
        cJSON_free(es);
        cJSON_Delete(eo);
    }
    j->next = d->jobs;
    d->jobs = j;
    char proc[QP_KEY_MAX], lease[QP_KEY_MAX], skey[QP_KEY_MAX], fence[QP_KEY_MAX], ckey[QP_KEY_MAX], ttl[32];
    char queue[QP_KEY_MAX], failed[QP_KEY_MAX], at[32];
    qp_key_processing(&d->keys, d->node, proc, sizeof proc);
    qp_key_lease(&d->keys, j->id, lease, sizeof lease);
    qp_key_status(&d->keys, j->id, skey, sizeof skey);
    qp_key_fence(&d->keys, fence, sizeof fence);
    qp_key_cancel(&d->keys, j->id, ckey, sizeof ckey);
    qp_key_queue(&d->keys, queue, sizeof queue);
    qp_key_failed(&d->keys, failed, sizeof failed);
    snprintf(ttl, sizeof ttl, "%" PRId64, d->cfg->lease_ttl_ms);
    snprintf(at, sizeof at, "%" PRId64, qdd_unix_ms());
    const char *keys[7] = {proc, lease, skey, fence, ckey, queue, failed};
    const char *args[6] = {rawz, canon, d->node, ttl, at, j->id};
    if (eval(d, qdd_lua_take, 7, keys, 6, args, on_take, j, j)) job_discard(j);
}

/* ---- scheduling ------------------------------------------------------------------------------ */

static int cmp_jobs(const void *a, const void *b)
{
    const qdd_job *x = *(qdd_job *const *)a, *y = *(qdd_job *const *)b;
    if (x->job->priority != y->job->priority) return x->job->priority > y->job->priority ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* The block to run next: the checkpoint on disk is the truth (another worker or node may
 * have advanced it). */
static int next_block(qdd_job *j)
{
    qd_err err = {0};
    int next = 0, n = 0, b = 0;
    if (qd_state_progress(j->job->output, &next, &n, &err) == 0) {
        j->n_blocks = n;
        b = next < n ? next : n - 1;
    }
    return b < 0 ? 0 : b;
}

void qdd_jobs_schedule(qdd_daemon *d)
{
    if (d->stopping > QDD_STOP_DRAINING) return;
    qdd_job *list[1024];
    int n = 0, running = 0;
    uint64_t mem = 0;
    for (qdd_job *j = d->jobs; j && n < 1024; j = j->next) {
        if (j->phase == QDD_JOB_RUNNING) { running++; mem += j->mem; }
        if (j->phase == QDD_JOB_WAITING || j->phase == QDD_JOB_RUNNING) list[n++] = j;
    }
    qsort(list, (size_t)n, sizeof *list, cmp_jobs);
    if (d->stopping) {
        /* Draining: no new task, but the blocks running finish, their parts included. */
        qdd_parts_schedule(d, list, n);
        return;
    }
    uint64_t limit = d->cfg->memory_limit_mb > 0 ? (uint64_t)d->cfg->memory_limit_mb << 20 : 0;
    for (int i = 0; i < n; i++) {
        qdd_job *j = list[i];
        if (j->phase != QDD_JOB_WAITING) continue;
        if (running >= d->max_jobs || (limit && mem + j->mem > limit)) break;   /* strict priority */
        j->phase = QDD_JOB_RUNNING;
        running++;
        mem += j->mem;
        j->st.state = QP_STATE_RUNNING;
        j->st.attempts++;
        j->st.started_ms = qdd_unix_ms();
        set_str(&j->st.stage, "load");
        QD_LOG(QD_LOG_INFO, "job_start", "job=%s priority=%d queue_to_start_ms=%lld", j->id, j->job->priority,
               (long long)(j->st.started_ms - j->popped_ms));
        status_write(d, &j->st, QP_SF_STATE | QP_SF_PLACE | QP_SF_TIMES | QP_SF_PROGRESS, QP_EVENT_STATE);
    }
    for (int i = 0; i < n; i++) {
        qdd_job *j = list[i];
        if (j->phase != QDD_JOB_RUNNING || j->worker >= 0 || j->cancel_req || j->lost) continue;
        qdd_worker *w = NULL;
        if (j->last_worker >= 0 && d->workers[j->last_worker].state == QDD_W_IDLE &&
            !d->workers[j->last_worker].exiting)
            w = &d->workers[j->last_worker];
        for (int k = 0; !w && k < d->n_workers; k++)
            if (d->workers[k].state == QDD_W_IDLE && !d->workers[k].exiting) w = &d->workers[k];
        if (!w) break;
        int b = next_block(j);
        if (qdd_pool_send_task(w, j, b)) continue;
        j->worker = w->index;
        set_str(&j->st.worker, w->name);
        status_write(d, &j->st, QP_SF_PLACE, QP_EVENT_PROGRESS);
    }
    /* Parts after tasks: a job waiting for a worker gets an idle one before a helper does. */
    qdd_parts_schedule(d, list, n);
}

int qdd_jobs_held(const qdd_daemon *d)
{
    int n = 0;
    for (const qdd_job *j = d->jobs; j; j = j->next) n++;
    return n;
}

int qdd_jobs_tasks_running(const qdd_daemon *d)
{
    int n = 0;
    for (const qdd_job *j = d->jobs; j; j = j->next) n += j->worker >= 0;
    return n;
}

/* ---- worker messages ---------------------------------------------------------------------- */

static void cancel_req(qdd_job *j, const char *reason)
{
    if (j->cancel_req || j->phase == QDD_JOB_FINAL || j->phase == QDD_JOB_GONE || j->phase == QDD_JOB_TAKING) return;
    j->cancel_req = 1;
    QD_LOG(QD_LOG_INFO, "job_cancel", "job=%s", j->id);
    qdd_parts_cancel(j, reason);   /* its helpers drop the parts they have not started */
    if (j->worker >= 0) qdd_pool_send_cancel(&j->d->workers[j->worker], j->id, reason);
    else job_final(j, QP_STATE_CANCELLED, "cancelled");
}

/* The task in w's hands is over (whatever the outcome); returns its job (still referenced
 * by the caller until it calls qdd_job_unref). */
static qdd_job *task_end(qdd_worker *w)
{
    qdd_job *j = w->job;
    w->job = NULL;
    if (w->state == QDD_W_BUSY && !w->part_job) w->state = QDD_W_IDLE;
    if (j) {
        j->worker = -1;
        j->last_worker = w->index;
        qdd_parts_drop(j, w);   /* the lead's block step is over, whatever its parts do */
    }
    return j;
}

/* Not enough disk or memory (QD_ERESOURCE: ENOSPC or EDQUOT on a write, an allocation that
 * failed) is retried this many times per job, whatever progress came between: the retry's
 * pre-flight sees what is left and refuses the job with the figures, or gets through where
 * another job has freed what it took. Retrying it max-retries times would fill the same disk
 * again each time. */
#define QDD_RESOURCE_RETRIES 1

static void task_failed(qdd_job *j, const char *error, int retryable, int cancelled, int code)
{
    qdd_daemon *d = j->d;
    if (j->lost || j->phase != QDD_JOB_RUNNING) { if (j->lost) job_remove(j); return; }
    if (cancelled || j->cancel_req) { job_final(j, QP_STATE_CANCELLED, "cancelled"); return; }
    if (d->stopping && code == QD_ECANCELLED) return;   /* handed back by the stop sequence */
    int resource = code == QD_ERESOURCE;
    if (retryable && j->retries < d->cfg->max_retries && (!resource || j->resource_retries < QDD_RESOURCE_RETRIES)) {
        j->retries++;
        j->resource_retries += resource;
        set_str(&j->st.error, error);
        QD_LOG(QD_LOG_WARN, "task_retry", "job=%s retry=%d/%lld err=\"%s\"", j->id, j->retries,
               (long long)d->cfg->max_retries, error);
        status_write(d, &j->st, QP_SF_RESULT, QP_EVENT_STATE);
        return;
    }
    char why[1024];
    int n = resource ? j->resource_retries : j->retries;   /* retries reset by progress, resource ones not */
    if (retryable) snprintf(why, sizeof why, "%s (after %d %s)", error, n, n == 1 ? "retry" : "retries");
    else snprintf(why, sizeof why, "%s", error);
    job_final(j, QP_STATE_FAILED, why);
}

void qdd_jobs_on_msg(qdd_daemon *d, qdd_worker *w, qp_msg *m)
{
    qdd_job *j = w->job;
    switch (m->type) {
    case QP_MSG_PROGRESS:
        if (!j || strcmp(j->id, m->progress.job_id) || j->lost) return;
        set_str(&j->st.stage, m->progress.stage);
        j->st.block = m->progress.block;
        if (m->progress.n_blocks > 0) j->st.n_blocks = m->progress.n_blocks;
        set_str(&j->st.layer, m->progress.layer);
        if (m->progress.fraction >= j->st.progress) j->st.progress = m->progress.fraction;
        j->st.eta_s = m->progress.eta_s;
        j->st.layer_error = m->progress.layer_error;
        if (j->phase == QDD_JOB_RUNNING)
            status_write(d, &j->st, QP_SF_PROGRESS, m->progress.layer_error >= 0 ? QP_EVENT_LAYER : QP_EVENT_PROGRESS);
        return;
    case QP_MSG_BLOCK_DONE:
        if (!j || strcmp(j->id, m->block_done.job_id)) return;
        j->next_block = m->block_done.block + 1;
        j->n_blocks = m->block_done.n_blocks;
        j->retries = 0;   /* progress was made: the retry budget is per block */
        if (m->block_done.cost && !j->lost) {
            set_str(&j->st.last_block, m->block_done.cost);
            if (j->phase == QDD_JOB_RUNNING) status_write(d, &j->st, QP_SF_PROGRESS, QP_EVENT_PROGRESS);
        }
        return;
    case QP_MSG_TASK_DONE:
        if (!j || strcmp(j->id, m->task_done.job_id)) return;
        task_end(w);
        if (j->lost) job_remove(j);
        else if (j->phase != QDD_JOB_RUNNING) {}
        else if (m->task_done.job_finished) {
            set_str(&j->st.output, m->task_done.output);
            if (m->task_done.report) set_str(&j->st.report, m->task_done.report);
            set_str(&j->st.error, NULL);
            job_final(j, QP_STATE_DONE, NULL);
        } else if (j->cancel_req) {
            job_final(j, QP_STATE_CANCELLED, "cancelled");
        }
        qdd_job_unref(j);
        break;
    case QP_MSG_PARTS:
    case QP_MSG_PART_DONE:
        qdd_parts_on_msg(d, w, m);
        break;
    case QP_MSG_TASK_FAILED:
        /* A worker whose device context broke exits after this reply; a retry given to it
         * would be lost with it (and spend a second retry), so it gets none. */
        if (m->task_failed.exiting) w->exiting = 1;
        if (!j || strcmp(j->id, m->task_failed.job_id)) return;
        task_end(w);
        task_failed(j, m->task_failed.error, m->task_failed.retryable, m->task_failed.cancelled, m->task_failed.code);
        qdd_job_unref(j);
        break;
    default:
        return;
    }
    qdd_jobs_schedule(d);
    qdd_maybe_pop(d);
}

/* A job whose task crashed its worker (a fatal signal, the out-of-memory killer) this many
 * times is quarantined rather than retried: it is failed with the reason and its payload
 * goes to the failed list, so a poison job cannot take down worker after worker. */
#define QDD_POISON_DEATHS 2

void qdd_jobs_worker_died(qdd_daemon *d, qdd_worker *w, const char *why, int poison)
{
    qdd_parts_worker_gone(d, w);   /* a helper's part is pending again */
    qdd_job *j = task_end(w);
    if (!j) return;
    if (poison && !j->cancel_req && !j->lost && j->phase == QDD_JOB_RUNNING && ++j->poison_deaths >= QDD_POISON_DEATHS) {
        char q[1024];
        snprintf(q, sizeof q, "quarantined: the job killed its worker %d times (last: %s); it is not retried",
                 j->poison_deaths, why);
        char failed[QP_KEY_MAX];
        qp_key_failed(&d->keys, failed, sizeof failed);
        cJSON *rec = cJSON_CreateObject();
        cJSON_AddStringToObject(rec, "payload", j->payload);
        cJSON_AddStringToObject(rec, "error", q);
        cJSON_AddNumberToObject(rec, "at_ms", (double)qdd_unix_ms());
        char *text = cJSON_PrintUnformatted(rec);
        cJSON_Delete(rec);
        if (text) qdd_rconn_cmdf(&d->cmd, NULL, NULL, "LPUSH %s %s", failed, text);
        cJSON_free(text);
        QD_LOG(QD_LOG_ERROR, "job_quarantined", "job=%s err=\"%s\"", j->id, q);
        job_final(j, QP_STATE_FAILED, q);
    } else {
        task_failed(j, why, 1, 0, QD_EBACKEND);
    }
    qdd_job_unref(j);
}

/* ---- leases, cancel ------------------------------------------------------------------------- */

static void on_renew(redisAsyncContext *ac, void *r, void *pd)
{
    qdd_job *j = pd;
    redisReply *reply = r;
    if (reply && reply->type == REDIS_REPLY_ERROR) qdd_rerr_fail(&j->d->rerr_lease, "lease", "EVAL renew", reply->str);
    else if (reply) qdd_rerr_ok(&j->d->rerr_lease, NULL);
    if (reply && reply->type == REDIS_REPLY_ARRAY && reply->elements == 2 && j->phase != QDD_JOB_GONE &&
        j->phase != QDD_JOB_FINAL) {
        if (reply->element[0]->integer == 0) {
            QD_LOG(QD_LOG_WARN, "lease_lost", "job=%s (another node owns it now); stopping without writing", j->id);
            j->lost = 1;
            qdd_parts_cancel(j, "lease lost");
            if (j->worker >= 0) qdd_pool_send_cancel(&j->d->workers[j->worker], j->id, "lease lost");
            else job_remove(j);
        } else if (reply->element[1]->integer == 1) {
            cancel_req(j, "cancel flag");
        }
    }
    qdd_job_unref(j);
}

void qdd_jobs_renew(qdd_daemon *d)
{
    /* Between a reconnect and the recovery a Redis that came back empty has no lease yet:
     * a renewal then would read "lost"; the recovery re-asserts every lease first. */
    if (d->awaiting_recovery) return;
    char ttl[32];
    snprintf(ttl, sizeof ttl, "%" PRId64, d->cfg->lease_ttl_ms);
    for (qdd_job *j = d->jobs; j; j = j->next) {
        if ((j->phase != QDD_JOB_WAITING && j->phase != QDD_JOB_RUNNING) || j->lost) continue;
        char lease[QP_KEY_MAX], ckey[QP_KEY_MAX];
        qp_key_lease(&d->keys, j->id, lease, sizeof lease);
        qp_key_cancel(&d->keys, j->id, ckey, sizeof ckey);
        const char *keys[2] = {lease, ckey};
        const char *args[2] = {j->lease, ttl};
        eval(d, qdd_lua_renew, 2, keys, 2, args, on_renew, j, j);
    }
}

void qdd_jobs_cancel(qdd_daemon *d, const char *id)
{
    for (qdd_job *j = d->jobs; j; j = j->next)
        if (!strcmp(j->id, id) && !j->lost) cancel_req(j, "cancel requested");
}

/* ---- node heartbeat, reclaim, recovery, hand-back ------------------------------------------- */

/* The node key, refreshed only while it holds this daemon's token (node.c). */
void qdd_jobs_node_heartbeat(qdd_daemon *d) { qdd_node_heartbeat(d); }

static void on_reclaim(redisAsyncContext *ac, void *r, void *pd)
{
    qdd_daemon *d = pd;
    redisReply *reply = r;
    if (reply && reply->type == REDIS_REPLY_ERROR) {
        /* Every scan would log it again: once per change instead (rerr.h). */
        qdd_rerr_fail(&d->rerr_reclaim, "reclaim", "EVAL reclaim", reply->str);
        return;
    }
    if (reply) qdd_rerr_ok(&d->rerr_reclaim, NULL);
    if (reply && reply->type == REDIS_REPLY_INTEGER && reply->integer > 0)
        QD_LOG(QD_LOG_WARN, "jobs_reclaimed", "count=%lld (a dead node's jobs are back on the queue)", reply->integer);
}

static void reclaim_node(qdd_daemon *d, const char *node, int force, const char **keep, int n_keep,
                         redisCallbackFn *cb)
{
    char nkey[QP_KEY_MAX], proc[QP_KEY_MAX], queue[QP_KEY_MAX], nodes[QP_KEY_MAX], failed[QP_KEY_MAX];
    if (qp_key_node(&d->keys, node, nkey, sizeof nkey) || qp_key_processing(&d->keys, node, proc, sizeof proc)) return;
    qp_key_queue(&d->keys, queue, sizeof queue);
    qp_key_nodes(&d->keys, nodes, sizeof nodes);
    qp_key_failed(&d->keys, failed, sizeof failed);
    char ret[32], now[32], chan[QP_KEY_MAX];
    qp_key_events_channel(&d->keys, chan, sizeof chan);
    snprintf(ret, sizeof ret, "%" PRId64, d->cfg->retention_s);
    snprintf(now, sizeof now, "%" PRId64, qdd_unix_ms());
    const char *keys[5] = {nkey, proc, queue, nodes, failed};
    const char *args[ARGS_MAX];
    int na = 0;
    args[na++] = node;
    args[na++] = d->keys.job;
    args[na++] = force ? "1" : "0";
    args[na++] = ret;
    args[na++] = now;
    args[na++] = chan;
    for (int i = 0; i < n_keep && na < ARGS_MAX - 4; i++) args[na++] = keep[i];
    eval(d, qdd_lua_reclaim, 5, keys, na, args, cb, d, NULL);
}

static void on_members(redisAsyncContext *ac, void *r, void *pd)
{
    qdd_daemon *d = pd;
    redisReply *reply = r;
    if (!reply || reply->type != REDIS_REPLY_ARRAY || d->stopping >= QDD_STOP_WORKERS_EXITING) return;
    for (size_t i = 0; i < reply->elements; i++) {
        const char *n = reply->element[i]->str;
        if (n && strcmp(n, d->node) && qp_name_valid(n)) reclaim_node(d, n, 0, NULL, 0, on_reclaim);
    }
}

void qdd_jobs_reclaim_scan(qdd_daemon *d)
{
    char nodes[QP_KEY_MAX];
    qp_key_nodes(&d->keys, nodes, sizeof nodes);
    qdd_rconn_cmdf(&d->cmd, on_members, d, "SMEMBERS %s", nodes);
}

static void on_recovered(redisAsyncContext *ac, void *r, void *pd)
{
    qdd_daemon *d = pd;
    redisReply *reply = r;
    if (reply && reply->type == REDIS_REPLY_ERROR) {
        /* Our processing list is not recovered (what it holds would sit there unseen): no
         * pop until it is; the queue backs off and runs the recovery again. */
        qdd_queue_error(d, "EVAL reclaim", reply->str, 1);
        return;
    }
    on_reclaim(ac, r, pd);
    if (!r) return;
    qdd_queue_ok(d, "EVAL reclaim");
    d->cmd_ready = 1;
    qdd_maybe_pop(d);
}

static void on_reassert(redisAsyncContext *ac, void *r, void *pd)
{
    qdd_job *j = pd;
    redisReply *reply = r;
    if (reply && reply->type == REDIS_REPLY_INTEGER && reply->integer == 0 && j->phase != QDD_JOB_GONE) {
        QD_LOG(QD_LOG_WARN, "lease_lost", "job=%s (held by another node after the reconnect)", j->id);
        j->lost = 1;
        qdd_parts_cancel(j, "lease lost");
        if (j->worker >= 0) qdd_pool_send_cancel(&j->d->workers[j->worker], j->id, "lease lost");
        else if (j->phase != QDD_JOB_FINAL) job_remove(j);
    } else if (reply && reply->type == REDIS_REPLY_ARRAY && reply->elements >= 6) {
        /* {1, lease, processing, status, index, fence}: 1 = it was missing and is re-created. */
        static const char *const what[5] = {"lease", "processing", "status", "index", "fence"};
        char list[128] = "";
        int lost = 0;
        for (int i = 0; i < 5; i++) {
            if (reply->element[i + 1]->type != REDIS_REPLY_INTEGER || !reply->element[i + 1]->integer) continue;
            size_t n = strlen(list);
            snprintf(list + n, sizeof list - n, "%s%s", n ? "," : "", what[i]);
            lost += i > 0;   /* a lease may simply have expired while Redis was away */
        }
        if (lost)
            QD_LOG(QD_LOG_WARN, "redis_data_lost", "job=%s recreated=%s (Redis came back without them; re-registered)",
                   j->id, list);
        else if (list[0])
            QD_LOG(QD_LOG_INFO, "lease_reasserted", "job=%s recreated=%s", j->id, list);
    }
    qdd_job_unref(j);
}

void qdd_jobs_recover(qdd_daemon *d, int force_self)
{
    qdd_jobs_node_heartbeat(d);
    /* Entries of our processing list we do not hold (a pop whose reply was lost, a previous
     * run of this node) go back to the queue; the ones we hold stay. */
    const char *keep[ARGS_MAX];
    int n_keep = 0;
    for (qdd_job *j = d->jobs; j && n_keep < ARGS_MAX - 10; j = j->next)
        if (j->phase != QDD_JOB_GONE && j->phase != QDD_JOB_TAKING && !j->lost) keep[n_keep++] = j->payload;
    reclaim_node(d, d->node, 1, keep, n_keep, on_recovered);
    char ttl[32], tok[32], fence[QP_KEY_MAX], proc[QP_KEY_MAX], idx[QP_KEY_MAX];
    snprintf(ttl, sizeof ttl, "%" PRId64, d->cfg->lease_ttl_ms);
    qp_key_fence(&d->keys, fence, sizeof fence);
    qp_key_processing(&d->keys, d->node, proc, sizeof proc);
    qp_key_index(&d->keys, idx, sizeof idx);
    d->recovering = 1;
    d->awaiting_recovery = 0;
    for (qdd_job *j = d->jobs; j; j = j->next) {
        if (j->lost) continue;
        int unsent_final = j->phase == QDD_JOB_FINAL && !j->final_sent;
        if (!unsent_final && j->phase != QDD_JOB_WAITING && j->phase != QDD_JOB_RUNNING) continue;
        char lease[QP_KEY_MAX], skey[QP_KEY_MAX];
        qp_key_lease(&d->keys, j->id, lease, sizeof lease);
        qp_key_status(&d->keys, j->id, skey, sizeof skey);
        if (unsent_final) {
            /* It ended while Redis was away: the spec and the index entry first (Redis may
             * have come back empty), then the final status and the finish script again. */
            qdd_rconn_cmdf(&d->cmd, NULL, NULL, "HSET %s %s %s", skey, QP_STATUS_FIELD_SPEC, j->payload);
            qdd_rconn_cmdf(&d->cmd, NULL, NULL, "ZADD %s %lld %s", idx, (long long)j->st.submitted_ms, j->id);
            finish_send(j);
            continue;
        }
        snprintf(tok, sizeof tok, "%" PRIu64, j->fence);
        const char *keys[5] = {proc, lease, fence, skey, idx};
        const char *args[5] = {j->payload, j->lease, ttl, tok, j->id};
        eval(d, qdd_lua_reassert, 5, keys, 5, args, on_reassert, j, j);
        qdd_rconn_cmdf(&d->cmd, NULL, NULL, "HSET %s %s %s", skey, QP_STATUS_FIELD_SPEC, j->payload);
        qdd_rconn_cmdf(&d->cmd, NULL, NULL, "ZADD %s %lld %s", idx, (long long)j->st.submitted_ms, j->id);
        /* Every write made while Redis was away was lost: one full write puts the hash,
         * the event and the stream back in step, and progress publishing goes on from it. */
        status_write(d, &j->st, QP_SF_ALL, QP_EVENT_STATE);
    }
    d->recovering = 0;
}

static void on_handback(redisAsyncContext *ac, void *r, void *pd)
{
    qdd_job *j = pd;
    if (j->d->handback_pending > 0) j->d->handback_pending--;
    if (r && j->phase != QDD_JOB_GONE) job_remove(j);
    qdd_job_unref(j);
}

void qdd_jobs_handback_all(qdd_daemon *d)
{
    char proc[QP_KEY_MAX], queue[QP_KEY_MAX], failed[QP_KEY_MAX], at[32];
    qp_key_processing(&d->keys, d->node, proc, sizeof proc);
    qp_key_queue(&d->keys, queue, sizeof queue);
    qp_key_failed(&d->keys, failed, sizeof failed);
    snprintf(at, sizeof at, "%" PRId64, qdd_unix_ms());
    for (qdd_job *j = d->jobs; j; j = j->next) {
        if ((j->phase != QDD_JOB_WAITING && j->phase != QDD_JOB_RUNNING) || j->worker >= 0 || j->lost) continue;
        j->phase = QDD_JOB_FINAL;   /* leaving this node; on_handback removes it */
        j->final_sent = 1;
        j->st.state = QP_STATE_QUEUED;
        set_str(&j->st.stage, "queued");
        set_str(&j->st.worker, NULL);
        set_str(&j->st.parts, NULL);
        status_write(d, &j->st, QP_SF_STATE | QP_SF_PLACE | QP_SF_PROGRESS | QP_SF_PARTS, QP_EVENT_STATE);
        char lease[QP_KEY_MAX];
        qp_key_lease(&d->keys, j->id, lease, sizeof lease);
        const char *keys[4] = {proc, queue, lease, failed};
        const char *args[4] = {j->payload, j->lease, j->id, at};
        if (eval(d, qdd_lua_handback, 4, keys, 4, args, on_handback, j, j) == 0) d->handback_pending++;
        QD_LOG(QD_LOG_INFO, "job_handed_back", "job=%s next_block=%d", j->id, j->next_block);
    }
}

void qdd_jobs_free_all(qdd_daemon *d)
{
    while (d->jobs) job_discard(d->jobs);
}
