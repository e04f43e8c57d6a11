/* Error record of the job spec (libqjob) and the service protocol (libqproto, proto/).
 *
 * A twin of quant/core's qd_err: the same layout, the same message size and the same
 * numeric codes, so a caller that has both can copy one into the other
 * (`qd_err_set(err, pe.code, "%s", pe.msg)`). It dates from when the job spec lived in
 * proto/ and linked nothing of the library; now quant/job sits at rank 2, above quant/core
 * (docs/architecture.md, "Layers"), and could use qd_err itself, but every qp_* call and its
 * callers speak qp_err, and keeping it costs one copy at the boundary. Neither library
 * brings in numeric code: the daemon links them with libqadmit and never libquant, so it
 * loads no BLAS, LAPACKE or CUDA library (docs/architecture.md, "Admission"). Every fallible
 * qp_* call returns 0 or a negative QP_E* code and writes one sentence naming the field into
 * the caller-owned record (which may be NULL). */
#ifndef QUANT_JOB_PERR_H
#define QUANT_JOB_PERR_H

#include <stdarg.h>

/* Values equal quant/core/error.h's QD_E* codes on purpose; do not renumber. */
enum qp_status_code {
    QP_OK = 0,
    QP_EINVAL = -1,        /* bad argument, or a job field that fails validation */
    QP_ENOMEM = -3,        /* allocation failed */
    QP_EFORMAT = -4,       /* malformed JSON, frame or field encoding */
    QP_ENOTFOUND = -5,     /* a required field is missing */
    QP_EUNSUPPORTED = -7,  /* a version newer than this build understands */
    QP_EMISMATCH = -10,    /* protocol version mismatch */
};

#define QP_ERR_MSG_MAX 512

typedef struct qp_err {
    int code;
    char msg[QP_ERR_MSG_MAX];
} qp_err;

/* Records code and a printf-style message in err (when non-NULL); returns code. */
int qp_err_set(qp_err *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
