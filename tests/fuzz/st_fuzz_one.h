/* The safetensors fuzz harness, shared by the libFuzzer target (fuzz_safetensors.c) and
 * the bounded in-ctest run (tests/unit/test_st_fuzz.c). */
#ifndef QUANTD_TESTS_ST_FUZZ_ONE_H
#define QUANTD_TESTS_ST_FUZZ_ONE_H

#include <stddef.h>
#include <stdint.h>

/* Feeds data to the safetensors parser twice: as a whole file image (st_file_open_memory)
 * and as a bare header (st_header_parse). Returns 0 when every outcome was sound (accepted
 * with all invariants holding, or refused with a message naming the source), -1 when an
 * invariant broke (details on stderr). *accepted (may be NULL) is set to 1 when the file
 * image was accepted. */
int st_fuzz_one(const uint8_t *data, size_t size, int *accepted);

#endif
