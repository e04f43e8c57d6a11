/* qd_backend_cpu_env_reexec: with OPENBLAS_THREAD_TIMEOUT unset the program comes back
 * (same argv) with it set to 4; a value the user set is kept and nothing is re-executed. */
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "quant/backend/backend.h"
#include "test_util.h"

static char **g_argv;

static void test_reexec_sets_timeout(void)
{
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        unsetenv("OPENBLAS_THREAD_TIMEOUT");
        setenv("QD_TEST_REEXEC_CHILD", "1", 1);
        qd_backend_cpu_env_reexec(g_argv);
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
    qd_backend_cpu_env_reexec(g_argv);             /* returns: nothing to do */
    CHECK_STR(getenv("OPENBLAS_THREAD_TIMEOUT"), "9");
    qd_backend_cpu_env_reexec(NULL);               /* NULL argv: a no-op */
}

int main(int argc, char **argv)
{
    (void)argc;
    if (getenv("QD_TEST_REEXEC_CHILD")) {
        const char *v = getenv("OPENBLAS_THREAD_TIMEOUT");
        return v && !strcmp(v, "4") ? 42 : 1;
    }
    g_argv = argv;
    TEST_RUN(test_reexec_sets_timeout);
    TEST_RUN(test_user_value_kept);
    return test_finish();
}
