/* Error codes and the error record every fallible quant/ call fills.
 *
 * Functions return 0 on success or a negative QD_E* code. Those that can say more take a
 * `qd_err *err` (may be NULL) and write one human-readable sentence into it, naming the
 * file, tensor or field concerned ("model.safetensors: tensor 'lm_head.weight': data
 * offsets [0, 10) do not match shape [4, 4] x F32 = 64 bytes"). The record is owned by the
 * caller, usually on its stack. */
#ifndef QUANT_CORE_ERROR_H
#define QUANT_CORE_ERROR_H

#include <stdarg.h>

enum qd_status {
    QD_OK = 0,
    QD_EINVAL = -1,       /* bad argument or option */
    QD_EIO = -2,          /* read/write/open failed (errno in the message) */
    QD_ENOMEM = -3,       /* allocation failed */
    QD_EFORMAT = -4,      /* malformed file or data */
    QD_ENOTFOUND = -5,    /* missing file, tensor or key */
    QD_ENUMERIC = -6,     /* NaN/Inf, or a factorisation that cannot be rescued */
    QD_EUNSUPPORTED = -7, /* valid but not handled (architecture, dtype, bits) */
    QD_ECANCELLED = -8,   /* stopped on request */
    QD_ESHAPE = -9,       /* shapes disagree */
    QD_EMISMATCH = -10,   /* fingerprint or version mismatch */
    QD_EBACKEND = -11,    /* the compute backend failed (CUDA error and the like) */
    QD_ERESOURCE = -12,   /* not enough memory or disk for the request (may pass later) */
    QD_EPREFLIGHT = -13,  /* refused before any work: the job cannot fit this machine as given */
};

#define QD_ERR_MSG_MAX 512

typedef struct qd_err {
    int code;
    char msg[QD_ERR_MSG_MAX];
} qd_err;

/* Records code and a printf-style message in err (when non-NULL); returns code, so
 * `return qd_err_set(err, QD_EINVAL, "bits: %d is not one of 2, 3, 4, 8", b);` works. */
int qd_err_set(qd_err *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int qd_err_setv(qd_err *err, int code, const char *fmt, va_list ap);
/* Prepends "prefix: " to an existing message (for adding context while unwinding). */
int qd_err_prefix(qd_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void qd_err_clear(qd_err *err);
/* A short fixed name for a code ("invalid argument", "malformed data", ...). */
const char *qd_strerror(int code);

#endif
