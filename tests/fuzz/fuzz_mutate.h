/* The bounded, seeded mutation driver the ctest fuzz runs share (tests/unit/test_*_fuzz.c):
 * a seed set, a byte/token mutator in the manner of test_st_fuzz's, and a loop that runs a
 * harness (tests/fuzz/<target>_fuzz_one.c, the same code the libFuzzer targets link) on
 * mutated seeds and reports inputs per second. Only the ctest binaries link this file: the
 * libFuzzer targets have libFuzzer's own mutator. */
#ifndef QUANTD_TESTS_FUZZ_MUTATE_H
#define QUANTD_TESTS_FUZZ_MUTATE_H

#include <stddef.h>
#include <stdint.h>

#include "test_util.h"

typedef struct fz_seed { uint8_t *data; size_t len; } fz_seed;

typedef struct fz_seeds {
    fz_seed *s;       /* owned */
    int n, cap;
} fz_seeds;

/* Copies len bytes in as a new seed. */
void fz_seeds_add(fz_seeds *ss, const void *data, size_t len);
void fz_seeds_add_str(fz_seeds *ss, const char *s);
/* Adds every regular file of tests/fuzz/corpus/<target> (under QUANTD_SOURCE_DIR); returns
 * how many were added. */
int fz_seeds_load_corpus(fz_seeds *ss, const char *target);
/* Adds one file when it exists (e.g. from ../shared/data); returns 1 when added. */
int fz_seeds_add_file(fz_seeds *ss, const char *path);
void fz_seeds_free(fz_seeds *ss);

/* Applies one random mutation to buf (len bytes, capacity cap) and returns the new length.
 * tokens are inserted or swapped in whole (field names, numbers at the edges of ranges), so
 * most mutants stay well-formed enough to reach validation. */
size_t fz_mutate(test_rng *r, uint8_t *buf, size_t len, size_t cap, const char *const *tokens,
                 size_t n_tokens, const fz_seeds *seeds);

/* One input through a harness: 0, or -1 when an invariant broke; *accepted is 1 when the
 * parser took the input. */
typedef int (*fz_one_fn)(const uint8_t *data, size_t size, int *accepted);

typedef struct fz_stats { long iters, accepted, refused, broken; double seconds, per_second; } fz_stats;

/* Runs iters inputs (QUANTD_FUZZ_ITERS overrides), each a seed with 1..max_mut mutations,
 * through fn; prints "fuzz <name>: ... inputs/s" and the first few broken inputs (escaped). */
fz_stats fz_run(const char *name, const fz_seeds *seeds, fz_one_fn fn, long iters, uint64_t rng_seed,
                const char *const *tokens, size_t n_tokens, size_t cap, int max_mut);
/* The iteration count: QUANTD_FUZZ_ITERS when set, else dflt. */
long fz_iters(long dflt);
/* Prints an input, escaped, on stderr (for reports of broken invariants). */
void fz_print_input(const char *what, const uint8_t *data, size_t len);

#endif
