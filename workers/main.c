/* quantd-worker: the process the daemon spawns per GPU or CPU slot. It speaks only the wire
 * protocol on stdin/stdout; stdout is moved to a private descriptor first and fd 1 pointed
 * at stderr, so a stray printf anywhere in the process cannot corrupt the message stream. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "quant/core/confine.h"
#include "quant/core/log.h"
#include "startup/runtime_env.h"
#include "workers/worker.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: quantd-worker [--name NAME] [--backend cpu|cuda:N] [--heartbeat-ms MS] [--allow-root DIR]...\n"
               "                     [--max-json-bytes N] [--max-tokenizer-bytes N] [--max-text-bytes N]\n"
               "Speaks the quantd wire protocol (proto/wire.md) on stdin/stdout; logs go to stderr.\n"
               "With --allow-root, every file a job names is opened beneath those directories only.\n");
}

/* Workers volunteer to be the OOM killer's first choice, so a memory-hungry job costs its
 * worker (which the daemon restarts) and never the daemon (systemd/quantd.service gives the
 * daemon OOMScoreAdjust=-100). Raising one's own score needs no privilege. */
static void raise_oom_score(void)
{
    FILE *f = fopen("/proc/self/oom_score_adj", "w");
    if (!f) return;
    fputs("800\n", f);
    fclose(f);
}

int main(int argc, char **argv)
{
    qst_openblas_reexec(argv);
    qst_malloc_tune();
    raise_oom_score();
    qd_runtime_opts rt;
    qw_opts o = {.name = "cpu0", .backend = "cpu", .rt = &rt, .heartbeat_ms = 2000, .in_fd = 0};
    const char **roots = calloc((size_t)argc, sizeof *roots);
    size_t n_roots = 0;
    uint64_t limits[QD_INPUT_KINDS] = {0};
    if (!roots) { perror("quantd-worker"); return 1; }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        if (!v) { usage(stderr); return 2; }
        if (!strcmp(a, "--name")) o.name = v;
        else if (!strcmp(a, "--backend")) o.backend = v;
        else if (!strcmp(a, "--heartbeat-ms")) o.heartbeat_ms = atoi(v);
        else if (!strcmp(a, "--allow-root")) roots[n_roots++] = v;
        else if (!strcmp(a, "--max-json-bytes")) limits[QD_INPUT_JSON] = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--max-tokenizer-bytes")) limits[QD_INPUT_TOKENIZER] = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--max-text-bytes")) limits[QD_INPUT_TEXT] = strtoull(v, NULL, 10);
        else { usage(stderr); return 2; }
        i++;
    }
    if (o.heartbeat_ms <= 0) { fprintf(stderr, "quantd-worker: --heartbeat-ms must be positive\n"); return 2; }
    qst_runtime_from_env(&rt);
    qd_log_set_level(rt.log_level);
    /* The environment's limits, then the daemon's flags over them. */
    qd_confine_set_limits(rt.input_max_bytes);
    qd_confine_set_limits(limits);
    qd_err cerr = {0};
    if (n_roots && qd_confine_set(roots, n_roots, &cerr)) {
        fprintf(stderr, "quantd-worker: %s\n", cerr.msg);
        free(roots);
        return 2;
    }
    free(roots);
    fflush(stdout);
    o.out_fd = dup(1);
    if (o.out_fd < 0 || dup2(2, 1) < 0) { perror("quantd-worker: dup"); return 1; }
    qd_err err = {0};
    int rc = qw_worker_run(&o, &err);
    if (rc) {
        QD_LOG(QD_LOG_ERROR, "worker_exit", "name=%s code=%d err=\"%s\"", o.name, rc, err.msg);
        return 1;
    }
    QD_LOG(QD_LOG_INFO, "worker_exit", "name=%s reason=done", o.name);
    return 0;
}
