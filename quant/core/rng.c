/* splitmix64 (see rng.h). */
#include "quant/core/rng.h"

#define SPLITMIX64_GAMMA 0x9E3779B97F4A7C15ull

uint64_t qd_splitmix64(uint64_t *state)
{
    uint64_t z = (*state += SPLITMIX64_GAMMA);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t qd_splitmix64_skip(uint64_t state, uint64_t n)
{
    return state + n * SPLITMIX64_GAMMA;   /* mod 2^64, as the additions themselves wrap */
}
