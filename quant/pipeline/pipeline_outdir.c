/* The output directory as the pipeline holds it: the output and its .quantd opened beneath
 * the allowed roots (confine.h) and named from then on by their descriptors
 * ("/proc/self/fd/N"), and the job's own output path put back into the messages that name
 * them so. The open (pipeline.c) opens them; the finish and the block's errors unmap. */
#include "quant/pipeline/pipeline_internal.h"

#include <stdio.h>
#include <string.h>

#include "quant/core/confine.h"

int qd_pipeline_out_dirs_open(qd_pipeline *p, int create, int *created_out, int *created_ckpt, qd_err *err)
{
    char shown[QD_PATH_MAX + 16];
    if (p->out_fd < 0) {
        int rc = qd_confine_dir_open(p->job->output, create, &p->out_fd, created_out, err);
        if (rc == QD_ENOTFOUND && !create) { qd_err_clear(err); return 0; }
        if (rc) return rc;
        qd_confine_fd_path(p->out_fd, p->out_dir, sizeof p->out_dir);
    }
    if (p->out_fd < 0) return 0;   /* absent, not created */
    if (p->ckpt_fd < 0) {
        snprintf(shown, sizeof shown, "%s/.quantd", p->out_shown);
        int rc = qd_confine_subdir_open(p->out_fd, ".quantd", create, &p->ckpt_fd, created_ckpt, shown, err);
        if (rc == QD_ENOTFOUND && !create) {
            qd_err_clear(err);
            if ((size_t)snprintf(p->ckpt_dir, sizeof p->ckpt_dir, "%s/.quantd", p->out_dir) >= sizeof p->ckpt_dir)
                return qd_err_set(err, QD_EINVAL, "%s: path too long", shown);
            return 0;
        }
        if (rc) return rc;
        qd_confine_fd_path(p->ckpt_fd, p->ckpt_dir, sizeof p->ckpt_dir);
    }
    return 0;
}

/* Replaces from in s (up to cap bytes) by to, where from ends a path component. */
static void replace_path(char *s, size_t cap, const char *from, const char *to)
{
    size_t lf = strlen(from), lt = strlen(to);
    char *at = s;
    while ((at = strstr(at, from))) {
        if (at[lf] >= '0' && at[lf] <= '9') { at += lf; continue; }   /* /proc/self/fd/7 in .../fd/71 */
        size_t tail = strlen(at + lf);
        if ((size_t)(at - s) + lt + tail + 1 > cap) return;
        memmove(at + lt, at + lf, tail + 1);
        memcpy(at, to, lt);
        at += lt;
    }
}

void qd_pipeline_err_unmap(const qd_pipeline *p, qd_err *err)
{
    if (!err || !p) return;
    char shown[QD_PATH_MAX + 16];
    if (p->ckpt_fd >= 0) {
        snprintf(shown, sizeof shown, "%s/.quantd", p->out_shown);
        replace_path(err->msg, sizeof err->msg, p->ckpt_dir, shown);
    }
    if (p->out_fd >= 0) replace_path(err->msg, sizeof err->msg, p->out_dir, p->out_shown);
}
