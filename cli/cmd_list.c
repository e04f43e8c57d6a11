/* quantctl list [--state S]: the jobs of the index (newest first) with state, progress and
 * place, from Redis or GET /v1/jobs. */
#define _GNU_SOURCE
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <hiredis/hiredis.h>

#include "cli/client.h"
#include "cli/quantctl.h"
#include "proto/keys.h"
#include "proto/status.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: quantctl list [--state queued|running|done|failed|cancelled] [--limit N] [--json]\n%s"
               "exit status: 0 listed, 1 unreachable, 2 bad usage\n", qctl_conn_help);
}

static void row(const char *id, const char *state, double progress, const char *stage, const char *node,
                const char *error)
{
    printf("%-24s %-10s %5.1f%%  %-12s %-16s %s\n", id, state, progress * 100, stage, node, error);
}

int cmd_list(int argc, char **argv, const qd_runtime_opts *rt)
{
    qctl_conn c;
    qctl_conn_defaults(&c);
    const char *state = NULL;
    long limit = 100;
    int json = 0, o;
    static const struct option opts[] = {QCTL_CONN_OPTIONS, {"state", required_argument, 0, 's'},
        {"limit", required_argument, 0, 'n'}, {"json", no_argument, 0, 'j'}, {"help", no_argument, 0, 'h'}, {0}};
    optind = 1;
    while ((o = getopt_long(argc, argv, "s:n:jh", opts, NULL)) != -1) {
        if (qctl_conn_option(&c, o, optarg)) continue;
        if (o == 's') state = optarg;
        else if (o == 'n') limit = strtol(optarg, NULL, 10);
        else if (o == 'j') json = 1;
        else if (o == 'h') { usage(stdout); return QCTL_OK; }
        else { usage(stderr); return QCTL_USAGE; }
    }
    qp_state st;
    if (state && qp_state_parse(state, &st)) {
        fprintf(stderr, "quantctl: --state '%s' is not one of queued, running, done, failed, cancelled\n", state);
        return QCTL_USAGE;
    }
    if (limit < 1 || limit > 10000) { fprintf(stderr, "quantctl: --limit must be 1..10000\n"); return QCTL_USAGE; }
    if (c.http) {
        char path[128], *resp;
        int status;
        snprintf(path, sizeof path, "/v1/jobs?limit=%ld%s%s", limit, state ? "&state=" : "", state ? state : "");
        if (qctl_http(&c, "GET", path, NULL, &status, &resp)) return QCTL_FAIL;
        if (status != 200) { qctl_http_error(status, resp); free(resp); return QCTL_FAIL; }
        if (json) { fputs(resp, stdout); free(resp); return QCTL_OK; }
        cJSON *root = cJSON_Parse(resp), *j;
        free(resp);
        cJSON_ArrayForEach(j, cJSON_GetObjectItemCaseSensitive(root, "jobs")) {
#define S(k) (cJSON_IsString(cJSON_GetObjectItemCaseSensitive(j, k)) ? cJSON_GetObjectItemCaseSensitive(j, k)->valuestring : "")
            const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "progress");
            row(S("id"), S("state"), cJSON_IsNumber(p) ? p->valuedouble : 0, S("stage"), S("node"), S("error"));
#undef S
        }
        cJSON_Delete(root);
        return QCTL_OK;
    }
    qp_keys k;
    if (qctl_keys(&c, &k)) return QCTL_USAGE;
    redisContext *r = qctl_redis(&c);
    if (!r) return QCTL_FAIL;
    char index[QP_KEY_MAX];
    qp_key_index(&k, index, sizeof index);
    redisReply *ids = redisCommand(r, "ZREVRANGE %s 0 9999", index);
    long shown = 0;
    for (size_t i = 0; ids && ids->type == REDIS_REPLY_ARRAY && i < ids->elements && shown < limit; i++) {
        char key[QP_KEY_MAX];
        if (qp_key_status(&k, ids->element[i]->str, key, sizeof key)) continue;
        redisReply *f = redisCommand(r, "HMGET %s state progress stage node error", key);
        if (f && f->type == REDIS_REPLY_ARRAY && f->elements == 5 && f->element[0]->str &&
            (!state || !strcmp(state, f->element[0]->str))) {
#define F(n) (f->element[n]->str ? f->element[n]->str : "")
            if (json) printf("{\"id\":\"%s\",\"state\":\"%s\",\"progress\":%s}\n", ids->element[i]->str, F(0),
                             *F(1) ? F(1) : "0");
            else row(ids->element[i]->str, F(0), atof(F(1)), F(2), F(3), F(4));
#undef F
            shown++;
        }
        freeReplyObject(f);
    }
    int rc = ids && ids->type == REDIS_REPLY_ARRAY ? QCTL_OK : QCTL_FAIL;
    if (rc) fprintf(stderr, "quantctl: Redis: %s\n", ids && ids->str ? ids->str : r->errstr);
    freeReplyObject(ids);
    redisFree(r);
    return rc;
}
