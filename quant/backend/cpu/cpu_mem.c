/* Large host blocks kept for reuse (see cpu_mem.h). */
#include "quant/backend/cpu/cpu_mem.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "quant/core/meminfo.h"

void cpu_mem_init(cpu_mem *m, size_t cap_bytes)
{
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->lock, NULL);
    m->cap_bytes = cap_bytes;
}

void cpu_mem_trim(cpu_mem *m)
{
    pthread_mutex_lock(&m->lock);
    for (int i = 0; i < m->n_idle; i++) free(m->idle[i].p);
    m->n_idle = 0;
    m->idle_bytes = 0;
    pthread_mutex_unlock(&m->lock);
}

void cpu_mem_destroy(cpu_mem *m)
{
    cpu_mem_trim(m);
    pthread_mutex_destroy(&m->lock);
}

size_t cpu_mem_default_cap(int64_t mb)
{
    if (mb >= 0 && (uint64_t)mb <= ((size_t)-1 >> 20)) return (size_t)mb << 20;
    qd_mem_limits ml;
    qd_mem_limits_read(NULL, &ml);
    uint64_t cap = ml.phys_bytes / 8, max = (uint64_t)4 << 30;
    return (size_t)(cap < max ? cap : max);
}

static void *mem_raw_alloc(size_t bytes)
{
    void *p = NULL;
    return posix_memalign(&p, 64, bytes ? bytes : 64) == 0 ? p : NULL;
}

/* Records p as live; a full table leaves it untracked (it is then freed, not cached). An
 * entry with the same address is stale (its block went back to the C allocator, which
 * handed the address out again) and is replaced. */
static void mem_track(cpu_mem *m, void *p, size_t bytes)
{
    for (int i = 0; i < CPU_MEM_SLOTS; i++)
        if (m->live[i].p == p) {
            m->live[i].bytes = bytes;
            return;
        }
    for (int i = 0; i < CPU_MEM_SLOTS; i++)
        if (!m->live[i].p) {
            m->live[i] = (cpu_mem_block){p, bytes};
            return;
        }
}

void *cpu_mem_alloc(cpu_mem *m, size_t bytes) { return cpu_mem_alloc_ex(m, bytes, NULL); }

void *cpu_mem_alloc_ex(cpu_mem *m, size_t bytes, int *fresh)
{
    if (fresh) *fresh = 1;
    if (bytes < CPU_MEM_MIN_BYTES) return mem_raw_alloc(bytes);
    pthread_mutex_lock(&m->lock);
    int best = -1;
    for (int i = 0; i < m->n_idle; i++) {
        size_t b = m->idle[i].bytes;
        if (b >= bytes && b - bytes <= bytes / 8 && (best < 0 || b < m->idle[best].bytes)) best = i;
    }
    void *p = NULL;
    size_t got = bytes;
    if (best >= 0) {
        p = m->idle[best].p;
        got = m->idle[best].bytes;
        m->idle_bytes -= got;
        memmove(&m->idle[best], &m->idle[best + 1], (size_t)(m->n_idle - best - 1) * sizeof m->idle[0]);
        m->n_idle--;
        m->hits++;
        if (fresh) *fresh = 0;
    } else {
        m->misses++;
    }
    pthread_mutex_unlock(&m->lock);
    if (!p) p = mem_raw_alloc(bytes);
    if (p) {
        pthread_mutex_lock(&m->lock);
        mem_track(m, p, got);
        pthread_mutex_unlock(&m->lock);
    }
    return p;
}

void cpu_mem_free(cpu_mem *m, void *p)
{
    if (!p) return;
    pthread_mutex_lock(&m->lock);
    size_t bytes = 0;
    for (int i = 0; i < CPU_MEM_SLOTS; i++)
        if (m->live[i].p == p) {
            bytes = m->live[i].bytes;
            m->live[i] = (cpu_mem_block){NULL, 0};
            break;
        }
    void *drop[CPU_MEM_SLOTS + 1];
    int n_drop = 0;
    if (bytes == 0 || bytes > m->cap_bytes) {
        drop[n_drop++] = p;                      /* small, untracked, or larger than the cap */
    } else {
        /* Oldest idle blocks make room (and a slot) for the newest. */
        while (m->n_idle > 0 && (m->idle_bytes + bytes > m->cap_bytes || m->n_idle == CPU_MEM_SLOTS)) {
            drop[n_drop++] = m->idle[0].p;
            m->idle_bytes -= m->idle[0].bytes;
            memmove(&m->idle[0], &m->idle[1], (size_t)(m->n_idle - 1) * sizeof m->idle[0]);
            m->n_idle--;
        }
        m->idle[m->n_idle++] = (cpu_mem_block){p, bytes};
        m->idle_bytes += bytes;
    }
    pthread_mutex_unlock(&m->lock);
    for (int i = 0; i < n_drop; i++) free(drop[i]);
}
