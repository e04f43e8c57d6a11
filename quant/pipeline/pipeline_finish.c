/* The end of a job: assemble the output directory from the block checkpoints and the
 * source model's other tensors, write the configs, copy the tokenizer, measure perplexity
 * before and after when the job asks, write the report, and remove .quantd/. */
#include "quant/pipeline/pipeline_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cjson/cJSON.h>

#include "quant/core/clock.h"
#include "quant/core/fsutil.h"
#include "quant/core/log.h"
#include "quant/core/safetensors.h"
#include "quant/model/eval.h"
#include "quant/pipeline/output.h"
#include "quant/pipeline/report.h"

/* Perplexity of the model in dir on the job's eval text. */
static int eval_dir(qd_pipeline *p, const char *dir, const int32_t *ids, size_t n, qd_eval_result *res, qd_err *err)
{
    qd_model *m = NULL;
    int rc = qd_model_open(dir, p->be, &m, err);
    if (rc) return qd_err_prefix(err, "eval of %s", dir);
    qd_eval_opts o = qd_eval_opts_default(p->job->eval.seq_len);
    o.max_windows = p->job->eval.max_windows;
    rc = qd_eval_ppl(m, ids, n, &o, res, err);
    qd_model_close(m);
    return rc;
}

/* Everything in the output directory but the checkpoint (.quantd/) is what a finish writes:
 * the weights (model.safetensors, or its shards and index), config.json,
 * quantize_config.json, the copied tokenizer and generation files, the report, and the
 * "<name>.tmp.<pid>" files of a write that was killed half way (qd_fs_write_atomic names
 * them by pid, so a resumed run never overwrites them). A finish that failed (a full disk)
 * or was killed leaves some of them; they are removed before a finish writes, so what the
 * pre-flight counted as the checkpoint's own bytes is not doubled by a second copy, and
 * after one fails, so a failed job's output directory holds its checkpoint alone (what a
 * retry or a resubmission resumes from) and never a model.safetensors that looks finished.
 * The directory held nothing else: the job starts only on an absent or empty directory, its
 * own checkpoint, or a quantd output that "overwrite" removed. Subdirectories are left. */
static void remove_outputs(const char *dir, const char *job_id)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[QD_PATH_MAX + 300];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || !strcmp(e->d_name, ".quantd")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat sb;
        if (lstat(path, &sb) != 0 || S_ISDIR(sb.st_mode)) continue;
        if (unlink(path) == 0) QD_LOG(QD_LOG_INFO, "partial_output_removed", "job=%s file=%s", job_id, e->d_name);
    }
    closedir(d);
}

/* A vision-language model's vision tower and projector: their top modules, declared in
 * float in the quantization config (their tensors are copied unchanged with the rest). */
#define MAX_FLOAT_ROOTS 16
static int float_roots(qd_pipeline *p, cJSON *qcfg, qd_err *err)
{
    const st_model *sm = qd_model_tensors(p->m);
    char roots[MAX_FLOAT_ROOTS][64];
    const char *names[MAX_FLOAT_ROOTS];
    size_t n = 0;
    for (size_t i = 0; i < st_model_count(sm); i++) {
        char r[64];
        if (!qd_model_outside_text(p->m, st_model_tensor(sm, i)->name, r, sizeof r)) continue;
        size_t j = 0;
        while (j < n && strcmp(roots[j], r)) j++;
        if (j == n && n == MAX_FLOAT_ROOTS)
            return qd_err_set(err, QD_EUNSUPPORTED, "%s: more than %d modules outside the text tower ('%s')",
                              qd_model_dir(p->m), MAX_FLOAT_ROOTS, r);
        if (j == n) {
            snprintf(roots[n], sizeof roots[n], "%s", r);
            names[n] = roots[n];
            n++;
        }
    }
    return qd_output_declare_float_roots(qcfg, names, n) ? qd_err_set(err, QD_ENOMEM, "out of memory") : 0;
}

/* The output directory's files, written from the checkpoint (see qd_pipeline_finish). */
static int finish_write(qd_pipeline *p, qd_err *err)
{
    int rc = 0;
    const st_model *sm = qd_model_tensors(p->m);
    st_file **files = calloc((size_t)p->n_blocks, sizeof *files);
    size_t cap = st_model_count(sm) * 3 + 16, n = 0;
    qd_out_tensor *t = calloc(cap, sizeof *t);
    if (!files || !t) { free(files); free(t); return qd_err_set(err, QD_ENOMEM, "out of memory"); }
    char path[QD_PATH_MAX + 64], prefix[160];
    /* Tensors outside the blocks (embeddings, final norm, lm_head), bit-exact, in source order. */
    char base[160];
    qd_model_block_prefix(p->m, 0, base, sizeof base);
    size_t bl = strlen(base);
    while (bl > 0 && base[bl - 1] != '.') bl--;            /* "model.layers.0." */
    if (bl > 0) bl--;
    while (bl > 0 && base[bl - 1] != '.') bl--;            /* "model.layers." */
    base[bl] = 0;
    for (size_t i = 0; i < st_model_count(sm); i++) {
        const st_tensor *s = st_model_tensor(sm, i);
        if (bl && !strncmp(s->name, base, bl)) continue;
        qd_out_tensor *o = &t[n++];
        o->name = s->name;
        o->dtype = s->dtype;
        o->ndim = s->ndim;
        memcpy(o->shape, s->shape, sizeof(int64_t) * (size_t)o->ndim);
        o->data = s->data;
    }
    for (int b = 0; b < p->n_blocks && !rc; b++) {
        snprintf(path, sizeof path, "%s/block-%03d.safetensors", p->ckpt_dir, b);
        rc = st_file_open(path, &files[b], err);
        if (rc) { qd_err_prefix(err, "checkpoint of block %d", b); break; }
        qd_model_block_prefix(p->m, b, prefix, sizeof prefix);
        for (size_t i = 0; i < st_file_count(files[b]); i++) {
            if (n == cap) {
                cap *= 2;
                qd_out_tensor *nt = realloc(t, cap * sizeof *nt);
                if (!nt) { rc = qd_err_set(err, QD_ENOMEM, "out of memory"); break; }
                t = nt;
            }
            const st_tensor *s = st_file_tensor(files[b], i);
            qd_out_tensor *o = &t[n++];
            o->name = s->name;
            o->dtype = s->dtype;
            o->ndim = s->ndim;
            memcpy(o->shape, s->shape, sizeof(int64_t) * (size_t)o->ndim);
            o->data = s->data;
        }
    }
    /* gpt-oss in compressed-tensors: the experts as vLLM's gpt-oss loader reads them. */
    qd_out_tensor *fused = NULL;
    qd_output_owned owned = {0};
    if (!rc && qd_pipeline_gptoss_vllm_layout(p)) rc = qd_output_gptoss_experts(t, n, &fused, &n, &owned, err);
    if (!rc) rc = qd_output_write_shards(p->out_dir, fused ? fused : t, n, p->job->shard_size, err);
    free(fused);
    qd_output_owned_free(&owned);
    for (int b = 0; b < p->n_blocks; b++) st_file_close(files[b]);
    free(files);
    free(t);
    if (rc) return rc;

    /* Configs. */
    size_t n_float = 0;
    const char **float_names = calloc(p->st.n_layers + 5 * (size_t)p->n_blocks + 1, sizeof *float_names);
    char (*moe_names)[160] = calloc(5 * (size_t)p->n_blocks + 1, sizeof *moe_names);
    if (!float_names || !moe_names) { free(float_names); free(moe_names); return qd_err_set(err, QD_ENOMEM, "out of memory"); }
    for (size_t i = 0; i < p->st.n_layers; i++)
        if (!strcmp(p->st.layers[i].method, "float")) float_names[n_float++] = p->st.layers[i].name;
    /* MoE: the routers (and Qwen2-MoE's shared-expert gates) are linear-shaped and stay in
     * float; declared so, a loader that quantizes every Linear it is not told about leaves
     * them alone (vLLM never quantizes them anyway). So does a Gated DeltaNet layer's conv1d,
     * and DeepSeek-V3.2's indexer wk and weights_proj (vLLM's wk_weights_proj, quant_config None). */
    for (int b = 0, k = 0; b < p->n_blocks; b++)
        for (int j = 0; j < 5; j++) {
            const char *rel = j >= 3 ? qd_model_dsa_float(p->m, j - 3) : j == 2 ? qd_model_block_conv(p->m, b)
                              : j ? qd_model_moe_shared_gate(p->m) : qd_model_moe_router(p->m);
            char bp[160];
            if (!rel || (j < 2 && !qd_model_block_is_moe(p->m, b)) || qd_model_block_prefix(p->m, b, bp, sizeof bp)) continue;
            snprintf(moe_names[k], sizeof moe_names[k], "%s%s", bp, rel);
            float_names[n_float++] = moe_names[k++];
        }
    /* tp_aware: every reordered down projection has a trivial g_idx (a `dynamic` override). */
    qd_pipeline_tp_summary *tps = calloc(1, sizeof *tps);
    if (!tps) { free(float_names); free(moe_names); return qd_err_set(err, QD_ENOMEM, "out of memory"); }
    rc = qd_pipeline_tp_summarize(p, tps, err);
    if (rc) { free(float_names); free(moe_names); free(tps); return rc; }
    const char *tp_regex = tps->regex;
    cJSON *qcfg = qd_output_quant_config(p->job, float_names, n_float, &tp_regex, (size_t)tps->n_regex, p->st.awq_note);
    free(float_names);
    free(moe_names);
    if (!qcfg) { free(tps); return qd_err_set(err, QD_ENOMEM, "out of memory"); }
    if ((rc = float_roots(p, qcfg, err)) || (rc = qd_pipeline_bpw_config_groups(p, qcfg, err))) {
        cJSON_Delete(qcfg);
        free(tps);
        return rc;
    }
    rc = qd_output_write_config(p->job->model, p->out_dir, qcfg, qd_output_float_dtype(sm), err);
    cJSON_Delete(qcfg);
    if (!rc) rc = qd_output_copy_aux(p->job->model, p->out_dir, err);
    if (rc) { free(tps); return rc; }

    qd_report_extra x;
    memset(&x, 0, sizeof x);
    x.backend = p->be->name;
    x.layout_note = tps->note[0] ? tps->note : NULL;
    x.serving = p->job->serve.enabled ? &p->serving : NULL;
    if (p->job->eval.enabled) {
        qd_pipeline_report_progress(p, "eval", p->n_blocks - 1, NULL, 1, -1);
        int32_t *ids = NULL;
        size_t nids = 0;
        qd_eval_result before, after;
        rc = qd_eval_text_tokens(p->job->model, p->job->eval.path, &ids, &nids, err);
        if (!rc) rc = eval_dir(p, p->job->model, ids, nids, &before, err);
        if (!rc) rc = eval_dir(p, p->out_dir, ids, nids, &after, err);
        free(ids);
        if (rc) { free(tps); return qd_err_prefix(err, "eval"); }
        x.have_ppl = 1;
        x.ppl_before = before.ppl;
        x.ppl_after = after.ppl;
        x.eval_tokens = after.tokens;
        x.eval_windows = after.windows;
        x.eval_seq_len = after.seq_len;
        QD_LOG(QD_LOG_INFO, "eval", "job=%s ppl_before=%.4f ppl_after=%.4f windows=%lld", p->job->id, before.ppl,
               after.ppl, (long long)after.windows);
    }
    x.wall_seconds = qd_clock_now_s() - p->t_open;
    /* The output beside the whole checkpoint is the job's last disk peak; the eval may have
     * been its memory peak. */
    qd_pipeline_sample_peaks(p);
    x.estimate = &p->est;
    QD_LOG(QD_LOG_INFO, "resources", "job=%s peak_ram_bytes=%llu peak_rss_bytes=%llu disk_bytes=%llu peak_disk_bytes=%llu",
           p->job->id, (unsigned long long)p->est.peak_ram_bytes, (unsigned long long)p->st.peak_rss_bytes,
           (unsigned long long)p->est.disk_bytes, (unsigned long long)p->st.peak_disk_bytes);
    x.bpw = qd_pipeline_bpw_report(p);
    if (p->bpw.n_cand && !x.bpw) rc = qd_err_set(err, QD_ENOMEM, "out of memory");
    if (!rc) rc = qd_report_write(p->out_dir, p->job, &p->st, &x, err);
    cJSON_Delete(x.bpw);
    free(tps);
    /* state.json first, once the output's names are durable: a kill from here on leaves a
     * finished output, which a resume takes as done (its leftovers removed then), never a
     * checkpoint that claims every block with some block files already gone. */
    if (!rc) rc = qd_fs_fsync_dir(p->out_dir, err);
    if (!rc && unlinkat(p->ckpt_fd, "state.json", 0) != 0 && errno != ENOENT)
        rc = qd_err_set(err, QD_EIO, "%s/state.json: cannot remove: %s", p->ckpt_dir, strerror(errno));
    if (!rc && fsync(p->ckpt_fd) != 0)
        rc = qd_err_set(err, QD_EIO, "%s: cannot sync: %s", p->ckpt_dir, strerror(errno));
    /* The checkpoint goes through the descriptors the job holds (never by name). A helper
     * whose part lost to the lead's backup may still write its output there while this runs
     * (docs/parallel.md, failures): a directory found not empty is emptied again, a few
     * times (each late helper writes one file). */
    for (int tries = 0; !rc && tries < 8; tries++) {
        rc = qd_fs_remove_contents_fd(p->ckpt_fd, p->ckpt_dir, err);
        if (!rc && unlinkat(p->out_fd, ".quantd", AT_REMOVEDIR) != 0 && errno != ENOENT)
            rc = qd_err_set(err, QD_EIO, "%s: cannot remove directory: %s", p->ckpt_dir, strerror(errno));
        if (!rc) break;
        if (tries < 7) { rc = 0; qd_err_clear(err); }
    }
    if (!rc) rc = qd_fs_fsync_dir(p->out_dir, err);
    return rc;
}

int qd_pipeline_finish(qd_pipeline *p, qd_err *err)
{
    if (p->already_done) {
        /* A finish killed after its state.json went leaves the rest of .quantd/. */
        if (p->ckpt_fd >= 0 && qd_fs_remove_contents_fd(p->ckpt_fd, p->ckpt_dir, err) == 0 &&
            unlinkat(p->out_fd, ".quantd", AT_REMOVEDIR) == 0)
            QD_LOG(QD_LOG_INFO, "checkpoint_leftovers_removed", "job=%s", p->job->id);
        qd_err_clear(err);
        qd_pipeline_report_progress(p, "done", p->n_blocks - 1, NULL, 1, -1);
        return 0;
    }
    if (p->st.next_block < p->n_blocks)
        return qd_err_set(err, QD_EINVAL, "finish: blocks %d..%d are not done", p->st.next_block, p->n_blocks - 1);
    int rc = qd_pipeline_report_progress(p, "write", p->n_blocks - 1, NULL, 1, -1) ? QD_ECANCELLED : 0;
    if (rc) return qd_err_set(err, rc, "cancelled");
    remove_outputs(p->out_dir, p->job->id);
    rc = finish_write(p, err);
    /* Failed while the checkpoint is whole (its state.json goes first of its files, after
     * the report and the output's sync): nothing of this attempt stays beside it. Once
     * state.json is gone the output is complete, and stays. */
    char state[QD_PATH_MAX + 32];
    snprintf(state, sizeof state, "%s/state.json", p->ckpt_dir);
    if (rc && qd_fs_exists(state)) remove_outputs(p->out_dir, p->job->id);
    if (!rc) qd_pipeline_report_progress(p, "done", p->n_blocks - 1, NULL, 1, -1);
    else qd_pipeline_err_unmap(p, err);
    return rc;
}
