/* libFuzzer entry point for the daemon config file (built with -DQUANTD_FUZZ=ON and clang).
 * Run: build/tests/fuzz/fuzz_daemon_config -max_total_time=60 /tmp/dconf-corpus tests/fuzz/corpus/daemon_config */
#include <stdlib.h>

#include "fuzz/daemon_config_fuzz_one.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* A broken invariant is a bug to report: abort so libFuzzer saves the input. */
    if (daemon_config_fuzz_one(data, size, NULL) != 0) abort();
    return 0;
}
