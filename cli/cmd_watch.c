/* quantctl watch ID: follows a job's event stream until it reaches a final state. Replays
 * qjob:<id>:events from the start, then waits with XREAD BLOCK; on a terminal it redraws
 * one progress bar with the ETA, otherwise it prints one line per event. Exits 0 when the
 * job is done, 1 when it failed or was cancelled. */
#define _GNU_SOURCE
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "cli/client.h"
#include "cli/quantctl.h"
#include "proto/keys.h"
#include "proto/status.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: quantctl watch ID [--redis URL | --http URL] [--timeout S]\n"
               "  Follows the job until it finishes (a bar with ETA on a terminal, lines otherwise),\n"
               "  from the Redis event stream, or with --http from the API's Server-Sent Events.\n%s"
               "  --timeout S       give up after S seconds without an event, and wait as long for a job\n"
               "                    no daemon has taken yet (default: wait forever for events; an\n"
               "                    unknown job is refused at once)\n"
               "exit status: 0 done, 1 failed, cancelled, timed out or unreachable, 2 bad usage\n", qctl_conn_help);
}

static void show(const qp_status *st, int tty)
{
    const char *state = qp_state_name(st->state);
    if (tty) {
        int w = 30, fill = (int)(st->progress * w + 0.5);
        char bar[64];
        for (int i = 0; i < w; i++) bar[i] = i < fill ? '#' : '-';
        bar[w] = 0;
        char eta[32] = "";
        if (st->eta_s >= 0 && st->state == QP_STATE_RUNNING)
            snprintf(eta, sizeof eta, " ETA %dm%02ds", (int)st->eta_s / 60, (int)st->eta_s % 60);
        fprintf(stderr, "\r\033[K%s [%s] %5.1f%% %s %s%s", st->id ? st->id : "", bar, st->progress * 100, state,
                st->stage ? st->stage : "", eta);
        if (qp_state_is_final(st->state)) fputc('\n', stderr);
    } else {
        printf("%s state=%s progress=%.4f stage=%s block=%d/%d eta_s=%.0f%s%s\n", st->id ? st->id : "", state,
               st->progress, st->stage ? st->stage : "", st->block + 1, st->n_blocks, st->eta_s,
               st->error ? " error=" : "", st->error ? st->error : "");
        fflush(stdout);
    }
}

/* Handles one SSE "data:" payload; returns QCTL_OK or QCTL_FAIL at a final state, else -1. */
static int sse_event(const char *id, const char *data, size_t len, int tty)
{
    qp_status st;
    qp_err pe = {0};
    if (qp_status_from_event(&st, NULL, data, len, &pe)) return -1;
    show(&st, tty);
    int rc = -1;
    if (qp_state_is_final(st.state)) {
        rc = st.state == QP_STATE_DONE ? QCTL_OK : QCTL_FAIL;
        if (st.error) fprintf(stderr, "quantctl: %s %s: %s\n", id, qp_state_name(st.state), st.error);
    }
    qp_status_clear(&st);
    return rc;
}

/* Follows GET /v1/jobs/ID/events: the replay of the job's stream, then live events. */
static int watch_http(const qctl_conn *c, const char *id, long timeout_s)
{
    char path[160];
    snprintf(path, sizeof path, "/v1/jobs/%s/events", id);
    int fd = qctl_http_open(c, "GET", path, NULL);
    if (fd < 0) return QCTL_FAIL;
    int tty = isatty(STDERR_FILENO), rc = -1, in_body = 0;
    size_t len = 0, cap = 1 << 16;
    char *buf = malloc(cap), *data = NULL;
    size_t dlen = 0;
    long idle = 0;
    while (buf && rc < 0) {
        struct pollfd pf = {fd, POLLIN, 0};
        int pr = poll(&pf, 1, 1000);
        if (pr == 0) {
            if (timeout_s && ++idle >= timeout_s) { fprintf(stderr, "quantctl: no event for %ld s\n", timeout_s); rc = QCTL_FAIL; }
            continue;
        }
        if (len + 4096 > cap) {
            char *nb = cap < (1u << 24) ? realloc(buf, cap *= 2) : NULL;
            if (!nb) { fprintf(stderr, "quantctl: event stream line too long\n"); rc = QCTL_FAIL; break; }
            buf = nb;
        }
        ssize_t k = read(fd, buf + len, cap - len - 1);
        if (k <= 0) { fprintf(stderr, "quantctl: the event stream ended before the job finished\n"); rc = QCTL_FAIL; break; }
        idle = 0;
        len += (size_t)k;
        buf[len] = 0;
        char *p = buf;
        if (!in_body) {
            char *sep = strstr(buf, "\r\n\r\n");
            if (!sep) continue;
            int status = 0;
            if (sscanf(buf, "HTTP/%*s %d", &status) != 1 || status != 200) {
                qctl_http_error(status, sep + 4);
                rc = QCTL_FAIL;
                break;
            }
            in_body = 1;
            p = sep + 4;
        }
        /* SSE: "data: ..." lines (several make one payload, joined by newlines), an empty
         * line ends the event; "id:", "event:" and ":" comment lines are skipped. */
        char *nl;
        while (rc < 0 && (nl = strchr(p, '\n'))) {
            *nl = 0;
            if (nl > p && nl[-1] == '\r') nl[-1] = 0;
            if (!strncmp(p, "data:", 5)) {
                const char *v = p + 5 + (p[5] == ' ');
                size_t vl = strlen(v);
                char *nd = realloc(data, dlen + vl + 2);
                if (!nd) { rc = QCTL_FAIL; break; }
                data = nd;
                if (dlen) data[dlen++] = '\n';
                memcpy(data + dlen, v, vl);
                dlen += vl;
                data[dlen] = 0;
            } else if (!*p && dlen) {
                rc = sse_event(id, data, dlen, tty);
                dlen = 0;
            }
            p = nl + 1;
        }
        len = strlen(p);
        memmove(buf, p, len + 1);
    }
    free(buf);
    free(data);
    close(fd);
    return rc < 0 ? QCTL_FAIL : rc;
}

int cmd_watch(int argc, char **argv, const qd_runtime_opts *rt)
{
    qctl_conn c;
    qctl_conn_defaults(&c);
    long timeout_s = 0;
    static const struct option opts[] = {QCTL_CONN_OPTIONS, {"timeout", required_argument, 0, 't'},
                                         {"help", no_argument, 0, 'h'}, {0}};
    int o;
    optind = 1;
    while ((o = getopt_long(argc, argv, "t:h", opts, NULL)) != -1) {
        if (qctl_conn_option(&c, o, optarg)) continue;
        if (o == 't') timeout_s = strtol(optarg, NULL, 10);
        else if (o == 'h') { usage(stdout); return QCTL_OK; }
        else { usage(stderr); return QCTL_USAGE; }
    }
    if (optind + 1 != argc) { usage(stderr); return QCTL_USAGE; }
    const char *id = argv[optind];
    if (!qp_name_valid(id)) { fprintf(stderr, "quantctl: '%s' is not a job id\n", id); return QCTL_USAGE; }
    if (c.http) return watch_http(&c, id, timeout_s);
    qp_keys k;
    if (qctl_keys(&c, &k)) return QCTL_USAGE;
    redisContext *r = qctl_redis(&c);
    if (!r) return QCTL_FAIL;
    char hash[QP_KEY_MAX], stream[QP_KEY_MAX], last[64] = "0";
    qp_key_status(&k, id, hash, sizeof hash);
    qp_key_job_events(&k, id, stream, sizeof stream);
    /* A job pushed onto the list has no status until a daemon takes it: with --timeout,
     * wait for it as long as for an event; without, an unknown id is refused at once (a
     * typo should not hang). */
    int exists = 0;
    for (long w = 0;; w++) {
        redisReply *ex = redisCommand(r, "EXISTS %s", hash);
        exists = ex && ex->type == REDIS_REPLY_INTEGER && ex->integer;
        freeReplyObject(ex);
        if (exists || !timeout_s || w >= timeout_s) break;
        sleep(1);
    }
    if (!exists) { fprintf(stderr, "quantctl: no job '%s'\n", id); redisFree(r); return QCTL_FAIL; }
    int tty = isatty(STDERR_FILENO), rc = -1;
    long waited = 0;
    while (rc < 0) {
        /* XREAD from "0" replays everything first; BLOCK waits 1 s at a time. */
        redisReply *rep = redisCommand(r, "XREAD COUNT 100 BLOCK 1000 STREAMS %s %s", stream, last);
        if (!rep || rep->type == REDIS_REPLY_ERROR) {
            fprintf(stderr, "quantctl: Redis: %s\n", rep ? rep->str : r->errstr);
            freeReplyObject(rep);
            rc = QCTL_FAIL;
            break;
        }
        if (rep->type != REDIS_REPLY_ARRAY || !rep->elements) {
            freeReplyObject(rep);
            /* No event: the job may have finished before we looked, with its stream trimmed. */
            redisReply *s = redisCommand(r, "HGET %s state", hash);
            qp_state fs;
            if (s && s->type == REDIS_REPLY_STRING && !qp_state_parse(s->str, &fs) && qp_state_is_final(fs) &&
                !strcmp(last, "0"))
                rc = fs == QP_STATE_DONE ? QCTL_OK : QCTL_FAIL;
            freeReplyObject(s);
            if (timeout_s && ++waited >= timeout_s) { fprintf(stderr, "quantctl: no event for %ld s\n", timeout_s); rc = QCTL_FAIL; }
            continue;
        }
        waited = 0;
        const redisReply *entries = rep->element[0]->element[1];
        for (size_t i = 0; i < entries->elements && rc < 0; i++) {
            const redisReply *e = entries->element[i], *kv = e->element[1];
            snprintf(last, sizeof last, "%s", e->element[0]->str);
            for (size_t f = 0; f + 1 < kv->elements; f += 2) {
                if (strcmp(kv->element[f]->str, QP_STREAM_FIELD_EVENT)) continue;
                qp_status st;
                qp_err pe = {0};
                if (qp_status_from_event(&st, NULL, kv->element[f + 1]->str, kv->element[f + 1]->len, &pe)) continue;
                show(&st, tty);
                if (qp_state_is_final(st.state)) {
                    rc = st.state == QP_STATE_DONE ? QCTL_OK : QCTL_FAIL;
                    if (st.error) fprintf(stderr, "quantctl: %s %s: %s\n", id, qp_state_name(st.state), st.error);
                }
                qp_status_clear(&st);
            }
        }
        freeReplyObject(rep);
    }
    redisFree(r);
    return rc;
}
