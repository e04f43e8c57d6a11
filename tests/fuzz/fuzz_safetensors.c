/* libFuzzer entry point for the safetensors reader (built with -DQUANTD_FUZZ=ON and clang).
 * Run: build/tests/fuzz/fuzz_safetensors -max_total_time=60 /tmp/st-corpus tests/data */
#include <stdlib.h>

#include "fuzz/st_fuzz_one.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* A broken invariant is a bug to report: abort so libFuzzer saves the input. */
    if (st_fuzz_one(data, size, NULL) != 0) abort();
    return 0;
}
