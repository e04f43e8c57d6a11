/* The HTTP API's routes: method and path dispatch, the bearer-token check, CORS preflight,
 * and the handlers that read and write Redis (job list, one job, submit, cancel, metrics).
 * Each Redis-backed handler sends one command (a Lua script where several keys are read
 * together, so the answer is consistent), suspends the connection, and finishes it from
 * the reply callback. Redis away means 503, never a hang. */
#define _GNU_SOURCE
#include "daemon/http_internal.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "proto/status.h"
#include "quant/job/job.h"
#include "quant/pipeline/admission.h"

#define JSON "application/json"

/* Newest first; a job whose hash expired is skipped (the daemon prunes the index). */
static const char list_script[] =
    "local ids = redis.call('ZREVRANGE', KEYS[1], 0, 9999)\n"
    "local out, n, lim = {}, 0, tonumber(ARGV[3])\n"
    "for _, id in ipairs(ids) do\n"
    "  local f = redis.call('HMGET', ARGV[1] .. ':' .. id, 'state', 'stage', 'block', 'blocks',\n"
    "    'progress', 'eta_s', 'node', 'worker', 'error', 'output', 'submitted_ms', 'updated_ms',\n"
    "    'finished_ms', 'layer', 'layer_error', 'attempts')\n"
    "  if f[1] and (ARGV[2] == '' or f[1] == ARGV[2]) then\n"
    "    table.insert(out, id)\n"
    "    for i = 1, 16 do table.insert(out, f[i] or '') end\n"
    "    n = n + 1\n"
    "    if n >= lim then break end\n"
    "  end\n"
    "end\n"
    "return out\n";
static const char *const list_fields[] = {"state", "stage", "block", "blocks", "progress", "eta_s",
                                          "node", "worker", "error", "output", "submitted_ms",
                                          "updated_ms", "finished_ms", "layer", "layer_error", "attempts"};
#define N_LIST_FIELDS 16
/* Which of list_fields are numbers (the rest are strings). */
static const char list_numeric[N_LIST_FIELDS] = {0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 0, 1, 1};

/* Submission, in one step: a job that is queued or running already cannot be submitted again
 * (the daemon would refuse it as a duplicate; answering 409 here is clearer). Otherwise the
 * job gets a fresh status hash saying queued (with its spec), an index entry and its first
 * event before its payload goes on the queue, so it can be seen, listed and cancelled while
 * it waits. What a previous run with this id left behind goes first: its hash (a stale error
 * or report), its retention TTLs, and its cancel flag (which the take would otherwise read
 * as "cancelled while queued", since the state is no longer final).
 * KEYS: hash, queue, cancel flag, index, event stream. ARGV: payload, events channel, stream
 * MAXLEN, event JSON, submitted_ms, id, then the hash's field/value pairs. */
static const char submit_script[] =
    "local s = redis.call('HGET', KEYS[1], 'state')\n"
    "if s == 'queued' or s == 'running' then return s end\n"
    "redis.call('DEL', KEYS[1], KEYS[3])\n"
    "redis.call('HSET', KEYS[1], 'spec', ARGV[1], unpack(ARGV, 7))\n"
    "redis.call('ZADD', KEYS[4], ARGV[5], ARGV[6])\n"
    "redis.call('PERSIST', KEYS[5])\n"
    "redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[3], '*', 'event', ARGV[4])\n"
    "redis.call('PUBLISH', ARGV[2], ARGV[4])\n"
    "redis.call('LPUSH', KEYS[2], ARGV[1])\n"
    "return 'ok'\n";

/* The cancel protocol of proto/redis.md: the persistent flag first, then the wake-up. A job
 * still waiting on the queue (its payload, the hash's spec, is there) is taken off it and
 * cancelled here and now instead, as a daemon would when taking it, without waiting for a
 * free worker slot: one LREM in Redis, no copy of the queue. One a daemon has popped already
 * is not on the queue any more, and gets the flag like a running one.
 * KEYS: hash, cancel flag, queue, event stream. ARGV: cancel channel, id, reason, events
 * channel, stream MAXLEN, event JSON (the cancelled state), retention seconds, now (ms). */
static const char cancel_script[] =
    "local s = redis.call('HGET', KEYS[1], 'state')\n"
    "if not s then return '' end\n"
    "if s == 'done' or s == 'failed' or s == 'cancelled' then return s end\n"
    "if s == 'queued' then\n"
    "  local spec = redis.call('HGET', KEYS[1], 'spec')\n"
    "  if spec and spec ~= '' and redis.call('LREM', KEYS[3], 0, spec) > 0 then\n"
    "    redis.call('HSET', KEYS[1], 'state', 'cancelled', 'error', ARGV[3], 'finished_ms', ARGV[8],\n"
    "      'updated_ms', ARGV[8])\n"
    "    redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[5], '*', 'event', ARGV[6])\n"
    "    redis.call('PUBLISH', ARGV[4], ARGV[6])\n"
    "    redis.call('EXPIRE', KEYS[1], ARGV[7])\n"
    "    redis.call('EXPIRE', KEYS[4], ARGV[7])\n"
    "    redis.call('DEL', KEYS[2])\n"
    "    return 'dequeued'\n"
    "  end\n"
    "end\n"
    "redis.call('SET', KEYS[2], ARGV[3])\n"
    "redis.call('PUBLISH', ARGV[1], ARGV[2])\n"
    "return 'ok'\n";

/* Unix time in milliseconds, as the status hash's times are. */
static int64_t unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static char *json_print(cJSON *o)
{
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!s) return NULL;
    char *t = realloc(s, strlen(s) + 2);   /* a newline makes curl output readable */
    if (!t) return s;
    strcat(t, "\n");
    return t;
}

static int redis_unavailable(qh_req *r, const redisReply *rep)
{
    if (!rep) {
        qh_req_finish_error(r, 503, "Redis is not reachable; try again");
        return 1;
    }
    if (rep->type == REDIS_REPLY_ERROR) {
        qh_req_finish_error(r, 502, "Redis answered an error: %s", rep->str);
        return 1;
    }
    return 0;
}

static enum MHD_Result redis_down(qh_req *r)
{
    return qh_respond_error(r, 503, "Redis is not reachable; try again");
}

/* ---- auth ---------------------------------------------------------------------------- */

static int token_eq(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    unsigned char d = la != lb;
    for (size_t i = 0; i < la; i++) d |= (unsigned char)(a[i] ^ b[i % (lb ? lb : 1)]);
    return d == 0;
}

/* 0 when allowed, else the answer is already queued (ret holds it). */
static int auth_check(qh_req *r, enum MHD_Result *ret)
{
    if (!r->h->token[0]) {
        *ret = qh_respond_error(r, 403, "mutating endpoints are disabled (no http-token is configured)");
        return -1;
    }
    const char *a = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Authorization");
    if (!a || strncasecmp(a, "Bearer ", 7) || !token_eq(a + 7, r->h->token)) {
        *ret = qh_respond_error(r, 401, "a valid 'Authorization: Bearer <token>' header is required");
        return -1;
    }
    return 0;
}

/* ---- GET /v1/jobs -------------------------------------------------------------------- */

static void on_list(redisAsyncContext *ac, void *reply, void *priv)
{
    qh_req *r = priv;
    redisReply *rep = reply;
    if (redis_unavailable(r, rep)) return;
    cJSON *root = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(root, "jobs");
    if (rep->type == REDIS_REPLY_ARRAY) {
        for (size_t i = 0; i + N_LIST_FIELDS < rep->elements; i += N_LIST_FIELDS + 1) {
            cJSON *j = cJSON_CreateObject();
            cJSON_AddStringToObject(j, "id", rep->element[i]->str ? rep->element[i]->str : "");
            for (int f = 0; f < N_LIST_FIELDS; f++) {
                const redisReply *e = rep->element[i + 1 + f];
                if (e->type != REDIS_REPLY_STRING || !e->len) continue;
                if (list_numeric[f]) {
                    char *end;
                    double v = strtod(e->str, &end);
                    if (!*end) cJSON_AddNumberToObject(j, list_fields[f], v);
                } else {
                    cJSON_AddStringToObject(j, list_fields[f], e->str);
                }
            }
            cJSON_AddItemToArray(arr, j);
        }
    }
    cJSON_AddNumberToObject(root, "count", cJSON_GetArraySize(arr));
    char *s = json_print(root);
    if (!s) qh_req_finish_error(r, 500, "out of memory");
    else qh_req_finish(r, 200, s, JSON);
}

static enum MHD_Result get_jobs(qh_req *r)
{
    const char *state = MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, "state");
    const char *limit = MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, "limit");
    qp_state st;
    if (state && *state && qp_state_parse(state, &st))
        return qh_respond_error(r, 400, "state: '%.64s' is not one of queued, running, done, failed, cancelled", state);
    long lim = 1000;
    if (limit) {
        char *end;
        lim = strtol(limit, &end, 10);
        if (!*limit || *end || lim < 1 || lim > 10000)
            return qh_respond_error(r, 400, "limit: must be an integer in 1..10000, got '%.32s'", limit);
    }
    char index[QP_KEY_MAX], lims[24];
    qp_key_index(&r->h->keys, index, sizeof index);
    snprintf(lims, sizeof lims, "%ld", lim);
    const char *argv[] = {"EVAL", list_script, "1", index, r->h->keys.job, state ? state : "", lims};
    if (qh_redis_cmd(r, on_list, 7, argv, NULL)) return redis_down(r);
    return qh_suspend(r);
}

/* ---- GET /v1/jobs/{id} --------------------------------------------------------------- */

static void on_job(redisAsyncContext *ac, void *reply, void *priv)
{
    qh_req *r = priv;
    redisReply *rep = reply;
    if (redis_unavailable(r, rep)) return;
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements == 0) {
        qh_req_finish_error(r, 404, "no job '%s'", r->job);
        return;
    }
    const char **kv = calloc(rep->elements, sizeof *kv);
    const char *spec = NULL;
    if (!kv) { qh_req_finish_error(r, 500, "out of memory"); return; }
    for (size_t i = 0; i < rep->elements; i++) {
        kv[i] = rep->element[i]->str ? rep->element[i]->str : "";
        if (i % 2 == 1 && !strcmp(kv[i - 1], QP_STATUS_FIELD_SPEC)) spec = kv[i];
    }
    qp_status st;
    qp_status_init(&st);
    qp_err pe = {0};
    int rc = qp_status_from_fields(&st, kv, rep->elements, &pe);
    free(kv);
    if (!rc && !st.id) rc = qp_status_set_str(&st.id, r->job);
    cJSON *o = rc ? NULL : qp_status_to_event_cjson(&st, QP_EVENT_STATE);
    qp_status_clear(&st);
    if (rc || !o) {
        cJSON_Delete(o);
        qh_req_finish_error(r, 500, "job '%s': the status hash cannot be read: %s", r->job, rc ? pe.msg : "invalid");
        return;
    }
    cJSON *sp = spec && *spec ? cJSON_Parse(spec) : NULL;
    if (sp) cJSON_AddItemToObject(o, "spec", sp);
    char *s = json_print(o);
    if (!s) qh_req_finish_error(r, 500, "out of memory");
    else qh_req_finish(r, 200, s, JSON);
}

static enum MHD_Result get_job(qh_req *r)
{
    char key[QP_KEY_MAX];
    qp_key_status(&r->h->keys, r->job, key, sizeof key);
    const char *argv[] = {"HGETALL", key};
    if (qh_redis_cmd(r, on_job, 2, argv, NULL)) return redis_down(r);
    return qh_suspend(r);
}

/* ---- GET /v1/jobs/{id}/events: check the job exists, then stream --------------------- */

static void on_exists(redisAsyncContext *ac, void *reply, void *priv)
{
    qh_req *r = priv;
    redisReply *rep = reply;
    if (redis_unavailable(r, rep)) return;
    if (rep->type != REDIS_REPLY_INTEGER || rep->integer == 0) {
        r->sse = 0;
        qh_req_finish_error(r, 404, "no job '%s'", r->job);
        return;
    }
    qh_req_finish(r, 200, NULL, NULL);   /* on_request sees sse + 200 and starts the stream */
}

static enum MHD_Result get_events(qh_req *r)
{
    const char *last = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Last-Event-ID");
    /* A stream id is "<ms>-<seq>"; anything else restarts from the beginning. */
    if (last && strlen(last) < sizeof r->last_id && strspn(last, "0123456789-") == strlen(last) && *last)
        snprintf(r->last_id, sizeof r->last_id, "%s", last);
    r->sse = 1;
    char key[QP_KEY_MAX];
    qp_key_status(&r->h->keys, r->job, key, sizeof key);
    const char *argv[] = {"EXISTS", key};
    if (qh_redis_cmd(r, on_exists, 2, argv, NULL)) { r->sse = 0; return redis_down(r); }
    return qh_suspend(r);
}

/* ---- POST /v1/jobs ------------------------------------------------------------------- */

static void on_submit(redisAsyncContext *ac, void *reply, void *priv)
{
    qh_req *r = priv;
    redisReply *rep = reply;
    if (redis_unavailable(r, rep)) return;
    if (rep->type == REDIS_REPLY_STRING && strcmp(rep->str, "ok")) {
        qh_req_finish_error(r, 409, "job '%s' is already %s", r->job, rep->str);
        return;
    }
    char *s = qh_strdup_printf("{\"id\":\"%s\",\"state\":\"queued\"}\n", r->job);
    if (!s) qh_req_finish_error(r, 500, "out of memory");
    else qh_req_finish(r, 202, s, JSON);
}

static enum MHD_Result post_job(qh_req *r)
{
    if (!r->body_len) return qh_respond_error(r, 400, "the request body must be a job spec (JSON)");
    qp_job *job = NULL;
    qp_err pe = {0};
    if (qp_job_parse(r->body, r->body_len, &job, &pe)) return qh_respond_error(r, 400, "%s", pe.msg);
    /* An output that overlaps the job's inputs is refused here already (the daemon checks
     * it again at admission, with its allow-roots). */
    qd_err perr = {0};
    if (qd_job_paths_check(job, NULL, 0, &perr)) {
        qp_job_free(job);
        return qh_respond_error(r, 400, "job.output: %s", perr.msg);
    }
    /* The canonical form carries the id, so the daemon admits exactly the id returned here. */
    char *canon = qp_job_to_json(job, 0);
    snprintf(r->job, sizeof r->job, "%s", job->id);
    if (!canon) {
        qp_job_free(job);
        return qh_respond_error(r, 500, "out of memory");
    }
    /* What goes on the queue is the canonical form, with every default spelled out: the
     * daemon's admission checks that against max-job-bytes, and so does this, with the same
     * function, so a job answered 202 here is never dropped for its size there. */
    char why[256];
    if (qdd_job_size_check(strlen(canon), r->h->max_job_bytes, why, sizeof why)) {
        free(canon);
        qp_job_free(job);
        return qh_respond_error(r, MHD_HTTP_CONTENT_TOO_LARGE, "%s (its canonical form, as queued)", why);
    }
    /* The status the job has while it waits, and its first event (proto/status.h encodes both). */
    qp_status st;
    qp_status_init(&st);
    qp_fields f = {0};
    qp_err pe2 = {0};
    int64_t now = unix_ms();
    int bad = qp_status_set_str(&st.id, r->job) || qp_status_set_str(&st.stage, "queued") ||
              qp_status_set_str(&st.output, job->output);
    st.state = QP_STATE_QUEUED;
    st.submitted_ms = st.updated_ms = now;
    qp_job_free(job);
    char *ev = bad ? NULL : qp_status_to_event(&st, QP_EVENT_STATE);
    if (!ev || qp_status_to_fields(&st, QP_SF_ALL, &f, &pe2)) {
        free(ev);
        free(canon);
        qp_status_clear(&st);
        return qh_respond_error(r, 500, "the job's status cannot be encoded: %s", pe2.msg[0] ? pe2.msg : "out of memory");
    }
    qp_status_clear(&st);
    char hash[QP_KEY_MAX], queue[QP_KEY_MAX], flag[QP_KEY_MAX], index[QP_KEY_MAX], stream[QP_KEY_MAX];
    char maxlen[16], sub[24];
    qp_key_status(&r->h->keys, r->job, hash, sizeof hash);
    qp_key_queue(&r->h->keys, queue, sizeof queue);
    qp_key_cancel(&r->h->keys, r->job, flag, sizeof flag);
    qp_key_index(&r->h->keys, index, sizeof index);
    qp_key_job_events(&r->h->keys, r->job, stream, sizeof stream);
    snprintf(maxlen, sizeof maxlen, "%d", QP_STREAM_MAXLEN);
    snprintf(sub, sizeof sub, "%lld", (long long)now);
    const char *argv[14 + 2 * QP_STATUS_MAX_FIELDS];
    int n = 0;
    argv[n++] = "EVAL";
    argv[n++] = submit_script;
    argv[n++] = "5";
    argv[n++] = hash;
    argv[n++] = queue;
    argv[n++] = flag;
    argv[n++] = index;
    argv[n++] = stream;
    argv[n++] = canon;
    argv[n++] = r->h->events_chan;
    argv[n++] = maxlen;
    argv[n++] = ev;
    argv[n++] = sub;
    argv[n++] = r->job;
    for (size_t i = 0; i < f.n; i++) {
        argv[n++] = f.name[i];
        argv[n++] = f.value[i];
    }
    int rc = qh_redis_cmd(r, on_submit, n, argv, NULL);
    qp_fields_free(&f);
    free(ev);
    free(canon);
    if (rc) return redis_down(r);
    return qh_suspend(r);
}

/* ---- DELETE /v1/jobs/{id} ------------------------------------------------------------ */

static void on_cancel(redisAsyncContext *ac, void *reply, void *priv)
{
    qh_req *r = priv;
    redisReply *rep = reply;
    if (redis_unavailable(r, rep)) return;
    if (rep->type != REDIS_REPLY_STRING || !rep->len) {
        qh_req_finish_error(r, 404, "no job '%s'", r->job);
        return;
    }
    if (!strcmp(rep->str, "dequeued")) {   /* it was still on the queue: cancelled now */
        char *s = qh_strdup_printf("{\"id\":\"%s\",\"state\":\"cancelled\"}\n", r->job);
        if (!s) qh_req_finish_error(r, 500, "out of memory");
        else qh_req_finish(r, 200, s, JSON);
        return;
    }
    if (strcmp(rep->str, "ok")) {
        qh_req_finish_error(r, 409, "job '%s' is already %s", r->job, rep->str);
        return;
    }
    char *s = qh_strdup_printf("{\"id\":\"%s\",\"cancel\":\"requested\"}\n", r->job);
    if (!s) qh_req_finish_error(r, 500, "out of memory");
    else qh_req_finish(r, 202, s, JSON);
}

static enum MHD_Result delete_job(qh_req *r)
{
    static const char reason[] = "cancelled through the HTTP API";
    char hash[QP_KEY_MAX], flag[QP_KEY_MAX], chan[QP_KEY_MAX], queue[QP_KEY_MAX], stream[QP_KEY_MAX];
    char maxlen[16], ttl[24], now[24];
    qp_key_status(&r->h->keys, r->job, hash, sizeof hash);
    qp_key_cancel(&r->h->keys, r->job, flag, sizeof flag);
    qp_key_cancel_channel(&r->h->keys, chan, sizeof chan);
    qp_key_queue(&r->h->keys, queue, sizeof queue);
    qp_key_job_events(&r->h->keys, r->job, stream, sizeof stream);
    snprintf(maxlen, sizeof maxlen, "%d", QP_STREAM_MAXLEN);
    snprintf(ttl, sizeof ttl, "%lld", (long long)r->h->retention_s);
    /* The event in case the job is still on the queue and the script cancels it itself. */
    qp_status st;
    qp_status_init(&st);
    st.state = QP_STATE_CANCELLED;
    st.finished_ms = st.updated_ms = unix_ms();
    snprintf(now, sizeof now, "%lld", (long long)st.finished_ms);
    char *ev = qp_status_set_str(&st.id, r->job) || qp_status_set_str(&st.error, reason) ? NULL
                                                                                          : qp_status_to_event(&st, QP_EVENT_STATE);
    qp_status_clear(&st);
    if (!ev) return qh_respond_error(r, 500, "out of memory");
    const char *argv[] = {"EVAL", cancel_script, "4", hash, flag, queue, stream, chan, r->job, reason,
                          r->h->events_chan, maxlen, ev, ttl, now};
    int rc = qh_redis_cmd(r, on_cancel, 15, argv, NULL);
    free(ev);
    if (rc) return redis_down(r);
    return qh_suspend(r);
}

/* ---- /metrics, /readyz, /healthz ----------------------------------------------------- */

static void on_metrics(redisAsyncContext *ac, void *reply, void *priv)
{
    qh_req *r = priv;
    redisReply *rep = reply;
    char *s = qh_metrics_render(r->h, rep && rep->type == REDIS_REPLY_ARRAY ? rep : NULL);
    if (!s) qh_req_finish_error(r, 500, "out of memory");
    else qh_req_finish(r, 200, s, "text/plain; version=0.0.4; charset=utf-8");
}

static enum MHD_Result get_metrics(qh_req *r)
{
    char index[QP_KEY_MAX], queue[QP_KEY_MAX], failed[QP_KEY_MAX];
    qp_key_index(&r->h->keys, index, sizeof index);
    qp_key_queue(&r->h->keys, queue, sizeof queue);
    qp_key_failed(&r->h->keys, failed, sizeof failed);
    const char *argv[] = {"EVAL", qh_metrics_script, "3", index, queue, failed, r->h->keys.job};
    if (qh_redis_cmd(r, on_metrics, 7, argv, NULL)) {
        /* Without Redis the daemon-side series still help (quantd_redis_up 0 says why). */
        char *s = qh_metrics_render(r->h, NULL);
        return s ? qh_respond(r, 200, s, "text/plain; version=0.0.4; charset=utf-8")
                 : qh_respond_error(r, 500, "out of memory");
    }
    return qh_suspend(r);
}

static enum MHD_Result get_readyz(qh_req *r)
{
    char why[256] = "";
    if (!qh_redis_ready(r->h)) return qh_respond_error(r, 503, "Redis is not connected");
    if (r->h->view.ready && !r->h->view.ready(r->h->view.ud, why, sizeof why))
        return qh_respond_error(r, 503, "%s", why[0] ? why : "not ready");
    return qh_respond(r, 200, qh_strdup_printf("{\"ready\":true,\"config_generation\":%llu}\n",
                                               (unsigned long long)r->h->config_gen), JSON);
}

static enum MHD_Result get_workers(qh_req *r)
{
    qdd_worker_view w[64];
    int n = r->h->view.workers ? r->h->view.workers(r->h->view.ud, w, 64) : 0;
    if (n > 64) n = 64;
    cJSON *root = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(root, "workers");
    const char *node = r->h->view.node ? r->h->view.node(r->h->view.ud) : NULL;
    cJSON_AddStringToObject(root, "node", node ? node : "");
    for (int i = 0; i < n; i++) {
        cJSON *o = cJSON_CreateObject();
        w[i].name[sizeof w[i].name - 1] = w[i].state[sizeof w[i].state - 1] = 0;
        w[i].job_id[sizeof w[i].job_id - 1] = w[i].selftest[sizeof w[i].selftest - 1] = 0;
        cJSON_AddStringToObject(o, "name", w[i].name);
        cJSON_AddStringToObject(o, "state", w[i].state);
        cJSON_AddStringToObject(o, "job", w[i].job_id);
        cJSON_AddNumberToObject(o, "block", w[i].block);
        if (w[i].part >= 0) cJSON_AddNumberToObject(o, "part", w[i].part);
        cJSON_AddNumberToObject(o, "pid", w[i].pid);
        cJSON_AddNumberToObject(o, "restarts", w[i].restarts);
        if (w[i].gpu_mem_total >= 0) {
            cJSON_AddNumberToObject(o, "gpu_mem_used", (double)w[i].gpu_mem_used);
            cJSON_AddNumberToObject(o, "gpu_mem_total", (double)w[i].gpu_mem_total);
        }
        cJSON_AddStringToObject(o, "selftest", w[i].selftest);
        cJSON_AddItemToArray(arr, o);
    }
    char *s = json_print(root);
    return s ? qh_respond(r, 200, s, JSON) : qh_respond_error(r, 500, "out of memory");
}

static enum MHD_Result get_asset(qh_req *r, const qh_asset *a)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(a->len, (void *)a->data, MHD_RESPMEM_PERSISTENT);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", a->ctype);
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
    /* Everything the page needs comes from here: no scripts or styles from elsewhere. */
    MHD_add_response_header(resp, "Content-Security-Policy",
                            "default-src 'self'; connect-src *; img-src 'self' data:");
    enum MHD_Result ret = qh_queue(r, 200, resp, NULL);
    MHD_destroy_response(resp);
    return ret;
}

/* ---- dispatch ------------------------------------------------------------------------ */

static enum MHD_Result method_not_allowed(qh_req *r, const char *allow)
{
    return qh_respond_error(r, 405, "method not allowed here (allowed: %s)", allow);
}

/* The routing decision: method and path to a route, r->job filled for the per-job ones.
 * QH_ROUTE_NONE when it answered by itself (*ret holds MHD's verdict). */
static qh_route_id route_decide(qh_req *r, const qh_asset **asset, enum MHD_Result *ret)
{
    const char *p = r->path;
    int get = r->method == QH_GET || r->method == QH_HEAD;
    if (r->method == QH_OPTIONS) return QH_ROUTE_PREFLIGHT;
    if (r->method == QH_OTHER) { *ret = qh_respond_error(r, 405, "method not allowed"); return QH_ROUTE_NONE; }
    static const struct { const char *path; qh_route_id id; } fixed[] = {
        {"/healthz", QH_ROUTE_HEALTHZ}, {"/readyz", QH_ROUTE_READYZ}, {"/metrics", QH_ROUTE_METRICS},
        {"/v1/workers", QH_ROUTE_WORKERS}, {"/v1/events", QH_ROUTE_EVENTS},
    };
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        if (!strcmp(p, fixed[i].path)) {
            if (get) return fixed[i].id;
            *ret = method_not_allowed(r, "GET");
            return QH_ROUTE_NONE;
        }
    if (!strcmp(p, "/v1/jobs") || !strcmp(p, "/v1/jobs/")) {
        if (get) return QH_ROUTE_JOBS_LIST;
        if (r->method == QH_POST) return QH_ROUTE_JOB_SUBMIT;
        *ret = method_not_allowed(r, "GET, POST");
        return QH_ROUTE_NONE;
    }
    if (!strncmp(p, "/v1/jobs/", 9)) {
        const char *id = p + 9, *slash = strchr(id, '/');
        size_t n = slash ? (size_t)(slash - id) : strlen(id);
        if (n < sizeof r->job) {
            memcpy(r->job, id, n);
            r->job[n] = 0;
        }
        if (n >= sizeof r->job || !qp_name_valid(r->job)) {
            r->job[0] = 0;
            *ret = qh_respond_error(r, 400, "a job id is 1-64 of A-Z a-z 0-9 . _ -");
            return QH_ROUTE_NONE;
        }
        if (!slash) {
            if (get) return QH_ROUTE_JOB_GET;
            if (r->method == QH_DELETE) return QH_ROUTE_JOB_CANCEL;
            *ret = method_not_allowed(r, "GET, DELETE");
            return QH_ROUTE_NONE;
        }
        if (!strcmp(slash, "/events")) {
            if (get) return QH_ROUTE_JOB_EVENTS;
            *ret = method_not_allowed(r, "GET");
            return QH_ROUTE_NONE;
        }
        *ret = qh_respond_error(r, 404, "no such endpoint: %.200s", p);
        return QH_ROUTE_NONE;
    }
    if ((*asset = qh_asset_find(p))) {
        if (get) return QH_ROUTE_ASSET;
        *ret = method_not_allowed(r, "GET");
        return QH_ROUTE_NONE;
    }
    *ret = qh_respond_error(r, 404, "no such endpoint: %.200s", p);
    return QH_ROUTE_NONE;
}

enum MHD_Result qh_route(qh_req *r)
{
    enum MHD_Result ret = MHD_NO;
    const qh_asset *asset = NULL;
    qh_route_id id = route_decide(r, &asset, &ret);
    if (id == QH_ROUTE_NONE) return ret;
    /* The mutating routes check the token here, before any handler code runs. */
    if ((id == QH_ROUTE_JOB_SUBMIT || id == QH_ROUTE_JOB_CANCEL) && auth_check(r, &ret)) return ret;
    if (r->h->trace) r->h->trace(r->h->trace_ud, r, QH_TRACE_ROUTE, (int)id, NULL);
    /* Each stream holds its connection and up to a buffer of memory for as long as the client
     * likes, so their number has a limit of its own (http-max-streams), under the
     * connection limits. */
    if ((id == QH_ROUTE_EVENTS || id == QH_ROUTE_JOB_EVENTS) && qh_sse_count(r->h, r) >= r->h->max_streams)
        return qh_respond_error(r, 503, "too many event streams (http-max-streams %zu); try again", r->h->max_streams);
    switch (id) {
    case QH_ROUTE_PREFLIGHT: return qh_respond(r, 204, NULL, NULL);
    case QH_ROUTE_HEALTHZ:
        return qh_respond(r, 200, qh_strdup_printf("{\"ok\":true,\"config_generation\":%llu}\n",
                                                   (unsigned long long)r->h->config_gen), JSON);
    case QH_ROUTE_READYZ: return get_readyz(r);
    case QH_ROUTE_METRICS: return get_metrics(r);
    case QH_ROUTE_WORKERS: return get_workers(r);
    case QH_ROUTE_EVENTS:
        r->sse = 2;
        return qh_sse_start(r);
    case QH_ROUTE_JOBS_LIST: return get_jobs(r);
    case QH_ROUTE_JOB_SUBMIT: return post_job(r);
    case QH_ROUTE_JOB_GET: return get_job(r);
    case QH_ROUTE_JOB_CANCEL: return delete_job(r);
    case QH_ROUTE_JOB_EVENTS: return get_events(r);
    case QH_ROUTE_ASSET: return get_asset(r, asset);
    case QH_ROUTE_NONE: break;
    }
    return ret;
}
