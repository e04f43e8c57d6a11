/* qd_mem_limits_read (quant/core/meminfo.h) on fake /proc and /sys trees: MemAvailable alone;
 * a cgroup v2 path whose parent holds the limit (the room is the limit less the usage less
 * the inactive file pages); a v1 memory controller listed with another; a container that
 * sees its own cgroup as the root (the path in /proc/self/cgroup is not there); v1's
 * "no limit" value and v2's "max"; and the real files, which must give a sane answer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "quant/core/meminfo.h"
#include "test_util.h"

#define GiB ((uint64_t)1 << 30)

static char root[4096];

static void put(const char *rel, const char *text)
{
    char path[8192];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    for (char *p = path + strlen(root) + 1; (p = strchr(p, '/')); p++) {   /* mkdir -p */
        *p = 0;
        mkdir(path, 0755);
        *p = '/';
    }
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

static void fresh(const char *name)
{
    snprintf(root, sizeof root, "%s", test_fresh_dir(name));
    put("proc/meminfo", "MemTotal:       32000000 kB\nMemFree:         1000000 kB\nMemAvailable:   20000000 kB\n");
}

static uint64_t sys_phys(void)
{
    return (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
}

static void test_no_cgroup(void)
{
    fresh("none");
    qd_mem_limits m;
    qd_mem_limits_read(root, &m);
    CHECK((long long)m.avail_bytes == 20000000LL * 1024);
    CHECK_INT((long long)m.cgroup_limit_bytes, 0);
    CHECK(m.phys_bytes == sys_phys());
}

static void test_v2_parent_limit(void)
{
    fresh("v2");
    put("proc/self/cgroup", "0::/pod/ctr\n");
    put("sys/fs/cgroup/pod/memory.max", "1073741824\n");
    put("sys/fs/cgroup/pod/memory.current", "600000000\n");
    put("sys/fs/cgroup/pod/memory.stat", "anon 400000000\nfile 200000000\ninactive_file 150000000\n");
    put("sys/fs/cgroup/pod/ctr/memory.max", "max\n");
    put("sys/fs/cgroup/pod/ctr/memory.current", "500000000\n");
    qd_mem_limits m;
    qd_mem_limits_read(root, &m);
    CHECK((long long)m.cgroup_limit_bytes == (long long)GiB);
    CHECK((long long)m.avail_bytes == (long long)(GiB - (600000000 - 150000000)));
    CHECK((long long)m.phys_bytes == (long long)GiB);
    /* A tighter leaf wins, and MemAvailable when it is lower than every cgroup's room. */
    put("sys/fs/cgroup/pod/ctr/memory.max", "536870912\n");
    qd_mem_limits_read(root, &m);
    CHECK((long long)m.cgroup_limit_bytes == 536870912LL);
    CHECK((long long)m.avail_bytes == 536870912LL - 500000000LL);
    put("proc/meminfo", "MemAvailable:       1000 kB\n");
    qd_mem_limits_read(root, &m);
    CHECK((long long)m.avail_bytes == 1000LL * 1024);
}

static void test_v1_listed_controller(void)
{
    fresh("v1");
    put("proc/self/cgroup", "5:devices:/job\n4:cpu,memory:/job\n0::/\n");
    put("sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");   /* the host: none */
    put("sys/fs/cgroup/memory/job/memory.limit_in_bytes", "2147483648\n");
    put("sys/fs/cgroup/memory/job/memory.usage_in_bytes", "1000000000\n");
    put("sys/fs/cgroup/memory/job/memory.stat", "cache 300000000\ninactive_file 1\ntotal_inactive_file 200000000\n");
    qd_mem_limits m;
    qd_mem_limits_read(root, &m);
    CHECK((long long)m.cgroup_limit_bytes == 2147483648LL);
    CHECK((long long)m.avail_bytes == 2147483648LL - 800000000LL);
}

/* The path names the cgroup as the host sees it; inside, that cgroup is the root. */
static void test_namespace_root(void)
{
    fresh("ns");
    put("proc/self/cgroup", "4:memory:/process_api/4ae5\n");
    put("sys/fs/cgroup/memory/memory.limit_in_bytes", "4294967296\n");
    put("sys/fs/cgroup/memory/memory.usage_in_bytes", "294967296\n");
    qd_mem_limits m;
    qd_mem_limits_read(root, &m);
    CHECK((long long)m.cgroup_limit_bytes == 4294967296LL);
    CHECK((long long)m.avail_bytes == 4000000000LL);
    /* Unlimited at the root: none. */
    put("sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
    qd_mem_limits_read(root, &m);
    CHECK_INT((long long)m.cgroup_limit_bytes, 0);
    CHECK((long long)m.avail_bytes == 20000000LL * 1024);
    fresh("ns2");
    put("proc/self/cgroup", "0::/\n");
    put("sys/fs/cgroup/memory.max", "max\n");
    qd_mem_limits_read(root, &m);
    CHECK_INT((long long)m.cgroup_limit_bytes, 0);
}

static void test_real(void)
{
    qd_mem_limits m;
    qd_mem_limits_read(NULL, &m);
    CHECK(m.phys_bytes > 0 && m.phys_bytes <= sys_phys());
    CHECK(m.avail_bytes > 0);
    fprintf(stderr, "this machine: phys %.2f GB, available %.2f GB, cgroup limit %.2f GB\n", m.phys_bytes / 1e9,
            m.avail_bytes / 1e9, m.cgroup_limit_bytes / 1e9);
}

int main(void)
{
    test_tmpdir();
    TEST_RUN(test_no_cgroup);
    TEST_RUN(test_v2_parent_limit);
    TEST_RUN(test_v1_listed_controller);
    TEST_RUN(test_namespace_root);
    TEST_RUN(test_real);
    return test_finish();
}
