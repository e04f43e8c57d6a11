/* One daemon per node name (issue #33). The node key names the daemon that owns a node's
 * processing list: two daemons started with the same --node used to start silently, and each
 * reconnect handed the other's jobs back to the queue. Now the key holds a token of the
 * daemon (start time, pid, 64 random bits) with the node TTL; the claim script takes it only
 * when it is free or already ours, and the heartbeat refreshes it only while it is ours.
 *
 * A daemon that finds another token waits and watches its TTL (each tick): when it rises the
 * holder refreshed it, so a live daemon runs as this node and this one refuses to start
 * (node_in_use, exit status QDD_EXIT_NODE_IN_USE, 3, which systemd/quantd.service lists in
 * RestartPreventExitStatus so a misconfigured second daemon is not restarted every few
 * seconds), within about a third of the TTL; when the key expires its
 * holder died without releasing it (kill -9, a crash, a lost host) and this daemon takes the
 * node over, within the TTL. A key without a TTL (set by hand) is refused at once, since it
 * would never expire. A daemon whose own key is found holding another token (it could not
 * refresh it for a whole TTL, and another daemon took the node over) stops with exit status 1.
 *
 * Callbacks get the daemon as their private data: it outlives every reply (the loop ends
 * before it is freed, and a closing connection answers what is pending with NULL). */
#define _GNU_SOURCE
#include "daemon/daemon.h"

#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "quant/core/clock.h"
#include "quant/core/log.h"

#define CLAIM_CMD "EVAL node_claim"

static void ensure_token(qdd_daemon *d)
{
    if (d->node_token[0]) return;
    unsigned long long r = 0;
    if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r)
        r = (qd_clock_now_ms() * 0x9E3779B97F4A7C15ull) ^ ((unsigned long long)getpid() << 32);
    snprintf(d->node_token, sizeof d->node_token, "%lld:%d:%016llx", (long long)d->start_ms, (int)getpid(), r);
}

static int send_claim(qdd_daemon *d, redisCallbackFn *cb)
{
    ensure_token(d);
    char nkey[QP_KEY_MAX], nodes[QP_KEY_MAX], ttl[32];
    if (qp_key_node(&d->keys, d->node, nkey, sizeof nkey) || qp_key_nodes(&d->keys, nodes, sizeof nodes)) return -1;
    snprintf(ttl, sizeof ttl, "%lld", (long long)d->cfg->node_ttl_ms);
    const char *argv[8] = {"EVAL", qdd_lua_node_claim, "2", nkey, nodes, d->node_token, ttl, d->node};
    size_t lens[8];
    for (int i = 0; i < 8; i++) lens[i] = strlen(argv[i]);
    return qdd_rconn_cmdv(&d->cmd, cb, d, 8, argv, lens);
}

/* The claim's reply: {1, existed} or {0, holder, pttl}; 0 when it has that shape. */
static int parse_claim(const redisReply *r, int *ours, const char **holder, long long *pttl)
{
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 2 || r->element[0]->type != REDIS_REPLY_INTEGER) return -1;
    *ours = r->element[0]->integer == 1;
    if (*ours) return 0;
    if (r->elements < 3 || r->element[1]->type != REDIS_REPLY_STRING || r->element[2]->type != REDIS_REPLY_INTEGER)
        return -1;
    *holder = r->element[1]->str;
    *pttl = r->element[2]->integer;
    return 0;
}

/* Another daemon has taken over this node while we held it. */
static void node_lost(qdd_daemon *d, const char *holder)
{
    if (d->node_state == QDD_NODE_LOST) return;
    d->node_state = QDD_NODE_LOST;
    QD_LOG(QD_LOG_ERROR, "node_lost",
           "node=%s holder=\"%s\" (the node key was not refreshed for node-ttl-ms and another daemon took this node "
           "over; stopping, exit status 1)",
           d->node, holder);
    qdd_daemon_stop(d, 1, "reason=node_lost");
}

static void refuse(qdd_daemon *d, const char *holder, const char *how)
{
    d->node_state = QDD_NODE_REFUSED;
    QD_LOG(QD_LOG_ERROR, "node_in_use",
           "node=%s holder=\"%s\" (%s: another daemon runs as this node; refusing to start, exit status %d; give "
           "each daemon its own --node)",
           d->node, holder, how, QDD_EXIT_NODE_IN_USE);
    qdd_daemon_stop(d, QDD_EXIT_NODE_IN_USE, "reason=node_in_use");
}

static void held_by_other(qdd_daemon *d, const char *holder, long long pttl)
{
    if (d->node_state == QDD_NODE_OWNED) { node_lost(d, holder); return; }
    if (pttl < 0) { refuse(d, holder, "its key has no TTL, so it never expires"); return; }
    if (d->node_state == QDD_NODE_WAITING) {
        /* Without a refresh the TTL only falls; a higher one, or another token, means a
         * live daemon wrote it since the last look. */
        if (strcmp(holder, d->node_holder)) refuse(d, holder, "the key changed hands while this daemon waited");
        else if (pttl > d->node_holder_pttl) refuse(d, holder, "its holder refreshed the key");
        else d->node_holder_pttl = pttl;
        return;
    }
    d->node_state = QDD_NODE_WAITING;
    snprintf(d->node_holder, sizeof d->node_holder, "%s", holder);
    d->node_holder_pttl = pttl;
    QD_LOG(QD_LOG_WARN, "node_in_use",
           "node=%s holder=\"%s\" ttl_ms=%lld (waiting: if its holder refreshes the key this daemon refuses to start; "
           "if the key expires, its holder died and this daemon takes the node over)",
           d->node, holder, pttl);
}

static void on_claim(redisAsyncContext *ac, void *r, void *pd)
{
    qdd_daemon *d = pd;
    redisReply *reply = r;
    d->node_claim_inflight = 0;
    if (!reply || d->stopping) return;   /* no reply: cmd went down, and claims again when up */
    int ours = 0;
    const char *holder = "";
    long long pttl = 0;
    if (reply->type == REDIS_REPLY_ERROR || parse_claim(reply, &ours, &holder, &pttl)) {
        int delay = qdd_rerr_fail(&d->rerr_node, "node", CLAIM_CMD,
                                  reply->type == REDIS_REPLY_ERROR ? reply->str : "unexpected reply");
        d->node_retry_at_ms = uv_now(d->loop) + (uint64_t)delay;
        return;
    }
    qdd_rerr_ok(&d->rerr_node, NULL);
    if (!ours) { held_by_other(d, holder, pttl); return; }
    if (d->node_state == QDD_NODE_WAITING)
        QD_LOG(QD_LOG_WARN, "node_taken_over", "node=%s previous=\"%s\" (its key expired or was released)", d->node,
               d->node_holder);
    else if (d->node_state == QDD_NODE_UNCLAIMED)
        QD_LOG(QD_LOG_INFO, "node_claimed", "node=%s ttl_ms=%lld", d->node, (long long)d->cfg->node_ttl_ms);
    d->node_state = QDD_NODE_OWNED;
    d->node_holder[0] = 0;
    qdd_daemon_node_owned(d);
}

void qdd_node_claim(qdd_daemon *d)
{
    if (d->node_claim_inflight || d->node_state >= QDD_NODE_REFUSED || d->stopping) return;
    if (send_claim(d, on_claim) == 0) d->node_claim_inflight = 1;
}

void qdd_node_tick(qdd_daemon *d)
{
    if (d->node_state == QDD_NODE_OWNED || !d->cmd.up) return;
    if (uv_now(d->loop) < d->node_retry_at_ms) return;
    qdd_node_claim(d);
}

static void on_refresh(redisAsyncContext *ac, void *r, void *pd)
{
    qdd_daemon *d = pd;
    redisReply *reply = r;
    if (!reply) return;
    int ours = 0;
    const char *holder = "";
    long long pttl = 0;
    if (reply->type == REDIS_REPLY_ERROR || parse_claim(reply, &ours, &holder, &pttl)) {
        /* The heartbeat runs every third of the TTL anyway: logged once, no faster retry. */
        qdd_rerr_fail(&d->rerr_node, "node", CLAIM_CMD, reply->type == REDIS_REPLY_ERROR ? reply->str : "unexpected reply");
        return;
    }
    qdd_rerr_ok(&d->rerr_node, NULL);
    if (!ours && d->node_state == QDD_NODE_OWNED) node_lost(d, holder);
}

void qdd_node_heartbeat(qdd_daemon *d)
{
    if (d->node_state >= QDD_NODE_REFUSED) return;
    send_claim(d, on_refresh);
}

static void on_release(redisAsyncContext *ac, void *r, void *pd)
{
    qdd_daemon *d = pd;
    redisReply *reply = r;
    if (reply && reply->type == REDIS_REPLY_INTEGER && reply->integer == 1)
        QD_LOG(QD_LOG_INFO, "node_released", "node=%s", d->node);
    else if (reply && reply->type == REDIS_REPLY_ERROR)
        QD_LOG(QD_LOG_WARN, "node_release_failed", "node=%s err=\"%s\" (the key expires after node-ttl-ms)", d->node,
               reply->str);
}

void qdd_node_release(qdd_daemon *d)
{
    if (d->node_state != QDD_NODE_OWNED || !d->cmd.up) return;
    char nkey[QP_KEY_MAX];
    if (qp_key_node(&d->keys, d->node, nkey, sizeof nkey)) return;
    const char *argv[5] = {"EVAL", qdd_lua_node_release, "1", nkey, d->node_token};
    size_t lens[5];
    for (int i = 0; i < 5; i++) lens[i] = strlen(argv[i]);
    if (qdd_rconn_cmdv(&d->cmd, on_release, d, 5, argv, lens) == 0) d->node_state = QDD_NODE_UNCLAIMED;
}
