/* libFuzzer entry point for a job's model directory (built with -DQUANTD_FUZZ=ON and clang):
 * each input is a container of files (tests/fuzz/model_dir_fuzz_one.h) written to a
 * temporary directory and read as a job reads it.
 * Run: build/tests/fuzz/fuzz_model_dir -max_total_time=60 /tmp/model-dir-corpus tests/fuzz/corpus/model_dir
 * (the seeds there were written by test_model_dir_fuzz with QUANTD_FUZZ_SEED_DIR set). */
#include <stdlib.h>

#include "fuzz/model_dir_fuzz_one.h"
#include "quant/core/log.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    qd_log_set_level(QD_LOG_ERROR);   /* mutated tokenizers with NFC normalisers each log a warning */
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* A broken invariant is a bug to report: abort so libFuzzer saves the input. */
    if (model_dir_fuzz_one(data, size, NULL) != 0) abort();
    return 0;
}
