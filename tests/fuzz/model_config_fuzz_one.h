/* Harness for the model config.json parser (quant/model/config.h), shared by the libFuzzer
 * target fuzz_model_config and the bounded ctest run test_model_config_fuzz. */
#ifndef QUANTD_TESTS_MODEL_CONFIG_FUZZ_ONE_H
#define QUANTD_TESTS_MODEL_CONFIG_FUZZ_ONE_H

#include <stddef.h>
#include <stdint.h>

/* Parses data as config.json and checks the outcome. Returns 0, or -1 when an invariant is
 * broken (the reason is printed); *accepted (may be NULL) is 1 when the config was taken. */
int model_config_fuzz_one(const uint8_t *data, size_t size, int *accepted);

#endif
