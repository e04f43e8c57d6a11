/* A Redis error reply that keeps coming back: a key holding the wrong type (`SET qjobs oops`),
 * a command or key the ACL user may not use, a script Redis refuses. Such a reply comes at
 * once, so a step that simply retries spins (issue #33: 13,000 error lines a second). A
 * tracker turns the stream of replies into:
 *   - one log line when an error starts or changes (`<op>_error cmd=... err="..."`), one when
 *     it clears (`<op>_error_cleared ... repeated=N`), and a count of the repeats between;
 *   - the delay before the step may run again: the connection backoff (rconn.h), 100 ms
 *     doubling to 5 s, back at the minimum after a success;
 *   - whether the error persists, for /readyz (qdd_daemon_ready) and tests.
 * A zeroed tracker is valid (no error, the minimum delay). It holds no handle and frees
 * nothing. */
#ifndef QUANTD_DAEMON_RERR_H
#define QUANTD_DAEMON_RERR_H

#include <stddef.h>
#include <stdint.h>

typedef struct qdd_rerr {
    const char *op;          /* what fails, in log events: "queue", "node", ... (static; set by
                              * qdd_rerr_fail) */
    char cmd[24];            /* the command of the current error ("BLMOVE", "EVAL take") */
    char err[160];           /* the current error, "" while none */
    uint64_t repeats;        /* the same error again since it was logged */
    uint64_t total;          /* error replies counted in all (tests, metrics) */
    uint64_t since_ms;       /* monotonic ms when the current error started */
    int backoff_ms;          /* the delay the next failure returns; 0 = the minimum */
} qdd_rerr;

/* An error reply err to cmd of step op (a static string; the log events are <op>_error and
 * <op>_error_cleared): logged when it is not the current error, counted when it is. Returns
 * the delay (ms) before the step should be tried again. */
int qdd_rerr_fail(qdd_rerr *e, const char *op, const char *cmd, const char *err);
/* A success of cmd (NULL: of the whole step). Clears the current error when cmd is NULL or
 * is the command that failed (a BLMOVE that works says nothing of the take script after
 * it), logging how often it repeated; the delay starts again from the minimum. Returns 1
 * when an error was cleared. */
int qdd_rerr_ok(qdd_rerr *e, const char *cmd);
/* 1 while an error persists. */
int qdd_rerr_active(const qdd_rerr *e);
/* "CMD: ERR" of the current error into buf ("" when none). */
void qdd_rerr_describe(const qdd_rerr *e, char *buf, size_t cap);

#endif
