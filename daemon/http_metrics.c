/* GET /metrics in the Prometheus text format (version 0.0.4): jobs by state and queue
 * depths from Redis (one Lua script, so the counts are taken together), the block-duration
 * histogram fed by the daemon through qdd_http_view.drain_block_seconds, worker states and
 * per-GPU memory from qdd_http_view.workers. */
#define _GNU_SOURCE
#include "daemon/http_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Returns {queued, running, done, failed, cancelled, queue length, failed-list length, jobs
 * indexed}. Jobs are counted from the index, as /v1/jobs lists them. */
const char qh_metrics_script[] =
    "local c = {queued = 0, running = 0, done = 0, failed = 0, cancelled = 0}\n"
    "local ids = redis.call('ZRANGE', KEYS[1], 0, 49999)\n"
    "for _, id in ipairs(ids) do\n"
    "  local s = redis.call('HGET', ARGV[1] .. ':' .. id, 'state')\n"
    "  if s and c[s] then c[s] = c[s] + 1 end\n"
    "end\n"
    "return {c.queued, c.running, c.done, c.failed, c.cancelled, redis.call('LLEN', KEYS[2]),\n"
    "        redis.call('LLEN', KEYS[3]), #ids}\n";

/* Upper bounds in seconds; a block of a 7B model on one GPU takes seconds to a minute. */
static const double bounds[QH_N_BUCKETS - 1] = {0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600};

void qh_metrics_drain(qdd_http *h)
{
    if (!h->view.drain_block_seconds) return;
    double obs[256];
    for (int guard = 0; guard < 1000; guard++) {
        size_t n = h->view.drain_block_seconds(h->view.ud, obs, 256);
        if (n > 256) n = 256;
        for (size_t i = 0; i < n; i++) {
            double v = obs[i];
            if (!(v >= 0)) continue;   /* NaN or negative: a bug upstream, not a sample */
            size_t b = 0;
            while (b < QH_N_BUCKETS - 1 && v > bounds[b]) b++;
            h->bucket[b]++;
            h->n_obs++;
            h->sum_obs += v;
        }
        if (n < 256) break;
    }
}

typedef struct sbuf { char *s; size_t len, cap; int oom; } sbuf;

static void put(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(sbuf *b, const char *fmt, ...)
{
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (k < 0) { b->oom = 1; return; }
        if ((size_t)k < b->cap - b->len) { b->len += (size_t)k; return; }
        size_t cap = b->cap * 2 + (size_t)k;
        char *n = realloc(b->s, cap);
        if (!n) { b->oom = 1; return; }
        b->s = n;
        b->cap = cap;
    }
}

/* Label values: backslash, quote and newline escaped as the format requires. */
static const char *label(const char *v, char *buf, size_t cap)
{
    size_t w = 0;
    for (; *v && w + 3 < cap; v++) {
        if (*v == '\\' || *v == '"') { buf[w++] = '\\'; buf[w++] = *v; }
        else if (*v == '\n') { buf[w++] = '\\'; buf[w++] = 'n'; }
        else buf[w++] = *v;
    }
    buf[w] = 0;
    return buf;
}

char *qh_metrics_render(qdd_http *h, const redisReply *c)
{
    sbuf b = {malloc(8192), 0, 8192, 0};
    if (!b.s) return NULL;
    b.s[0] = 0;
    char l1[160], l2[160];
    const char *node = h->view.node ? h->view.node(h->view.ud) : NULL;
    put(&b, "# HELP quantd_up The daemon is serving.\n# TYPE quantd_up gauge\nquantd_up{node=\"%s\"} 1\n",
        label(node ? node : "", l1, sizeof l1));
    put(&b, "# HELP quantd_redis_up The daemon's Redis command connection is up.\n# TYPE quantd_redis_up gauge\n"
            "quantd_redis_up %d\n", qh_redis_ready(h) && c ? 1 : 0);
    put(&b, "# HELP quantd_config_generation The configuration in force: 1 at start, +1 per reload.\n"
            "# TYPE quantd_config_generation gauge\nquantd_config_generation %llu\n", (unsigned long long)h->config_gen);
    if (c && c->elements >= 8) {
        static const char *const states[] = {"queued", "running", "done", "failed", "cancelled"};
        put(&b, "# HELP quantd_jobs Jobs in the index by state.\n# TYPE quantd_jobs gauge\n");
        for (int i = 0; i < 5; i++)
            put(&b, "quantd_jobs{state=\"%s\"} %lld\n", states[i], c->element[i]->integer);
        put(&b, "# HELP quantd_queue_depth Payloads waiting in the queue list.\n# TYPE quantd_queue_depth gauge\n"
                "quantd_queue_depth %lld\n", c->element[5]->integer);
        put(&b, "# HELP quantd_failed_payloads Payloads refused at admission (failed list length).\n"
                "# TYPE quantd_failed_payloads gauge\nquantd_failed_payloads %lld\n", c->element[6]->integer);
    }
    qh_metrics_drain(h);
    put(&b, "# HELP quantd_block_duration_seconds Time to quantize one transformer block.\n"
            "# TYPE quantd_block_duration_seconds histogram\n");
    uint64_t cum = 0;
    for (int i = 0; i < QH_N_BUCKETS - 1; i++) {
        cum += h->bucket[i];
        put(&b, "quantd_block_duration_seconds_bucket{le=\"%g\"} %llu\n", bounds[i], (unsigned long long)cum);
    }
    put(&b, "quantd_block_duration_seconds_bucket{le=\"+Inf\"} %llu\n", (unsigned long long)h->n_obs);
    put(&b, "quantd_block_duration_seconds_sum %.6f\nquantd_block_duration_seconds_count %llu\n", h->sum_obs,
        (unsigned long long)h->n_obs);
    qdd_worker_view w[64];
    int n = h->view.workers ? h->view.workers(h->view.ud, w, 64) : 0;
    if (n > 64) n = 64;
    put(&b, "# HELP quantd_worker_state Each worker's state (1 for its current state).\n"
            "# TYPE quantd_worker_state gauge\n");
    for (int i = 0; i < n; i++) {
        w[i].name[sizeof w[i].name - 1] = w[i].state[sizeof w[i].state - 1] = 0;
        put(&b, "quantd_worker_state{worker=\"%s\",state=\"%s\"} 1\n", label(w[i].name, l1, sizeof l1),
            label(w[i].state, l2, sizeof l2));
    }
    put(&b, "# HELP quantd_worker_restarts_total Times each worker was restarted.\n"
            "# TYPE quantd_worker_restarts_total counter\n");
    for (int i = 0; i < n; i++)
        put(&b, "quantd_worker_restarts_total{worker=\"%s\"} %d\n", label(w[i].name, l1, sizeof l1), w[i].restarts);
    int gpu = 0;
    for (int i = 0; i < n; i++)
        if (w[i].gpu_mem_total >= 0) {
            if (!gpu++)
                put(&b, "# HELP quantd_gpu_memory_bytes GPU memory per worker's device.\n"
                        "# TYPE quantd_gpu_memory_bytes gauge\n");
            label(w[i].name, l1, sizeof l1);
            put(&b, "quantd_gpu_memory_bytes{worker=\"%s\",kind=\"used\"} %lld\n", l1, (long long)w[i].gpu_mem_used);
            put(&b, "quantd_gpu_memory_bytes{worker=\"%s\",kind=\"total\"} %lld\n", l1, (long long)w[i].gpu_mem_total);
        }
    if (b.oom) { free(b.s); return NULL; }
    return b.s;
}
