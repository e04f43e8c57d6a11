/* Fuzzes the safetensors parser on every test run, without libFuzzer: 20000 inputs made
 * by mutating valid seed files (the goldens in tests/data plus a few built here) with a
 * fixed-seed RNG, each run through the same harness as the libFuzzer target
 * (tests/fuzz/st_fuzz_one.c). Mutations (fz_mutate) are JSON-aware (tokens, digits, splices) and the
 * 8-byte length is usually recomputed, so most inputs get past the framing and into the
 * header validation. QUANTD_FUZZ_ITERS overrides the count for longer local runs. */
#include "test_util.h"

#include <stdlib.h>

#include "fuzz/fuzz_mutate.h"
#include "fuzz/st_fuzz_one.h"
#include "quant/core/fsutil.h"

typedef struct seed { char *hdr; size_t hlen; size_t dlen; } seed;

static const char *TOKENS[] = {
    "\"dtype\"", "\"shape\"", "\"data_offsets\"", "\"__metadata__\"", "\"format\"", "\"pt\"", "\"F32\"",
    "\"F16\"", "\"BF16\"", "\"I32\"", "\"U8\"", "\"BOOL\"", "\"F8_E4M3\"", "\"F64\"", "[0,4]", "[4,0]", "[]",
    "[0]", "{}", "-1", "0", "1e3", "0.5", "18446744073709551615", "18446744073709551616",
    "9223372036854775808", "\\u0000", "\\ud800", "\\udc00", "\\ud83d\\ude00", "\\\"", "\\n", "\xc3\xa9",
    "\xff", "\xed\xa0\x80", ",", ":", "\"", "{", "}", "[", "]", " ", "null", "true",
    "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}",
    "\"z\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}",
};
#define N_TOKENS (sizeof TOKENS / sizeof TOKENS[0])

static void add_seed(seed *s, int *n, const char *hdr, size_t hlen, size_t dlen)
{
    s[*n].hdr = malloc(hlen + 1);
    memcpy(s[*n].hdr, hdr, hlen);
    s[*n].hlen = hlen;
    s[*n].dlen = dlen;
    (*n)++;
}

static int load_golden(seed *s, int *n, const char *name)
{
    const char *src = getenv("QUANTD_SOURCE_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/data/%s", src ? src : ".", name);
    char *b;
    size_t len;
    qd_err err = {0};
    if (qd_fs_read_file(path, &b, &len, &err) != 0) { fprintf(stderr, "%s\n", err.msg); return -1; }
    uint64_t h = 0;
    for (int i = 7; i >= 0; i--) h = (h << 8) | (unsigned char)b[i];
    add_seed(s, n, b + 8, (size_t)h, len - 8 - (size_t)h);
    free(b);
    return 0;
}

static void test_fuzz_mutated_headers(void)
{
    seed seeds[16];
    int nseeds = 0;
    if (load_golden(seeds, &nseeds, "st_golden_mixed.safetensors") ||
        load_golden(seeds, &nseeds, "st_golden_values.safetensors") ||
        load_golden(seeds, &nseeds, "st_golden_values_bf16.safetensors") ||
        load_golden(seeds, &nseeds, "st_golden_empty.safetensors")) {
        CHECK(!"golden seed files missing");
        return;
    }
    static const char *extra[] = {
        "{}",
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}",
        "{\"z\":{\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[0,0]},\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4]}}",
        "{\"__metadata__\":{\"k\\u00e9\":\"v\\n\",\"format\":\"pt\"},\"x\\\"y\":{\"dtype\":\"I8\",\"shape\":[1,1,1,1,1,1,1,2],\"data_offsets\":[0,2]}}  ",
        "{\"u\":{\"data_offsets\":[1,3],\"shape\":[1],\"dtype\":\"U16\"},\"v\":{\"shape\":[1],\"dtype\":\"U8\",\"data_offsets\":[0,1]}}",
    };
    static const size_t extra_dlen[] = {0, 4, 4, 2, 3};
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++)
        add_seed(seeds, &nseeds, extra[i], strlen(extra[i]), extra_dlen[i]);

    /* The mutator is the one every bounded fuzz run shares (tests/fuzz/fuzz_mutate.c); it
     * splices from the seeds' headers. */
    fz_seeds hseeds = {0};
    for (int i = 0; i < nseeds; i++) fz_seeds_add(&hseeds, seeds[i].hdr, seeds[i].hlen);
    long iters = fz_iters(20000);
    test_rng r;
    test_rng_seed(&r, 20240611);
    enum { CAP = 8192 };
    static char hdr[CAP];
    static uint8_t img[CAP + 8 + 4096];
    long accepted = 0, refused = 0, broken = 0;

    /* Every seed must be accepted as is, or the mutations start from broken files. */
    for (int s = 0; s < nseeds; s++) {
        size_t n = seeds[s].hlen;
        for (int i = 0; i < 8; i++) img[i] = (uint8_t)((uint64_t)n >> (8 * i));
        memcpy(img + 8, seeds[s].hdr, n);
        memset(img + 8 + n, 0x3c, seeds[s].dlen);
        int acc = 0;
        CHECK_OK(st_fuzz_one(img, 8 + n + seeds[s].dlen, &acc));
        CHECK_INT(acc, 1);
    }

    for (long it = 0; it < iters; it++) {
        const seed *s = &seeds[test_rng_u64(&r) % nseeds];
        size_t len = s->hlen < CAP ? s->hlen : CAP;
        memcpy(hdr, s->hdr, len);
        int nmut = 1 + (int)(test_rng_u64(&r) % 4);
        for (int m = 0; m < nmut; m++) len = fz_mutate(&r, (uint8_t *)hdr, len, CAP, TOKENS, N_TOKENS, &hseeds);
        size_t dlen = s->dlen;
        uint64_t hl = len;
        switch (test_rng_u64(&r) % 16) {   /* mostly keep the framing consistent */
        case 0: hl = len + 1 + test_rng_u64(&r) % 16; break;
        case 1: hl = len ? len - 1 : 0; break;
        case 2: hl = test_rng_u64(&r); break;
        case 3: dlen = (size_t)(test_rng_u64(&r) % 64); break;
        default: break;
        }
        if (dlen > 4096) dlen = 4096;
        for (int i = 0; i < 8; i++) img[i] = (uint8_t)(hl >> (8 * i));
        memcpy(img + 8, hdr, len);
        for (size_t i = 0; i < dlen; i++) img[8 + len + i] = (uint8_t)test_rng_u64(&r);
        size_t total = 8 + len + dlen;
        if (test_rng_u64(&r) % 32 == 0) total = (size_t)(test_rng_u64(&r) % (total + 1));   /* truncated file */
        int acc = 0;
        if (st_fuzz_one(img, total, &acc) != 0) {
            if (broken++ < 3) fprintf(stderr, "iteration %ld broke an invariant: %.*s\n", it, (int)len, hdr);
        }
        if (acc) accepted++;
        else refused++;
    }
    CHECK_INT(broken, 0);
    /* The mutations must reach both outcomes, or the run tests little. */
    CHECK(accepted > iters / 100);
    CHECK(refused > iters / 4);
    printf("fuzz: %ld iterations, %ld accepted, %ld refused\n", iters, accepted, refused);
    for (int s = 0; s < nseeds; s++) free(seeds[s].hdr);
    fz_seeds_free(&hseeds);
}

int main(void)
{
    TEST_RUN(test_fuzz_mutated_headers);
    return test_finish();
}
