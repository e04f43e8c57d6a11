/* Reading a JSON file into a cJSON tree with errors that name the file and, for malformed
 * JSON, the byte where parsing stopped. One place for what every config, index, state and
 * tokenizer loader needs. */
#ifndef QUANT_CORE_JSONFILE_H
#define QUANT_CORE_JSONFILE_H

#include "quant/core/confine.h"
#include "quant/core/error.h"

struct cJSON;

/* Reads (qd_input_read: a regular file within the kind's size limit, beneath the allowed
 * roots when the process is confined) and parses path; the top level must be an object. *out is owned by the caller
 * (cJSON_Delete). Errors: QD_ENOTFOUND / QD_EIO from reading, QD_EFORMAT for bad JSON
 * ("path: invalid JSON near byte N") or a non-object top level. */
int qd_json_read_object(const char *path, qd_input_kind kind, struct cJSON **out, qd_err *err);

/* The same, for a file that will be written back: every number written with a fraction or
 * an exponent (10.0, 1e-06) is kept as its literal text (a cJSON_Raw node), because cJSON
 * would print 10.0 as 10 and loaders that type-check config.json refuse an int where the
 * class declares a float (transformers 5: final_logit_softcapping, router_jitter_noise).
 * Those nodes are no longer cJSON_IsNumber. */
int qd_json_read_object_literal(const char *path, qd_input_kind kind, struct cJSON **out, qd_err *err);

/* Adds key = v to object o with 17 significant digits, so that reading it back gives v
 * exactly. cJSON's own printer keeps 15 digits whenever they come back within a relative
 * DBL_EPSILON of v, which can lose the last bit: a value saved in a checkpoint and read on
 * a resume would then differ from the uninterrupted run's. Non-finite v is written as
 * null, as cJSON does. Returns the new node, NULL when out of memory. */
struct cJSON *qd_json_add_exact(struct cJSON *o, const char *key, double v);

#endif
