/* The worker process: one compute backend, tasks from the daemon over stdin, replies on
 * stdout, in the framed messages of proto/wire.h (proto/wire.md).
 *
 * Three threads: the reader decodes stdin (tasks are queued; cancel and shutdown act at
 * once), the heartbeat thread sends a heartbeat every interval whether a task runs or not,
 * and the main thread runs tasks through quant/pipeline. The pipeline's progress hook
 * forwards progress and returns nonzero once the task is cancelled, so a cancel stops the
 * job at the next safe point with its checkpoint intact. A task for the same job that
 * continues where the previous one stopped reuses the open pipeline (its activations are
 * already in memory); anything else closes it and opens from the checkpoint.
 *
 * Every task ends with exactly one task_done or task_failed. Failures caused by the job
 * itself (validation, a model the pipeline cannot handle, a fingerprint mismatch) are not
 * retryable; I/O, memory and backend errors are.
 *
 * Parts (worker_parts.c): a `part` message is queued like a task and answered by exactly one
 * part_done. A task of a job whose `workers` is not 1 hands the pipeline a fan-out hook: the
 * worker announces a block's parts to the daemon and runs the parts of its own job that come
 * back, while idle workers run the others, until the daemon says parts_done. */
#ifndef QUANTD_WORKERS_WORKER_H
#define QUANTD_WORKERS_WORKER_H

#include "quant/core/error.h"
#include "quant/core/runtime.h"

typedef struct qw_opts {
    const char *name;          /* worker name in hello and logs, e.g. "cpu0" (borrowed) */
    const char *backend;       /* backend spec for qd_backend_open: "cpu", "cuda:0" (borrowed) */
    const qd_runtime_opts *rt; /* the runtime options the backend opens with (borrowed; NULL = defaults) */
    int heartbeat_ms;          /* heartbeat interval; 0 selects 2000 */
    int in_fd, out_fd;         /* message pipes (stdin and a private copy of stdout) */
} qw_opts;

/* Runs the worker until shutdown or end of input. Returns 0 on a clean exit (shutdown
 * message, or EOF on stdin while idle), or a negative QD_E* code with err set (the backend
 * could not be opened, the pipe broke, the daemon spoke another protocol). */
int qw_worker_run(const qw_opts *o, qd_err *err);

/* Maps a pipeline error code to the retryable flag of task_failed: 1 when a retry (from
 * the checkpoint, maybe on another worker) may succeed. */
int qw_error_retryable(int code);

#endif
