/* libFuzzer entry point for the status API's request handling (built with -DQUANTD_FUZZ=ON
 * and clang). Each input is the bytes of one client connection.
 * Run: build/tests/fuzz/fuzz_http -max_total_time=60 /tmp/http-corpus tests/fuzz/corpus/http */
#include <stdlib.h>

#include "fuzz/http_fuzz_one.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* A broken invariant is a bug to report: abort so libFuzzer saves the input. */
    if (http_fuzz_one(data, size, NULL) != 0) abort();
    return 0;
}
