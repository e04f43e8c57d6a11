/* Reading a job file for the offline commands (see quantctl.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/quantctl.h"
#include "quant/core/fsutil.h"
#include "quant/job/job.h"

qp_job *qctl_read_job(const char *cmd, const char *path)
{
    char *text = NULL;
    size_t len = 0;
    qd_err err = {0};
    if (qd_fs_read_file(path, &text, &len, &err)) {
        fprintf(stderr, "quantctl %s: %s\n", cmd, err.msg);
        return NULL;
    }
    qp_job *job = NULL;
    qp_err perr;
    memset(&perr, 0, sizeof perr);
    int rc = qp_job_parse(text, len, &job, &perr);
    free(text);
    if (rc) {
        fprintf(stderr, "quantctl %s: %s: %s\n", cmd, path, perr.msg);
        return NULL;
    }
    return job;
}
