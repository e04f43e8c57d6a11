/* daemon/rerr.c: a Redis error reply that keeps coming back (issue #33, item 7).
 *   - the delays follow the connection backoff: 100, 200, 400 ... capped at 5000 ms, and
 *     start again from 100 after a success;
 *   - 1000 identical replies make one log line; a different error makes one more, carrying
 *     the count of repeats of the previous one; clearing makes one more with its count;
 *   - a success of another command (BLMOVE after the take script failed) does not clear it;
 *   - the reason for /readyz names the command and the error. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/rconn.h"
#include "daemon/rerr.h"
#include "test_util.h"

static char captured[16384];

/* Runs fn with stderr going to a file, then reads what it wrote into captured. */
static void capture(void (*fn)(void *), void *arg)
{
    char path[1100];
    snprintf(path, sizeof path, "%s/stderr.txt", test_tmpdir());
    fflush(stderr);
    int saved = dup(2);
    FILE *f = fopen(path, "w+");
    if (!f || saved < 0) { captured[0] = 0; return; }
    dup2(fileno(f), 2);
    fn(arg);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(f);
    size_t n = fread(captured, 1, sizeof captured - 1, f);
    captured[n] = 0;
    fclose(f);
}

static int lines_with(const char *needle)
{
    int n = 0;
    for (const char *p = captured; (p = strstr(p, needle)); p++) n++;
    return n;
}

static void test_backoff(void)
{
    qdd_rerr e;
    memset(&e, 0, sizeof e);
    int want = QDD_BACKOFF_MIN_MS;
    for (int i = 0; i < 12; i++) {
        CHECK_INT(qdd_rerr_fail(&e, "queue", "BLMOVE", "WRONGTYPE x"), want);
        want = want * 2 > QDD_BACKOFF_MAX_MS ? QDD_BACKOFF_MAX_MS : want * 2;
    }
    CHECK_INT(e.total, 12);
    CHECK_INT(e.repeats, 11);
    CHECK_INT(qdd_rerr_ok(&e, "BLMOVE"), 1);
    CHECK_INT(qdd_rerr_fail(&e, "queue", "BLMOVE", "WRONGTYPE x"), QDD_BACKOFF_MIN_MS);
}

static void many_errors(void *arg)
{
    qdd_rerr *e = arg;
    for (int i = 0; i < 1000; i++) qdd_rerr_fail(e, "queue", "BLMOVE", "WRONGTYPE Operation against a key");
    for (int i = 0; i < 5; i++) qdd_rerr_fail(e, "queue", "EVAL take", "NOPERM no\nfake=1");
    qdd_rerr_ok(e, "BLMOVE");       /* not the failing command: still failing */
    qdd_rerr_ok(e, NULL);
    qdd_rerr_ok(e, NULL);           /* nothing to clear */
}

static void test_logged_once_per_change(void)
{
    qdd_rerr e;
    memset(&e, 0, sizeof e);
    capture(many_errors, &e);
    CHECK_INT(lines_with("\n"), 3);
    CHECK_INT(lines_with("ERROR queue_error cmd=BLMOVE err=\"WRONGTYPE Operation against a key\""), 1);
    CHECK_INT(lines_with("ERROR queue_error cmd=EVAL take err=\"NOPERM no\\nfake=1\""), 1);
    CHECK_INT(lines_with("previous_cmd=BLMOVE previous=\"WRONGTYPE Operation against a key\" repeated=999"), 1);
    CHECK_INT(lines_with("INFO queue_error_cleared cmd=EVAL take err=\"NOPERM no\\nfake=1\" repeated=4 "), 1);
    CHECK(!qdd_rerr_active(&e));
}

static void test_describe(void)
{
    qdd_rerr e;
    memset(&e, 0, sizeof e);
    char why[256];
    qdd_rerr_describe(&e, why, sizeof why);
    CHECK_STR(why, "");
    qdd_rerr_fail(&e, "node", "EVAL node_claim", "NOPERM this user has no permissions");
    CHECK(qdd_rerr_active(&e));
    qdd_rerr_describe(&e, why, sizeof why);
    CHECK_STR(why, "EVAL node_claim: NOPERM this user has no permissions");
}

int main(void)
{
    TEST_RUN(test_backoff);
    TEST_RUN(test_logged_once_per_change);
    TEST_RUN(test_describe);
    return test_finish();
}
