/* quantctl status [ID]: one job's status (every field of its qjob:<id> hash, the report
 * and the spec), or without ID the job list, read from Redis or from the HTTP API
 * (cli/client.h). */
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

/* The parts in flight, one line each: "part:      cpu-1: block 3 quantize part 5 (mlp.down_proj)". */
static void print_parts(const char *parts)
{
    cJSON *a = cJSON_Parse(parts);
    const cJSON *list = cJSON_IsArray(a) ? a : NULL, *p;
    cJSON_ArrayForEach(p, list) {
        const cJSON *w = cJSON_GetObjectItemCaseSensitive(p, "worker"), *b = cJSON_GetObjectItemCaseSensitive(p, "block"),
                    *s = cJSON_GetObjectItemCaseSensitive(p, "step"), *i = cJSON_GetObjectItemCaseSensitive(p, "part"),
                    *l = cJSON_GetObjectItemCaseSensitive(p, "layer");
        printf("part:      %s: block %d %s part %d", cJSON_IsString(w) ? w->valuestring : "?",
               cJSON_IsNumber(b) ? b->valueint : -1, cJSON_IsString(s) ? s->valuestring : "?",
               cJSON_IsNumber(i) ? i->valueint : -1);
        if (cJSON_IsString(l)) printf(" (%s)", l->valuestring);
        putchar('\n');
    }
    cJSON_Delete(a);
}

/* The status as "key:  value" lines. */
static void print_status(const qp_status *st)
{
    printf("id:        %s\nstate:     %s\n", st->id ? st->id : "?", qp_state_name(st->state));
    if (st->stage) printf("stage:     %s\n", st->stage);
    if (st->n_blocks) printf("block:     %d/%d\n", st->block + 1, st->n_blocks);
    printf("progress:  %.1f%%\n", st->progress * 100);
    if (st->eta_s >= 0 && st->state == QP_STATE_RUNNING) printf("eta:       %.0f s\n", st->eta_s);
    if (st->layer) printf("layer:     %s\n", st->layer);
    if (st->node) printf("node:      %s%s%s\n", st->node, st->worker ? " / " : "", st->worker ? st->worker : "");
    if (st->parts) print_parts(st->parts);
    if (st->attempts) printf("attempts:  %d\n", st->attempts);
    if (st->error) printf("error:     %s\n", st->error);
    if (st->estimate) printf("estimate:  %s\n", st->estimate);
    if (st->output) printf("output:    %s\n", st->output);
    if (st->report) printf("report:    %s\n", st->report);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: quantctl status [ID] [--json] [--redis URL | --http URL]\n"
               "  Shows one job's status, or every job (like `quantctl list`) without ID.\n"
               "  --json            print the status as JSON\n%s"
               "exit status: 0 shown, 1 no such job or the server failed, 2 bad usage\n", qctl_conn_help);
}

int cmd_status(int argc, char **argv, const qd_runtime_opts *rt)
{
    qctl_conn c;
    qctl_conn_defaults(&c);
    int json = 0, o;
    static const struct option opts[] = {QCTL_CONN_OPTIONS, {"json", no_argument, 0, 'j'}, {"help", no_argument, 0, 'h'}, {0}};
    optind = 1;
    while ((o = getopt_long(argc, argv, "jh", opts, NULL)) != -1) {
        if (qctl_conn_option(&c, o, optarg)) continue;
        if (o == 'j') json = 1;
        else if (o == 'h') { usage(stdout); return QCTL_OK; }
        else { usage(stderr); return QCTL_USAGE; }
    }
    if (optind == argc) return cmd_list(argc, argv, rt);
    if (optind + 1 != argc) { usage(stderr); return QCTL_USAGE; }
    const char *id = argv[optind];
    if (!qp_name_valid(id)) { fprintf(stderr, "quantctl: '%s' is not a job id\n", id); return QCTL_USAGE; }
    if (c.http) {
        char path[128], *resp;
        int status;
        snprintf(path, sizeof path, "/v1/jobs/%s", id);
        if (qctl_http(&c, "GET", path, NULL, &status, &resp)) return QCTL_FAIL;
        if (status != 200) { qctl_http_error(status, resp); free(resp); return QCTL_FAIL; }
        qp_status st;
        qp_err pe = {0};
        if (json || qp_status_from_event(&st, NULL, resp, strlen(resp), &pe)) fputs(resp, stdout);
        else { print_status(&st); qp_status_clear(&st); }
        free(resp);
        return QCTL_OK;
    }
    qp_keys k;
    if (qctl_keys(&c, &k)) return QCTL_USAGE;
    redisContext *r = qctl_redis(&c);
    if (!r) return QCTL_FAIL;
    char key[QP_KEY_MAX];
    qp_key_status(&k, id, key, sizeof key);
    redisReply *rep = redisCommand(r, "HGETALL %s", key);
    int rc = QCTL_FAIL;
    if (!rep || rep->type != REDIS_REPLY_ARRAY) fprintf(stderr, "quantctl: Redis: %s\n", rep ? rep->str : r->errstr);
    else if (!rep->elements) fprintf(stderr, "quantctl: no job '%s'\n", id);
    else {
        const char **kv = calloc(rep->elements, sizeof *kv);
        for (size_t i = 0; kv && i < rep->elements; i++) kv[i] = rep->element[i]->str ? rep->element[i]->str : "";
        qp_status st;
        qp_status_init(&st);
        qp_err pe = {0};
        if (kv && !qp_status_from_fields(&st, kv, rep->elements, &pe)) {
            if (json) {
                char *s = qp_status_to_event(&st, QP_EVENT_STATE);
                if (s) puts(s);
                free(s);
            } else {
                print_status(&st);
            }
            rc = QCTL_OK;
        } else {
            fprintf(stderr, "quantctl: job '%s': %s\n", id, pe.msg);
        }
        qp_status_clear(&st);
        free(kv);
    }
    freeReplyObject(rep);
    redisFree(r);
    return rc;
}
