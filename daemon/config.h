/* The daemon's configuration: one table of options drives the config file, the environment,
 * the command line, validation and the start-up dump.
 *
 * Every option is one row of the table in config.c (name, type, field offset, default,
 * validator, help). Sources apply in increasing precedence: built-in defaults, then the
 * config file (`name = value` lines, `#` comments, names with `-` or `_`), then the
 * environment (QUANTD_<NAME>, dashes as underscores, upper case), then command-line flags
 * (`--name value` or `--name=value`). A list option (allow-root) given by a source replaces
 * what lower sources gave; within one source repeated values append (QUANTD_ALLOW_ROOT takes
 * a colon-separated list).
 *
 * Jobs may only read and write under the allow-listed roots: qdd_path_allowed resolves the
 * path with realpath (the deepest existing ancestor for a path not created yet), so `..` and
 * symbolic links cannot lead out of a root. */
#ifndef QUANTD_DAEMON_CONFIG_H
#define QUANTD_DAEMON_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "quant/core/error.h"

#define QDD_MAX_WORKERS 256
#define QDD_CUDA_ALL (-1)   /* qdd_workers.n_devices for "cuda:all": resolved at spawn time */

typedef enum qdd_worker_kind { QDD_WORKERS_CPU = 0, QDD_WORKERS_CUDA } qdd_worker_kind;

/* The parsed --workers value: "cpu:N", "cuda:all" or "cuda:0,1"; a device may carry "*N",
 * N worker processes on it ("cuda:0*2", "cuda:all*2": each a context of its own, so one GPU's
 * idle time between one worker's kernels goes to another's parts). */
typedef struct qdd_workers {
    qdd_worker_kind kind;
    int n_cpu;                          /* CPU workers (kind CPU) */
    int n_devices;                      /* CUDA devices listed, or QDD_CUDA_ALL */
    int devices[QDD_MAX_WORKERS];       /* CUDA ordinals (kind CUDA, n_devices > 0) */
    int per_device[QDD_MAX_WORKERS];    /* workers on devices[i]: 1 unless "*N" */
    int all_per_device;                 /* cuda:all: workers on each visible device (1 unless "*N") */
} qdd_workers;

/* The parsed --redis value: redis://[user:pass@]HOST:PORT[/db]. Strings are owned. */
typedef struct qdd_redis_url {
    char *host;
    int port;
    char *user;      /* NULL: no ACL user (AUTH with the password alone) */
    char *pass;      /* NULL: no AUTH */
    int db;
} qdd_redis_url;

/* The effective configuration. Every char * and the allow_roots array are owned by the
 * struct (qdd_config_free). The raw option strings are kept for the dump and for reload. */
typedef struct qdd_config {
    char *config_file;      /* the file read, NULL when none */
    char *redis;            /* redis URL as given */
    char *node;             /* node name (default: host name, made a valid name) */
    char *workers;          /* workers spec as given */
    char **allow_roots;     /* canonical (realpath) roots; outputs are allowed only below these */
    size_t n_allow_roots;
    char *http;             /* ADDR:PORT for the HTTP API, "" for none */
    char *queue;            /* queue name, also the prefix of cluster-wide keys */
    char *key_prefix;       /* prefix of per-job keys */
    int64_t max_jobs;       /* jobs running at once; 0 = one per worker */
    int64_t retention_s;    /* finished jobs' keys expire after this */
    char *log_level;        /* debug, info, warn, error */
    int64_t max_job_bytes;  /* payloads over this are refused */
    int64_t cancel_grace_s;  /* a worker still busy this long after a cancel is killed */
    int64_t max_json_bytes, max_tokenizer_bytes, max_text_bytes;   /* the size limits of the
                               files a job names (quant/core/confine.h), for the daemon's
                               admission and passed to every worker */
    int64_t max_retries;    /* task retries after a worker dies before the job fails */
    int64_t heartbeat_s;    /* worker heartbeat interval; silent for 3 intervals = dead */
    int64_t memory_limit_mb;/* admission limit on the summed memory estimates; 0 = none */
    char *worker_path;      /* the quantd-worker executable; "" = next to quantd */
    int64_t node_ttl_ms;    /* node heartbeat key TTL; a node silent this long is reclaimed */
    int64_t lease_ttl_ms;   /* job lease TTL; renewed every third of it */
    int64_t stop_timeout_s; /* SIGTERM: how long running blocks may take to finish */
    int64_t remote_parts;   /* 1: idle workers take parts of other nodes' fan-outs (parts_nodes.c) */
    char *http_token;       /* bearer token for the HTTP API's mutating endpoints; "" = they are off */
    char *http_cors;        /* comma-separated origins allowed by CORS ("*" = any); "" = none */
    int64_t http_max_conns; /* HTTP connections served at once; past it 503 (restart to change) */
    int64_t http_max_conns_per_ip; /* the same per client address; 0 = no per-client limit */
    int64_t http_timeout_s; /* an HTTP connection idle this long is closed (restart to change) */
    int64_t http_max_streams; /* Server-Sent Events streams open at once; past it 503 */

    /* Derived by qdd_config_load from the strings above. */
    qdd_redis_url redis_url;
    qdd_workers worker_spec;
} qdd_config;

/* Builds the configuration from defaults, the config file (--config FILE, else
 * QUANTD_CONFIG, else none), the environment `envp` (NULL-terminated "NAME=value" array;
 * NULL = no environment) and argv (argv[0] is skipped). On success *out is new and owned by
 * the caller (qdd_config_free). On failure err names the source and option:
 * "--max-jobs: must be an integer in [0, 100000], got 'x'" or
 * "/etc/quantd.conf:7: unknown option 'redsi' (did you mean 'redis'?)". `--help` is not
 * handled here (see qdd_config_usage). */
int qdd_config_load(int argc, char *const argv[], char *const envp[], qdd_config **out,
                    qd_err *err);
void qdd_config_free(qdd_config *c);   /* accepts NULL */

/* One line `key=value ...` of the effective configuration (the password masked), written
 * into buf (always NUL-terminated). Returns the length it needed. */
size_t qdd_config_dump(const qdd_config *c, char *buf, size_t cap);
/* Reload: each option of the table is either applied by SIGHUP or needs a restart (redis,
 * node, workers, http, queue, key-prefix, heartbeat, worker-path). For every restart-only
 * option whose value differs between the running configuration and the one just loaded,
 * note(ud, name, running value, new value) is called (values as the dump shows them, secrets
 * masked) and `next` gets the running value back (with what is derived from it), so `next`
 * can replace `running` as a whole. Returns how many options were kept, or a negative code
 * (next is then unusable). */
typedef void qdd_config_note_fn(void *ud, const char *option, const char *running, const char *wanted);
int qdd_config_keep_restart_options(const qdd_config *running, qdd_config *next, qdd_config_note_fn *note,
                                    void *ud);

/* The one size check of a job payload as it sits on the queue: the daemon's admission
 * applies it to each payload it pops, the HTTP API to the canonical form it is about to push
 * (which is what a daemon will pop), so the API never accepts a job that admission would
 * then refuse for its size. Returns 0 when len bytes fit max_job_bytes, else -1 with why
 * (always NUL-terminated) saying so. */
int qdd_job_size_check(size_t len, int64_t max_job_bytes, char *why, size_t cap);

/* Writes the usage text, one line per option of the table, to buf. Returns the length needed. */
size_t qdd_config_usage(char *buf, size_t cap);

/* Parsers behind the validators, usable alone. */
int qdd_redis_url_parse(const char *s, qdd_redis_url *u, qd_err *err);   /* u owned: _clear */
void qdd_redis_url_clear(qdd_redis_url *u);
int qdd_workers_parse(const char *s, qdd_workers *w, qd_err *err);

/* Returns 1 when path (absolute; need not exist yet) lies inside one of the roots (given
 * canonical, as in qdd_config) after resolving symbolic links and `..`, else 0 with err
 * saying why. For a path that does not exist, the deepest existing ancestor is resolved and
 * the rest must be plain names (no `.` or `..`). */
int qdd_path_allowed(const char *path, char *const roots[], size_t n_roots, qd_err *err);

#endif
