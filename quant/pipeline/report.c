/* The job report (see report.h). */
#include "quant/pipeline/report.h"

#include "quant/algo/gptaq.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>

#include "quant/algo/gptaq.h"
#include "quant/core/fsutil.h"

cJSON *qd_report_moe_coverage(const qd_ckpt_state *st)
{
    cJSON *arr = NULL;
    int64_t *v = malloc((st->n_layers + 1) * sizeof *v);
    if (!v) return NULL;
    for (int b = 0; b < st->n_blocks; b++) {
        /* One count per expert: its gate linear (w1 / gate_proj) carries it. */
        size_t n = 0;
        cJSON *below = NULL;
        for (size_t i = 0; i < st->n_layers; i++) {
            const qd_layer_result *l = &st->layers[i];
            if (l->block != b || l->routed_tokens < 0 || !(strstr(l->name, ".w1") || strstr(l->name, ".gate_proj"))) continue;
            v[n++] = l->routed_tokens;
            if (strstr(l->note, "moe.min_tokens")) {
                if (!below) below = cJSON_CreateArray();
                char name[160];
                snprintf(name, sizeof name, "%.*s", (int)(strrchr(l->name, '.') - l->name), l->name);
                cJSON_AddItemToArray(below, cJSON_CreateString(name));
            }
        }
        if (n == 0) { cJSON_Delete(below); continue; }
        qd_block_cost c;
        memset(&c, 0, sizeof c);
        qd_block_cost_set_coverage(&c, v, (int)n);
        if (!arr) arr = cJSON_CreateArray();
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "block", b);
        cJSON_AddNumberToObject(o, "experts", (double)n);
        cJSON_AddNumberToObject(o, "min", (double)c.routed_min);
        cJSON_AddNumberToObject(o, "median", (double)c.routed_median);
        cJSON_AddNumberToObject(o, "max", (double)c.routed_max);
        cJSON_AddItemToObject(o, "below_min_tokens", below ? below : cJSON_CreateArray());
        cJSON_AddItemToArray(arr, o);
    }
    free(v);
    return arr;
}

/* est / measured to three decimals, or null when nothing was measured. */
static cJSON *ratio(uint64_t est, uint64_t measured)
{
    return measured ? cJSON_CreateNumber(round((double)est / (double)measured * 1000.0) / 1000.0) : cJSON_CreateNull();
}

cJSON *qd_report_resources(const qd_pipeline_estimate *est, const qd_ckpt_state *st)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *e = qd_pipeline_estimate_to_json(est);
    cJSON *m = cJSON_CreateObject();
    cJSON *r = cJSON_CreateObject();
    if (!o || !e || !m || !r) {
        cJSON_Delete(o); cJSON_Delete(e); cJSON_Delete(m); cJSON_Delete(r);
        return NULL;
    }
    cJSON_AddItemToObject(o, "estimate", e);
    cJSON_AddNumberToObject(m, "peak_rss_bytes", (double)st->peak_rss_bytes);
    cJSON_AddNumberToObject(m, "peak_disk_bytes", (double)st->peak_disk_bytes);
    cJSON_AddItemToObject(o, "measured", m);
    cJSON_AddItemToObject(r, "ram", ratio(est->peak_ram_bytes, st->peak_rss_bytes));
    cJSON_AddItemToObject(r, "disk", ratio(est->disk_bytes, st->peak_disk_bytes));
    cJSON_AddItemToObject(o, "ratio", r);
    return o;
}

int qd_report_write(const char *out_dir, const qp_job *job, const qd_ckpt_state *st,
                    const qd_report_extra *x, qd_err *err)
{
    cJSON *r = cJSON_CreateObject();
    if (!r) return qd_err_set(err, QD_ENOMEM, "out of memory");
    cJSON_AddNumberToObject(r, "version", QD_REPORT_VERSION);
    cJSON_AddStringToObject(r, "job_id", job->id);
    cJSON_AddItemToObject(r, "job", qp_job_to_cjson(job, 0));
    cJSON_AddStringToObject(r, "backend", x->backend ? x->backend : "");
    /* The arithmetic the blocks ran with: the job's "compute", auto resolved. */
    if (st->compute[0]) cJSON_AddStringToObject(r, "compute", st->compute);
    /* The fingerprint lets a rerun of the same job recognise this finished output. */
    cJSON *fp = cJSON_AddObjectToObject(r, "fingerprint");
    cJSON_AddStringToObject(fp, "model", st->fp.model);
    cJSON_AddStringToObject(fp, "options", st->fp.options);
    cJSON_AddStringToObject(fp, "calib", st->fp.calib);
    cJSON_AddBoolToObject(r, "cross_backend", st->cross_backend);
    if (st->cross_backend)
        cJSON_AddStringToObject(r, "cross_backend_note", "blocks were computed on more than one backend: the output is valid but not byte-identical to a single-backend run");
    size_t n_q = 0, n_f = 0, n_fb = 0;
    double sum_err = 0, max_err = 0, q_secs = 0;
    cJSON *layers = cJSON_CreateArray();
    for (size_t i = 0; i < st->n_layers; i++) {
        const qd_layer_result *l = &st->layers[i];
        cJSON_AddItemToArray(layers, qd_layer_result_to_json(l));
        if (!strcmp(l->method, "float")) { n_f++; continue; }
        n_q++;
        n_fb += l->fallback;
        sum_err += l->rel_error;
        if (l->rel_error > max_err) max_err = l->rel_error;
        q_secs += l->seconds;
    }
    cJSON *tot = cJSON_AddObjectToObject(r, "totals");
    cJSON_AddNumberToObject(tot, "blocks", st->n_blocks);
    cJSON_AddNumberToObject(tot, "layers_quantized", (double)n_q);
    cJSON_AddNumberToObject(tot, "layers_float", (double)n_f);
    cJSON_AddNumberToObject(tot, "gptq_fallbacks", (double)n_fb);
    cJSON_AddNumberToObject(tot, "mean_rel_error", n_q ? sum_err / n_q : 0);
    cJSON_AddNumberToObject(tot, "max_rel_error", max_err);
    cJSON_AddNumberToObject(tot, "quantize_seconds", q_secs);
    cJSON_AddNumberToObject(tot, "block_seconds", st->seconds);
    cJSON_AddNumberToObject(tot, "wall_seconds_last_run", x->wall_seconds);
    /* Where the block time went, summed over the blocks, and per block. */
    double stage_sum[QD_STAGE_COUNT] = {0};
    uint64_t bytes = 0;
    cJSON *blocks = cJSON_CreateArray();
    for (size_t i = 0; i < st->n_blocks_cost; i++) {
        for (int s = 0; s < QD_STAGE_COUNT; s++) stage_sum[s] += st->blocks[i].stage[s];
        bytes += st->blocks[i].bytes_written;
        cJSON_AddItemToArray(blocks, qd_block_cost_to_json(&st->blocks[i]));
    }
    cJSON *ss = cJSON_AddObjectToObject(tot, "stage_seconds");
    for (int s = 0; ss && s < QD_STAGE_COUNT; s++) cJSON_AddNumberToObject(ss, qd_stage_name(s), stage_sum[s]);
    cJSON_AddNumberToObject(tot, "checkpoint_bytes_written", (double)bytes);
    if (x->have_ppl) {
        cJSON *e = cJSON_AddObjectToObject(r, "eval");
        cJSON_AddNumberToObject(e, "ppl_before", x->ppl_before);
        cJSON_AddNumberToObject(e, "ppl_after", x->ppl_after);
        cJSON_AddNumberToObject(e, "tokens", (double)x->eval_tokens);
        cJSON_AddNumberToObject(e, "windows", (double)x->eval_windows);
        cJSON_AddNumberToObject(e, "seq_len", (double)x->eval_seq_len);
    }
    if (x->estimate) {
        cJSON *res = qd_report_resources(x->estimate, st);
        if (res) cJSON_AddItemToObject(r, "resources", res);
    }
    if (st->awq_note[0]) cJSON_AddStringToObject(r, "awq_note", st->awq_note);
    if (job->gptaq) {
        /* Which inputs GPTQ's updates were computed from (quant/algo/gptaq.h). */
        cJSON *g = cJSON_AddObjectToObject(r, "gptaq");
        cJSON_AddNumberToObject(g, "alpha", QD_GPTAQ_ALPHA_DEFAULT);
        cJSON_AddStringToObject(g, "hessian_inputs", "quantized model: each linear's inputs with the blocks and groups before it quantized (X_q)");
        cJSON_AddStringToObject(g, "asymmetric_inputs", "float model: each linear's inputs with every block in float (X_fp), in dXXT = (X_fp - X_q) X_q^T");
        cJSON_AddStringToObject(g, "objective", "||W X_fp - Q X_q||^2");
    }
    cJSON *cov = qd_report_moe_coverage(st);
    if (cov) cJSON_AddItemToObject(r, "moe_coverage", cov);
    if (x->layout_note) cJSON_AddStringToObject(r, "layout_note", x->layout_note);
    if (job->serve.enabled && x->serving) {
        cJSON *sv = cJSON_AddObjectToObject(r, "serving");
        cJSON_AddStringToObject(sv, "engine", job->serve.engine);
        cJSON_AddStringToObject(sv, "gpu", job->serve.gpu);
        cJSON_AddNumberToObject(sv, "tp", job->serve.tp);
        cJSON *sl = cJSON_AddArrayToObject(sv, "layers");
        for (size_t i = 0; sl && i < x->serving->n; i++) {
            const qd_serving_row *row = &x->serving->rows[i];
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "layer", row->name);
            cJSON_AddStringToObject(o, "kernel", row->is_float ? "float" : qd_srv_kernel_name(row->choice.kernel));
            if (!row->is_float) cJSON_AddStringToObject(o, "why", row->choice.why);
            cJSON_AddItemToArray(sl, o);
        }
    }
    if (x->bpw) cJSON_AddItemToObject(r, "bpw", cJSON_Duplicate(x->bpw, 1));
    cJSON_AddItemToObject(r, "blocks", blocks);
    cJSON_AddItemToObject(r, "layers", layers);
    char *text = cJSON_Print(r);
    cJSON_Delete(r);
    if (!text) return qd_err_set(err, QD_ENOMEM, "out of memory");
    char path[4096];
    snprintf(path, sizeof path, "%s/quantd_report.json", out_dir);
    int rc = qd_fs_write_atomic(path, text, strlen(text), err);
    free(text);
    return rc;
}
