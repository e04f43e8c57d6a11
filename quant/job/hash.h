/* SHA-256 (FIPS 180-4), small and dependency-free, for deriving job ids from the canonical
 * job JSON and for a checkpoint's fingerprints (quant/pipeline/state.c). Not constant-time;
 * not for secrets. */
#ifndef QUANT_JOB_HASH_H
#define QUANT_JOB_HASH_H

#include <stddef.h>
#include <stdint.h>

typedef struct qp_sha256 {
    uint32_t h[8];
    uint64_t total;       /* bytes absorbed so far */
    uint8_t buf[64];
    size_t used;          /* bytes pending in buf */
} qp_sha256;

void qp_sha256_init(qp_sha256 *s);
void qp_sha256_update(qp_sha256 *s, const void *data, size_t n);
void qp_sha256_final(qp_sha256 *s, uint8_t out[32]);
/* One-shot digest as 64 lowercase hex digits plus NUL into hex[65]. */
void qp_sha256_hex(const void *data, size_t n, char hex[65]);

#endif
