/* Helpers for unit tests of the daemon's modules (daemon/pool.c, daemon/jobs.c) without the
 * daemon's main loop: a qdd_daemon filled in the way qdd_daemon_run fills it (no signals,
 * no tick, no HTTP), a loop runner with a deadline, and a fake quantd-worker.
 *
 * The fake worker is the test binary itself: the daemon test sets worker-path to
 * /proc/self/exe, and the test's main() first calls dt_fake_worker_main, which takes over
 * when the process was started the way pool.c starts a worker (`--name N --backend B
 * --heartbeat-ms MS`). What it does comes from QUANTD_FAKE_WORKER, read at each spawn (so a
 * test may change it between restarts with setenv):
 *   ok            hello, then each task: progress, block_done for blocks 0 and 1 of 2,
 *                 task_done with the job finished (output from the spec)
 *   hang          hello, then each task: one progress message, then nothing until cancel
 *                 (task_failed cancelled) or shutdown
 *   fail          hello, then each task: task_failed "fake failure" (retryable)
 *   nospace       hello, then each task: block_done for block 0, then task_failed with
 *                 QD_ERESOURCE, "... No space left on device" (retryable), as for ENOSPC
 *   exit          hello, then exit status 3 at once
 *   selftest      hello with selftest_ok 0
 *   protocol      hello with a foreign wire protocol version
 * Every mode exits 0 on shutdown or end of input. */
#ifndef QUANTD_TESTS_DAEMON_TESTLIB_H
#define QUANTD_TESTS_DAEMON_TESTLIB_H

#include <uv.h>

#include "daemon/daemon.h"

/* Runs the fake worker and returns its exit status when argv says so; -1 otherwise (the
 * caller goes on as the test). */
int dt_fake_worker_main(int argc, char **argv);

/* Fills d (zeroed here) for loop: the configuration from argv (qdd_config_load with an empty
 * environment; "--worker-path /proc/self/exe" is added), keys, node, worker_exe, max_jobs,
 * and the three connections initialised (not connected; ud = d, client names set). d->cfg is
 * owned by d. 0, or -1 with the reason printed. */
int dt_daemon_init(qdd_daemon *d, uv_loop_t *loop, int argc, char **argv);
/* Closes what dt_daemon_init and qdd_pool_start opened (connections, restart timers), runs
 * the loop until they are closed, frees jobs, workers and the configuration. The loop is
 * the caller's (uv_loop_close after this must return 0). */
void dt_daemon_free(qdd_daemon *d);

/* Runs loop until cond(arg) holds or ms pass; returns whether it held (1 when cond is NULL,
 * after ms). */
int dt_run_until(uv_loop_t *loop, int (*cond)(void *), void *arg, int ms);

#endif
