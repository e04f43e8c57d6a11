/* libFuzzer entry point for the tokenizer.json loader (built with -DQUANTD_FUZZ=ON and clang).
 * Run: build/tests/fuzz/fuzz_tokenizer -max_total_time=60 /tmp/tok-corpus tests/fuzz/corpus/tokenizer */
#include <stdlib.h>

#include "fuzz/tokenizer_fuzz_one.h"
#include "quant/core/log.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    qd_log_set_level(QD_LOG_ERROR);   /* mutants with NFC normalisers each log a warning */
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* A broken invariant is a bug to report: abort so libFuzzer saves the input. */
    if (tokenizer_fuzz_one(data, size, NULL) != 0) abort();
    return 0;
}
