/* The worker pool: quantd-worker processes spawned with uv_spawn (one per GPU for
 * cuda:..., N on each for cuda:0*N, N for cpu:N), framed messages over their stdin/stdout
 * (proto/wire.h), the hello check, the heartbeat watchdog, and restarts. A worker that
 * exits, is killed (OOM killer included) or falls silent is killed and restarted after a
 * backoff; the task it held is retried from the checkpoint by jobs.c. */
#define _GNU_SOURCE
#include "daemon/daemon.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/core/clock.h"
#include "quant/core/log.h"

#define HELLO_TIMEOUT_S 60.0
#define RESTART_MIN_MS 200
#define RESTART_MAX_MS 10000

static void spawn(qdd_worker *w);
static void on_restart(uv_timer_t *t) { spawn(t->data); }

static void on_handle_closed(uv_handle_t *h)
{
    qdd_worker *w = h->data;
    if (--w->open_handles > 0) return;
    qp_wire_decoder_free(&w->dec);
    if (w->state != QDD_W_FAILED) w->state = QDD_W_DOWN;
    if (w->d->stopping || w->state == QDD_W_FAILED) return;
    int delay = RESTART_MIN_MS << (w->restarts < 6 ? w->restarts : 6);
    if (delay > RESTART_MAX_MS) delay = RESTART_MAX_MS;
    /* A worker that ran a good while before dying is not crash-looping. */
    if (qd_clock_now_s() - w->started_s > 60) delay = RESTART_MIN_MS;
    uv_timer_start(&w->restart, on_restart, (uint64_t)delay, 0);
}

static void close_all(qdd_worker *w)
{
    uv_handle_t *hs[3] = {(uv_handle_t *)&w->proc, (uv_handle_t *)&w->in, (uv_handle_t *)&w->out};
    for (int i = 0; i < 3; i++)
        if (!uv_is_closing(hs[i])) uv_close(hs[i], on_handle_closed);
}

void qdd_pool_kill(qdd_worker *w, const char *why)
{
    if (w->state == QDD_W_DOWN || w->exited) return;
    if (why && why != w->why && !w->why[0]) snprintf(w->why, sizeof w->why, "%.*s", (int)sizeof w->why - 1, why);
    QD_LOG(QD_LOG_WARN, "worker_kill", "worker=%s pid=%d why=\"%s\"", w->name, w->pid, why ? why : "");
    uv_process_kill(&w->proc, SIGKILL);
}

/* The kernel's count of out-of-memory kills in our cgroup (cgroup v2 memory.events), or -1
 * when it cannot be read. Workers live in the daemon's cgroup (the systemd service), so a
 * count that grew while a worker ran tells an OOM kill from an operator's kill -9. */
static long cgroup_oom_kills(void)
{
    char line[4096], path[4200];
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f) return -1;
    path[0] = 0;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "0::", 3)) continue;
        line[strcspn(line, "\n")] = 0;
        snprintf(path, sizeof path, "/sys/fs/cgroup%s/memory.events", line + 3);
    }
    fclose(f);
    if (!path[0] || !(f = fopen(path, "r"))) return -1;
    long n = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "oom_kill %ld", &n) == 1) break;
    fclose(f);
    return n;
}

static void on_exit_cb(uv_process_t *p, int64_t status, int sig)
{
    qdd_worker *w = p->data;
    qdd_daemon *d = w->d;
    w->exited = 1;
    long oom_now = cgroup_oom_kills();
    char why[400];
    if (w->why[0]) snprintf(why, sizeof why, "worker %s %s", w->name, w->why);
    else if (sig == SIGKILL && w->oom_kills_at_start >= 0 && oom_now > w->oom_kills_at_start)
        snprintf(why, sizeof why, "worker %s was killed by the kernel's out-of-memory killer (signal 9, SIGKILL)", w->name);
    else if (sig) snprintf(why, sizeof why, "worker %s was killed by signal %d (SIG%s)", w->name, sig, sigabbrev_np(sig) ? sigabbrev_np(sig) : "?");
    else snprintf(why, sizeof why, "worker %s exited with status %lld", w->name, (long long)status);
    int was_running = w->job != NULL;
    /* Whatever this exit was, an OOM kill counted so far is not news to the workers still
     * running: their baselines move up, so a later plain kill of one of them is not read as
     * the OOM killer's (and counted towards quarantine). */
    for (int i = 0; i < d->n_workers; i++)
        if (&d->workers[i] != w && !d->workers[i].exited) d->workers[i].oom_kills_at_start = oom_now;
    /* Died of its task: a crash signal, or the out-of-memory killer; not a kill the daemon
     * sent (w->why) nor a plain SIGKILL from elsewhere (an operator, a test). */
    int oom = sig == SIGKILL && w->oom_kills_at_start >= 0 && oom_now > w->oom_kills_at_start;
    int poison = !w->why[0] && (oom || sig == SIGSEGV || sig == SIGBUS || sig == SIGABRT || sig == SIGILL ||
                                sig == SIGFPE || sig == SIGSYS);
    if (!d->stopping) QD_LOG(QD_LOG_WARN, "worker_exit", "worker=%s pid=%d status=%lld signal=%d task=%d", w->name, w->pid,
                             (long long)status, sig, was_running);
    if (w->state != QDD_W_FAILED) w->state = QDD_W_DEAD;
    w->restarts++;
    qdd_jobs_worker_died(d, w, why, poison);
    close_all(w);
    qdd_jobs_schedule(d);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    buf->base = malloc(65536);
    buf->len = buf->base ? 65536 : 0;
}

static void on_hello(qdd_worker *w, const qp_msg_hello *h)
{
    if (h->protocol != QP_WIRE_VERSION) {
        snprintf(w->why, sizeof w->why, "speaks wire protocol %d, this daemon %d (stale binary?)", h->protocol, QP_WIRE_VERSION);
        w->state = QDD_W_FAILED;
        qdd_pool_kill(w, w->why);
        return;
    }
    if (!h->selftest_ok) {
        snprintf(w->why, sizeof w->why, "failed its self-test: %s", h->selftest ? h->selftest : "?");
        QD_LOG(QD_LOG_ERROR, "worker_refused", "worker=%s why=\"%s\"", w->name, w->why);
        w->state = QDD_W_FAILED;
        qdd_pool_kill(w, w->why);
        return;
    }
    w->state = QDD_W_IDLE;
    w->why[0] = 0;
    QD_LOG(QD_LOG_INFO, "worker_ready", "worker=%s pid=%d device=\"%s\"", w->name, w->pid, h->device ? h->device : "");
    qdd_jobs_schedule(w->d);
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    qdd_worker *w = s->data;
    if (n < 0) {
        free(buf->base);
        uv_read_stop(s);
        return;   /* the exit callback follows */
    }
    qp_err pe = {0};
    int bad = n > 0 && qp_wire_decoder_feed(&w->dec, buf->base, (size_t)n, &pe);
    free(buf->base);
    if (bad) { qdd_pool_kill(w, pe.msg); return; }
    w->last_msg_s = qd_clock_now_s();
    for (;;) {
        qp_msg m;
        int rc = qp_wire_decoder_next(&w->dec, &m, &pe);
        if (rc == 0) break;
        if (rc < 0) {
            if (qp_wire_decoder_broken(&w->dec)) { qdd_pool_kill(w, pe.msg); return; }
            QD_LOG(QD_LOG_WARN, "worker_bad_message", "worker=%s err=\"%s\"", w->name, pe.msg);
            continue;
        }
        if (m.type == QP_MSG_HELLO) {
            if (w->state == QDD_W_STARTING) on_hello(w, &m.hello);
        } else if (m.type != QP_MSG_HEARTBEAT) {
            qdd_jobs_on_msg(w->d, w, &m);
        }
        qp_msg_clear(&m);
        if (w->exited) break;
    }
}

static void spawn(qdd_worker *w)
{
    qdd_daemon *d = w->d;
    if (d->stopping) return;
    char hb[32], lj[32], lt[32], lx[32];
    snprintf(hb, sizeof hb, "%lld", (long long)d->cfg->heartbeat_s * 1000);
    snprintf(lj, sizeof lj, "%lld", (long long)d->cfg->max_json_bytes);
    snprintf(lt, sizeof lt, "%lld", (long long)d->cfg->max_tokenizer_bytes);
    snprintf(lx, sizeof lx, "%lld", (long long)d->cfg->max_text_bytes);
    /* The worker is confined to the allow-roots and limits the daemon started with
     * (quant/core/confine.h), given as flags so the config file's values reach it too. */
    size_t n_args = 0, cap = 16 + 2 * d->cfg->n_allow_roots;
    char **args = calloc(cap, sizeof *args);
    if (!args) { QD_LOG(QD_LOG_ERROR, "worker_spawn", "worker=%s err=\"out of memory\"", w->name); return; }
    char *fixed[] = {d->worker_exe, "--name", w->name, "--backend", w->backend, "--heartbeat-ms", hb,
                     "--max-json-bytes", lj, "--max-tokenizer-bytes", lt, "--max-text-bytes", lx};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) args[n_args++] = fixed[i];
    for (size_t i = 0; i < d->cfg->n_allow_roots; i++) {
        args[n_args++] = "--allow-root";
        args[n_args++] = d->cfg->allow_roots[i];
    }
    uv_pipe_init(d->loop, &w->in, 0);
    uv_pipe_init(d->loop, &w->out, 0);
    w->in.data = w->out.data = w->proc.data = w;
    uv_stdio_container_t stdio[3];
    stdio[0].flags = UV_CREATE_PIPE | UV_READABLE_PIPE;
    stdio[0].data.stream = (uv_stream_t *)&w->in;
    stdio[1].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
    stdio[1].data.stream = (uv_stream_t *)&w->out;
    stdio[2].flags = UV_INHERIT_FD;
    stdio[2].data.fd = 2;
    uv_process_options_t o;
    memset(&o, 0, sizeof o);
    o.file = d->worker_exe;
    o.args = args;
    o.exit_cb = on_exit_cb;
    o.stdio_count = 3;
    o.stdio = stdio;
    qp_wire_decoder_init(&w->dec, 0);
    w->exited = 0;
    w->exiting = 0;
    w->why[0] = 0;
    w->job = NULL;
    w->part_job = NULL;   /* released when the previous process died (qdd_parts_worker_gone) */
    w->open_handles = 3;
    w->started_s = w->last_msg_s = qd_clock_now_s();
    w->oom_kills_at_start = cgroup_oom_kills();
    int rc = uv_spawn(d->loop, &w->proc, &o);
    free(args);   /* the child has exec'd (or failed to) by the time uv_spawn returns */
    if (rc) {
        QD_LOG(QD_LOG_ERROR, "worker_spawn", "worker=%s exe=%s err=\"%s\"", w->name, d->worker_exe, uv_strerror(rc));
        w->exited = 1;
        w->restarts++;
        w->state = QDD_W_DEAD;
        close_all(w);
        return;
    }
    w->pid = w->proc.pid;
    w->state = QDD_W_STARTING;
    uv_read_start((uv_stream_t *)&w->out, on_alloc, on_read);
    QD_LOG(QD_LOG_INFO, "worker_spawn", "worker=%s pid=%d backend=%s", w->name, w->pid, w->backend);
}

int qdd_pool_start(qdd_daemon *d, qd_err *err)
{
    const qdd_workers *ws = &d->cfg->worker_spec;
    /* devs[i]: worker i's device; copy[i]: which of that device's workers it is (0 first). */
    int n = 0, devs[QDD_MAX_WORKERS], copy[QDD_MAX_WORKERS];
    if (ws->kind == QDD_WORKERS_CPU) {
        n = ws->n_cpu;
    } else {
        int n_dev, per_all = ws->all_per_device > 0 ? ws->all_per_device : 1;
        if (ws->n_devices == QDD_CUDA_ALL) {
            /* Every visible device; without the CUDA runtime in the daemon, count them from
             * CUDA_VISIBLE_DEVICES, else assume one (a worker on a missing device refuses in hello). */
            const char *vis = getenv("CUDA_VISIBLE_DEVICES");
            n_dev = 1;
            if (vis && *vis)
                for (const char *p = vis; *p; p++) n_dev += *p == ',';
        } else {
            n_dev = ws->n_devices;
        }
        for (int i = 0; i < n_dev; i++) {
            int dev = ws->n_devices == QDD_CUDA_ALL ? i : ws->devices[i];
            int k = ws->n_devices == QDD_CUDA_ALL ? per_all : (ws->per_device[i] > 0 ? ws->per_device[i] : 1);
            for (int c = 0; c < k; c++) {
                if (n == QDD_MAX_WORKERS) return qd_err_set(err, QD_EINVAL, "--workers: more than %d workers", QDD_MAX_WORKERS);
                devs[n] = dev;
                copy[n++] = c;
            }
        }
    }
    if (n <= 0 || n > QDD_MAX_WORKERS) return qd_err_set(err, QD_EINVAL, "--workers: no workers to run");
    d->workers = calloc((size_t)n, sizeof *d->workers);
    if (!d->workers) return qd_err_set(err, QD_ENOMEM, "out of memory");
    d->n_workers = n;
    for (int i = 0; i < n; i++) {
        qdd_worker *w = &d->workers[i];
        w->d = d;
        w->index = i;
        if (ws->kind == QDD_WORKERS_CPU) {
            snprintf(w->name, sizeof w->name, "cpu-%d", i);
            snprintf(w->backend, sizeof w->backend, "cpu");
        } else {
            /* The first on a device keeps the name it had alone (cuda-0); the others are
             * cuda-0.1, cuda-0.2, ... */
            if (copy[i]) snprintf(w->name, sizeof w->name, "cuda-%d.%d", devs[i], copy[i]);
            else snprintf(w->name, sizeof w->name, "cuda-%d", devs[i]);
            snprintf(w->backend, sizeof w->backend, "cuda:%d", devs[i]);
        }
        uv_timer_init(d->loop, &w->restart);
        w->restart.data = w;
        spawn(w);
    }
    return 0;
}

typedef struct wreq {
    uv_write_t req;
    uint8_t *frame;
} wreq;

static void on_written(uv_write_t *req, int status)
{
    wreq *r = (wreq *)req;
    free(r->frame);
    free(r);
}

static int send_msg(qdd_worker *w, const qp_msg *m)
{
    if (w->exited || (w->state != QDD_W_IDLE && w->state != QDD_W_BUSY && w->state != QDD_W_STARTING)) return -1;
    wreq *r = calloc(1, sizeof *r);
    size_t n = 0;
    qp_err pe = {0};
    if (!r || qp_wire_encode(m, &r->frame, &n, &pe)) {
        QD_LOG(QD_LOG_ERROR, "worker_send", "worker=%s err=\"%s\"", w->name, pe.msg);
        free(r);
        return -1;
    }
    uv_buf_t b = uv_buf_init((char *)r->frame, (unsigned)n);
    if (uv_write(&r->req, (uv_stream_t *)&w->in, &b, 1, on_written)) {
        free(r->frame);
        free(r);
        return -1;
    }
    return 0;
}

int qdd_pool_send_task(qdd_worker *w, qdd_job *j, int block)
{
    char ckpt[4200];
    snprintf(ckpt, sizeof ckpt, "%s/.quantd", j->job->output);
    qp_msg m;
    qp_msg_init(&m, QP_MSG_TASK);
    m.task.job_id = j->id;
    m.task.job = j->payload;
    m.task.block = block;
    m.task.checkpoint_dir = ckpt;
    m.task.fence = j->fence;
    /* Parts need another worker to go to, here or on a node that offers its workers
     * (remote-parts): with none, the lead keeps them in memory. */
    m.task.fanout = j->job->workers != 1 && (w->d->n_workers > 1 || w->d->remote_nodes > 0);
    if (send_msg(w, &m)) return -1;
    w->state = QDD_W_BUSY;
    w->job = j;
    w->cancel_sent_s = 0;
    w->block = block;
    j->refs++;
    QD_LOG(QD_LOG_DEBUG, "task_sent", "worker=%s job=%s block=%d fence=%llu", w->name, j->id, block,
           (unsigned long long)j->fence);
    return 0;
}

int qdd_pool_send_part_msg(qdd_worker *w, const char *job_id, const char *spec, const char *ckpt, int block,
                           const char *step, int index, uint64_t fence)
{
    qp_msg m;
    qp_msg_init(&m, QP_MSG_PART);
    m.part.job_id = (char *)job_id;
    m.part.job = (char *)spec;
    m.part.checkpoint_dir = (char *)ckpt;
    m.part.block = block;
    m.part.step = (char *)step;
    m.part.index = index;
    m.part.fence = fence;
    if (send_msg(w, &m)) return -1;
    QD_LOG(QD_LOG_DEBUG, "part_sent", "worker=%s job=%s block=%d step=%s part=%d", w->name, job_id, block, step, index);
    return 0;
}

int qdd_pool_send_part(qdd_worker *w, qdd_job *j, int block, const char *step, int index)
{
    char ckpt[4200];
    snprintf(ckpt, sizeof ckpt, "%s/.quantd", j->job->output);
    qp_msg m;
    qp_msg_init(&m, QP_MSG_PART);
    m.part.job_id = j->id;
    m.part.job = j->payload;
    m.part.checkpoint_dir = ckpt;
    m.part.block = block;
    m.part.step = (char *)step;
    m.part.index = index;
    m.part.fence = j->fence;
    if (w->part_job || send_msg(w, &m)) return -1;
    w->state = QDD_W_BUSY;   /* the lead already is, with its task */
    w->part_job = j;
    w->part_block = block;
    w->part_index = index;
    j->refs++;
    QD_LOG(QD_LOG_DEBUG, "part_sent", "worker=%s job=%s block=%d step=%s part=%d", w->name, j->id, block, step, index);
    return 0;
}

int qdd_pool_send_parts_done(qdd_worker *w, const char *job_id, int block, const char *step)
{
    qp_msg m;
    qp_msg_init(&m, QP_MSG_PARTS_DONE);
    m.parts_done.job_id = (char *)job_id;
    m.parts_done.block = block;
    m.parts_done.step = (char *)step;
    return send_msg(w, &m);
}

int qdd_pool_send_part_stop(qdd_worker *w, const char *job_id, int block, const char *step, int index)
{
    qp_msg m;
    qp_msg_init(&m, QP_MSG_PART_STOP);
    m.part_stop.job_id = (char *)job_id;
    m.part_stop.block = block;
    m.part_stop.step = (char *)step;
    m.part_stop.index = index;
    return send_msg(w, &m);
}

int qdd_pool_send_cancel(qdd_worker *w, const char *job_id, const char *reason)
{
    qp_msg m;
    qp_msg_init(&m, QP_MSG_CANCEL);
    m.cancel.job_id = (char *)job_id;
    m.cancel.reason = (char *)reason;
    if (w->job && w->cancel_sent_s == 0) w->cancel_sent_s = qd_clock_now_s();
    return send_msg(w, &m);
}

void qdd_pool_shutdown(qdd_daemon *d)
{
    for (int i = 0; i < d->n_workers; i++) {
        qdd_worker *w = &d->workers[i];
        uv_timer_stop(&w->restart);
        if (w->state == QDD_W_DOWN || w->exited) continue;
        qp_msg m;
        qp_msg_init(&m, QP_MSG_SHUTDOWN);
        m.shutdown.graceful = 1;
        send_msg(w, &m);
    }
}

int qdd_pool_all_down(const qdd_daemon *d)
{
    for (int i = 0; i < d->n_workers; i++)
        if (d->workers[i].open_handles > 0) return 0;
    return 1;
}

void qdd_pool_watchdog(qdd_daemon *d)
{
    double now = qd_clock_now_s(), limit = 3.0 * (double)d->cfg->heartbeat_s;
    for (int i = 0; i < d->n_workers; i++) {
        qdd_worker *w = &d->workers[i];
        if (w->exited || w->state == QDD_W_DOWN || w->state == QDD_W_DEAD || w->state == QDD_W_FAILED) continue;
        if (w->state == QDD_W_STARTING && now - w->started_s > HELLO_TIMEOUT_S)
            qdd_pool_kill(w, "sent no hello within 60 s");
        else if (w->state != QDD_W_STARTING && now - w->last_msg_s > limit)
            qdd_pool_kill(w, "stopped sending heartbeats");
        /* A worker blocked in I/O (a slow or hung file system) cannot see a cancel: after
         * the grace period the daemon ends it, and the job ends cancelled. */
        else if (w->job && w->cancel_sent_s > 0 && now - w->cancel_sent_s > (double)d->cfg->cancel_grace_s) {
            char why[96];
            snprintf(why, sizeof why, "did not stop within %lld s of a cancel", (long long)d->cfg->cancel_grace_s);
            qdd_pool_kill(w, why);
        }
    }
}

void qdd_pool_free(qdd_daemon *d)
{
    for (int i = 0; i < d->n_workers; i++)
        if (d->workers[i].rpart) qdd_nparts_worker_gone(d, &d->workers[i]);   /* its claim lapses */
    free(d->workers);
    d->workers = NULL;
    d->n_workers = 0;
}
