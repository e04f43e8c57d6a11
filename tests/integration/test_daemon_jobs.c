/* daemon/jobs.c alone: the job lifecycle against a real redis-server on a random loopback
 * port, with the worker pool running fake workers (tests/daemon_testlib.h), without the
 * daemon's main loop. The test plays the daemon's part around the module: it puts each
 * payload in the node's processing list (as BLMOVE does) and calls qdd_jobs_admit, and it
 * calls qdd_jobs_renew / _cancel / _handback_all / _recover where the tick, the cancel
 * channel, SIGTERM and a reconnect would. Cases:
 *   - done: taken (lease, fence, status hash, index), run on a worker, finished; the
 *     references are the list's plus one per pending reply or task (2 while taking, 2 while
 *     running, 3 with a renewal in flight), and the job is freed once the finish script
 *     answered; nothing of it is left in the processing list or the lease;
 *   - cancel while running: the worker is told, the job ends cancelled;
 *   - a worker killed mid-task: the task is retried on the restarted worker; done;
 *   - a task that keeps failing: retried max-retries times, then failed with the reason;
 *   - a full disk (QD_ERESOURCE): retried once per job, progress between notwithstanding;
 *   - a duplicate id while the first holds its lease: refused into the failed list;
 *   - lease lost to another node: the worker is cancelled and nothing is written;
 *   - SIGTERM hand-back of a job waiting for a slot: back on the queue;
 *   - Redis restarted empty: the recovery re-creates the lease, the processing entry, the
 *     status hash and the index entry of the running job;
 *   - every handle closed at the end (uv_loop_close == 0); ASan sees no use after free. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <uv.h>

#include "daemon/daemon.h"
#include "daemon_testlib.h"
#include "quant/core/log.h"
#include "redis_fixture.h"
#include "test_util.h"

static rf_redis rs;
static const char *tmp;
static uv_loop_t loop;
static qdd_daemon d;

/* ---- Redis from the test's side ----------------------------------------------------------- */

static redisReply *redis_q(const char *fmt, ...)
{
    redisContext *c = rf_connect(&rs);
    if (!c) return NULL;
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    redisFree(c);
    return r;
}

static long long rint_cmd(const char *fmt, const char *a)
{
    redisReply *r = redis_q(fmt, a);
    long long v = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    freeReplyObject(r);
    return v;
}

/* HGET of a job's status field into buf ("" when absent). */
static const char *hget(const char *id, const char *field, char *buf, size_t cap)
{
    char key[QP_KEY_MAX];
    qp_key_status(&d.keys, id, key, sizeof key);
    redisReply *r = redis_q("HGET %s %s", key, field);
    snprintf(buf, cap, "%s", r && r->type == REDIS_REPLY_STRING ? r->str : "");
    freeReplyObject(r);
    return buf;
}

static long long proc_len(void)
{
    char proc[QP_KEY_MAX];
    qp_key_processing(&d.keys, d.node, proc, sizeof proc);
    return rint_cmd("LLEN %s", proc);
}

static long long lease_exists(const char *id)
{
    char key[QP_KEY_MAX];
    qp_key_lease(&d.keys, id, key, sizeof key);
    return rint_cmd("EXISTS %s", key);
}

/* ---- the module's side -------------------------------------------------------------------- */

static char payload[1024];

/* What BLMOVE and the pop callback do: the payload into our processing list, then admit. */
static void take(const char *id)
{
    char proc[QP_KEY_MAX];
    snprintf(payload, sizeof payload,
             "{\"id\":\"%s\",\"model\":\"%s/model\",\"output\":\"%s/out-%s\",\"method\":\"rtn\"}", id, tmp, tmp, id);
    qp_key_processing(&d.keys, d.node, proc, sizeof proc);
    freeReplyObject(redis_q("LPUSH %s %s", proc, payload));
    qdd_jobs_admit(&d, payload, strlen(payload));
}

static qdd_job *job_find(const char *id)
{
    for (qdd_job *j = d.jobs; j; j = j->next)
        if (!strcmp(j->id, id)) return j;
    return NULL;
}

static int none_held(void *arg) { return qdd_jobs_held(&d) == 0; }
static int is_running(void *arg)
{
    qdd_job *j = job_find(arg);
    return j && j->phase == QDD_JOB_RUNNING && j->worker >= 0;
}
static int is_waiting(void *arg)
{
    qdd_job *j = job_find(arg);
    return j && j->phase == QDD_JOB_WAITING;
}
static int workers_idle(void *arg)
{
    for (int i = 0; i < d.n_workers; i++)
        if (d.workers[i].state != QDD_W_IDLE) return 0;
    return 1;
}
static int cmd_up(void *arg) { return d.cmd.up; }
static int renew_answered(void *arg) { return job_find(arg) && job_find(arg)->refs == 2; }

static int daemon_begin(const char *mode, const char *max_retries, const char *max_jobs)
{
    setenv("QUANTD_FAKE_WORKER", mode, 1);
    char redis[64];
    snprintf(redis, sizeof redis, "redis://127.0.0.1:%d", rs.port);
    char *argv[] = {"quantd", "--redis", redis, "--node", "jobs-test", "--workers", "cpu:1", "--allow-root", (char *)tmp,
                    "--max-retries", (char *)max_retries, "--max-jobs", (char *)max_jobs, "--lease-ttl-ms", "10000", NULL};
    if (dt_daemon_init(&d, &loop, 15, argv)) return -1;
    qd_err err = {0};
    if (qdd_pool_start(&d, &err)) {
        fprintf(stderr, "qdd_pool_start: %s\n", err.msg);
        return -1;
    }
    qdd_rconn_connect(&d.cmd);
    if (!dt_run_until(&loop, cmd_up, NULL, 5000) || !dt_run_until(&loop, workers_idle, NULL, 10000)) return -1;
    return 0;
}

static void daemon_end(void)
{
    dt_daemon_free(&d);
    freeReplyObject(redis_q("FLUSHALL"));
}

/* ---- the cases ---------------------------------------------------------------------------- */

static void test_done(void)
{
    char b[4096];
    CHECK_OK(daemon_begin("ok", "1", "1"));
    take("j-done");
    qdd_job *j = job_find("j-done");
    CHECK(j != NULL);
    if (!j) { daemon_end(); return; }
    CHECK_INT(j->phase, QDD_JOB_TAKING);
    CHECK_INT(j->refs, 2);   /* the list's + the take reply's */
    CHECK(dt_run_until(&loop, none_held, NULL, 10000));
    CHECK_STR(hget("j-done", "state", b, sizeof b), "done");
    char want[1100];
    snprintf(want, sizeof want, "%s/out-j-done", tmp);
    CHECK_STR(hget("j-done", "output", b, sizeof b), want);
    CHECK_CONTAINS(hget("j-done", "report", b, sizeof b), "\"fake\"");
    CHECK_CONTAINS(hget("j-done", "spec", b, sizeof b), "\"j-done\"");
    CHECK_INT(proc_len(), 0);
    CHECK_INT(lease_exists("j-done"), 0);
    char idx[QP_KEY_MAX], xkey[QP_KEY_MAX];
    qp_key_index(&d.keys, idx, sizeof idx);
    qp_key_job_events(&d.keys, "j-done", xkey, sizeof xkey);
    redisReply *r = redis_q("ZSCORE %s j-done", idx);
    CHECK(r && r->type == REDIS_REPLY_STRING);
    freeReplyObject(r);
    CHECK(rint_cmd("XLEN %s", xkey) >= 3);   /* queued, running, progress ..., done */
    CHECK_INT(d.workers[0].state, QDD_W_IDLE);
    CHECK(d.workers[0].job == NULL);
    daemon_end();
}

static void test_refs_and_cancel(void)
{
    char b[256];
    CHECK_OK(daemon_begin("hang", "1", "1"));
    take("j-cancel");
    CHECK(dt_run_until(&loop, is_running, "j-cancel", 10000));
    qdd_job *j = job_find("j-cancel");
    if (!j) { daemon_end(); return; }
    CHECK_INT(j->refs, 2);   /* the list's + the worker's task */
    CHECK(d.workers[0].job == j);
    CHECK_INT(d.workers[0].state, QDD_W_BUSY);
    CHECK(j->fence >= 1);
    CHECK_INT(lease_exists("j-cancel"), 1);
    qdd_jobs_renew(&d);
    CHECK_INT(j->refs, 3);   /* + the renewal's reply */
    CHECK(dt_run_until(&loop, renew_answered, "j-cancel", 5000));
    CHECK_INT(j->phase, QDD_JOB_RUNNING);
    CHECK_STR(hget("j-cancel", "state", b, sizeof b), "running");
    CHECK_STR(hget("j-cancel", "stage", b, sizeof b), "quantize");   /* the worker's progress */
    /* The cancel protocol: the flag, then the wake-up (the sub connection's callback). */
    char ckey[QP_KEY_MAX];
    qp_key_cancel(&d.keys, "j-cancel", ckey, sizeof ckey);
    freeReplyObject(redis_q("SET %s %s", ckey, "by the test"));
    qdd_jobs_cancel(&d, "j-cancel");
    CHECK(dt_run_until(&loop, none_held, NULL, 10000));
    CHECK_STR(hget("j-cancel", "state", b, sizeof b), "cancelled");
    CHECK_INT(proc_len(), 0);
    CHECK_INT(lease_exists("j-cancel"), 0);
    CHECK_INT(d.workers[0].state, QDD_W_IDLE);
    daemon_end();
}

static void test_worker_killed(void)
{
    char b[256];
    CHECK_OK(daemon_begin("hang", "2", "1"));
    take("j-kill");
    CHECK(dt_run_until(&loop, is_running, "j-kill", 10000));
    /* The restarted worker finishes it. */
    setenv("QUANTD_FAKE_WORKER", "ok", 1);
    kill(d.workers[0].pid, SIGKILL);
    CHECK(dt_run_until(&loop, none_held, NULL, 10000));
    CHECK_STR(hget("j-kill", "state", b, sizeof b), "done");
    CHECK_STR(hget("j-kill", "attempts", b, sizeof b), "1");
    CHECK_INT(d.workers[0].restarts, 1);
    CHECK_INT(proc_len(), 0);
    daemon_end();
}

static void test_retries_exhausted(void)
{
    char b[512];
    CHECK_OK(daemon_begin("fail", "2", "1"));
    take("j-fail");
    CHECK(dt_run_until(&loop, none_held, NULL, 10000));
    CHECK_STR(hget("j-fail", "state", b, sizeof b), "failed");
    CHECK_STR(hget("j-fail", "error", b, sizeof b), "fake failure (after 2 retries)");
    CHECK_INT(proc_len(), 0);
    CHECK_INT(lease_exists("j-fail"), 0);
    daemon_end();
}

/* A full disk (QD_ERESOURCE) is retried once per job, as docs/daemon.md says, not max-retries
 * times, and the block committed before each failure (progress, which resets the ordinary
 * retry budget) does not renew it: the retry's pre-flight sees the space left, and more
 * retries would fill the same disk again. */
static void test_disk_full_retried_once(void)
{
    char b[512];
    CHECK_OK(daemon_begin("nospace", "3", "1"));
    take("j-full");
    CHECK(dt_run_until(&loop, none_held, NULL, 10000));
    CHECK_STR(hget("j-full", "state", b, sizeof b), "failed");
    CHECK_STR(hget("j-full", "error", b, sizeof b),
              "out/.quantd/block-001.safetensors: No space left on device (after 1 retry)");
    CHECK_INT(proc_len(), 0);
    CHECK_INT(lease_exists("j-full"), 0);
    daemon_end();
}

static void test_duplicate(void)
{
    char b[4096];
    CHECK_OK(daemon_begin("hang", "1", "2"));
    take("j-dup");
    CHECK(dt_run_until(&loop, is_running, "j-dup", 10000));
    char first_payload[1024];
    snprintf(first_payload, sizeof first_payload, "%s", payload);
    take("j-dup");   /* the same id again, while the first holds its lease */
    CHECK_INT(qdd_jobs_held(&d), 2);
    for (int i = 0; i < 200 && qdd_jobs_held(&d) > 1; i++) dt_run_until(&loop, NULL, NULL, 10);
    CHECK_INT(qdd_jobs_held(&d), 1);
    char failed[QP_KEY_MAX];
    qp_key_failed(&d.keys, failed, sizeof failed);
    CHECK_INT(rint_cmd("LLEN %s", failed), 1);
    redisReply *r = redis_q("LINDEX %s 0", failed);
    CHECK(r && r->type == REDIS_REPLY_STRING);
    if (r && r->type == REDIS_REPLY_STRING) CHECK_CONTAINS(r->str, "is already live");
    freeReplyObject(r);
    CHECK_STR(hget("j-dup", "state", b, sizeof b), "running");   /* the first one's, untouched */
    CHECK_INT(proc_len(), 1);
    daemon_end();
}

static void test_lease_lost(void)
{
    char b[256];
    CHECK_OK(daemon_begin("hang", "1", "1"));
    take("j-lost");
    CHECK(dt_run_until(&loop, is_running, "j-lost", 10000));
    char lease[QP_KEY_MAX];
    qp_key_lease(&d.keys, "j-lost", lease, sizeof lease);
    freeReplyObject(redis_q("SET %s %s", lease, "999 other-node"));
    qdd_jobs_renew(&d);
    CHECK(dt_run_until(&loop, none_held, NULL, 10000));
    /* Nothing was written: the other node owns the job now. */
    CHECK_STR(hget("j-lost", "state", b, sizeof b), "running");
    redisReply *r = redis_q("GET %s", lease);
    CHECK(r && r->type == REDIS_REPLY_STRING && !strcmp(r->str, "999 other-node"));
    freeReplyObject(r);
    CHECK_INT(d.workers[0].state, QDD_W_IDLE);
    daemon_end();
}

static void test_handback(void)
{
    CHECK_OK(daemon_begin("hang", "1", "1"));
    take("j-run");
    CHECK(dt_run_until(&loop, is_running, "j-run", 10000));
    take("j-wait");   /* one slot (max-jobs 1): it waits */
    CHECK(dt_run_until(&loop, is_waiting, "j-wait", 5000));
    d.stopping = QDD_STOP_DRAINING;   /* what SIGTERM sets before handing back */
    qdd_jobs_handback_all(&d);
    CHECK(dt_run_until(&loop, is_running, "j-run", 10));   /* the running one stays */
    for (int i = 0; i < 200 && job_find("j-wait"); i++) dt_run_until(&loop, NULL, NULL, 10);
    CHECK(job_find("j-wait") == NULL);
    char queue[QP_KEY_MAX];
    qp_key_queue(&d.keys, queue, sizeof queue);
    redisReply *r = redis_q("LRANGE %s 0 -1", queue);
    CHECK(r && r->type == REDIS_REPLY_ARRAY && r->elements == 1);
    if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 1) CHECK_CONTAINS(r->element[0]->str, "\"j-wait\"");
    freeReplyObject(r);
    CHECK_INT(lease_exists("j-wait"), 0);
    CHECK_INT(proc_len(), 1);   /* j-run's */
    daemon_end();
}

static void test_recover_after_empty_restart(void)
{
    char b[256];
    CHECK_OK(daemon_begin("hang", "1", "1"));
    take("j-rec");
    CHECK(dt_run_until(&loop, is_running, "j-rec", 10000));
    rf_kill9(&rs);
    CHECK_OK(rf_start(&rs, tmp, NULL));   /* back without its data */
    CHECK_INT(lease_exists("j-rec"), 0);
    /* Wait for the drop to be noticed and the reconnect: up again after a down. */
    for (int i = 0; i < 500 && (d.cmd.ups < 2 || !d.cmd.up); i++) dt_run_until(&loop, NULL, NULL, 10);
    CHECK(d.cmd.ups >= 2);
    qdd_jobs_recover(&d, 0);   /* what the daemon's cmd on_up does */
    for (int i = 0; i < 300 && !lease_exists("j-rec"); i++) dt_run_until(&loop, NULL, NULL, 10);
    CHECK_INT(lease_exists("j-rec"), 1);
    CHECK_INT(proc_len(), 1);
    CHECK_STR(hget("j-rec", "state", b, sizeof b), "running");
    char idx[QP_KEY_MAX];
    qp_key_index(&d.keys, idx, sizeof idx);
    redisReply *r = redis_q("ZSCORE %s j-rec", idx);
    CHECK(r && r->type == REDIS_REPLY_STRING);
    freeReplyObject(r);
    qdd_job *j = job_find("j-rec");
    CHECK(j && j->phase == QDD_JOB_RUNNING && !j->lost);
    daemon_end();
}

int main(int argc, char **argv)
{
    int fw = dt_fake_worker_main(argc, argv);
    if (fw >= 0) return fw;
    signal(SIGPIPE, SIG_IGN);
    if (!rf_installed()) {
        fprintf(stderr, "test_daemon_jobs: redis-server not installed; skipping\n");
        return TEST_SKIP;
    }
    qd_log_set_level(QD_LOG_ERROR);
    tmp = test_tmpdir();
    char model[1200];
    snprintf(model, sizeof model, "%s/model", tmp);
    mkdir(model, 0755);
    rs.port = rf_free_port();
    if (rf_start(&rs, tmp, NULL)) {
        fprintf(stderr, "test_daemon_jobs: redis-server did not start\n");
        return 1;
    }
    uv_loop_init(&loop);
    TEST_RUN(test_done);
    TEST_RUN(test_refs_and_cancel);
    TEST_RUN(test_worker_killed);
    TEST_RUN(test_retries_exhausted);
    TEST_RUN(test_disk_full_retried_once);
    TEST_RUN(test_duplicate);
    TEST_RUN(test_lease_lost);
    TEST_RUN(test_handback);
    TEST_RUN(test_recover_after_empty_restart);
    test_current = "loop";
    CHECK_INT(uv_loop_close(&loop), 0);
    rf_kill9(&rs);
    return test_finish();
}
