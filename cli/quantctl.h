/* quantctl: one command per file (cmd_<name>.c), dispatched by main.c's table.
 * A command returns the process exit status: 0 success, 1 the work failed, 2 bad usage or
 * bad input (the one-line error on stderr names the problem). Each gets the runtime
 * options main() read from the environment (quant/core/runtime.h), to pass to every
 * backend it opens. */
#ifndef QUANTD_CLI_QUANTCTL_H
#define QUANTD_CLI_QUANTCTL_H

#include "quant/core/runtime.h"

enum { QCTL_OK = 0, QCTL_FAIL = 1, QCTL_USAGE = 2 };

typedef struct qctl_command {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv, const qd_runtime_opts *rt);   /* argv[0] is the command name */
} qctl_command;

int cmd_layer(int argc, char **argv, const qd_runtime_opts *rt);
int cmd_gen_layer(int argc, char **argv, const qd_runtime_opts *rt);
int cmd_tokenize(int argc, char **argv, const qd_runtime_opts *rt);
int cmd_eval(int argc, char **argv, const qd_runtime_opts *rt);
int cmd_quantize(int argc, char **argv, const qd_runtime_opts *rt);
int cmd_estimate(int argc, char **argv, const qd_runtime_opts *rt);
int cmd_gen_model(int argc, char **argv, const qd_runtime_opts *rt);
int cmd_logits(int argc, char **argv, const qd_runtime_opts *rt);
int cmd_dequant(int argc, char **argv, const qd_runtime_opts *rt);
int cmd_check_serving(int argc, char **argv, const qd_runtime_opts *rt);
int cmd_tp_sim(int argc, char **argv, const qd_runtime_opts *rt);
int cmd_selftest(int argc, char **argv, const qd_runtime_opts *rt);

/* ---- the job commands (submit, status, watch, cancel, list); their client side is
 * cli/client.h ---- */
struct qp_job;
/* Reads and validates the job file at path (qp_job_parse); NULL, with the reason printed as
 * "quantctl CMD: ...", when it cannot. The job is the caller's (qp_job_free). */
struct qp_job *qctl_read_job(const char *cmd, const char *path);

int cmd_submit(int argc, char **argv, const qd_runtime_opts *rt);
int cmd_status(int argc, char **argv, const qd_runtime_opts *rt);
int cmd_watch(int argc, char **argv, const qd_runtime_opts *rt);
int cmd_cancel(int argc, char **argv, const qd_runtime_opts *rt);
int cmd_list(int argc, char **argv, const qd_runtime_opts *rt);

#endif
