/* Reading a JSON file into a cJSON tree with errors that name the file and, for malformed
 * JSON, the byte where parsing stopped. One place for what every config, index, state and
 * tokenizer loader needs. */
#ifndef QUANT_CORE_JSONFILE_H
#define QUANT_CORE_JSONFILE_H

#include "quant/core/error.h"

struct cJSON;

/* Reads and parses path; the top level must be an object. *out is owned by the caller
 * (cJSON_Delete). Errors: QD_ENOTFOUND / QD_EIO from reading, QD_EFORMAT for bad JSON
 * ("path: invalid JSON near byte N") or a non-object top level. */
int qd_json_read_object(const char *path, struct cJSON **out, qd_err *err);

#endif
