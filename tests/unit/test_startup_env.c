/* The programs' start-up (startup/runtime_env.c): every QUANTD_* variable becomes its
 * runtime option, a value that cannot be used leaves the default, and the OpenBLAS re-exec
 * (with OPENBLAS_THREAD_TIMEOUT unset the program comes back, same argv, with it set to 4;
 * a value the user set is kept and nothing is re-executed). */
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "quant/core/log.h"
#include "startup/runtime_env.h"
#include "test_util.h"

static char **g_argv;

static const char *const vars[] = {"QUANTD_LOG", "QUANTD_THREADS", "QUANTD_CPU_CACHE_MB", "QUANTD_CPU_KERNEL",
                                   "QUANTD_GPTQ_FORM", "QUANTD_FAULT_INJECT"};

static void unset_all(void)
{
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
}

static void test_defaults(void)
{
    unset_all();
    qd_runtime_opts o;
    qst_runtime_from_env(&o);
    CHECK_INT(o.log_level, QD_LOG_INFO);
    CHECK_INT(o.threads, 0);
    CHECK_INT(o.cpu_cache_mb, -1);
    CHECK_INT(o.cpu_kernel, QD_CPU_KERNEL_AUTO);
    CHECK_INT(o.gptq_form, QD_GPTQ_FORM_AUTO);
    CHECK(o.fault_inject == NULL);
}

static void test_each_variable(void)
{
    unset_all();
    setenv("QUANTD_LOG", "debug", 1);
    setenv("QUANTD_THREADS", "3", 1);
    setenv("QUANTD_CPU_CACHE_MB", "12", 1);
    setenv("QUANTD_CPU_KERNEL", "portable", 1);
    setenv("QUANTD_GPTQ_FORM", "inverse", 1);
    setenv("QUANTD_FAULT_INJECT", "gemm:2", 1);
    qd_runtime_opts o;
    qst_runtime_from_env(&o);
    CHECK_INT(o.log_level, QD_LOG_DEBUG);
    CHECK_INT(o.threads, 3);
    CHECK_INT(o.cpu_cache_mb, 12);
    CHECK_INT(o.cpu_kernel, QD_CPU_KERNEL_PORTABLE);
    CHECK_INT(o.gptq_form, QD_GPTQ_FORM_INVERSE);
    CHECK_STR(o.fault_inject, "gemm:2");
    setenv("QUANTD_CPU_KERNEL", "avx2", 1);
    setenv("QUANTD_CPU_CACHE_MB", "0", 1);
    qst_runtime_from_env(&o);
    CHECK_INT(o.cpu_kernel, QD_CPU_KERNEL_AVX2);
    CHECK_INT(o.cpu_cache_mb, 0);
    unset_all();
}

/* Values the library always ignored still leave the default. */
static void test_bad_values(void)
{
    unset_all();
    setenv("QUANTD_LOG", "loud", 1);
    setenv("QUANTD_THREADS", "0", 1);
    setenv("QUANTD_CPU_KERNEL", "sse", 1);
    setenv("QUANTD_GPTQ_FORM", "ldl", 1);
    setenv("QUANTD_FAULT_INJECT", "", 1);
    qd_runtime_opts o;
    qst_runtime_from_env(&o);
    CHECK_INT(o.log_level, QD_LOG_INFO);
    CHECK_INT(o.threads, 0);
    CHECK_INT(o.cpu_kernel, QD_CPU_KERNEL_AUTO);
    CHECK_INT(o.gptq_form, QD_GPTQ_FORM_AUTO);
    CHECK(o.fault_inject == NULL);
    const char *threads[] = {"2000", "4x", "-1"};
    for (int i = 0; i < 3; i++) {
        setenv("QUANTD_THREADS", threads[i], 1);
        qst_runtime_from_env(&o);
        CHECK_INT(o.threads, 0);
    }
    const char *cache[] = {"abc", "12MB", "-5", "99999999999999999999"};
    for (int i = 0; i < 4; i++) {                  /* warned about, then the default */
        setenv("QUANTD_CPU_CACHE_MB", cache[i], 1);
        qst_runtime_from_env(&o);
        CHECK_INT(o.cpu_cache_mb, -1);
    }
    unset_all();
}

static void test_reexec_sets_timeout(void)
{
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        unsetenv("OPENBLAS_THREAD_TIMEOUT");
        setenv("QD_TEST_REEXEC_CHILD", "1", 1);
        qst_openblas_reexec(g_argv);
        _exit(3);                                   /* only reached when exec failed */
    }
    int st = 0;
    CHECK(waitpid(pid, &st, 0) == pid);
    CHECK(WIFEXITED(st));
    CHECK_INT(WEXITSTATUS(st), 42);
}

static void test_user_value_kept(void)
{
    setenv("OPENBLAS_THREAD_TIMEOUT", "9", 1);
    qst_openblas_reexec(g_argv);                   /* returns: nothing to do */
    CHECK_STR(getenv("OPENBLAS_THREAD_TIMEOUT"), "9");
    qst_openblas_reexec(NULL);                     /* NULL argv: a no-op */
}

int main(int argc, char **argv)
{
    (void)argc;
    if (getenv("QD_TEST_REEXEC_CHILD")) {
        const char *v = getenv("OPENBLAS_THREAD_TIMEOUT");
        return v && !strcmp(v, "4") ? 42 : 1;
    }
    g_argv = argv;
    TEST_RUN(test_defaults);
    TEST_RUN(test_each_variable);
    TEST_RUN(test_bad_values);
    TEST_RUN(test_reexec_sets_timeout);
    TEST_RUN(test_user_value_kept);
    return test_finish();
}
