/* quantd: the long-running service. Reads the configuration (flags > environment > file >
 * defaults), logs the effective configuration and runs the daemon loop (daemon.c) until
 * SIGTERM/SIGINT; exits 0 after a clean stop, 2 on a bad configuration, 1 otherwise. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/config.h"
#include "daemon/daemon.h"
#include "quant/core/confine.h"
#include "quant/core/log.h"
#include "startup/runtime_env.h"

extern char **environ;

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            char buf[16384];
            qdd_config_usage(buf, sizeof buf);
            /* qdd_config_usage starts with the usage line and the option table. */
            printf("%s"
                   "Takes quantization jobs from Redis (redis-cli LPUSH qjobs '<job json>') and runs them on\n"
                   "worker processes. Flags win over the environment, which wins over the file.\n",
                   buf);
            return 0;
        }
    }
    /* The runtime options matter here for the log level only: the daemon opens no backend,
     * and each quantd-worker it spawns reads the same environment itself. */
    qd_runtime_opts rt;
    qst_runtime_from_env(&rt);
    qd_log_set_level(rt.log_level);
    qdd_config *cfg = NULL;
    qd_err err = {0};
    if (qdd_config_load(argc, argv, environ, &cfg, &err)) {
        fprintf(stderr, "quantd: %s\n", err.msg);
        return 2;
    }
    int lvl = qd_log_level_parse(cfg->log_level);
    if (lvl >= 0 && !getenv("QUANTD_LOG")) qd_log_set_level(lvl);
    /* Admission reads each job's config.json: beneath the allow-roots and within the limits,
     * as the workers' reads are (quant/core/confine.h). */
    uint64_t limits[QD_INPUT_KINDS] = {(uint64_t)cfg->max_json_bytes, (uint64_t)cfg->max_tokenizer_bytes,
                                       (uint64_t)cfg->max_text_bytes, 0};
    qd_confine_set_limits(limits);
    if (cfg->n_allow_roots && qd_confine_set((const char *const *)cfg->allow_roots, cfg->n_allow_roots, &err)) {
        fprintf(stderr, "quantd: %s\n", err.msg);
        qdd_config_free(cfg);
        return 2;
    }
    return qdd_daemon_run(cfg, argc, argv, environ);
}
