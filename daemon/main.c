/* quantd: the long-running service. Reads the configuration (flags > environment > file >
 * defaults), logs the effective configuration and runs the daemon loop (daemon.c) until
 * SIGTERM/SIGINT; exits 0 after a clean stop, 2 on a bad configuration, 1 otherwise. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/config.h"
#include "daemon/daemon.h"
#include "quant/core/log.h"
#include "startup/runtime_env.h"

extern char **environ;

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            char buf[16384];
            qdd_config_usage(buf, sizeof buf);
            printf("usage: quantd [--config FILE] [options]\n"
                   "Takes quantization jobs from Redis (redis-cli LPUSH qjobs '<job json>') and runs them\n"
                   "on worker processes. Options (also QUANTD_<NAME> in the environment, or NAME = value\n"
                   "lines in the config file; flags win over the environment, which wins over the file):\n%s",
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
    return qdd_daemon_run(cfg, argc, argv, environ);
}
