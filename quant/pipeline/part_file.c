/* The part file container (part.h): a JSON meta and raw arrays, checksummed, written
 * atomically beside the checkpoint. */
#define _GNU_SOURCE
#include "quant/pipeline/part.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "quant/core/confine.h"
#include "quant/core/fsutil.h"
#include "quant/pipeline/acts.h"

#define PART_MAGIC "QDPART\0\0"
#define PART_HEAD 40                    /* magic 8, version 4, 0 4, meta_len 8, data_len 8, checksum 8 */
#define PART_META_MAX ((uint64_t)16 << 20)
#define PART_ALIGN 64

static void put_u32(unsigned char *b, uint32_t v) { for (int i = 0; i < 4; i++) b[i] = (unsigned char)(v >> (8 * i)); }
static void put_u64(unsigned char *b, uint64_t v) { for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i)); }
static uint32_t get_u32(const unsigned char *b) { uint32_t v = 0; for (int i = 3; i >= 0; i--) v = v << 8 | b[i]; return v; }
static uint64_t get_u64(const unsigned char *b) { uint64_t v = 0; for (int i = 7; i >= 0; i--) v = v << 8 | b[i]; return v; }

static uint64_t round_up(uint64_t x) { return (x + PART_ALIGN - 1) / PART_ALIGN * PART_ALIGN; }

/* The data's checksum: qd_hash64's step (xor a little-endian word, multiply) on four
 * independent lanes, one word each of every 32 bytes, so the four multiplications overlap
 * (a part file is gigabytes; one chain of dependent multiplications is what bounded its
 * hashing). Every word still passes through a bijection of its lane, so any change to one
 * word changes the sum. The data section is streamed in multiples of 32 bytes: each array
 * starts 64-byte aligned and is padded to 64. */
typedef struct part_hash {
    uint64_t l[4];
} part_hash;

static void part_hash_init(part_hash *s, uint64_t seed)
{
    for (int i = 0; i < 4; i++) s->l[i] = seed ^ (0x9e3779b97f4a7c15ull * (uint64_t)(i + 1));
}

static void part_hash_blocks(part_hash *s, const void *data, uint64_t n)   /* n: a multiple of 32 */
{
    const unsigned char *p = data;
    uint64_t a = s->l[0], b = s->l[1], c = s->l[2], d = s->l[3], w[4];
    for (uint64_t i = 0; i + 32 <= n; i += 32) {
        memcpy(w, p + i, 32);
        a = (a ^ w[0]) * 0x100000001b3ull;
        b = (b ^ w[1]) * 0x100000001b3ull;
        c = (c ^ w[2]) * 0x100000001b3ull;
        d = (d ^ w[3]) * 0x100000001b3ull;
    }
    s->l[0] = a; s->l[1] = b; s->l[2] = c; s->l[3] = d;
}

static uint64_t part_hash_final(const part_hash *s)
{
    unsigned char b[32];
    for (int i = 0; i < 4; i++) put_u64(b + 8 * i, s->l[i]);
    return qd_hash64(b, sizeof b, QD_HASH64_INIT);
}

uint64_t qd_part_checksum(const void *data, uint64_t n)
{
    part_hash ph;
    part_hash_init(&ph, QD_HASH64_INIT);
    uint64_t body = n / 32 * 32;
    part_hash_blocks(&ph, data, body);
    return qd_hash64((const unsigned char *)data + body, n - body, part_hash_final(&ph));
}

int qd_part_file_write(int dirfd, const char *name, cJSON *meta, const qd_part_arr *arrs, int n,
                       uint64_t *checksum, qd_err *err)
{
    cJSON *a = cJSON_CreateObject();
    if (!a) return qd_err_set(err, QD_ENOMEM, "out of memory");
    cJSON_DeleteItemFromObject(meta, "arrays");
    cJSON_AddItemToObject(meta, "arrays", a);
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        cJSON *pair = cJSON_CreateArray();
        cJSON_AddItemToArray(pair, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(pair, cJSON_CreateNumber((double)arrs[i].bytes));
        cJSON_AddItemToObject(a, arrs[i].name, pair);
        off = round_up(off + arrs[i].bytes);
    }
    char *text = cJSON_PrintUnformatted(meta);
    if (!text) return qd_err_set(err, QD_ENOMEM, "out of memory");
    uint64_t tl = strlen(text);
    uint64_t meta_len = round_up(PART_HEAD + tl) - PART_HEAD;   /* the data starts aligned */
    char *mbuf = malloc(meta_len);
    static const char zeros[PART_ALIGN];
    struct iovec *iov = malloc((size_t)(2 * n + 2) * sizeof *iov);
    if (!mbuf || !iov) {
        free(text); free(mbuf); free(iov);
        return qd_err_set(err, QD_ENOMEM, "out of memory");
    }
    memcpy(mbuf, text, tl);
    memset(mbuf + tl, ' ', meta_len - tl);
    free(text);
    part_hash ph;
    part_hash_init(&ph, qd_hash64(mbuf, meta_len, QD_HASH64_INIT));
    uint64_t data_len = 0;
    int ni = 2;
    for (int i = 0; i < n; i++) {
        uint64_t pad = round_up(arrs[i].bytes) - arrs[i].bytes;
        /* The hash runs over the data as the reader sees it, contiguous: an array's last
         * partial 64 bytes are hashed together with the padding after them. */
        uint64_t whole = arrs[i].bytes & ~(uint64_t)(PART_ALIGN - 1), rest = arrs[i].bytes - whole;
        part_hash_blocks(&ph, arrs[i].data, whole);
        if (rest + pad) {
            unsigned char tail[PART_ALIGN] = {0};
            memcpy(tail, (const char *)arrs[i].data + whole, rest);
            part_hash_blocks(&ph, tail, rest + pad);
        }
        iov[ni++] = (struct iovec){(void *)arrs[i].data, arrs[i].bytes};
        if (pad) iov[ni++] = (struct iovec){(void *)zeros, pad};
        data_len += arrs[i].bytes + pad;
    }
    unsigned char head[PART_HEAD];
    memcpy(head, PART_MAGIC, 8);
    put_u32(head + 8, QD_PART_VERSION);
    put_u32(head + 12, 0);
    put_u64(head + 16, meta_len);
    put_u64(head + 24, data_len);
    uint64_t h = part_hash_final(&ph);
    put_u64(head + 32, h);
    iov[0] = (struct iovec){head, PART_HEAD};
    iov[1] = (struct iovec){mbuf, meta_len};
    char path[64];
    qd_confine_fd_path(dirfd, path, sizeof path);
    char full[128 + 256];
    snprintf(full, sizeof full, "%s/%s", path, name);
    /* No fsync: a part file lost or torn by a crash fails its checksum and is computed again,
     * and syncing gigabytes of scratch a block would cost more than the parts gain. */
    int rc = qd_fs_write_scratch_iov(full, iov, ni, err);
    free(mbuf);
    free(iov);
    if (!rc && checksum) *checksum = h;
    return rc;
}

static int open_part(int dirfd, const char *name, int *fd, uint64_t *size, qd_err *err)
{
    *fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (*fd < 0) {
        if (errno == ENOENT) return qd_err_set(err, QD_ENOTFOUND, "part file %s: not there", name);
        return qd_err_set(err, QD_EFORMAT, "part file %s: %s", name, strerror(errno));
    }
    struct stat st;
    if (fstat(*fd, &st) || !S_ISREG(st.st_mode)) {
        close(*fd);
        *fd = -1;
        return qd_err_set(err, QD_EFORMAT, "part file %s: not a regular file", name);
    }
    *size = (uint64_t)st.st_size;
    return 0;
}

static int read_all(int fd, void *buf, uint64_t n)
{
    char *p = buf;
    while (n) {
        ssize_t k = read(fd, p, n > (1u << 30) ? (1u << 30) : n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        p += k;
        n -= (uint64_t)k;
    }
    return 0;
}

static int read_head(int fd, const char *name, uint64_t size, uint64_t *meta_len, uint64_t *data_len,
                     uint64_t *checksum, qd_err *err)
{
    unsigned char head[PART_HEAD];
    if (size < PART_HEAD || read_all(fd, head, PART_HEAD))
        return qd_err_set(err, QD_EFORMAT, "part file %s: truncated header", name);
    if (memcmp(head, PART_MAGIC, 8)) return qd_err_set(err, QD_EFORMAT, "part file %s: not a part file", name);
    if (get_u32(head + 8) != QD_PART_VERSION)
        return qd_err_set(err, QD_EFORMAT, "part file %s: version %u, this build reads %d", name, get_u32(head + 8),
                          QD_PART_VERSION);
    *meta_len = get_u64(head + 16);
    *data_len = get_u64(head + 24);
    *checksum = get_u64(head + 32);
    if (*meta_len > PART_META_MAX || *data_len > size || PART_HEAD + *meta_len + *data_len != size)
        return qd_err_set(err, QD_EFORMAT, "part file %s: %llu bytes, its header says %llu", name,
                          (unsigned long long)size, (unsigned long long)(PART_HEAD + *meta_len + *data_len));
    return 0;
}

int qd_part_file_read(int dirfd, const char *name, qd_part_file *f, qd_err *err)
{
    memset(f, 0, sizeof *f);
    int fd;
    uint64_t size, meta_len, data_len, sum;
    int rc = open_part(dirfd, name, &fd, &size, err);
    if (rc) return rc;
    rc = read_head(fd, name, size, &meta_len, &data_len, &sum, err);
    char *meta = NULL;
    if (!rc) {
        meta = malloc(meta_len + 1);
        f->data = malloc(data_len ? data_len : 1);
        if (!meta || !f->data) rc = qd_err_set(err, QD_ENOMEM, "part file %s: out of memory for %llu bytes", name,
                                               (unsigned long long)data_len);
    }
    if (!rc && (read_all(fd, meta, meta_len) || read_all(fd, f->data, data_len)))
        rc = qd_err_set(err, QD_EFORMAT, "part file %s: short read", name);
    close(fd);
    if (!rc) {
        part_hash ph;
        part_hash_init(&ph, qd_hash64(meta, meta_len, QD_HASH64_INIT));
        part_hash_blocks(&ph, f->data, data_len);
        uint64_t h = part_hash_final(&ph);
        if (h != sum || data_len % PART_ALIGN) rc = qd_err_set(err, QD_EFORMAT, "part file %s: checksum mismatch (damaged)", name);
    }
    if (!rc) {
        meta[meta_len] = 0;
        f->meta = cJSON_ParseWithLength(meta, meta_len);
        if (!cJSON_IsObject(f->meta)) rc = qd_err_set(err, QD_EFORMAT, "part file %s: meta is not a JSON object", name);
    }
    free(meta);
    f->data_len = data_len;
    f->checksum = sum;
    if (rc) qd_part_file_free(f);
    return rc;
}

uint64_t qd_part_file_checksum(int dirfd, const char *name)
{
    int fd;
    uint64_t size = 0, ml, dl, sum = 0;
    qd_err e = {0};
    if (open_part(dirfd, name, &fd, &size, &e)) return 0;
    if (read_head(fd, name, size, &ml, &dl, &sum, &e)) sum = 0;
    close(fd);
    return sum;
}

cJSON *qd_part_file_meta(int dirfd, const char *name)
{
    int fd;
    uint64_t size = 0, ml, dl, sum;
    qd_err e = {0};
    if (open_part(dirfd, name, &fd, &size, &e)) return NULL;
    cJSON *meta = NULL;
    char *buf = NULL;
    if (!read_head(fd, name, size, &ml, &dl, &sum, &e) && (buf = malloc(ml + 1)) && !read_all(fd, buf, ml))
        meta = cJSON_ParseWithLength(buf, ml);
    free(buf);
    close(fd);
    return meta;
}

const void *qd_part_file_arr(const qd_part_file *f, const char *name, uint64_t bytes, qd_err *err)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(f->meta, "arrays"), name);
    const cJSON *o = cJSON_GetArrayItem(a, 0), *b = cJSON_GetArrayItem(a, 1);
    if (!cJSON_IsNumber(o) || !cJSON_IsNumber(b) || o->valuedouble < 0 || b->valuedouble != (double)bytes ||
        o->valuedouble + (double)bytes > (double)f->data_len) {
        qd_err_set(err, QD_EFORMAT, "part file: array %s missing or not %llu bytes", name, (unsigned long long)bytes);
        return NULL;
    }
    return f->data + (uint64_t)o->valuedouble;
}

void qd_part_file_free(qd_part_file *f)
{
    if (!f) return;
    cJSON_Delete(f->meta);
    free(f->data);
    memset(f, 0, sizeof *f);
}

void qd_part_outputs_remove(int dirfd, int block, const char *step, int n, const uint64_t *in_sums)
{
    int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return;
    DIR *d = fdopendir(fd);
    if (!d) { close(fd); return; }
    char prefix[48];
    int pl = snprintf(prefix, sizeof prefix, "b%04d-%s-", block, step);
    struct dirent *e;
    while ((e = readdir(d))) {
        /* b<block>-<step>-<index>-<in checksum>-<maker>.out.part */
        if (strncmp(e->d_name, prefix, (size_t)pl)) continue;
        int index = -1, used = 0;
        unsigned long long sum = 0;
        if (sscanf(e->d_name + pl, "%4d-%16llx-%n", &index, &sum, &used) != 2 || used != 4 + 1 + 16 + 1) continue;
        if (index >= 0 && index < n && sum == in_sums[index] && strstr(e->d_name, ".out.part"))
            unlinkat(dirfd, e->d_name, 0);
    }
    closedir(d);
}

void qd_part_file_remove(int dirfd, const char *name)
{
    unlinkat(dirfd, name, 0);
}

void qd_part_files_remove(int dirfd, const char *prefix)
{
    int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return;
    DIR *d = fdopendir(fd);
    if (!d) { close(fd); return; }
    size_t pl = prefix ? strlen(prefix) : 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        if (prefix && strncmp(e->d_name, prefix, pl)) continue;
        unlinkat(dirfd, e->d_name, 0);
    }
    closedir(d);
}
