/* The confinement of a job's files (confine.h): opens beneath the allowed roots with
 * openat2, or a component walk without it; regular files only; reads and copies bounded by
 * the kind's limit. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE   /* O_DIRECTORY, O_NOFOLLOW, O_PATH */
#endif
#include "quant/core/confine.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "quant/core/fsutil.h"

#define QD_CONFINE_MAX_ROOTS 64

/* Process-wide by design (confine.h): written once at start-up, read by every open. */
static struct {
    size_t n;
    int fd[QD_CONFINE_MAX_ROOTS];
    char *path[QD_CONFINE_MAX_ROOTS];
    uint64_t lim[QD_INPUT_KINDS];
    int force_walk;
} g = {.lim = {QD_INPUT_JSON_MAX_DEFAULT, QD_INPUT_TOKENIZER_MAX_DEFAULT, QD_INPUT_TEXT_MAX_DEFAULT, 0}};

static const char *const kind_names[QD_INPUT_KINDS] = {"json", "tokenizer", "text", "weights"};
static const char *const kind_env[QD_INPUT_KINDS] = {"QUANTD_MAX_JSON_BYTES", "QUANTD_MAX_TOKENIZER_BYTES",
                                                     "QUANTD_MAX_TEXT_BYTES", ""};

const char *qd_input_kind_name(qd_input_kind k)
{
    return (unsigned)k < QD_INPUT_KINDS ? kind_names[k] : "?";
}

void qd_confine_set_limits(const uint64_t max_bytes[QD_INPUT_KINDS])
{
    for (int k = 0; k < QD_INPUT_WEIGHTS; k++)
        if (max_bytes[k]) g.lim[k] = max_bytes[k];
}

uint64_t qd_confine_limit(qd_input_kind k)
{
    return (unsigned)k < QD_INPUT_KINDS ? g.lim[k] : 0;
}

int qd_confine_active(void) { return g.n > 0; }

void qd_confine_force_walk_for_tests(int on) { g.force_walk = on; }

void qd_confine_reset_for_tests(void)
{
    for (size_t i = 0; i < g.n; i++) {
        close(g.fd[i]);
        free(g.path[i]);
    }
    g.n = 0;
    g.force_walk = 0;
}

int qd_confine_set(const char *const roots[], size_t n, qd_err *err)
{
    if (g.n) return qd_err_set(err, QD_EINVAL, "the process is already confined to its allowed roots");
    if (n == 0) return qd_err_set(err, QD_EINVAL, "confinement needs at least one allowed root");
    if (n > QD_CONFINE_MAX_ROOTS) return qd_err_set(err, QD_EINVAL, "%zu allowed roots: at most %d", n, QD_CONFINE_MAX_ROOTS);
    for (size_t i = 0; i < n; i++) {
        char canon[PATH_MAX];
        int rc = qd_fs_resolve(roots[i], canon, sizeof canon, err);
        int fd = rc ? -1 : open(canon, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        char *copy = fd >= 0 ? strdup(canon) : NULL;
        if (!copy) {
            int e = errno;
            if (fd >= 0) close(fd);
            qd_confine_reset_for_tests();
            if (rc) return rc;
            return qd_err_set(err, QD_EINVAL, "allowed root %s: %s", roots[i], strerror(e));
        }
        g.fd[g.n] = fd;
        g.path[g.n] = copy;
        g.n++;
    }
    return 0;
}

/* ---- resolution beneath a root ---------------------------------------------------------- */

/* The root whose subtree holds path, lexically (the roots are canonical), and path's part
 * below it ("." for the root itself). A path that reaches a root only through a link above
 * it (/mnt/alias -> /data) is resolved first; the open that follows is beneath the root
 * either way, so this choice cannot widen what is reachable. */
static int find_root(const char *path, char *rel, size_t cap, qd_err *err)
{
    char resolved[PATH_MAX];
    for (int pass = 0; pass < 2; pass++) {
        const char *p = pass ? resolved : path;
        for (size_t i = 0; i < g.n; i++) {
            size_t l = strlen(g.path[i]);
            if (strcmp(g.path[i], "/") == 0) l = 0;
            if (strncmp(p, g.path[i], l) != 0 || (p[l] != '/' && p[l] != '\0')) continue;
            const char *r = p + l;
            while (*r == '/') r++;
            if ((size_t)snprintf(rel, cap, "%s", *r ? r : ".") >= cap)
                return qd_err_set(err, QD_EINVAL, "%s: path too long", path);
            return (int)i;
        }
        if (pass == 0) {
            qd_err rerr = {0};
            if (path[0] != '/' || qd_fs_resolve(path, resolved, sizeof resolved, &rerr)) break;
        }
    }
    if (path[0] != '/') return qd_err_set(err, QD_EINVAL, "%s: not an absolute path", path);
    return qd_err_set(err, QD_EINVAL, "%s is outside every allowed root (first: %s)", path, g.path[0]);
}

/* openat(2) of rel below dirfd one component at a time, no symbolic link followed and no
 * "..": for kernels without openat2. Intermediate components are directories. */
static int walk_open(int dirfd, const char *rel, int flags, mode_t mode)
{
    char buf[PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", rel) >= (int)sizeof buf) { errno = ENAMETOOLONG; return -1; }
    int cur = dup(dirfd);
    if (cur < 0) return -1;
    char *save = NULL, *comp = strtok_r(buf, "/", &save);
    if (!comp) {   /* the root itself */
        int fd = openat(cur, ".", flags | O_NOFOLLOW, mode);
        int e = errno;
        close(cur);
        errno = e;
        return fd;
    }
    while (comp) {
        char *next = strtok_r(NULL, "/", &save);
        if (!strcmp(comp, "..")) { close(cur); errno = EXDEV; return -1; }
        if (!strcmp(comp, ".") && next) { comp = next; continue; }
        int fd = next ? openat(cur, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
                      : openat(cur, comp, flags | O_NOFOLLOW, mode);
        int e = errno;
        close(cur);
        if (fd < 0) { errno = e; return -1; }
        cur = fd;
        comp = next;
    }
    return cur;
}

/* Opens rel beneath dirfd: no component may leave it (EXDEV), and no magic /proc link is
 * followed. Symbolic links inside it are followed unless no_symlinks. */
static int open_beneath(int dirfd, const char *rel, int flags, mode_t mode, int no_symlinks)
{
    if (!g.force_walk) {
        struct open_how how = {.flags = (uint64_t)flags, .mode = (flags & O_CREAT) ? mode : 0,
                               .resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS |
                                          (no_symlinks ? RESOLVE_NO_SYMLINKS : 0)};
        long fd;
        /* EAGAIN: a rename raced the lookup of "..", and the kernel asks to retry; bounded,
         * so one who renames in a loop cannot hold the job here. */
        int tries = 0;
        do fd = syscall(SYS_openat2, dirfd, rel, &how, sizeof how);
        while (fd < 0 && errno == EAGAIN && ++tries < 64);
        if (fd >= 0 || (errno != ENOSYS && errno != EPERM)) return (int)fd;
        /* ENOSYS: no openat2 (before Linux 5.6); EPERM: a seccomp filter that refuses it. */
    }
    return walk_open(dirfd, rel, flags, mode);
}

static int open_error(const char *path, const char *what, int e, qd_err *err)
{
    if (e == ENOENT) return qd_err_set(err, QD_ENOTFOUND, "%s: cannot open %s: %s", path, what, strerror(e));
    if (e == EXDEV)
        return qd_err_set(err, QD_EINVAL, "%s: refused: it leads outside the allowed roots (a symbolic link or \"..\" "
                                          "that leaves them)", path);
    if (e == ELOOP)
        return qd_err_set(err, QD_EINVAL, "%s: refused: a symbolic link where none may be (or a loop of links)", path);
    if (e == ENXIO)   /* open(2) of a socket, or of a device with no driver behind it */
        return qd_err_set(err, QD_EINVAL, "%s: refused: a socket or a device, not a regular file", path);
    return qd_err_set(err, e == ENOSPC || e == EDQUOT ? QD_ERESOURCE : QD_EIO, "%s: cannot open %s: %s", path, what,
                      strerror(e));
}

/* "/proc/self/fd/N/rest" (qd_confine_fd_path): N and rest, for an open beneath the
 * directory this process holds as N. 0 when path is not of that form. */
static int fd_path_split(const char *path, int *dirfd, const char **rest)
{
    static const char pre[] = "/proc/self/fd/";
    if (strncmp(path, pre, sizeof pre - 1) != 0) return 0;
    char *end;
    long n = strtol(path + sizeof pre - 1, &end, 10);
    if (end == path + sizeof pre - 1 || n < 0 || n > INT_MAX || (*end != '/' && *end != '\0')) return 0;
    while (*end == '/') end++;
    *dirfd = (int)n;
    *rest = *end ? end : ".";
    return 1;
}

static int open_confined(const char *path, int flags, mode_t mode, const char *what, qd_err *err)
{
    int fd, dirfd;
    const char *rest;
    if (fd_path_split(path, &dirfd, &rest)) {
        /* A file of a directory the job holds open (its output): beneath that directory. */
        fd = open_beneath(dirfd, rest, flags, mode, 0);
    } else if (g.n) {
        char rel[PATH_MAX];
        int r = find_root(path, rel, sizeof rel, err);
        if (r < 0) return r;
        fd = open_beneath(g.fd[r], rel, flags, mode, 0);
    } else {
        fd = open(path, flags, mode);
    }
    if (fd < 0) return open_error(path, what, errno, err);
    return fd;
}

static const char *type_name(mode_t m)
{
    if (S_ISDIR(m)) return "a directory";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    if (S_ISLNK(m)) return "a symbolic link";
    return "not a regular file";
}

static int over_limit(const char *path, qd_input_kind kind, uint64_t size, qd_err *err)
{
    return qd_err_set(err, QD_EINVAL, "%s: refused: %" PRIu64 " bytes is over the %s file limit of %" PRIu64
                      " bytes (%s)", path, size, kind_names[kind], g.lim[kind], kind_env[kind]);
}

int qd_input_open(const char *path, qd_input_kind kind, int *fd_out, uint64_t *size, qd_err *err)
{
    *fd_out = -1;
    if ((unsigned)kind >= QD_INPUT_KINDS) return qd_err_set(err, QD_EINVAL, "%s: bad input kind", path);
    /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever. */
    int fd = open_confined(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY, 0, "file", err);
    if (fd < 0) return fd;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return qd_err_set(err, QD_EIO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return qd_err_set(err, QD_EINVAL, "%s: refused: %s, not a regular file", path, type_name(st.st_mode));
    }
    if (g.lim[kind] && (uint64_t)st.st_size > g.lim[kind]) {
        close(fd);
        return over_limit(path, kind, (uint64_t)st.st_size, err);
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    *fd_out = fd;
    if (size) *size = (uint64_t)st.st_size;
    return 0;
}

int qd_input_read(const char *path, qd_input_kind kind, char **buf, size_t *len, qd_err *err)
{
    *buf = NULL;
    *len = 0;
    int fd;
    uint64_t size;
    int rc = qd_input_open(path, kind, &fd, &size, err);
    if (rc) return rc;
    uint64_t lim = g.lim[kind] ? g.lim[kind] : UINT64_MAX;
    rc = qd_fs_read_fd(fd, size, lim, path, buf, len, err);
    close(fd);
    if (!rc && *len > lim) {   /* it grew past the limit after the fstat */
        uint64_t got = *len;
        free(*buf);
        *buf = NULL;
        *len = 0;
        return over_limit(path, kind, got, err);
    }
    return rc;
}

int qd_input_exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

int qd_input_copy_at(const char *src, qd_input_kind kind, int dirfd, const char *name, const char *dst_shown,
                     qd_err *err)
{
    int in;
    uint64_t size;
    int rc = qd_input_open(src, kind, &in, &size, err);
    if (rc) return rc;
    uint64_t lim = g.lim[kind] ? g.lim[kind] : UINT64_MAX;
    char tmp[NAME_MAX + 32];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp.%ld", name, (long)getpid()) >= sizeof tmp) {
        close(in);
        return qd_err_set(err, QD_EINVAL, "%s: name too long", dst_shown);
    }
    char *buf = malloc(1 << 20);
    int out = buf ? openat(dirfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644) : -1;
    if (!buf) rc = qd_err_set(err, QD_ENOMEM, "%s: out of memory", dst_shown);
    else if (out < 0) rc = open_error(dst_shown, "a temporary file for", errno, err);
    uint64_t done = 0;
    while (!rc) {
        ssize_t r = read(in, buf, 1 << 20);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) { rc = qd_err_set(err, QD_EIO, "%s: read failed: %s", src, strerror(errno)); break; }
        if (r == 0) break;
        done += (uint64_t)r;
        if (done > lim) { rc = over_limit(src, kind, done, err); break; }
        for (ssize_t off = 0; off < r && !rc;) {
            ssize_t w = write(out, buf + off, (size_t)(r - off));
            if (w < 0 && errno == EINTR) continue;
            if (w < 0) rc = qd_err_set(err, errno == ENOSPC || errno == EDQUOT ? QD_ERESOURCE : QD_EIO,
                                       "%s: write failed: %s", dst_shown, strerror(errno));
            else off += w;
        }
    }
    if (!rc && fsync(out) != 0) rc = qd_err_set(err, QD_EIO, "%s: fsync failed: %s", dst_shown, strerror(errno));
    if (out >= 0 && close(out) != 0 && !rc) rc = qd_err_set(err, QD_EIO, "%s: close failed: %s", dst_shown, strerror(errno));
    if (!rc && renameat(dirfd, tmp, dirfd, name) != 0)
        rc = qd_err_set(err, QD_EIO, "%s: cannot rename its temporary file over it: %s", dst_shown, strerror(errno));
    if (rc && out >= 0) unlinkat(dirfd, tmp, 0);
    if (!rc && fsync(dirfd) != 0 && errno != EINVAL && errno != EROFS)
        rc = qd_err_set(err, QD_EIO, "%s: cannot fsync its directory: %s", dst_shown, strerror(errno));
    free(buf);
    close(in);
    return rc;
}

/* ---- the output directory ---------------------------------------------------------------- */

/* The directory leaf in parent, never through a symbolic link; made (0755) when missing
 * and create is set. Returns the descriptor or a negative code. */
static int leaf_open(int parent, const char *leaf, int create, int *created, const char *path, qd_err *err)
{
    if (!strcmp(leaf, "..") || strchr(leaf, '/')) return open_error(path, "directory", EXDEV, err);
    int fd = openat(parent, leaf, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT && create) {
        if (mkdirat(parent, leaf, 0755) != 0 && errno != EEXIST) return open_error(path, "(creating) directory", errno, err);
        if (created) *created = 1;
        fd = openat(parent, leaf, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    }
    if (fd < 0) {
        if (errno == ENOTDIR) return qd_err_set(err, QD_EINVAL, "%s: refused: exists and is not a directory", path);
        return open_error(path, "directory", errno, err);
    }
    return fd;
}

/* Opens (creating when asked) each directory of rel below the root fd in turn: the parents
 * beneath the root (links inside it followed), the last one itself never a link. */
static int dir_walk(int rootfd, const char *path, const char *rel, int create, int *created, qd_err *err)
{
    char buf[PATH_MAX];
    snprintf(buf, sizeof buf, "%s", rel);
    size_t n = strlen(buf);
    while (n > 1 && buf[n - 1] == '/') buf[--n] = '\0';
    char *last = strrchr(buf, '/');
    int parent;
    const char *leaf;
    if (!strcmp(buf, ".")) {   /* the root itself */
        int fd = open_beneath(rootfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0, 0);
        return fd < 0 ? open_error(path, "directory", errno, err) : fd;
    }
    if (last) {
        *last = '\0';
        leaf = last + 1;
        parent = open_beneath(rootfd, buf, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0, 0);
        if (parent < 0 && errno == ENOENT && create) {
            /* Make the parents one at a time, each beneath the root. */
            int rc = dir_walk(rootfd, path, buf, 1, NULL, err);
            if (rc < 0) return rc;
            parent = rc;
        }
        if (parent < 0) return open_error(path, "the directory above", errno, err);
    } else {
        leaf = buf;
        parent = dup(rootfd);
        if (parent < 0) return open_error(path, "directory", errno, err);
    }
    int fd = leaf_open(parent, leaf, create, created, path, err);
    close(parent);
    return fd;
}

int qd_confine_dir_open(const char *path, int create, int *fd_out, int *created, qd_err *err)
{
    *fd_out = -1;
    if (created) *created = 0;
    int fd;
    if (g.n) {
        char rel[PATH_MAX];
        int r = find_root(path, rel, sizeof rel, err);
        if (r < 0) return r;
        fd = dir_walk(g.fd[r], path, rel, create, created, err);
    } else {
        if (create) {
            struct stat st;
            int existed = lstat(path, &st) == 0;
            int rc = qd_fs_mkdir_p(path, err);
            if (rc) return rc;
            if (created) *created = !existed;
        }
        fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0) {
            if (errno == ENOTDIR) return qd_err_set(err, QD_EINVAL, "%s: refused: exists and is not a directory", path);
            return open_error(path, "directory", errno, err);
        }
    }
    if (fd < 0) return fd;
    *fd_out = fd;
    return 0;
}

int qd_confine_subdir_open(int dirfd, const char *name, int create, int *fd_out, int *created, const char *shown,
                           qd_err *err)
{
    *fd_out = -1;
    if (created) *created = 0;
    int fd = leaf_open(dirfd, name, create, created, shown, err);
    if (fd < 0) return fd;
    *fd_out = fd;
    return 0;
}

const char *qd_confine_fd_path(int fd, char *buf, size_t cap)
{
    snprintf(buf, cap, "/proc/self/fd/%d", fd);
    return buf;
}
