/* How much memory this process may use: the machine's, or its memory cgroup's when that is
 * lower (a container's limit, a systemd unit's MemoryMax, a Kubernetes pod's limit).
 *
 * The pre-flight memory check (quant/pipeline/pipeline.c) compares a job's estimate with
 * avail_bytes, and the estimate's choices that depend on the machine (estimate.c: whether a
 * block keeps its MLP activation) and the CPU backend's block cache (cpu_mem.c) read
 * phys_bytes. Without the cgroup, a job that fits the host but not the container passes the
 * check and is then killed by the kernel's OOM killer.
 *
 * cgroup v2: /proc/self/cgroup's "0::PATH" line; memory.max, memory.current and memory.stat's
 * inactive_file at PATH under /sys/fs/cgroup and every ancestor (each level's limit applies).
 * cgroup v1: the "memory" controller's line; memory.limit_in_bytes, memory.usage_in_bytes
 * and memory.stat's total_inactive_file under /sys/fs/cgroup/memory. Where PATH does not
 * exist (a container that sees its own cgroup as the root), the root's files are read. A
 * level's room is its limit less its usage, less the inactive file pages the kernel would
 * reclaim first (the working set, as the kubelet counts it). "max" and v1's near-2^63 values
 * mean no limit. */
#ifndef QUANT_CORE_MEMINFO_H
#define QUANT_CORE_MEMINFO_H

#include <stdint.h>

typedef struct qd_mem_limits {
    uint64_t phys_bytes;         /* physical memory, or the cgroup limit when lower; 0: unknown */
    uint64_t avail_bytes;        /* /proc/meminfo's MemAvailable, or the room under the cgroup
                                  * limit when lower; 0: unknown */
    uint64_t cgroup_limit_bytes; /* the lowest memory cgroup limit over the levels; 0: none */
} qd_mem_limits;

/* Reads the limits with every path under root: "/" (or NULL) for the real files, a
 * directory holding proc/ and sys/ for a test. phys_bytes starts from sysconf. */
void qd_mem_limits_read(const char *root, qd_mem_limits *out);

#endif
