/* Large host blocks of the CPU backend, kept for reuse.
 *
 * A GPTQ layer allocates a few buffers of N x K and K x K floats (hundreds of MB on 7B-class
 * layers) and frees them when it returns; the next layer asks for the same sizes. Fresh
 * pages cost a page fault each on first touch (about 0.5 ms per MB measured on a KVM guest,
 * 13% of a 4096 x 4096 GPTQ), so freed blocks of at least CPU_MEM_MIN_BYTES are kept,
 * already faulted in, up to a byte cap, and handed out again for a request of the same size
 * (a block at most 1/8 larger than the request). Smaller blocks go straight to the C
 * allocator.
 *
 * Ownership: the cache owns its idle blocks; a block handed out belongs to the caller
 * until cpu_mem_free. Thread-safe (one mutex); the backend is normally used by one thread. */
#ifndef QUANT_BACKEND_CPU_CPU_MEM_H
#define QUANT_BACKEND_CPU_CPU_MEM_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define CPU_MEM_MIN_BYTES ((size_t)1 << 20)
#define CPU_MEM_SLOTS 32

typedef struct cpu_mem_block {
    void *p;
    size_t bytes;
} cpu_mem_block;

typedef struct cpu_mem {
    pthread_mutex_t lock;
    cpu_mem_block live[CPU_MEM_SLOTS];   /* large blocks handed out (p NULL: free slot) */
    cpu_mem_block idle[CPU_MEM_SLOTS];   /* kept for reuse, oldest first */
    int n_idle;
    size_t idle_bytes, cap_bytes;
    size_t hits, misses;                 /* large requests served from / not from the cache */
} cpu_mem;

/* cap_bytes: the most idle bytes kept (0 keeps none: every block goes back at once). */
void cpu_mem_init(cpu_mem *m, size_t cap_bytes);
/* Releases every idle block; live blocks must have been freed before. */
void cpu_mem_destroy(cpu_mem *m);
/* Releases every idle block (live ones stay live); the cache keeps working afterwards. */
void cpu_mem_trim(cpu_mem *m);
/* 64-byte aligned; NULL when out of memory. */
void *cpu_mem_alloc(cpu_mem *m, size_t bytes);
/* The same; *fresh (when not NULL) says whether the block is new memory from the C
 * allocator (its pages not yet touched, for a large one) rather than a cached block. */
void *cpu_mem_alloc_ex(cpu_mem *m, size_t bytes, int *fresh);
void cpu_mem_free(cpu_mem *m, void *p);               /* accepts NULL */
/* The cap for the runtime options' cpu_cache_mb (quant/core/runtime.h): mb MB when it is
 * not negative, else 1/8 of the physical memory (or of the memory
 * cgroup's limit when lower: quant/core/meminfo.h), at most 4 GiB. */
size_t cpu_mem_default_cap(int64_t mb);

#endif
