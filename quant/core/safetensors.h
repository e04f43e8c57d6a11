/* safetensors: a validating mmap reader, sharded model checkpoints, and a writer that
 * produces byte for byte what the Python safetensors library writes.
 *
 * Reader: st_file_open maps the file read-only and validates the header strictly (see
 * ../shared/ref/formats.md section 7): header length bound, well-formed JSON, known dtype,
 * offsets contiguous from 0 with no gaps or overlaps, end - begin = numel x dtype size,
 * file length = 8 + N + last end, no duplicate names. Errors name the file, the tensor and
 * what is wrong. The st_file owns the mapping; st_tensor pointers and their `data` stay
 * valid until st_file_close.
 *
 * Model: st_model_open reads a HuggingFace directory: model.safetensors, or
 * model.safetensors.index.json plus its shards (each shard opened lazily is fine; all are
 * validated before use). Tensors are found by name across shards.
 *
 * Writer: st_writer collects (name, dtype, shape, data) entries and writes them sorted as
 * the Python library does (dtype rank descending, then name bytewise), compact JSON with
 * __metadata__ first, header padded with spaces to a multiple of 8. The file is written to
 * a temp name in the same directory, fsynced, renamed, and the directory fsynced. The data
 * can also be streamed in after the header (st_writer_declare, begin, append, finish), so
 * a file need not fit in memory.
 *
 * Sharded writing: st_shard_plan splits a tensor list into shards as HF does, and
 * st_shard_index_write writes model.safetensors.index.json for it. */
#ifndef QUANT_CORE_SAFETENSORS_H
#define QUANT_CORE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "quant/core/dtype.h"
#include "quant/core/error.h"

#define ST_MAX_DIMS 8
#define ST_HEADER_MAX 100000000ull

typedef struct st_tensor {
    const char *name;            /* owned by the st_file */
    qd_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    uint64_t numel;
    uint64_t begin, end;         /* data_offsets, relative to the data section */
    const void *data;            /* into the mapping; NULL for a header parsed without data */
    int mapped;                  /* data lies in st_file_open's read-only file mapping (not a
                                  * caller's buffer given to st_file_open_memory) */
} st_tensor;

typedef struct st_file st_file;

/* Opens and validates path. On success *out is owned by the caller (st_file_close). */
int st_file_open(const char *path, st_file **out, qd_err *err);
void st_file_close(st_file *f);                        /* accepts NULL */
size_t st_file_count(const st_file *f);
/* Tensors in data (offset) order. */
const st_tensor *st_file_tensor(const st_file *f, size_t i);
const st_tensor *st_file_find(const st_file *f, const char *name);   /* NULL when absent */
/* A __metadata__ value, or NULL. */
const char *st_file_metadata(const st_file *f, const char *key);

/* Validates a header without a file: buf holds the N JSON bytes, data_len the length of
 * the data section that follows it (file length - 8 - N). `what` names the source in
 * errors. This is the fuzzing entry point. On success *out is owned by the caller. */
int st_header_parse(const char *buf, size_t n, uint64_t data_len, const char *what,
                    st_file **out, qd_err *err);

/* Validates a whole safetensors file image held in memory (8-byte length, header, data).
 * buf is borrowed and must outlive *out; tensor data pointers point into it. `what` names
 * the source in errors. On success *out is owned by the caller (st_file_close). */
int st_file_open_memory(const void *buf, size_t len, const char *what, st_file **out, qd_err *err);

/* Converts a tensor to F32 into dst (numel floats). Errors on unsupported dtypes. */
int st_tensor_read_f32(const st_tensor *t, float *dst, qd_err *err);
/* A view of rows r0..r1 of t (its first dimension; a row is numel / shape[0] values) as a
 * tensor of its own, data into t's: st_tensor_read_f32 converts just those rows. QD_EINVAL
 * when t has no rows or the range is not inside it. */
int st_tensor_rows(const st_tensor *t, int64_t r0, int64_t r1, st_tensor *view, qd_err *err);
/* Hands the mapped pages that lie wholly inside t's data back (madvise MADV_DONTNEED on a
 * read-only mapping): the file's bytes stay in the page cache and a later read faults them
 * in again, but the process no longer counts them as resident. For tensors converted once
 * and not read again soon (a block's weights). Does nothing for a tensor that is not
 * t->mapped: on a caller's own memory MADV_DONTNEED would zero it. */
void st_tensor_release(const st_tensor *t);

/* ---- sharded HF checkpoints ---- */
typedef struct st_model st_model;

int st_model_open(const char *dir, st_model **out, qd_err *err);
void st_model_close(st_model *m);                      /* accepts NULL */
size_t st_model_count(const st_model *m);
const st_tensor *st_model_tensor(const st_model *m, size_t i);
const st_tensor *st_model_find(const st_model *m, const char *name);
/* The shard file (basename) that holds `name`, or NULL. */
const char *st_model_shard_of(const st_model *m, const char *name);
/* Finds `name`, checks it has `ndim` dims equal to `shape` (pass ndim < 0 to skip), and
 * converts it to F32 into dst. The error names the tensor and both shapes. */
int st_model_read_f32(const st_model *m, const char *name, int ndim, const int64_t *shape,
                      float *dst, qd_err *err);

/* ---- writer ---- */
typedef struct st_writer st_writer;

int st_writer_init(st_writer **out);
void st_writer_free(st_writer *w);                     /* accepts NULL */
/* Adds a tensor. The name is copied; `data` (numel x dtype size bytes) is borrowed and must
 * stay valid until st_writer_write returns. Duplicate names are an error. */
int st_writer_add(st_writer *w, const char *name, qd_dtype dtype, int ndim,
                  const int64_t *shape, const void *data, qd_err *err);
/* Like st_writer_add but copies the data. */
int st_writer_add_copy(st_writer *w, const char *name, qd_dtype dtype, int ndim,
                       const int64_t *shape, const void *data, qd_err *err);
/* Adds a __metadata__ entry ("format": "pt" is always written first). */
int st_writer_set_metadata(st_writer *w, const char *key, const char *value);
/* Total bytes of tensor data added so far. */
uint64_t st_writer_data_bytes(const st_writer *w);
/* Writes atomically to path (every tensor must have been added with its data). */
int st_writer_write(st_writer *w, const char *path, qd_err *err);

/* Streaming, for files larger than memory: declare each tensor without its data, then
 * st_writer_begin writes the header to a temp file next to path, st_writer_append adds the
 * data bytes of the tensors in data order (st_writer_tensor_at), in pieces of any size, and
 * st_writer_finish checks that exactly st_writer_data_bytes came and renames the file into
 * place. Nothing can be added between begin and finish; a failed append, a failed finish
 * and st_writer_free before finish remove the temp file. */
int st_writer_declare(st_writer *w, const char *name, qd_dtype dtype, int ndim,
                      const int64_t *shape, qd_err *err);
int st_writer_begin(st_writer *w, const char *path, qd_err *err);
/* The add-order index (0 = the first tensor added) of the tensor whose data comes i-th in the
 * file; (size_t)-1 before st_writer_begin or past the end. */
size_t st_writer_tensor_at(const st_writer *w, size_t i);
int st_writer_append(st_writer *w, const void *buf, size_t n, qd_err *err);
int st_writer_finish(st_writer *w, qd_err *err);

/* ---- sharded writing (st_shards.c) ---- */
typedef struct st_shard_plan {
    size_t n_shards;         /* >= 1 */
    size_t *start;           /* owned: n_shards + 1 entries; shard s holds tensors
                                start[s] .. start[s + 1] - 1 of the caller's list */
    uint64_t total_bytes;    /* data bytes of all tensors (the index's metadata.total_size) */
} st_shard_plan;

/* HF's rule (transformers' max_shard_size): tensors in the caller's order, a new shard when
 * the next tensor would take the current one past shard_size bytes of data; a tensor larger
 * than shard_size gets a shard of its own. shard_size 0: one shard. bytes[i] is tensor i's
 * data size. QD_ENOMEM or 0; *out is the caller's (st_shard_plan_free). */
int st_shard_plan_by_size(const uint64_t *bytes, size_t n, uint64_t shard_size, st_shard_plan *out);
/* n tensors into n_shards shards of nearly equal counts (shard s starts at s * n / n_shards;
 * n_shards is clamped to 1..n). */
int st_shard_plan_by_count(const uint64_t *bytes, size_t n, size_t n_shards, st_shard_plan *out);
void st_shard_plan_free(st_shard_plan *p);                  /* accepts NULL */
/* Shard s's file name (s from 0): "model.safetensors" when the plan has one shard, else
 * "model-00001-of-00003.safetensors" and so on. */
void st_shard_file_name(const st_shard_plan *p, size_t s, char *buf, size_t cap);
/* Writes dir/model.safetensors.index.json atomically: {"metadata": {"total_size": N},
 * "weight_map": {name: shard file}}, names[i] being tensor i of the plan's list, in order. */
int st_shard_index_write(const char *dir, const st_shard_plan *p, const char *const *names, qd_err *err);

#endif
