/* The output-overlap check (qd_job_paths_check, admission.h). */
#include "quant/pipeline/admission.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "quant/core/fsutil.h"

/* Checks the resolved output against one input. inside_ok: the output may lie below it
 * (an allow-root), else that is an overlap too (the model directory). */
static int check_one(const char *out_path, const char *out, const char *path, const char *what, int inside_ok,
                     qd_err *err)
{
    char r[PATH_MAX];
    qd_err e = {0};
    if (qd_fs_resolve(path, r, sizeof r, &e))
        return qd_err_set(err, QD_EINVAL, "%s: %s", what, e.msg);
    if (!strcmp(r, out))
        return qd_err_set(err, QD_EINVAL, "output %s is %s (%s); choose an output directory of its own", out_path,
                          what, path);
    if (qd_fs_path_within(r, out))
        return qd_err_set(err, QD_EINVAL, "output %s contains %s %s; choose an output directory of its own", out_path,
                          what, path);
    if (!inside_ok && qd_fs_path_within(out, r))
        return qd_err_set(err, QD_EINVAL, "output %s lies inside %s %s; choose an output directory outside it",
                          out_path, what, path);
    return 0;
}

/* A path in the kernel's own file systems: /proc/self/fd/N names whatever the reading
 * process holds as N (confine.h reaches the job's output through such names), so a job may
 * name none of them. */
static int kernel_path(const char *path)
{
    static const char *const roots[] = {"/proc", "/sys", "/dev"};
    for (size_t i = 0; i < sizeof roots / sizeof roots[0]; i++) {
        size_t l = strlen(roots[i]);
        if (!strncmp(path, roots[i], l) && (path[l] == '/' || path[l] == '\0')) return 1;
    }
    return 0;
}

int qd_job_paths_check(const qp_job *job, const qd_protected_path *protect, int n, qd_err *err)
{
    char out[PATH_MAX];
    qd_err e = {0};
    const char *const named[] = {job->model, job->output, job->calibration.path, job->eval.path};
    static const char *const field[] = {"model", "output", "calibration.path", "eval.path"};
    for (size_t i = 0; i < sizeof named / sizeof named[0]; i++) {
        char r[PATH_MAX];
        qd_err re = {0};
        if (named[i] && (kernel_path(named[i]) || (!qd_fs_resolve(named[i], r, sizeof r, &re) && kernel_path(r))))
            return qd_err_set(err, QD_EINVAL, "%s: %s is in /proc, /sys or /dev; a job names files on a real file system",
                              field[i], named[i]);
    }
    if (qd_fs_resolve(job->output, out, sizeof out, &e)) return qd_err_set(err, QD_EINVAL, "output: %s", e.msg);
    if (!strcmp(out, "/")) return qd_err_set(err, QD_EINVAL, "output %s is the root directory", job->output);
    int rc = check_one(job->output, out, job->model, "the model directory", 0, err);
    if (!rc && job->calibration.path)
        rc = check_one(job->output, out, job->calibration.path, "the calibration file", 0, err);
    if (!rc && job->eval.enabled && job->eval.path)
        rc = check_one(job->output, out, job->eval.path, "the eval file", 0, err);
    for (int i = 0; !rc && i < n; i++)
        if (protect[i].path) rc = check_one(job->output, out, protect[i].path, protect[i].what, 1, err);
    return rc;
}
