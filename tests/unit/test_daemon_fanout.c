/* daemon/parts.c's bookkeeping of one fan-out, without processes or Redis:
 *   - open: every part pending, names copied (fewer than n allowed), bad arguments refused;
 *   - pending -> in flight -> done, and a report from the wrong worker, a second report, or
 *     one for a part that is not in flight changing nothing;
 *   - lead first: the lead gets a part whenever it holds none, before any helper;
 *   - the helper limit: job.workers - 1 helpers at most ("all": the node's worker count);
 *   - requeue when a helper dies: its part is pending again and goes to another worker, and
 *     the dead worker's late report changes nothing;
 *   - stragglers: with nothing pending the free lead gets a backup of the part held longest
 *     (once per part, one at a time, never in a fan-out shared with other nodes); whichever
 *     copy ends first makes it done (the other copy is the one to stop, qdd_fanout_other_copy),
 *     the other's report changes nothing; a failed backup
 *     leaves the helper's copy running; a helper dying under a backup leaves the part to the
 *     lead;
 *   - a random run of many fan-outs (finish, fail, die, reschedule) that always completes with
 *     every part done exactly once and the limits held at every step;
 *   - a fan-out shared with other nodes (qdd_fanout_apply): Redis's state of a part moves it to
 *     in flight on another node, done or failed there, or back to pending when the claim
 *     lapsed; a part in flight on this node's own worker is decided by its messages, not by
 *     Redis; other nodes' parts are not helpers of this node (the limit), and the lead
 *     still gets the pending ones. */
#include "test_util.h"

#include <stdlib.h>
#include <string.h>

#include "daemon/daemon.h"

static int count_state(const qdd_fanout *f, qdd_part_state s)
{
    int n = 0;
    for (int i = 0; i < f->n; i++) n += f->state[i] == s;
    return n;
}

static void test_open(void)
{
    const char *names[] = {"self_attn.q_proj", "", "mlp.down_proj"};
    qdd_fanout *f = NULL;
    CHECK_OK(qdd_fanout_open(&f, 7, 0, 3, "quantize", 5, names, 3));
    if (!f) return;
    CHECK_INT(f->id, 7);
    CHECK_INT(f->lead, 0);
    CHECK_INT(f->block, 3);
    CHECK_STR(f->step, "quantize");
    CHECK_INT(f->n, 5);
    CHECK_INT(count_state(f, QDD_PART_PENDING), 5);
    CHECK(f->n_done == 0 && f->n_inflight == 0);
    CHECK_STR(f->names[0], "self_attn.q_proj");
    CHECK(f->names[1] == NULL);   /* an empty name is no name */
    CHECK_STR(f->names[2], "mlp.down_proj");
    CHECK(f->names[3] == NULL && f->names[4] == NULL);
    CHECK(names[0] != f->names[0]);   /* a copy */
    for (int i = 0; i < 5; i++) CHECK_INT(f->worker[i], -1);
    CHECK(!qdd_fanout_complete(f));
    CHECK_INT(qdd_fanout_held_by(f, 0), -1);
    CHECK_INT(qdd_fanout_helpers(f), 0);
    qdd_fanout_free(f);
    qdd_fanout_free(NULL);

    qdd_fanout *g = (qdd_fanout *)1;
    CHECK_INT(qdd_fanout_open(&g, 1, 0, 0, "quantize", 0, NULL, 0), QD_EINVAL);
    CHECK(g == NULL);
    CHECK_INT(qdd_fanout_open(&g, 1, 0, 0, "quantize", QP_PARTS_MAX + 1, NULL, 0), QD_EINVAL);
    CHECK_INT(qdd_fanout_open(&g, 1, 0, 0, "quantize", 2, names, 3), QD_EINVAL);   /* more names than parts */
    CHECK_INT(qdd_fanout_open(&g, 1, 0, 0, "a-step-name-that-is-too-long", 2, NULL, 0), QD_EINVAL);
    CHECK_INT(qdd_fanout_open(&g, 1, 0, 0, NULL, 2, NULL, 0), QD_EINVAL);
    CHECK_OK(qdd_fanout_open(&g, 1, 0, 0, "quantize", QP_PARTS_MAX, NULL, 0));
    qdd_fanout_free(g);
}

static void test_transitions(void)
{
    qdd_fanout *f = NULL;
    CHECK_OK(qdd_fanout_open(&f, 1, 0, 0, "quantize", 3, NULL, 0));
    if (!f) return;
    qdd_fanout_start(f, 1, 2);
    CHECK_INT(f->state[1], QDD_PART_INFLIGHT);
    CHECK_INT(f->worker[1], 2);
    CHECK_INT(f->n_inflight, 1);
    CHECK_INT(qdd_fanout_held_by(f, 2), 1);
    CHECK_INT(qdd_fanout_helpers(f), 1);
    qdd_fanout_start(f, 1, 3);              /* not pending: nothing changes */
    CHECK_INT(f->worker[1], 2);
    CHECK_INT(f->n_inflight, 1);
    qdd_fanout_start(f, 3, 3);              /* out of range */
    qdd_fanout_start(f, -1, 3);
    CHECK_INT(f->n_inflight, 1);
    CHECK_INT(qdd_fanout_finish(f, 1, 3), 0);   /* the wrong worker */
    CHECK_INT(qdd_fanout_finish(f, 0, 2), 0);   /* a pending part */
    CHECK_INT(qdd_fanout_finish(f, 7, 2), 0);
    CHECK_INT(qdd_fanout_finish(f, 1, 2), 1);
    CHECK_INT(f->state[1], QDD_PART_DONE);
    CHECK_INT(f->worker[1], -1);
    CHECK(f->n_done == 1 && f->n_inflight == 0);
    CHECK_INT(qdd_fanout_finish(f, 1, 2), 0);   /* twice */
    CHECK_INT(f->n_done, 1);
    qdd_fanout_start(f, 1, 2);              /* done stays done */
    CHECK_INT(f->state[1], QDD_PART_DONE);
    qdd_fanout_start(f, 0, 0);
    qdd_fanout_start(f, 2, 1);
    CHECK_INT(qdd_fanout_helpers(f), 1);    /* the lead (0) is no helper */
    CHECK(qdd_fanout_finish(f, 0, 0) && qdd_fanout_finish(f, 2, 1));
    CHECK(qdd_fanout_complete(f));
    qdd_fanout_free(f);
}

static void test_lead_first_and_limit(void)
{
    qdd_fanout *f = NULL;
    CHECK_OK(qdd_fanout_open(&f, 1, 2, 0, "quantize", 8, NULL, 0));
    if (!f) return;
    int idle[] = {0, 1, 2, 3, 4};   /* the lead (2) among them is skipped */
    qdd_part_grant g[8];
    /* workers 1: the lead alone, one part. */
    int n = qdd_fanout_plan(f, 1, 1, idle, 5, g, 8);
    CHECK_INT(n, 1);
    CHECK(g[0].worker == 2 && g[0].index == 0);
    /* workers 3: the lead first, then two helpers, in the order given, parts in order. */
    n = qdd_fanout_plan(f, 1, 3, idle, 5, g, 8);
    CHECK_INT(n, 3);
    CHECK(g[0].worker == 2 && g[0].index == 0);
    CHECK(g[1].worker == 0 && g[1].index == 1);
    CHECK(g[2].worker == 1 && g[2].index == 2);
    /* "all" of 5 workers: the lead and 4 helpers. */
    n = qdd_fanout_plan(f, 1, 5, idle, 5, g, 8);
    CHECK_INT(n, 5);
    /* The lead busy (lead_free 0): helpers only. */
    n = qdd_fanout_plan(f, 0, 3, idle, 5, g, 8);
    CHECK_INT(n, 2);
    CHECK(g[0].worker == 0 && g[0].index == 0);
    /* cap */
    CHECK_INT(qdd_fanout_plan(f, 1, 5, idle, 5, g, 2), 2);

    /* Hand out the lead's part and two helpers'; the limit then holds until one finishes. */
    qdd_fanout_start(f, 0, 2);
    qdd_fanout_start(f, 1, 0);
    qdd_fanout_start(f, 2, 1);
    int idle2[] = {3, 4};
    CHECK_INT(qdd_fanout_plan(f, 1, 3, idle2, 2, g, 8), 0);   /* 2 helpers = workers - 1; lead holds one */
    CHECK(qdd_fanout_finish(f, 1, 0));
    n = qdd_fanout_plan(f, 1, 3, idle2, 2, g, 8);
    CHECK_INT(n, 1);
    CHECK(g[0].worker == 3 && g[0].index == 3);
    /* The lead finishes its part: it gets the next pending one before anyone else. */
    CHECK(qdd_fanout_finish(f, 0, 2));
    n = qdd_fanout_plan(f, 1, 3, idle2, 2, g, 8);
    CHECK_INT(n, 2);
    CHECK(g[0].worker == 2 && g[0].index == 3);
    CHECK(g[1].worker == 3 && g[1].index == 4);
    /* An idle worker that somehow still holds a part (its report not in yet) gets none. */
    qdd_fanout_start(f, 3, 3);
    n = qdd_fanout_plan(f, 0, 8, idle2, 2, g, 8);
    CHECK_INT(n, 1);
    CHECK(g[0].worker == 4);
    qdd_fanout_free(f);
}

static void test_requeue(void)
{
    qdd_fanout *f = NULL;
    CHECK_OK(qdd_fanout_open(&f, 1, 0, 5, "quantize", 2, NULL, 0));
    if (!f) return;
    qdd_fanout_start(f, 0, 0);
    qdd_fanout_start(f, 1, 1);
    CHECK_INT(qdd_fanout_requeue(f, 3), -1);   /* holds nothing */
    CHECK_INT(qdd_fanout_requeue(f, 1), 1);    /* helper 1 died */
    CHECK_INT(f->state[1], QDD_PART_PENDING);
    CHECK_INT(f->n_inflight, 1);
    CHECK_INT(qdd_fanout_helpers(f), 0);
    int idle[] = {2};
    qdd_part_grant g[4];
    CHECK_INT(qdd_fanout_plan(f, 1, 3, idle, 1, g, 4), 1);
    CHECK(g[0].worker == 2 && g[0].index == 1);
    qdd_fanout_start(f, 1, 2);
    CHECK_INT(qdd_fanout_finish(f, 1, 1), 0);  /* the dead worker's late report */
    CHECK(qdd_fanout_finish(f, 1, 2) && qdd_fanout_finish(f, 0, 0));
    CHECK(qdd_fanout_complete(f));
    qdd_fanout_free(f);
}

/* Many fan-outs driven at random as the daemon would: plan, start, then finish, fail or kill
 * in-flight parts. Each ends complete with every part done once; the helpers never exceed
 * the limit; the lead holds a part whenever one is pending after a round. */
static void test_backup(void)
{
    qdd_fanout *f = NULL;
    CHECK_OK(qdd_fanout_open(&f, 1, 0, 2, "quantize", 4, NULL, 0));
    if (!f) return;
    int idle[] = {1, 2};
    qdd_part_grant g[4];
    f->now_ms = 1000;
    CHECK_INT(qdd_fanout_plan(f, 1, 3, idle, 2, g, 4), 3);
    for (int k = 0; k < 3; k++) CHECK(!g[k].backup);
    qdd_fanout_start(f, 0, 0);
    qdd_fanout_start(f, 1, 1);   /* handed out before part 2: held longest */
    f->now_ms = 1010;
    qdd_fanout_start(f, 2, 2);
    f->now_ms = 1100;
    CHECK(qdd_fanout_finish(f, 0, 0));   /* 100 ms */
    /* Part 3 pending: the lead takes it, no backup. */
    CHECK_INT(qdd_fanout_plan(f, 1, 3, NULL, 0, g, 4), 1);
    CHECK(g[0].worker == 0 && g[0].index == 3 && !g[0].backup);
    qdd_fanout_start(f, 3, 0);
    f->now_ms = 1150;
    CHECK(qdd_fanout_finish(f, 3, 0));   /* 50 ms: the longest done stays 100 */
    CHECK_INT(f->done_max_ms, 100);
    /* Nothing pending, but the helpers' parts are not yet twice the longest done part old. */
    CHECK_INT(qdd_fanout_plan(f, 1, 3, NULL, 0, g, 4), 0);
    f->now_ms = 1200;   /* part 1 200 ms old: not over */
    CHECK_INT(qdd_fanout_plan(f, 1, 3, NULL, 0, g, 4), 0);
    /* Both over: a backup of the part held longest (1, not 2); not while the lead is busy. */
    f->now_ms = 1300;
    CHECK_INT(qdd_fanout_plan(f, 0, 3, NULL, 0, g, 4), 0);
    CHECK_INT(qdd_fanout_plan(f, 1, 3, NULL, 0, g, 4), 1);
    CHECK(g[0].worker == 0 && g[0].index == 1 && g[0].backup);
    qdd_fanout_backup_start(f, 1);
    CHECK_INT(f->backup, 1);
    CHECK_INT(qdd_fanout_plan(f, 1, 3, NULL, 0, g, 4), 0);   /* one backup at a time */
    CHECK_INT(qdd_fanout_helpers(f), 2);                     /* the helpers still hold theirs */
    /* Each copy's other: the helper's for the lead's, the lead's for the helper's; none for
     * a part without a backup, or for a worker that holds no copy. */
    CHECK_INT(qdd_fanout_other_copy(f, 1, 0), 1);
    CHECK_INT(qdd_fanout_other_copy(f, 1, 1), 0);
    CHECK_INT(qdd_fanout_other_copy(f, 2, 2), -1);
    CHECK_INT(qdd_fanout_other_copy(f, 1, 2), -1);
    CHECK_INT(qdd_fanout_other_copy(f, 9, 0), -1);
    /* The lead's copy ends first: the part is done, the helper's report is late. */
    CHECK_INT(qdd_fanout_finish(f, 1, 0), 1);
    CHECK_INT(f->backup, -1);
    CHECK_INT(qdd_fanout_other_copy(f, 1, 1), -1);   /* done: nothing more to stop */
    CHECK_INT(qdd_fanout_finish(f, 1, 1), 0);
    /* Next: a backup of part 2; its helper ends first, the lead's copy reports late. */
    CHECK_INT(qdd_fanout_plan(f, 1, 3, NULL, 0, g, 4), 1);
    CHECK(g[0].index == 2 && g[0].backup);
    qdd_fanout_backup_start(f, 2);
    CHECK_INT(qdd_fanout_other_copy(f, 2, 2), 0);   /* the lead's copy is the one to stop */
    CHECK_INT(qdd_fanout_finish(f, 2, 2), 1);
    CHECK_INT(f->backup, -1);
    CHECK(qdd_fanout_complete(f));
    CHECK_INT(qdd_fanout_finish(f, 2, 0), 0);
    CHECK_INT(f->n_done, 4);
    qdd_fanout_free(f);

    /* No part done yet: nothing to measure a straggler by, no backup. A part is backed up
     * once; a failed backup leaves the helper's copy running; a helper that dies under a
     * backup leaves the part to the lead (in flight, not pending). */
    CHECK_OK(qdd_fanout_open(&f, 2, 0, 2, "quantize", 3, NULL, 0));
    if (!f) return;
    qdd_fanout_start(f, 0, 1);
    qdd_fanout_start(f, 1, 2);
    qdd_fanout_start(f, 2, 3);
    f->now_ms = 5000;
    CHECK_INT(qdd_fanout_plan(f, 1, 4, NULL, 0, g, 4), 0);
    CHECK(qdd_fanout_finish(f, 2, 3));   /* done in 5 s: the others not yet over 10 s */
    CHECK_INT(qdd_fanout_plan(f, 1, 4, NULL, 0, g, 4), 0);
    f->now_ms = 10001;
    CHECK_INT(qdd_fanout_plan(f, 1, 3, NULL, 0, g, 4), 1);
    CHECK(g[0].index == 0 && g[0].backup);
    qdd_fanout_backup_start(f, 0);
    qdd_fanout_backup_failed(f, 0);
    CHECK_INT(f->backup, -1);
    CHECK_INT(f->state[0], QDD_PART_INFLIGHT);
    CHECK_INT(qdd_fanout_plan(f, 1, 3, NULL, 0, g, 4), 1);
    CHECK(g[0].index == 1 && g[0].backup);                   /* not part 0 again */
    qdd_fanout_backup_start(f, 1);
    CHECK_INT(qdd_fanout_requeue(f, 2), 1);                  /* part 1's helper died */
    CHECK(f->state[1] == QDD_PART_INFLIGHT && f->worker[1] == 0 && f->backup == -1);
    CHECK_INT(qdd_fanout_plan(f, 1, 3, NULL, 0, g, 4), 0);   /* the lead holds part 1 */
    CHECK_INT(qdd_fanout_finish(f, 1, 0), 1);
    CHECK_INT(qdd_fanout_finish(f, 0, 1), 1);
    CHECK(qdd_fanout_complete(f));
    qdd_fanout_free(f);

    /* A fan-out shared with other nodes: no backups (a claim runs a part once). */
    CHECK_OK(qdd_fanout_open(&f, 3, 0, 2, "quantize", 2, NULL, 0));
    if (!f) return;
    f->shared = 1;
    qdd_fanout_start(f, 0, 1);
    qdd_fanout_start(f, 1, 0);
    f->now_ms = 10;
    CHECK(qdd_fanout_finish(f, 1, 0));
    f->now_ms = 1000;
    CHECK_INT(qdd_fanout_plan(f, 1, 3, NULL, 0, g, 4), 0);
    f->shared = 0;   /* the same fan-out unshared: the backup comes */
    CHECK_INT(qdd_fanout_plan(f, 1, 3, NULL, 0, g, 4), 1);
    qdd_fanout_free(f);
}

static void test_random_runs(void)
{
    test_rng r;
    test_rng_seed(&r, 4242);
    int total_backups = 0;
    for (int run = 0; run < 300; run++) {
        int n_workers = 1 + (int)(test_rng_u64(&r) % 6), n = 1 + (int)(test_rng_u64(&r) % 40);
        int lead = (int)(test_rng_u64(&r) % (uint64_t)n_workers);
        int limit = test_rng_u64(&r) % 3 ? 1 + (int)(test_rng_u64(&r) % 6) : n_workers;   /* job.workers */
        qdd_fanout *f = NULL;
        CHECK_OK(qdd_fanout_open(&f, (uint64_t)run + 1, lead, 0, "quantize", n, NULL, 0));
        if (!f) return;
        int done_count[40] = {0}, backups[40] = {0}, rounds = 0;
        int lead_copy = -1;   /* the part the lead runs as a backup (it may have lost already) */
        while ((!qdd_fanout_complete(f) || lead_copy >= 0) && rounds++ < 10000) {
            f->now_ms += test_rng_u64(&r) % 50;
            int idle[8], n_idle = 0;
            for (int k = 0; k < n_workers; k++)
                if (k != lead && qdd_fanout_held_by(f, k) < 0) idle[n_idle++] = k;
            qdd_part_grant g[8];
            int ng = qdd_fanout_plan(f, lead_copy < 0, limit, idle, n_idle, g, 8);
            int pending = 0;
            for (int i = 0; i < n; i++) pending += f->state[i] == QDD_PART_PENDING;
            for (int k = 0; k < ng; k++) {
                if (!g[k].backup) {
                    qdd_fanout_start(f, g[k].index, g[k].worker);
                    continue;
                }
                if (g[k].worker != lead || pending || f->worker[g[k].index] == lead || backups[g[k].index]++)
                    TEST_FAIL_("run %d: a backup of part %d for worker %d (%d pending, its %d backup)", run, g[k].index,
                               g[k].worker, pending, backups[g[k].index]);
                test_checks++;
                qdd_fanout_backup_start(f, g[k].index);
                lead_copy = g[k].index;
                total_backups++;
            }
            if (qdd_fanout_helpers(f) > limit - 1) TEST_FAIL_("run %d: %d helpers over the limit %d", run, qdd_fanout_helpers(f), limit);
            test_checks++;
            pending = 0;
            for (int i = 0; i < n; i++) pending += f->state[i] == QDD_PART_PENDING;
            if (qdd_fanout_held_by(f, lead) < 0 && lead_copy < 0 && pending)
                TEST_FAIL_("run %d: parts pending but the lead holds none", run);
            test_checks++;
            /* Something happens to one part in flight, or to the lead's copy. */
            int in[48], n_in = 0;
            for (int i = 0; i < n; i++) if (f->state[i] == QDD_PART_INFLIGHT) in[n_in++] = i;
            if (lead_copy >= 0) in[n_in++] = -1;
            if (!n_in) continue;
            int pick = in[test_rng_u64(&r) % (uint64_t)n_in];
            if (pick < 0) {
                if (test_rng_u64(&r) % 5 == 0 && f->state[lead_copy] == QDD_PART_INFLIGHT) {
                    qdd_fanout_backup_failed(f, lead_copy);   /* the helper's copy goes on */
                } else {
                    int won = f->state[lead_copy] == QDD_PART_INFLIGHT;
                    CHECK_INT(qdd_fanout_finish(f, lead_copy, lead), won);
                    done_count[lead_copy] += won;
                }
                lead_copy = -1;
                continue;
            }
            int i = pick, w = f->worker[i];
            if (w != lead && test_rng_u64(&r) % 5 == 0) {
                CHECK_INT(qdd_fanout_requeue(f, w), i);   /* its worker died */
                if (i == lead_copy) {
                    /* The lead's copy is the part now, in flight on the lead. */
                    CHECK(f->state[i] == QDD_PART_INFLIGHT && f->worker[i] == lead);
                    lead_copy = -1;
                }
            } else {
                CHECK_INT(qdd_fanout_finish(f, i, w), 1);   /* done, ok or failed alike */
                done_count[i]++;
            }
        }
        CHECK(qdd_fanout_complete(f));
        for (int i = 0; i < n; i++) CHECK_INT(done_count[i], 1);
        CHECK_INT(f->n_inflight, 0);
        CHECK_INT(f->backup, -1);
        qdd_fanout_free(f);
    }
    CHECK(total_backups > 0);   /* the runs went through backups too */
}

static void test_apply(void)
{
    qdd_fanout *f = NULL;
    CHECK_OK(qdd_fanout_open(&f, 1, 0, 2, "quantize", 4, NULL, 0));
    /* Another node claims part 1: in flight there, with its holder; not a helper here. */
    CHECK_INT(qdd_fanout_apply(f, 1, "run n2/cpu-0 1700000000000", "n1"), QDD_APPLY_REMOTE);
    CHECK_INT(f->state[1], QDD_PART_INFLIGHT);
    CHECK_INT(f->worker[1], QDD_PART_REMOTE);
    CHECK_STR(f->holder[1], "n2/cpu-0");
    CHECK_INT(f->n_inflight, 1);
    CHECK_INT(f->n_remote, 1);
    CHECK_INT(qdd_fanout_helpers(f), 0);
    /* The same state again changes nothing. */
    CHECK_INT(qdd_fanout_apply(f, 1, "run n2/cpu-0 1700000000500", "n1"), QDD_APPLY_NONE);
    CHECK_INT(f->n_inflight, 1);
    /* The plan skips it: the lead gets part 0, a helper part 2 (limit 2: one helper). */
    int idle[2] = {1, 2};
    qdd_part_grant g[4];
    CHECK_INT(qdd_fanout_plan(f, 1, 2, idle, 2, g, 4), 2);
    CHECK_INT(g[0].worker, 0); CHECK_INT(g[0].index, 0);
    CHECK_INT(g[1].worker, 1); CHECK_INT(g[1].index, 2);
    qdd_fanout_start(f, 0, 0);
    qdd_fanout_start(f, 2, 1);
    /* A part in flight on this node's own worker: Redis's view of it changes nothing. */
    CHECK_INT(qdd_fanout_apply(f, 2, "run n1/cpu-1 1700000000000", "n1"), QDD_APPLY_NONE);
    CHECK_INT(qdd_fanout_apply(f, 2, "expired n1/cpu-1", "n1"), QDD_APPLY_NONE);
    CHECK_INT(f->worker[2], 1);
    /* A node named like a prefix of ours is another node. */
    CHECK_INT(qdd_fanout_apply(f, 3, "run n1x/cpu-0 1", "n1"), QDD_APPLY_REMOTE);
    CHECK_INT(f->n_remote, 2);
    /* Its claim lapsed: pending again, then done by another node. */
    CHECK_INT(qdd_fanout_apply(f, 3, "expired n1x/cpu-0", "n1"), QDD_APPLY_REQUEUED);
    CHECK_INT(f->state[3], QDD_PART_PENDING);
    CHECK_INT(f->n_remote, 1);
    CHECK_INT(qdd_fanout_apply(f, 3, "expired n1x/cpu-0", "n1"), QDD_APPLY_NONE);   /* already pending */
    CHECK_INT(qdd_fanout_apply(f, 3, "done n3/cpu-4", "n1"), QDD_APPLY_DONE);        /* pending -> done */
    CHECK_STR(f->holder[3], "n3/cpu-4");
    CHECK_INT(qdd_fanout_apply(f, 1, "failed n2/cpu-0", "n1"), QDD_APPLY_FAILED);
    CHECK_INT(f->n_remote, 0);
    CHECK_INT(f->n_done, 2);
    /* Done is final: nothing moves it back. */
    CHECK_INT(qdd_fanout_apply(f, 1, "run n2/cpu-1 1", "n1"), QDD_APPLY_NONE);
    CHECK_INT(qdd_fanout_apply(f, 1, "expired n2/cpu-1", "n1"), QDD_APPLY_NONE);
    CHECK_INT(f->state[1], QDD_PART_DONE);
    /* Nonsense and out-of-range parts change nothing. */
    CHECK_INT(qdd_fanout_apply(f, 9, "done n2/cpu-0", "n1"), QDD_APPLY_NONE);
    CHECK_INT(qdd_fanout_apply(f, -1, "done n2/cpu-0", "n1"), QDD_APPLY_NONE);
    CHECK_INT(qdd_fanout_apply(f, 0, "bogus", "n1"), QDD_APPLY_NONE);
    CHECK_INT(qdd_fanout_apply(f, 0, "done", "n1"), QDD_APPLY_NONE);
    CHECK(qdd_fanout_finish(f, 0, 0));
    CHECK(qdd_fanout_finish(f, 2, 1));
    CHECK(qdd_fanout_complete(f));
    CHECK_INT(f->n_inflight, 0);
    qdd_fanout_free(f);

    /* A claim of a worker of ours that died (the part pending here, Redis still says ours) is
     * another holder until it lapses. */
    CHECK_OK(qdd_fanout_open(&f, 2, 0, 0, "quantize", 2, NULL, 0));
    CHECK_INT(qdd_fanout_apply(f, 1, "run n1/cpu-3 1", "n1"), QDD_APPLY_REMOTE);
    CHECK_INT(qdd_fanout_apply(f, 1, "expired n1/cpu-3", "n1"), QDD_APPLY_REQUEUED);
    CHECK_INT(f->state[1], QDD_PART_PENDING);
    CHECK_INT(f->n_inflight, 0);
    qdd_fanout_free(f);
}

int main(void)
{
    TEST_RUN(test_open);
    TEST_RUN(test_transitions);
    TEST_RUN(test_lead_first_and_limit);
    TEST_RUN(test_requeue);
    TEST_RUN(test_backup);
    TEST_RUN(test_random_runs);
    TEST_RUN(test_apply);
    return test_finish();
}
