/* Pre-tokenized input files: read a token stream that was made elsewhere (or by
 * `quantctl tokenize`) and write ids.json.
 *
 * Accepted inputs, detected from the content (and the .bin extension):
 *   - a JSON array of integer ids:            [1, 450, 29871, ...]
 *   - a JSON object with the array under "tokens" (also "ids" or "input_ids"):
 *                                             {"tokens": [1, 450, ...], ...}
 *   - raw little-endian uint32 ids, when the path ends in ".bin" (size a multiple of 4).
 * Ids must be in [0, 2^31). */
#ifndef QUANT_MODEL_TOKEN_FILE_H
#define QUANT_MODEL_TOKEN_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "quant/core/error.h"

/* Reads path; *ids is malloc'd and owned by the caller, *n its length. QD_ENOTFOUND for a
 * missing file, QD_EFORMAT (naming the byte offset or element) for a malformed one. */
int qd_token_file_read(const char *path, int32_t **ids, size_t *n, qd_err *err);
/* Parses the JSON forms above from memory (buf need not be NUL-terminated). name is used in
 * messages. */
int qd_token_json_parse(const char *name, const char *buf, size_t len, int32_t **ids, size_t *n, qd_err *err);
/* Writes ids as a JSON array ("[1,2,3]\n"), atomically (temp file + rename). */
int qd_token_file_write_json(const char *path, const int32_t *ids, size_t n, qd_err *err);
/* Writes ids as raw little-endian uint32, atomically. */
int qd_token_file_write_bin(const char *path, const int32_t *ids, size_t n, qd_err *err);

#endif
