/* quantctl's client side of the daemon, shared by the job commands (submit, status, watch,
 * cancel, list): the connection flags (--redis URL, or --http URL with --token), a Redis
 * connection, and a minimal HTTP/1.0 client for the daemon's own API (cli/client.c).
 * Errors are printed here, as "quantctl: ..." lines, so a command only chooses its exit
 * status. */
#ifndef QUANTD_CLI_CLIENT_H
#define QUANTD_CLI_CLIENT_H

struct redisContext;
struct qp_keys;

/* Where the job commands talk: Redis (default) or the daemon's HTTP API. Strings borrowed
 * from argv/environment. */
typedef struct qctl_conn {
    const char *redis;     /* redis://[user:pass@]HOST:PORT[/db] */
    const char *http;      /* http://HOST:PORT, or NULL to use Redis */
    const char *token;     /* bearer token for mutating HTTP calls, or NULL */
    const char *queue, *prefix;   /* NULL = defaults */
} qctl_conn;

enum { QCTL_OPT_REDIS = 1000, QCTL_OPT_HTTP, QCTL_OPT_TOKEN, QCTL_OPT_QUEUE, QCTL_OPT_PREFIX };
#define QCTL_CONN_OPTIONS {"redis", required_argument, 0, QCTL_OPT_REDIS}, \
    {"http", required_argument, 0, QCTL_OPT_HTTP}, {"token", required_argument, 0, QCTL_OPT_TOKEN}, \
    {"queue", required_argument, 0, QCTL_OPT_QUEUE}, {"key-prefix", required_argument, 0, QCTL_OPT_PREFIX}
extern const char *qctl_conn_help;    /* the usage lines for those options */

void qctl_conn_defaults(qctl_conn *c);                      /* from QUANTD_REDIS, QUANTD_HTTP, ... */
int qctl_conn_option(qctl_conn *c, int opt, const char *arg);   /* 1 when opt was a connection flag */
int qctl_keys(const qctl_conn *c, struct qp_keys *k);       /* 0, or -1 with the error printed */
/* A connected, authenticated Redis context (caller frees with redisFree), or NULL with the
 * error printed. */
struct redisContext *qctl_redis(const qctl_conn *c);
/* Connects to c->http and sends one HTTP/1.0 request; returns the socket (the caller reads
 * the answer and closes it) or -1 with the reason printed. */
int qctl_http_open(const qctl_conn *c, const char *method, const char *path, const char *body);
/* One HTTP/1.0 request to c->http. *status is the answer's status, *resp its malloc'd body
 * (caller frees). Returns 0, or -1 with the error printed when the API cannot be reached
 * or answers malformed. */
int qctl_http(const qctl_conn *c, const char *method, const char *path, const char *body, int *status,
              char **resp);
void qctl_http_error(int status, const char *resp);          /* prints the answer's "error" */

#endif
