/* The paths a job reads and writes, checked against each other before anything is created
 * or removed.
 *
 * A job writes (and with "overwrite" removes) its output directory, so that directory must
 * never be, contain, or lie inside what the job reads: the model directory, the calibration
 * file and the eval file. Callers add their own protected paths (the daemon: its allow-roots
 * and its configuration file), which the output may lie inside but never be or contain.
 * The check resolves every path (symbolic links, "..") before comparing, so an alias
 * cannot hide an overlap. */
#ifndef QUANT_PIPELINE_JOB_PATHS_H
#define QUANT_PIPELINE_JOB_PATHS_H

#include "quant/core/error.h"
#include "quant/job/job.h"

typedef struct qd_protected_path {
    const char *path;        /* absolute; borrowed */
    const char *what;        /* for the message: "allow-root", "the daemon's configuration file" */
} qd_protected_path;

/* 0 when job->output overlaps none of the job's inputs nor the n protected paths, else
 * QD_EINVAL naming both paths and how they overlap ("output /d/m is the model directory").
 * A path in /proc, /sys or /dev (as named or resolved) is refused too.
 * A path that cannot be resolved is reported the same way. */
int qd_job_paths_check(const qp_job *job, const qd_protected_path *protect, int n, qd_err *err);

#endif
