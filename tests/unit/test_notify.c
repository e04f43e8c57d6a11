/* daemon/notify: the sd_notify datagrams arrive on the socket named by NOTIFY_SOCKET with
 * the right keys, and every call is a harmless no-op without it. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "daemon/notify.h"
#include "test_util.h"

static int listen_sock(const char *path)
{
    int fd = socket(AF_UNIX, SOCK_DGRAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    unlink(path);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa)) return -1;
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

static const char *recv_msg(int fd)
{
    static char buf[2048];
    ssize_t n = recv(fd, buf, sizeof buf - 1, 0);
    buf[n > 0 ? n : 0] = 0;
    return buf;
}

static void test_no_socket(void)
{
    unsetenv("NOTIFY_SOCKET");
    CHECK_OK(qdd_notify_ready("x"));
    CHECK_OK(qdd_notify_watchdog());
    CHECK_OK(qdd_notify_status("jobs=%d", 1));
}

static void test_messages(void)
{
    const char *path = test_path(test_tmpdir(), "notify.sock");
    int fd = listen_sock(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    setenv("NOTIFY_SOCKET", path, 1);
    CHECK_OK(qdd_notify_ready("ready: 2 workers"));
    const char *m = recv_msg(fd);
    CHECK_CONTAINS(m, "READY=1");
    CHECK_CONTAINS(m, "STATUS=ready: 2 workers");
    CHECK_OK(qdd_notify_status("running %d jobs\non node %s", 3, "n1"));
    m = recv_msg(fd);
    CHECK_STR(m, "STATUS=running 3 jobs on node n1");   /* a newline would start a new key */
    CHECK_OK(qdd_notify_watchdog());
    CHECK_STR(recv_msg(fd), "WATCHDOG=1");
    CHECK_OK(qdd_notify_reloading(NULL));
    CHECK_STR(recv_msg(fd), "RELOADING=1");
    CHECK_OK(qdd_notify_stopping("checkpointing"));
    m = recv_msg(fd);
    CHECK_CONTAINS(m, "STOPPING=1");
    CHECK_CONTAINS(m, "STATUS=checkpointing");
    close(fd);
    unsetenv("NOTIFY_SOCKET");
}

static void test_watchdog_usec(void)
{
    unsetenv("WATCHDOG_USEC");
    unsetenv("WATCHDOG_PID");
    CHECK_INT(qdd_notify_watchdog_usec(), 0);
    setenv("WATCHDOG_USEC", "30000000", 1);
    CHECK_INT(qdd_notify_watchdog_usec(), 30000000);
    char pid[32];
    snprintf(pid, sizeof pid, "%d", (int)getpid() + 1);
    setenv("WATCHDOG_PID", pid, 1);   /* meant for another process */
    CHECK_INT(qdd_notify_watchdog_usec(), 0);
    unsetenv("WATCHDOG_USEC");
    unsetenv("WATCHDOG_PID");
}

int main(void)
{
    TEST_RUN(test_no_socket);
    TEST_RUN(test_messages);
    TEST_RUN(test_watchdog_usec);
    return test_finish();
}
