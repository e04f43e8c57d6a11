/* Parts of a block's step fanned out over workers (proto/wire.md, the parts messages).
 *
 * Two roles. Any worker runs a `part` message it is given: the job spec is parsed once and
 * kept while the parts of one job come (a helper gets many in a row), the part runs through
 * qd_pipeline_part_run, and the reply is one part_done, ok or not; a device error still makes
 * the worker exit after the reply (worker.c checks device_lost). The lead, running the job's
 * task, gets the pipeline's fan-out hook: it announces the parts (`parts`), then runs the
 * `part` messages of its job on the main thread as the daemon sends them, until `parts_done`
 * says no part runs anywhere any more; a cancel or the end of stdin ends the wait with
 * nonzero, and the pipeline stops the task. Heartbeats go on meanwhile from their own thread.
 * A part that fails here, or never runs, costs time only: the pipeline reads every output
 * back and computes what is missing itself. */
#include "workers/worker_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "quant/core/log.h"

void qw_parts_free(qw_worker *w)
{
    qp_job_free(w->part_job);
    free(w->part_spec);
    w->part_job = NULL;
    w->part_spec = NULL;
}

/* The parsed job of p, from the cache when the spec is the one of the previous part. */
static const qp_job *part_job(qw_worker *w, const qp_msg_part *p, qd_err *err)
{
    if (w->part_job && w->part_spec && !strcmp(w->part_spec, p->job)) return w->part_job;
    qw_parts_free(w);
    qp_job *job = NULL;
    if (qw_job_parse(w, p->job, p->job_id, "part", &job, err)) return NULL;
    if (!(w->part_spec = strdup(p->job))) {
        qp_job_free(job);
        qd_err_set(err, QD_ENOMEM, "out of memory");
        return NULL;
    }
    w->part_job = job;
    return job;
}

static void send_part_done(qw_worker *w, const qp_msg_part *p, int ok, const char *error, double seconds)
{
    qp_msg m;
    qp_msg_init(&m, QP_MSG_PART_DONE);
    m.part_done.job_id = p->job_id;
    m.part_done.block = p->block;
    m.part_done.step = p->step;
    m.part_done.index = p->index;
    m.part_done.ok = ok;
    m.part_done.error = ok ? NULL : (char *)(error && *error ? error : "failed");
    m.part_done.seconds = seconds >= 0 ? seconds : 0;
    qw_send_msg(w, &m);
}

#ifdef QUANTD_FAULT_HOOKS
/* Test hook (fault-hook builds only): with QUANTD_FAULT_PART_HOLD=PATH a helper holds every
 * part it is handed until PATH exists (or stdin ends, or a shutdown, cancel or part_stop comes), its
 * heartbeats going on meanwhile: a straggler as slow as a test needs, with no clock in the
 * test. With QUANTD_FAULT_PART_HOLD_DEAF=1 it hears neither cancel nor part_stop (both stay
 * set for the part's run): a helper whose report comes after its job has ended. */
void qw_fault_part_hold(qw_worker *w, const qp_msg_part *p)
{
    const char *path = getenv("QUANTD_FAULT_PART_HOLD");
    if (!path || !*path) return;
    const char *deaf_env = getenv("QUANTD_FAULT_PART_HOLD_DEAF");
    int deaf = deaf_env && !strcmp(deaf_env, "1");
    QD_LOG(QD_LOG_INFO, "fault_part_hold", "worker=%s job=%s block=%d part=%d deaf=%d (until %s exists)", w->o->name,
           p->job_id, p->block, p->index, deaf, path);
    pthread_mutex_lock(&w->lock);
    while (access(path, F_OK) != 0 && !w->eof && !w->shutdown &&
           (deaf || (!atomic_load(&w->cancel) && !atomic_load(&w->part_stop)))) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 20 * 1000 * 1000;
        if (until.tv_nsec >= 1000000000L) { until.tv_sec++; until.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&w->cond, &w->lock, &until);
    }
    pthread_mutex_unlock(&w->lock);
}
#endif

void qw_part_refuse(qw_worker *w, const qp_msg_part *p, const char *why)
{
    send_part_done(w, p, 0, why, 0);
}

static int part_is(const qw_worker *w, const char *job, int block, const char *step, int index)
{
    return !strcmp(w->run_job, job) && w->run_block == block && !strcmp(w->run_step, step) && w->run_index == index;
}

void qw_part_stop(qw_worker *w, const qp_msg_part_stop *m)
{
    if (w->run_part && part_is(w, m->job_id, m->block, m->step, m->index)) {
        atomic_store(&w->part_stop, 1);
        pthread_cond_broadcast(&w->cond);   /* a held part (the fault hook) stops waiting */
        return;
    }
    for (int i = 0; i < w->n_queued; i++) {
        const qp_msg *q = &w->queue[i].msg;
        if (q->type != QP_MSG_PART || strcmp(q->part.job_id, m->job_id) || q->part.block != m->block ||
            strcmp(q->part.step, m->step) || q->part.index != m->index)
            continue;
        qp_msg t = *q;
        memmove(&w->queue[i], &w->queue[i + 1], (size_t)(w->n_queued - i - 1) * sizeof w->queue[0]);
        w->n_queued--;
        pthread_mutex_unlock(&w->lock);
        qw_part_refuse(w, &t.part, "stopped before it started: another copy of it finished");
        qp_msg_clear(&t);
        pthread_mutex_lock(&w->lock);
        return;
    }
}

void qw_part_run(qw_worker *w, const qp_msg_part *p, int helper)
{
    qd_err err = {0};
    double secs = 0;
    pthread_mutex_lock(&w->lock);
    w->run_part = 1;
    snprintf(w->run_job, sizeof w->run_job, "%s", p->job_id);
    snprintf(w->run_step, sizeof w->run_step, "%s", p->step);
    w->run_block = p->block;
    w->run_index = p->index;
    atomic_store(&w->part_stop, 0);
    pthread_mutex_unlock(&w->lock);
#ifdef QUANTD_FAULT_HOOKS
    if (helper) qw_fault_part_hold(w, p);
#else
    (void)helper;
#endif
    int rc = QD_ECANCELLED;
    if (!atomic_load(&w->part_stop)) {
        const qp_job *job = part_job(w, p, &err);
        rc = job ? qd_pipeline_part_run(job, w->be, p->block, p->step, p->index, w->o->name, &w->part_stop, &secs, &err)
                 : err.code;
    }
    /* Stopped: GPTQ saw the flag; or the part, which had not (a capture part does not look),
     * failed on files the lead removed or replaced once the other copy was taken over. */
    int stopped = atomic_load(&w->part_stop) && (rc == QD_ECANCELLED || rc == QD_ENOTFOUND || rc == QD_EFORMAT);
    pthread_mutex_lock(&w->lock);
    w->run_part = 0;
    pthread_mutex_unlock(&w->lock);
    if (stopped) {
        QD_LOG(QD_LOG_INFO, "part_stopped", "worker=%s job=%s block=%d step=%s part=%d (another copy finished first)",
               w->o->name, p->job_id, p->block, p->step, p->index);
        send_part_done(w, p, 0, "stopped: another copy of it finished first", secs);
        return;
    }
    if (rc) {
        int retryable = 0;
        rc = qw_device_check(w, rc, &err, &retryable);
        QD_LOG(QD_LOG_WARN, "part_failed", "worker=%s job=%s block=%d step=%s part=%d code=%d err=\"%s\"", w->o->name,
               p->job_id, p->block, p->step, p->index, rc, err.msg);
    } else {
        QD_LOG(QD_LOG_INFO, "part_run", "worker=%s job=%s block=%d step=%s part=%d seconds=%.3f", w->o->name, p->job_id,
               p->block, p->step, p->index, secs);
    }
    send_part_done(w, p, rc == 0, err.msg, secs);
}

void qw_parts_done_seen(qw_worker *w, const qp_msg_parts_done *m)
{
    if (w->fan_active && !strcmp(w->current, m->job_id) && w->fan_block == m->block && !strcmp(w->fan_step, m->step)) {
        w->fan_done = 1;
        pthread_cond_broadcast(&w->cond);
        return;
    }
    QD_LOG(QD_LOG_WARN, "worker_ignored", "name=%s type=parts_done job=%s block=%d (no fan-out of it waits)", w->o->name,
           m->job_id, m->block);
}

/* The queue's first part of job (w->lock held), taken out into *out; 0 when there is none. */
static int take_part(qw_worker *w, const char *job, qp_msg *out)
{
    for (int i = 0; i < w->n_queued; i++) {
        if (w->queue[i].msg.type != QP_MSG_PART || strcmp(w->queue[i].msg.part.job_id, job)) continue;
        *out = w->queue[i].msg;
        memmove(&w->queue[i], &w->queue[i + 1], (size_t)(w->n_queued - i - 1) * sizeof w->queue[0]);
        w->n_queued--;
        return 1;
    }
    return 0;
}

int qw_fanout(void *ud, int block, const char *step, int n, const char *const *names)
{
    qw_worker *w = ud;
    if (!w->pipe_job || n < 1 || n > QP_PARTS_MAX || strlen(step) >= sizeof w->fan_step) return 0;
    char job[QP_JOB_ID_MAX + 1];
    snprintf(job, sizeof job, "%s", w->pipe_job->id);
    /* The names are for status only: a name over the wire's limit leaves them all out rather
     * than the fan-out. */
    int n_names = names ? n : 0;
    for (int i = 0; i < n_names; i++)
        if (!names[i] || strlen(names[i]) > QP_PART_NAME_MAX) n_names = 0;
    pthread_mutex_lock(&w->lock);
    w->fan_active = 1;   /* before the message: parts_done may come back at once */
    w->fan_done = 0;
    w->fan_block = block;
    snprintf(w->fan_step, sizeof w->fan_step, "%s", step);
    pthread_mutex_unlock(&w->lock);
    qp_msg m;
    qp_msg_init(&m, QP_MSG_PARTS);
    m.parts.job_id = job;
    m.parts.block = block;
    m.parts.step = (char *)step;
    m.parts.n = n;
    m.parts.names.v = (char **)names;
    m.parts.names.n = n_names;
    m.parts.fence = w->pipe_fence;
    int rc = 0, ran = 0;
    if (qw_send_msg(w, &m)) {
        /* Not sent: no part runs elsewhere, and the pipeline computes them all here. */
        rc = w->out_broken;
        pthread_mutex_lock(&w->lock);
        w->fan_active = 0;
        pthread_mutex_unlock(&w->lock);
        return rc;
    }
    QD_LOG(QD_LOG_INFO, "parts_sent", "worker=%s job=%s block=%d step=%s parts=%d", w->o->name, job, block, step, n);
    for (;;) {
        qp_msg part;
        pthread_mutex_lock(&w->lock);
        int got = 0;
        while (!w->fan_done && !atomic_load(&w->cancel) && !w->eof && !(got = take_part(w, job, &part)))
            pthread_cond_wait(&w->cond, &w->lock);
        if (!got) {
            rc = w->fan_done ? 0 : 1;   /* cancelled, or the daemon is gone */
            w->fan_active = 0;
            pthread_mutex_unlock(&w->lock);
            break;
        }
        pthread_mutex_unlock(&w->lock);
        qw_part_run(w, &part.part, 0);
        qp_msg_clear(&part);
        ran++;
        if (w->device_lost) {
            /* The task fails with the device error (worker.c) and the process exits. */
            pthread_mutex_lock(&w->lock);
            w->fan_active = 0;
            pthread_mutex_unlock(&w->lock);
            rc = 1;
            break;
        }
    }
    QD_LOG(QD_LOG_INFO, "parts_waited", "worker=%s job=%s block=%d step=%s parts=%d ran_here=%d stopped=%d", w->o->name, job,
           block, step, n, ran, rc);
    return rc;
}
