/* splitmix64 (Steele, Lea and Flood; Vigna's public-domain constants): the fixed generator
 * behind every seeded choice the code makes (calibration sampling and token ids, test
 * models and layers, self-test data, tp-sim inputs), so the same seed gives the same
 * numbers on every machine and in every release. Changing it changes outputs: the golden
 * tests would fail. */
#ifndef QUANT_CORE_RNG_H
#define QUANT_CORE_RNG_H

#include <stdint.h>

/* Advances *state by the golden-ratio increment and returns the mixed 64-bit value. */
uint64_t qd_splitmix64(uint64_t *state);
/* The state after n calls of qd_splitmix64 from state. The state only ever grows by a fixed
 * increment, so any point of the sequence is reached without drawing the values before it
 * (testgen makes each tensor from its own point, in whatever order the file wants them). */
uint64_t qd_splitmix64_skip(uint64_t state, uint64_t n);

#endif
