/* The worker process's state and the functions its files share (internal to workers/):
 * worker.c (threads, tasks, the main loop) and worker_parts.c (parts of a block's step run
 * for a fan-out, and the lead's fan-out hook). */
#ifndef QUANTD_WORKERS_WORKER_INTERNAL_H
#define QUANTD_WORKERS_WORKER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "proto/wire.h"
#include "quant/backend/backend.h"
#include "quant/core/error.h"
#include "quant/job/job.h"
#include "quant/pipeline/pipeline.h"
#include "workers/worker.h"

#define QW_MAX_QUEUED 8          /* the daemon sends one task or part at a time; a few spare slots */

typedef struct qw_task {
    qp_msg msg;                  /* a decoded QP_MSG_TASK or QP_MSG_PART, owned */
} qw_task;

typedef struct qw_worker {
    const qw_opts *o;
    qd_backend *be;

    pthread_mutex_t out_lock;    /* one writer at a time on out_fd */
    int out_broken;              /* a write failed: the daemon is gone */

    pthread_mutex_t lock;        /* guards everything below */
    pthread_cond_t cond;         /* signalled on a new task or part, parts_done, cancel, shutdown, EOF */
    qw_task queue[QW_MAX_QUEUED];
    int n_queued;
    char current[QP_JOB_ID_MAX + 1];   /* job id of the running task or part, "" when idle */
    int eof;                     /* stdin closed or broken */
    int shutdown;                /* a shutdown message arrived */
    int stop_pipe[2];            /* written by the main thread to wake the reader at exit */
    int graceful;                /* ... and it asked to finish the current block first */
    atomic_int cancel;           /* the running task was cancelled */
    int hb_stop;
    qd_err reader_err;
    int device_lost;             /* the backend is broken: finish this task's reply, then exit */
    /* The fan-out the running task waits on (worker_parts.c). */
    int fan_active;              /* parts sent, parts_done not yet seen */
    int fan_done;                /* parts_done for it arrived */
    int fan_block;
    char fan_step[16];
    /* The part running now (qw_part_run), and its stop: part_stop for it arrived. */
    int run_part;
    char run_job[QP_JOB_ID_MAX + 1];
    int run_block, run_index;
    char run_step[16];
    atomic_int part_stop;

    /* The pipeline kept open between tasks of one job (main thread only). */
    qd_pipeline *pipe;
    qp_job *pipe_job;
    char *pipe_spec;
    char *pipe_task_job_id;
    uint64_t pipe_fence;         /* the fencing token the open pipeline commits under */
    double t_open;
    /* The job of the last part run, parsed once for all its parts (main thread only). */
    char *part_spec;
    qp_job *part_job;
} qw_worker;

/* Encodes and writes one message; a failure marks the pipe broken (the daemon is gone). */
/* Parses the job spec a task or part (what: "task", "part") carries into *out (the caller
 * frees it): its id must be job_id and its backend this worker's (QD_ERESOURCE otherwise,
 * so another worker may take it). */
int qw_job_parse(qw_worker *w, const char *spec, const char *job_id, const char *what, qp_job **out, qd_err *err);
int qw_send_msg(qw_worker *w, const qp_msg *m);
/* After a failure: a device error (be->broken) becomes a retryable QD_EBACKEND carrying the
 * backend's message, and marks the worker to exit after its reply. Returns the code to report. */
int qw_device_check(qw_worker *w, int rc, qd_err *err, int *retryable);
/* The job id of a queued task or part. */
const char *qw_queued_job_id(const qp_msg *m);

/* worker_parts.c */
/* Runs part p (qd_pipeline_part_run) and replies part_done, ok or not; stopped early (not
 * done) when a part_stop for it comes meanwhile. helper: a part of another worker's job
 * (the fault hook's hold applies to those). */
void qw_part_run(qw_worker *w, const qp_msg_part *p, int helper);
/* part_stop (w->lock held): stops the part if it runs, or refuses it if it is queued. */
void qw_part_stop(qw_worker *w, const qp_msg_part_stop *m);
#ifdef QUANTD_FAULT_HOOKS
void qw_fault_part_hold(qw_worker *w, const qp_msg_part *p);
#endif
/* Replies part_done {ok: false, error: why} for a part that will not run. */
void qw_part_refuse(qw_worker *w, const qp_msg_part *p, const char *why);
/* The pipeline's fan-out hook of a task (ud is the worker): announces the parts, runs the
 * part messages of the job as they come until parts_done, a cancel or the end of stdin. */
int qw_fanout(void *ud, int block, const char *step, int n, const char *const *names);
/* The reader thread got parts_done (w->lock held): wakes the fan-out it ends. */
void qw_parts_done_seen(qw_worker *w, const qp_msg_parts_done *m);
/* Frees the cached part job. */
void qw_parts_free(qw_worker *w);

#endif
