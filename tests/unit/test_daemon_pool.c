/* daemon/pool.c alone: the worker pool's state machine with fake workers (this binary, see
 * tests/daemon_testlib.h), no Redis, no daemon main loop:
 *   - start: every worker is spawned, says hello and becomes idle;
 *   - crash (kill -9): the worker is restarted after its backoff, with a new pid;
 *   - a crash loop: the restart delay doubles (400, 800, 1600 ms after the 1st..3rd exit);
 *   - a failed self-test, and a foreign wire protocol: the worker is refused (failed) and not
 *     restarted;
 *   - the watchdog: a worker silent for 3 heartbeats, and one with no hello in 60 s (clocks
 *     moved back), is killed and restarted;
 *   - graceful shutdown: every worker exits and none is restarted;
 *   - every handle is closed at the end (uv_loop_close == 0). */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "daemon/daemon.h"
#include "daemon_testlib.h"
#include "quant/core/log.h"
#include "test_util.h"

static uv_loop_t loop;
static qdd_daemon d;

/* How late the test may look at a restart timer after pool.c armed it (a loaded machine):
 * still well under the step between two backoff delays (200 ms at the first). */
#define SLACK_MS 150

static int pool_begin(const char *mode, const char *workers)
{
    setenv("QUANTD_FAKE_WORKER", mode, 1);
    char *argv[] = {"quantd", "--workers", (char *)workers, "--node", "pool-test", "--heartbeat", "1", NULL};
    if (dt_daemon_init(&d, &loop, 7, argv)) return -1;
    qd_err err = {0};
    int rc = qdd_pool_start(&d, &err);
    if (rc) fprintf(stderr, "qdd_pool_start: %s\n", err.msg);
    return rc;
}

static void pool_end(void)
{
    dt_daemon_free(&d);
    CHECK_INT(uv_loop_alive(&loop), 0);
}

static int all_idle(void *arg)
{
    for (int i = 0; i < d.n_workers; i++)
        if (d.workers[i].state != QDD_W_IDLE) return 0;
    return d.n_workers > 0;
}

/* The worker is gone and its handles are closed (the restart timer is armed, if any). */
static int w0_closed(void *arg) { return d.workers[0].open_handles == 0; }
static int w0_idle_again(void *arg) { return d.workers[0].state == QDD_W_IDLE && d.workers[0].restarts >= *(int *)arg; }
static int w0_failed(void *arg) { return d.workers[0].state == QDD_W_FAILED && d.workers[0].open_handles == 0; }

static void test_start(void)
{
    CHECK_OK(pool_begin("ok", "cpu:2"));
    CHECK_INT(d.n_workers, 2);
    CHECK_INT(d.workers[0].state, QDD_W_STARTING);   /* spawned, no hello yet */
    CHECK(dt_run_until(&loop, all_idle, NULL, 10000));
    CHECK_STR(d.workers[0].name, "cpu-0");
    CHECK_STR(d.workers[1].name, "cpu-1");
    CHECK(d.workers[0].pid > 0 && d.workers[1].pid > 0 && d.workers[0].pid != d.workers[1].pid);
    CHECK_INT(d.workers[0].restarts, 0);
    CHECK_INT(d.workers[0].open_handles, 3);
    pool_end();
}

/* Several workers on one GPU: each its own process, named apart, on the same device. The
 * fake workers answer hello as CPU workers, so only the spawn is checked. */
static void test_cuda_copies(void)
{
    CHECK_OK(pool_begin("ok", "cuda:3*2,1"));
    CHECK_INT(d.n_workers, 3);
    CHECK_STR(d.workers[0].name, "cuda-3");
    CHECK_STR(d.workers[0].backend, "cuda:3");
    CHECK_STR(d.workers[1].name, "cuda-3.1");
    CHECK_STR(d.workers[1].backend, "cuda:3");
    CHECK_STR(d.workers[2].name, "cuda-1");
    CHECK_STR(d.workers[2].backend, "cuda:1");
    CHECK(d.workers[0].pid > 0 && d.workers[1].pid > 0 && d.workers[0].pid != d.workers[1].pid);
    pool_end();
    setenv("CUDA_VISIBLE_DEVICES", "4,5", 1);
    CHECK_OK(pool_begin("ok", "cuda:all*2"));
    unsetenv("CUDA_VISIBLE_DEVICES");
    CHECK_INT(d.n_workers, 4);
    CHECK_STR(d.workers[1].name, "cuda-0.1");
    CHECK_STR(d.workers[1].backend, "cuda:0");
    CHECK_STR(d.workers[3].name, "cuda-1.1");
    CHECK_STR(d.workers[3].backend, "cuda:1");
    pool_end();
}

static void test_crash_restart(void)
{
    CHECK_OK(pool_begin("ok", "cpu:1"));
    CHECK(dt_run_until(&loop, all_idle, NULL, 10000));
    qdd_worker *w = &d.workers[0];
    int pid = w->pid;
    kill(pid, SIGKILL);
    CHECK(dt_run_until(&loop, w0_closed, NULL, 5000));
    CHECK_INT(w->restarts, 1);
    CHECK_INT(w->state, QDD_W_DOWN);
    /* The first restart waits 400 ms (200 ms << 1). */
    CHECK(uv_is_active((uv_handle_t *)&w->restart));
    uint64_t due = uv_timer_get_due_in(&w->restart);
    CHECK(due > 400 - SLACK_MS && due <= 400);
    int one = 1;
    uv_update_time(&loop);
    uint64_t t0 = uv_now(&loop);
    CHECK(dt_run_until(&loop, w0_idle_again, &one, 10000));
    CHECK(uv_now(&loop) - t0 >= due - 20);
    CHECK(w->pid != pid);
    CHECK_INT(w->state, QDD_W_IDLE);
    pool_end();
}

static void test_crash_loop_backoff(void)
{
    CHECK_OK(pool_begin("exit", "cpu:1"));
    qdd_worker *w = &d.workers[0];
    for (int k = 1; k <= 3; k++) {
        CHECK(dt_run_until(&loop, w0_closed, NULL, 10000));
        CHECK_INT(w->restarts, k);
        uint64_t due = uv_timer_get_due_in(&w->restart), want = 200u << k;
        CHECK(uv_is_active((uv_handle_t *)&w->restart));
        if (due <= want - SLACK_MS || due > want)
            TEST_FAIL_("restart %d: due in %llu ms, want (%llu, %llu]", k, (unsigned long long)due,
                       (unsigned long long)(want - SLACK_MS), (unsigned long long)want);
        /* Up to the respawn: the handles are open again. */
        while (w->open_handles == 0 && uv_is_active((uv_handle_t *)&w->restart)) uv_run(&loop, UV_RUN_ONCE);
    }
    pool_end();
}

static void refused_case(const char *mode, const char *why)
{
    CHECK_OK(pool_begin(mode, "cpu:1"));
    qdd_worker *w = &d.workers[0];
    CHECK(dt_run_until(&loop, w0_failed, NULL, 10000));
    CHECK_CONTAINS(w->why, why);
    CHECK(!uv_is_active((uv_handle_t *)&w->restart));   /* refused workers stay down */
    int pid = w->pid;
    dt_run_until(&loop, NULL, NULL, 500);
    CHECK_INT(w->state, QDD_W_FAILED);
    CHECK_INT(w->pid, pid);
    CHECK_INT(w->restarts, 1);
    pool_end();
}

static void test_selftest_refused(void) { refused_case("selftest", "failed its self-test: fake: dequant mismatch"); }
static void test_protocol_refused(void) { refused_case("protocol", "speaks wire protocol 4, this daemon 3"); }

static void test_watchdog(void)
{
    CHECK_OK(pool_begin("ok", "cpu:2"));
    /* No hello yet, and the clock says 100 s since the spawn: killed at once. */
    d.workers[1].started_s -= 100;
    qdd_pool_watchdog(&d);
    CHECK_STR(d.workers[1].why, "sent no hello within 60 s");
    CHECK(dt_run_until(&loop, all_idle, NULL, 10000));
    CHECK_INT(d.workers[1].restarts, 1);
    CHECK_INT(d.workers[0].restarts, 0);
    /* An idle worker quiet for longer than 3 heartbeats (3 s here). */
    qdd_worker *w = &d.workers[0];
    qdd_pool_watchdog(&d);
    CHECK_INT(w->state, QDD_W_IDLE);   /* it just spoke: nothing happens */
    w->last_msg_s -= 4;
    qdd_pool_watchdog(&d);
    CHECK_STR(w->why, "stopped sending heartbeats");
    int one = 1;
    CHECK(dt_run_until(&loop, w0_idle_again, &one, 10000));
    CHECK_INT(w->restarts, 1);
    CHECK_STR(w->why, "");   /* cleared by the new hello */
    pool_end();
}

static int all_down(void *arg) { return qdd_pool_all_down(&d); }

static void test_shutdown(void)
{
    CHECK_OK(pool_begin("ok", "cpu:2"));
    CHECK(dt_run_until(&loop, all_idle, NULL, 10000));
    d.stopping = QDD_STOP_DRAINING;
    qdd_pool_shutdown(&d);
    CHECK(dt_run_until(&loop, all_down, NULL, 5000));
    for (int i = 0; i < d.n_workers; i++) {
        CHECK_INT(d.workers[i].state, QDD_W_DOWN);
        CHECK(!uv_is_active((uv_handle_t *)&d.workers[i].restart));
    }
    pool_end();
}

int main(int argc, char **argv)
{
    int fw = dt_fake_worker_main(argc, argv);
    if (fw >= 0) return fw;
    signal(SIGPIPE, SIG_IGN);
    qd_log_set_level(QD_LOG_ERROR);
    uv_loop_init(&loop);
    TEST_RUN(test_start);
    TEST_RUN(test_cuda_copies);
    TEST_RUN(test_crash_restart);
    TEST_RUN(test_crash_loop_backoff);
    TEST_RUN(test_selftest_refused);
    TEST_RUN(test_protocol_refused);
    TEST_RUN(test_watchdog);
    TEST_RUN(test_shutdown);
    test_current = "loop";
    CHECK_INT(uv_loop_close(&loop), 0);
    return test_finish();
}
