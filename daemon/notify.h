/* systemd readiness and watchdog notifications (sd_notify), for Type=notify units.
 *
 * Outside systemd (no NOTIFY_SOCKET in the environment) every call is a no-op returning 0,
 * so the daemon calls them unconditionally. With libsystemd they go through sd_notify;
 * without it, the same datagram is sent by hand to NOTIFY_SOCKET (the protocol is one
 * newline-separated "KEY=value" datagram on a unix socket, abstract when it starts with
 * '@'). The environment is left in place so worker processes could notify too (they do
 * not: NotifyAccess=main). */
#ifndef QUANTD_DAEMON_NOTIFY_H
#define QUANTD_DAEMON_NOTIFY_H

#include <stdint.h>

/* Each returns 0 (sent, or nothing to send to) or a negative QD_E* code when the socket
 * named by NOTIFY_SOCKET could not be written. status strings may be NULL. */
int qdd_notify_ready(const char *status);       /* READY=1 (+ STATUS=...) */
int qdd_notify_status(const char *fmt, ...) __attribute__((format(printf, 1, 2)));   /* STATUS=... */
int qdd_notify_watchdog(void);                  /* WATCHDOG=1 */
int qdd_notify_reloading(const char *status);   /* RELOADING=1; send qdd_notify_ready after */
int qdd_notify_stopping(const char *status);    /* STOPPING=1 (+ STATUS=...) */
/* The watchdog interval systemd asked for (WATCHDOG_USEC for this pid), in microseconds;
 * 0 when the watchdog is off. Ping at half of it. */
uint64_t qdd_notify_watchdog_usec(void);

#endif
