/* Error records: formatting and the names of the codes in error.h. */
#include "quant/core/error.h"

#include <stdio.h>
#include <string.h>

int qd_err_setv(qd_err *err, int code, const char *fmt, va_list ap)
{
    if (err) {
        err->code = code;
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    }
    return code;
}

int qd_err_set(qd_err *err, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    qd_err_setv(err, code, fmt, ap);
    va_end(ap);
    return code;
}

int qd_err_prefix(qd_err *err, const char *fmt, ...)
{
    if (!err) return 0;
    char prefix[QD_ERR_MSG_MAX], old[QD_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    /* Assemble by hand: snprintf("%s: %s") would warn about truncation we accept. */
    size_t pl = strnlen(prefix, sizeof err->msg - 3), ol = strnlen(old, sizeof old);
    memcpy(err->msg, prefix, pl);
    memcpy(err->msg + pl, ": ", 2);
    size_t room = sizeof err->msg - pl - 3;
    if (ol > room) ol = room;
    memcpy(err->msg + pl + 2, old, ol);
    err->msg[pl + 2 + ol] = 0;
    return err->code;
}

void qd_err_clear(qd_err *err)
{
    if (err) { err->code = 0; err->msg[0] = 0; }
}

const char *qd_strerror(int code)
{
    switch (code) {
    case QD_OK: return "ok";
    case QD_EINVAL: return "invalid argument";
    case QD_EIO: return "i/o error";
    case QD_ENOMEM: return "out of memory";
    case QD_EFORMAT: return "malformed data";
    case QD_ENOTFOUND: return "not found";
    case QD_ENUMERIC: return "numerical failure";
    case QD_EUNSUPPORTED: return "unsupported";
    case QD_ECANCELLED: return "cancelled";
    case QD_ESHAPE: return "shape mismatch";
    case QD_EMISMATCH: return "mismatch";
    case QD_EBACKEND: return "backend failure";
    case QD_ERESOURCE: return "insufficient resources";
    case QD_EPREFLIGHT: return "refused by the pre-flight check";
    default: return "unknown error";
    }
}
