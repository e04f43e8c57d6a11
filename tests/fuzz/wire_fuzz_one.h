/* Harness for the worker wire protocol (proto/wire.h), shared by the libFuzzer target
 * fuzz_wire and the bounded ctest run test_wire_fuzz. */
#ifndef QUANTD_TESTS_WIRE_FUZZ_ONE_H
#define QUANTD_TESTS_WIRE_FUZZ_ONE_H

#include <stddef.h>
#include <stdint.h>

/* Input: byte 0 picks how the rest is cut into chunks; the rest is a byte stream from a peer
 * (frames of either direction). Returns 0, or -1 when an invariant is broken (the reason is
 * printed). *accepted (may be NULL) is set to 1 when at least one message decoded. */
int wire_fuzz_one(const uint8_t *data, size_t size, int *accepted);

#endif
