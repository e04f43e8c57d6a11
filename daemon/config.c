/* The daemon's option table and the code it drives: defaults, config file, environment and
 * flags (in that order of increasing precedence), validation, the one-line dump and the
 * usage text. Adding an option is one row in `options` and one field in qdd_config. */
#define _GNU_SOURCE
#include "daemon/config.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "proto/keys.h"
#include "quant/core/fsutil.h"
#include "quant/core/log.h"
#include "quant/job/job.h"

typedef enum opt_type { OPT_STR = 0, OPT_INT, OPT_LIST } opt_type;

typedef struct qdd_option {
    const char *name;        /* flag and file key; env is QUANTD_ + upper(name with _) */
    opt_type type;
    size_t off;              /* field in qdd_config */
    const char *def;         /* default as text; NULL = computed (node) */
    int64_t min, max;        /* OPT_INT range */
    int (*validate)(const char *v, qd_err *err);   /* raw value check, NULL = none */
    const char *meta;        /* value placeholder in the usage */
    const char *help;
    int reload;              /* RELOAD_APPLY: SIGHUP applies it; RELOAD_RESTART: needs a restart */
} qdd_option;

/* What SIGHUP does with an option. Every row says one or the other, so a new option cannot
 * be forgotten by the reload path (qdd_config_keep_restart_options). */
enum { RELOAD_APPLY = 1, RELOAD_RESTART = 2 };

static int check_redis(const char *v, qd_err *err)
{
    qdd_redis_url u = {0};
    int rc = qdd_redis_url_parse(v, &u, err);
    qdd_redis_url_clear(&u);
    return rc;
}

static int check_workers(const char *v, qd_err *err)
{
    qdd_workers w;
    return qdd_workers_parse(v, &w, err);
}

static int check_node(const char *v, qd_err *err)
{
    if (!qp_name_valid(v))
        return qd_err_set(err, QD_EINVAL, "'%s' is not a valid node name (1-64 of A-Z a-z 0-9 . _ -)", v);
    return 0;
}

static int check_prefix(const char *v, qd_err *err)
{
    qp_keys k;
    qp_err pe = {0};
    if (qp_keys_init(&k, v, "x-unused-job-prefix", &pe))
        return qd_err_set(err, QD_EINVAL, "%s", pe.msg);
    return 0;
}

static int check_log_level(const char *v, qd_err *err)
{
    if (qd_log_level_parse(v) < 0)
        return qd_err_set(err, QD_EINVAL, "'%s' is not one of debug, info, warn, error, off", v);
    return 0;
}

static int check_http(const char *v, qd_err *err)
{
    if (!*v) return 0;
    const char *colon = strrchr(v, ':');
    char *end = NULL;
    long port = colon ? strtol(colon + 1, &end, 10) : -1;
    if (!colon || colon == v || !end || *end || end == colon + 1 || port < 0 || port > 65535)
        return qd_err_set(err, QD_EINVAL, "'%s' is not ADDR:PORT (e.g. 127.0.0.1:8080)", v);
    return 0;
}

static int check_abs_path(const char *v, qd_err *err)
{
    if (v[0] != '/') return qd_err_set(err, QD_EINVAL, "'%s' is not an absolute path", v);
    return 0;
}

#define OFF(f) offsetof(qdd_config, f)
static const qdd_option options[] = {
    {"redis", OPT_STR, OFF(redis), "redis://127.0.0.1:6379", 0, 0, check_redis,
     "redis://[user:pass@]HOST:PORT[/db]", "Redis server (AUTH with user and password when given)", RELOAD_RESTART},
    {"node", OPT_STR, OFF(node), NULL, 0, 0, check_node, "NAME",
     "this node's name in Redis keys (default: the host name)", RELOAD_RESTART},
    {"workers", OPT_STR, OFF(workers), "cpu:1", 0, 0, check_workers, "cpu:N|cuda:all|cuda:0,1",
     "worker processes to run (cuda:0*2, cuda:all*2: two on each of those devices)", RELOAD_RESTART},
    {"allow-root", OPT_LIST, OFF(allow_roots), "", 0, 0, check_abs_path, "DIR",
     "a directory jobs may read and write under (repeatable); none = every job is refused. The daemon and its "
     "workers open every file a job names beneath these", RELOAD_RESTART},
    {"cancel-grace", OPT_INT, OFF(cancel_grace_s), "10", 1, 86400, NULL, "S",
     "seconds a cancelled task gets to stop before its worker is killed (one blocked in I/O cannot see it)",
     RELOAD_APPLY},
    {"max-json-bytes", OPT_INT, OFF(max_json_bytes), "67108864", 1024, INT64_C(1) << 40, NULL, "N",
     "largest config, index or other JSON file a job may name", RELOAD_RESTART},
    {"max-tokenizer-bytes", OPT_INT, OFF(max_tokenizer_bytes), "268435456", 1024, INT64_C(1) << 40, NULL, "N",
     "largest tokenizer file (tokenizer.json, tokenizer.model, vocab, merges) a job may name", RELOAD_RESTART},
    {"max-text-bytes", OPT_INT, OFF(max_text_bytes), "1073741824", 1024, INT64_C(1) << 40, NULL, "N",
     "largest calibration or eval text or token file a job may name", RELOAD_RESTART},
    {"http", OPT_STR, OFF(http), "", 0, 0, check_http, "ADDR:PORT", "HTTP API address (empty: off)", RELOAD_RESTART},
    {"queue", OPT_STR, OFF(queue), QP_KEYS_DEFAULT_QUEUE, 0, 0, check_prefix, "NAME",
     "queue list, also the prefix of cluster-wide keys", RELOAD_RESTART},
    {"key-prefix", OPT_STR, OFF(key_prefix), QP_KEYS_DEFAULT_JOB, 0, 0, check_prefix, "P",
     "prefix of per-job keys", RELOAD_RESTART},
    {"max-jobs", OPT_INT, OFF(max_jobs), "0", 0, 100000, NULL, "N",
     "jobs running at once (0: one per worker)", RELOAD_APPLY},
    {"remote-parts", OPT_INT, OFF(remote_parts), "0", 0, 1, NULL, "0|1",
     "1: idle workers take parts of other nodes' jobs whose checkpoint lies under an allow-root (a shared "
     "filesystem; docs/parallel.md)", RELOAD_APPLY},
    {"retention", OPT_INT, OFF(retention_s), "604800", 1, INT64_C(315360000), NULL, "S",
     "seconds finished jobs' keys are kept", RELOAD_APPLY},
    {"log-level", OPT_STR, OFF(log_level), "info", 0, 0, check_log_level, "L",
     "debug, info, warn, error or off", RELOAD_APPLY},
    {"max-job-bytes", OPT_INT, OFF(max_job_bytes), "65536", 2, QP_JOB_MAX_BYTES, NULL, "N",
     "largest job payload accepted", RELOAD_APPLY},
    {"max-retries", OPT_INT, OFF(max_retries), "3", 0, 100, NULL, "N",
     "task retries after a worker dies, before the job fails", RELOAD_APPLY},
    {"heartbeat", OPT_INT, OFF(heartbeat_s), "2", 1, 3600, NULL, "S",
     "worker heartbeat interval (silent for 3 intervals: restarted)", RELOAD_RESTART},
    {"memory-limit-mb", OPT_INT, OFF(memory_limit_mb), "0", 0, INT64_C(1) << 40, NULL, "MB",
     "admit jobs while their summed memory estimates stay below this (0: no limit)", RELOAD_APPLY},
    {"worker-path", OPT_STR, OFF(worker_path), "", 0, 0, NULL, "FILE",
     "quantd-worker executable (empty: next to quantd)", RELOAD_RESTART},
    {"node-ttl-ms", OPT_INT, OFF(node_ttl_ms), "15000", 300, 3600000, NULL, "MS",
     "node heartbeat TTL: a node silent this long has its jobs reclaimed by the others", RELOAD_APPLY},
    {"lease-ttl-ms", OPT_INT, OFF(lease_ttl_ms), "30000", 300, 3600000, NULL, "MS",
     "job lease TTL (renewed every third of it)", RELOAD_APPLY},
    {"stop-timeout", OPT_INT, OFF(stop_timeout_s), "30", 0, 86400, NULL, "S",
     "on SIGTERM, seconds running blocks get to finish before their workers are killed", RELOAD_APPLY},
    {"http-token", OPT_STR, OFF(http_token), "", 0, 0, NULL, "TOKEN",
     "bearer token for POST/DELETE on the HTTP API (empty: those endpoints are off)", RELOAD_APPLY},
    {"http-cors", OPT_STR, OFF(http_cors), "", 0, 0, NULL, "ORIGIN,...",
     "origins allowed to read the HTTP API from a browser (* = any; empty: none)", RELOAD_APPLY},
    {"http-max-connections", OPT_INT, OFF(http_max_conns), "256", 1, 100000, NULL, "N",
     "HTTP connections served at once; a request on one past it gets 503", RELOAD_RESTART},
    {"http-max-connections-per-ip", OPT_INT, OFF(http_max_conns_per_ip), "32", 0, 100000, NULL, "N",
     "HTTP connections served at once per client address; past it 503 (0: no per-client limit)", RELOAD_RESTART},
    {"http-timeout", OPT_INT, OFF(http_timeout_s), "30", 1, 86400, NULL, "S",
     "an HTTP connection that sends or receives nothing this long is closed (an idle event stream is not)",
     RELOAD_RESTART},
    {"http-max-streams", OPT_INT, OFF(http_max_streams), "64", 1, 100000, NULL, "N",
     "Server-Sent Events streams open at once; past it 503", RELOAD_APPLY},
};
#undef OFF
#define N_OPTIONS (sizeof options / sizeof options[0])
/* An OPT_LIST field is a char ** immediately followed by its size_t count. */
_Static_assert(offsetof(qdd_config, n_allow_roots) == offsetof(qdd_config, allow_roots) + sizeof(char **),
               "allow_roots must be followed by n_allow_roots");

enum { SRC_DEFAULT = 0, SRC_FILE, SRC_ENV, SRC_FLAG };

typedef struct loader {
    qdd_config *c;
    int list_src[N_OPTIONS];   /* the source a list option's current values came from */
} loader;

/* Option names match with '-' and '_' treated alike, so files may use either. */
static int name_eq(const char *a, const char *b, size_t blen)
{
    size_t i = 0;
    for (; i < blen && a[i]; i++) {
        char x = a[i] == '_' ? '-' : a[i], y = b[i] == '_' ? '-' : b[i];
        if (x != y) return 0;
    }
    return i == blen && !a[i];
}

static const qdd_option *option_find(const char *name, size_t len)
{
    for (size_t i = 0; i < N_OPTIONS; i++)
        if (name_eq(options[i].name, name, len)) return &options[i];
    return NULL;
}

static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b), prev[64], cur[64];
    if (la > 63 || lb > 63) return 99;
    for (size_t j = 0; j <= lb; j++) prev[j] = j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
            size_t del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
        memcpy(prev, cur, (lb + 1) * sizeof *prev);
    }
    return prev[lb];
}

static int unknown_option(const char *where, const char *name, size_t len, qd_err *err)
{
    char buf[64];
    snprintf(buf, sizeof buf, "%.*s", (int)(len < 63 ? len : 63), name);
    const char *best = NULL;
    size_t best_d = 3;
    for (size_t i = 0; i < N_OPTIONS; i++) {
        size_t d = edit_distance(buf, options[i].name);
        if (d < best_d) { best_d = d; best = options[i].name; }
    }
    if (best)
        return qd_err_set(err, QD_EINVAL, "%s%sunknown option '%s' (did you mean '%s'?)", where, *where ? ": " : "", buf, best);
    return qd_err_set(err, QD_EINVAL, "%s%sunknown option '%s'", where, *where ? ": " : "", buf);
}

static int list_append(char ***list, size_t *n, const char *v)
{
    char **nl = realloc(*list, (*n + 1) * sizeof *nl);
    if (!nl) return QD_ENOMEM;
    *list = nl;
    if (!(nl[*n] = strdup(v))) return QD_ENOMEM;
    (*n)++;
    return 0;
}

static void list_clear(char ***list, size_t *n)
{
    for (size_t i = 0; i < *n; i++) free((*list)[i]);
    free(*list);
    *list = NULL;
    *n = 0;
}

/* Sets one option from text. `where` prefixes error messages ("--max-jobs",
 * "quantd.conf:7: redis", "QUANTD_NODE"). */
static int option_apply(loader *L, const qdd_option *o, const char *v, int src, const char *where,
                        qd_err *err)
{
    char *base = (char *)L->c;
    if (o->validate && (*v || o->type != OPT_LIST) && o->validate(v, err))
        return qd_err_prefix(err, "%s", where);
    switch (o->type) {
    case OPT_STR: {
        char **f = (char **)(base + o->off);
        char *d = strdup(v);
        if (!d) return qd_err_set(err, QD_ENOMEM, "out of memory");
        free(*f);
        *f = d;
        return 0;
    }
    case OPT_INT: {
        char *end = NULL;
        errno = 0;
        long long x = strtoll(v, &end, 10);
        if (!*v || errno || *end || x < o->min || x > o->max)
            return qd_err_set(err, QD_EINVAL, "%s: must be an integer in [%lld, %lld], got '%s'", where,
                              (long long)o->min, (long long)o->max, v);
        *(int64_t *)(base + o->off) = x;
        return 0;
    }
    case OPT_LIST: {
        char ***list = (char ***)(base + o->off);
        size_t *n = (size_t *)(base + o->off + sizeof(char **));
        size_t idx = (size_t)(o - options);
        if (L->list_src[idx] != src) {   /* a higher source replaces the lower ones' list */
            list_clear(list, n);
            L->list_src[idx] = src;
        }
        if (*v && list_append(list, n, v)) return qd_err_set(err, QD_ENOMEM, "out of memory");
        return 0;
    }
    }
    return qd_err_set(err, QD_EINVAL, "%s: bad option type", where);
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s)) s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1])) *--e = 0;
    return s;
}

static int load_file(loader *L, const char *path, qd_err *err)
{
    char *text = NULL;
    size_t len = 0;
    if (qd_fs_read_file(path, &text, &len, err)) return qd_err_prefix(err, "config file");
    int rc = 0, lineno = 0;
    /* strtok_r would skip empty lines and so miscount them: walk by hand. */
    for (char *line = text; line && !rc; ) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        lineno++;
        char *hash = strchr(line, '#');   /* values never hold '#': paths and URLs here do not */
        if (hash) *hash = 0;
        char *s = trim(line);
        if (*s) {
            char where[512];
            char *eq = strchr(s, '=');
            if (!eq) {
                rc = qd_err_set(err, QD_EINVAL, "%s:%d: expected 'name = value', got '%s'", path, lineno, s);
                break;
            }
            *eq = 0;
            char *name = trim(s), *val = trim(eq + 1);
            snprintf(where, sizeof where, "%s:%d", path, lineno);
            const qdd_option *o = option_find(name, strlen(name));
            if (!o) { rc = unknown_option(where, name, strlen(name), err); break; }
            snprintf(where, sizeof where, "%s:%d: %s", path, lineno, o->name);
            rc = option_apply(L, o, val, SRC_FILE, where, err);
        }
        line = nl ? nl + 1 : NULL;
    }
    free(text);
    return rc;
}

static void env_name(const qdd_option *o, char *buf, size_t cap)
{
    size_t j = snprintf(buf, cap, "QUANTD_");
    for (const char *p = o->name; *p && j + 1 < cap; p++)
        buf[j++] = *p == '-' ? '_' : (char)toupper((unsigned char)*p);
    buf[j] = 0;
}

static const char *env_get(char *const envp[], const char *name)
{
    size_t n = strlen(name);
    for (size_t i = 0; envp && envp[i]; i++)
        if (!strncmp(envp[i], name, n) && envp[i][n] == '=') return envp[i] + n + 1;
    return NULL;
}

static int load_env(loader *L, char *const envp[], qd_err *err)
{
    for (size_t i = 0; i < N_OPTIONS; i++) {
        char name[96], where[128];
        env_name(&options[i], name, sizeof name);
        const char *v = env_get(envp, name);
        if (!v) continue;
        snprintf(where, sizeof where, "%s", name);
        if (options[i].type != OPT_LIST) {
            int rc = option_apply(L, &options[i], v, SRC_ENV, where, err);
            if (rc) return rc;
            continue;
        }
        /* A list from the environment is colon-separated, like PATH. */
        char *copy = strdup(v), *save = NULL;
        if (!copy) return qd_err_set(err, QD_ENOMEM, "out of memory");
        int rc = option_apply(L, &options[i], "", SRC_ENV, where, err);   /* replaces lower sources */
        for (char *t = strtok_r(copy, ":", &save); t && !rc; t = strtok_r(NULL, ":", &save))
            rc = option_apply(L, &options[i], t, SRC_ENV, where, err);
        free(copy);
        if (rc) return rc;
    }
    return 0;
}

static int load_flags(loader *L, int argc, char *const argv[], qd_err *err)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) || !a[2])
            return qd_err_set(err, QD_EINVAL, "unexpected argument '%s' (options are --name VALUE)", a);
        const char *name = a + 2, *eq = strchr(name, '='), *val;
        size_t nlen = eq ? (size_t)(eq - name) : strlen(name);
        if (name_eq("config", name, nlen)) {   /* read before the other sources */
            if (!eq) i++;
            continue;
        }
        const qdd_option *o = option_find(name, nlen);
        if (!o) return unknown_option("", name, nlen, err);
        if (eq) val = eq + 1;
        else if (i + 1 < argc) val = argv[++i];
        else return qd_err_set(err, QD_EINVAL, "--%s: needs a value (%s)", o->name, o->meta);
        char where[96];
        snprintf(where, sizeof where, "--%s", o->name);
        int rc = option_apply(L, o, val, SRC_FLAG, where, err);
        if (rc) return rc;
    }
    return 0;
}

static const char *find_config_flag(int argc, char *const argv[], qd_err *err, int *rc)
{
    const char *file = NULL;
    *rc = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--config")) {
            if (i + 1 >= argc) { *rc = qd_err_set(err, QD_EINVAL, "--config: needs a value (FILE)"); return NULL; }
            file = argv[++i];
        } else if (!strncmp(argv[i], "--config=", 9)) {
            file = argv[i] + 9;
        }
    }
    return file;
}

/* The host name, with characters Redis key names may not hold replaced by '-'. */
static char *default_node(void)
{
    char host[256] = "quantd";
    if (gethostname(host, sizeof host - 1) || !host[0]) strcpy(host, "quantd");
    host[64] = 0;
    for (char *p = host; *p; p++)
        if (!isalnum((unsigned char)*p) && *p != '.' && *p != '_' && *p != '-') *p = '-';
    if (host[0] == '.' || host[0] == '-') host[0] = 'n';
    return strdup(host);
}

static int finish(qdd_config *c, qd_err *err)
{
    if (!c->node && !(c->node = default_node())) return qd_err_set(err, QD_ENOMEM, "out of memory");
    if (!strcmp(c->queue, c->key_prefix))
        return qd_err_set(err, QD_EINVAL, "queue and key-prefix must differ (both are '%s')", c->queue);
    qp_keys k;
    qp_err pe = {0};
    if (qp_keys_init(&k, c->queue, c->key_prefix, &pe))
        return qd_err_set(err, QD_EINVAL, "queue/key-prefix: %s", pe.msg);
    int rc = qdd_redis_url_parse(c->redis, &c->redis_url, err);
    if (rc) return qd_err_prefix(err, "redis");
    if ((rc = qdd_workers_parse(c->workers, &c->worker_spec, err))) return qd_err_prefix(err, "workers");
    /* Roots are stored canonical, so every later check compares resolved paths. */
    for (size_t i = 0; i < c->n_allow_roots; i++) {
        char *r = realpath(c->allow_roots[i], NULL);
        if (!r)
            return qd_err_set(err, QD_EINVAL, "allow-root: %s: %s (a root must be an existing directory)",
                              c->allow_roots[i], strerror(errno));
        struct stat st;
        if (stat(r, &st) || !S_ISDIR(st.st_mode)) {
            qd_err_set(err, QD_EINVAL, "allow-root: %s is not a directory", c->allow_roots[i]);
            free(r);
            return QD_EINVAL;
        }
        free(c->allow_roots[i]);
        c->allow_roots[i] = r;
    }
    return 0;
}

int qdd_config_load(int argc, char *const argv[], char *const envp[], qdd_config **out, qd_err *err)
{
    *out = NULL;
    loader L;
    memset(&L, 0, sizeof L);
    if (!(L.c = calloc(1, sizeof *L.c))) return qd_err_set(err, QD_ENOMEM, "out of memory");
    int rc = 0;
    for (size_t i = 0; i < N_OPTIONS && !rc; i++) {
        if (!options[i].def) continue;
        char where[96];
        snprintf(where, sizeof where, "default %s", options[i].name);
        rc = option_apply(&L, &options[i], options[i].def, SRC_DEFAULT, where, err);
    }
    const char *file = NULL;
    if (!rc) file = find_config_flag(argc, argv, err, &rc);
    if (!rc && !file) file = env_get(envp, "QUANTD_CONFIG");
    if (!rc && file && *file) {
        if (!(L.c->config_file = strdup(file))) rc = qd_err_set(err, QD_ENOMEM, "out of memory");
        if (!rc) rc = load_file(&L, file, err);
    }
    if (!rc) rc = load_env(&L, envp, err);
    if (!rc) rc = load_flags(&L, argc, argv, err);
    if (!rc) rc = finish(L.c, err);
    if (rc) {
        qdd_config_free(L.c);
        return rc;
    }
    *out = L.c;
    return 0;
}

void qdd_config_free(qdd_config *c)
{
    if (!c) return;
    for (size_t i = 0; i < N_OPTIONS; i++) {
        char *base = (char *)c;
        if (options[i].type == OPT_STR) free(*(char **)(base + options[i].off));
    }
    list_clear(&c->allow_roots, &c->n_allow_roots);
    free(c->config_file);
    qdd_redis_url_clear(&c->redis_url);
    free(c);
}

/* One option's value as the dump shows it (the Redis password and the HTTP token masked). */
static void option_text(const qdd_config *c, const qdd_option *o, char *buf, size_t cap)
{
    const char *base = (const char *)c;
    size_t n = 0;
    buf[0] = 0;
    if (o->type == OPT_INT) {
        snprintf(buf, cap, "%lld", (long long)*(const int64_t *)(base + o->off));
    } else if (o->type == OPT_LIST) {
        for (size_t j = 0; j < c->n_allow_roots && n < cap; j++) {
            int k = snprintf(buf + n, cap - n, "%s%s", j ? ":" : "", c->allow_roots[j]);
            if (k > 0) n += (size_t)k;
        }
    } else if (o->off == offsetof(qdd_config, redis)) {
        /* The password never reaches the log. */
        const qdd_redis_url *u = &c->redis_url;
        snprintf(buf, cap, "redis://%s%s%s%s:%d/%d", u->user ? u->user : "", u->pass ? ":***" : "",
                 u->user || u->pass ? "@" : "", u->host ? u->host : "?", u->port, u->db);
    } else if (o->off == offsetof(qdd_config, http_token)) {
        /* Like the password, the token never reaches the log. */
        const char *v = *(char *const *)(base + o->off);
        snprintf(buf, cap, "%s", v && *v ? "***" : "\"\"");
    } else {
        const char *v = *(char *const *)(base + o->off);
        snprintf(buf, cap, "%s", v && *v ? v : "\"\"");
    }
}

size_t qdd_config_dump(const qdd_config *c, char *buf, size_t cap)
{
    size_t n = 0;
    char v[4096];
#define PUT(...) do { int _k = snprintf(buf + (n < cap ? n : cap), n < cap ? cap - n : 0, __VA_ARGS__); \
    if (_k > 0) n += (size_t)_k; } while (0)
    if (cap) buf[0] = 0;
    PUT("config=%s", c->config_file ? c->config_file : "(none)");
    for (size_t i = 0; i < N_OPTIONS; i++) {
        option_text(c, &options[i], v, sizeof v);
        PUT(" %s=%s", options[i].name, v);
    }
#undef PUT
    return n;
}

static int option_differs(const qdd_config *a, const qdd_config *b, const qdd_option *o)
{
    const char *pa = (const char *)a + o->off, *pb = (const char *)b + o->off;
    if (o->type == OPT_INT) return *(const int64_t *)pa != *(const int64_t *)pb;
    if (o->type == OPT_STR) {
        const char *x = *(char *const *)pa, *y = *(char *const *)pb;
        return strcmp(x ? x : "", y ? y : "") != 0;
    }
    char *const *la = *(char *const *const *)pa, *const *lb = *(char *const *const *)pb;
    size_t na = *(const size_t *)(pa + sizeof(char **)), nb = *(const size_t *)(pb + sizeof(char **));
    if (na != nb) return 1;
    for (size_t i = 0; i < na; i++)
        if (strcmp(la[i], lb[i])) return 1;
    return 0;
}

int qdd_config_keep_restart_options(const qdd_config *running, qdd_config *next, qdd_config_note_fn *note, void *ud)
{
    int kept = 0;
    char was[4096], wanted[4096];
    for (size_t i = 0; i < N_OPTIONS; i++) {
        const qdd_option *o = &options[i];
        if (o->reload == RELOAD_APPLY || !option_differs(running, next, o)) continue;
        option_text(running, o, was, sizeof was);
        option_text(next, o, wanted, sizeof wanted);
        if (o->type == OPT_INT) {
            *(int64_t *)((char *)next + o->off) = *(const int64_t *)((const char *)running + o->off);
        } else if (o->type == OPT_STR) {
            char **f = (char **)((char *)next + o->off);
            char *v = strdup(*(char *const *)((const char *)running + o->off));
            if (!v) return QD_ENOMEM;
            free(*f);
            *f = v;
        } else {
            return QD_EINVAL;   /* no list option needs a restart; keeping one would need a deep copy */
        }
        /* What is derived from the kept value goes back too. */
        if (o->off == offsetof(qdd_config, redis)) {
            qd_err err = {0};
            qdd_redis_url_clear(&next->redis_url);
            if (qdd_redis_url_parse(next->redis, &next->redis_url, &err)) return QD_ENOMEM;
        } else if (o->off == offsetof(qdd_config, workers)) {
            next->worker_spec = running->worker_spec;
        }
        if (note) note(ud, o->name, was, wanted);
        kept++;
    }
    return kept;
}

int qdd_job_size_check(size_t len, int64_t max_job_bytes, char *why, size_t cap)
{
    if (max_job_bytes < 0 || len <= (uint64_t)max_job_bytes) return 0;
    snprintf(why, cap, "job payload of %zu bytes is over max-job-bytes %lld", len, (long long)max_job_bytes);
    return -1;
}

size_t qdd_config_usage(char *buf, size_t cap)
{
    size_t n = 0;
    int k = snprintf(buf, cap, "usage: quantd [--config FILE] [--OPTION VALUE]...\n"
                     "options (file: name = value; environment: QUANTD_NAME):\n");
    if (k > 0) n += (size_t)k;
    for (size_t i = 0; i < N_OPTIONS; i++) {
        const qdd_option *o = &options[i];
        k = snprintf(buf + (n < cap ? n : cap), n < cap ? cap - n : 0, "  --%-16s %-24s %s%s%s%s\n",
                     o->name, o->meta, o->help, o->def && *o->def ? " [" : "",
                     o->def && *o->def ? o->def : "", o->def && *o->def ? "]" : "");
        if (k > 0) n += (size_t)k;
    }
    return n;
}

/* ---- value parsers ---------------------------------------------------------------- */

void qdd_redis_url_clear(qdd_redis_url *u)
{
    if (!u) return;
    free(u->host);
    free(u->user);
    free(u->pass);
    memset(u, 0, sizeof *u);
}

static char *strndup_or_null(const char *s, size_t n) { return n ? strndup(s, n) : NULL; }

int qdd_redis_url_parse(const char *s, qdd_redis_url *u, qd_err *err)
{
    memset(u, 0, sizeof *u);
    if (strncmp(s, "redis://", 8))
        return qd_err_set(err, QD_EINVAL, "'%s' does not start with redis://", s);
    const char *p = s + 8, *at = strrchr(p, '@'), *hp = at ? at + 1 : p;
    const char *slash = strchr(hp, '/');
    size_t hplen = slash ? (size_t)(slash - hp) : strlen(hp);
    const char *colon = memrchr(hp, ':', hplen);
    if (!colon || colon == hp)
        return qd_err_set(err, QD_EINVAL, "'%s': expected redis://[user:pass@]HOST:PORT[/db]", s);
    char portbuf[8];
    size_t plen = hplen - (size_t)(colon + 1 - hp);
    if (plen == 0 || plen >= sizeof portbuf)
        return qd_err_set(err, QD_EINVAL, "'%s': bad port", s);
    memcpy(portbuf, colon + 1, plen);
    portbuf[plen] = 0;
    char *end;
    long port = strtol(portbuf, &end, 10);
    if (*end || port < 1 || port > 65535)
        return qd_err_set(err, QD_EINVAL, "'%s': port must be 1-65535, got '%s'", s, portbuf);
    long db = 0;
    if (slash) {
        db = strtol(slash + 1, &end, 10);
        if (!slash[1] || *end || db < 0 || db > 1000000)
            return qd_err_set(err, QD_EINVAL, "'%s': database must be a non-negative integer", s);
    }
    u->port = (int)port;
    u->db = (int)db;
    if (!(u->host = strndup(hp, (size_t)(colon - hp)))) goto nomem;
    if (at) {
        const char *uc = memchr(p, ':', (size_t)(at - p));
        if (uc) {
            u->user = strndup_or_null(p, (size_t)(uc - p));
            if (!(u->pass = strndup(uc + 1, (size_t)(at - uc - 1)))) goto nomem;
        } else {
            /* "redis://secret@host:port": a password alone, as redis-cli -u reads it. */
            if (!(u->pass = strndup(p, (size_t)(at - p)))) goto nomem;
        }
    }
    return 0;
nomem:
    qdd_redis_url_clear(u);
    return qd_err_set(err, QD_ENOMEM, "out of memory");
}

/* The "*N" after a CUDA device, at p: returns how many workers it runs (1 without "*N"),
 * with *endp past it; -1 when a '*' is not followed by N in 1..QDD_MAX_WORKERS. */
static int parse_copies(const char *p, const char **endp)
{
    *endp = p;
    if (*p != '*') return 1;
    char *end;
    if (p[1] < '0' || p[1] > '9') return -1;   /* strtol would take "+2", " 2" */
    long n = strtol(p + 1, &end, 10);
    if (n < 1 || n > QDD_MAX_WORKERS) return -1;
    *endp = end;
    return (int)n;
}

int qdd_workers_parse(const char *s, qdd_workers *w, qd_err *err)
{
    memset(w, 0, sizeof *w);
    char *end;
    if (!strncmp(s, "cpu:", 4)) {
        long n = strtol(s + 4, &end, 10);
        if (*end == '*')
            return qd_err_set(err, QD_EINVAL, "'%s': cpu:N already counts the workers (\"*N\" is for a CUDA device)", s);
        if (!s[4] || *end || n < 1 || n > QDD_MAX_WORKERS)
            return qd_err_set(err, QD_EINVAL, "'%s': cpu:N needs N in 1..%d", s, QDD_MAX_WORKERS);
        w->kind = QDD_WORKERS_CPU;
        w->n_cpu = (int)n;
        return 0;
    }
    if (!strncmp(s, "cuda:", 5)) {
        w->kind = QDD_WORKERS_CUDA;
        const char *after;
        if (!strncmp(s + 5, "all", 3)) {
            int k = parse_copies(s + 8, &after);
            if (k < 0 || *after)
                return qd_err_set(err, QD_EINVAL, "'%s': expected cuda:all or cuda:all*N, N workers per device in 1..%d", s,
                                  QDD_MAX_WORKERS);
            w->n_devices = QDD_CUDA_ALL;
            w->all_per_device = k;
            return 0;
        }
        const char *p = s + 5;
        int total = 0;
        while (1) {
            long d = strtol(p, &end, 10);
            if (end == p || *p < '0' || *p > '9' || d > 1023)
                return qd_err_set(err, QD_EINVAL, "'%s': expected cuda:all or cuda:0,1,... (a device may end in *N)", s);
            int k = parse_copies(end, &after);
            if (k < 0)
                return qd_err_set(err, QD_EINVAL, "'%s': device %ld: '*' needs a number of workers in 1..%d", s, d,
                                  QDD_MAX_WORKERS);
            if (*after && *after != ',')
                return qd_err_set(err, QD_EINVAL, "'%s': expected cuda:all or cuda:0,1,... (a device may end in *N)", s);
            for (int i = 0; i < w->n_devices; i++)
                if (w->devices[i] == d)
                    return qd_err_set(err, QD_EINVAL, "'%s': device %ld listed twice (for several workers on it: %ld*N)", s, d,
                                      d);
            total += k;
            if (w->n_devices == QDD_MAX_WORKERS || total > QDD_MAX_WORKERS)
                return qd_err_set(err, QD_EINVAL, "'%s': more than %d workers", s, QDD_MAX_WORKERS);
            w->per_device[w->n_devices] = k;
            w->devices[w->n_devices++] = (int)d;
            if (!*after) return 0;
            p = after + 1;
        }
    }
    return qd_err_set(err, QD_EINVAL, "'%s' is not cpu:N, cuda:all or cuda:0,1 (cuda:0*2: two workers on device 0)", s);
}

/* ---- the output allow-list ---------------------------------------------------------- */

int qdd_path_allowed(const char *path, char *const roots[], size_t n_roots, qd_err *err)
{
    char resolved[PATH_MAX];
    if (qd_fs_resolve(path, resolved, sizeof resolved, err)) return 0;
    for (size_t i = 0; i < n_roots; i++)
        if (qd_fs_path_within(resolved, roots[i])) return 1;
    if (!n_roots)
        qd_err_set(err, QD_EINVAL, "%s: no output roots are allowed (configure --allow-root)", path);
    else if (strcmp(resolved, path))
        qd_err_set(err, QD_EINVAL, "%s resolves to %s, which is outside every allowed root (first: %s)", path,
                   resolved, roots[0]);
    else
        qd_err_set(err, QD_EINVAL, "%s is outside every allowed root (first: %s)", path, roots[0]);
    return 0;
}
