/* Small filesystem helpers with crash-safe semantics.
 *
 * qd_fs_write_atomic writes to "<path>.tmp.<pid>", fsyncs it, renames it over path and
 * fsyncs the directory, so a crash leaves either the old file or the new one, never half a
 * file under the final name. */
#ifndef QUANT_CORE_FSUTIL_H
#define QUANT_CORE_FSUTIL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "quant/core/error.h"

int qd_fs_write_atomic(const char *path, const void *buf, size_t n, qd_err *err);
/* Same with several buffers written in order. */
int qd_fs_write_atomic_iov(const char *path, const struct iovec *iov, int iovcnt, qd_err *err);
/* The same without any fsync: for scratch files a crash may lose or leave torn under their
 * final name because their readers check them (the part files' checksums) and recompute
 * them; the rename still keeps a half-written file from appearing under the name while the
 * system runs. */
int qd_fs_write_scratch_iov(const char *path, const struct iovec *iov, int iovcnt, qd_err *err);
/* The same, streamed: qd_fs_atomic_open creates the temp file, the writes append to it, and
 * qd_fs_atomic_commit fsyncs, renames it over path and fsyncs the directory; on any failure,
 * and in qd_fs_atomic_abort, the temp file is removed and path is left as it was. For files
 * too large to hold in memory (quantctl gen-model's shards). commit and abort free the
 * handle, which the caller owns until then; abort accepts NULL. */
typedef struct qd_fs_atomic qd_fs_atomic;
int qd_fs_atomic_open(const char *path, qd_fs_atomic **out, qd_err *err);
int qd_fs_atomic_write(qd_fs_atomic *a, const void *buf, size_t n, qd_err *err);
int qd_fs_atomic_writev(qd_fs_atomic *a, const struct iovec *iov, int iovcnt, qd_err *err);
int qd_fs_atomic_commit(qd_fs_atomic *a, qd_err *err);
void qd_fs_atomic_abort(qd_fs_atomic *a);
int qd_fs_fsync_dir(const char *dir, qd_err *err);
/* fsyncs the directory that contains path. */
int qd_fs_fsync_parent(const char *path, qd_err *err);
/* mkdir -p with mode 0755. */
int qd_fs_mkdir_p(const char *dir, qd_err *err);
/* Reads what is left of the open fd, at most limit + 1 bytes (UINT64_MAX: no limit):
 * *len > limit says there was more than limit (the caller refuses it; *buf then holds the
 * first limit bytes). size_hint (the size fstat gave, or 0) sizes the first buffer; a file
 * that grows, or a /proc file that says 0, is read on past it. *buf is malloc'd and
 * NUL-terminated (not counted in *len), owned by the caller. path names fd in messages. */
int qd_fs_read_fd(int fd, uint64_t size_hint, uint64_t limit, const char *path, char **buf, size_t *len,
                  qd_err *err);
/* Reads a whole file; *buf is malloc'd, NUL-terminated (not counted in *len), owned by caller. */
int qd_fs_read_file(const char *path, char **buf, size_t *len, qd_err *err);
int qd_fs_exists(const char *path);
/* The size in bytes of a regular file; 0 when it cannot be read. */
uint64_t qd_fs_file_size(const char *path);
/* The sum of the sizes (st_size) of the regular files in the tree at path (a file: its
 * size), symbolic links not followed; 0 when it does not exist. Files removed during the
 * walk are skipped, so a tree that changes meanwhile gives a figure between its states. */
uint64_t qd_fs_tree_bytes(const char *path);
/* The same for the directory open as dirfd (which stays open). */
uint64_t qd_fs_tree_bytes_fd(int dirfd);
/* Copies src to dst atomically (dst's directory must exist). */
int qd_fs_copy_file(const char *src, const char *dst, qd_err *err);
/* Recursively removes a directory tree (like rm -rf); missing is not an error. */
int qd_fs_remove_tree(const char *path, qd_err *err);
/* Removes everything inside the directory open as dirfd (which stays, empty), symbolic
 * links removed and never followed; shown names it in messages. */
int qd_fs_remove_contents_fd(int dirfd, const char *shown, qd_err *err);
/* Resolves an absolute path to its canonical form (symbolic links, ".", ".." and doubled
 * slashes removed) even when its last components do not exist yet: the deepest existing
 * ancestor goes through realpath and the missing rest is appended, which must be plain
 * names (a ".." or a dangling symbolic link below a missing directory cannot be resolved
 * and is an error). out gets at least PATH_MAX bytes. QD_EINVAL with the reason. */
int qd_fs_resolve(const char *path, char *out, size_t cap, qd_err *err);
/* 1 when the canonical path inner is dir itself or lies below it (both from qd_fs_resolve). */
int qd_fs_path_within(const char *inner, const char *dir);
/* path itself when it is at most room bytes long, else "..." and its last room - 3 bytes
 * written to buf (cap > room; room >= 8, else path itself): for messages with a size limit. */
const char *qd_fs_path_tail(const char *path, size_t room, char *buf, size_t cap);
/* Free bytes available to an unprivileged user on the filesystem holding path. */
int qd_fs_free_bytes(const char *path, uint64_t *out, qd_err *err);

#endif
