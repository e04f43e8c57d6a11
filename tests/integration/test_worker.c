/* quantd-worker end to end: spawn it with pipes, expect hello, run a tiny generated llama
 * model block by block (progress, block_done, task_done, a complete output directory),
 * refuse an invalid job as not retryable, cancel a queued task, and exit 0 on shutdown; and
 * with an injected device error, fail the task and exit so the daemon starts a fresh one.
 * The test plays the daemon's part in a fan-out (proto/wire.md, the parts messages): a task
 * of a job with workers other than 1 announces each block's parts, gets them back one at a
 * time as `part` messages, answers each with part_done, and goes on after parts_done; a job
 * with workers 1 announces none and writes the same bytes; a part of an invalid job is
 * answered part_done ok false; a parts_done nobody waits for is ignored. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "proto/wire.h"
#include "quant/core/fsutil.h"
#include "quant/model/testgen.h"
#include "test_util.h"

typedef struct child {
    pid_t pid;
    int to, from;
    qp_wire_decoder d;
} child;

/* fault: a QUANTD_FAULT_INJECT value for the child, or NULL. */
static int spawn_worker_env(child *c, const char *exe, const char *fault)
{
    int in[2], out[2];
    if (pipe(in) || pipe(out)) return -1;
    c->pid = fork();
    if (c->pid < 0) return -1;
    if (c->pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[0]); close(in[1]); close(out[0]); close(out[1]);
        if (fault) setenv("QUANTD_FAULT_INJECT", fault, 1);
        else unsetenv("QUANTD_FAULT_INJECT");
        execl(exe, exe, "--name", "cpu7", "--backend", "cpu", "--heartbeat-ms", "100", (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    c->to = in[1];
    c->from = out[0];
    qp_wire_decoder_init(&c->d, 0);
    return 0;
}

static int spawn_worker(child *c, const char *exe) { return spawn_worker_env(c, exe, NULL); }

static void send_frame(child *c, const qp_msg *m)
{
    uint8_t *f = NULL;
    size_t n = 0;
    qp_err pe = {0};
    CHECK_OK(qp_wire_encode(m, &f, &n, &pe));
    CHECK_INT(write(c->to, f, n), n);
    free(f);
}

/* Next message that is not a heartbeat (counted); 0 on timeout or EOF. */
static int recv_msg(child *c, qp_msg *m, int *heartbeats, int timeout_ms)
{
    for (;;) {
        qp_err pe = {0};
        int rc = qp_wire_decoder_next(&c->d, m, &pe);
        if (rc < 0) { fprintf(stderr, "decode: %s\n", pe.msg); return 0; }
        if (rc > 0) {
            if (m->type == QP_MSG_HEARTBEAT) {
                if (heartbeats) (*heartbeats)++;
                qp_msg_clear(m);
                continue;
            }
            return 1;
        }
        struct pollfd p = {.fd = c->from, .events = POLLIN};
        if (poll(&p, 1, timeout_ms) <= 0) return 0;
        char buf[65536];
        ssize_t k = read(c->from, buf, sizeof buf);
        if (k <= 0) return 0;
        if (qp_wire_decoder_feed(&c->d, buf, (size_t)k, &pe)) { fprintf(stderr, "feed: %s\n", pe.msg); return 0; }
    }
}

static int wait_exit(child *c, int secs)
{
    for (int i = 0; i < secs * 20; i++) {
        int st;
        pid_t r = waitpid(c->pid, &st, WNOHANG);
        if (r == c->pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        usleep(50000);
    }
    kill(c->pid, SIGKILL);
    waitpid(c->pid, NULL, 0);
    return -1;
}

static char *make_job(const char *model, const char *out, const char *extra)
{
    char *s = NULL;
    CHECK(asprintf(&s, "{\"id\":\"wtest-%s\",\"model\":\"%s\",\"output\":\"%s\",\"method\":\"rtn\","
                       "\"group_size\":32,\"backend\":\"cpu\"%s}",
                   strrchr(out, '/') + 1, model, out, extra) > 0);
    return s;
}

static void send_task_fan(child *c, const char *id, const char *job, int block, int fanout)
{
    qp_msg m;
    qp_msg_init(&m, QP_MSG_TASK);
    m.task.job_id = (char *)id;
    m.task.job = (char *)job;
    m.task.block = block;
    m.task.checkpoint_dir = "unused";
    m.task.fence = 3;
    m.task.fanout = fanout;
    send_frame(c, &m);
}

/* A task as a daemon with other workers sends it (task.fanout). */
static void send_task(child *c, const char *id, const char *job, int block)
{
    send_task_fan(c, id, job, block, 1);
}

/* The fan-out the worker announced in *pm (a `parts` message, cleared here): the parts go
 * back to it one at a time, each answered by part_done, then parts_done. Returns the parts
 * run; *fanouts counts the fan-outs. */
static int serve_parts(child *c, qp_msg *pm, const char *job, int *fanouts, int *hb)
{
    const qp_msg_parts *p = &pm->parts;
    int ran = 0;
    (*fanouts)++;
    CHECK(p->n >= 1);
    CHECK_INT(p->fence, 3);
    CHECK_STR(p->step, "quantize");
    CHECK(p->names.n == 0 || p->names.n == p->n);
    for (int i = 0; i < p->n; i++) {
        qp_msg m;
        qp_msg_init(&m, QP_MSG_PART);
        m.part.job_id = p->job_id;
        m.part.job = (char *)job;
        m.part.checkpoint_dir = "unused";
        m.part.block = p->block;
        m.part.step = p->step;
        m.part.index = i;
        m.part.fence = p->fence;
        send_frame(c, &m);
        qp_msg r;
        int got = 0;
        while (!got && recv_msg(c, &r, hb, 60000)) {
            if (r.type == QP_MSG_PART_DONE) {
                got = 1;
                CHECK_STR(r.part_done.job_id, p->job_id);
                CHECK_INT(r.part_done.block, p->block);
                CHECK_INT(r.part_done.index, i);
                CHECK_INT(r.part_done.ok, 1);
                if (!r.part_done.ok) fprintf(stderr, "part %d: %s\n", i, r.part_done.error);
                ran += r.part_done.ok;
            } else if (r.type != QP_MSG_PROGRESS) {
                TEST_FAIL_("while a part runs: unexpected message %s", qp_msg_type_name(r.type));
            }
            qp_msg_clear(&r);
        }
        CHECK_INT(got, 1);
        if (!got) break;
    }
    qp_msg d;
    qp_msg_init(&d, QP_MSG_PARTS_DONE);
    d.parts_done.job_id = p->job_id;
    d.parts_done.block = p->block;
    d.parts_done.step = p->step;
    send_frame(c, &d);
    qp_msg_clear(pm);
    return ran;
}

/* The sorted listing of dir's files with their bytes, for comparing two outputs (the report,
 * with its timings and ids, left out). 1 when every file of a is in b with the same bytes. */
static int same_files(const char *a, const char *b)
{
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "cd '%s' && for f in $(find . -type f ! -name quantd_report.json | sort); do cmp -s \"$f\" '%s'/\"$f\" || exit 1; done", a, b);
    return system(cmd) == 0;
}

/* Runs a whole job (output DIR/NAME, more job keys in extra, task.fanout as given) that must
 * announce no parts, to the same bytes as the output ref. */
static void whole_without_parts(child *c, int *hb, const char *model, const char *dir, const char *name,
                                const char *extra, int fanout, const char *ref)
{
    char out[1024], id[128];
    snprintf(out, sizeof out, "%s/%s", dir, name);
    snprintf(id, sizeof id, "wtest-%s", name);
    char *job = make_job(model, out, extra);
    send_task_fan(c, id, job, QP_TASK_WHOLE_JOB, fanout);
    int done = 0;
    qp_msg m;
    while (!done && recv_msg(c, &m, hb, 60000)) {
        if (m.type == QP_MSG_PARTS) TEST_FAIL_("%s: parts announced", name);
        if (m.type == QP_MSG_TASK_FAILED) { TEST_FAIL_("%s: task_failed: %s", name, m.task_failed.error); done = 2; }
        if (m.type == QP_MSG_TASK_DONE) done = 1;
        qp_msg_clear(&m);
    }
    CHECK_INT(done, 1);
    CHECK(same_files(ref, out));
    free(job);
}

static void test_worker(void)
{
    const char *bdir = getenv("QUANTD_BUILD_DIR");
    char exe[4096];
    snprintf(exe, sizeof exe, "%s/quantd-worker", bdir ? bdir : ".");
    const char *dir = test_tmpdir();
    char model[1024], out[1024], out2[1024];
    snprintf(model, sizeof model, "%s/model", dir);
    snprintf(out, sizeof out, "%s/out1", dir);
    snprintf(out2, sizeof out2, "%s/out2", dir);
    qd_testgen_opts o = qd_testgen_defaults(QD_ARCH_LLAMA);
    qd_err err = {0};
    CHECK_OK(qd_testgen_write(model, &o, &err));

    child c;
    CHECK_OK(spawn_worker(&c, exe));
    qp_msg m;
    int hb = 0;
    CHECK(recv_msg(&c, &m, &hb, 10000));
    CHECK_INT(m.type, QP_MSG_HELLO);
    CHECK_STR(m.hello.worker, "cpu7");
    CHECK_STR(m.hello.backend, "cpu");
    CHECK_INT(m.hello.protocol, QP_WIRE_VERSION);
    CHECK_INT(m.hello.pid, c.pid);
    CHECK_INT(m.hello.selftest_ok, 1);
    qp_msg_clear(&m);

    /* Block by block: block 0, then block 1 which also finishes the job. */
    char *job = make_job(model, out, "");
    char id[64];
    snprintf(id, sizeof id, "wtest-out1");
    int fanouts = 0, parts_ran = 0;
    for (int b = 0; b < 2; b++) {
        send_task(&c, id, job, b);
        int progress = 0, block_done = 0, done = 0;
        double last_fraction = -1;
        while (!done && recv_msg(&c, &m, &hb, 60000)) {
            switch (m.type) {
            case QP_MSG_PROGRESS:
                progress++;
                CHECK_STR(m.progress.job_id, id);
                CHECK(m.progress.fraction >= last_fraction - 1e-12);
                last_fraction = m.progress.fraction;
                break;
            case QP_MSG_BLOCK_DONE:
                block_done++;
                CHECK_INT(m.block_done.block, b);
                CHECK_INT(m.block_done.n_blocks, 2);
                CHECK_INT(m.block_done.fence, 3);
                /* The block's cost record rides along: its stages and passes. */
                CHECK(m.block_done.cost != NULL);
                if (m.block_done.cost) {
                    CHECK_CONTAINS(m.block_done.cost, "\"stages\":{\"load\":");
                    CHECK_CONTAINS(m.block_done.cost, "\"forward_passes\":");
                    CHECK_CONTAINS(m.block_done.cost, "\"bytes_written\":");
                }
                break;
            case QP_MSG_TASK_DONE:
                done = 1;
                CHECK_STR(m.task_done.job_id, id);
                CHECK_INT(m.task_done.job_finished, b == 1);
                if (b == 1) {
                    CHECK_STR(m.task_done.output, out);
                    CHECK(m.task_done.report && m.task_done.report[0] == '{');
                }
                break;
            case QP_MSG_TASK_FAILED:
                TEST_FAIL_("task_failed: %s", m.task_failed.error);
                done = 2;
                break;
            case QP_MSG_PARTS:
                CHECK_STR(m.parts.job_id, id);
                CHECK_INT(m.parts.block, b);
                parts_ran += serve_parts(&c, &m, job, &fanouts, &hb);
                break;
            default:
                TEST_FAIL_("unexpected message %s", qp_msg_type_name(m.type));
            }
            qp_msg_clear(&m);
        }
        CHECK_INT(done, 1);
        CHECK(progress > 0);
        CHECK_INT(block_done, 1);
    }
    /* Each block's quantize step went out as parts, and every part ran. */
    CHECK_INT(fanouts, 2);
    CHECK(parts_ran >= 2);
    CHECK(qd_fs_exists(test_path(out, "config.json")));
    CHECK(qd_fs_exists(test_path(out, "quantd_report.json")));
    CHECK(qd_fs_exists(test_path(out, "model.safetensors")) ||
          qd_fs_exists(test_path(out, "model.safetensors.index.json")));
    CHECK(!qd_fs_exists(test_path(out, ".quantd")));
    free(job);

    /* workers 1: no fan-out, and the same bytes; workers "all" on a daemon with no other
     * worker (task.fanout false): no fan-out either. */
    whole_without_parts(&c, &hb, model, dir, "outone", ",\"workers\":1", 1, out);
    whole_without_parts(&c, &hb, model, dir, "outnofan", "", 0, out);

    /* The pipeline kept open from block 0 to block 1 follows each task's fanout: none for
     * block 0, parts for block 1 (another node began to offer its workers). */
    char outs[1024];
    snprintf(outs, sizeof outs, "%s/outswitch", dir);
    char *js = make_job(model, outs, "");
    int sw_fanouts = 0, sw_parts = 0;
    for (int b = 0; b < 2; b++) {
        send_task_fan(&c, "wtest-outswitch", js, b, b);
        int done = 0;
        while (!done && recv_msg(&c, &m, &hb, 60000)) {
            if (m.type == QP_MSG_PARTS) {
                if (b == 0) TEST_FAIL_("parts announced by block 0 without fanout");
                CHECK_INT(m.parts.block, b);
                sw_parts += serve_parts(&c, &m, js, &sw_fanouts, &hb);
                continue;
            }
            if (m.type == QP_MSG_TASK_FAILED) { TEST_FAIL_("switch: task_failed: %s", m.task_failed.error); done = 2; }
            if (m.type == QP_MSG_TASK_DONE) done = 1;
            qp_msg_clear(&m);
        }
        CHECK_INT(done, 1);
    }
    CHECK_INT(sw_fanouts, 1);
    CHECK(sw_parts >= 2);
    CHECK(same_files(out, outs));
    free(js);

    /* A part of a job that does not parse: part_done, not ok, saying why; a parts_done no
     * fan-out waits for is ignored (the worker answers the next message as usual). */
    qp_msg pd;
    qp_msg_init(&pd, QP_MSG_PARTS_DONE);
    pd.parts_done.job_id = "nobody";
    pd.parts_done.block = 0;
    pd.parts_done.step = "quantize";
    send_frame(&c, &pd);
    qp_msg bp;
    qp_msg_init(&bp, QP_MSG_PART);
    bp.part.job_id = "bad";
    bp.part.job = "{\"model\":\"m\",\"output\":\"o\",\"method\":\"rtn\",\"bits\":5,\"id\":\"bad\"}";
    bp.part.checkpoint_dir = "unused";
    bp.part.block = 0;
    bp.part.step = "quantize";
    bp.part.index = 2;
    bp.part.fence = 3;
    send_frame(&c, &bp);
    CHECK(recv_msg(&c, &m, &hb, 10000));
    CHECK_INT(m.type, QP_MSG_PART_DONE);
    if (m.type == QP_MSG_PART_DONE) {
        CHECK_STR(m.part_done.job_id, "bad");
        CHECK_INT(m.part_done.index, 2);
        CHECK_INT(m.part_done.ok, 0);
        CHECK_CONTAINS(m.part_done.error, "job.bits");
    }
    qp_msg_clear(&m);

    /* A job that fails validation is not retryable. */
    send_task(&c, "bad", "{\"model\":\"m\",\"output\":\"o\",\"method\":\"rtn\",\"bits\":5,\"id\":\"bad\"}", -1);
    CHECK(recv_msg(&c, &m, &hb, 10000));
    CHECK_INT(m.type, QP_MSG_TASK_FAILED);
    if (m.type == QP_MSG_TASK_FAILED) {
        CHECK_STR(m.task_failed.job_id, "bad");
        CHECK_INT(m.task_failed.retryable, 0);
        CHECK_INT(m.task_failed.cancelled, 0);
        CHECK_CONTAINS(m.task_failed.error, "job.bits");
    }
    qp_msg_clear(&m);

    /* The whole job in one task, immediately followed by a task for another job and a
     * cancel of that second one: the second is cancelled (queued or running), the first
     * completes. */
    job = make_job(model, out2, "");
    char *job3 = make_job(model, out, ",\"overwrite\":true");
    send_task(&c, "wtest-out2", job, QP_TASK_WHOLE_JOB);
    send_task(&c, "wtest-out1", job3, QP_TASK_WHOLE_JOB);
    qp_msg cm;
    qp_msg_init(&cm, QP_MSG_CANCEL);
    cm.cancel.job_id = "wtest-out1";
    send_frame(&c, &cm);
    int done2 = 0, cancelled = 0, blocks2 = 0;
    while ((!done2 || !cancelled) && recv_msg(&c, &m, &hb, 60000)) {
        if (m.type == QP_MSG_PARTS) {
            serve_parts(&c, &m, !strcmp(m.parts.job_id, "wtest-out2") ? job : job3, &fanouts, &hb);
            continue;
        }
        if (m.type == QP_MSG_BLOCK_DONE && !strcmp(m.block_done.job_id, "wtest-out2")) blocks2++;
        if (m.type == QP_MSG_TASK_DONE) {
            CHECK_STR(m.task_done.job_id, "wtest-out2");
            CHECK_INT(m.task_done.job_finished, 1);
            done2 = 1;
        }
        if (m.type == QP_MSG_TASK_FAILED) {
            CHECK_STR(m.task_failed.job_id, "wtest-out1");
            CHECK_INT(m.task_failed.cancelled, 1);
            CHECK_INT(m.task_failed.exiting, 0);
            CHECK_INT(m.task_failed.retryable, 0);
            cancelled = 1;
        }
        qp_msg_clear(&m);
    }
    CHECK_INT(done2, 1);
    CHECK_INT(cancelled, 1);
    CHECK_INT(blocks2, 2);
    CHECK(qd_fs_exists(test_path(out2, "quantd_report.json")));
    free(job);
    free(job3);
    /* Heartbeats flowed at 100 ms throughout. */
    CHECK(hb >= 1);

    qp_msg sm;
    qp_msg_init(&sm, QP_MSG_SHUTDOWN);
    sm.shutdown.graceful = 1;
    send_frame(&c, &sm);
    CHECK_INT(wait_exit(&c, 20), 0);
    close(c.to);
    close(c.from);
    qp_wire_decoder_free(&c.d);

    /* EOF on stdin while idle is a clean exit too. */
    CHECK_OK(spawn_worker(&c, exe));
    CHECK(recv_msg(&c, &m, NULL, 10000));
    CHECK_INT(m.type, QP_MSG_HELLO);
    qp_msg_clear(&m);
    close(c.to);
    CHECK_INT(wait_exit(&c, 20), 0);
    close(c.from);
    qp_wire_decoder_free(&c.d);
}

/* A device error during a task (injected through the backend's fault hook, so no GPU is
 * needed): the task fails as retryable QD_EBACKEND with the call, file, line and device in
 * the message, and the worker then exits on its own (non-zero) so the daemon starts a fresh
 * one, instead of running the next task on a broken context. */
static void test_worker_device_error(void)
{
#ifdef QUANTD_FAULT_HOOKS
    const char *bdir = getenv("QUANTD_BUILD_DIR");
    char exe[4096];
    snprintf(exe, sizeof exe, "%s/quantd-worker", bdir ? bdir : ".");
    const char *dir = test_tmpdir();
    char model[1024], out[1024];
    snprintf(model, sizeof model, "%s/model", dir);
    snprintf(out, sizeof out, "%s/outfault", dir);
    qd_testgen_opts o = qd_testgen_defaults(QD_ARCH_LLAMA);
    qd_err err = {0};
    CHECK_OK(qd_testgen_write(model, &o, &err));
    child c;
    CHECK_OK(spawn_worker_env(&c, exe, "gemm:1"));
    qp_msg m;
    CHECK(recv_msg(&c, &m, NULL, 10000));
    CHECK_INT(m.type, QP_MSG_HELLO);
    CHECK_INT(m.hello.selftest_ok, 1);          /* the self-test calls no gemm */
    qp_msg_clear(&m);
    char *job = make_job(model, out, "");
    send_task(&c, "wtest-outfault", job, QP_TASK_WHOLE_JOB);
    /* A second task queued behind it must not run on the broken context. */
    send_task(&c, "wtest-outfault", job, QP_TASK_WHOLE_JOB);
    int failed = 0, others = 0, fanouts = 0;
    while (recv_msg(&c, &m, NULL, 60000)) {
        if (m.type == QP_MSG_PARTS) {
            serve_parts(&c, &m, job, &fanouts, NULL);
            continue;
        }
        if (m.type == QP_MSG_TASK_FAILED) {
            failed++;
            CHECK_STR(m.task_failed.job_id, "wtest-outfault");
            CHECK_INT(m.task_failed.code, QD_EBACKEND);
            CHECK_INT(m.task_failed.retryable, 1);
            CHECK_INT(m.task_failed.cancelled, 0);
            CHECK_CONTAINS(m.task_failed.error, "gemm failed: injected device fault");
            CHECK_CONTAINS(m.task_failed.error, "cpu: ");              /* the device */
            CHECK_CONTAINS(m.task_failed.error, "backend_fault.c:");   /* file and line */
            CHECK_INT(m.task_failed.exiting, 1);                       /* send it no more */
        } else if (m.type == QP_MSG_TASK_DONE || m.type == QP_MSG_BLOCK_DONE) {
            others++;
        }
        qp_msg_clear(&m);
    }
    CHECK_INT(failed, 1);
    CHECK_INT(others, 0);
    /* It exits without being asked (stdin still open), with a failure status. */
    CHECK_INT(wait_exit(&c, 20), 1);
    close(c.to);
    close(c.from);
    qp_wire_decoder_free(&c.d);
    free(job);
#else
    fprintf(stderr, "test_worker_device_error: built without QUANTD_FAULT_HOOKS, not run\n");
#endif
}

int main(void)
{
    const char *bdir = getenv("QUANTD_BUILD_DIR");
    char exe[4096];
    snprintf(exe, sizeof exe, "%s/quantd-worker", bdir ? bdir : ".");
    if (access(exe, X_OK)) {
        fprintf(stderr, "skip: %s not built\n", exe);
        return TEST_SKIP;
    }
    signal(SIGPIPE, SIG_IGN);
    TEST_RUN(test_worker);
    TEST_RUN(test_worker_device_error);
    return test_finish();
}
