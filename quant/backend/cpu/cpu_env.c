/* OpenBLAS's idle-thread setting for processes that run the CPU backend (see backend.h,
 * qd_backend_cpu_env_reexec). */
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include "quant/backend/backend.h"

void qd_backend_cpu_env_reexec(char **argv)
{
    if (!argv || !argv[0] || getenv("OPENBLAS_THREAD_TIMEOUT")) return;
    /* The program's real path, not /proc/self/exe: the kernel names the process after the
     * file executed, and ps, pgrep and systemd should keep seeing quantd-worker. */
    char path[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", path, sizeof path - 1);
    if (len <= 0) return;
    path[len] = '\0';
    if (setenv("OPENBLAS_THREAD_TIMEOUT", "4", 1) != 0) return;
    execv(path, argv);
    /* Exec refused: run on with OpenBLAS's default (slower, still correct). */
}
