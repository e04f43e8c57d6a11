/* The worker process's threads and task runner (see worker.h): a reader thread that turns
 * stdin into queued tasks and parts and immediate cancel/shutdown flags, a heartbeat thread,
 * and the main thread running quant/pipeline with progress forwarded to the daemon; parts
 * (a block's step fanned out over workers) are in worker_parts.c. */
#define _GNU_SOURCE
#include "quant/core/confine.h"
#include "quant/core/clock.h"
#include "workers/worker.h"
#include "workers/worker_internal.h"
#include "quant/kernels/selftest.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "proto/wire.h"
#include "quant/backend/backend.h"
#include "quant/core/fsutil.h"
#include "quant/core/log.h"
#include "quant/core/rss.h"
#include "quant/job/job.h"
#include "quant/pipeline/pipeline.h"
#include "quant/pipeline/state.h"

#define QW_REPORT_MAX (256 * 1024)   /* a report larger than this is not forwarded */
/* Seconds idle after which a worker closes what parts keep open between them: the model's
 * files, then the block capture parts keep loaded. */
#define QW_IDLE_S 10
#define QW_BLOCK_IDLE_S 60

static int64_t unix_ms(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000;
}

static int64_t rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, rss = 0;
    if (!f) return 0;
    if (fscanf(f, "%ld %ld", &pages, &rss) != 2) rss = 0;
    fclose(f);
    return (int64_t)rss * sysconf(_SC_PAGESIZE);
}

int qw_error_retryable(int code)
{
    switch (code) {
    case QD_EIO: case QD_ENOMEM: case QD_EBACKEND: case QD_ERESOURCE: return 1;
    default: return 0;   /* the job itself is at fault: a retry would fail the same way */
    }
}

int qw_send_msg(qw_worker *w, const qp_msg *m)
{
    uint8_t *frame = NULL;
    size_t n = 0;
    qp_err pe = {0};
    if (qp_wire_encode(m, &frame, &n, &pe)) {
        QD_LOG(QD_LOG_ERROR, "worker_encode", "type=%s err=\"%s\"", qp_msg_type_name(m->type), pe.msg);
        return QD_EINVAL;
    }
    int rc = 0;
    pthread_mutex_lock(&w->out_lock);
    for (size_t off = 0; off < n && !w->out_broken;) {
        ssize_t k = write(w->o->out_fd, frame + off, n - off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) { w->out_broken = 1; break; }
        off += (size_t)k;
    }
    if (w->out_broken) rc = QD_EIO;
    pthread_mutex_unlock(&w->out_lock);
    free(frame);
    return rc;
}

static void send_failed(qw_worker *w, const char *job_id, int code, const char *why, int retryable,
                        int cancelled)
{
    qp_msg m;
    qp_msg_init(&m, QP_MSG_TASK_FAILED);
    m.task_failed.job_id = (char *)job_id;
    m.task_failed.error = (char *)(why && *why ? why : qd_strerror(code));
    m.task_failed.code = code;
    m.task_failed.retryable = retryable;
    m.task_failed.cancelled = cancelled;
    m.task_failed.exiting = w->device_lost;   /* set before the reply: the daemon sends no more */
    qw_send_msg(w, &m);
}

/* ---- reader thread -------------------------------------------------------------- */

const char *qw_queued_job_id(const qp_msg *m)
{
    return m->type == QP_MSG_PART ? m->part.job_id : m->task.job_id;
}

static void handle_msg(qw_worker *w, qp_msg *m)
{
    pthread_mutex_lock(&w->lock);
    switch (m->type) {
    case QP_MSG_TASK:
    case QP_MSG_PART:
        if (w->n_queued == QW_MAX_QUEUED || w->shutdown) {
            const char *why = w->shutdown ? "worker is shutting down" : "worker task queue is full";
            pthread_mutex_unlock(&w->lock);
            if (m->type == QP_MSG_TASK) send_failed(w, m->task.job_id, QD_ERESOURCE, why, 1, 0);
            else qw_part_refuse(w, &m->part, why);
            qp_msg_clear(m);
            return;
        }
        w->queue[w->n_queued++].msg = *m;   /* the queue takes the strings */
        memset(m, 0, sizeof *m);
        pthread_cond_broadcast(&w->cond);
        break;
    case QP_MSG_PARTS_DONE:
        qw_parts_done_seen(w, &m->parts_done);
        break;
    case QP_MSG_PART_STOP:
        qw_part_stop(w, &m->part_stop);
        break;
    case QP_MSG_CANCEL: {
        if (!strcmp(w->current, m->cancel.job_id)) atomic_store(&w->cancel, 1);
        pthread_cond_broadcast(&w->cond);   /* a task waiting on its fan-out stops waiting */
        /* Queued tasks and parts of that job end at once, each with its own reply. */
        for (int i = 0; i < w->n_queued;) {
            if (strcmp(qw_queued_job_id(&w->queue[i].msg), m->cancel.job_id)) { i++; continue; }
            qp_msg t = w->queue[i].msg;
            memmove(&w->queue[i], &w->queue[i + 1], (size_t)(w->n_queued - i - 1) * sizeof w->queue[0]);
            w->n_queued--;
            pthread_mutex_unlock(&w->lock);
            if (t.type == QP_MSG_TASK) send_failed(w, t.task.job_id, QD_ECANCELLED, "cancelled before it started", 0, 1);
            else qw_part_refuse(w, &t.part, "cancelled before it started");
            qp_msg_clear(&t);
            pthread_mutex_lock(&w->lock);
        }
        break;
    }
    case QP_MSG_SHUTDOWN:
        w->shutdown = 1;
        w->graceful = m->shutdown.graceful;
        if (!w->graceful) {
            /* "Exit now": checkpoints are written atomically, so stopping mid-block loses
             * only the block in progress. */
            QD_LOG(QD_LOG_INFO, "worker_exit", "name=%s reason=shutdown", w->o->name);
            _exit(0);
        }
        pthread_cond_broadcast(&w->cond);
        break;
    default:
        QD_LOG(QD_LOG_WARN, "worker_ignored", "name=%s type=%s", w->o->name, qp_msg_type_name(m->type));
        break;
    }
    pthread_mutex_unlock(&w->lock);
    qp_msg_clear(m);
}

static void *reader_main(void *arg)
{
    qw_worker *w = arg;
    qp_wire_decoder d;
    qp_wire_decoder_init(&d, 0);
    char buf[65536];
    for (;;) {
        /* Wait for input or for the main thread's stop byte, so the reader can be
         * joined (and everything freed) even while the daemon keeps our stdin open. */
        struct pollfd pf[2] = {{w->o->in_fd, POLLIN, 0}, {w->stop_pipe[0], POLLIN, 0}};
        if (poll(pf, 2, -1) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (pf[1].revents) break;
        ssize_t n = read(w->o->in_fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        qp_err pe = {0};
        if (qp_wire_decoder_feed(&d, buf, (size_t)n, &pe)) {
            qd_err_set(&w->reader_err, QD_EFORMAT, "stdin: %s", pe.msg);
            break;
        }
        for (;;) {
            qp_msg m;
            int rc = qp_wire_decoder_next(&d, &m, &pe);
            if (rc == 0) break;
            if (rc > 0) { handle_msg(w, &m); continue; }
            if (qp_wire_decoder_broken(&d)) {
                qd_err_set(&w->reader_err, QD_EFORMAT, "stdin: %s", pe.msg);
                goto done;
            }
            QD_LOG(QD_LOG_WARN, "worker_bad_message", "name=%s err=\"%s\"", w->o->name, pe.msg);
        }
    }
done:
    qp_wire_decoder_free(&d);
    pthread_mutex_lock(&w->lock);
    w->eof = 1;
    /* Without the daemon nobody will read our results: stop the task at the next safe point. */
    if (w->current[0]) atomic_store(&w->cancel, 1);
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

/* ---- heartbeat thread ------------------------------------------------------------- */

static void *heartbeat_main(void *arg)
{
    qw_worker *w = arg;
    int interval = w->o->heartbeat_ms > 0 ? w->o->heartbeat_ms : 2000;
    pthread_mutex_lock(&w->lock);
    while (!w->hb_stop) {
        char job[QP_JOB_ID_MAX + 1];
        snprintf(job, sizeof job, "%s", w->current);
        pthread_mutex_unlock(&w->lock);
        qp_msg m;
        qp_msg_init(&m, QP_MSG_HEARTBEAT);
        m.heartbeat.t_ms = unix_ms();
        m.heartbeat.job_id = job[0] ? job : NULL;
        m.heartbeat.rss_bytes = rss_bytes();
        qw_send_msg(w, &m);
        pthread_mutex_lock(&w->lock);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += interval / 1000;
        ts.tv_nsec += (long)(interval % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        while (!w->hb_stop && pthread_cond_timedwait(&w->cond, &w->lock, &ts) != ETIMEDOUT) {}
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

/* ---- tasks -------------------------------------------------------------------------- */

static int on_progress(void *ud, const qd_progress *p)
{
    qw_worker *w = ud;
    qp_msg m;
    qp_msg_init(&m, QP_MSG_PROGRESS);
    m.progress.job_id = (char *)(p->job_id ? p->job_id : w->current);
    m.progress.stage = (char *)(p->stage ? p->stage : "quantize");
    m.progress.block = p->block;
    m.progress.n_blocks = p->n_blocks > 0 ? p->n_blocks : 0;
    m.progress.layer = (char *)p->layer;
    m.progress.fraction = p->fraction < 0 ? 0 : p->fraction > 1 ? 1 : p->fraction;
    m.progress.eta_s = p->eta_s;
    m.progress.layer_error = p->layer_error;
    qw_send_msg(w, &m);
    return atomic_load(&w->cancel) || w->out_broken;
}

/* Fencing (proto/redis.md): the commit is refused when the checkpoint on disk was written
 * under a newer lease, i.e. another node reclaimed the job while this one was cut off. */
static int before_commit(void *ud, int block)
{
    qw_worker *w = ud;
    if (!w->pipe_job || !w->pipe_fence) return 0;
    char path[4096];
    snprintf(path, sizeof path, "%s/.quantd/state.json", w->pipe_job->output);
    qd_ckpt_state s;
    qd_err err = {0};
    int refuse = 0;
    if (qd_state_load(path, &s, &err) == 0 && s.fence > w->pipe_fence) {
        QD_LOG(QD_LOG_WARN, "commit_refused", "job=%s block=%d fence=%llu disk_fence=%llu", w->pipe_job->id, block,
               (unsigned long long)w->pipe_fence, (unsigned long long)s.fence);
        refuse = 1;
    }
    qd_state_free(&s);
    return refuse;
}

static void pipe_drop(qw_worker *w)
{
    qd_pipeline_close(w->pipe);
    qp_job_free(w->pipe_job);
    free(w->pipe_spec);
    w->pipe = NULL;
    w->pipe_job = NULL;
    w->pipe_spec = NULL;
}

/* The report summary for task_done: quantd_report.json when it is a reasonable size. */
static char *read_report(const char *out_dir)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/quantd_report.json", out_dir);
    char *text = NULL;
    size_t len = 0;
    qd_err err = {0};
    /* Through the output's descriptor (qd_pipeline_out_dir): never a file planted under the
     * output's name meanwhile. */
    if (qd_input_read(path, QD_INPUT_JSON, &text, &len, &err) || len > QW_REPORT_MAX) {
        free(text);
        return NULL;
    }
    cJSON *j = cJSON_ParseWithLength(text, len);
    free(text);
    if (!cJSON_IsObject(j)) { cJSON_Delete(j); return NULL; }
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    return s;
}

static void send_block_done(qw_worker *w, const qp_msg_task *t, int block, int n_blocks, double secs)
{
    qp_msg m;
    qp_msg_init(&m, QP_MSG_BLOCK_DONE);
    m.block_done.job_id = t->job_id;
    m.block_done.block = block;
    m.block_done.n_blocks = n_blocks;
    m.block_done.seconds = secs;
    m.block_done.fence = t->fence;
    m.block_done.cost = qd_pipeline_last_block_cost(w->pipe);   /* NULL (left out) when out of memory */
    qw_send_msg(w, &m);
    free(m.block_done.cost);
}

int qw_job_parse(qw_worker *w, const char *spec, const char *job_id, const char *what, qp_job **out, qd_err *err)
{
    *out = NULL;
    qp_err pe = {0};
    qp_job *job = NULL;
    if (qp_job_parse(spec, strlen(spec), &job, &pe)) return qd_err_set(err, QD_EINVAL, "%s", pe.msg);
    if (strcmp(job->id, job_id)) {
        qd_err_set(err, QD_EINVAL, "%s.job_id '%s' differs from the job spec's id '%s'", what, job_id, job->id);
        qp_job_free(job);
        return QD_EINVAL;
    }
    if ((job->backend == QP_BACKEND_CUDA && strcmp(w->be->name, "cuda")) ||
        (job->backend == QP_BACKEND_CPU && strcmp(w->be->name, "cpu"))) {
        /* Another worker can run it, so the scheduler may retry it there. */
        qd_err_set(err, QD_ERESOURCE, "job asks for backend %s but this worker runs %s", qp_backend_name(job->backend),
                   w->be->name);
        qp_job_free(job);
        return QD_ERESOURCE;
    }
    *out = job;
    return 0;
}

/* Opens the pipeline for t, or keeps the one already open when t continues its job. */
static int task_open(qw_worker *w, const qp_msg_task *t, qd_err *err)
{
    if (w->pipe && w->pipe_spec && !strcmp(w->pipe_spec, t->job) && w->pipe_fence == t->fence &&
        (t->block == QP_TASK_WHOLE_JOB || t->block == qd_pipeline_next_block(w->pipe))) {
        /* Whether this block may fan out is the task's to say (workers of other nodes may
         * have come or gone since the last one). */
        int fan = t->fanout && w->pipe_job->workers != 1;
        qd_pipeline_set_fanout(w->pipe, fan ? qw_fanout : NULL, w->o->name);
        return 0;
    }
    pipe_drop(w);
    qp_job *job = NULL;
    int rc = qw_job_parse(w, t->job, t->job_id, "task", &job, err);
    if (rc) return rc;
    qd_pipeline_hooks hooks = {.ud = w, .progress = on_progress, .before_commit = before_commit,
                               .fence = t->fence};
    /* A job that may use more than this worker fans its blocks' steps out through the daemon
     * (worker_parts.c) when the daemon says there are others (task.fanout, the node's own
     * workers or another node's); with workers 1, or alone, the pipeline runs every part
     * itself, in memory. */
    if (t->fanout && job->workers != 1) {
        hooks.fanout = qw_fanout;
        hooks.worker = w->o->name;
    }
    qd_pipeline *p = NULL;
    if ((rc = qd_pipeline_open(job, w->be, &hooks, &p, err))) {
        qp_job_free(job);
        return rc;
    }
    if (!(w->pipe_spec = strdup(t->job))) {
        qd_pipeline_close(p);
        qp_job_free(job);
        return qd_err_set(err, QD_ENOMEM, "out of memory");
    }
    w->pipe = p;
    w->pipe_job = job;   /* the pipeline borrows it */
    w->pipe_fence = t->fence;
    return 0;
}

static int stop_requested(qw_worker *w)
{
    pthread_mutex_lock(&w->lock);
    int stop = w->shutdown || w->eof;
    pthread_mutex_unlock(&w->lock);
    return stop;
}

/* After a failed task or part: when the backend reports a device error (be->broken, any CUDA
 * error, sticky or not), the failure becomes a retryable QD_EBACKEND whose message carries
 * the backend's own (call, file, line, device), and the worker is marked to exit after
 * replying, so the daemon starts a fresh process with a fresh context instead of running
 * the next task on a broken one. Returns the code to report. */
int qw_device_check(qw_worker *w, int rc, qd_err *err, int *retryable)
{
    if (!w->be || !w->be->broken) return rc;
    if (!w->device_lost)
        QD_LOG(QD_LOG_ERROR, "worker_device_error", "name=%s backend=%s err=\"%s\"", w->o->name, w->o->backend,
               w->be->err.msg);
    w->device_lost = 1;
    if (!strstr(err->msg, w->be->err.msg)) {
        char first[QD_ERR_MSG_MAX];
        snprintf(first, sizeof first, "%s", err->msg);
        qd_err_set(err, QD_EBACKEND, "%.200s [device error: %.280s]", first, w->be->err.msg);
    }
    *retryable = 1;
    return QD_EBACKEND;
}

static void task_run(qw_worker *w, const qp_msg_task *t)
{
    qd_err err = {0};
    int rc = task_open(w, t, &err);
    int n = rc ? 0 : qd_pipeline_n_blocks(w->pipe);
    int behind = 0;   /* the checkpoint is behind the task: retrying later is right */
    if (!rc && t->block != QP_TASK_WHOLE_JOB) {
        int next = qd_pipeline_next_block(w->pipe);
        if (t->block >= n) {
            rc = qd_err_set(&err, QD_EINVAL, "task.block %d is past the model's %d blocks", t->block, n);
        } else if (t->block > next) {
            /* The checkpoint is behind: the daemon's view is stale; another try after it
             * catches up (or a whole-job task) will do. */
            rc = qd_err_set(&err, QD_EMISMATCH, "task.block %d, but the checkpoint's next block is %d",
                            t->block, next);
            behind = 1;
        }
    }
    /* Run the asked block (or every remaining one); a block already committed (a retried
     * task whose first run died after the commit) is not run again. */
    while (!rc && qd_pipeline_next_block(w->pipe) < n &&
           (t->block == QP_TASK_WHOLE_JOB || qd_pipeline_next_block(w->pipe) <= t->block)) {
        int b = qd_pipeline_next_block(w->pipe);
        double t0 = qd_clock_now_s();
        if ((rc = qd_pipeline_run_block(w->pipe, &err))) break;
        send_block_done(w, t, b, n, qd_clock_now_s() - t0);
        if (t->block == QP_TASK_WHOLE_JOB && qd_pipeline_next_block(w->pipe) < n && stop_requested(w)) {
            rc = qd_err_set(&err, QD_ECANCELLED, "worker is shutting down after block %d", b);
            break;
        }
    }
    if (rc) {
        int cancelled = rc == QD_ECANCELLED && atomic_load(&w->cancel);
        int retryable = cancelled ? 0 : (rc == QD_ECANCELLED || behind) ? 1 : qw_error_retryable(rc);
        if (!cancelled) rc = qw_device_check(w, rc, &err, &retryable);
        else if (w->be && w->be->broken) w->device_lost = 1;   /* cancelled, but still exit */
        QD_LOG(QD_LOG_WARN, "task_failed", "job=%s block=%d code=%d retryable=%d err=\"%s\"", t->job_id, t->block,
               rc, retryable, err.msg);
        send_failed(w, t->job_id, rc, err.msg, retryable, cancelled);
        pipe_drop(w);   /* after a failure the in-memory state is not trusted */
        return;
    }
    qp_msg m;
    qp_msg_init(&m, QP_MSG_TASK_DONE);
    m.task_done.job_id = t->job_id;
    if (qd_pipeline_next_block(w->pipe) < n) {
        m.task_done.job_finished = 0;
        qw_send_msg(w, &m);
        return;
    }
    if ((rc = qd_pipeline_finish(w->pipe, &err))) {
        int retryable = qw_error_retryable(rc);
        rc = qw_device_check(w, rc, &err, &retryable);
        send_failed(w, t->job_id, rc, err.msg, retryable, 0);
        pipe_drop(w);
        return;
    }
    char *report = read_report(qd_pipeline_out_dir(w->pipe));
    m.task_done.job_finished = 1;
    m.task_done.output = w->pipe_job->output;
    m.task_done.report = report;
    qw_send_msg(w, &m);
    free(report);
    pipe_drop(w);
}

static int send_hello(qw_worker *w, int selftest_ok, const char *selftest)
{
    char device[128];
    if (w->be && !strcmp(w->be->name, "cpu"))
        snprintf(device, sizeof device, "cpu: %d threads", w->be->n_threads);
    else
        snprintf(device, sizeof device, "%s", w->o->backend);
    qp_msg m;
    qp_msg_init(&m, QP_MSG_HELLO);
    m.hello.worker = (char *)w->o->name;
    m.hello.pid = getpid();
    m.hello.backend = (char *)(w->be ? w->be->name : (strncmp(w->o->backend, "cuda", 4) ? "cpu" : "cuda"));
    m.hello.device = device;
    m.hello.protocol = QP_WIRE_VERSION;
    m.hello.selftest_ok = selftest_ok;
    m.hello.selftest = (char *)selftest;
    return qw_send_msg(w, &m);
}

int qw_worker_run(const qw_opts *o, qd_err *err)
{
    qw_worker *w = calloc(1, sizeof *w);
    if (!w) return qd_err_set(err, QD_ENOMEM, "out of memory");
    w->o = o;
    pthread_mutex_init(&w->out_lock, NULL);
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->cond, NULL);
    pthread_t reader, hb;
    int have_reader = 0, have_hb = 0, rc;
    if (pipe(w->stop_pipe) != 0) {
        free(w);
        return qd_err_set(err, QD_EIO, "pipe: %s", strerror(errno));
    }

    qd_err berr = {0};
    if ((rc = qd_backend_open(o->backend, o->rt, &w->be, &berr))) {
        /* Tell the daemon why before leaving, so it logs the reason rather than a crash. */
        send_hello(w, 0, berr.msg);
        qd_err_set(err, rc, "backend %s: %s", o->backend, berr.msg);
        goto out;
    }
    /* The quick kernel self-test (a fraction of a second): a worker whose kernels disagree
     * with the reference says so in its hello and takes no work. */
    qd_selftest_report rep;
    qd_err terr = {0};
    memset(&rep, 0, sizeof rep);
    int st_rc = qd_selftest_run(w->be, 1, NULL, &rep, &terr);
    char summary[384];
    if (st_rc == 0)
        snprintf(summary, sizeof summary, "%s: %d kernel cases passed; copy %.1f GB/s, batch-1 kernel %.2f GB/s",
                 rep.device, rep.cases, rep.copy_gbps, rep.gemv_gbps);
    else
        snprintf(summary, sizeof summary, "%s: %d of %d kernel cases failed: %.200s", rep.device, rep.failures, rep.cases,
                 rep.first_failure[0] ? rep.first_failure : terr.msg);
    QD_LOG(st_rc ? QD_LOG_ERROR : QD_LOG_INFO, "worker_selftest", "name=%s ok=%d summary=\"%s\"", o->name, st_rc == 0, summary);
    if ((rc = send_hello(w, st_rc == 0, summary))) {
        qd_err_set(err, rc, "stdout: the daemon is gone");
        goto out;
    }
    if (st_rc) {
        rc = qd_err_set(err, QD_EBACKEND, "kernel self-test failed: %s", summary);
        goto out;
    }
    if (pthread_create(&reader, NULL, reader_main, w)) { rc = qd_err_set(err, QD_ENOMEM, "cannot start a thread"); goto out; }
    have_reader = 1;
    if (pthread_create(&hb, NULL, heartbeat_main, w)) { rc = qd_err_set(err, QD_ENOMEM, "cannot start a thread"); goto out; }
    have_hb = 1;

    for (;;) {
        pthread_mutex_lock(&w->lock);
        /* Idle for QW_IDLE_S: the model's files parts keep open between them are closed; for
         * QW_BLOCK_IDLE_S, the block capture parts keep loaded too (held 2, 1, then 0). Each
         * time, what the allocator keeps freed for the next part goes back to the system
         * (qst_malloc_tune). */
        struct timespec files_until, block_until;
        clock_gettime(CLOCK_REALTIME, &files_until);
        block_until = files_until;
        files_until.tv_sec += QW_IDLE_S;
        block_until.tv_sec += QW_BLOCK_IDLE_S;
        for (int held = 2; !w->n_queued && !w->eof && !w->shutdown;) {
            if (!held) { pthread_cond_wait(&w->cond, &w->lock); continue; }
            const struct timespec *until = held == 2 ? &files_until : &block_until;
            if (pthread_cond_timedwait(&w->cond, &w->lock, until) != ETIMEDOUT || w->n_queued) continue;
            pthread_mutex_unlock(&w->lock);
            if (held == 2) qd_pipeline_part_idle_files();
            else qd_pipeline_part_idle();
            qd_rss_release();
            pthread_mutex_lock(&w->lock);
            held--;
        }
        if (!w->n_queued || w->eof || w->shutdown) {
            pthread_mutex_unlock(&w->lock);
            break;
        }
        qp_msg t = w->queue[0].msg;
        memmove(&w->queue[0], &w->queue[1], (size_t)(w->n_queued - 1) * sizeof w->queue[0]);
        w->n_queued--;
        snprintf(w->current, sizeof w->current, "%s", qw_queued_job_id(&t));
        atomic_store(&w->cancel, 0);
        pthread_mutex_unlock(&w->lock);

        if (t.type == QP_MSG_PART) {
            qw_part_run(w, &t.part, 1);   /* a helper's part: one reply, part_done */
        } else {
            QD_LOG(QD_LOG_INFO, "task_start", "worker=%s job=%s block=%d", o->name, t.task.job_id, t.task.block);
            task_run(w, &t.task);
        }

        pthread_mutex_lock(&w->lock);
        w->current[0] = 0;
        pthread_mutex_unlock(&w->lock);
        qp_msg_clear(&t);
        if (w->device_lost) {
            /* Style rule 5: a CUDA error recycles that GPU's worker process. Tasks still
             * queued here are the daemon's to hand out again when it sees the exit. */
            rc = qd_err_set(err, QD_EBACKEND, "device error on %s, exiting so the daemon starts a fresh worker: %s",
                            o->backend, w->be->err.msg);
            goto out;
        }
    }
    rc = 0;
    if (w->reader_err.code) {
        *err = w->reader_err;
        rc = w->reader_err.code;
    }
out:
    pthread_mutex_lock(&w->lock);
    w->hb_stop = 1;
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->lock);
    if (have_hb) pthread_join(hb, NULL);
    if (have_reader) {
        ssize_t wr = write(w->stop_pipe[1], "x", 1);
        (void)wr;
        pthread_join(reader, NULL);
    }
    pipe_drop(w);
    qw_parts_free(w);
    qd_pipeline_part_idle();
    qd_backend_close(w->be);
    for (int i = 0; i < w->n_queued; i++) qp_msg_clear(&w->queue[i].msg);
    close(w->stop_pipe[0]);
    close(w->stop_pipe[1]);
    free(w);
    return rc;
}
