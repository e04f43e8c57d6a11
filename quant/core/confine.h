/* How the library opens what a job names: every file it reads on a job's behalf (config,
 * tokenizer, shard index, weights, calibration and eval text, the checkpoint it resumes)
 * and the output directory it writes into.
 *
 * A job is input from a stranger. Three rules hold for every such file:
 *   - It is opened first and checked after (fstat on the open descriptor, never a stat of
 *     the name before), so a swap between check and use changes nothing. Only a regular
 *     file is read: a FIFO, a device (/dev/zero), a socket or a directory is refused, and
 *     the open itself never blocks (O_NONBLOCK), so a FIFO cannot hang the job.
 *   - Its size is bounded by its kind (qd_input_kind): config JSON, tokenizer files and text
 *     each have a limit, and a read stops at the limit even if the file grows meanwhile.
 *   - Once the process is confined (qd_confine_set, done by quantd and quantd-worker with the
 *     daemon's --allow-root list), the file is opened beneath an allowed root by the kernel:
 *     openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS) relative to a descriptor of the root,
 *     so no symbolic link, ".." or rename made before or during the open can reach outside
 *     the roots. A link that stays inside the roots (a Hugging Face cache's snapshot links
 *     into its blobs/) still works. Where the kernel lacks openat2 the walk is done one
 *     component at a time with O_NOFOLLOW, and then no symbolic link is followed at all.
 *
 * The output directory is opened the same way once (qd_confine_dir_open), and the job
 * writes everything through that descriptor, so renaming the directory away and planting a
 * link in its place redirects nothing.
 *
 * The confinement is process-wide on purpose (like landlock or unveil): it is set once at
 * start-up, before any job, by the program, and never loosened; a library call cannot
 * forget to pass it. quantctl, run by a user on their own files, sets no roots: the type
 * and size rules still hold there. */
#ifndef QUANT_CORE_CONFINE_H
#define QUANT_CORE_CONFINE_H

#include <stddef.h>
#include <stdint.h>

#include "quant/core/error.h"

typedef enum qd_input_kind {
    QD_INPUT_JSON = 0,    /* config.json, the shard index, generation/tokenizer config,
                           * special tokens, the checkpoint's state and the report */
    QD_INPUT_TOKENIZER,   /* tokenizer.json, tokenizer.model, vocab.json, merges.txt */
    QD_INPUT_TEXT,        /* calibration and eval text, token files */
    QD_INPUT_WEIGHTS,     /* safetensors shards and the checkpoint's activation files:
                           * mapped or read in checked pieces, never whole; no size limit */
    QD_INPUT_KINDS
} qd_input_kind;

/* The default limits in bytes (docs/security.md): 64 MiB of JSON, 256 MiB of tokenizer,
 * 1 GiB of text. Real files are far below them: a 671B model's shard index is about 9 MB,
 * the largest tokenizer.json of the supported families about 33 MB, and a calibration set
 * of 128 x 2048 tokens about 1 MB of text. */
#define QD_INPUT_JSON_MAX_DEFAULT (64ull << 20)
#define QD_INPUT_TOKENIZER_MAX_DEFAULT (256ull << 20)
#define QD_INPUT_TEXT_MAX_DEFAULT (1ull << 30)

/* The kind's name as the limits and messages spell it ("json", "tokenizer", "text",
 * "weights"). */
const char *qd_input_kind_name(qd_input_kind k);

/* Sets the size limit of each kind (0 keeps the current value; weights has none). Call at
 * start-up, before any job. */
void qd_confine_set_limits(const uint64_t max_bytes[QD_INPUT_KINDS]);
uint64_t qd_confine_limit(qd_input_kind k);

/* Confines the process's job files to the given directories (absolute paths; each is
 * opened and kept open as the root of its subtree). Once only: a second call, or zero roots,
 * is QD_EINVAL. */
int qd_confine_set(const char *const roots[], size_t n, qd_err *err);
/* 1 once qd_confine_set succeeded. */
int qd_confine_active(void);
/* Tests only: undo qd_confine_set, and force (1) or stop forcing (0) the component walk
 * used where the kernel has no openat2. */
void qd_confine_reset_for_tests(void);
void qd_confine_force_walk_for_tests(int on);

/* Opens path (absolute, or relative when the process is not confined) for reading under the
 * rules above. A path made by qd_confine_fd_path ("/proc/self/fd/N/name") is opened
 * beneath the directory held as N, confined or not. On success *fd is an O_RDONLY | O_CLOEXEC descriptor the caller owns and
 * *size the file's size at open. Errors name the path and why: QD_ENOTFOUND (missing),
 * QD_EINVAL (outside the roots, through a link that leaves them, not a regular file, over
 * the kind's limit: the message names the limit and the QUANTD_MAX_*_BYTES setting),
 * QD_EIO. */
int qd_input_open(const char *path, qd_input_kind kind, int *fd, uint64_t *size, qd_err *err);
/* Reads the whole file (opened as above), at most the kind's limit even if it grows while
 * being read. *buf is malloc'd and NUL-terminated (not counted in *len); the caller owns it. */
int qd_input_read(const char *path, qd_input_kind kind, char **buf, size_t *len, qd_err *err);
/* 1 when path names something (any type) that qd_input_open could reach: for optional
 * files. A link out of the roots or a device still counts as present, so qd_input_open
 * then refuses it by name instead of the job skipping it silently. */
int qd_input_exists(const char *path);
/* Copies src (opened as above, at most the kind's limit) to name in the directory dirfd
 * through a temporary file, fsync and renameat, so a crash never leaves half a file under
 * the final name. dst_shown names the destination in messages. */
int qd_input_copy_at(const char *src, qd_input_kind kind, int dirfd, const char *name, const char *dst_shown,
                     qd_err *err);

/* Opens the directory at path (creating it and its missing parents, mode 0755, when create
 * is set) beneath the roots as above; the final component must be a directory, never a
 * symbolic link. *fd is an O_DIRECTORY | O_CLOEXEC descriptor the caller owns; *created is
 * set when the final directory did not exist before (may be NULL). */
int qd_confine_dir_open(const char *path, int create, int *fd, int *created, qd_err *err);
/* The same for the directory name inside the directory open as dirfd (one component, never
 * a link): the checkpoint's .quantd inside the output. shown names it in messages. */
int qd_confine_subdir_open(int dirfd, const char *name, int create, int *fd, int *created, const char *shown,
                           qd_err *err);
/* The name through which path-based calls reach the directory open as fd, whatever happens
 * to its name meanwhile: "/proc/self/fd/N" (cap >= 32). */
const char *qd_confine_fd_path(int fd, char *buf, size_t cap);

#endif
