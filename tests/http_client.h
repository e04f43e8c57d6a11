/* A plain-socket HTTP/1.0 client for the tests of the daemon's HTTP API: one request a
 * connection, the answer read until the server closes. Nothing here measures time: the read
 * guard (`secs`) only keeps a hung server from hanging the test. */
#ifndef QUANTD_TESTS_HTTP_CLIENT_H
#define QUANTD_TESTS_HTTP_CLIENT_H

#include <stddef.h>

typedef struct hc_resp {
    int status;                  /* 0 when the status line did not parse */
    char head[4096];             /* the status line and headers (cut) */
    char body[65536];            /* the body (cut) */
} hc_resp;

/* A socket connected to 127.0.0.1:port whose reads give up after secs; -1 when refused. */
int hc_connect(int port, int secs);
/* Sends the raw request bytes and reads the answer. -1 when no answer came (refused, closed
 * without one, or the guard ran out); out is zeroed first. */
int hc_raw(int port, int secs, const char *req, size_t len, hc_resp *out);
/* method path with Host, the extra headers (each ending "\r\n", or NULL), Content-Length and
 * body (NULL: empty). */
int hc_request(int port, int secs, const char *method, const char *path, const char *headers, const char *body,
               hc_resp *out);

#endif
