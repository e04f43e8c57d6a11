/* quantctl cancel ID: the cancel protocol of proto/redis.md (the persistent flag
 * qjob:<id>:cancel, then PUBLISH on the cancel channel), or DELETE /v1/jobs/{id}. The job
 * stops at its next safe point and ends `cancelled`; `quantctl watch ID` shows when. */
#define _GNU_SOURCE
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "cli/client.h"
#include "cli/quantctl.h"
#include "proto/keys.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: quantctl cancel ID [--reason TEXT] [--redis URL | --http URL --token T]\n%s"
               "exit status: 0 cancel requested, 1 no such job, already finished or unreachable, 2 bad usage\n",
               qctl_conn_help);
}

int cmd_cancel(int argc, char **argv, const qd_runtime_opts *rt)
{
    qctl_conn c;
    qctl_conn_defaults(&c);
    const char *reason = "cancelled with quantctl";
    static const struct option opts[] = {QCTL_CONN_OPTIONS, {"reason", required_argument, 0, 'r'},
                                         {"help", no_argument, 0, 'h'}, {0}};
    int o;
    optind = 1;
    while ((o = getopt_long(argc, argv, "r:h", opts, NULL)) != -1) {
        if (qctl_conn_option(&c, o, optarg)) continue;
        if (o == 'r') reason = optarg;
        else if (o == 'h') { usage(stdout); return QCTL_OK; }
        else { usage(stderr); return QCTL_USAGE; }
    }
    if (optind + 1 != argc) { usage(stderr); return QCTL_USAGE; }
    const char *id = argv[optind];
    if (!qp_name_valid(id)) { fprintf(stderr, "quantctl: '%s' is not a job id\n", id); return QCTL_USAGE; }
    if (c.http) {
        char path[128], *resp;
        int status;
        snprintf(path, sizeof path, "/v1/jobs/%s", id);
        if (qctl_http(&c, "DELETE", path, NULL, &status, &resp)) return QCTL_FAIL;
        int ok = status == 202 || status == 200;
        if (ok) printf("cancel requested for %s\n", id);
        else qctl_http_error(status, resp);
        free(resp);
        return ok ? QCTL_OK : QCTL_FAIL;
    }
    qp_keys k;
    if (qctl_keys(&c, &k)) return QCTL_USAGE;
    redisContext *r = qctl_redis(&c);
    if (!r) return QCTL_FAIL;
    char hash[QP_KEY_MAX], flag[QP_KEY_MAX], chan[QP_KEY_MAX];
    qp_key_status(&k, id, hash, sizeof hash);
    qp_key_cancel(&k, id, flag, sizeof flag);
    qp_key_cancel_channel(&k, chan, sizeof chan);
    int rc = QCTL_FAIL;
    redisReply *st = redisCommand(r, "HGET %s state", hash);
    if (!st || st->type == REDIS_REPLY_NIL) fprintf(stderr, "quantctl: no job '%s'\n", id);
    else if (st->type == REDIS_REPLY_STRING && (!strcmp(st->str, "done") || !strcmp(st->str, "failed") ||
                                                 !strcmp(st->str, "cancelled")))
        fprintf(stderr, "quantctl: job '%s' is already %s\n", id, st->str);
    else {
        /* The flag first: a daemon that misses the message still sees it. */
        freeReplyObject(redisCommand(r, "SET %s %s", flag, reason));
        freeReplyObject(redisCommand(r, "PUBLISH %s %s", chan, id));
        printf("cancel requested for %s\n", id);
        rc = QCTL_OK;
    }
    freeReplyObject(st);
    redisFree(r);
    return rc;
}
