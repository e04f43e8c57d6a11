/* The qp_err record: formatting helpers (see perr.h for why the job spec and the protocol
 * have their own). */
#include "quant/job/perr.h"

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

