/* The daemon's in-memory state and the functions its modules share (internal to daemon/).
 *
 * One libuv loop runs everything: three hiredis async connections (commands, the blocking
 * pop, the subscription to the cancel and events channels; rconn.c, shared with the HTTP
 * layer), the worker processes (pool.c), the jobs this node
 * holds and the Redis protocol around them (jobs.c: take, lease, status, finish, hand back,
 * reclaim; the Lua scripts are in scripts.c), and the lifecycle (daemon.c: start, timers,
 * signals, graceful stop). proto/redis.md documents the keys and protocols.
 *
 * Ownership: the daemon owns its jobs, workers and connections; a job is freed only once no
 * Redis command referring to it is pending (refs). */
#ifndef QUANTD_DAEMON_DAEMON_H
#define QUANTD_DAEMON_DAEMON_H

#include <stdint.h>
#include <uv.h>
#include <hiredis/async.h>

#include "daemon/config.h"
#include "daemon/http.h"
#include "daemon/rconn.h"
#include "daemon/rerr.h"
#include "proto/keys.h"
#include "proto/status.h"
#include "proto/wire.h"
#include "quant/job/job.h"

typedef struct qdd_daemon qdd_daemon;
typedef struct qdd_fanout qdd_fanout;

/* ---- Redis connections: rconn.h (cmd, pop, sub; the HTTP layer borrows cmd and sub) ---- */

/* ---- Lua scripts (scripts.c) -------------------------------------------------------------- */

extern const char *const qdd_lua_take;      /* KEYS proc lease status fence cancel queue failed; ARGV raw canon node ttl at_ms id */
extern const char *const qdd_lua_status;    /* KEYS status stream; ARGV channel maxlen event f v ... */
extern const char *const qdd_lua_renew;     /* KEYS lease cancel; ARGV value ttl -> {owned, cancel} */
extern const char *const qdd_lua_finish;    /* KEYS proc lease status stream cancel queue failed; ARGV payload value ttl_s id at_ms */
extern const char *const qdd_lua_handback;  /* KEYS proc queue lease failed; ARGV payload value id at_ms */
extern const char *const qdd_lua_reassert;  /* KEYS proc lease fence status index; ARGV payload value ttl token id */
extern const char *const qdd_lua_reclaim;   /* KEYS node proc queue nodes; ARGV node jobprefix force keep... */
extern const char *const qdd_lua_reject;    /* KEYS proc failed; ARGV raw record */
extern const char *const qdd_lua_node_claim;   /* KEYS node nodes; ARGV token ttl_ms node -> {1, existed} | {0, holder, pttl} */
extern const char *const qdd_lua_node_release; /* KEYS node; ARGV token -> 1 released, 0 not ours */
/* Parts over several nodes (parts_nodes.c); a part's holder is "<node>/<worker>". */
extern const char *const qdd_lua_fanout_open;  /* KEYS fanout fanouts; ARGV channel id ttl_ms f v ... */
extern const char *const qdd_lua_fanout_close; /* KEYS fanout fanouts; ARGV fid id */
extern const char *const qdd_lua_part_claim;   /* KEYS fanout lease; ARGV fid holder ttl_ms index|-1 fence -> {index|-1|-2, state} */
extern const char *const qdd_lua_part_renew;   /* KEYS fanout; ARGV fid index holder ttl_ms -> 1 | 0 */
extern const char *const qdd_lua_part_done;    /* KEYS fanout; ARGV fid index holder ok channel id -> 1 | 0 */
extern const char *const qdd_lua_fanout_sync;  /* KEYS fanout; ARGV fid ttl_ms -> {state of each part} | {} */
extern const char *const qdd_lua_parts_nodes;  /* KEYS parts_nodes; ARGV nodekeyprefix self -> live others */

/* ---- jobs (jobs.c) -------------------------------------------------------------------------- */

typedef enum qdd_job_phase {
    QDD_JOB_TAKING = 0,    /* the take script is in flight */
    QDD_JOB_WAITING,       /* leased, waiting for a job slot / memory */
    QDD_JOB_RUNNING,       /* admitted: its (job, block) tasks are scheduled */
    QDD_JOB_FINAL,         /* final status written or pending; leaving */
    QDD_JOB_GONE,          /* lease lost, handed back or finished: only waiting for refs */
} qdd_job_phase;

typedef struct qdd_job {
    struct qdd_job *next;
    qdd_daemon *d;
    int refs;                  /* pending Redis commands that point at this job, plus 1 while listed */
    char id[QP_JOB_ID_MAX + 1];
    char *payload;             /* canonical JSON, as it sits in the processing list (owned) */
    qp_job *job;               /* parsed (owned) */
    qp_status st;              /* the status we publish (owned strings) */
    qdd_job_phase phase;
    char lease[QP_KEY_MAX];    /* "<token> <node>" */
    uint64_t fence;
    uint64_t mem;              /* the pipeline's peak memory estimate, bytes */
    uint64_t part_mem;         /* one of its parts' peak in the worker that runs it (the estimate's
                                  part_ram_bytes): counted for each helper under memory-limit-mb */
    uint64_t seq;              /* admission order (FIFO within a priority) */
    int worker;                /* worker running its task, -1 none */
    int last_worker;           /* worker that ran its previous block (holds its activations) */
    int next_block, n_blocks;
    int retries;               /* task failures retried so far */
    int resource_retries;      /* of them, QD_ERESOURCE ones (disk or memory; never reset) */
    int cancel_req;            /* cancel flag seen */
    int poison_deaths;         /* workers this job's tasks crashed (qdd_jobs_worker_died) */
    int lost;                  /* lease lost: stop without writing anything */
    int final_sent;            /* the finish script went out and succeeded */
    char *take_payload;        /* the raw queue payload, held from the pop until the take
                                  reply decides (dup: rejected with it; cancelled while queued:
                                  finished with it; else dropped) */
    int64_t popped_ms;         /* when this node took it (queue-to-start latency) */
    qdd_fanout *fanout;        /* the open fan-out of its lead's block step (parts.c; owned), or NULL */
} qdd_job;

/* The daemon's stop sequence (daemon.c stop_step), one phase after the other. */
typedef enum qdd_stop_phase {
    QDD_RUNNING = 0,             /* no stop asked */
    QDD_STOP_DRAINING,           /* running blocks finish (until stop_timeout_s) */
    QDD_STOP_HANDING_BACK,       /* jobs go back to the queue */
    QDD_STOP_WORKERS_EXITING,    /* workers were told to shut down */
    QDD_STOP_CLOSED,             /* every handle closed: the loop ends */
} qdd_stop_phase;

/* ---- the node key (node.c) ------------------------------------------------------------------
 * One daemon per node name: the node key (qjobs:node:<node>) holds this daemon's token with
 * a TTL of node-ttl-ms, refreshed by the heartbeat only while the token is ours. A daemon
 * that finds another token there waits: a key that its holder refreshes means a live daemon
 * runs as this node (refused: logged as node_in_use, exit status 1); a key that expires was
 * left by a daemon that died (taken over). A clean stop releases the key. */

typedef enum qdd_node_state {
    QDD_NODE_UNCLAIMED = 0,    /* not asked yet, or the claim got an error reply */
    QDD_NODE_WAITING,          /* another token holds it: is it refreshed, or does it expire? */
    QDD_NODE_OWNED,            /* ours; the jobs protocol runs */
    QDD_NODE_REFUSED,          /* another live daemon runs as this node: stopping, exit 1 */
    QDD_NODE_LOST,             /* it was ours and another daemon took it over: stopping, exit 1 */
} qdd_node_state;

/* Sends the claim (cmd up, and each tick while not owned); on success the recovery runs
 * (qdd_daemon_node_owned). */
void qdd_node_claim(qdd_daemon *d);
/* The tick's part: claims again while waiting or after an error reply (with backoff). */
void qdd_node_tick(qdd_daemon *d);
/* The heartbeat: refreshes the key only while the token is ours; someone else's token there
 * means this node was taken over (stop, exit 1). */
void qdd_node_heartbeat(qdd_daemon *d);
/* A clean stop: deletes the key when it is ours (before cmd closes, which flushes it). */
void qdd_node_release(qdd_daemon *d);

/* ---- workers (pool.c) ------------------------------------------------------------------------ */

typedef enum qdd_wstate {
    QDD_W_DOWN = 0, QDD_W_STARTING, QDD_W_IDLE, QDD_W_BUSY, QDD_W_DEAD, QDD_W_FAILED,
} qdd_wstate;

typedef struct qdd_worker {
    qdd_daemon *d;
    int index;
    char name[32];
    char backend[32];          /* "cpu" or "cuda:N" */
    qdd_wstate state;
    uv_process_t proc;
    uv_pipe_t in, out;         /* our ends of its stdin / stdout */
    int open_handles;          /* of proc, in, out */
    int exited;
    uv_timer_t restart;
    int pid;
    int restarts;
    qp_wire_decoder dec;
    double last_msg_s;         /* monotonic seconds of its last message */
    double started_s;
    long oom_kills_at_start;   /* the cgroup's oom_kill count when it was spawned or another
                                  worker last exited (-1 unknown) */
    qdd_job *job;              /* the task in hand (a borrowed reference counted in job->refs) */
    int block;
    char why[256];             /* why it died or was refused */
    double cancel_sent_s;      /* monotonic seconds the task in hand was told to cancel; 0: not */
    int exiting;               /* it said it exits after its last reply (a device error): no tasks */
    /* The part in hand (parts.c): a helper holding one is busy with job NULL; the lead holds
     * its own beside its task. part_job is a borrowed reference counted in its refs. */
    qdd_job *part_job;
    uint64_t part_fanout;      /* the id of the fan-out it was handed out of */
    int part_block, part_index;
    int part_claiming;         /* reserved for that part, its claim in Redis not answered yet
                                  (a fan-out shared with other nodes; parts_nodes.c) */
    struct qdd_rpart *rpart;   /* a part of another node's job it runs (owned; parts_nodes.c) */
} qdd_worker;

int qdd_pool_start(qdd_daemon *d, qd_err *err);
/* Sends a task for job to worker w. */
int qdd_pool_send_task(qdd_worker *w, qdd_job *j, int block);
int qdd_pool_send_cancel(qdd_worker *w, const char *job_id, const char *reason);
/* Sends part `index` of job j's step `step` of `block` to w and marks w busy with it (w->part_*
 * set, a reference on j taken). */
int qdd_pool_send_part(qdd_worker *w, qdd_job *j, int block, const char *step, int index);
/* The part message alone (w's bookkeeping is the caller's). */
int qdd_pool_send_part_msg(qdd_worker *w, const char *job_id, const char *spec, const char *ckpt, int block,
                           const char *step, int index, uint64_t fence);
int qdd_pool_send_parts_done(qdd_worker *w, const char *job_id, int block, const char *step);
int qdd_pool_send_part_stop(qdd_worker *w, const char *job_id, int block, const char *step, int index);
/* Graceful shutdown message to every worker, then SIGKILL any still alive after grace. */
void qdd_pool_shutdown(qdd_daemon *d);
void qdd_pool_kill(qdd_worker *w, const char *why);
int qdd_pool_all_down(const qdd_daemon *d);
void qdd_pool_watchdog(qdd_daemon *d);      /* kills workers silent for 3 heartbeats */
void qdd_pool_free(qdd_daemon *d);

/* ---- fan-outs of a block's step over workers (parts.c) ----------------------------------------
 * A job's lead worker (the one running its task) cuts a block's step into n parts and says so
 * (wire `parts`); the daemon keeps one fan-out per job and hands its parts out: the lead one
 * whenever it has none in flight, idle workers (helpers) more while the job's helpers stay
 * below its `workers` - 1. When every part is done (well or not: the lead recomputes what is
 * missing) the lead gets `parts_done`. A helper that dies puts its part back to pending; the
 * lead's task ending in any way drops the fan-out (late part_done messages free their worker
 * and are otherwise ignored).
 *
 * The bookkeeping below (qdd_fanout_*) is pure, with no process or Redis behind it, so the
 * unit test drives it directly; qdd_parts_* are the daemon's side. */

typedef enum qdd_part_state { QDD_PART_PENDING = 0, QDD_PART_INFLIGHT, QDD_PART_DONE } qdd_part_state;

struct qdd_fanout {
    uint64_t id;               /* unique in the daemon: what a part in flight was handed out of */
    int lead;                  /* the lead worker's index */
    int block;
    char step[16];
    int n;
    unsigned char *state;      /* n qdd_part_state (owned) */
    int *worker;               /* n: the worker a part is in flight on, -1 (owned) */
    char **names;              /* n: what part i works on, NULL where unnamed (owned) */
    int n_done, n_inflight;
    /* Shared with other nodes (parts_nodes.c): published in Redis, every claim through it. A
     * part in flight on another node has worker QDD_PART_REMOTE and its holder
     * ("<node>/<worker>") in holder. */
    int shared;
    int n_remote;              /* parts in flight on other nodes */
    int mem_held;              /* a helper was held back for memory-limit-mb (logged once) */
    /* Stragglers: once no part is pending, the idle lead runs a copy (a backup) of a part a
     * helper of this node has held for more than twice the longest part done so far;
     * whichever copy ends first makes the part done, and the other's report is late. Both
     * write the same output file (named by its input, renamed in place), so the bytes do not
     * depend on which one won. The clock is the caller's (now_ms, set before each call). */
    uint64_t now_ms;
    uint64_t *hand_ms;         /* n: now_ms when part i was handed out (owned) */
    uint64_t done_max_ms;      /* the longest hand-out to done of a part done by its holder */
    int n_timed;               /* parts done by their holder */
    unsigned char *backed;     /* n: part i had a backup (one each; owned) */
    int backup;                /* the part the lead runs as a backup, or -1 */
    int sync_inflight;         /* the owner's read of the hash is in flight */
    char **holder;             /* n (owned, allocated by the first remote part) */
};

#define QDD_PART_REMOTE (-2)

/* What qdd_fanout_apply did with a part's state read from Redis. */
typedef enum qdd_apply_result {
    QDD_APPLY_NONE = 0,
    QDD_APPLY_REMOTE,          /* pending -> in flight on another node (or its holder changed) */
    QDD_APPLY_DONE,            /* another node's part -> done, its output written */
    QDD_APPLY_FAILED,          /* another node's part -> done, not written (the lead computes it) */
    QDD_APPLY_REQUEUED,        /* another node's claim lapsed -> pending */
    QDD_APPLY_ENOMEM
} qdd_apply_result;

/* One part for one worker, as qdd_fanout_plan decides. */
typedef struct qdd_part_grant {
    int worker;
    int index;
    int backup;                /* a copy, for the lead, of a part in flight elsewhere */
} qdd_part_grant;

/* A new fan-out with every part pending; names (n_names <= n, may be NULL) are copied. *out
 * is owned by the caller (qdd_fanout_free). 0, QD_EINVAL or QD_ENOMEM. */
int qdd_fanout_open(qdd_fanout **out, uint64_t id, int lead, int block, const char *step, int n,
                    const char *const *names, int n_names);
void qdd_fanout_free(qdd_fanout *f);
/* The part in flight on worker, or -1. */
int qdd_fanout_held_by(const qdd_fanout *f, int worker);
/* Workers other than the lead with a part in flight. */
int qdd_fanout_helpers(const qdd_fanout *f);
/* Pending part index -> in flight on worker. */
void qdd_fanout_start(qdd_fanout *f, int index, int worker);
/* The lead starts a backup of part index (in flight on a helper). */
void qdd_fanout_backup_start(qdd_fanout *f, int index);
/* Part index in flight on worker, or backed up by worker (the lead) -> done. 1 when it was
 * (and is now done), 0 when that part is not in flight there (a late or foreign report, or
 * the copy that lost: nothing changes but the backup's end). */
int qdd_fanout_finish(qdd_fanout *f, int index, int worker);
/* The worker running the other copy of part index while worker runs one (the helper whose
 * part the lead backs up, or the lead backing up the helper's), or -1: once worker's copy
 * finishes well, the other is stopped (part_stop). Ask before qdd_fanout_finish. */
int qdd_fanout_other_copy(const qdd_fanout *f, int index, int worker);
/* The lead's backup of part index failed: the helper's copy goes on alone. */
void qdd_fanout_backup_failed(qdd_fanout *f, int index);
/* The part in flight on worker (if any) back to pending; returns its index, or -1. A part the
 * lead backs up stays in flight, now the lead's alone (state INFLIGHT tells the caller). */
int qdd_fanout_requeue(qdd_fanout *f, int worker);
/* 1 when every part is done. */
int qdd_fanout_complete(const qdd_fanout *f);
/* Part index's state as Redis says ("pending", "run H DEADLINE", "expired H", "done H",
 * "failed H"; H = "<node>/<worker>") applied to f, for parts of other nodes only: a holder
 * under self_node is this node's own worker, whose messages decide. */
qdd_apply_result qdd_fanout_apply(qdd_fanout *f, int index, const char *state, const char *self_node);
/* Which parts to hand out now, without changing f: the lead first (one part, when
 * lead_free and it has none in flight), then the idle workers in the order given (the lead
 * among them is skipped) while the helpers stay below max_workers - 1 (max_workers counts
 * the lead) and parts are pending. When none is pending and the lead is free, a backup for
 * it of the part a helper of this node has held longest, once that is more than twice the
 * longest part done (f->now_ms): never twice the same part, one at a time, and not in a
 * fan-out shared with other nodes (their claims run a part once). Fills up to cap grants;
 * returns how many. */
int qdd_fanout_plan(const qdd_fanout *f, int lead_free, int max_workers, const int *idle, int n_idle,
                    qdd_part_grant *grants, int cap);

/* A `parts` or `part_done` message from w. */
void qdd_parts_on_msg(qdd_daemon *d, qdd_worker *w, const qp_msg *m);
/* Hands out parts: jobs (RUNNING ones with a fan-out) in the order given (priority order),
 * after the tasks were assigned. */
void qdd_parts_schedule(qdd_daemon *d, qdd_job *const *jobs, int n);
/* w died or was killed: its part in flight goes back to pending (logged) and w holds none. */
void qdd_parts_worker_gone(qdd_daemon *d, qdd_worker *w);
/* The lead's task of j ended (done, failed, died): its fan-out is dropped. lead (may be NULL)
 * is the worker that ran the task: a part it still held is let go. */
void qdd_parts_drop(qdd_job *j, qdd_worker *lead);
/* Sends cancel to the helpers holding a part of j (the lead is told by the caller). */
void qdd_parts_cancel(qdd_job *j, const char *reason);
/* Parts of j in flight on any worker (the status field `parts` is made from them). */
int qdd_parts_in_flight(const qdd_job *j);
/* The status field `parts` of j, rewritten when it changed. */
void qdd_parts_status(qdd_job *j);
/* A fan-out complete: parts_done to the lead, then closed. */
void qdd_parts_complete(qdd_job *j);
/* w lets go of its part (w idle again unless it runs a task); returns the job it held. */
qdd_job *qdd_parts_release(qdd_worker *w);

/* ---- parts over several nodes (parts_nodes.c) ---------------------------------------------
 * The owner publishes a fan-out in Redis when another live node offers its workers
 * (remote-parts), and then claims each part there before it hands it to its own worker; a
 * daemon with remote-parts on claims parts of other nodes' fan-outs for its idle workers. */
/* f of j opened: published (f->shared) when another node offers its workers. */
void qdd_nparts_open(qdd_job *j, qdd_fanout *f);
/* f of j closes: its hash goes. */
void qdd_nparts_close(qdd_job *j, qdd_fanout *f);
/* Hands part index of j's shared fan-out to w through a claim (w reserved meanwhile). */
int qdd_nparts_grant(qdd_job *j, qdd_worker *w, int index);
/* This node's worker w finished part index of j's shared fan-out: done in Redis too, so
 * that no other node claims it once the claim would lapse. */
void qdd_nparts_local_done(qdd_job *j, qdd_worker *w, int index, int ok);
/* A part_done from a worker running another node's part (w->rpart). */
void qdd_nparts_done(qdd_daemon *d, qdd_worker *w, const qp_msg_part_done *p);
/* w died holding another node's part: its claim lapses, the owner requeues it. */
void qdd_nparts_worker_gone(qdd_daemon *d, qdd_worker *w);
/* The tick: claims renewed, the owner's fan-outs synced, other nodes' fan-outs scanned. */
void qdd_nparts_tick(qdd_daemon *d);
/* Subscribes to the parts channel (start-up). */
void qdd_nparts_start(qdd_daemon *d);

/* ---- the daemon ------------------------------------------------------------------------------ */

struct qdd_daemon {
    uv_loop_t *loop;
    qdd_config *cfg;           /* owned; replaced on SIGHUP */
    int argc;
    char **argv;
    char **envp;
    qp_keys keys;
    char node[QP_NODE_MAX + 1];
    char worker_exe[4096];
    qdd_redis_url url;         /* the URL connected to (not reloaded) */
    qdd_rconn cmd, pop, sub;   /* every Redis connection of the daemon */
    int cmd_ready;             /* the start-up/reconnect recovery ran on cmd */
    int awaiting_recovery;     /* cmd (re)connected, the recovery not run yet: a running job's
                                  progress is not written (status_write) */
    int recovering;            /* qdd_jobs_recover is writing: its own status writes go out */
    int pop_inflight;
    /* Redis error replies (rerr.h): logged once per change, retried with backoff. */
    qdd_rerr rerr_queue;       /* BLMOVE and the take script: the pop backs off; /readyz 503 */
    qdd_rerr rerr_node;        /* the node key's claim and refresh: /readyz 503 */
    qdd_rerr rerr_reclaim;     /* the reclaim script on dead nodes' lists (our own: rerr_queue) */
    qdd_rerr rerr_lease;       /* lease renewal */
    uint64_t pop_after_ms;     /* no BLMOVE before this uv_now (backoff after an error reply) */
    int pop_recover;           /* a take or the recovery failed: the recovery runs (again) first */
    uv_timer_t pop_timer;      /* fires when the backoff ends (pop_timer_on: initialised) */
    int pop_timer_on;
    /* The node key (node.c). */
    char node_token[64];       /* this daemon's value of the node key: "<start_ms>:<pid>:<random>" */
    qdd_node_state node_state;
    int node_claim_inflight;
    uint64_t node_retry_at_ms; /* uv_now before which no claim is sent (after an error reply) */
    char node_holder[128];     /* the other daemon's token while waiting */
    long long node_holder_pttl;/* its remaining TTL when last seen */
    int exit_code;             /* the process's exit status once the loop ends (0, or 1 when refused) */
    int ever_ready;
    qdd_job *jobs;
    uint64_t seq;
    qdd_worker *workers;
    int n_workers;
    int max_jobs;
    uv_timer_t tick;
    uv_signal_t sig_term, sig_int, sig_hup;
    double next_node_hb_s, next_renew_s, next_reclaim_s;
    qdd_stop_phase stopping;   /* QDD_RUNNING until a stop signal */
    double stop_deadline_s;
    int handback_pending;
    double handback_deadline_s;
    int64_t start_ms;
    uint64_t fanout_seq;       /* the last fan-out id given */
    /* Parts over several nodes (parts_nodes.c). */
    int remote_nodes;          /* live other nodes offering their workers, as last counted */
    double next_nodes_s, next_parts_renew_s, next_scan_s, scan_backoff_s;
    int scan_inflight;         /* replies of a scan still to come */
    char refused[8][QP_JOB_ID_MAX + 1];   /* jobs whose parts this node cannot reach (logged once) */
    int n_refused;
    int sd_watchdog;           /* systemd watchdog enabled */
    void *http;                /* qdd_http * when the HTTP API runs */
    uint64_t config_gen;       /* 1 at start, +1 per successful SIGHUP reload */
    qdd_http_view view;        /* what the HTTP layer asks the daemon (borrowed by it) */
};

int64_t qdd_unix_ms(void);

/* jobs.c */
void qdd_jobs_admit(qdd_daemon *d, const char *raw, size_t len);
void qdd_jobs_schedule(qdd_daemon *d);
void qdd_jobs_on_msg(qdd_daemon *d, qdd_worker *w, qp_msg *m);
/* poison: the worker died of its task (a fatal signal or the out-of-memory killer), not of
 * a kill the daemon or an operator sent; the second such death quarantines the job. */
void qdd_jobs_worker_died(qdd_daemon *d, qdd_worker *w, const char *why, int poison);
void qdd_jobs_renew(qdd_daemon *d);
void qdd_jobs_cancel(qdd_daemon *d, const char *id);
void qdd_jobs_reclaim_scan(qdd_daemon *d);
void qdd_jobs_node_heartbeat(qdd_daemon *d);
void qdd_jobs_recover(qdd_daemon *d, int force_self);   /* after cmd (re)connects */
void qdd_jobs_handback_all(qdd_daemon *d);
int qdd_jobs_held(const qdd_daemon *d);                 /* jobs not yet gone */
int qdd_jobs_tasks_running(const qdd_daemon *d);
void qdd_jobs_free_all(qdd_daemon *d);
void qdd_job_unref(qdd_job *j);
/* Writes the selected status fields of st, publishes the event and appends it to the stream. */
void qdd_jobs_status_write(qdd_daemon *d, qp_status *st, unsigned which, qp_event_type type);

/* daemon.c */
int qdd_daemon_run(qdd_config *cfg, int argc, char **argv, char **envp);
void qdd_maybe_pop(qdd_daemon *d);
/* An error reply on the queue path (cmd "BLMOVE"; or "EVAL take" / "EVAL reclaim" with
 * recover set: a payload popped sits in our processing list, and the recovery that hands it
 * back runs again first): the next pop waits the backoff, and /readyz answers 503 until the
 * step works again. */
void qdd_queue_error(qdd_daemon *d, const char *cmd, const char *err, int recover);
/* The queue path worked (cmd as for qdd_rerr_ok). */
void qdd_queue_ok(qdd_daemon *d, const char *cmd);
/* Whether the daemon can take jobs (/readyz): 1, or 0 with the reason in why. */
int qdd_daemon_ready(const qdd_daemon *d, char *why, size_t cap);
/* The node key is ours (node.c, after a claim): the recovery runs, then the queue pop. */
void qdd_daemon_node_owned(qdd_daemon *d);
/* Stops the daemon as SIGTERM does, with this exit status (why: "key=value" for the log). */
void qdd_daemon_stop(qdd_daemon *d, int exit_code, const char *why);
/* The exit status of a daemon that refused to start because another daemon owns its node
 * name (node.c); the systemd unit does not restart on it. */
#define QDD_EXIT_NODE_IN_USE 3

#endif
