/* Fuzzes the worker wire protocol on every test run, without libFuzzer: 100000 streams
 * through the libFuzzer target's harness (tests/fuzz/wire_fuzz_one.c), which decodes each
 * stream fed whole and cut into chunks, requires the same outcome, and round-trips every
 * decoded message through encode/decode. The streams are built here, structure-aware: one to
 * four frames whose payloads are mutated messages of every type in both directions (the
 * seeds in tests/fuzz/corpus/wire), mostly with a correct header and sometimes with a bad
 * magic, version or length, and now and then the whole stream mutated or truncated.
 * QUANTD_FUZZ_ITERS overrides the count. */
#include "test_util.h"

#include <stdlib.h>

#include "fuzz/fuzz_mutate.h"
#include "fuzz/wire_fuzz_one.h"
#include "proto/wire.h"
#include "quant/core/clock.h"

static const char *const TOKENS[] = {
    "\"type\":", "\"hello\"", "\"task\"", "\"progress\"", "\"block_done\"", "\"task_done\"", "\"task_failed\"",
    "\"heartbeat\"", "\"cancel\"", "\"shutdown\"", "\"parts\"", "\"part\"", "\"part_done\"", "\"parts_done\"", "\"part_stop\"", "\"factor\"",
    "\"step\":", "\"quantize\"", "\"n\":", "\"names\":", "\"index\":", "\"ok\":", "4096", "4097",
    "\"worker\":", "\"pid\":", "\"backend\":", "\"device\":",
    "\"protocol\":", "\"selftest_ok\":", "\"selftest\":", "\"job_id\":", "\"job\":", "\"block\":",
    "\"checkpoint_dir\":", "\"fence\":", "\"stage\":", "\"n_blocks\":", "\"layer\":", "\"fraction\":", "\"eta_s\":",
    "\"layer_error\":", "\"seconds\":", "\"job_finished\":", "\"output\":", "\"report\":", "\"error\":", "\"code\":",
    "\"retryable\":", "\"cancelled\":", "\"t_ms\":", "\"rss_bytes\":", "\"reason\":", "\"graceful\":", "\"all\"",
    "\"j-1\"", "\"-x\"", "\"\"", "0", "1", "-1", "-2", "0.5", "1.0000001", "2", "1e308", "-1e308", "1e999",
    "2147483647", "2147483648", "-2147483649", "9007199254740991", "9007199254740992", "-9007199254740992",
    "true", "false", "null", "{}", "[]", "{\"a\":[1,{\"b\":null}]}", "\\u0000", "\\ud800", "\xc3\xa9", "\xff",
    ",", ":", "{", "}", "[", "]", "\"",
};
#define N_TOKENS (sizeof TOKENS / sizeof TOKENS[0])

static void put_frame(uint8_t *out, size_t *len, size_t cap, const uint8_t *p, size_t n, test_rng *r)
{
    if (*len + QP_WIRE_HEADER_BYTES + n > cap) return;
    uint8_t *h = out + *len;
    qp_wire_header(h, (uint32_t)n);
    switch (test_rng_u64(r) % 24) {   /* mostly a correct header */
    case 0: h[test_rng_u64(r) % 3] ^= (uint8_t)(1u << (test_rng_u64(r) % 8)); break;   /* magic */
    case 1: h[3] = (uint8_t)test_rng_u64(r); break;                                      /* version */
    case 2: qp_wire_header(h, (uint32_t)(n + 1 + test_rng_u64(r) % 8)); break;           /* too long */
    case 3: qp_wire_header(h, n ? (uint32_t)(n - 1 - test_rng_u64(r) % n) : 0); break;  /* too short */
    case 4: qp_wire_header(h, (uint32_t)test_rng_u64(r)); break;
    default: break;
    }
    memcpy(h + QP_WIRE_HEADER_BYTES, p, n);
    *len += QP_WIRE_HEADER_BYTES + n;
}

static void test_wire_fuzz(void)
{
    fz_seeds seeds = {0}, payloads = {0};
    int n = fz_seeds_load_corpus(&seeds, "wire");
    CHECK(n >= 13);
    if (n < 1) return;
    /* Every seed passes as is; its frames' payloads become the payload seeds. */
    for (int i = 0; i < n; i++) {
        CHECK_OK(wire_fuzz_one(seeds.s[i].data, seeds.s[i].len, NULL));
        const uint8_t *p = seeds.s[i].data + 1, *end = seeds.s[i].data + seeds.s[i].len;
        while (end - p >= QP_WIRE_HEADER_BYTES && !memcmp(p, "QDW", 3)) {
            uint32_t k = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 | (uint32_t)p[7] << 24;
            if ((size_t)(end - p) < QP_WIRE_HEADER_BYTES + k) break;
            fz_seeds_add(&payloads, p + QP_WIRE_HEADER_BYTES, k);
            p += QP_WIRE_HEADER_BYTES + k;
        }
    }
    CHECK(payloads.n >= 13);

    enum { PCAP = 4096, SCAP = 4 * (PCAP + QP_WIRE_HEADER_BYTES) + 1 };
    static uint8_t pay[PCAP], stream[SCAP];
    long iters = fz_iters(100000), accepted = 0, broken = 0, by_type[QP_MSG_COUNT_] = {0};
    test_rng r;
    test_rng_seed(&r, 20250116);
    double t0 = qd_clock_now_s();
    for (long it = 0; it < iters; it++) {
        size_t len = 1;
        stream[0] = (uint8_t)test_rng_u64(&r);
        int nframes = 1 + (int)(test_rng_u64(&r) % 4);
        for (int f = 0; f < nframes; f++) {
            const fz_seed *s = &payloads.s[test_rng_u64(&r) % (uint64_t)payloads.n];
            size_t pl = s->len < PCAP ? s->len : PCAP;
            memcpy(pay, s->data, pl);
            int nmut = (int)(test_rng_u64(&r) % 4);
            for (int m = 0; m < nmut; m++) pl = fz_mutate(&r, pay, pl, PCAP, TOKENS, N_TOKENS, &payloads);
            qp_msg msg;
            if (!qp_msg_from_json(&msg, (const char *)pay, pl, NULL)) {
                by_type[msg.type]++;
                qp_msg_clear(&msg);
            }
            put_frame(stream, &len, SCAP, pay, pl, &r);
        }
        if (test_rng_u64(&r) % 8 == 0) len = fz_mutate(&r, stream, len, SCAP, TOKENS, N_TOKENS, &seeds);
        if (test_rng_u64(&r) % 16 == 0) len = 1 + (size_t)(test_rng_u64(&r) % len);
        int acc = 0;
        if (wire_fuzz_one(stream, len, &acc) != 0 && broken++ < 3) {
            fprintf(stderr, "fuzz wire: iteration %ld broke an invariant\n", it);
            fz_print_input("stream", stream, len);
        }
        accepted += acc;
    }
    double secs = qd_clock_now_s() - t0;
    printf("fuzz wire: %ld streams, %ld with a message, %ld broken, %.1f s, %.0f inputs/s\n", iters, accepted, broken,
           secs, secs > 0 ? iters / secs : 0);
    for (int t = 1; t < QP_MSG_COUNT_; t++) printf("  %-12s %ld mutated payloads accepted\n", qp_msg_type_name(t), by_type[t]);
    CHECK_INT(broken, 0);
    CHECK(accepted > iters / 10);
    /* Every message type, both directions, must have been accepted after mutation. */
    for (int t = 1; t < QP_MSG_COUNT_; t++) CHECK(by_type[t] > iters / 1000);
    fz_seeds_free(&seeds);
    fz_seeds_free(&payloads);
}

int main(void)
{
    TEST_RUN(test_wire_fuzz);
    return test_finish();
}
