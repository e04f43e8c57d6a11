/* The tests' HTTP/1.0 client (http_client.h). */
#define _GNU_SOURCE
#include "http_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

int hc_connect(int port, int secs)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct timeval tv = {secs, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa)) { close(fd); return -1; }
    return fd;
}

int hc_raw(int port, int secs, const char *req, size_t len, hc_resp *out)
{
    memset(out, 0, sizeof *out);
    int fd = hc_connect(port, secs);
    if (fd < 0) return -1;
    if (write(fd, req, len) != (ssize_t)len) { close(fd); return -1; }
    const size_t cap = 200000;   /* more than head and body hold: a longer answer is cut */
    char *buf = malloc(cap);
    if (!buf) { close(fd); return -1; }
    size_t n = 0;
    ssize_t k;
    while (n < cap - 1 && (k = read(fd, buf + n, cap - 1 - n)) > 0) n += (size_t)k;
    buf[n] = 0;
    close(fd);
    char *sep = strstr(buf, "\r\n\r\n");
    if (!sep) { free(buf); return -1; }
    *sep = 0;
    snprintf(out->head, sizeof out->head, "%.4000s", buf);
    snprintf(out->body, sizeof out->body, "%.65000s", sep + 4);
    sscanf(buf, "HTTP/%*s %d", &out->status);
    free(buf);
    return 0;
}

int hc_request(int port, int secs, const char *method, const char *path, const char *headers, const char *body,
               hc_resp *out)
{
    char *req = NULL;
    int n = asprintf(&req, "%s %s HTTP/1.0\r\nHost: 127.0.0.1\r\n%sContent-Length: %zu\r\n\r\n%s", method, path,
                     headers ? headers : "", body ? strlen(body) : 0, body ? body : "");
    if (n < 0) return -1;
    int rc = hc_raw(port, secs, req, (size_t)n, out);
    free(req);
    return rc;
}
