/* Harness for tokenizer.json loading and use (quant/model/tokenizer/tokenizer.h), shared by the
 * libFuzzer target fuzz_tokenizer and the bounded ctest run test_tokenizer_fuzz. */
#ifndef QUANTD_TESTS_TOKENIZER_FUZZ_ONE_H
#define QUANTD_TESTS_TOKENIZER_FUZZ_ONE_H

#include <stddef.h>
#include <stdint.h>

/* Loads data as a tokenizer.json; an accepted tokenizer encodes a few texts (fixed ones and
 * the input's last bytes) and decodes the ids. Returns 0, or -1 when an invariant is broken
 * (the reason is printed); *accepted (may be NULL) is 1 when the file loaded. */
int tokenizer_fuzz_one(const uint8_t *data, size_t size, int *accepted);

#endif
