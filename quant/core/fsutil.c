/* Filesystem helpers with crash-safe semantics: atomic replace (temp file in the same
 * directory, fsync, rename, fsync the directory), mkdir -p, whole-file reads, recursive
 * removal, tree sizes and free-space queries. Every error names the path and the errno text. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE   /* O_DIRECTORY, fdopendir, unlinkat */
#endif
#include "quant/core/fsutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#ifndef IOV_MAX
#define IOV_MAX 1024
#endif

static int io_code(int e)
{
    if (e == ENOENT) return QD_ENOTFOUND;
    if (e == ENOSPC || e == EDQUOT) return QD_ERESOURCE;
    return QD_EIO;
}

int qd_fs_fsync_dir(const char *dir, qd_err *err)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return qd_err_set(err, io_code(errno), "%s: cannot open directory: %s", dir, strerror(errno));
    /* Some filesystems cannot fsync a directory and say EINVAL; there is nothing more to
     * make durable there, so that is not an error. */
    if (fsync(fd) != 0 && errno != EINVAL && errno != EROFS) {
        int e = errno;
        close(fd);
        return qd_err_set(err, QD_EIO, "%s: cannot fsync directory: %s", dir, strerror(e));
    }
    close(fd);
    return 0;
}

int qd_fs_fsync_parent(const char *path, qd_err *err)
{
    const char *slash = strrchr(path, '/');
    if (!slash) return qd_fs_fsync_dir(".", err);
    if (slash == path) return qd_fs_fsync_dir("/", err);
    size_t len = (size_t)(slash - path);
    char *dir = malloc(len + 1);
    if (!dir) return qd_err_set(err, QD_ENOMEM, "%s: out of memory", path);
    memcpy(dir, path, len);
    dir[len] = '\0';
    int rc = qd_fs_fsync_dir(dir, err);
    free(dir);
    return rc;
}

static char *tmp_name(const char *path)
{
    size_t len = strlen(path) + 32;
    char *t = malloc(len);
    if (t) snprintf(t, len, "%s.tmp.%ld", path, (long)getpid());
    return t;
}

/* Creates the temporary file afresh: a stale one (a killed write) or a symbolic link planted
 * under its predictable name in a directory others can write is removed, never followed. */
static int open_tmp(const char *tmp)
{
    if (unlink(tmp) != 0 && errno != ENOENT) return -1;
    return open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
}

/* Writes all of iov to fd, in chunks of IOV_MAX and across short writes. */
static int write_all_iov(int fd, const struct iovec *iov_in, int iovcnt, const char *path, qd_err *err)
{
    struct iovec local[64];
    int i = 0;
    size_t skip = 0;   /* bytes of iov_in[i] already written */
    while (i < iovcnt) {
        int k = 0;
        for (int j = i; j < iovcnt && k < 64 && k < IOV_MAX; j++) {
            size_t off = j == i ? skip : 0;
            if (iov_in[j].iov_len - off == 0) continue;
            local[k].iov_base = (char *)iov_in[j].iov_base + off;
            local[k].iov_len = iov_in[j].iov_len - off;
            k++;
        }
        if (k == 0) break;
        ssize_t w = writev(fd, local, k);
        if (w < 0) {
            if (errno == EINTR) continue;
            return qd_err_set(err, io_code(errno), "%s: write failed: %s", path, strerror(errno));
        }
        size_t left = (size_t)w;
        while (i < iovcnt) {
            size_t rem = iov_in[i].iov_len - skip;
            if (left < rem) { skip += left; break; }
            left -= rem;
            i++;
            skip = 0;
        }
    }
    return 0;
}

struct qd_fs_atomic {
    char *path;   /* owned: the final name */
    char *tmp;    /* owned: "<path>.tmp.<pid>", removed unless committed */
    int fd;
};

int qd_fs_atomic_open(const char *path, qd_fs_atomic **out, qd_err *err)
{
    *out = NULL;
    qd_fs_atomic *a = calloc(1, sizeof *a);
    if (a) { a->path = strdup(path); a->tmp = tmp_name(path); }
    if (!a || !a->path || !a->tmp) {
        if (a) { free(a->path); free(a->tmp); }
        free(a);
        return qd_err_set(err, QD_ENOMEM, "%s: out of memory", path);
    }
    a->fd = open_tmp(a->tmp);
    if (a->fd < 0) {
        int rc = qd_err_set(err, io_code(errno), "%s: cannot create: %s", a->tmp, strerror(errno));
        free(a->path);
        free(a->tmp);
        free(a);
        return rc;
    }
    *out = a;
    return 0;
}

int qd_fs_atomic_writev(qd_fs_atomic *a, const struct iovec *iov, int iovcnt, qd_err *err)
{
    return write_all_iov(a->fd, iov, iovcnt, a->tmp, err);
}

int qd_fs_atomic_write(qd_fs_atomic *a, const void *buf, size_t n, qd_err *err)
{
    struct iovec iov = { (void *)buf, n };
    return write_all_iov(a->fd, &iov, 1, a->tmp, err);
}

void qd_fs_atomic_abort(qd_fs_atomic *a)
{
    if (!a) return;
    if (a->fd >= 0) close(a->fd);
    unlink(a->tmp);
    free(a->tmp);
    free(a->path);
    free(a);
}

int qd_fs_atomic_commit(qd_fs_atomic *a, qd_err *err)
{
    int rc = 0;
    if (fsync(a->fd) != 0) rc = qd_err_set(err, io_code(errno), "%s: fsync failed: %s", a->tmp, strerror(errno));
    if (close(a->fd) != 0 && rc == 0) rc = qd_err_set(err, io_code(errno), "%s: close failed: %s", a->tmp, strerror(errno));
    a->fd = -1;
    if (rc == 0 && rename(a->tmp, a->path) != 0)
        rc = qd_err_set(err, io_code(errno), "%s: cannot rename %s over it: %s", a->path, a->tmp, strerror(errno));
    if (rc != 0) { qd_fs_atomic_abort(a); return rc; }
    rc = qd_fs_fsync_parent(a->path, err);
    free(a->tmp);
    free(a->path);
    free(a);
    return rc;
}

int qd_fs_write_atomic_iov(const char *path, const struct iovec *iov, int iovcnt, qd_err *err)
{
    qd_fs_atomic *a = NULL;
    int rc = qd_fs_atomic_open(path, &a, err);
    if (rc) return rc;
    if ((rc = qd_fs_atomic_writev(a, iov, iovcnt, err))) { qd_fs_atomic_abort(a); return rc; }
    return qd_fs_atomic_commit(a, err);
}

int qd_fs_write_scratch_iov(const char *path, const struct iovec *iov, int iovcnt, qd_err *err)
{
    qd_fs_atomic *a = NULL;
    int rc = qd_fs_atomic_open(path, &a, err);
    if (rc) return rc;
    if ((rc = qd_fs_atomic_writev(a, iov, iovcnt, err))) { qd_fs_atomic_abort(a); return rc; }
    if (close(a->fd) != 0) rc = qd_err_set(err, io_code(errno), "%s: close failed: %s", a->tmp, strerror(errno));
    a->fd = -1;
    if (rc == 0 && rename(a->tmp, a->path) != 0)
        rc = qd_err_set(err, io_code(errno), "%s: cannot rename %s over it: %s", a->path, a->tmp, strerror(errno));
    if (rc != 0) { qd_fs_atomic_abort(a); return rc; }
    free(a->tmp);
    free(a->path);
    free(a);
    return 0;
}

int qd_fs_write_atomic(const char *path, const void *buf, size_t n, qd_err *err)
{
    struct iovec iov = { (void *)buf, n };
    return qd_fs_write_atomic_iov(path, &iov, 1, err);
}

int qd_fs_mkdir_p(const char *dir, qd_err *err)
{
    size_t len = strlen(dir);
    if (len == 0) return qd_err_set(err, QD_EINVAL, "mkdir: empty path");
    char *p = strdup(dir);
    if (!p) return qd_err_set(err, QD_ENOMEM, "%s: out of memory", dir);
    int rc = 0;
    for (size_t i = 1; i <= len && rc == 0; i++) {
        if (p[i] != '/' && p[i] != '\0') continue;
        char saved = p[i];
        p[i] = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST)
            rc = qd_err_set(err, io_code(errno), "%s: cannot create directory: %s", p, strerror(errno));
        else if (saved == '\0' || p[i + 1] == '\0') {
            struct stat st;
            if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode))
                rc = qd_err_set(err, QD_EIO, "%s: exists and is not a directory", p);
        }
        p[i] = saved;
    }
    free(p);
    return rc;
}

int qd_fs_read_fd(int fd, uint64_t size_hint, uint64_t limit, const char *path, char **buf, size_t *len,
                  qd_err *err)
{
    *buf = NULL;
    *len = 0;
    if (limit == UINT64_MAX) limit--;
    size_t cap = size_hint && size_hint < limit ? (size_t)size_hint + 1 : 4096;
    if ((uint64_t)cap > limit + 1) cap = (size_t)limit + 1;
    if (cap < 2) cap = 2;
    char *b = malloc(cap);
    size_t used = 0;
    if (!b) return qd_err_set(err, QD_ENOMEM, "%s: out of memory reading %zu bytes", path, cap);
    for (;;) {
        if (used + 1 >= cap) {
            /* Full at the size expected: one more byte says whether there is more (the file
             * grew, or /proc said 0); past the limit that byte is all that is read. */
            char c;
            ssize_t r = read(fd, &c, 1);
            if (r < 0 && errno == EINTR) continue;
            if (r == 0) break;
            if (r < 0) {
                int e = errno;
                free(b);
                return qd_err_set(err, QD_EIO, "%s: read failed: %s", path, strerror(e));
            }
            if (used >= limit) { used++; break; }   /* over: *len > limit says so */
            size_t ncap = (uint64_t)cap * 2 > limit + 1 ? (size_t)limit + 1 : cap * 2;
            if (ncap < used + 2) ncap = used + 2;
            char *nb = realloc(b, ncap);
            if (!nb) { free(b); return qd_err_set(err, QD_ENOMEM, "%s: out of memory", path); }
            b = nb;
            cap = ncap;
            b[used++] = c;
            continue;
        }
        ssize_t r = read(fd, b + used, cap - 1 - used);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int e = errno;
            free(b);
            return qd_err_set(err, QD_EIO, "%s: read failed: %s", path, strerror(e));
        }
        if (r == 0) break;
        used += (size_t)r;
    }
    b[used < cap ? used : cap - 1] = '\0';
    *buf = b;
    *len = used;
    return 0;
}

int qd_fs_read_file(const char *path, char **buf, size_t *len, qd_err *err)
{
    *buf = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return qd_err_set(err, io_code(errno), "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    uint64_t hint = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? (uint64_t)st.st_size : 0;
    int rc = qd_fs_read_fd(fd, hint, UINT64_MAX, path, buf, len, err);
    close(fd);
    return rc;
}

int qd_fs_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

uint64_t qd_fs_file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) ? (uint64_t)st.st_size : 0;
}

int qd_fs_copy_file(const char *src, const char *dst, qd_err *err)
{
    int in = open(src, O_RDONLY | O_CLOEXEC);
    if (in < 0) return qd_err_set(err, io_code(errno), "%s: cannot open: %s", src, strerror(errno));
    char *tmp = tmp_name(dst);
    char *buf = malloc(1 << 20);
    int rc = 0, out = -1;
    if (!tmp || !buf) { rc = qd_err_set(err, QD_ENOMEM, "%s: out of memory", dst); goto done; }
    out = open_tmp(tmp);
    if (out < 0) { rc = qd_err_set(err, io_code(errno), "%s: cannot create: %s", tmp, strerror(errno)); goto done; }
    for (;;) {
        ssize_t r = read(in, buf, 1 << 20);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) { rc = qd_err_set(err, QD_EIO, "%s: read failed: %s", src, strerror(errno)); break; }
        if (r == 0) break;
        struct iovec iov = { buf, (size_t)r };
        if ((rc = write_all_iov(out, &iov, 1, tmp, err))) break;
    }
    if (rc == 0 && fsync(out) != 0) rc = qd_err_set(err, io_code(errno), "%s: fsync failed: %s", tmp, strerror(errno));
    if (close(out) != 0 && rc == 0) rc = qd_err_set(err, io_code(errno), "%s: close failed: %s", tmp, strerror(errno));
    out = -1;
    if (rc == 0 && rename(tmp, dst) != 0)
        rc = qd_err_set(err, io_code(errno), "%s: cannot rename %s over it: %s", dst, tmp, strerror(errno));
    if (rc != 0) unlink(tmp);
    else rc = qd_fs_fsync_parent(dst, err);
done:
    if (out >= 0) { close(out); unlink(tmp); }
    close(in);
    free(tmp);
    free(buf);
    return rc;
}

/* Removes the entries of the directory open as dfd (and closes it). Uses *at() calls so
 * deep trees need no path building and symlinks are removed, never followed. */
static int remove_dir_contents(int dfd, const char *path, int depth, qd_err *err)
{
    DIR *d = fdopendir(dfd);
    if (!d) { close(dfd); return qd_err_set(err, QD_EIO, "%s: cannot read directory: %s", path, strerror(errno)); }
    int rc = 0;
    struct dirent *de;
    while (rc == 0 && (errno = 0, de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
        if (unlinkat(dirfd(d), de->d_name, 0) == 0 || errno == ENOENT) continue;
        if (errno != EISDIR && errno != EPERM) {
            rc = qd_err_set(err, QD_EIO, "%s/%s: cannot remove: %s", path, de->d_name, strerror(errno));
            break;
        }
        if (depth > 256) { rc = qd_err_set(err, QD_EIO, "%s: directory tree too deep to remove", path); break; }
        int sub = openat(dirfd(d), de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sub < 0) { rc = qd_err_set(err, QD_EIO, "%s/%s: cannot open: %s", path, de->d_name, strerror(errno)); break; }
        if ((rc = remove_dir_contents(sub, path, depth + 1, err))) break;
        if (unlinkat(dirfd(d), de->d_name, AT_REMOVEDIR) != 0 && errno != ENOENT)
            rc = qd_err_set(err, QD_EIO, "%s/%s: cannot remove directory: %s", path, de->d_name, strerror(errno));
    }
    closedir(d);
    return rc;
}

int qd_fs_remove_contents_fd(int dirfd, const char *shown, qd_err *err)
{
    int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return qd_err_set(err, QD_EIO, "%s: cannot open: %s", shown, strerror(errno));
    return remove_dir_contents(fd, shown, 0, err);
}

int qd_fs_remove_tree(const char *path, qd_err *err)
{
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT) return 0;
        return qd_err_set(err, QD_EIO, "%s: cannot stat: %s", path, strerror(errno));
    }
    if (!S_ISDIR(st.st_mode)) {
        if (unlink(path) != 0 && errno != ENOENT)
            return qd_err_set(err, QD_EIO, "%s: cannot remove: %s", path, strerror(errno));
        return 0;
    }
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return qd_err_set(err, QD_EIO, "%s: cannot open: %s", path, strerror(errno));
    int rc = remove_dir_contents(fd, path, 0, err);
    if (rc == 0 && rmdir(path) != 0 && errno != ENOENT)
        rc = qd_err_set(err, QD_EIO, "%s: cannot remove directory: %s", path, strerror(errno));
    return rc;
}

/* Sums the regular files under the directory open as dfd (and closes it), with *at() calls
 * like remove_dir_contents: symbolic links are not followed. */
static uint64_t dir_bytes(int dfd, int depth)
{
    DIR *d = fdopendir(dfd);
    if (!d) { close(dfd); return 0; }
    uint64_t sum = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
        struct stat st;
        if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;   /* removed meanwhile */
        if (S_ISREG(st.st_mode)) {
            sum += (uint64_t)st.st_size;
        } else if (S_ISDIR(st.st_mode) && depth < 256) {
            int sub = openat(dirfd(d), de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub >= 0) sum += dir_bytes(sub, depth + 1);
        }
    }
    closedir(d);
    return sum;
}

uint64_t qd_fs_tree_bytes_fd(int dirfd)
{
    int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    return fd < 0 ? 0 : dir_bytes(fd, 0);
}

uint64_t qd_fs_tree_bytes(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0) return 0;
    if (S_ISREG(st.st_mode)) return (uint64_t)st.st_size;
    if (!S_ISDIR(st.st_mode)) return 0;
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    return fd < 0 ? 0 : dir_bytes(fd, 0);
}

const char *qd_fs_path_tail(const char *path, size_t room, char *buf, size_t cap)
{
    size_t n = strlen(path);
    if (n <= room || room < 8 || cap <= room) return path;
    snprintf(buf, cap, "...%s", path + n - (room - 3));
    return buf;
}

int qd_fs_free_bytes(const char *path, uint64_t *out, qd_err *err)
{
    struct statvfs sv;
    if (statvfs(path, &sv) != 0) return qd_err_set(err, io_code(errno), "%s: statvfs failed: %s", path, strerror(errno));
    *out = (uint64_t)sv.f_bavail * (uint64_t)sv.f_frsize;
    return 0;
}

int qd_fs_resolve(const char *path, char *out, size_t cap, qd_err *err)
{
    if (!path || path[0] != '/') return qd_err_set(err, QD_EINVAL, "path '%s' is not absolute", path ? path : "(null)");
    size_t len = strlen(path);
    if (len >= PATH_MAX || cap < PATH_MAX) return qd_err_set(err, QD_EINVAL, "path is longer than %d bytes", PATH_MAX);
    char cur[PATH_MAX], resolved[PATH_MAX];
    memcpy(cur, path, len + 1);
    while (len > 1 && cur[len - 1] == '/') cur[--len] = 0;
    /* Walk up to the deepest ancestor that exists; what is below it must be plain names,
     * since a `..` below a missing directory cannot be resolved and a dangling link could
     * point anywhere once its target is created. */
    size_t tail = len;   /* cur[tail..] (after the cut) is the part that does not exist yet */
    for (;;) {
        while (strlen(cur) > 1 && cur[strlen(cur) - 1] == '/') cur[strlen(cur) - 1] = 0;
        if (realpath(cur, resolved)) break;
        if (errno != ENOENT) return qd_err_set(err, QD_EINVAL, "%s: %s", path, strerror(errno));
        struct stat st;
        if (!lstat(cur, &st))
            return qd_err_set(err, QD_EINVAL, "%s: %s is a symbolic link to a path that does not exist", path, cur);
        char *slash = strrchr(cur, '/');
        const char *name = slash + 1;
        if (!strcmp(name, "..") || !strcmp(name, ".") || !*name)
            return qd_err_set(err, QD_EINVAL, "%s: '%s' below a directory that does not exist cannot be resolved", path,
                              *name ? name : "//");
        if (slash == cur) { strcpy(cur, "/"); tail = 1; }
        else { *slash = 0; tail = (size_t)(slash - cur); }
    }
    size_t rlen = strlen(resolved);
    if (tail < len) {   /* append the missing part, already checked to be plain names */
        const char *rest = path + tail + (path[tail] == '/' ? 1 : 0);
        size_t restlen = len - (size_t)(rest - path);
        if (rlen + 1 + restlen >= PATH_MAX) return qd_err_set(err, QD_EINVAL, "path is longer than %d bytes", PATH_MAX);
        if (rlen > 1) resolved[rlen++] = '/';
        memcpy(resolved + rlen, rest, restlen);
        resolved[rlen + restlen] = 0;
        /* Collapse doubled slashes in the missing part ("a//b"); realpath did the rest. */
        char *w = resolved;
        for (const char *r = resolved; *r; r++)
            if (!(r[0] == '/' && r[1] == '/')) *w++ = *r;
        *w = 0;
    }
    memcpy(out, resolved, strlen(resolved) + 1);
    return 0;
}

int qd_fs_path_within(const char *inner, const char *dir)
{
    size_t n = strlen(dir);
    if (n == 1 && dir[0] == '/') return 1;
    return !strncmp(inner, dir, n) && (inner[n] == 0 || inner[n] == '/');
}
