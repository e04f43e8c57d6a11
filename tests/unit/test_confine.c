/* quant/core/confine.h: a job's files are opened beneath the allowed roots, regular files
 * only, within their kind's size limit; the output is written through a held descriptor.
 * Each case is an attack from issue #33 (a link out of a model directory, a FIFO or
 * /dev/zero as a tokenizer, a huge config, an output swapped for a link while the job
 * runs), with the openat2 path and the component walk used where the kernel lacks it. A
 * whole pipeline runs at the end under confinement: links out of the model directory fail
 * the job by name and nothing of the outside reaches the output. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pipeline_testlib.h"
#include "quant/core/confine.h"
#include "quant/core/fsutil.h"
#include "quant/pipeline/admission.h"
#include "test_util.h"

static char T[4096], root[4200], outside[4200], secret[4300];

static void put(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f) { perror(path); return; }
    fputs(text, f);
    fclose(f);
}

static int read_ok(const char *path, qd_input_kind kind, char *msg, size_t cap)
{
    char *buf = NULL;
    size_t len = 0;
    qd_err err = {0};
    int rc = qd_input_read(path, kind, &buf, &len, &err);
    free(buf);
    snprintf(msg, cap, "%s", err.msg);
    return rc;
}

/* Everything the reads refuse, with openat2 (walk = 0) or the component walk (walk = 1). */
static void test_reads(int walk)
{
    qd_confine_force_walk_for_tests(walk);
    char p[4400], msg[QD_ERR_MSG_MAX];
    snprintf(p, sizeof p, "%s/model/config.json", root);
    CHECK_OK(read_ok(p, QD_INPUT_JSON, msg, sizeof msg));

    /* A link to a file outside the roots (issue #33: special_tokens_map.json -> /etc/shadow). */
    snprintf(p, sizeof p, "%s/model/special_tokens_map.json", root);
    CHECK_INT(read_ok(p, QD_INPUT_JSON, msg, sizeof msg), QD_EINVAL);
    CHECK_CONTAINS(msg, walk ? "symbolic link" : "outside the allowed roots");

    /* ".." out of the root, and a path that is outside from the start. */
    snprintf(p, sizeof p, "%s/model/../../outside/secret.txt", root);
    CHECK_INT(read_ok(p, QD_INPUT_JSON, msg, sizeof msg), QD_EINVAL);
    CHECK_INT(read_ok(secret, QD_INPUT_JSON, msg, sizeof msg), QD_EINVAL);
    CHECK_CONTAINS(msg, "outside every allowed root");

    /* A relative link inside the root (a Hugging Face cache's snapshot -> blobs): followed
     * by openat2, refused by the walk, which follows no link at all. */
    snprintf(p, sizeof p, "%s/model/tokenizer_config.json", root);
    int rc = read_ok(p, QD_INPUT_JSON, msg, sizeof msg);
    if (walk) CHECK_INT(rc, QD_EINVAL);
    else CHECK_OK(rc);

    /* A FIFO: refused at once (the open does not wait for a writer), a device through a
     * link, a directory. */
    snprintf(p, sizeof p, "%s/model/tokenizer.json", root);
    CHECK_INT(read_ok(p, QD_INPUT_TOKENIZER, msg, sizeof msg), QD_EINVAL);
    CHECK_CONTAINS(msg, "a FIFO");
    snprintf(p, sizeof p, "%s/model/zero.json", root);
    CHECK_INT(read_ok(p, QD_INPUT_JSON, msg, sizeof msg), QD_EINVAL);
    snprintf(p, sizeof p, "%s/model/dir.json", root);
    CHECK_INT(read_ok(p, QD_INPUT_JSON, msg, sizeof msg), QD_EINVAL);
    CHECK_CONTAINS(msg, "a directory");

    /* Over the kind's limit, named with its setting. */
    uint64_t lim[QD_INPUT_KINDS] = {100, 0, 0, 0};
    qd_confine_set_limits(lim);
    snprintf(p, sizeof p, "%s/model/big.json", root);
    CHECK_INT(read_ok(p, QD_INPUT_JSON, msg, sizeof msg), QD_EINVAL);
    CHECK_CONTAINS(msg, "QUANTD_MAX_JSON_BYTES");
    CHECK_OK(read_ok(p, QD_INPUT_TOKENIZER, msg, sizeof msg));   /* another kind's limit */
    lim[0] = 511;   /* big.json's size: at the limit is allowed, one byte under it is not */
    qd_confine_set_limits(lim);
    CHECK_OK(read_ok(p, QD_INPUT_JSON, msg, sizeof msg));
    lim[0] = 510;
    qd_confine_set_limits(lim);
    CHECK_INT(read_ok(p, QD_INPUT_JSON, msg, sizeof msg), QD_EINVAL);
    uint64_t back[QD_INPUT_KINDS] = {QD_INPUT_JSON_MAX_DEFAULT, 0, 0, 0};
    qd_confine_set_limits(back);

    /* Missing stays QD_ENOTFOUND (optional files are probed so). */
    snprintf(p, sizeof p, "%s/model/none.json", root);
    CHECK_INT(read_ok(p, QD_INPUT_JSON, msg, sizeof msg), QD_ENOTFOUND);
    qd_confine_force_walk_for_tests(0);
}

/* The output is opened once and written through its descriptor: renaming it away and
 * planting a link to a directory outside the roots redirects nothing (issue #33 item 3). */
static void test_output_swap(void)
{
    char out[4400], moved[4400], victim[4400], p[4500], fdp[64];
    snprintf(out, sizeof out, "%s/outs/job1", root);
    snprintf(moved, sizeof moved, "%s/outs/job1.moved", root);
    snprintf(victim, sizeof victim, "%s/victim", outside);
    CHECK_OK(qd_fs_mkdir_p(victim, NULL));
    int fd = -1, created = 0;
    qd_err err = {0};
    CHECK_OK(qd_confine_dir_open(out, 1, &fd, &created, &err));
    CHECK_INT(created, 1);
    if (fd < 0) return;
    CHECK_INT(rename(out, moved), 0);
    CHECK_INT(symlink(victim, out), 0);
    snprintf(p, sizeof p, "%s/config.json", qd_confine_fd_path(fd, fdp, sizeof fdp));
    CHECK_OK(qd_fs_write_atomic(p, "{}", 2, &err));
    snprintf(p, sizeof p, "%s/config.json", victim);
    CHECK(!qd_fs_exists(p));
    snprintf(p, sizeof p, "%s/config.json", moved);
    CHECK(qd_fs_exists(p));
    /* A temporary name planted as a link is replaced, never followed. */
    snprintf(p, sizeof p, "%s/x.json.tmp.%ld", moved, (long)getpid());
    char target[4500];
    snprintf(target, sizeof target, "%s/planted", victim);
    CHECK_INT(symlink(target, p), 0);
    snprintf(p, sizeof p, "%s/x.json", qd_confine_fd_path(fd, fdp, sizeof fdp));
    CHECK_OK(qd_fs_write_atomic(p, "{}", 2, &err));
    CHECK(!qd_fs_exists(target));
    close(fd);

    /* Opening it again now: the link in its place is refused, not followed. */
    fd = -1;
    CHECK_INT(qd_confine_dir_open(out, 1, &fd, NULL, &err), QD_EINVAL);
    if (fd >= 0) close(fd);
    /* A directory path through a link out of the roots is refused too. */
    snprintf(p, sizeof p, "%s/escape/newdir", root);
    CHECK_INT(qd_confine_dir_open(p, 1, &fd, NULL, &err), QD_EINVAL);
    snprintf(p, sizeof p, "%s/victim/newdir", outside);
    CHECK(!qd_fs_exists(p));
}

/* A copy takes regular files only, within the limit. */
static void test_copy(void)
{
    char src[4400], dir[4400];
    snprintf(dir, sizeof dir, "%s/outs/copy", root);
    int fd = -1;
    qd_err err = {0};
    CHECK_OK(qd_confine_dir_open(dir, 1, &fd, NULL, &err));
    if (fd < 0) return;
    snprintf(src, sizeof src, "%s/model/config.json", root);
    CHECK_OK(qd_input_copy_at(src, QD_INPUT_JSON, fd, "config.json", "copy/config.json", &err));
    snprintf(src, sizeof src, "%s/model/zero.json", root);
    CHECK_INT(qd_input_copy_at(src, QD_INPUT_JSON, fd, "zero.json", "copy/zero.json", &err), QD_EINVAL);
    snprintf(src, sizeof src, "%s/model/special_tokens_map.json", root);
    CHECK_INT(qd_input_copy_at(src, QD_INPUT_JSON, fd, "s.json", "copy/s.json", &err), QD_EINVAL);
    int tmps = 0;
    CHECK_INT(test_count_entries(dir, &tmps), 1);
    CHECK_INT(tmps, 0);
    close(fd);
}

/* A job may not name the kernel's file systems: /proc/self/fd/N is how the job's own
 * output is reached, and names whatever the reading process holds as N. */
static void test_kernel_paths(void)
{
    char out[4400], link[4400];
    snprintf(out, sizeof out, "%s/outs/kp", root);
    snprintf(link, sizeof link, "%s/proclink", root);
    if (symlink("/proc/self/fd", link)) perror(link);
    const char *const models[] = {"/proc/self/fd/3", "/dev/shm/m", "/sys", link};
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        qp_job *job = pt_job(models[i], out, "rtn", "gptq", NULL, NULL);
        qd_err err = {0};
        CHECK(job != NULL);
        if (!job) continue;
        CHECK_INT(qd_job_paths_check(job, NULL, 0, &err), QD_EINVAL);
        CHECK_CONTAINS(err.msg, "/proc, /sys or /dev");
        qp_job_free(job);
    }
}

/* A whole job under confinement: each link out of the model directory fails it by name. */
static void test_pipeline_links(void)
{
    char model[4400], out[4400], tokens[4400], p[4500];
    snprintf(model, sizeof model, "%s/llama", root);
    snprintf(tokens, sizeof tokens, "%s/calib.json", root);
    qd_testgen_opts o = pt_llama_opts(64, 1);
    CHECK_OK(pt_gen_model(model, &o));
    CHECK_OK(pt_write_tokens(tokens, 1000, 128, 1));
    static const char *const names[] = {"special_tokens_map.json", "generation_config.json", "tokenizer_config.json"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", model, names[i]);
        unlink(p);
        CHECK_INT(symlink(secret, p), 0);
        snprintf(out, sizeof out, "%s/outs/links-%zu", root, i);
        qp_job *job = pt_job(model, out, "rtn", "gptq", tokens, NULL);
        qd_err err = {0};
        int rc = job ? qd_pipeline_run(job, pt_be, NULL, &err) : -1;
        CHECK(rc != 0);
        CHECK_CONTAINS(err.msg, names[i]);
        CHECK_CONTAINS(err.msg, "outside the allowed roots");
        snprintf(p, sizeof p, "%s/%s", out, names[i]);
        CHECK(!qd_fs_exists(p));
        qp_job_free(job);
        snprintf(p, sizeof p, "%s/%s", model, names[i]);
        unlink(p);
    }
    /* The model's weights as a link to a model outside the roots. */
    char ext[4400];
    snprintf(ext, sizeof ext, "%s/model.safetensors", outside);
    snprintf(p, sizeof p, "%s/model.safetensors", model);
    CHECK_INT(rename(p, ext), 0);
    CHECK_INT(symlink(ext, p), 0);
    snprintf(out, sizeof out, "%s/outs/weights", root);
    qp_job *job = pt_job(model, out, "rtn", "gptq", tokens, NULL);
    qd_err err = {0};
    CHECK(job && qd_pipeline_run(job, pt_be, NULL, &err) != 0);
    CHECK_CONTAINS(err.msg, "model.safetensors");
    qp_job_free(job);
    /* Put back, the job runs to the end under confinement. */
    unlink(p);
    CHECK_INT(rename(ext, p), 0);
    snprintf(out, sizeof out, "%s/outs/ok", root);
    job = pt_job(model, out, "rtn", "gptq", tokens, NULL);
    CHECK(job && qd_pipeline_run(job, pt_be, NULL, &err) == 0);
    snprintf(p, sizeof p, "%s/outs/ok/quantd_report.json", root);
    CHECK(qd_fs_exists(p));
    qp_job_free(job);
    /* An attempt killed between making .quantd and committing its first state leaves a bare
     * .quantd (maybe with a temporary file): the next attempt starts over in it. */
    snprintf(out, sizeof out, "%s/outs/bare", root);
    snprintf(p, sizeof p, "%s/.quantd", out);
    CHECK_OK(qd_fs_mkdir_p(p, &err));
    snprintf(p, sizeof p, "%s/.quantd/state.json.tmp.12345", out);
    put(p, "{");
    job = pt_job(model, out, "rtn", "gptq", tokens, NULL);
    CHECK(job && qd_pipeline_run(job, pt_be, NULL, &err) == 0);
    snprintf(p, sizeof p, "%s/quantd_report.json", out);
    CHECK(qd_fs_exists(p));
    qp_job_free(job);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    qd_err err = {0};
    snprintf(T, sizeof T, "%s", test_tmpdir());
    snprintf(root, sizeof root, "%s/root", T);
    snprintf(outside, sizeof outside, "%s/outside", T);
    snprintf(secret, sizeof secret, "%s/secret.txt", outside);
    char p[4400], q[4400];
    snprintf(p, sizeof p, "%s/model", root);
    if (qd_fs_mkdir_p(p, &err) || qd_fs_mkdir_p(outside, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    put(secret, "{\"root_password\": \"hunter2\"}");
    snprintf(p, sizeof p, "%s/model/config.json", root);
    put(p, "{\"model_type\": \"llama\"}");
    snprintf(p, sizeof p, "%s/model/special_tokens_map.json", root);
    if (symlink(secret, p)) perror(p);
    snprintf(p, sizeof p, "%s/blob-1", root);
    put(p, "{\"bos_token\": \"<s>\"}");
    snprintf(p, sizeof p, "%s/model/tokenizer_config.json", root);
    if (symlink("../blob-1", p)) perror(p);
    snprintf(p, sizeof p, "%s/model/tokenizer.json", root);
    if (mkfifo(p, 0600)) perror(p);
    snprintf(p, sizeof p, "%s/model/zero.json", root);
    if (symlink("/dev/zero", p)) perror(p);
    snprintf(p, sizeof p, "%s/model/dir.json", root);
    qd_fs_mkdir_p(p, &err);
    snprintf(p, sizeof p, "%s/model/big.json", root);
    char big[512];
    memset(big, ' ', sizeof big - 1);
    big[sizeof big - 1] = 0;
    put(p, big);
    snprintf(p, sizeof p, "%s/escape", root);
    if (symlink(outside, p)) perror(p);
    snprintf(q, sizeof q, "%s/outs", root);
    qd_fs_mkdir_p(q, &err);

    const char *roots[1] = {root};
    if (qd_confine_set(roots, 1, &err)) { fprintf(stderr, "confine: %s\n", err.msg); return 1; }
    CHECK(qd_confine_active());
    CHECK_INT(qd_confine_set(roots, 1, &err), QD_EINVAL);   /* once only */
    if (qd_backend_cpu_open(2, NULL, &pt_be, &err)) { fprintf(stderr, "cpu backend: %s\n", err.msg); return 1; }
    test_reads(0);
    test_reads(1);
    test_output_swap();
    test_copy();
    test_kernel_paths();
    test_pipeline_links();
    qd_backend_close(pt_be);
    qd_confine_reset_for_tests();
    return test_finish();
}
