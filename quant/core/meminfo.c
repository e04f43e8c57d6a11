/* The memory this process may use: the machine's and its memory cgroup's (meminfo.h). */
#include "quant/core/meminfo.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* v1 reports "no limit" as the largest page-aligned signed 64-bit value; anything this
 * large is no limit in practice. */
#define MEM_NO_LIMIT ((uint64_t)1 << 62)

static uint64_t u64min(uint64_t a, uint64_t b) { return a < b ? a : b; }

/* The first line of path; 0 when it cannot be read. */
static int read_line(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int ok = fgets(buf, (int)cap, f) != NULL;
    fclose(f);
    return ok;
}

/* A limit file: *v its bytes, 0 for "max" or a value that means none; 0 when unreadable. */
static int read_limit(const char *path, uint64_t *v)
{
    char line[64];
    if (!read_line(path, line, sizeof line)) return 0;
    if (!strncmp(line, "max", 3)) { *v = 0; return 1; }
    char *end = NULL;
    unsigned long long x = strtoull(line, &end, 10);
    if (end == line) return 0;
    *v = x >= MEM_NO_LIMIT ? 0 : (uint64_t)x;
    return 1;
}

/* The value of "key N" in a memory.stat or /proc/meminfo style file, times unit; 0 when absent. */
static uint64_t read_field(const char *path, const char *key, uint64_t unit)
{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[256];
    size_t kl = strlen(key);
    uint64_t v = 0;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, key, kl) || (line[kl] != ' ' && line[kl] != ':')) continue;
        v = (uint64_t)strtoull(line + kl + 1, NULL, 10) * unit;
        break;
    }
    fclose(f);
    return v;
}

static int is_dir(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* The controller's levels from the process's cgroup (rel, under base) up to base: the
 * lowest limit and the least room left under one into *out. */
static void cgroup_walk(const char *base, const char *rel, int v2, qd_mem_limits *out)
{
    if (!is_dir(base)) return;
    char dir[PATH_MAX];
    if (snprintf(dir, sizeof dir, "%s%s", base, rel) >= (int)sizeof dir || !is_dir(dir))
        snprintf(dir, sizeof dir, "%s", base);   /* a container that sees its cgroup as the root */
    size_t base_len = strlen(base);
    for (;;) {
        size_t len = strlen(dir);
        while (len > base_len && dir[len - 1] == '/') dir[--len] = 0;
        char path[PATH_MAX + 32];
        uint64_t limit = 0;
        snprintf(path, sizeof path, "%s/%s", dir, v2 ? "memory.max" : "memory.limit_in_bytes");
        if (read_limit(path, &limit) && limit > 0) {
            uint64_t usage = 0;
            snprintf(path, sizeof path, "%s/%s", dir, v2 ? "memory.current" : "memory.usage_in_bytes");
            if (!read_limit(path, &usage)) usage = 0;
            snprintf(path, sizeof path, "%s/memory.stat", dir);
            uint64_t inactive = read_field(path, v2 ? "inactive_file" : "total_inactive_file", 1);
            uint64_t ws = usage > inactive ? usage - inactive : 0;
            uint64_t room = limit > ws ? limit - ws : 0;
            out->cgroup_limit_bytes = out->cgroup_limit_bytes ? u64min(out->cgroup_limit_bytes, limit) : limit;
            out->avail_bytes = out->avail_bytes ? u64min(out->avail_bytes, room) : room;
        }
        if (len <= base_len) break;
        char *slash = strrchr(dir + base_len, '/');
        if (!slash) break;
        *slash = 0;
    }
}

void qd_mem_limits_read(const char *root, qd_mem_limits *out)
{
    memset(out, 0, sizeof *out);
    if (!root || !strcmp(root, "/")) root = "";
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    out->phys_bytes = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 0;
    char path[PATH_MAX], base[PATH_MAX];
    snprintf(path, sizeof path, "%s/proc/meminfo", root);
    out->avail_bytes = read_field(path, "MemAvailable", 1024);

    /* Both hierarchies where their files exist: a hybrid system has the memory controller in
     * v1 and an empty unified tree. */
    snprintf(path, sizeof path, "%s/proc/self/cgroup", root);
    FILE *f = fopen(path, "r");
    char line[PATH_MAX];
    while (f && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2) continue;
        *c1 = 0;
        *c2 = 0;
        const char *ctrls = c1 + 1, *rel = c2 + 1;
        if (!strcmp(line, "0") && !*ctrls) {
            snprintf(base, sizeof base, "%s/sys/fs/cgroup", root);
            cgroup_walk(base, rel, 1, out);
            continue;
        }
        for (const char *p = ctrls; *p;) {   /* "memory" in a comma-separated list */
            size_t n = strcspn(p, ",");
            if (n == 6 && !strncmp(p, "memory", 6)) {
                snprintf(base, sizeof base, "%s/sys/fs/cgroup/memory", root);
                cgroup_walk(base, rel, 0, out);
                break;
            }
            p += n + (p[n] == ',');
        }
    }
    if (f) fclose(f);
    if (out->cgroup_limit_bytes)
        out->phys_bytes = out->phys_bytes ? u64min(out->phys_bytes, out->cgroup_limit_bytes) : out->cgroup_limit_bytes;
}
