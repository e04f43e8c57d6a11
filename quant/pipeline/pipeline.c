/* The pipeline's life cycle (see pipeline.h): open (model, output directory, fingerprint,
 * resume or fresh calibration), close, and the loop over the blocks. One block is
 * pipeline_block.c's, the finish (assemble the output, eval, report) pipeline_finish.c's;
 * progress and resource sampling are pipeline_progress.c's, the output directory's
 * descriptors pipeline_outdir.c's. */
#include "quant/pipeline/pipeline_internal.h"
#include "quant/pipeline/part.h"
#include "quant/formats/scheme.h"

#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cjson/cJSON.h>

#include "quant/core/clock.h"
#include "quant/core/confine.h"
#include "quant/core/fsutil.h"
#include "quant/core/log.h"
#include "quant/core/meminfo.h"
#include "quant/core/rss.h"
#include "quant/core/safetensors.h"
#include "quant/job/hash.h"
#include "quant/model/eval.h"
#include "quant/pipeline/acts.h"
#include "quant/pipeline/admission.h"
#include "quant/pipeline/calib_tokens.h"
#include "quant/pipeline/output.h"
#include "quant/pipeline/report.h"
#include "quant/tp/tp_layout.h"

int qd_pipeline_n_blocks(const qd_pipeline *p) { return p->n_blocks; }
int qd_pipeline_next_block(const qd_pipeline *p) { return p->st.next_block; }

void qd_pipeline_set_wave_bytes(qd_pipeline *p, uint64_t bytes) { p->wave_bytes = bytes; }
void qd_pipeline_set_twins(qd_pipeline *p, int on) { p->no_twins = !on; }
void qd_pipeline_set_trace_parts(qd_pipeline *p, int mode) { p->trace_parts = mode < 0 ? -1 : !!mode; }
uint64_t qd_pipeline_twins_copied(const qd_pipeline *p) { return p->twins_copied; }
void qd_pipeline_set_keep_mlp_act(qd_pipeline *p, int keep) { p->no_mlp_keep = !keep; }

void qd_pipeline_set_fanout(qd_pipeline *p, int (*fanout)(void *ud, int block, const char *step, int n,
                                                         const char *const *names),
                            const char *worker)
{
    p->hooks.fanout = fanout;
    p->hooks.worker = worker;
}

int qd_pipeline_resumed_cross_backend(const qd_pipeline *p) { return p->resumed_cross_backend; }

/* 1 when the output holds nothing but, at most, a .quantd without a state.json: what an
 * attempt killed between creating its checkpoint directory and committing its first state
 * leaves (nothing of it can be resumed, and nothing of anyone else's is there). */
static int dir_is_empty(const char *path)
{
    DIR *d = opendir(path);
    if (!d) return 1;
    struct dirent *e;
    int empty = 1;
    char state[QD_PATH_MAX + 32];
    while (empty && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (!strcmp(e->d_name, ".quantd")) {
            snprintf(state, sizeof state, "%s/.quantd/state.json", path);
            struct stat sb;
            if (lstat(state, &sb) != 0 && errno == ENOENT) continue;
        }
        empty = 0;
    }
    closedir(d);
    return empty;
}

/* 1 when out_dir holds this job's finished output: a quantd_report.json whose fingerprint
 * has the same model files and output-changing options, and model.safetensors or its
 * index. A job whose completion never reached the daemon (it died in between) then
 * finishes at once instead of being refused for an existing output directory. */
static int output_is_finished(const char *out_dir, const char *model_fp, const char *options_fp)
{
    char path[QD_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/model.safetensors", out_dir);
    int have_weights = qd_fs_exists(path);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", out_dir);
    have_weights |= qd_fs_exists(path);
    snprintf(path, sizeof path, "%s/quantd_report.json", out_dir);
    char *buf = NULL;
    size_t len = 0;
    if (!have_weights || qd_input_read(path, QD_INPUT_JSON, &buf, &len, NULL)) return 0;
    cJSON *r = cJSON_ParseWithLength(buf, len);
    free(buf);
    const cJSON *fp = cJSON_GetObjectItemCaseSensitive(r, "fingerprint");
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(fp, "model");
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(fp, "options");
    int same = cJSON_IsString(m) && cJSON_IsString(o) && !strcmp(m->valuestring, model_fp) &&
               !strcmp(o->valuestring, options_fp);
    cJSON_Delete(r);
    return same;
}

static void options_fingerprint(const qp_job *job, char hex[65])
{
    char *text = qp_job_to_json(job, QP_JOB_JSON_OUTPUT_ONLY);
    qp_sha256_hex(text ? text : "", text ? strlen(text) : 0, hex);
    free(text);
}

static int embed_calibration(qd_pipeline *p, const int32_t *ids, qd_err *err)
{
    size_t bytes = (size_t)(p->n_seq * p->seq_len * p->hidden) * sizeof(float);
    p->acts = qd_backend_alloc(p->be, bytes);
    if (!p->acts) return qd_err_set(err, QD_ENOMEM, "out of memory for calibration activations (%zu bytes)", bytes);
    for (int64_t s0 = 0; s0 < p->n_seq; s0 += p->batch_seqs) {
        int64_t nb = p->n_seq - s0 < p->batch_seqs ? p->n_seq - s0 : p->batch_seqs;
        int rc = qd_model_embed(p->m, ids + s0 * p->seq_len, nb, p->seq_len, NULL,
                                p->acts + s0 * p->seq_len * p->hidden, err);
        if (rc) return rc;
    }
    return 0;
}

/* The deepest existing directory at or above path (for free-space questions about an
 * output directory that does not exist yet). */
static void existing_ancestor(const char *path, char *out, size_t cap)
{
    snprintf(out, cap, "%s", path);
    for (;;) {
        struct stat sb;
        if (stat(out, &sb) == 0 || !strcmp(out, "/") || !out[0]) return;
        char *slash = strrchr(out, '/');
        if (!slash) return;
        if (slash == out) slash[1] = 0;
        else *slash = 0;
    }
}

/* Refuses the job when the estimate (*est, filled) is over the free disk or memory. held:
 * the bytes already in the output directory that this run reuses or replaces (its own
 * checkpoint and partial output, or a quantd output that overwrite removes), which the
 * estimate counts as still to be written. */
static int check_resources(const qp_job *job, const char *out_dir, uint64_t held, int fanout, qd_pipeline_estimate *est,
                           qd_err *err)
{
    int rc = qd_pipeline_estimate_job(job, est, err);
    if (rc) return rc;

    char where[QD_PATH_MAX];
    existing_ancestor(out_dir, where, sizeof where);
    uint64_t free_disk = 0;
    /* Not enough disk is final: the same job on the same file system fails the same way
     * until someone frees space, so it is not retried. */
    char hint[512];
    /* A run whose quantize steps go out as parts writes their files beside the checkpoint
     * (the estimate itself stays the one the daemon admitted the job under). */
    qd_pipeline_estimate need = *est;
    if (fanout) need.disk_bytes += est->part_disk_bytes;
    if (qd_fs_free_bytes(where, &free_disk, NULL) == 0 && (rc = qd_pipeline_check_disk(&need, free_disk, held, where, err)))
        return rc;
    qd_mem_limits ml;
    qd_mem_limits_read(NULL, &ml);
    uint64_t avail = ml.avail_bytes;
    /* A large kept MLP activation is a speed-up, not a need: it goes before the job does. */
    if (avail && qd_pipeline_estimate_fit(est, avail))
        QD_LOG(QD_LOG_INFO, "mlp_act_not_kept", "job=%s mlp_act_bytes=%llu available_bytes=%llu", job->id,
               (unsigned long long)est->mlp_act_bytes, (unsigned long long)avail);
    /* A lead whose passes go out as capture parts holds one of them too. */
    uint64_t peak = est->peak_ram_bytes + (fanout ? est->part_lead_bytes : 0);
    if (avail && peak > avail) {
        qd_pipeline_estimate_hint(est, 0, hint, sizeof hint);
        char cg[64] = "";
        if (ml.cgroup_limit_bytes)
            snprintf(cg, sizeof cg, " under the memory cgroup's limit of %.2f GB", ml.cgroup_limit_bytes / 1e9);
        return qd_err_set(err, QD_ERESOURCE, "not enough memory: the job needs about %.2f GB at its peak, %.2f GB available%s %s",
                          peak / 1e9, avail / 1e9, cg, hint);
    }
    return 0;
}

/* An existing output directory may be removed (overwrite) only when it looks like a quantd
 * output: its report or its checkpoint is there. Anything else is somebody's data. */
static int check_removable(const char *out_dir, qd_err *err)
{
    char path[QD_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/quantd_report.json", out_dir);
    if (qd_fs_exists(path)) return 0;
    snprintf(path, sizeof path, "%s/.quantd/state.json", out_dir);
    if (qd_fs_exists(path)) return 0;
    return qd_err_set(err, QD_EINVAL,
                      "output %s is not empty and is not a quantd output (no quantd_report.json or .quantd/state.json): "
                      "\"overwrite\" removes only quantd outputs; empty it yourself or choose another directory",
                      out_dir);
}

int qd_pipeline_quant_setup(qd_pipeline *p, qd_err *err)
{
    const qp_job *job = p->job;
    p->fmt = qd_format_at((size_t)job->format);
    if (!p->fmt) return qd_err_set(err, QD_EINVAL, "format %d is not in the format table", (int)job->format);
    p->qcfg = qd_quant_cfg_default();
    p->qcfg.bits = job->bits;
    p->qcfg.sym = job->sym;
    p->qcfg.group_size = job->group_size;
    /* A format that stores zero - offset (gptq v1) cannot hold a zero below the offset. */
    p->qcfg.zero_min1 = p->fmt->zero_offset > 0 && !job->sym;
    p->qcfg.scale_search = (qd_scale_search)job->scale_search;
    /* A scheme's grid and scale rule (the job spec checked that bits, group and format
     * agree with it). */
    const qd_scheme *sc = qp_job_scheme(job);
    if (sc) {
        p->qcfg.grid = sc->grid;
        p->qcfg.scale_rule = sc->scale_rule;
        p->qcfg.row_block = sc->row_block;
    }
    return qd_quant_cfg_validate(&p->qcfg, err);
}

int qd_pipeline_open(const qp_job *job, qd_backend *be, const qd_pipeline_hooks *hooks,
                     qd_pipeline **out, qd_err *err)
{
    *out = NULL;
    qd_pipeline *p = calloc(1, sizeof *p);
    if (!p) return qd_err_set(err, QD_ENOMEM, "out of memory");
    p->out_fd = p->ckpt_fd = p->parts_fd = -1;
    p->trace_parts = -1;
    p->job = job;
    p->be = be;
    if (hooks) p->hooks = *hooks;
    p->t_open = qd_clock_now_s();
    /* The peak resident set measured from here is this job's (a worker ran others before,
     * and its backend may still cache their freed blocks). */
    qd_backend_trim(be);
    if (qd_rss_peak_reset())
        QD_LOG(QD_LOG_INFO, "rss_peak_reset", "job=%s (not allowed: the measured peak RSS is the process's since it started)",
               job->id);
    qd_state_init(&p->st);
    p->wave_bytes = QD_WAVE_HESSIAN_BYTES;
    int rc = 0;
    int32_t *ids = NULL;
    int created_out = 0, created_ckpt = 0;
    rc = qd_pipeline_quant_setup(p, err);
    if (rc) goto fail;
    char state_path[QD_PATH_MAX + 32];
    snprintf(p->out_shown, sizeof p->out_shown, "%s", job->output);
    snprintf(p->out_dir, sizeof p->out_dir, "%s", job->output);
    snprintf(p->ckpt_dir, sizeof p->ckpt_dir, "%s/.quantd", job->output);
    snprintf(state_path, sizeof state_path, "%s/state.json", p->ckpt_dir);

    /* Every check comes first and touches nothing on disk: a refused job leaves no output
     * directory behind, and its retry or resubmission sees the same state. */
    rc = qd_job_paths_check(job, NULL, 0, err);
    if (rc) goto fail;
    rc = qd_model_open(job->model, be, &p->m, err);
    if (rc) goto fail;
    const qd_model_config *cfg = qd_model_cfg(p->m);
    p->n_blocks = (int)cfg->n_layers;
    p->acts_dtype = qd_acts_dtype_for(qd_output_float_dtype(qd_model_tensors(p->m)));
    p->hidden = cfg->hidden;
    /* The first progress line: no block started yet, of a known count ("block 0/32"). */
    rc = qd_pipeline_report_progress(p, "load", -1, NULL, 0, -1) ? QD_ECANCELLED : 0;
    if (rc) { qd_err_set(err, rc, "cancelled"); goto fail; }
    qd_model_set_moe_calibrate_all(p->m, job->moe.calibrate_all_experts);
    const char *compute_why = NULL;
    p->compute = qd_pipeline_compute_resolve(job->compute, qd_output_float_dtype(qd_model_tensors(p->m)), be, &compute_why);
    rc = qd_model_set_compute_bf16(p->m, p->compute == QP_COMPUTE_BF16, err);
    if (!rc) rc = qd_pipeline_check_plans(p, err);
    if (!rc) rc = qd_pipeline_gptoss_check(p, err);
    if (!rc) rc = qd_pipeline_bpw_preflight(p, err);
    if (!rc && job->gptaq) rc = qd_pipeline_gptaq_check(p, err);
    if (!rc && job->serve.enabled) rc = qd_pipeline_check_serving(p, err);
    if (rc) goto fail;
    /* The output directory: absent, empty, our checkpoint, our finished output, or a quantd
     * output that overwrite may replace. Held open from here when it exists. */
    rc = qd_pipeline_out_dirs_open(p, 0, NULL, NULL, err);
    if (rc) goto fail;
    snprintf(state_path, sizeof state_path, "%s/state.json", p->ckpt_dir);
    int have_state = qd_fs_exists(state_path);
    int remove_old = 0;
    if (qd_fs_exists(p->out_dir) && !dir_is_empty(p->out_dir) && !have_state) {
        char mfp[65], ofp[65];
        if (!job->overwrite && qd_fingerprint_model_dir(job->model, mfp, NULL) == 0) {
            options_fingerprint(job, ofp);
            if (output_is_finished(p->out_dir, mfp, ofp)) {
                QD_LOG(QD_LOG_INFO, "already_done", "job=%s output=%s (finished output found)", job->id, p->out_dir);
                p->already_done = 1;
                p->st.n_blocks = p->st.next_block = p->n_blocks;
                *out = p;
                return 0;
            }
        }
        if (!job->overwrite) {
            rc = qd_err_set(err, QD_EINVAL, "output %s exists and is not this job's checkpoint; choose another directory or set \"overwrite\": true", p->out_dir);
            goto fail;
        }
        rc = check_removable(p->out_dir, err);
        if (rc) goto fail;
        remove_old = 1;
    }
    if (job->layout == QP_LAYOUT_TP_AWARE && cfg->n_experts > 0) {
        /* The reordering pairs one dense MLP per block; experts are not laid out so. */
        rc = qd_err_set(err, QD_EUNSUPPORTED, "layout tp_aware is not supported for %s (mixture of experts)", cfg->architecture);
        goto fail;
    }
    if (job->layout == QP_LAYOUT_TP_AWARE) {
        /* Fail before any work when the MLP cannot be split over tp ranks. */
        const char *down = qd_model_linear_find(p->m, "mlp.down_proj") >= 0 ? "mlp.down_proj" : "fc2";
        rc = qd_tp_layout_check_shard(cfg->intermediate, job->tp, job->bits, job->group_size, down, err);
        if (rc) { qd_err_prefix(err, "layout tp_aware"); goto fail; }
    }

    /* Calibration tokens (also for RTN, whose error report needs inputs). */
    rc = qd_pipeline_calib_tokens(job, p->m, &ids, &p->n_seq, &p->seq_len, err);
    if (rc) goto fail;
    p->batch_seqs = 4096 / p->seq_len > 0 ? 4096 / p->seq_len : 1;
    qd_pipeline_shards_plan(p, job->calibration.shards);
    if (p->n_shards < job->calibration.shards)   /* a shard is at least one forward batch */
        QD_LOG(QD_LOG_INFO, "shards", "job=%s shards=%d requested=%lld reason=\"%lld sequences of %lld tokens are %lld "
               "forward batches\"", job->id, p->n_shards, (long long)job->calibration.shards, (long long)p->n_seq,
               (long long)p->seq_len, (long long)((p->n_seq + p->batch_seqs - 1) / p->batch_seqs));

    qd_fingerprint fp;
    memset(&fp, 0, sizeof fp);
    rc = qd_fingerprint_model_dir(job->model, fp.model, err);
    if (rc) goto fail;
    options_fingerprint(job, fp.options);
    qp_sha256_hex(ids, (size_t)(p->n_seq * p->seq_len) * sizeof(int32_t), fp.calib);
    snprintf(fp.backend, sizeof fp.backend, "%s", be->name);

    if (have_state) {
        qd_ckpt_state old;
        rc = qd_state_load(state_path, &old, err);
        if (!rc) rc = qd_fingerprint_check(&old.fp, &fp, err);
        if (!rc && old.n_blocks != p->n_blocks)
            rc = qd_err_set(err, QD_EMISMATCH, "checkpoint has %d blocks, the model %d", old.n_blocks, p->n_blocks);
        if (rc) {
            qd_state_free(&old);
            if (!job->overwrite) { qd_err_prefix(err, "cannot resume %s", p->out_dir); goto fail; }
            /* overwrite: start over (a checkpoint marks a quantd output). */
            qd_err_clear(err);
            rc = 0;
            remove_old = 1;
            have_state = 0;
        } else {
            qd_state_free(&p->st);
            p->st = old;
            /* auto was resolved when the job started: a resume keeps that arithmetic, on
             * whatever machine it runs (a checkpoint from before auto ran f32). An explicit
             * value is in the fingerprint, so the checkpoint ran with it. */
            qp_compute was = !strcmp(p->st.compute, "bf16") ? QP_COMPUTE_BF16 : QP_COMPUTE_F32;
            if (job->compute == QP_COMPUTE_AUTO && was != p->compute) {
                p->compute = was;
                compute_why = "kept from the checkpoint";
                rc = qd_model_set_compute_bf16(p->m, p->compute == QP_COMPUTE_BF16, err);
                if (rc) { qd_err_prefix(err, "cannot resume %s", p->out_dir); goto fail; }
            }
            if (strcmp(old.fp.backend, fp.backend) != 0) {
                p->st.cross_backend = 1;
                p->resumed_cross_backend = 1;
                QD_LOG(QD_LOG_WARN, "resume_cross_backend", "job=%s was=%s now=%s", job->id, old.fp.backend, fp.backend);
            }
            snprintf(p->st.fp.backend, sizeof p->st.fp.backend, "%s", fp.backend);
        }
    }
    snprintf(p->st.compute, sizeof p->st.compute, "%s", qp_compute_name(p->compute));
    QD_LOG(QD_LOG_INFO, "compute", "job=%s compute=%s requested=%s reason=\"%s\"", job->id, qp_compute_name(p->compute),
           qp_compute_name(job->compute), compute_why);
    rc = check_resources(job, p->out_dir, have_state || remove_old ? qd_pipeline_out_bytes(p) : 0, p->hooks.fanout != NULL,
                         &p->est, err);
    if (rc) goto fail;
    /* Accepted: the estimate goes to the log here and to the report at the end, beside the
     * peaks measured meanwhile, so its error shows on every run. */
    QD_LOG(QD_LOG_INFO, "estimate", "job=%s peak_ram_bytes=%llu disk_bytes=%llu act_bytes=%llu mlp_act_kept_bytes=%llu n_blocks=%d",
           job->id, (unsigned long long)p->est.peak_ram_bytes, (unsigned long long)p->est.disk_bytes,
           (unsigned long long)p->est.act_bytes, (unsigned long long)(p->est.keep_mlp_act ? p->est.mlp_act_bytes : 0),
           p->est.n_blocks);

    /* Every check passed: only now is anything removed or created. */
    if (remove_old) {
        QD_LOG(QD_LOG_INFO, "output_overwrite", "job=%s output=%s (removing the previous quantd output)", job->id, p->out_dir);
        rc = qd_fs_remove_contents_fd(p->out_fd, p->out_shown, err);
        if (rc) goto fail;
        if (p->ckpt_fd >= 0) close(p->ckpt_fd);   /* removed with the rest */
        if (p->parts_fd >= 0) close(p->parts_fd);
        p->ckpt_fd = p->parts_fd = -1;
    }
    rc = qd_pipeline_out_dirs_open(p, 1, &created_out, &created_ckpt, err);
    if (rc) goto fail;
    snprintf(state_path, sizeof state_path, "%s/state.json", p->ckpt_dir);
    if (!have_state) {
        p->st.fp = fp;
        p->st.n_blocks = p->n_blocks;
        p->st.next_block = 0;
        rc = embed_calibration(p, ids, err);
        if (!rc) rc = qd_state_save(state_path, &p->st, err);
        /* target_bpw's plan, from block 0's inputs, before block 0 (pipeline_bpw.c). */
        if (!rc) rc = qd_pipeline_bpw_prepare(p, err);
        if (rc) goto fail;
    } else if (p->st.next_block < p->n_blocks) {
        char path[QD_PATH_MAX + 32];
        float *host = NULL;
        /* The last kept activations, then the blocks after them again (pipeline_replay.c). */
        if (p->st.acts_block == 0) {
            rc = embed_calibration(p, ids, err);
        } else {
            snprintf(path, sizeof path, "%s/acts-%03d.bin", p->ckpt_dir, p->st.acts_block);
            rc = qd_acts_read(path, p->n_seq * p->seq_len, p->hidden, &host, NULL, NULL, err);
            if (!rc) {
                size_t bytes = (size_t)(p->n_seq * p->seq_len * p->hidden) * sizeof(float);
                p->acts = qd_backend_alloc(be, bytes);
                if (!p->acts) rc = qd_err_set(err, QD_ENOMEM, "out of memory for activations");
                else rc = qd_backend_upload(be, p->acts, host, bytes);
            }
            free(host);
        }
        /* The plan the blocks done followed (made here only when none was done). */
        if (!rc) rc = qd_pipeline_bpw_prepare(p, err);
        if (!rc && p->st.acts_block < p->st.next_block) rc = qd_pipeline_replay(p, p->st.acts_block, p->st.next_block, err);
        if (rc) goto fail;
        QD_LOG(QD_LOG_INFO, "resume", "job=%s next_block=%d of=%d acts_block=%d", job->id, p->st.next_block, p->n_blocks,
               p->st.acts_block);
    } else if ((rc = qd_pipeline_bpw_prepare(p, err))) {
        goto fail;   /* every block done: the finish still writes the plan's config groups */
    }
    /* GPTAQ's float stream: recomputed, never checkpointed (pipeline_gptaq.c). */
    if (job->gptaq && p->st.next_block < p->n_blocks) {
        rc = qd_pipeline_gptaq_stream_open(p, ids, p->st.next_block, err);
        if (rc) goto fail;
    }
    free(ids);
    *out = p;
    return 0;
fail:
    free(ids);
    /* Leave nothing this open created and never committed: no empty .quantd, no empty output. */
    if (created_ckpt && !qd_fs_exists(state_path)) unlinkat(p->out_fd, ".quantd", AT_REMOVEDIR);
    if (created_out && dir_is_empty(p->out_dir)) rmdir(job->output);
    qd_pipeline_err_unmap(p, err);
    qd_pipeline_close(p);
    return rc ? rc : QD_EINVAL;
}

qp_compute qd_pipeline_compute_resolve(qp_compute want, qd_dtype weights, const qd_backend *be, const char **why)
{
    const char *w = "as the job says";
    qp_compute c = want;
    if (want == QP_COMPUTE_AUTO) {
        if (weights != QD_DTYPE_BF16) {
            c = QP_COMPUTE_F32;
            w = "auto: the checkpoint's weights are not bfloat16";
        } else if (!be->bf16_native || !be->ops->gemm_nt_bf16) {
            c = QP_COMPUTE_F32;
            w = "auto: bfloat16 checkpoint, but this backend's bf16 products are emulated";
        } else {
            c = QP_COMPUTE_BF16;
            w = "auto: bfloat16 checkpoint, bf16 products on a bfloat16 unit";
        }
    }
    if (why) *why = w;
    return c;
}

void qd_pipeline_close(qd_pipeline *p)
{
    if (!p) return;
    if (p->acts) qd_backend_free(p->be, p->acts);
    if (p->acts_fp) qd_backend_free(p->be, p->acts_fp);
    qd_model_close(p->m);
    qd_state_free(&p->st);
    qd_tp_serving_report_free(&p->serving);
    qd_pipeline_folds_clear(p);
    free(p->folds);
    qd_bpw_plan_free(&p->bpw);
    if (p->parts_fd >= 0) close(p->parts_fd);
    if (p->ckpt_fd >= 0) close(p->ckpt_fd);
    if (p->out_fd >= 0) close(p->out_fd);
    free(p);
}

const char *qd_pipeline_out_dir(const qd_pipeline *p)
{
    return p->out_dir;
}

int qd_pipeline_run_block(qd_pipeline *p, qd_err *err)
{
    if (p->st.next_block >= p->n_blocks) return qd_err_set(err, QD_EINVAL, "every block is already done");
    int rc = qd_pipeline_run_block_impl(p, err);
    if (rc) qd_pipeline_err_unmap(p, err);
    return rc;
}

int qd_pipeline_run(const qp_job *job, qd_backend *be, const qd_pipeline_hooks *hooks, qd_err *err)
{
    qd_pipeline *p = NULL;
    int rc = qd_pipeline_open(job, be, hooks, &p, err);
    while (!rc && qd_pipeline_next_block(p) < qd_pipeline_n_blocks(p)) rc = qd_pipeline_run_block(p, err);
    if (!rc) rc = qd_pipeline_finish(p, err);
    qd_pipeline_close(p);
    return rc;
}
