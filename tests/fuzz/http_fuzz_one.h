/* Harness for the status API's request handling (daemon/http_*.c), shared by the libFuzzer
 * target fuzz_http and the bounded ctest run test_http_fuzz. The input is the raw bytes a
 * client sends on one connection (request line, headers, maybe a body, maybe several
 * pipelined requests); they reach the real server (libmicrohttpd's parser, then the layer's
 * on_request and routes) through MHD_add_connection on a socketpair. */
#ifndef QUANTD_TESTS_HTTP_FUZZ_ONE_H
#define QUANTD_TESTS_HTTP_FUZZ_ONE_H

#include <stddef.h>
#include <stdint.h>

/* The bearer token the harness's server is configured with. */
#define HTTP_FUZZ_TOKEN "fuzz-t0ken"

/* Sends data on a fresh connection and checks what came of it. Returns 0, or -1 when an
 * invariant is broken (the reason is printed); *accepted (may be NULL) is 1 when a request
 * reached a route's handler. The server is started on the first call and kept. */
int http_fuzz_one(const uint8_t *data, size_t size, int *accepted);

/* Stops the server and closes its loop: 0 when every handle closed (uv_loop_close), else
 * -1. Later calls of http_fuzz_one start a new server. */
int http_fuzz_teardown(void);

#endif
