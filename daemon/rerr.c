/* Redis error replies logged once per change, with the backoff of rconn.h (rerr.h). */
#include "daemon/rerr.h"

#include <stdio.h>
#include <string.h>

#include "daemon/rconn.h"
#include "quant/core/clock.h"
#include "quant/core/log.h"

int qdd_rerr_fail(qdd_rerr *e, const char *op, const char *cmd, const char *err)
{
    char event[48];
    e->op = op ? op : "redis";
    op = e->op;
    if (!err || !*err) err = "error reply without a message";
    if (e->backoff_ms < QDD_BACKOFF_MIN_MS) e->backoff_ms = QDD_BACKOFF_MIN_MS;
    int delay = e->backoff_ms;
    e->backoff_ms = e->backoff_ms * 2 > QDD_BACKOFF_MAX_MS ? QDD_BACKOFF_MAX_MS : e->backoff_ms * 2;
    e->total++;
    /* The same error (a long one compared as far as it is kept): counted, not logged. */
    char cut[sizeof e->err];
    snprintf(cut, sizeof cut, "%s", err);
    if (e->err[0] && !strcmp(e->err, cut) && !strcmp(e->cmd, cmd)) {
        e->repeats++;
        return delay;
    }
    snprintf(event, sizeof event, "%s_error", op);
    if (e->err[0])
        QD_LOG(QD_LOG_ERROR, event, "cmd=%s err=\"%s\" retry_ms=%d previous_cmd=%s previous=\"%s\" repeated=%llu", cmd,
               err, delay, e->cmd, e->err, (unsigned long long)e->repeats);
    else
        QD_LOG(QD_LOG_ERROR, event, "cmd=%s err=\"%s\" retry_ms=%d (retried with backoff up to %d ms; logged again when it changes or clears)",
               cmd, err, delay, QDD_BACKOFF_MAX_MS);
    snprintf(e->cmd, sizeof e->cmd, "%s", cmd);
    snprintf(e->err, sizeof e->err, "%s", cut);
    e->repeats = 0;
    e->since_ms = qd_clock_now_ms();
    return delay;
}

int qdd_rerr_ok(qdd_rerr *e, const char *cmd)
{
    if (!e->err[0]) {
        e->backoff_ms = QDD_BACKOFF_MIN_MS;
        return 0;
    }
    if (cmd && strcmp(cmd, e->cmd)) return 0;
    char event[48];
    snprintf(event, sizeof event, "%s_error_cleared", e->op ? e->op : "redis");
    QD_LOG(QD_LOG_INFO, event, "cmd=%s err=\"%s\" repeated=%llu for_ms=%llu", e->cmd, e->err,
           (unsigned long long)e->repeats, (unsigned long long)(qd_clock_now_ms() - e->since_ms));
    e->err[0] = 0;
    e->cmd[0] = 0;
    e->repeats = 0;
    e->backoff_ms = QDD_BACKOFF_MIN_MS;
    return 1;
}

int qdd_rerr_active(const qdd_rerr *e) { return e->err[0] != 0; }

void qdd_rerr_describe(const qdd_rerr *e, char *buf, size_t cap)
{
    if (!cap) return;
    if (!e->err[0]) buf[0] = 0;
    else snprintf(buf, cap, "%s: %s", e->cmd, e->err);
}
