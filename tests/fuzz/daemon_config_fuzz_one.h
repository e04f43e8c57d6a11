/* Harness for the daemon's config file (daemon/config.h, `name = value` lines), shared by
 * the libFuzzer target fuzz_daemon_config and the bounded ctest run test_daemon_config_fuzz. */
#ifndef QUANTD_TESTS_DAEMON_CONFIG_FUZZ_ONE_H
#define QUANTD_TESTS_DAEMON_CONFIG_FUZZ_ONE_H

#include <stddef.h>
#include <stdint.h>

/* Loads data as the config file and checks the outcome. Returns 0, or -1 when an invariant
 * is broken (the reason is printed); *accepted (may be NULL) is 1 when the file was taken. */
int daemon_config_fuzz_one(const uint8_t *data, size_t size, int *accepted);

#endif
