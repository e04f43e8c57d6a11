/* Activation files of the checkpoint (.quantd/acts-NNN.bin): the inputs of one block,
 * [rows, cols], so a resumed job starts the block without recomputing the earlier ones.
 *
 * They are stored in the activations' dtype: F32 for an F32 model; BF16 for a half-precision
 * (F16 or BF16) model, whose inputs between blocks the pipeline rounds to BF16 before
 * using them (qd_acts_round), so that the file holds exactly what the uninterrupted run
 * computes with (a resumed output stays byte-identical) at half the bytes. BF16 keeps F32's
 * range (no overflow where F16 could) and rounds by at most 2^-9 relative, the order of
 * what the model's own half-precision forward does.
 *
 * Layout (little-endian): "QDACTS\0\0" | u32 version | u32 dtype (0 = F32, 2 = BF16) |
 * i64 rows | i64 cols | u64 checksum of the data (qd_hash64) | data. The checksum catches a
 * file damaged on disk; atomic writes already rule out torn files. Bump QD_ACTS_VERSION
 * when the layout changes. */
#ifndef QUANT_PIPELINE_ACTS_H
#define QUANT_PIPELINE_ACTS_H

#include <stdint.h>

#include "quant/core/dtype.h"
#include "quant/core/error.h"

#define QD_ACTS_VERSION 2

/* Bytes of the activation file of rows x cols in dtype, header included: the one place the
 * checkpoint's activation dtype enters the pre-flight estimate (estimate.c). */
uint64_t qd_acts_file_bytes(int64_t rows, int64_t cols, qd_dtype dtype);
/* The dtype activations of a model whose float weights are `weights` are held in. */
qd_dtype qd_acts_dtype_for(qd_dtype weights);
/* Rounds x [n] in place to the values dtype holds (F32: nothing). */
void qd_acts_round(float *x, uint64_t n, qd_dtype dtype);
/* Writes x [rows, cols] (host, already rounded to dtype) atomically to path in dtype (F32 or
 * BF16). */
int qd_acts_write(const char *path, const float *x, int64_t rows, int64_t cols, qd_dtype dtype, qd_err *err);
/* Reads path into a malloc'd F32 array *x (caller frees); checks the header, the size the
 * caller expects (pass 0 to accept any) and the checksum. */
int qd_acts_read(const char *path, int64_t expect_rows, int64_t expect_cols, float **x,
                 int64_t *rows, int64_t *cols, qd_err *err);
/* Bytes per value of an activation file in dtype. */
int qd_acts_value_bytes(qd_dtype dtype);
/* FNV-1a over 64-bit little-endian words (the tail bytewise): 8 bytes per multiply, so a
 * multi-gigabyte file is checked at memory speed. */
uint64_t qd_hash64(const void *data, uint64_t n, uint64_t h);
#define QD_HASH64_INIT 0xcbf29ce484222325ull

#endif
