/* Activation files of the checkpoint (.quantd/acts-NNN.bin): the F32 inputs of one block,
 * [rows, cols], so a resumed job starts the block without recomputing the earlier ones.
 *
 * Layout (little-endian): "QDACTS\0\0" | u32 version | u32 dtype (0 = F32) | i64 rows |
 * i64 cols | u64 FNV-1a-64 of the data | data. The checksum catches a file damaged on disk;
 * atomic writes already rule out torn files. Bump QD_ACTS_VERSION when the layout changes. */
#ifndef QUANT_PIPELINE_ACTS_H
#define QUANT_PIPELINE_ACTS_H

#include <stdint.h>

#include "quant/core/error.h"

#define QD_ACTS_VERSION 1

/* Bytes of the activation file of rows x cols, header included: the one place the
 * checkpoint's activation dtype enters the pre-flight estimate (estimate.c). */
uint64_t qd_acts_file_bytes(int64_t rows, int64_t cols);
/* Writes x [rows, cols] (host) atomically to path. */
int qd_acts_write(const char *path, const float *x, int64_t rows, int64_t cols, qd_err *err);
/* Reads path into a malloc'd array *x (caller frees); checks the header, the size the
 * caller expects (pass 0 to accept any) and the checksum. */
int qd_acts_read(const char *path, int64_t expect_rows, int64_t expect_cols, float **x,
                 int64_t *rows, int64_t *cols, qd_err *err);
uint64_t qd_fnv1a64(const void *data, uint64_t n, uint64_t h);
#define QD_FNV1A64_INIT 0xcbf29ce484222325ull

#endif
