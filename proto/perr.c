/* The qp_err record: formatting helpers (see perr.h for why proto has its own). */
#include "proto/perr.h"

#include <stdio.h>
#include <string.h>

int qp_err_set(qp_err *err, int code, const char *fmt, ...)
{
    if (!err) return code;
    va_list ap;
    va_start(ap, fmt);
    err->code = code;
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return code;
}

int qp_err_prefix(qp_err *err, const char *fmt, ...)
{
    if (!err) return 0;
    char prefix[QP_ERR_MSG_MAX], old[QP_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    /* A long message loses its tail, never its start (which names the field). */
    if (snprintf(err->msg, sizeof err->msg, "%s: %s", prefix, old) >= (int)sizeof err->msg)
        err->msg[sizeof err->msg - 1] = '\0';
    return err->code;
}

void qp_err_clear(qp_err *err)
{
    if (!err) return;
    err->code = 0;
    err->msg[0] = '\0';
}
