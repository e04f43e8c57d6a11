/* sd_notify wrappers (see notify.h): one formatting path, sent through libsystemd when the
 * build has it and by a plain sendto on NOTIFY_SOCKET otherwise. */
#define _GNU_SOURCE
#include "daemon/notify.h"

#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "quant/core/error.h"

#ifdef QUANTD_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

static int notify_send(const char *msg)
{
    const char *path = getenv("NOTIFY_SOCKET");
    if (!path || !*path) return 0;
#ifdef QUANTD_HAVE_SYSTEMD
    int rc = sd_notify(0, msg);
    return rc < 0 ? QD_EIO : 0;
#else
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    size_t n = strlen(path);
    if (n >= sizeof sa.sun_path || (path[0] != '/' && path[0] != '@')) return QD_EINVAL;
    memcpy(sa.sun_path, path, n);
    if (path[0] == '@') sa.sun_path[0] = 0;   /* abstract namespace */
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return QD_EIO;
    ssize_t w = sendto(fd, msg, strlen(msg), MSG_NOSIGNAL, (struct sockaddr *)&sa,
                       (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n));
    close(fd);
    return w < 0 ? QD_EIO : 0;
#endif
}

/* "KEY=1\nSTATUS=<status>" with newlines in status flattened (a newline starts a new key). */
static int notify_with_status(const char *head, const char *status)
{
    char msg[1024];
    int k = snprintf(msg, sizeof msg, "%s%s%s", head, status ? "\nSTATUS=" : "", status ? status : "");
    if (k < 0) return QD_EINVAL;
    for (char *p = msg + strlen(head) + 1; status && *p; p++)
        if (*p == '\n') *p = ' ';
    return notify_send(msg);
}

int qdd_notify_ready(const char *status) { return notify_with_status("READY=1", status); }
int qdd_notify_reloading(const char *status) { return notify_with_status("RELOADING=1", status); }
int qdd_notify_stopping(const char *status) { return notify_with_status("STOPPING=1", status); }
int qdd_notify_watchdog(void) { return notify_send("WATCHDOG=1"); }

int qdd_notify_status(const char *fmt, ...)
{
    char status[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(status, sizeof status, fmt, ap);
    va_end(ap);
    char msg[1024];
    snprintf(msg, sizeof msg, "STATUS=%s", status);
    for (char *p = msg; *p; p++)
        if (*p == '\n') *p = ' ';
    return notify_send(msg);
}

uint64_t qdd_notify_watchdog_usec(void)
{
    /* Same rule as sd_watchdog_enabled: WATCHDOG_PID, when set, must be us. */
    const char *pid = getenv("WATCHDOG_PID"), *usec = getenv("WATCHDOG_USEC");
    if (!usec) return 0;
    if (pid && strtol(pid, NULL, 10) != (long)getpid()) return 0;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(usec, &end, 10);
    if (errno || *end || end == usec) return 0;
    return (uint64_t)v;
}
