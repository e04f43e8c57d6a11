/* The pre-flight estimate (qd_pipeline_estimate_job, what `quantctl estimate` prints) against
 * what real jobs on tiny-llama-c4 take: the peak RSS of a `quantctl quantize` child (wait4's
 * ru_maxrss) and the peak bytes of output + checkpoint on disk (measured in-process through
 * the progress hook). The estimate must be an upper bound of both, and not more than
 * EST_MAX_OVER times what was measured, so it neither lets a job run out nor refuses one that
 * fits. The report's "resources" must carry the same estimate and peaks that agree with
 * these measurements. On a generated model big enough that the job's own buffers decide
 * the figure, the estimate must be within 15% above the measured peak (GPTQ, AWQ, and GPTQ
 * with "compute": "bf16").
 * Skipped without the shared data or the quantctl binary. */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "pipeline_testlib.h"

extern char **environ;

/* A sanitized build's RSS is not the product's (shadow memory, redzones, the quarantine of
 * freed blocks): there only the disk bound and the printed figures are checked, and the RAM
 * bound is checked by every plain build's ctest. */
#if defined(__SANITIZE_ADDRESS__)
#define EST_RSS_CHECKED 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EST_RSS_CHECKED 0
#endif
#endif
#ifndef EST_RSS_CHECKED
#define EST_RSS_CHECKED 1
#endif

/* How far above reality the estimate may be (both RAM and disk), chosen from the measured
 * ratios of these jobs (bench notes in the commit and docs/quantctl.md, "quantctl estimate"). */
#define EST_MAX_OVER 2.0

static const char *T, *data;

/* The largest acts-NNN.bin in dir, bytes. */
static uint64_t largest_acts(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    uint64_t best = 0;
    struct dirent *e;
    char path[2048];
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "acts-", 5)) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat sb;
        if (!stat(path, &sb) && (uint64_t)sb.st_size > best) best = (uint64_t)sb.st_size;
    }
    closedir(d);
    return best;
}

typedef struct disk_watch {
    char ckpt[1100];
    uint64_t ckpt_max, acts_max;
} disk_watch;

static int on_progress(void *ud, const qd_progress *pr)
{
    (void)pr;
    disk_watch *w = ud;
    uint64_t c = qd_fs_tree_bytes(w->ckpt), a = largest_acts(w->ckpt);
    if (c > w->ckpt_max) w->ckpt_max = c;
    if (a > w->acts_max) w->acts_max = a;
    return 0;
}

/* Peak RSS (bytes) of `quantctl quantize job_path --backend cpu`, or 0 when it failed. */
static uint64_t child_peak_rss(const char *job_path)
{
    char q[1024];
    snprintf(q, sizeof q, "%s/quantctl", getenv("QUANTD_BUILD_DIR"));
    char *argv[] = {q, "quantize", (char *)job_path, "--backend", "cpu", NULL};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    pid_t pid;
    int rc = posix_spawn(&pid, q, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc) { fprintf(stderr, "spawn %s failed\n", q); return 0; }
    int status = 0;
    struct rusage ru;
    if (wait4(pid, &status, 0, &ru) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "quantctl quantize %s failed (status %d)\n", job_path, status);
        return 0;
    }
    return (uint64_t)ru.ru_maxrss * 1024;     /* kilobytes on Linux */
}

typedef struct est_case {
    const char *name;
    char fields[2048];
    char job_path[1024], out[1024];
    qp_job *job;
    uint64_t rss;
} est_case;

static void case_write(est_case *c)
{
    snprintf(c->out, sizeof c->out, "%s/%s-out", T, c->name);
    snprintf(c->job_path, sizeof c->job_path, "%s/%s.json", T, c->name);
    char json[4096];
    snprintf(json, sizeof json, "{\"model\":\"%s/models/tiny-llama-c4\",\"output\":\"%s\",\"backend\":\"cpu\",%s}", data,
             c->out, c->fields);
    FILE *f = fopen(c->job_path, "w");
    CHECK(f != NULL);
    if (f) { fputs(json, f); fclose(f); }
    qp_err perr;
    memset(&perr, 0, sizeof perr);
    CHECK_OK(qp_job_parse(json, strlen(json), &c->job, &perr));
}

static double num_at(const cJSON *o, const char *a, const char *b)
{
    return cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(o, a), b));
}

/* The report's resources: the estimate the job ran under, and the peaks the pipeline measured
 * itself, which must agree with what this test measured from outside: the disk, and the RSS
 * (of this process, which ran jobs before: the pipeline's open trims what they left) near
 * the quantctl child's. */
static void check_report_resources(const est_case *c, const qd_pipeline_estimate *est, uint64_t disk)
{
    char path[1100];
    snprintf(path, sizeof path, "%s/quantd_report.json", c->out);
    char *text = NULL;
    size_t len = 0;
    CHECK_OK(qd_fs_read_file(path, &text, &len, NULL));
    cJSON *r = cJSON_ParseWithLength(text ? text : "", len);
    free(text);
    const cJSON *res = cJSON_GetObjectItemCaseSensitive(r, "resources");
    CHECK(cJSON_IsObject(res));
    CHECK_NEAR(num_at(res, "estimate", "peak_ram_bytes"), (double)est->peak_ram_bytes, 0.5);
    CHECK_NEAR(num_at(res, "estimate", "disk_bytes"), (double)est->disk_bytes, 0.5);
    double rss = num_at(res, "measured", "peak_rss_bytes"), mdisk = num_at(res, "measured", "peak_disk_bytes");
    fprintf(stderr, "%-10s report: peak RSS %7.1f MiB, peak disk %7.2f MiB, ratio ram %.3f disk %.3f\n", c->name,
            rss / 1048576.0, mdisk / 1048576.0, num_at(res, "ratio", "ram"), num_at(res, "ratio", "disk"));
    CHECK(rss > 0);
    CHECK(mdisk > 0);
    CHECK_NEAR(num_at(res, "ratio", "ram"), (double)est->peak_ram_bytes / rss, 0.001);
    CHECK_NEAR(num_at(res, "ratio", "disk"), (double)est->disk_bytes / mdisk, 0.001);
    /* This test's figure is a bound (the largest checkpoint it saw plus a second activation
     * file, or plus the whole output with its report); the pipeline's is a real moment of
     * the tree, so at most that and not far below it. */
    CHECK(mdisk <= (double)disk);
    CHECK(mdisk >= 0.95 * (double)disk);
    if (EST_RSS_CHECKED) {
        CHECK(rss >= 0.5 * (double)c->rss);
        CHECK(rss <= 1.5 * (double)c->rss);
    }
    cJSON_Delete(r);
}

/* Disk: the job run in-process, the checkpoint watched at every progress call. */
static void case_check(est_case *c)
{
    if (!c->job) return;
    qd_pipeline_estimate est;
    qd_err err = {0};
    CHECK_OK(qd_pipeline_estimate_job(c->job, &est, &err));
    CHECK_OK(qd_fs_remove_tree(c->out, &err));
    disk_watch w = {0};
    snprintf(w.ckpt, sizeof w.ckpt, "%s/.quantd", c->out);
    qd_pipeline_hooks hooks = {.ud = &w, .progress = on_progress};
    CHECK_OK(qd_pipeline_run(c->job, pt_be, &hooks, &err));
    /* The checkpoint's largest moment as the hook saw it, plus the second activation file that
     * exists for an instant between writing acts-(i+1) and removing acts-i; or, at the end, the
     * whole checkpoint (seen at the "write" stage) with the finished output beside it. */
    uint64_t out_bytes = qd_fs_tree_bytes(c->out);
    uint64_t disk = w.ckpt_max + w.acts_max;
    if (w.ckpt_max + out_bytes > disk) disk = w.ckpt_max + out_bytes;
    fprintf(stderr, "%-10s RAM: estimate %7.1f MiB, peak RSS %7.1f MiB (x%.2f) | disk: estimate %7.2f MiB, "
                    "measured %7.2f MiB (x%.2f; checkpoint %.2f, acts %.2f, output %.2f)\n",
            c->name, est.peak_ram_bytes / 1048576.0, c->rss / 1048576.0, c->rss ? (double)est.peak_ram_bytes / c->rss : 0,
            est.disk_bytes / 1048576.0, disk / 1048576.0, disk ? (double)est.disk_bytes / disk : 0,
            w.ckpt_max / 1048576.0, w.acts_max / 1048576.0, out_bytes / 1048576.0);
    if (EST_RSS_CHECKED) {
        CHECK(c->rss > 0 && est.peak_ram_bytes >= c->rss);
        CHECK(est.peak_ram_bytes <= EST_MAX_OVER * c->rss);
    } else {
        fprintf(stderr, "%-10s (sanitized build: RSS not compared)\n", c->name);
    }
    CHECK(disk > 0 && est.disk_bytes >= disk);
    CHECK(est.disk_bytes <= EST_MAX_OVER * disk);
    CHECK_INT(est.n_blocks, 4);
    check_report_resources(c, &est, disk);
    /* quantctl estimate --json prints the same numbers. */
    char cmd[2200], line[512] = "";
    snprintf(cmd, sizeof cmd, "'%s/quantctl' estimate --json '%s'", getenv("QUANTD_BUILD_DIR"), c->job_path);
    FILE *p = popen(cmd, "r");
    CHECK(p != NULL);
    if (p) {
        if (!fgets(line, sizeof line, p)) line[0] = 0;
        CHECK_INT(pclose(p), 0);
    }
    cJSON *j = cJSON_Parse(line);
    CHECK(cJSON_IsObject(j));
    CHECK_NEAR(cJSON_GetNumberValue(cJSON_GetObjectItem(j, "peak_ram_bytes")), (double)est.peak_ram_bytes, 0.5);
    CHECK_NEAR(cJSON_GetNumberValue(cJSON_GetObjectItem(j, "disk_bytes")), (double)est.disk_bytes, 0.5);
    CHECK_NEAR(cJSON_GetNumberValue(cJSON_GetObjectItem(j, "act_bytes")), (double)est.act_bytes, 0.5);
    CHECK_NEAR(cJSON_GetNumberValue(cJSON_GetObjectItem(j, "mlp_act_kept_bytes")),
               (double)(est.keep_mlp_act ? est.mlp_act_bytes : 0), 0.5);
    CHECK_NEAR(cJSON_GetNumberValue(cJSON_GetObjectItem(j, "part_disk_bytes")), (double)est.part_disk_bytes, 0.5);
    CHECK_NEAR(cJSON_GetNumberValue(cJSON_GetObjectItem(j, "part_ram_bytes")), (double)est.part_ram_bytes, 0.5);
    CHECK_NEAR(cJSON_GetNumberValue(cJSON_GetObjectItem(j, "part_lead_bytes")), (double)est.part_lead_bytes, 0.5);
    CHECK_NEAR(cJSON_GetNumberValue(cJSON_GetObjectItem(j, "n_blocks")), 4, 0);
    cJSON_Delete(j);
}

/* 0 when argv (argv[0] a path) ran and exited 0, its output discarded. */
static int run_quiet(char *const argv[])
{
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    pid_t pid;
    int rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    int status = 0;
    if (rc || waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
    return WEXITSTATUS(status);
}

/* A generated model whose job buffers dwarf the process's own (2 blocks of hidden 1024,
 * MLP 2816, F16; 8-16k calibration rows), so the estimate's terms decide the figure: it must
 * lie between the measured peak and EST_SYNTH_OVER times it, for GPTQ, AWQ, bf16 GPTQ and
 * GPTQ without true-sequential in calibration shards. */
#define EST_SYNTH_OVER 1.15

static void test_estimate_synthetic(void)
{
    char q[1024], model[1100], ids[1100];
    snprintf(q, sizeof q, "%s/quantctl", getenv("QUANTD_BUILD_DIR"));
    snprintf(model, sizeof model, "%s/synth", T);
    snprintf(ids, sizeof ids, "%s/synth-ids.json", T);
    char *gen[] = {q, "gen-model", "--out", model, "--layers", "2", "--hidden", "1024", "--intermediate", "2816",
                   "--heads", "8", "--kv-heads", "8", "--max-pos", "2048", "--vocab", "512", "--dtype", "f16", NULL};
    CHECK_INT(run_quiet(gen), 0);
    FILE *f = fopen(ids, "w");
    CHECK(f != NULL);
    if (!f) return;
    test_rng r;
    test_rng_seed(&r, 5);
    fputs("{\"tokens\":[", f);
    for (int i = 0; i < 20000; i++) fprintf(f, "%s%u", i ? "," : "", (unsigned)(test_rng_u64(&r) % 512));
    fputs("]}", f);
    fclose(f);
    /* name, method, samples, seq_len, more job keys ("compute": "bf16" adds its rounded
     * copies, which at these widths exceed GPTQ's buffers: the term decides the figure), more
     * calibration keys (shards: each pass's Hessians a shard at a time beside the sums) */
    static const char *const kinds[4][6] = {{"gptq", "gptq", "32", "512", "", ""},
                                            {"awq", "awq", "16", "256", "", ""},
                                            {"gptq-bf16", "gptq", "32", "512", ",\"compute\":\"bf16\"", ""},
                                            {"gptq-shards", "gptq", "32", "512", ",\"true_sequential\":false", ",\"shards\":4"}};
    for (int i = 0; i < 4; i++) {
        char job_path[1200], json[4096];
        snprintf(job_path, sizeof job_path, "%s/synth-%s.json", T, kinds[i][0]);
        snprintf(json, sizeof json, "{\"model\":\"%s\",\"output\":\"%s/synth-%s-out\",\"backend\":\"cpu\","
                 "\"method\":\"%s\",\"bits\":4,\"group_size\":128,\"calibration\":{\"path\":\"%s\","
                 "\"samples\":%s,\"seq_len\":%s%s}%s}", model, T, kinds[i][0], kinds[i][1], ids, kinds[i][2], kinds[i][3],
                 kinds[i][5], kinds[i][4]);
        f = fopen(job_path, "w");
        CHECK(f != NULL);
        if (!f) return;
        fputs(json, f);
        fclose(f);
        qp_job *job = NULL;
        qp_err perr;
        memset(&perr, 0, sizeof perr);
        CHECK_OK(qp_job_parse(json, strlen(json), &job, &perr));
        if (!job) continue;
        qd_pipeline_estimate est;
        qd_err err = {0};
        CHECK_OK(qd_pipeline_estimate_job(job, &est, &err));
        uint64_t rss = child_peak_rss(job_path);
        CHECK(rss > 0);
        fprintf(stderr, "synthetic %-9s estimate %7.1f MiB, measured peak RSS %7.1f MiB, ratio %.3f\n", kinds[i][0],
                est.peak_ram_bytes / 1048576.0, rss / 1048576.0, rss ? (double)est.peak_ram_bytes / rss : 0.0);
        if (EST_RSS_CHECKED && rss) {
            CHECK(est.peak_ram_bytes >= rss);
            CHECK(est.peak_ram_bytes <= EST_SYNTH_OVER * rss);
        }
        qp_job_free(job);
    }
}

static void test_estimate_jobs(void)
{
    char cal[1024], ev[1024];
    snprintf(cal, sizeof cal, "%s/text/c4/c4-calib.jsonl", data);
    snprintf(ev, sizeof ev, "%s/text/wikitext-2-raw/wiki.test.raw", data);
    est_case cs[4] = {{.name = "gptq"}, {.name = "gptq-big"}, {.name = "awq"}, {.name = "rtn-eval"}};
    snprintf(cs[0].fields, sizeof cs[0].fields, "\"method\":\"gptq\",\"calibration\":{\"path\":\"%s\",\"samples\":32,\"seq_len\":256}", cal);
    snprintf(cs[1].fields, sizeof cs[1].fields,
             "\"method\":\"gptq\",\"desc_act\":true,\"checkpoint\":{\"acts_every\":1},"
             "\"calibration\":{\"path\":\"%s\",\"samples\":32,\"seq_len\":512}", cal);
    snprintf(cs[2].fields, sizeof cs[2].fields, "\"method\":\"awq\",\"calibration\":{\"path\":\"%s\",\"samples\":8,\"seq_len\":256}", cal);
    snprintf(cs[3].fields, sizeof cs[3].fields, "\"method\":\"rtn\",\"eval\":{\"path\":\"%s\",\"seq_len\":512,\"max_windows\":16}", ev);
    /* RAM first, every child before any in-process job: posix_spawn's child shares this
     * process's memory until it execs, and Linux carries that high-water mark into the
     * child's ru_maxrss, so this process must still be small (a few MiB, which the measured
     * figure then includes). */
    for (int i = 0; i < 4; i++) {
        case_write(&cs[i]);
        cs[i].rss = child_peak_rss(cs[i].job_path);
        CHECK(cs[i].rss > 0);
    }
    for (int i = 0; i < 4; i++) {
        case_check(&cs[i]);
        qp_job_free(cs[i].job);
    }
}

int main(void)
{
    data = test_shared_data();
    const char *bd = getenv("QUANTD_BUILD_DIR");
    char q[1024];
    snprintf(q, sizeof q, "%s/quantctl", bd ? bd : "");
    struct stat sb;
    if (!data || !bd || stat(q, &sb)) {
        fprintf(stderr, "SKIP: needs the shared data and %s\n", q);
        return 77;
    }
    if (pt_setup(2, 0, 0, 0, &T, NULL)) return 1;
    TEST_RUN(test_estimate_synthetic);   /* first: its children measure while this process is small */
    TEST_RUN(test_estimate_jobs);
    return pt_teardown();
}
