/* quantctl: one command per file (cmd_<name>.c), dispatched by main.c's table.
 * A command returns the process exit status: 0 success, 1 the work failed, 2 bad usage or
 * bad input (the one-line error on stderr names the problem). Each gets the runtime
 * options main() read from the environment (quant/core/runtime.h), to pass to every
 * backend it opens. */
#ifndef QUANTD_CLI_QUANTCTL_H
#define QUANTD_CLI_QUANTCTL_H

#include "quant/core/runtime.h"

enum { QCTL_OK = 0, QCTL_FAIL = 1, QCTL_USAGE = 2 };

typedef struct qctl_command {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv, const qd_runtime_opts *rt);   /* argv[0] is the command name */
} qctl_command;

int cmd_layer(int argc, char **argv, const qd_runtime_opts *rt);
int cmd_gen_layer(int argc, char **argv, const qd_runtime_opts *rt);
int cmd_tokenize(int argc, char **argv, const qd_runtime_opts *rt);
int cmd_eval(int argc, char **argv, const qd_runtime_opts *rt);
int cmd_quantize(int argc, char **argv, const qd_runtime_opts *rt);
int cmd_estimate(int argc, char **argv, const qd_runtime_opts *rt);
int cmd_gen_model(int argc, char **argv, const qd_runtime_opts *rt);
int cmd_logits(int argc, char **argv, const qd_runtime_opts *rt);
int cmd_dequant(int argc, char **argv, const qd_runtime_opts *rt);
int cmd_check_serving(int argc, char **argv, const qd_runtime_opts *rt);
int cmd_tp_sim(int argc, char **argv, const qd_runtime_opts *rt);
int cmd_selftest(int argc, char **argv, const qd_runtime_opts *rt);

/* ---- the job commands (submit, status, watch, cancel, list); helpers in cmd_status.c ---- */
struct redisContext;
struct qp_keys;
struct qp_status;

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
/* One HTTP/1.0 request to c->http. *resp is the malloc'd body (caller frees). Returns 0, or
 * -1 with the error printed when the API cannot be reached. */
/* Connects to c->http and sends one HTTP/1.0 request; returns the socket (the caller reads
 * the answer and closes it) or -1 with the reason printed. */
int qctl_http_open(const qctl_conn *c, const char *method, const char *path, const char *body);
int qctl_http(const qctl_conn *c, const char *method, const char *path, const char *body, int *status,
              char **resp);
void qctl_http_error(int status, const char *resp);          /* prints the answer's "error" */
void qctl_print_status(const struct qp_status *st);         /* "key:  value" lines */
struct qp_job;
/* Reads and validates the job file at path (qp_job_parse); NULL, with the reason printed as
 * "quantctl CMD: ...", when it cannot. The job is the caller's (qp_job_free). */
struct qp_job *qctl_read_job(const char *cmd, const char *path);

int cmd_submit(int argc, char **argv, const qd_runtime_opts *rt);
int cmd_status(int argc, char **argv, const qd_runtime_opts *rt);
int cmd_watch(int argc, char **argv, const qd_runtime_opts *rt);
int cmd_cancel(int argc, char **argv, const qd_runtime_opts *rt);
int cmd_list(int argc, char **argv, const qd_runtime_opts *rt);

#endif
