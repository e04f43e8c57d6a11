/* quantctl submit: validates a job (the same qp_job_parse the daemon runs at admission) and
 * queues it, with LPUSH on the queue list or POST /v1/jobs. The spec comes from a JSON file
 * (FILE, or - for stdin) or from flags; flags given with a file override its fields. The
 * canonical JSON (with the id) is what is queued, so the printed id is the one the daemon
 * uses. */
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
#include "quant/job/job.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: quantctl submit [FILE.json|-] [--model DIR --output DIR --method gptq|awq|rtn|awq+gptq\n"
               "                       --bits N --group-size N --calib FILE --format F --scheme S --id ID --priority N]\n"
               "                       [--profile NAME] [--print]\n"
               "  Validates the job and queues it; prints its id. --profile applies a named set of fields\n"
               "  under the file's and the flags' (vllm-hopper: compressed-tensors, symmetric 4-bit, group\n"
               "  128, serve vllm/hopper/tp 1); a job with a scheme (--scheme FP8_DYNAMIC, docs/schemes.md) takes\n"
               "  no bits, group size, symmetry or format from a profile. --print prints the canonical job\n"
               "  instead of queueing it.\n%s"
               "exit status: 0 queued, 1 the queue refused it or is unreachable, 2 invalid job or usage\n",
               qctl_conn_help);
}

static char *read_all(FILE *fp)
{
    size_t n = 0, cap = 4096;
    char *b = malloc(cap);
    size_t k;
    while (b && (k = fread(b + n, 1, cap - n - 1, fp)) > 0) {
        n += k;
        if (cap - n < 2) { char *nb = realloc(b, cap *= 2); if (!nb) { free(b); return NULL; } b = nb; }
    }
    if (b) b[n] = 0;
    return b;
}

int cmd_submit(int argc, char **argv, const qd_runtime_opts *rt)
{
    qctl_conn c;
    qctl_conn_defaults(&c);
    enum { O_MODEL = 1, O_OUTPUT, O_METHOD, O_BITS, O_GROUP, O_CALIB, O_FORMAT, O_SCHEME, O_ID, O_PRIO, O_PROFILE, O_PRINT };
    static const struct option opts[] = {QCTL_CONN_OPTIONS,
        {"model", required_argument, 0, O_MODEL}, {"output", required_argument, 0, O_OUTPUT},
        {"method", required_argument, 0, O_METHOD}, {"bits", required_argument, 0, O_BITS},
        {"group-size", required_argument, 0, O_GROUP}, {"calib", required_argument, 0, O_CALIB},
        {"format", required_argument, 0, O_FORMAT}, {"scheme", required_argument, 0, O_SCHEME},
        {"id", required_argument, 0, O_ID},
        {"priority", required_argument, 0, O_PRIO}, {"profile", required_argument, 0, O_PROFILE},
        {"print", no_argument, 0, O_PRINT}, {"help", no_argument, 0, 'h'}, {0}};
    const char *val[O_PRIO + 1] = {0};
    const char *profile = NULL;
    int print_only = 0;
    int o;
    optind = 1;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (qctl_conn_option(&c, o, optarg)) continue;
        if (o == 'h') { usage(stdout); return QCTL_OK; }
        if (o >= O_MODEL && o <= O_PRIO) { val[o] = optarg; continue; }
        if (o == O_PROFILE) { profile = optarg; continue; }
        if (o == O_PRINT) { print_only = 1; continue; }
        usage(stderr);
        return QCTL_USAGE;
    }
    if (optind + 1 < argc) { usage(stderr); return QCTL_USAGE; }
    cJSON *spec = NULL;
    if (optind < argc) {
        const char *file = argv[optind];
        FILE *fp = strcmp(file, "-") ? fopen(file, "rb") : stdin;
        if (!fp) { fprintf(stderr, "quantctl: cannot open %s\n", file); return QCTL_USAGE; }
        char *text = read_all(fp);
        if (fp != stdin) fclose(fp);
        spec = text ? cJSON_Parse(text) : NULL;
        free(text);
        if (!cJSON_IsObject(spec)) {
            fprintf(stderr, "quantctl: %s: not a JSON object\n", file);
            cJSON_Delete(spec);
            return QCTL_USAGE;
        }
    } else {
        spec = cJSON_CreateObject();
    }
    if (profile) {
        /* The profile's fields go under the file's: a field the file sets wins. */
        const char *pj = qp_job_profile(profile, NULL);
        if (!pj) {
            fprintf(stderr, "quantctl: --profile: '%s' is not a profile (", profile);
            for (size_t i = 0; qp_job_profile_name(i); i++) fprintf(stderr, "%s%s", i ? ", " : "", qp_job_profile_name(i));
            fprintf(stderr, ")\n");
            cJSON_Delete(spec);
            return QCTL_USAGE;
        }
        cJSON *pobj = cJSON_Parse(pj);
        /* A scheme (the file's or --scheme) sets bits, group size, symmetry and format itself:
         * a profile's would contradict it. */
        int has_scheme = val[O_SCHEME] || cJSON_GetObjectItemCaseSensitive(spec, "scheme");
        static const char *const by_scheme[] = {"bits", "group_size", "sym", "format"};
        for (cJSON *it = pobj ? pobj->child : NULL; it; it = it->next) {
            int implied = 0;
            for (size_t k = 0; has_scheme && k < sizeof by_scheme / sizeof by_scheme[0]; k++)
                implied |= !strcmp(it->string, by_scheme[k]);
            if (!implied && !cJSON_GetObjectItemCaseSensitive(spec, it->string))
                cJSON_AddItemToObject(spec, it->string, cJSON_Duplicate(it, 1));
        }
        cJSON_Delete(pobj);
    }
    static const char *const names[] = {NULL, "model", "output", "method", "bits", "group_size",
                                        NULL, "format", "scheme", "id", "priority"};
    for (int i = O_MODEL; i <= O_PRIO; i++) {
        if (!val[i]) continue;
        if (i == O_CALIB) {
            cJSON_DeleteItemFromObjectCaseSensitive(spec, "calibration");
            cJSON *cal = cJSON_AddObjectToObject(spec, "calibration");
            cJSON_AddStringToObject(cal, "path", val[i]);
            continue;
        }
        cJSON_DeleteItemFromObjectCaseSensitive(spec, names[i]);
        char *end;
        long n = strtol(val[i], &end, 10);
        if ((i == O_BITS || i == O_GROUP || i == O_PRIO) && *val[i] && !*end) cJSON_AddNumberToObject(spec, names[i], (double)n);
        else cJSON_AddStringToObject(spec, names[i], val[i]);
    }
    char *text = cJSON_PrintUnformatted(spec);
    cJSON_Delete(spec);
    qp_job *job = NULL;
    qp_err pe = {0};
    if (!text || qp_job_parse(text, strlen(text), &job, &pe)) {
        fprintf(stderr, "quantctl: invalid job: %s\n", text ? pe.msg : "out of memory");
        free(text);
        return QCTL_USAGE;
    }
    free(text);
    char *canon = qp_job_to_json(job, 0);
    char id[QP_JOB_ID_MAX + 1];
    snprintf(id, sizeof id, "%s", job->id);
    qp_job_free(job);
    if (!canon) return QCTL_FAIL;
    if (print_only) {
        printf("%s\n", canon);
        free(canon);
        return QCTL_OK;
    }
    int rc = QCTL_FAIL;
    if (c.http) {
        int status;
        char *resp;
        if (!qctl_http(&c, "POST", "/v1/jobs", canon, &status, &resp)) {
            if (status == 202 || status == 200) { printf("%s\n", id); rc = QCTL_OK; }
            else { qctl_http_error(status, resp); rc = status == 400 ? QCTL_USAGE : QCTL_FAIL; }
            free(resp);
        }
    } else {
        qp_keys k;
        redisContext *r = NULL;
        char queue[QP_KEY_MAX];
        if (!qctl_keys(&c, &k) && !qp_key_queue(&k, queue, sizeof queue) && (r = qctl_redis(&c))) {
            redisReply *rep = redisCommand(r, "LPUSH %s %s", queue, canon);
            if (rep && rep->type == REDIS_REPLY_INTEGER) { printf("%s\n", id); rc = QCTL_OK; }
            else fprintf(stderr, "quantctl: LPUSH %s: %s\n", queue, rep ? rep->str : r->errstr);
            freeReplyObject(rep);
            redisFree(r);
        }
    }
    free(canon);
    return rc;
}
