/* daemon/config: defaults, file < env < flags precedence, list replacement, validation
 * messages, the redis URL and workers parsers, the dump (password masked), the reload
 * split (restart-only options kept and reported, the rest applied) and the realpath-based
 * output allow-list. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/config.h"
#include "test_util.h"

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

static void test_defaults(void)
{
    char *argv[] = {"quantd", NULL};
    qdd_config *c = NULL;
    qd_err err = {0};
    CHECK_OK(qdd_config_load(1, argv, NULL, &c, &err));
    if (!c) return;
    CHECK_STR(c->redis_url.host, "127.0.0.1");
    CHECK_INT(c->redis_url.port, 6379);
    CHECK_INT(c->redis_url.db, 0);
    CHECK(c->redis_url.pass == NULL);
    CHECK_STR(c->queue, "qjobs");
    CHECK_STR(c->key_prefix, "qjob");
    CHECK_INT(c->worker_spec.kind, QDD_WORKERS_CPU);
    CHECK_INT(c->worker_spec.n_cpu, 1);
    CHECK_INT(c->n_allow_roots, 0);
    CHECK_INT(c->retention_s, 604800);
    CHECK_STR(c->http, "");
    CHECK(c->node && c->node[0]);
    CHECK(c->config_file == NULL);
    qdd_config_free(c);
    qdd_config_free(NULL);
}

static void test_precedence(void)
{
    const char *dir = test_tmpdir();
    char r1[512], r2[512], r3[512], conf[512];
    snprintf(r1, sizeof r1, "%s/root1", dir);
    snprintf(r2, sizeof r2, "%s/root2", dir);
    snprintf(r3, sizeof r3, "%s/root3", dir);
    mkdir(r1, 0755);
    mkdir(r2, 0755);
    mkdir(r3, 0755);
    snprintf(conf, sizeof conf, "%s/quantd.conf", dir);
    char text[2048];
    snprintf(text, sizeof text,
             "# a comment\n\n"
             "redis = redis://file-host:7000/2   # trailing comment\n"
             "node = file-node\n"
             "queue = fq\n"
             "key_prefix = fk\n"
             "max-jobs = 3\n"
             "allow-root = %s\n"
             "allow-root = %s\n"
             "log-level = debug\n",
             r1, r2);
    write_text(conf, text);

    /* File only. */
    char *argv1[] = {"quantd", "--config", conf, NULL};
    qdd_config *c = NULL;
    qd_err err = {0};
    CHECK_OK(qdd_config_load(3, argv1, NULL, &c, &err));
    if (c) {
        CHECK_STR(c->redis_url.host, "file-host");
        CHECK_INT(c->redis_url.port, 7000);
        CHECK_INT(c->redis_url.db, 2);
        CHECK_STR(c->node, "file-node");
        CHECK_STR(c->queue, "fq");
        CHECK_STR(c->key_prefix, "fk");
        CHECK_INT(c->max_jobs, 3);
        CHECK_INT(c->n_allow_roots, 2);
        CHECK_STR(c->config_file, conf);
        qdd_config_free(c);
        c = NULL;
    }

    /* Env over file: node and the root list (replaced, colon-separated). */
    char envroots[1100];
    snprintf(envroots, sizeof envroots, "QUANTD_ALLOW_ROOT=%s", r3);
    char *envp[] = {"QUANTD_NODE=env-node", "QUANTD_MAX_JOBS=5", envroots, "PATH=/bin", NULL};
    CHECK_OK(qdd_config_load(3, argv1, envp, &c, &err));
    if (c) {
        CHECK_STR(c->node, "env-node");
        CHECK_INT(c->max_jobs, 5);
        CHECK_STR(c->queue, "fq");
        CHECK_INT(c->n_allow_roots, 1);
        char *real3 = realpath(r3, NULL);
        if (c->n_allow_roots == 1) CHECK_STR(c->allow_roots[0], real3);
        free(real3);
        qdd_config_free(c);
        c = NULL;
    }

    /* Flags over env over file; config file named by the environment. */
    char envconf[600];
    snprintf(envconf, sizeof envconf, "QUANTD_CONFIG=%s", conf);
    char *envp2[] = {envconf, "QUANTD_NODE=env-node", "QUANTD_MAX_JOBS=5", NULL};
    char *argv2[] = {"quantd", "--node", "flag-node", "--max-jobs=7", "--allow-root", r1,
                     "--allow-root", r3, "--workers", "cuda:0,2", "--redis",
                     "redis://alice:s3cret@10.0.0.1:6380", NULL};
    CHECK_OK(qdd_config_load(12, argv2, envp2, &c, &err));
    if (c) {
        CHECK_STR(c->config_file, conf);
        CHECK_STR(c->node, "flag-node");
        CHECK_INT(c->max_jobs, 7);
        CHECK_STR(c->queue, "fq");
        CHECK_STR(c->log_level, "debug");
        CHECK_INT(c->n_allow_roots, 2);
        CHECK_INT(c->worker_spec.kind, QDD_WORKERS_CUDA);
        CHECK_INT(c->worker_spec.n_devices, 2);
        CHECK_INT(c->worker_spec.devices[1], 2);
        CHECK_STR(c->redis_url.user, "alice");
        CHECK_STR(c->redis_url.pass, "s3cret");
        CHECK_STR(c->redis_url.host, "10.0.0.1");
        CHECK_INT(c->redis_url.port, 6380);
        char line[4096];
        size_t n = qdd_config_dump(c, line, sizeof line);
        CHECK(n < sizeof line);
        CHECK_CONTAINS(line, "node=flag-node");
        CHECK_CONTAINS(line, "redis=redis://alice:***@10.0.0.1:6380/0");
        CHECK_CONTAINS(line, "max-jobs=7");
        CHECK(strstr(line, "s3cret") == NULL);
        CHECK(strchr(line, '\n') == NULL);
        /* A short buffer still gets a terminated prefix and the full length back. */
        char tiny[16];
        CHECK_INT(qdd_config_dump(c, tiny, sizeof tiny), n);
        CHECK_INT(strlen(tiny), 15);
        qdd_config_free(c);
    }
}

static void test_errors(void)
{
    qdd_config *c = NULL;
    qd_err err = {0};
    char *a1[] = {"quantd", "--max-jobs", "x", NULL};
    CHECK_ERR(qdd_config_load(3, a1, NULL, &c, &err));
    CHECK(c == NULL);
    CHECK_CONTAINS(err.msg, "--max-jobs: must be an integer");
    char *a2[] = {"quantd", "--redsi", "redis://h:1", NULL};
    CHECK_ERR(qdd_config_load(3, a2, NULL, &c, &err));
    CHECK_CONTAINS(err.msg, "did you mean 'redis'");
    char *a3[] = {"quantd", "--workers", "gpu:2", NULL};
    CHECK_ERR(qdd_config_load(3, a3, NULL, &c, &err));
    CHECK_CONTAINS(err.msg, "--workers:");
    char *a4[] = {"quantd", "--node", "bad name", NULL};
    CHECK_ERR(qdd_config_load(3, a4, NULL, &c, &err));
    CHECK_CONTAINS(err.msg, "node name");
    char *a5[] = {"quantd", "--queue", "same", "--key-prefix", "same", NULL};
    CHECK_ERR(qdd_config_load(5, a5, NULL, &c, &err));
    CHECK_CONTAINS(err.msg, "must differ");
    char *a6[] = {"quantd", "--allow-root", "/definitely/not/here/quantd", NULL};
    CHECK_ERR(qdd_config_load(3, a6, NULL, &c, &err));
    CHECK_CONTAINS(err.msg, "allow-root");
    char *a7[] = {"quantd", "--node", NULL};
    CHECK_ERR(qdd_config_load(2, a7, NULL, &c, &err));
    CHECK_CONTAINS(err.msg, "needs a value");
    char *e1[] = {"QUANTD_RETENTION=-5", NULL};
    char *a8[] = {"quantd", NULL};
    CHECK_ERR(qdd_config_load(1, a8, e1, &c, &err));
    CHECK_CONTAINS(err.msg, "QUANTD_RETENTION");

    const char *dir = test_tmpdir();
    char conf[512];
    snprintf(conf, sizeof conf, "%s/bad.conf", dir);
    write_text(conf, "node = ok\n\nworkrs = cpu:2\n");
    char *a9[] = {"quantd", "--config", conf, NULL};
    CHECK_ERR(qdd_config_load(3, a9, NULL, &c, &err));
    CHECK_CONTAINS(err.msg, ":3: unknown option 'workrs' (did you mean 'workers'?)");
    write_text(conf, "node ok\n");
    CHECK_ERR(qdd_config_load(3, a9, NULL, &c, &err));
    CHECK_CONTAINS(err.msg, ":1: expected 'name = value'");
    char *a10[] = {"quantd", "--config", "/no/such/quantd.conf", NULL};
    CHECK_ERR(qdd_config_load(3, a10, NULL, &c, &err));
    CHECK(c == NULL);
}

static void test_parsers(void)
{
    qdd_redis_url u;
    qd_err err = {0};
    CHECK_OK(qdd_redis_url_parse("redis://h:1", &u, &err));
    CHECK_STR(u.host, "h");
    CHECK_INT(u.port, 1);
    CHECK(u.user == NULL && u.pass == NULL);
    qdd_redis_url_clear(&u);
    CHECK_OK(qdd_redis_url_parse("redis://pw@h:2/3", &u, &err));
    CHECK_STR(u.pass, "pw");
    CHECK(u.user == NULL);
    CHECK_INT(u.db, 3);
    qdd_redis_url_clear(&u);
    CHECK_OK(qdd_redis_url_parse("redis://:pw@h:2", &u, &err));
    CHECK(u.user == NULL);
    CHECK_STR(u.pass, "pw");
    qdd_redis_url_clear(&u);
    CHECK_ERR(qdd_redis_url_parse("http://h:1", &u, &err));
    CHECK_ERR(qdd_redis_url_parse("redis://h", &u, &err));
    CHECK_ERR(qdd_redis_url_parse("redis://h:0", &u, &err));
    CHECK_ERR(qdd_redis_url_parse("redis://h:70000", &u, &err));
    CHECK_ERR(qdd_redis_url_parse("redis://h:1/x", &u, &err));

    qdd_workers w;
    CHECK_OK(qdd_workers_parse("cpu:4", &w, &err));
    CHECK_INT(w.n_cpu, 4);
    CHECK_OK(qdd_workers_parse("cuda:all", &w, &err));
    CHECK_INT(w.n_devices, QDD_CUDA_ALL);
    CHECK_OK(qdd_workers_parse("cuda:3", &w, &err));
    CHECK_INT(w.n_devices, 1);
    CHECK_INT(w.devices[0], 3);
    CHECK_ERR(qdd_workers_parse("cpu:0", &w, &err));
    CHECK_ERR(qdd_workers_parse("cuda:0,0", &w, &err));
    CHECK_ERR(qdd_workers_parse("cuda:0,", &w, &err));
    CHECK_ERR(qdd_workers_parse("cuda:", &w, &err));
    CHECK_ERR(qdd_workers_parse("cuda:-1", &w, &err));
    /* Several workers on one device: "*N" after it, or after all. */
    CHECK_OK(qdd_workers_parse("cuda:3", &w, &err));
    CHECK_INT(w.per_device[0], 1);
    CHECK_OK(qdd_workers_parse("cuda:0*2", &w, &err));
    CHECK_INT(w.n_devices, 1);
    CHECK_INT(w.devices[0], 0);
    CHECK_INT(w.per_device[0], 2);
    CHECK_OK(qdd_workers_parse("cuda:1*3,0", &w, &err));
    CHECK_INT(w.n_devices, 2);
    CHECK_INT(w.devices[0], 1);
    CHECK_INT(w.per_device[0], 3);
    CHECK_INT(w.devices[1], 0);
    CHECK_INT(w.per_device[1], 1);
    CHECK_OK(qdd_workers_parse("cuda:all*2", &w, &err));
    CHECK_INT(w.n_devices, QDD_CUDA_ALL);
    CHECK_INT(w.all_per_device, 2);
    CHECK_OK(qdd_workers_parse("cuda:all", &w, &err));
    CHECK_INT(w.all_per_device, 1);
    CHECK_OK(qdd_workers_parse("cuda:0*256", &w, &err));
    CHECK_ERR(qdd_workers_parse("cuda:0*0", &w, &err));
    CHECK_CONTAINS(err.msg, "'cuda:0*0': device 0: '*' needs a number of workers in 1..256");
    CHECK_ERR(qdd_workers_parse("cuda:0*", &w, &err));
    CHECK_CONTAINS(err.msg, "device 0: '*' needs a number");
    CHECK_ERR(qdd_workers_parse("cuda:0*+2", &w, &err));
    CHECK_ERR(qdd_workers_parse("cuda:0*x", &w, &err));
    CHECK_ERR(qdd_workers_parse("cuda:0*257", &w, &err));
    CHECK_ERR(qdd_workers_parse("cuda:0*2*2", &w, &err));
    CHECK_CONTAINS(err.msg, "'cuda:0*2*2': expected cuda:all or cuda:0,1,...");
    CHECK_ERR(qdd_workers_parse("cuda:0*2,0", &w, &err));
    CHECK_CONTAINS(err.msg, "'cuda:0*2,0': device 0 listed twice (for several workers on it: 0*N)");
    CHECK_ERR(qdd_workers_parse("cuda:0*200,1*57", &w, &err));
    CHECK_CONTAINS(err.msg, "more than 256 workers");
    CHECK_ERR(qdd_workers_parse("cuda:all*0", &w, &err));
    CHECK_CONTAINS(err.msg, "'cuda:all*0': expected cuda:all or cuda:all*N");
    CHECK_ERR(qdd_workers_parse("cuda:all*", &w, &err));
    CHECK_ERR(qdd_workers_parse("cuda:all,0", &w, &err));
    CHECK_ERR(qdd_workers_parse("cuda:*2", &w, &err));
    CHECK_ERR(qdd_workers_parse("cpu:2*2", &w, &err));
    CHECK_CONTAINS(err.msg, "'cpu:2*2': cpu:N already counts the workers");

    char usage[8192];
    CHECK(qdd_config_usage(usage, sizeof usage) < sizeof usage);
    CHECK_CONTAINS(usage, "--allow-root");
    CHECK_CONTAINS(usage, "--key-prefix");
}

static void test_allow_list(void)
{
    const char *dir = test_tmpdir();
    char root[512], outside[512], link_out[600], link_in[600], p[1024], dangling[600];
    snprintf(root, sizeof root, "%s/allowed", dir);
    snprintf(outside, sizeof outside, "%s/outside", dir);
    mkdir(root, 0755);
    mkdir(outside, 0755);
    snprintf(link_out, sizeof link_out, "%s/escape", root);
    CHECK_OK(symlink(outside, link_out));
    snprintf(link_in, sizeof link_in, "%s/sub", root);
    mkdir(link_in, 0755);
    snprintf(dangling, sizeof dangling, "%s/dangling", root);
    snprintf(p, sizeof p, "%s/not-yet", outside);
    CHECK_OK(symlink(p, dangling));

    char *real = realpath(root, NULL);
    char *roots[] = {real};
    qd_err err = {0};
    /* Inside: existing, not yet existing (several levels), through a `..` that stays inside. */
    CHECK_INT(qdd_path_allowed(root, roots, 1, &err), 1);
    snprintf(p, sizeof p, "%s/job1/out", root);
    CHECK_INT(qdd_path_allowed(p, roots, 1, &err), 1);
    snprintf(p, sizeof p, "%s/sub/../job2/", root);
    CHECK_INT(qdd_path_allowed(p, roots, 1, &err), 1);
    /* Outside: /etc, a `..` escape, a symlink out of the root (existing and below it), a
     * dangling link, `..` below a missing directory, a sibling sharing the root's prefix. */
    CHECK_INT(qdd_path_allowed("/etc/quantd-out", roots, 1, &err), 0);
    CHECK_CONTAINS(err.msg, "outside every allowed root");
    snprintf(p, sizeof p, "%s/../outside/x", root);
    CHECK_INT(qdd_path_allowed(p, roots, 1, &err), 0);
    CHECK_CONTAINS(err.msg, "resolves to");
    CHECK_INT(qdd_path_allowed(link_out, roots, 1, &err), 0);
    snprintf(p, sizeof p, "%s/escape/new/dir", root);
    CHECK_INT(qdd_path_allowed(p, roots, 1, &err), 0);
    CHECK_INT(qdd_path_allowed(dangling, roots, 1, &err), 0);
    CHECK_CONTAINS(err.msg, "symbolic link");
    snprintf(p, sizeof p, "%s/missing/../../outside", root);
    CHECK_INT(qdd_path_allowed(p, roots, 1, &err), 0);
    snprintf(p, sizeof p, "%s-sibling/x", root);
    CHECK_INT(qdd_path_allowed(p, roots, 1, &err), 0);
    CHECK_INT(qdd_path_allowed("relative/path", roots, 1, &err), 0);
    CHECK_CONTAINS(err.msg, "not absolute");
    CHECK_INT(qdd_path_allowed("/tmp/x", roots, 0, &err), 0);
    CHECK_CONTAINS(err.msg, "no output roots");
    char *slash[] = {"/"};
    CHECK_INT(qdd_path_allowed("/etc/x", slash, 1, &err), 1);
    free(real);
}

typedef struct notes { int n; char names[512]; char last_running[256]; } notes;

static void note(void *ud, const char *option, const char *running, const char *wanted)
{
    notes *n = ud;
    n->n++;
    size_t k = strlen(n->names);
    snprintf(n->names + k, sizeof n->names - k, "%s ", option);
    snprintf(n->last_running, sizeof n->last_running, "%s", running);
}

static void test_reload_split(void)
{
    char *a[] = {"quantd", "--redis", "redis://:pw@127.0.0.1:6379", "--node", "n1", "--workers", "cpu:1",
                 "--http", "127.0.0.1:8080", "--queue", "qjobs", "--key-prefix", "qjob", "--heartbeat", "2",
                 "--worker-path", "/bin/w1", "--http-token", "old", "--max-jobs", "1", "--log-level", "info", NULL};
    char *b[] = {"quantd", "--redis", "redis://:pw2@127.0.0.1:6380", "--node", "n2", "--workers", "cpu:2",
                 "--http", "127.0.0.1:8081", "--queue", "qj2", "--key-prefix", "qk2", "--heartbeat", "5",
                 "--worker-path", "/bin/w2", "--http-token", "new", "--max-jobs", "3", "--log-level", "debug", NULL};
    qdd_config *run = NULL, *next = NULL;
    qd_err err = {0};
    CHECK_OK(qdd_config_load(23, a, NULL, &run, &err));
    CHECK_OK(qdd_config_load(23, b, NULL, &next, &err));
    if (!run || !next) { qdd_config_free(run); qdd_config_free(next); return; }
    notes n = {0};
    CHECK_INT(qdd_config_keep_restart_options(run, next, note, &n), 8);
    CHECK_INT(n.n, 8);
    const char *restart[] = {"redis", "node", "workers", "http", "queue", "key-prefix", "heartbeat", "worker-path"};
    for (int i = 0; i < 8; i++) {
        char w[64];
        snprintf(w, sizeof w, "%s ", restart[i]);
        CHECK_CONTAINS(n.names, w);
    }
    /* The running values are back in next, derived fields included; secrets never shown. */
    CHECK(!strstr(n.names, "http-token"));
    CHECK_INT(next->redis_url.port, 6379);
    CHECK_STR(next->redis_url.pass, "pw");
    CHECK_STR(next->node, "n1");
    CHECK_INT(next->worker_spec.n_cpu, 1);
    CHECK_STR(next->http, "127.0.0.1:8080");
    CHECK_STR(next->queue, "qjobs");
    CHECK_INT(next->heartbeat_s, 2);
    CHECK_STR(next->worker_path, "/bin/w1");
    /* The rest is applied. */
    CHECK_STR(next->http_token, "new");
    CHECK_INT(next->max_jobs, 3);
    CHECK_STR(next->log_level, "debug");
    /* Nothing differs: nothing is noted. */
    notes m = {0};
    CHECK_INT(qdd_config_keep_restart_options(run, run, note, &m), 0);
    CHECK_INT(m.n, 0);
    qdd_config_free(run);
    qdd_config_free(next);
}

int main(void)
{
    TEST_RUN(test_defaults);
    TEST_RUN(test_precedence);
    TEST_RUN(test_errors);
    TEST_RUN(test_parsers);
    TEST_RUN(test_allow_list);
    TEST_RUN(test_reload_split);
    return test_finish();
}
