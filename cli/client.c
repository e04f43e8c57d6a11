/* quantctl's client side of the daemon (client.h): the connection flags and their
 * defaults from the environment, a Redis connection (AUTH, SELECT), and a minimal HTTP/1.0
 * client for the daemon's own API, which closes the connection after each answer. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <hiredis/hiredis.h>

#include "cli/client.h"
#include "proto/keys.h"

void qctl_conn_defaults(qctl_conn *c)
{
    memset(c, 0, sizeof *c);
    const char *e = getenv("QUANTD_REDIS");
    c->redis = e && *e ? e : "redis://127.0.0.1:6379";
    c->http = getenv("QUANTD_HTTP");
    if (c->http && !*c->http) c->http = NULL;
    c->token = getenv("QUANTD_HTTP_TOKEN");
    c->queue = getenv("QUANTD_QUEUE");
    c->prefix = getenv("QUANTD_KEY_PREFIX");
}

int qctl_conn_option(qctl_conn *c, int opt, const char *arg)
{
    switch (opt) {
    case QCTL_OPT_REDIS: c->redis = arg; c->http = NULL; return 1;
    case QCTL_OPT_HTTP: c->http = arg; return 1;
    case QCTL_OPT_TOKEN: c->token = arg; return 1;
    case QCTL_OPT_QUEUE: c->queue = arg; return 1;
    case QCTL_OPT_PREFIX: c->prefix = arg; return 1;
    default: return 0;
    }
}

const char *qctl_conn_help =
    "  --redis URL       Redis holding the queue (redis://[user:pass@]HOST:PORT[/db]; $QUANTD_REDIS)\n"
    "  --http URL        use the daemon's HTTP API instead (http://HOST:PORT; $QUANTD_HTTP)\n"
    "  --token T         bearer token for submit/cancel over HTTP ($QUANTD_HTTP_TOKEN)\n"
    "  --queue NAME      queue name (default qjobs); --key-prefix P  job key prefix (default qjob)\n";

int qctl_keys(const qctl_conn *c, qp_keys *k)
{
    qp_err pe = {0};
    if (qp_keys_init(k, c->queue, c->prefix, &pe)) {
        fprintf(stderr, "quantctl: %s\n", pe.msg);
        return -1;
    }
    return 0;
}

redisContext *qctl_redis(const qctl_conn *c)
{
    const char *u = c->redis;
    if (strncmp(u, "redis://", 8)) {
        fprintf(stderr, "quantctl: --redis '%s' does not start with redis://\n", u);
        return NULL;
    }
    char buf[512], *user = NULL, *pass = NULL, *host, *port, *db;
    snprintf(buf, sizeof buf, "%s", u + 8);
    char *at = strrchr(buf, '@');
    host = buf;
    if (at) {
        *at = 0;
        host = at + 1;
        char *colon = strchr(buf, ':');
        if (colon) { *colon = 0; user = *buf ? buf : NULL; pass = colon + 1; }
        else pass = buf;
    }
    if ((db = strchr(host, '/'))) *db++ = 0;
    port = strrchr(host, ':');
    if (!port) { fprintf(stderr, "quantctl: --redis '%s': expected HOST:PORT\n", u); return NULL; }
    *port++ = 0;
    struct timeval tv = {5, 0};
    redisContext *r = redisConnectWithTimeout(host, atoi(port), tv);
    if (!r || r->err) {
        fprintf(stderr, "quantctl: cannot reach Redis at %s:%s: %s\n", host, port, r ? r->errstr : "out of memory");
        redisFree(r);
        return NULL;
    }
    redisReply *rep = NULL;
    if (pass) rep = user ? redisCommand(r, "AUTH %s %s", user, pass) : redisCommand(r, "AUTH %s", pass);
    if (pass && (!rep || rep->type == REDIS_REPLY_ERROR)) {
        fprintf(stderr, "quantctl: Redis AUTH failed: %s\n", rep ? rep->str : r->errstr);
        freeReplyObject(rep);
        redisFree(r);
        return NULL;
    }
    freeReplyObject(rep);
    if (db && atoi(db)) freeReplyObject(redisCommand(r, "SELECT %d", atoi(db)));
    return r;
}

int qctl_http_open(const qctl_conn *c, const char *method, const char *path, const char *body)
{
    const char *u = c->http;
    if (!strncmp(u, "http://", 7)) u += 7;
    char host[256], port[16] = "80";
    snprintf(host, sizeof host, "%s", u);
    char *slash = strchr(host, '/');
    if (slash) *slash = 0;
    char *colon = strrchr(host, ':');
    if (colon) { *colon = 0; snprintf(port, sizeof port, "%s", colon + 1); }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    if (getaddrinfo(host, port, &hints, &ai)) {
        fprintf(stderr, "quantctl: cannot resolve %s\n", host);
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype, 0);
        if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen)) { close(fd); fd = -1; }
    }
    freeaddrinfo(ai);
    if (fd < 0) {
        fprintf(stderr, "quantctl: cannot reach the HTTP API at %s:%s: %s\n", host, port, strerror(errno));
        return -1;
    }
    char *req = NULL;
    size_t blen = body ? strlen(body) : 0;
    int n = asprintf(&req, "%s %s HTTP/1.0\r\nHost: %s\r\n%s%s%sContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n%s", method, path, host, c->token ? "Authorization: Bearer " : "",
                     c->token ? c->token : "", c->token ? "\r\n" : "", blen, body ? body : "");
    if (n < 0 || write(fd, req, (size_t)n) != n) { free(req); close(fd); return -1; }
    free(req);
    return fd;
}

int qctl_http(const qctl_conn *c, const char *method, const char *path, const char *body, int *status,
              char **resp)
{
    *status = 0;
    *resp = NULL;
    int fd = qctl_http_open(c, method, path, body);
    if (fd < 0) return -1;
    /* HTTP/1.0: the server closes after the body, so read to EOF. */
    size_t len = 0, cap = 65536;
    char *buf = malloc(cap);
    ssize_t k;
    while (buf && (k = read(fd, buf + len, cap - len - 1)) > 0) {
        len += (size_t)k;
        if (cap - len < 2) { char *nb = realloc(buf, cap *= 2); if (!nb) { free(buf); buf = NULL; } else buf = nb; }
    }
    close(fd);
    if (!buf) return -1;
    buf[len] = 0;
    char *sep = strstr(buf, "\r\n\r\n");
    if (!sep || sscanf(buf, "HTTP/%*s %d", status) != 1) {
        fprintf(stderr, "quantctl: malformed answer from %s\n", c->http);
        free(buf);
        return -1;
    }
    *resp = strdup(sep + 4);
    free(buf);
    return *resp ? 0 : -1;
}

/* Prints the "error" of an API answer, or the answer itself. */
void qctl_http_error(int status, const char *resp)
{
    cJSON *o = cJSON_Parse(resp ? resp : "");
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(o, "error");
    fprintf(stderr, "quantctl: HTTP %d: %s\n", status, cJSON_IsString(e) ? e->valuestring : (resp ? resp : ""));
    cJSON_Delete(o);
}
