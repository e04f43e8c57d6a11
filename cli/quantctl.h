/* quantctl: one command per file (cmd_<name>.c), dispatched by main.c's table.
 * A command returns the process exit status: 0 success, 1 the work failed, 2 bad usage or
 * bad input (the one-line error on stderr names the problem). */
#ifndef QUANTD_CLI_QUANTCTL_H
#define QUANTD_CLI_QUANTCTL_H

enum { QCTL_OK = 0, QCTL_FAIL = 1, QCTL_USAGE = 2 };

typedef struct qctl_command {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv);     /* argv[0] is the command name */
} qctl_command;

int cmd_layer(int argc, char **argv);
int cmd_gen_layer(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_logits(int argc, char **argv);

#endif
