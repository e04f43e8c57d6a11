/* The daemon config file fuzz harness. qdd_config_load reads the file by path, so the input
 * goes into an anonymous memory file (memfd, no disk) named as /proc/self/fd/N through
 * --config; daemon/config.c has no parse-from-memory entry point and gets none here (it was
 * being changed by other work at the time). An accepted config must hold every integer
 * inside its table range, a valid Redis URL and workers spec, distinct queue and key prefix,
 * a known log level; its dump must never contain the Redis password. A refusal must say
 * where ("<file>:<line>: ..." or the option's name). */
#define _GNU_SOURCE
#include "fuzz/daemon_config_fuzz_one.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "daemon/config.h"

static int fail(const char *why, const char *detail)
{
    fprintf(stderr, "daemon_config_fuzz_one: invariant broken: %s%s%s\n", why, detail ? ": " : "", detail ? detail : "");
    return -1;
}

static int check_config(const qdd_config *c)
{
    if (!c->redis || !c->node || !c->workers || !c->http || !c->queue || !c->key_prefix || !c->log_level ||
        !c->worker_path || !c->http_token || !c->http_cors)
        return fail("a string option is missing", NULL);
    if (!strcmp(c->queue, c->key_prefix)) return fail("queue equals key-prefix", c->queue);
    if (c->max_jobs < 0 || c->max_jobs > 100000 || c->retention_s < 1 || c->max_job_bytes < 2 ||
        c->max_job_bytes > 64 * 1024 || c->max_retries < 0 || c->max_retries > 100 || c->heartbeat_s < 1 ||
        c->heartbeat_s > 3600 || c->memory_limit_mb < 0 || c->node_ttl_ms < 300 || c->lease_ttl_ms < 300 ||
        c->stop_timeout_s < 0 || c->stop_timeout_s > 86400)
        return fail("an integer option outside its range", NULL);
    const char *lv = c->log_level;
    if (strcmp(lv, "debug") && strcmp(lv, "info") && strcmp(lv, "warn") && strcmp(lv, "error") && strcmp(lv, "off"))
        return fail("unknown log level", lv);
    const qdd_redis_url *u = &c->redis_url;
    if (!u->host || !u->host[0] || u->port < 1 || u->port > 65535 || u->db < 0) return fail("redis URL", c->redis);
    const qdd_workers *w = &c->worker_spec;
    if (w->kind == QDD_WORKERS_CPU ? (w->n_cpu < 1 || w->n_cpu > QDD_MAX_WORKERS)
                                   : (w->n_devices != QDD_CUDA_ALL && (w->n_devices < 1 || w->n_devices > QDD_MAX_WORKERS)))
        return fail("workers spec", c->workers);
    for (int i = 0; w->kind == QDD_WORKERS_CUDA && i < w->n_devices; i++)
        if (w->devices[i] < 0) return fail("negative CUDA ordinal", c->workers);
    for (size_t i = 0; i < c->n_allow_roots; i++)
        if (!c->allow_roots[i] || c->allow_roots[i][0] != '/') return fail("allow-root not canonical", NULL);
    char dump[8192];
    size_t need = qdd_config_dump(c, dump, sizeof dump);
    if (strlen(dump) >= sizeof dump || (need < sizeof dump && strlen(dump) != need)) return fail("dump length", NULL);
    /* With a password, the dump must hold the URL in its documented masked form, built here
     * from the parsed URL. (Other options, and the URL's own scheme, user or host, may spell
     * the password's characters, so looking for them would report nothing real.) */
    if (u->pass && u->pass[0] && need < sizeof dump) {
        char want[2048];
        snprintf(want, sizeof want, " redis=redis://%s:***@%s:%d/%d node=", u->user ? u->user : "", u->host, u->port, u->db);
        if (!strstr(dump, want)) return fail("the dump does not show the masked Redis URL", dump);
    }
    return 0;
}

int daemon_config_fuzz_one(const uint8_t *data, size_t size, int *accepted)
{
    if (accepted) *accepted = 0;
    static int fd = -1;   /* one memfd for the process: reused, never closed */
    if (fd < 0 && (fd = memfd_create("quantd-fuzz.conf", 0)) < 0) return fail("memfd_create failed", NULL);
    if (ftruncate(fd, 0) || (size && pwrite(fd, data, size, 0) != (ssize_t)size)) return fail("writing the memfd failed", NULL);
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    char *argv[] = {"quantd", "--config", path, NULL};
    char *envp[] = {NULL};
    qdd_config *c = (qdd_config *)(uintptr_t)1;
    qd_err err = {0};
    int bad = 0, rc = qdd_config_load(3, argv, envp, &c, &err);
    if (rc == 0) {
        if (!c) return fail("success without a config", NULL);
        if (accepted) *accepted = 1;
        bad = check_config(c);
        qdd_config_free(c);
    } else {
        if (rc > 0) bad = fail("an error path returned a positive code", NULL);
        if (c) bad = fail("a refused file still produced a config", NULL);
        if (!err.msg[0]) bad = fail("a refusal without a message", NULL);
    }
    return bad ? -1 : 0;
}
