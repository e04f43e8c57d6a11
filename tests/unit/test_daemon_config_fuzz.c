/* Fuzzes the daemon's config file parser on every test run, without libFuzzer: 100000 files
 * made by mutating the seeds in tests/fuzz/corpus/daemon_config (the packaged quantd.conf,
 * every option at the edges of its range, CRLF and comment forms) with a fixed-seed RNG,
 * through the libFuzzer target's harness (tests/fuzz/daemon_config_fuzz_one.c). The mutator
 * knows the option names and values such as Redis URLs, worker specs and integers at the
 * edges. QUANTD_FUZZ_ITERS overrides the count. */
#include "test_util.h"

#include "fuzz/daemon_config_fuzz_one.h"
#include "fuzz/fuzz_mutate.h"

static const char *const TOKENS[] = {
    "redis", "node", "workers", "allow-root", "allow_root", "http", "queue", "key-prefix", "key_prefix",
    "max-jobs", "retention", "log-level", "max-job-bytes", "max-retries", "heartbeat", "memory-limit-mb",
    "worker-path", "node-ttl-ms", "lease-ttl-ms", "stop-timeout", "http-token", "http-cors", "config", "redsi",
    " = ", "=", "\n", "\r\n", "#", " ", "\t", "redis://", "rediss://", "redis://u:p@h:1/0", "redis://:pw@[::1]:6379",
    "@", ":", "/", "cpu:", "cuda:", "cuda:all", "cpu:0", "cpu:257", "0,1,2", ",", "0", "1", "-1", "2",
    "65535", "65536", "99999999999999999999", "9223372036854775807", "-9223372036854775808", "1e3", "0x10",
    "debug", "info", "warn", "error", "off", "/tmp", "/", "/nonexistent/x", "..", "127.0.0.1:8080", ":0",
    "qjobs", "qjob", "*", "\xc3\xa9", "\xff",
};
#define N_TOKENS (sizeof TOKENS / sizeof TOKENS[0])

static void test_daemon_config_fuzz(void)
{
    fz_seeds seeds = {0};
    int n = fz_seeds_load_corpus(&seeds, "daemon_config");
    CHECK(n >= 4);
    if (n < 1) return;
    for (int i = 0; i < n; i++) {
        int acc = 0;
        CHECK_OK(daemon_config_fuzz_one(seeds.s[i].data, seeds.s[i].len, &acc));
        CHECK_INT(acc, 1);   /* every seed is a file the daemon takes */
    }
    fz_stats st = fz_run("daemon_config", &seeds, daemon_config_fuzz_one, 100000, 20250118, TOKENS, N_TOKENS, 4096, 3);
    CHECK_INT(st.broken, 0);
    CHECK(st.accepted > st.iters / 20);
    CHECK(st.refused > st.iters / 10);
    fz_seeds_free(&seeds);
}

int main(void)
{
    TEST_RUN(test_daemon_config_fuzz);
    return test_finish();
}
