/* Fuzzes the status API's request handling on every test run, without libFuzzer: 100000
 * connections' worth of bytes made by mutating the seeds in tests/fuzz/corpus/http (every
 * endpoint and method, the token right and wrong, CORS, queries, escapes, pipelining,
 * HTTP/1.0, Expect: 100-continue) with a fixed-seed RNG, each sent to the real server
 * (libmicrohttpd + daemon/http_*.c, no Redis) through the libFuzzer target's harness
 * (tests/fuzz/http_fuzz_one.c). The mutator knows methods, paths, header names, the token
 * and HTTP's separators. QUANTD_FUZZ_ITERS overrides the count. */
#include "test_util.h"

#include "fuzz/fuzz_mutate.h"
#include "fuzz/http_fuzz_one.h"

static const char *const TOKENS[] = {
    "GET ", "HEAD ", "POST ", "DELETE ", "OPTIONS ", "PUT ", "PATCH ", " HTTP/1.1", " HTTP/1.0", " HTTP/2.0",
    "\r\n", "\r\n\r\n", "\n", ": ", ":", " ", "\t", "/", "//", "?", "&", "=", "#", "%", "%00", "%2f", "%ff", "..",
    "/healthz", "/readyz", "/metrics", "/v1/workers", "/v1/events", "/v1/jobs", "/v1/jobs/", "/v1/jobs/job-1",
    "/events", "/", "/index.html", "/app.js", "?state=running", "state=", "limit=", "limit=0", "limit=10001",
    "Authorization: ", "Bearer ", "bearer ", HTTP_FUZZ_TOKEN, "Basic Zm9vOmJhcg==", "Origin: ",
    "https://dash.example", "http://other.example", "null", "Content-Length: ", "Content-Length: 0",
    "Content-Length: 99999999999999999999", "-1", "2049", "Transfer-Encoding: chunked", "0\r\n\r\n",
    "Expect: 100-continue", "Connection: close", "Connection: keep-alive", "Last-Event-ID: ", "1700000000000-0",
    "Host: localhost", "{\"model\":\"/m\",\"output\":\"/o\",\"method\":\"rtn\"}", "\xc3\xa9", "\xff", "\x80",
    "\"", "\\", "\x7f", "\x01",
};
#define N_TOKENS (sizeof TOKENS / sizeof TOKENS[0])

static void test_http_fuzz(void)
{
    fz_seeds seeds = {0};
    int n = fz_seeds_load_corpus(&seeds, "http");
    CHECK(n >= 10);
    if (n < 1) return;
    int routed = 0;
    for (int i = 0; i < n; i++) {
        int acc = 0;
        CHECK_OK(http_fuzz_one(seeds.s[i].data, seeds.s[i].len, &acc));
        routed += acc;
    }
    CHECK(routed >= n / 2);   /* most seeds reach a handler (not the refused token or the bad path ones) */
    fz_stats st = fz_run("http", &seeds, http_fuzz_one, 100000, 20251124, TOKENS, N_TOKENS, 4096, 3);
    CHECK_INT(st.broken, 0);
    CHECK(st.accepted > st.iters / 20);
    CHECK(st.refused > st.iters / 20);
    CHECK_OK(http_fuzz_teardown());
    fz_seeds_free(&seeds);
}

int main(void)
{
    TEST_RUN(test_http_fuzz);
    return test_finish();
}
