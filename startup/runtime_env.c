/* The environment -> runtime options, and OpenBLAS's re-exec (see runtime_env.h). */
#include "startup/runtime_env.h"

#include <errno.h>
#include <limits.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "quant/core/log.h"

/* QUANTD_CPU_CACHE_MB: a plain non-negative number of MB that fits a size_t in bytes, or -1
 * (the default) after a warning. */
static int64_t cache_mb_parse(const char *env, int log_level)
{
    char *end = NULL;
    errno = 0;
    unsigned long long mb = strtoull(env, &end, 10);
    if (env[0] != '-' && errno == 0 && end && *end == '\0' && mb <= ((size_t)-1 >> 20) && mb <= INT64_MAX)
        return (int64_t)mb;
    /* The level QUANTD_LOG asks for, which the caller has not applied yet. */
    if (QD_LOG_WARN >= log_level)
        qd_log_emit(QD_LOG_WARN, "cpu_cache_env", "QUANTD_CPU_CACHE_MB=\"%s\" is not a number of MB; using the default",
                    env);
    return -1;
}

void qst_runtime_from_env(qd_runtime_opts *o)
{
    *o = qd_runtime_opts_default();
    int l = qd_log_level_parse(getenv("QUANTD_LOG"));
    if (l >= 0) o->log_level = l;

    const char *env = getenv("QUANTD_THREADS");
    if (env && *env) {
        char *end = NULL;
        long v = strtol(env, &end, 10);
        if (end && *end == '\0' && v >= 1 && v <= 1024) o->threads = (int)v;
    }

    env = getenv("QUANTD_CPU_CACHE_MB");
    if (env && *env) o->cpu_cache_mb = cache_mb_parse(env, o->log_level);

    env = getenv("QUANTD_CPU_KERNEL");
    if (env && !strcmp(env, "portable")) o->cpu_kernel = QD_CPU_KERNEL_PORTABLE;
    else if (env && !strcmp(env, "avx2")) o->cpu_kernel = QD_CPU_KERNEL_AVX2;

    env = getenv("QUANTD_GPTQ_FORM");
    if (env && !strcmp(env, "inverse")) o->gptq_form = QD_GPTQ_FORM_INVERSE;

    env = getenv("QUANTD_FAULT_INJECT");
    if (env && *env) o->fault_inject = env;

    static const char *const limits[] = {"QUANTD_MAX_JSON_BYTES", "QUANTD_MAX_TOKENIZER_BYTES", "QUANTD_MAX_TEXT_BYTES"};
    for (int k = 0; k < 3; k++) {
        env = getenv(limits[k]);
        if (!env || !*env) continue;
        char *end = NULL;
        errno = 0;
        unsigned long long v = strtoull(env, &end, 10);
        if (end && *end == '\0' && !errno && v > 0 && env[0] != '-') o->input_max_bytes[k] = v;
        else if (o->log_level <= QD_LOG_WARN)
            qd_log_emit(QD_LOG_WARN, "input_limit_env", "%s=\"%s\" is not a positive number of bytes; using the default",
                        limits[k], env);
    }
}

void qst_openblas_reexec(char **argv)
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

void qst_malloc_tune(void)
{
    /* Advice: a failure leaves glibc's default. */
    (void)mallopt(M_MMAP_MAX, 0);
    (void)mallopt(M_TRIM_THRESHOLD, -1);   /* mallopt(3): -1 never trims */
}

void qst_startup(char **argv, qd_runtime_opts *o)
{
    qst_openblas_reexec(argv);
    qst_malloc_tune();
    qst_runtime_from_env(o);
    qd_log_set_level(o->log_level);
    qd_confine_set_limits(o->input_max_bytes);
}
