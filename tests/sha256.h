/* A small SHA-256 (FIPS 180-4) for tests that compare against published digests, e.g. the
 * sha256 of a token stream written as int32 little-endian. */
#ifndef QUANTD_TEST_SHA256_H
#define QUANTD_TEST_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct test_sha256 { uint32_t h[8]; uint64_t bytes; uint8_t buf[64]; size_t fill; } test_sha256;

void test_sha256_init(test_sha256 *s);
void test_sha256_update(test_sha256 *s, const void *data, size_t n);
/* Writes the 64 lowercase hex digits and a NUL into hex[65]. */
void test_sha256_final_hex(test_sha256 *s, char hex[65]);
/* One call: digest of data as hex. */
void test_sha256_hex(const void *data, size_t n, char hex[65]);
/* Digest of ids written as int32 little-endian (the goldens' convention). */
void test_sha256_ids_hex(const int32_t *ids, size_t n, char hex[65]);

#endif
