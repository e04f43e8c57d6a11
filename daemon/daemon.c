/* The daemon's lifecycle on one libuv loop: start (keys, worker pool, the three Redis
 * connections of rconn.h, which the HTTP API shares when configured, the node key of node.c),
 * the periodic tick (node heartbeat, lease renewal, dead-node reclaim, worker watchdog,
 * systemd watchdog), the queue pop (backing off while Redis answers it with an error), the
 * readiness /readyz reports, and the signals: SIGTERM/SIGINT drain (no new jobs, running
 * blocks finish within stop-timeout, jobs handed back to the queue, workers shut down, the
 * node key released, exit 0), SIGHUP reloads the
 * configuration (every option is applied, the HTTP layer's included, or reported as
 * needing a restart and kept; the generation counts successful reloads). */
#define _GNU_SOURCE
#include "daemon/daemon.h"

#include <inttypes.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "daemon/http.h"
#include "daemon/notify.h"
#include "quant/core/clock.h"
#include "quant/core/log.h"

#define TICK_MS 200
#define HANDBACK_WAIT_S 5.0
#define WORKER_EXIT_WAIT_S 5.0

int64_t qdd_unix_ms(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000;
}

/* ---- the queue ------------------------------------------------------------------------------- */

/* The queue path answered with an error reply (a key of the wrong type, a command or key
 * the ACL forbids): Redis answers at once, so popping again at once would spin. The pop
 * waits the backoff (100 ms doubling to 5 s, as reconnects do), the error is logged once per
 * change (rerr.h), and /readyz says why until the pop works again. */
static void queue_retry(qdd_daemon *d)
{
    if (d->pop_recover) {
        if (d->pop_after_ms && uv_now(d->loop) < d->pop_after_ms) return;   /* backing off */
        /* A take failed (its payload is still in our processing list) or the recovery did:
         * the reconnect recovery runs again, handing back what we do not hold and
         * re-asserting what we do; its reply resumes the pop. */
        if (!d->cmd.up || d->node_state != QDD_NODE_OWNED || d->stopping) return;
        d->pop_recover = 0;
        d->cmd_ready = 0;
        qdd_jobs_recover(d, 1);
        return;
    }
    qdd_maybe_pop(d);
}

static void on_pop_timer(uv_timer_t *t) { queue_retry(t->data); }

void qdd_queue_error(qdd_daemon *d, const char *cmd, const char *err, int recover)
{
    int delay = qdd_rerr_fail(&d->rerr_queue, "queue", cmd, err);
    d->pop_after_ms = uv_now(d->loop) + (uint64_t)delay;
    if (recover) d->pop_recover = 1;
    if (d->pop_timer_on) uv_timer_start(&d->pop_timer, on_pop_timer, (uint64_t)delay, 0);
}

void qdd_queue_ok(qdd_daemon *d, const char *cmd) { qdd_rerr_ok(&d->rerr_queue, cmd); }

static void on_pop(redisAsyncContext *ac, void *r, void *pd)
{
    qdd_daemon *d = pd;
    redisReply *reply = r;
    d->pop_inflight = 0;
    if (!reply) return;   /* the connection went; pop_up pops again */
    if (reply->type == REDIS_REPLY_ERROR) {
        qdd_queue_error(d, "BLMOVE", reply->str, 0);
        return;
    }
    qdd_queue_ok(d, "BLMOVE");
    if (reply->type == REDIS_REPLY_STRING) qdd_jobs_admit(d, reply->str, reply->len);
    qdd_maybe_pop(d);
}

void qdd_maybe_pop(qdd_daemon *d)
{
    if (d->stopping || !d->pop.up || !d->cmd_ready || d->pop_inflight || d->pop_recover) return;
    if (d->pop_after_ms && uv_now(d->loop) < d->pop_after_ms) return;   /* backing off */
    int held = 0;
    for (qdd_job *j = d->jobs; j; j = j->next) {
        if (j->phase == QDD_JOB_WAITING || j->phase == QDD_JOB_TAKING) return;   /* no hoarding */
        held += j->phase == QDD_JOB_RUNNING;
    }
    if (held >= d->max_jobs) return;
    char queue[QP_KEY_MAX], proc[QP_KEY_MAX];
    qp_key_queue(&d->keys, queue, sizeof queue);
    qp_key_processing(&d->keys, d->node, proc, sizeof proc);
    /* A short block timeout keeps the stop and reconnect paths responsive. */
    if (qdd_rconn_cmdf(&d->pop, on_pop, d, "BLMOVE %s %s RIGHT LEFT 1", queue, proc) == 0) d->pop_inflight = 1;
}

/* ---- connections ------------------------------------------------------------------------------ */

static void on_cancel_msg(void *pd, const char *channel, const char *payload, size_t len)
{
    char id[QP_JOB_ID_MAX + 1];
    if (len == 0 || len >= sizeof id) return;
    memcpy(id, payload, len);
    id[len] = 0;
    qdd_jobs_cancel(pd, id);
}

/* When one connection sees Redis go away, probe the others now instead of waiting for their
 * next watchdog round: an idle connection may not notice on its own. */
static void probe_others(qdd_daemon *d, const qdd_rconn *except)
{
    qdd_rconn *all[3] = {&d->cmd, &d->pop, &d->sub};
    for (int i = 0; i < 3; i++)
        if (all[i] != except) qdd_rconn_probe_now(all[i]);
}

/* Once cmd is up the node key comes first (node.c): only the daemon that holds it may
 * recover the node's processing list, or two daemons with one --node would hand each
 * other's jobs back. */
static void cmd_up(qdd_rconn *c)
{
    qdd_daemon *d = c->ud;
    d->cmd_ready = 0;
    d->awaiting_recovery = 1;
    d->node_claim_inflight = 0;   /* a claim sent on the previous connection got no reply */
    qdd_node_claim(d);
}

void qdd_daemon_node_owned(qdd_daemon *d)
{
    /* Re-asserts what this node holds (lease, processing list, status hash with spec, index;
     * a full status write, since writes made while Redis was away were lost) and puts back
     * what it does not; cmd_ready follows, and with it the queue pop. */
    d->pop_recover = 0;
    qdd_jobs_recover(d, 1);
    if (!d->ever_ready) {
        d->ever_ready = 1;
        qdd_notify_ready("connected to Redis");
    }
}

static void cmd_down(qdd_rconn *c)
{
    qdd_daemon *d = c->ud;
    d->cmd_ready = 0;
    probe_others(d, c);
}

static void pop_up(qdd_rconn *c) { qdd_maybe_pop(c->ud); }

static void pop_down(qdd_rconn *c)
{
    qdd_daemon *d = c->ud;
    d->pop_inflight = 0;   /* the BLMOVE in flight got its NULL reply */
    probe_others(d, c);
}

static void sub_down(qdd_rconn *c) { probe_others(c->ud, c); }

/* ---- HTTP view --------------------------------------------------------------------------------- */

int qdd_daemon_ready(const qdd_daemon *d, char *why, size_t cap)
{
    char e[200];
    if (!d->cmd.up) { snprintf(why, cap, "not connected to Redis"); return 0; }
    switch (d->node_state) {
    case QDD_NODE_OWNED: break;
    case QDD_NODE_WAITING:
        snprintf(why, cap, "node %s is held by another daemon (%s): waiting for its key to expire or be refreshed",
                 d->node, d->node_holder);
        return 0;
    case QDD_NODE_REFUSED:
    case QDD_NODE_LOST:
        snprintf(why, cap, "node %s is in use by another daemon: stopping", d->node);
        return 0;
    default:
        if (qdd_rerr_active(&d->rerr_node)) break;   /* said below */
        snprintf(why, cap, "claiming node %s", d->node);
        return 0;
    }
    if (qdd_rerr_active(&d->rerr_queue)) {
        qdd_rerr_describe(&d->rerr_queue, e, sizeof e);
        snprintf(why, cap, "Redis refuses the queue (%s); retrying with backoff", e);
        return 0;
    }
    if (qdd_rerr_active(&d->rerr_node)) {
        qdd_rerr_describe(&d->rerr_node, e, sizeof e);
        snprintf(why, cap, "Redis refuses the node key (%s); retrying", e);
        return 0;
    }
    for (int i = 0; i < d->n_workers; i++)
        if (d->workers[i].state == QDD_W_IDLE || d->workers[i].state == QDD_W_BUSY) return 1;
    snprintf(why, cap, "no worker is up");
    return 0;
}

static int view_ready(void *ud, char *why, size_t cap) { return qdd_daemon_ready(ud, why, cap); }

static int view_workers(void *ud, qdd_worker_view *out, int cap)
{
    static const char *const names[] = {"starting", "starting", "idle", "busy", "dead", "failed_selftest"};
    qdd_daemon *d = ud;
    for (int i = 0; i < d->n_workers && i < cap; i++) {
        const qdd_worker *w = &d->workers[i];
        qdd_worker_view *v = &out[i];
        memset(v, 0, sizeof *v);
        snprintf(v->name, sizeof v->name, "%s", w->name);
        snprintf(v->state, sizeof v->state, "%s", names[w->state]);
        /* A helper shows the part it runs; the lead its task, and its own part beside it. */
        const qdd_job *j = w->job ? w->job : w->part_job;
        snprintf(v->job_id, sizeof v->job_id, "%s", j ? j->id : "");
        v->block = w->job ? w->block : w->part_job ? w->part_block : -1;
        v->part = w->part_job ? w->part_index : -1;
        v->pid = w->pid;
        v->restarts = w->restarts;
        v->gpu_mem_used = v->gpu_mem_total = -1;
        snprintf(v->selftest, sizeof v->selftest, "%.*s", (int)sizeof v->selftest - 1, w->why);
    }
    return d->n_workers;
}

static size_t view_drain(void *ud, double *out, size_t cap) { return 0; }
static const char *view_node(void *ud) { return ((qdd_daemon *)ud)->node; }

/* ---- stop and reload --------------------------------------------------------------------------- */

static void close_handle(uv_handle_t *h)
{
    if (!uv_is_closing(h)) uv_close(h, NULL);
}

static void http_stopped(void *ud) { (void)ud; }

static void close_everything(qdd_daemon *d)
{
    QD_LOG(QD_LOG_INFO, "daemon_exit", "node=%s", d->node);
    /* The HTTP layer first: it answers its requests still waiting on cmd and unsubscribes. */
    if (d->http) {
        qdd_http_stop(d->http, http_stopped, d);
        d->http = NULL;
    }
    qdd_rconn_close(&d->pop);
    qdd_rconn_close(&d->sub);
    qdd_node_release(d);   /* queued on cmd, which the close flushes */
    qdd_rconn_close(&d->cmd);
    close_handle((uv_handle_t *)&d->tick);
    if (d->pop_timer_on) close_handle((uv_handle_t *)&d->pop_timer);
    close_handle((uv_handle_t *)&d->sig_term);
    close_handle((uv_handle_t *)&d->sig_int);
    close_handle((uv_handle_t *)&d->sig_hup);
    for (int i = 0; i < d->n_workers; i++) close_handle((uv_handle_t *)&d->workers[i].restart);
}

/* why: "signal=TERM", "reason=node_in_use", ... */
static void start_stop(qdd_daemon *d, const char *why)
{
    if (d->stopping) {
        d->stop_deadline_s = qd_clock_now_s();   /* a second signal: do not wait for blocks */
        return;
    }
    d->stopping = QDD_STOP_DRAINING;
    d->stop_deadline_s = qd_clock_now_s() + (double)d->cfg->stop_timeout_s;
    QD_LOG(QD_LOG_INFO, "daemon_stopping", "%s running_tasks=%d", why, qdd_jobs_tasks_running(d));
    qdd_notify_stopping("draining: running blocks finish, then jobs go back to the queue");
}

static void stop_step(qdd_daemon *d)
{
    double now = qd_clock_now_s();
    if (d->stopping == QDD_STOP_DRAINING) {
        if (qdd_jobs_tasks_running(d) > 0 && now < d->stop_deadline_s) return;
        /* Helpers too: a part in flight is recomputed by whoever resumes the block. */
        for (int i = 0; i < d->n_workers; i++)
            if (d->workers[i].job || d->workers[i].part_job) qdd_pool_kill(&d->workers[i], "still busy at the stop deadline");
        d->stopping = QDD_STOP_HANDING_BACK;
        d->handback_deadline_s = now + HANDBACK_WAIT_S;
    }
    if (d->stopping == QDD_STOP_HANDING_BACK) {
        qdd_jobs_handback_all(d);
        int left = 0;
        for (qdd_job *j = d->jobs; j; j = j->next) left += j->phase != QDD_JOB_GONE && !j->lost;
        if ((left > 0 || d->handback_pending > 0) && now < d->handback_deadline_s) return;
        if (left) QD_LOG(QD_LOG_WARN, "handback_incomplete", "jobs=%d (they stay in the processing list and are reclaimed)", left);
        qdd_pool_shutdown(d);
        d->stopping = QDD_STOP_WORKERS_EXITING;
        d->handback_deadline_s = now + WORKER_EXIT_WAIT_S;
    }
    if (d->stopping == QDD_STOP_WORKERS_EXITING) {
        if (!qdd_pool_all_down(d) && now < d->handback_deadline_s) return;
        for (int i = 0; i < d->n_workers; i++) qdd_pool_kill(&d->workers[i], "did not exit after shutdown");
        if (!qdd_pool_all_down(d)) return;
        d->stopping = QDD_STOP_CLOSED;
        close_everything(d);
    }
}

static void note_restart(void *ud, const char *option, const char *running, const char *wanted)
{
    QD_LOG(QD_LOG_WARN, "reload_needs_restart", "option=%s running=%s new=%s (the running value is kept)", option,
           running, wanted);
}

/* SIGHUP: every option is applied or reported as needing a restart (config.c's table says
 * which). The new configuration replaces the old one whole; the old one is freed at once,
 * since nothing keeps a pointer into it (the HTTP layer copies what it uses). */
static void reload(qdd_daemon *d)
{
    qdd_config *nc = NULL;
    qd_err err = {0};
    qdd_notify_reloading("reloading the configuration");
    if (qdd_config_load(d->argc, d->argv, d->envp, &nc, &err)) {
        QD_LOG(QD_LOG_ERROR, "reload_failed", "err=\"%s\" generation=%llu (keeping the running configuration)", err.msg,
               (unsigned long long)d->config_gen);
        qdd_notify_ready("reload failed; running configuration kept");
        return;
    }
    int kept = qdd_config_keep_restart_options(d->cfg, nc, note_restart, NULL);
    if (kept < 0) {
        QD_LOG(QD_LOG_ERROR, "reload_failed", "err=\"out of memory\" generation=%llu (keeping the running configuration)",
               (unsigned long long)d->config_gen);
        qdd_config_free(nc);
        qdd_notify_ready("reload failed; running configuration kept");
        return;
    }
    if (d->http && qdd_http_reconfigure(d->http, nc, d->config_gen + 1, &err)) {
        QD_LOG(QD_LOG_ERROR, "reload_failed", "err=\"%s\" generation=%llu (keeping the running configuration)", err.msg,
               (unsigned long long)d->config_gen);
        qdd_config_free(nc);
        qdd_notify_ready("reload failed; running configuration kept");
        return;
    }
    qdd_config *old = d->cfg;
    d->cfg = nc;
    qdd_config_free(old);
    d->config_gen++;
    d->max_jobs = nc->max_jobs > 0 ? (int)nc->max_jobs : d->n_workers;
    int lvl = qd_log_level_parse(nc->log_level);
    if (lvl >= 0) qd_log_set_level(lvl);
    char dump[4096];
    qdd_config_dump(nc, dump, sizeof dump);
    QD_LOG(QD_LOG_INFO, "config_reloaded", "generation=%llu needs_restart=%d %s", (unsigned long long)d->config_gen, kept,
           dump);
    qdd_notify_ready("configuration reloaded");
    qdd_jobs_schedule(d);
    qdd_maybe_pop(d);
}

static void on_signal(uv_signal_t *s, int sig)
{
    qdd_daemon *d = s->data;
    if (sig == SIGHUP) reload(d);
    else start_stop(d, sig == SIGTERM ? "signal=TERM" : "signal=INT");
}

void qdd_daemon_stop(qdd_daemon *d, int exit_code, const char *why)
{
    if (exit_code && !d->exit_code) d->exit_code = exit_code;
    start_stop(d, why);
}

/* ---- the tick ----------------------------------------------------------------------------------- */

static void on_tick(uv_timer_t *t)
{
    qdd_daemon *d = t->data;
    double now = qd_clock_now_s();
    qdd_pool_watchdog(d);
    if (d->stopping) { stop_step(d); if (d->stopping == QDD_STOP_CLOSED) return; }
    if (now >= d->next_node_hb_s) {
        d->next_node_hb_s = now + (double)d->cfg->node_ttl_ms / 3000.0;
        /* Not gated on cmd_ready: a recovery that Redis keeps refusing must not let the key
         * expire, or another daemon could take this live node over. */
        if (d->node_state == QDD_NODE_OWNED) qdd_jobs_node_heartbeat(d);
        if (d->sd_watchdog) qdd_notify_watchdog();
        int running = 0;
        for (qdd_job *j = d->jobs; j; j = j->next) running += j->phase == QDD_JOB_RUNNING;
        qdd_notify_status("%d jobs running, redis %s", running, d->cmd.up ? "up" : "down");
    }
    if (now >= d->next_renew_s) {
        d->next_renew_s = now + (double)d->cfg->lease_ttl_ms / 3000.0;
        qdd_jobs_renew(d);
    }
    if (now >= d->next_reclaim_s && !d->stopping) {
        d->next_reclaim_s = now + (double)d->cfg->node_ttl_ms / 3000.0;
        if (d->cmd_ready) qdd_jobs_reclaim_scan(d);
    }
    qdd_node_tick(d);
    qdd_nparts_tick(d);
    qdd_jobs_schedule(d);
    queue_retry(d);
}

/* ---- run ------------------------------------------------------------------------------------------ */

static void find_worker_exe(qdd_daemon *d)
{
    if (d->cfg->worker_path && d->cfg->worker_path[0]) {
        snprintf(d->worker_exe, sizeof d->worker_exe, "%s", d->cfg->worker_path);
        return;
    }
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) { snprintf(d->worker_exe, sizeof d->worker_exe, "quantd-worker"); return; }
    self[n] = 0;
    snprintf(d->worker_exe, sizeof d->worker_exe, "%s/quantd-worker", dirname(self));
}

int qdd_daemon_run(qdd_config *cfg, int argc, char **argv, char **envp)
{
    qdd_daemon *d = calloc(1, sizeof *d);
    uv_loop_t loop;
    if (!d || uv_loop_init(&loop)) { free(d); qdd_config_free(cfg); return 1; }
    d->loop = &loop;
    d->cfg = cfg;
    d->argc = argc;
    d->argv = argv;
    d->envp = envp;
    d->start_ms = qdd_unix_ms();
    int rc = 1;
    qd_err err = {0};
    qp_err pe = {0};
    signal(SIGPIPE, SIG_IGN);
    if (qp_keys_init(&d->keys, cfg->queue, cfg->key_prefix, &pe)) {
        QD_LOG(QD_LOG_ERROR, "config", "err=\"%s\"", pe.msg);
        goto out;
    }
    snprintf(d->node, sizeof d->node, "%s", cfg->node);
    if (qdd_redis_url_parse(cfg->redis, &d->url, &err)) {
        QD_LOG(QD_LOG_ERROR, "config", "err=\"%s\"", err.msg);
        goto out;
    }
    find_worker_exe(d);
    char dump[4096];
    qdd_config_dump(cfg, dump, sizeof dump);
    d->config_gen = 1;
    QD_LOG(QD_LOG_INFO, "config", "generation=%llu %s worker_exe=%s", (unsigned long long)d->config_gen, dump,
           d->worker_exe);
    if (cfg->n_allow_roots == 0)
        QD_LOG(QD_LOG_WARN, "config", "no --allow-root: every job will be refused");

    uv_signal_init(d->loop, &d->sig_term);
    uv_signal_init(d->loop, &d->sig_int);
    uv_signal_init(d->loop, &d->sig_hup);
    d->sig_term.data = d->sig_int.data = d->sig_hup.data = d;
    uv_signal_start(&d->sig_term, on_signal, SIGTERM);
    uv_signal_start(&d->sig_int, on_signal, SIGINT);
    uv_signal_start(&d->sig_hup, on_signal, SIGHUP);
    uv_timer_init(d->loop, &d->tick);
    d->tick.data = d;
    uv_timer_init(d->loop, &d->pop_timer);
    d->pop_timer.data = d;
    d->pop_timer_on = 1;
    /* The connections exist (closable) before anything can fail below. Each carries a client
     * name (CLIENT LIST shows quantd:<node>:cmd, ...). The sub connection subscribes to the
     * cancel channel here; the HTTP layer adds the events channel. */
    qdd_rconn *conns[3] = {&d->cmd, &d->pop, &d->sub};
    static const char *const conn_names[3] = {"cmd", "pop", "sub"};
    for (int i = 0; i < 3; i++) {
        if (qdd_rconn_init(conns[i], d->loop, &d->url, conn_names[i])) {
            QD_LOG(QD_LOG_ERROR, "redis", "err=\"out of memory\"");
            for (int k = 0; k < i; k++) qdd_rconn_close(conns[k]);
            close_handle((uv_handle_t *)&d->tick);
            close_handle((uv_handle_t *)&d->pop_timer);
            close_handle((uv_handle_t *)&d->sig_term);
            close_handle((uv_handle_t *)&d->sig_int);
            close_handle((uv_handle_t *)&d->sig_hup);
            uv_run(d->loop, UV_RUN_DEFAULT);
            goto out;
        }
        conns[i]->ud = d;
        snprintf(conns[i]->client_name, sizeof conns[i]->client_name, "quantd:%s:%s", d->node, conn_names[i]);
    }
    d->cmd.on_up = cmd_up;
    d->cmd.on_down = cmd_down;
    d->pop.on_up = pop_up;
    d->pop.on_down = pop_down;
    d->sub.on_down = sub_down;
    char cancel_chan[QP_KEY_MAX];
    qp_key_cancel_channel(&d->keys, cancel_chan, sizeof cancel_chan);
    qdd_rconn_subscribe(&d->sub, cancel_chan, on_cancel_msg, d);
    qdd_nparts_start(d);

    if (qdd_pool_start(d, &err)) {
        QD_LOG(QD_LOG_ERROR, "workers", "err=\"%s\"", err.msg);
        d->stopping = QDD_STOP_CLOSED;
        close_everything(d);
        uv_run(d->loop, UV_RUN_DEFAULT);
        goto out;
    }
    d->max_jobs = cfg->max_jobs > 0 ? (int)cfg->max_jobs : d->n_workers;
    d->sd_watchdog = qdd_notify_watchdog_usec() > 0;

    qdd_rconn_connect(&d->cmd);
    qdd_rconn_connect(&d->pop);
    qdd_rconn_connect(&d->sub);

    if (cfg->http && cfg->http[0]) {
        d->view = (qdd_http_view){.ud = d, .ready = view_ready, .workers = view_workers,
                                  .drain_block_seconds = view_drain, .node = view_node};
        qdd_http *h = NULL;
        if (qdd_http_start(d->loop, cfg, &d->view, &d->cmd, &d->sub, &h, &err)) {
            QD_LOG(QD_LOG_ERROR, "http", "err=\"%s\"", err.msg);
            d->stopping = QDD_STOP_CLOSED;
            qdd_pool_shutdown(d);
            for (int i = 0; i < d->n_workers; i++) qdd_pool_kill(&d->workers[i], "the daemon failed to start");
            close_everything(d);
            uv_run(d->loop, UV_RUN_DEFAULT);
            goto out;
        }
        d->http = h;
    }
    uv_timer_start(&d->tick, on_tick, TICK_MS, TICK_MS);
    uv_run(d->loop, UV_RUN_DEFAULT);
    rc = d->exit_code;
    if (rc) QD_LOG(QD_LOG_ERROR, "daemon_exit_status", "node=%s status=%d", d->node, rc);
out:
    qdd_jobs_free_all(d);
    qdd_pool_free(d);
    uv_loop_close(d->loop);
    qdd_redis_url_clear(&d->url);
    qdd_config_free(d->cfg);
    free(d);
    return rc;
}
