/* Internal to the job spec (quant/job) and the service protocol (proto/): typed, validating
 * accessors for cJSON objects that word their errors the same way everywhere
 * ("job.calibration.samples: must be a positive integer, got 0"), reject unknown and
 * duplicated keys, and print numbers so they read back bit-exactly. Not part of the public
 * API; the names carry the qpj_ prefix so they never clash. */
#ifndef QUANT_JOB_JSONUTIL_H
#define QUANT_JOB_JSONUTIL_H

#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>

#include "quant/job/perr.h"

/* Largest integer a JSON number (an IEEE double) carries exactly: 2^53 - 1. */
#define QPJ_INT_MAX 9007199254740991LL

/* "a string", "a number", "an array", ... for messages. */
const char *qpj_type_name(const cJSON *v);
/* Writes a short description of v ("0", "1.5", "\"abc\"", "an array") into buf. */
const char *qpj_describe(const cJSON *v, char *buf, size_t cap);

/* Fails on a key of obj not in allowed (NULL-terminated), naming it and suggesting the
 * nearest allowed key, and on a key given twice. path is the object's own path ("job"). */
int qpj_check_keys(const cJSON *obj, const char *path, const char *const *allowed, qp_err *err);

/* The member called name, or NULL when it is absent or JSON null (null means "default"). */
const cJSON *qpj_field(const cJSON *obj, const char *name);

/* Each reads obj[name]; absent/null leaves *out untouched and returns 0 (set *present when
 * non-NULL to say which). A present value of the wrong type or out of range fails with
 * "<path>.<name>: <rule>, got <value>". */
int qpj_get_int(const cJSON *obj, const char *path, const char *name, int64_t lo, int64_t hi,
                const char *rule, int64_t *out, int *present, qp_err *err);
int qpj_get_double(const cJSON *obj, const char *path, const char *name, const char *rule,
                   double *out, int *present, qp_err *err);
int qpj_get_bool(const cJSON *obj, const char *path, const char *name, int *out, int *present,
                 qp_err *err);
/* *out becomes a malloc'd copy (caller frees; the old value is freed first). Empty strings
 * are refused unless allow_empty. */
int qpj_get_str(const cJSON *obj, const char *path, const char *name, int allow_empty,
                char **out, int *present, qp_err *err);

/* Shortest "%.Ng" that reads back to exactly x ("0.01", not "0.01000000000000000021"). */
const char *qpj_fmt_double(double x, char buf[32]);

/* True when s is 1..max bytes of [A-Za-z0-9._-] not starting with '.' or '-': the names
 * that go into Redis keys, file names and log lines without quoting (job ids, node names). */
int qpj_name_valid(const char *s, size_t max);

/* Adds a string member, or JSON null when s is NULL. Returns 0 or QP_ENOMEM. */
int qpj_add_str(cJSON *obj, const char *name, const char *s);
int qpj_add_num(cJSON *obj, const char *name, double x);
int qpj_add_bool(cJSON *obj, const char *name, int b);

/* Prints obj (compact, or indented when pretty) with every number written so it reads back
 * bit-exactly: integers up to 2^53 as plain digits, others by qpj_fmt_double. cJSON's own
 * printer settles for 15 digits when they are "close enough" (9007199254740991 becomes
 * 9.00719925474099e+15), which would corrupt fencing tokens, seeds and fingerprints. obj's
 * number nodes are turned into raw nodes in place, so print a tree you are about to delete.
 * Returns a malloc'd string or NULL. */
char *qpj_print(cJSON *obj, int pretty);
/* The same, compact, for a borrowed tree (prints a copy, leaves v alone). */
char *qpj_print_copy(const cJSON *v);

/* malloc'd copy of s (NULL stays NULL). */
char *qpj_strdup(const char *s);

#endif
