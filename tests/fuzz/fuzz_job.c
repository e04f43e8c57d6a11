/* libFuzzer entry point for the job spec parser (built with -DQUANTD_FUZZ=ON and clang).
 * Run: build/tests/fuzz/fuzz_job -max_total_time=60 /tmp/job-corpus tests/fuzz/corpus/job */
#include <stdlib.h>

#include "fuzz/job_fuzz_one.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* A broken invariant is a bug to report: abort so libFuzzer saves the input. */
    if (job_fuzz_one(data, size, NULL) != 0) abort();
    return 0;
}
