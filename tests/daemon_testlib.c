/* The daemon module test helpers and the fake worker (daemon_testlib.h). */
#define _GNU_SOURCE
#include "daemon_testlib.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "proto/wire.h"
#include "quant/core/error.h"

/* ---- the fake worker --------------------------------------------------------------------- */

static int fw_send(const qp_msg *m)
{
    uint8_t *frame = NULL;
    size_t n = 0;
    qp_err pe = {0};
    if (qp_wire_encode(m, &frame, &n, &pe)) {
        fprintf(stderr, "fake worker: encode: %s\n", pe.msg);
        return -1;
    }
    size_t off = 0;
    while (off < n) {
        ssize_t k = write(1, frame + off, n - off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        off += (size_t)k;
    }
    free(frame);
    return off == n ? 0 : -1;
}

static void fw_task(const char *mode, const qp_msg_task *t)
{
    qp_msg m;
    qp_msg_init(&m, QP_MSG_PROGRESS);
    m.progress.job_id = t->job_id;
    m.progress.stage = "quantize";
    m.progress.block = 0;
    m.progress.n_blocks = 2;
    m.progress.layer = "model.layers.0.self_attn.q_proj";
    m.progress.fraction = 0.25;
    m.progress.eta_s = 1;
    m.progress.layer_error = 0.01;
    if (!strcmp(mode, "fail")) {
        qp_msg_init(&m, QP_MSG_TASK_FAILED);
        m.task_failed.job_id = t->job_id;
        m.task_failed.error = "fake failure";
        m.task_failed.retryable = 1;
        fw_send(&m);
        return;
    }
    if (!strcmp(mode, "nospace")) {
        /* A block committed, then the next write finds the disk full (what the worker sends
         * for ENOSPC: QD_ERESOURCE, retryable). */
        qp_msg_init(&m, QP_MSG_BLOCK_DONE);
        m.block_done.job_id = t->job_id;
        m.block_done.block = 0;
        m.block_done.n_blocks = 2;
        m.block_done.seconds = 0.01;
        m.block_done.fence = t->fence;
        fw_send(&m);
        qp_msg_init(&m, QP_MSG_TASK_FAILED);
        m.task_failed.job_id = t->job_id;
        m.task_failed.error = "out/.quantd/block-001.safetensors: No space left on device";
        m.task_failed.code = QD_ERESOURCE;
        m.task_failed.retryable = 1;
        fw_send(&m);
        return;
    }
    fw_send(&m);
    if (!strcmp(mode, "hang")) return;   /* waits for cancel */
    for (int b = 0; b < 2; b++) {
        qp_msg_init(&m, QP_MSG_BLOCK_DONE);
        m.block_done.job_id = t->job_id;
        m.block_done.block = b;
        m.block_done.n_blocks = 2;
        m.block_done.seconds = 0.01;
        m.block_done.fence = t->fence;
        fw_send(&m);
    }
    cJSON *spec = cJSON_Parse(t->job);
    const cJSON *out = cJSON_GetObjectItemCaseSensitive(spec, "output");
    qp_msg_init(&m, QP_MSG_TASK_DONE);
    m.task_done.job_id = t->job_id;
    m.task_done.job_finished = 1;
    m.task_done.output = cJSON_IsString(out) ? out->valuestring : "/nonexistent";
    m.task_done.report = "{\"fake\":true}";
    fw_send(&m);
    cJSON_Delete(spec);
}

int dt_fake_worker_main(int argc, char **argv)
{
    if (argc < 3 || strcmp(argv[1], "--name")) return -1;
    const char *mode = getenv("QUANTD_FAKE_WORKER");
    if (!mode) mode = "ok";
    qp_msg m;
    qp_msg_init(&m, QP_MSG_HELLO);
    m.hello.worker = argv[2];
    m.hello.pid = getpid();
    m.hello.backend = "cpu";
    m.hello.device = "fake";
    m.hello.protocol = !strcmp(mode, "protocol") ? QP_WIRE_VERSION + 1 : QP_WIRE_VERSION;
    m.hello.selftest_ok = strcmp(mode, "selftest") != 0;
    m.hello.selftest = m.hello.selftest_ok ? "fake: ok" : "fake: dequant mismatch";
    fw_send(&m);
    if (!strcmp(mode, "exit")) _exit(3);
    qp_wire_decoder dec;
    qp_wire_decoder_init(&dec, 0);
    char buf[65536];
    int code = 0;
    for (;;) {
        ssize_t n = read(0, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        qp_err pe = {0};
        if (qp_wire_decoder_feed(&dec, buf, (size_t)n, &pe)) { code = 2; break; }
        qp_msg in;
        int rc, stop = 0;
        while ((rc = qp_wire_decoder_next(&dec, &in, &pe)) != 0) {
            if (rc < 0) continue;
            if (in.type == QP_MSG_TASK) fw_task(mode, &in.task);
            if (in.type == QP_MSG_CANCEL) {
                qp_msg f;
                qp_msg_init(&f, QP_MSG_TASK_FAILED);
                f.task_failed.job_id = in.cancel.job_id;
                f.task_failed.error = "cancelled";
                f.task_failed.code = QD_ECANCELLED;
                f.task_failed.cancelled = 1;
                fw_send(&f);
            }
            stop |= in.type == QP_MSG_SHUTDOWN;
            qp_msg_clear(&in);
        }
        if (stop) break;
    }
    qp_wire_decoder_free(&dec);
    /* _exit: a child of the test binary, with nothing to flush. */
    _exit(code);
}

/* ---- the daemon struct ------------------------------------------------------------------- */

int dt_daemon_init(qdd_daemon *d, uv_loop_t *loop, int argc, char **argv)
{
    memset(d, 0, sizeof *d);
    char **args = calloc((size_t)argc + 3, sizeof *args);
    if (!args) return -1;
    memcpy(args, argv, (size_t)argc * sizeof *args);
    args[argc] = "--worker-path";
    args[argc + 1] = "/proc/self/exe";
    char *envp[] = {NULL};
    qd_err err = {0};
    int rc = qdd_config_load(argc + 2, args, envp, &d->cfg, &err);
    free(args);
    if (rc) {
        fprintf(stderr, "dt_daemon_init: config: %s\n", err.msg);
        return -1;
    }
    qp_err pe = {0};
    if (qp_keys_init(&d->keys, d->cfg->queue, d->cfg->key_prefix, &pe)) {
        fprintf(stderr, "dt_daemon_init: keys: %s\n", pe.msg);
        qdd_config_free(d->cfg);
        return -1;
    }
    d->loop = loop;
    d->start_ms = qdd_unix_ms();
    d->config_gen = 1;
    snprintf(d->node, sizeof d->node, "%s", d->cfg->node);
    /* The fake worker is this binary: resolve it now, as the daemon does with its own path. */
    ssize_t n = readlink("/proc/self/exe", d->worker_exe, sizeof d->worker_exe - 1);
    if (n <= 0) {
        qdd_config_free(d->cfg);
        return -1;
    }
    d->worker_exe[n] = 0;
    qdd_rconn *conns[3] = {&d->cmd, &d->pop, &d->sub};
    static const char *const names[3] = {"cmd", "pop", "sub"};
    for (int i = 0; i < 3; i++) {
        if (qdd_rconn_init(conns[i], loop, &d->cfg->redis_url, names[i])) {
            for (int k = 0; k < i; k++) qdd_rconn_close(conns[k]);
            uv_run(loop, UV_RUN_DEFAULT);
            qdd_config_free(d->cfg);
            return -1;
        }
        conns[i]->ud = d;
        snprintf(conns[i]->client_name, sizeof conns[i]->client_name, "quantd:%s:%s", d->node, names[i]);
    }
    d->max_jobs = d->cfg->max_jobs > 0 ? (int)d->cfg->max_jobs : 1;
    return 0;
}

void dt_daemon_free(qdd_daemon *d)
{
    d->stopping = QDD_STOP_CLOSED;
    qdd_rconn_close(&d->cmd);
    qdd_rconn_close(&d->pop);
    qdd_rconn_close(&d->sub);
    for (int i = 0; i < d->n_workers; i++) {
        qdd_worker *w = &d->workers[i];
        qdd_pool_kill(w, "the test ends");
        if (!uv_is_closing((uv_handle_t *)&w->restart)) uv_close((uv_handle_t *)&w->restart, NULL);
    }
    /* Until the workers' exit callbacks ran and every handle closed (QDD_STOP_CLOSED: no
     * restart is scheduled any more). */
    uv_run(d->loop, UV_RUN_DEFAULT);
    qdd_jobs_free_all(d);
    qdd_pool_free(d);
    qdd_config_free(d->cfg);
    d->cfg = NULL;
}

/* ---- the loop ---------------------------------------------------------------------------- */

typedef struct dt_waiter {
    uv_timer_t t;
    uv_loop_t *loop;
    int (*cond)(void *);
    void *arg;
    uint64_t deadline;
    int met;
} dt_waiter;

static void on_wait_tick(uv_timer_t *t)
{
    dt_waiter *w = t->data;
    if ((w->cond && w->cond(w->arg)) || uv_now(w->loop) >= w->deadline) {
        w->met = w->cond ? w->cond(w->arg) : 1;
        uv_stop(w->loop);
    }
}

int dt_run_until(uv_loop_t *loop, int (*cond)(void *), void *arg, int ms)
{
    dt_waiter w = {.loop = loop, .cond = cond, .arg = arg};
    if (cond && cond(arg)) return 1;
    uv_update_time(loop);
    w.deadline = uv_now(loop) + (uint64_t)ms;
    uv_timer_init(loop, &w.t);
    w.t.data = &w;
    uv_timer_start(&w.t, on_wait_tick, 5, 5);
    uv_run(loop, UV_RUN_DEFAULT);
    uv_close((uv_handle_t *)&w.t, NULL);
    uv_run(loop, UV_RUN_NOWAIT);
    return w.met;
}
