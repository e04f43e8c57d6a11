/* libFuzzer entry point for the worker wire protocol (built with -DQUANTD_FUZZ=ON and clang).
 * Run: build/tests/fuzz/fuzz_wire -max_total_time=60 /tmp/wire-corpus tests/fuzz/corpus/wire */
#include <stdlib.h>

#include "fuzz/wire_fuzz_one.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* A broken invariant is a bug to report: abort so libFuzzer saves the input. */
    if (wire_fuzz_one(data, size, NULL) != 0) abort();
    return 0;
}
