/* job.target_bpw: the plan of bits and group size per linear, made once before block 0.
 *
 * Why a first pass and not a choice per block as blocks are done: the target is an average
 * over the whole model, and a choice made block by block cannot know how sensitive the later
 * blocks are, so it would either miss the target or spend it unevenly. The pass: one forward
 * of the calibration through the float model (no quantization, no true-sequential passes),
 * each block's Hessians of every input group as the non-sequential capture makes them, and
 * per input group and candidate the job's own quantizer on each of its linears (for a GPTQ
 * job GPTQ itself with the job's options through the pipeline's own call,
 * qd_pipeline_quantize_weight; for an RTN job RTN), then the block run again on the first
 * calibration sequences with those linears at the candidate (pipeline_bpw_block.c): the
 * error at the block's output, relative to each token's residual stream, is what the
 * allocation ranks. The plan is saved atomically in the checkpoint directory beside
 * state.json and read back on every resume, so the blocks quantized before and after an
 * interruption follow the same plan.
 *
 * Why the block's output and not each linear's own error: with the sum over linears of
 * tr(D H D^T) / tr(W H W^T) times output features (GPTQ's own error, within about 1% of
 * what the run then reports per layer) the plan lost to uniform g64 at the same size on
 * SmolLM2-135M (KL 0.312 against 0.249 over three draws): a layer's own noise-to-signal
 * ratio says nothing of how much of the residual stream that layer's output is, nor of what
 * the attention or the MLP after it does to its error. At the block's output every input
 * group's error is on one scale, the noise in the stream the rest of the model reads, and
 * the plan from it beat uniform g64 there (bench/results/target-bpw.md). The per-layer
 * error is still computed and kept (rel_err2, the report's): it costs nothing beside GPTQ.
 * The cost: per input group and candidate one block forward over a few sequences, beside
 * one GPTQ per candidate per linear. What is shared exactly: GPTQ's factorisation of H
 * depends on H, act order and the damping only, not on bits or group size, so one factor per
 * input group serves every candidate of every linear reading it (qd_gptq_shared). */
#include "quant/pipeline/pipeline_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include "quant/algo/bpw_alloc.h"
#include "quant/core/clock.h"
#include "quant/core/fsutil.h"
#include "quant/core/jsonfile.h"
#include "quant/core/log.h"

/* Bump when the file's keys or their meaning change; a plan of another version is refused
 * (the checkpoint then cannot be resumed, as its blocks followed that plan). 3: each layer's
 * "block_err2" (the block-output estimate, "gptq-block" / "rtn-block"); 2: the "estimate"
 * key ("gptq" or "rtn": the sum of per-layer errors); version 1 plans were RTN's per-layer
 * estimate for every job. A plan of an earlier version is of another estimate than any job's
 * now: made again before block 0, refused after. */
#define BPW_PLAN_VERSION 3

/* The estimate a job's plan is made with: its own quantizer ("gptq" or "rtn"; target_bpw
 * refuses AWQ and GPTAQ, job.c), its error measured at the block's output. */
static const char *plan_estimate(const qd_pipeline *p)
{
    return p->job->method == QP_METHOD_GPTQ || p->job->method == QP_METHOD_AWQ_GPTQ ? "gptq-block" : "rtn-block";
}

void qd_bpw_plan_free(qd_bpw_plan *b)
{
    if (!b) return;
    free(b->choice);
    free(b->err);
    free(b->blk);
    memset(b, 0, sizeof *b);
}

double qd_pipeline_bpw_size_bits(const qd_pipeline *p, int64_t n, int64_t k, int bits, int64_t gs)
{
    int64_t groups = gs > 0 ? (k + gs - 1) / gs : 1;
    /* compressed-tensors: F16 scales; asymmetric zero points packed at the code width. GPTQ
     * (a format with g_idx) stores the zeros packed at the code width even when symmetric,
     * and an I32 g_idx per input column. */
    int gptq = qd_pipeline_bpw_is_dynamic(p);
    double per_group = 16.0 + (p->job->sym && !gptq ? 0.0 : (double)bits);
    return (double)n * ((double)k * bits + (double)groups * per_group) + (gptq ? 32.0 * (double)k : 0.0);
}

qd_quant_cfg qd_pipeline_linear_qcfg(const qd_pipeline *p, int block, int li)
{
    qd_quant_cfg c = p->qcfg;
    const qd_bpw_plan *b = &p->bpw;
    if (b->n_cand > 0 && block >= 0 && block < b->n_blocks && li >= 0 && li < b->n_lin) {
        int ch = b->choice[(size_t)block * b->n_lin + li];
        if (ch >= 0) {
            c.bits = b->cand_bits[ch];
            c.group_size = b->cand_group[ch];
        }
    }
    return c;
}

/* The candidates: every listed bit width (or the format's) with every listed group size
 * (or the job's), smallest first. */
static int plan_candidates(qd_pipeline *p, qd_bpw_plan *b, qd_err *err)
{
    const qp_job *job = p->job;
    int bits[QP_JOB_BPW_MAX], nb = 0;
    if (job->n_bpw_bits) {
        for (int i = 0; i < job->n_bpw_bits; i++) bits[nb++] = job->bpw_bits[i];
    } else {
        for (int x = 2; x <= 8 && nb < QP_JOB_BPW_MAX; x++)
            if (p->fmt->bits_mask & (1u << x)) bits[nb++] = x;
    }
    int64_t groups[QP_JOB_BPW_MAX];
    int ng = 0;
    if (job->n_bpw_group_sizes) {
        for (int i = 0; i < job->n_bpw_group_sizes; i++) groups[ng++] = job->bpw_group_sizes[i];
    } else {
        groups[ng++] = job->group_size;
    }
    b->n_cand = 0;
    for (int i = 0; i < nb; i++)
        for (int j = 0; j < ng; j++) {
            b->cand_bits[b->n_cand] = bits[i];
            b->cand_group[b->n_cand] = groups[j];
            b->n_cand++;
        }
    return b->n_cand ? 0 : qd_err_set(err, QD_EINVAL, "target_bpw: no candidate bit width for format %s", p->fmt->name);
}

/* The group a linear reads (its Hessian's). */
static int linear_group(const qd_model *m, int li)
{
    for (int g = 0; g < qd_model_n_groups(m); g++) {
        const qd_input_group *G = qd_model_group(m, g);
        for (int j = 0; j < G->n_linears; j++)
            if (G->linears[j] == li) return g;
    }
    return -1;
}

/* The calibration sequences the block-output estimate runs on (the first ones): each
 * candidate of each input group costs one block forward over them, so a few; the Hessians
 * and the per-layer errors still use every sequence. */
#define BPW_BLOCK_SEQS 4

/* One block of the pass: the Hessians of its inputs (x: the block's inputs, in p->acts),
 * per input group and candidate each linear's own error and the block-output error of the
 * group at that candidate, and the block's float outputs into y. */
static int probe_block(qd_pipeline *p, qd_bpw_plan *b, int block, float *y, qd_err *err)
{
    int nl = qd_model_n_linears(p->m), ng = qd_model_n_groups(p->m);
    int64_t bseq = p->n_seq < BPW_BLOCK_SEQS ? p->n_seq : BPW_BLOCK_SEQS, brows = bseq * p->seq_len;
    size_t bbytes = (size_t)(brows * p->hidden) * sizeof(float);
    qd_block_weights *bw = NULL;
    qd_gptq_hessian *acc = calloc(QD_MAX_GROUPS, sizeof *acc);
    qd_linear_plan *plans = calloc(QD_MAX_LINEARS, sizeof *plans);
    qd_gptq_shared *shared = calloc(QD_MAX_GROUPS, sizeof *shared);   /* one factor per input group */
    float *w[QD_MAX_LINEARS] = {0}, *ovw[QD_MAX_LINEARS] = {0};       /* host float; backend candidate */
    double den[QD_MAX_LINEARS];
    float *yref = qd_backend_alloc(p->be, bbytes), *yq = qd_backend_alloc(p->be, bbytes);
    float *href = malloc(bbytes), *hq = malloc(bbytes);
    int use_gptq = !strcmp(plan_estimate(p), "gptq-block");
    int rc = !acc || !plans || !shared || !yref || !yq || !href || !hq ? qd_err_set(err, QD_ENOMEM, "out of memory") : 0;
    if (!rc) rc = qd_block_load(p->m, block, &bw, err);
    if (rc) goto out;
    for (int li = 0; li < nl; li++) qd_pipeline_plan_linear(p, block, li, &plans[li]);
    qd_capture_ctx c;
    qd_capture_init(&c, p, err);
    for (int g = 0; g < ng && !rc; g++) {
        if (plans[qd_model_group(p->m, g)->linears[0]].absent) continue;
        rc = qd_gptq_hessian_init(&acc[g], p->be, qd_model_group(p->m, g)->k, err);
        acc[g].bf16 = p->compute == QP_COMPUTE_BF16;
        c.want[g] = 1;
        c.acc[g] = &acc[g];
    }
    if (!rc) rc = qd_capture_run(p, bw, QD_BLOCK_ALL, y, &c, err);
    /* The float block's output on the estimate's rows, by the same forward the candidates
     * run (so the difference is the candidate's alone). */
    if (!rc) rc = qd_pipeline_bpw_block_forward(p, bw, NULL, bseq, yref, err);
    if (!rc) rc = qd_backend_download(p->be, href, yref, bbytes) ? qd_err_set(err, QD_EBACKEND, "%s", p->be->err.msg) : 0;
    for (int li = 0; li < nl && !rc; li++) {
        double *e = b->err + ((size_t)block * nl + li) * b->n_cand, *be = b->blk + ((size_t)block * nl + li) * b->n_cand;
        for (int ci = 0; ci < b->n_cand; ci++) e[ci] = be[ci] = NAN;
        b->choice[(size_t)block * nl + li] = plans[li].quantize ? 0 : -1;   /* quantized; the allocation picks which */
        den[li] = -1;   /* tr(W H W^T) * 2 / n, once per linear */
        if (!plans[li].quantize) continue;
        const qd_linear_info *L = qd_model_linear(p->m, li);
        if (linear_group(p->m, li) < 0) { rc = qd_err_set(err, QD_EINVAL, "target_bpw: linear %s has no input group", L->name); break; }
    }
    for (int g = 0; g < ng && !rc; g++) {
        const qd_input_group *G = qd_model_group(p->m, g);
        /* The group's float weights (host) and candidate weights (backend), one group at a
         * time: the pass holds at most one group's copies beside the block. */
        for (int j = 0; j < G->n_linears && !rc; j++) {
            int li = G->linears[j];
            if (!plans[li].quantize) continue;
            const qd_linear_info *L = qd_model_linear(p->m, li);
            w[li] = malloc((size_t)(L->n * L->k) * sizeof(float));
            ovw[li] = qd_backend_alloc(p->be, (size_t)(L->n * L->k) * sizeof(float));
            if (!w[li] || !ovw[li]) { rc = qd_err_set(err, QD_ENOMEM, "out of memory for %s", L->name); break; }
            rc = qd_block_linear_get(p->m, bw, li, w[li], NULL, err);
        }
        for (int ci = 0; ci < b->n_cand && !rc; ci++) {
            const float *over[QD_MAX_LINEARS] = {0};
            int any = 0, fits = 1;
            for (int j = 0; j < G->n_linears && !rc; j++) {
                int li = G->linears[j];
                if (!plans[li].quantize) continue;
                const qd_linear_info *L = qd_model_linear(p->m, li);
                double *e = b->err + ((size_t)block * nl + li) * b->n_cand;
                char why[160];
                any = 1;
                if (qd_format_misfit(p->fmt, L->n, L->k, b->cand_group[ci], why, sizeof why)) { fits = 0; continue; }
                qd_quant_cfg qc = p->qcfg;
                qc.bits = b->cand_bits[ci];
                qc.group_size = b->cand_group[ci];
                double tr[2], h_err = -1;
                qd_qlayer layer;
                qd_deq deq;
                memset(&layer, 0, sizeof layer);
                memset(&deq, 0, sizeof deq);
                const float *q = NULL;
                float *dq = NULL;
                if (use_gptq && acc[g].n_seen > 0) {
                    /* The pipeline's own GPTQ call, the job's options with the candidate's bits
                     * and group; the group's factor is made by the first call and reused. */
                    qd_layer_result res;
                    memset(&res, 0, sizeof res);
                    rc = qd_pipeline_quantize_weight(p, &qc, 1, 0.0f, w[li], L->n, L->k, &acc[g], &shared[g], &layer,
                                                     &deq, &res, &h_err, err);
                    q = deq.w;
                } else {
                    dq = malloc((size_t)(L->n * L->k) * sizeof *dq);
                    rc = dq ? qd_rtn_quantize(&qc, w[li], L->n, L->k, NULL, NULL, NULL, dq, err)
                            : qd_err_set(err, QD_ENOMEM, "out of memory for %s", L->name);
                    q = dq;
                }
                if (!rc && h_err >= 0 && den[li] >= 0) {
                    tr[0] = h_err * 2.0 / (double)L->n;   /* qd_pipeline_rel_traces' scale */
                    tr[1] = den[li];
                } else if (!rc) {
                    rc = qd_pipeline_rel_traces(p, w[li], q, L->n, L->k, &acc[g], h_err, tr, err);
                    if (!rc) den[li] = tr[1];
                }
                if (!rc) e[ci] = tr[1] > 0 ? fmax(tr[0], 0) / tr[1] : 0.0;
                if (!rc && qd_backend_upload(p->be, ovw[li], q, (size_t)(L->n * L->k) * sizeof(float)))
                    rc = qd_err_set(err, QD_EBACKEND, "%s", p->be->err.msg);
                over[li] = ovw[li];
                free(dq);
                qd_qlayer_free(&layer);
                qd_deq_free(&deq);
            }
            if (rc || !any || !fits) continue;
            /* The block with this group's linears at the candidate, every other one float. */
            rc = qd_pipeline_bpw_block_forward(p, bw, over, bseq, yq, err);
            if (!rc && qd_backend_download(p->be, hq, yq, bbytes)) rc = qd_err_set(err, QD_EBACKEND, "%s", p->be->err.msg);
            double v = rc ? NAN : qd_bpw_token_rel_err2(href, hq, brows, p->hidden);
            for (int j = 0; j < G->n_linears && !rc; j++)
                if (plans[G->linears[j]].quantize) b->blk[((size_t)block * nl + G->linears[j]) * b->n_cand + ci] = v;
        }
        for (int j = 0; j < G->n_linears; j++) {
            int li = G->linears[j];
            free(w[li]);
            qd_backend_free(p->be, ovw[li]);
            w[li] = NULL;
            ovw[li] = NULL;
        }
    }
out:
    for (int li = 0; li < QD_MAX_LINEARS; li++) {
        free(w[li]);
        qd_backend_free(p->be, ovw[li]);
    }
    qd_backend_free(p->be, yref);
    qd_backend_free(p->be, yq);
    free(href);
    free(hq);
    for (int g = 0; shared && g < ng; g++) qd_gptq_shared_free(&shared[g]);   /* before its accumulator */
    free(shared);
    for (int g = 0; acc && g < ng; g++) qd_gptq_hessian_free(&acc[g]);
    free(acc);
    free(plans);
    qd_block_free(p->m, bw);
    return rc ? qd_err_prefix(err, "target_bpw: block %d", block) : 0;
}

/* The pass over every block from p->acts (block 0's inputs, left as they were). */
static int probe(qd_pipeline *p, qd_bpw_plan *b, qd_err *err)
{
    size_t bytes = (size_t)(p->n_seq * p->seq_len * p->hidden) * sizeof(float);
    float *x0 = p->acts, *buf[2] = {qd_backend_alloc(p->be, bytes), qd_backend_alloc(p->be, bytes)};
    int rc = !buf[0] || !buf[1] ? qd_err_set(err, QD_ENOMEM, "target_bpw: out of memory for two activation buffers") : 0;
    for (int blk = 0; blk < p->n_blocks && !rc; blk++) {
        if (qd_pipeline_report_progress(p, "bpw_plan", blk, NULL, 0.0, -1)) rc = qd_err_set(err, QD_ECANCELLED, "cancelled");
        float *y = buf[blk % 2];
        if (!rc) rc = probe_block(p, b, blk, y, err);
        p->acts = y;
    }
    p->acts = x0;
    qd_backend_free(p->be, buf[0]);
    qd_backend_free(p->be, buf[1]);
    return rc;
}

/* The allocation over the linears the pass marked quantized, one choice per input group of
 * a block: the linears that read one input (q/k/v, gate/up) take the same bits and group
 * size, because vLLM fuses them into one layer and refuses shards of different schemes
 * (compressed_tensors.py, _get_scheme_from_parts / find_matched_target). */
static int allocate(qd_pipeline *p, qd_bpw_plan *b, qd_err *err)
{
    int nl = b->n_lin, ng = qd_model_n_groups(p->m), total = b->n_blocks * ng, n = 0;
    qd_bpw_item *items = calloc((size_t)total, sizeof *items);
    double *sizes = calloc((size_t)total * b->n_cand, sizeof *sizes);
    double *errs = calloc((size_t)total * b->n_cand, sizeof *errs);
    int *idx = calloc((size_t)total, sizeof *idx), *pick = calloc((size_t)total, sizeof *pick);
    int rc = !items || !sizes || !errs || !idx || !pick ? qd_err_set(err, QD_ENOMEM, "out of memory") : 0;
    double weights = 0;
    for (int i = 0; i < total && !rc; i++) {
        const qd_input_group *G = qd_model_group(p->m, i % ng);
        int blk = i / ng, any = 0;
        double *sz = sizes + (size_t)i * b->n_cand, *er = errs + (size_t)i * b->n_cand;
        for (int j = 0; j < G->n_linears; j++) {
            int at = blk * nl + G->linears[j];
            if (b->choice[at] < 0) continue;
            const qd_linear_info *L = qd_model_linear(p->m, G->linears[j]);
            for (int c = 0; c < b->n_cand; c++) {
                sz[c] += qd_pipeline_bpw_size_bits(p, L->n, L->k, b->cand_bits[c], b->cand_group[c]);
                /* The group's block-output error, on each of its linears alike (NaN: does not fit). */
                if (!any) er[c] = b->blk[(size_t)at * b->n_cand + c];
            }
            weights += (double)(L->n * L->k);
            any = 1;
        }
        if (!any) continue;
        items[n] = (qd_bpw_item){b->n_cand, sz, er};
        idx[n++] = i;
    }
    double es = 0, ss = 0;
    if (!rc && n == 0) rc = qd_err_set(err, QD_EINVAL, "target_bpw: no linear is quantized");
    if (!rc) rc = qd_bpw_allocate(items, n, b->target * weights, QD_BPW_UNITS_DEFAULT, pick, &es, &ss, err);
    if (rc) qd_err_prefix(err, "target_bpw %g", b->target);
    for (int j = 0; j < n && !rc; j++) {
        const qd_input_group *G = qd_model_group(p->m, idx[j] % ng);
        for (int x = 0; x < G->n_linears; x++) {
            int at = idx[j] / ng * nl + G->linears[x];
            if (b->choice[at] >= 0) b->choice[at] = pick[j];
        }
    }
    if (!rc) b->bpw = ss / weights;
    free(items); free(sizes); free(errs); free(idx); free(pick);
    return rc;
}

static int plan_save(const qd_pipeline *p, const qd_bpw_plan *b, const char *path, qd_err *err)
{
    cJSON *o = cJSON_CreateObject(), *cands = cJSON_AddArrayToObject(o, "candidates"),
          *layers = cJSON_AddArrayToObject(o, "layers");
    int bad = !o || !cands || !layers;
    if (!bad) {
        cJSON_AddNumberToObject(o, "version", BPW_PLAN_VERSION);
        bad |= !cJSON_AddStringToObject(o, "estimate", plan_estimate(p));
        bad |= !qd_json_add_exact(o, "target_bpw", b->target);
        bad |= !qd_json_add_exact(o, "bpw", b->bpw);
        bad |= !qd_json_add_exact(o, "seconds", b->seconds);
        cJSON_AddNumberToObject(o, "n_blocks", b->n_blocks);
        cJSON_AddNumberToObject(o, "n_linears", b->n_lin);
    }
    for (int c = 0; !bad && c < b->n_cand; c++) {
        double v[2] = {b->cand_bits[c], (double)b->cand_group[c]};
        bad |= !cJSON_AddItemToArray(cands, cJSON_CreateDoubleArray(v, 2));
    }
    for (int i = 0; !bad && i < b->n_blocks * b->n_lin; i++) {
        if (b->choice[i] < 0) continue;
        cJSON *l = cJSON_CreateObject(), *e = cJSON_CreateArray(), *be = cJSON_CreateArray();
        if (!l || !e || !be || !cJSON_AddItemToArray(layers, l)) { cJSON_Delete(l); cJSON_Delete(e); cJSON_Delete(be); bad = 1; break; }
        if (!cJSON_AddItemToObject(l, "rel_err2", e)) { cJSON_Delete(e); cJSON_Delete(be); bad = 1; break; }
        if (!cJSON_AddItemToObject(l, "block_err2", be)) { cJSON_Delete(be); bad = 1; break; }
        char prefix[160], name[400];
        qd_model_block_prefix(p->m, i / b->n_lin, prefix, sizeof prefix);
        snprintf(name, sizeof name, "%s%s", prefix, qd_model_linear(p->m, i % b->n_lin)->name);
        cJSON_AddStringToObject(l, "name", name);
        cJSON_AddNumberToObject(l, "block", i / b->n_lin);
        cJSON_AddNumberToObject(l, "linear", i % b->n_lin);
        cJSON_AddNumberToObject(l, "choice", b->choice[i]);
        for (int c = 0; c < 2 * b->n_cand && !bad; c++) {
            /* Exact doubles (qd_json_add_exact writes into an object; the node is moved). */
            const double *src = c < b->n_cand ? b->err : b->blk;
            cJSON *h = cJSON_CreateObject();
            cJSON *node = h && qd_json_add_exact(h, "v", src[(size_t)i * b->n_cand + c % b->n_cand])
                              ? cJSON_DetachItemFromObject(h, "v") : NULL;
            cJSON_Delete(h);
            if (!node || !cJSON_AddItemToArray(c < b->n_cand ? e : be, node)) { cJSON_Delete(node); bad = 1; }
        }
    }
    char *text = bad ? NULL : cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!text) return qd_err_set(err, QD_ENOMEM, "out of memory");
    int rc = qd_fs_write_atomic(path, text, strlen(text), err);
    free(text);
    return rc;
}

/* QD_EMISMATCH: a plan made with another estimate than the job's (a version 1 plan: RTN's
 * for every job); QD_EFORMAT: not a plan for this job. */
static int plan_load(const qd_pipeline *p, qd_bpw_plan *b, const char *path, qd_err *err)
{
    cJSON *o = NULL;
    int rc = qd_json_read_object(path, QD_INPUT_JSON, &o, err);
    if (rc) return rc;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "version");
    const cJSON *est = cJSON_GetObjectItemCaseSensitive(o, "estimate");
    const char *made = cJSON_IsNumber(v) && v->valueint == 1 ? "rtn" : cJSON_IsString(est) ? est->valuestring : "?";
    if (cJSON_IsNumber(v) && v->valueint >= 1 && v->valueint <= BPW_PLAN_VERSION && strcmp(made, plan_estimate(p))) {
        rc = qd_err_set(err, QD_EMISMATCH, "%s: made with the %s estimate (version %d), this job's is %s's", path, made,
                        v->valueint, plan_estimate(p));
        cJSON_Delete(o);
        return rc;
    }
    const cJSON *cands = cJSON_GetObjectItemCaseSensitive(o, "candidates");
    const cJSON *layers = cJSON_GetObjectItemCaseSensitive(o, "layers");
    const cJSON *tb = cJSON_GetObjectItemCaseSensitive(o, "target_bpw");
    const cJSON *bp = cJSON_GetObjectItemCaseSensitive(o, "bpw");
    const cJSON *sec = cJSON_GetObjectItemCaseSensitive(o, "seconds");
    /* An earlier version's plan is of an estimate no job makes now (checked above). */
    if (!cJSON_IsNumber(v) || v->valueint != BPW_PLAN_VERSION || !cJSON_IsArray(cands) || !cJSON_IsArray(layers) ||
        !cJSON_IsNumber(tb) || tb->valuedouble != b->target || !cJSON_IsNumber(bp))
        rc = qd_err_set(err, QD_EFORMAT, "%s: not a version %d plan for target_bpw %g", path, BPW_PLAN_VERSION, b->target);
    int i = 0;
    for (const cJSON *c = cands ? cands->child : NULL; !rc && c; c = c->next, i++) {
        if (i >= b->n_cand || !cJSON_IsArray(c) || cJSON_GetArraySize(c) != 2 ||
            cJSON_GetArrayItem(c, 0)->valuedouble != b->cand_bits[i] ||
            cJSON_GetArrayItem(c, 1)->valuedouble != (double)b->cand_group[i])
            rc = qd_err_set(err, QD_EFORMAT, "%s: its candidates are not the job's", path);
    }
    if (!rc && i != b->n_cand) rc = qd_err_set(err, QD_EFORMAT, "%s: its candidates are not the job's", path);
    for (const cJSON *l = layers ? layers->child : NULL; !rc && l; l = l->next) {
        const cJSON *bl = cJSON_GetObjectItemCaseSensitive(l, "block"), *li = cJSON_GetObjectItemCaseSensitive(l, "linear"),
                    *ch = cJSON_GetObjectItemCaseSensitive(l, "choice"), *e = cJSON_GetObjectItemCaseSensitive(l, "rel_err2"),
                    *be = cJSON_GetObjectItemCaseSensitive(l, "block_err2");
        if (!cJSON_IsNumber(bl) || !cJSON_IsNumber(li) || !cJSON_IsNumber(ch) || !cJSON_IsArray(e) || !cJSON_IsArray(be) ||
            cJSON_GetArraySize(be) != b->n_cand ||
            bl->valueint < 0 || bl->valueint >= b->n_blocks || li->valueint < 0 || li->valueint >= b->n_lin ||
            ch->valueint < 0 || ch->valueint >= b->n_cand || cJSON_GetArraySize(e) != b->n_cand) {
            rc = qd_err_set(err, QD_EFORMAT, "%s: a layer entry is not valid", path);
            break;
        }
        size_t at = (size_t)bl->valueint * b->n_lin + li->valueint;
        b->choice[at] = ch->valueint;
        int c = 0;
        for (const cJSON *x = e->child; x; x = x->next, c++)
            b->err[at * b->n_cand + c] = cJSON_IsNumber(x) ? x->valuedouble : NAN;
        c = 0;
        for (const cJSON *x = be->child; x; x = x->next, c++)
            b->blk[at * b->n_cand + c] = cJSON_IsNumber(x) ? x->valuedouble : NAN;
    }
    if (!rc) {
        b->bpw = bp->valuedouble;
        b->seconds = cJSON_IsNumber(sec) ? sec->valuedouble : 0;
    }
    cJSON_Delete(o);
    return rc;
}

int qd_pipeline_bpw_preflight(qd_pipeline *p, qd_err *err)
{
    const qp_job *job = p->job;
    if (job->target_bpw == 0) return 0;
    qd_bpw_plan b;
    memset(&b, 0, sizeof b);
    int rc = plan_candidates(p, &b, err);
    if (!rc) rc = qd_pipeline_bpw_dynamic_preflight(p, err);
    if (rc) return rc;
    /* The least each quantized linear can store (its smallest candidate that fits): a target
     * below that is refused before any work. */
    double least = 0, weights = 0;
    int nl = qd_model_n_linears(p->m);
    for (int blk = 0; blk < p->n_blocks; blk++)
        for (int li = 0; li < nl; li++) {
            qd_linear_plan plan;
            qd_pipeline_plan_linear(p, blk, li, &plan);
            if (!plan.quantize) continue;
            const qd_linear_info *L = qd_model_linear(p->m, li);
            double lo = INFINITY;
            for (int c = 0; c < b.n_cand; c++) {
                char why[160];
                if (qd_format_misfit(p->fmt, L->n, L->k, b.cand_group[c], why, sizeof why)) continue;
                lo = fmin(lo, qd_pipeline_bpw_size_bits(p, L->n, L->k, b.cand_bits[c], b.cand_group[c]));
            }
            least += lo;
            weights += (double)(L->n * L->k);
        }
    if (weights > 0 && least > job->target_bpw * weights)
        return qd_err_set(err, QD_EINVAL, "target_bpw %g: the smallest candidates need %.4f bits per weight on this model "
                          "(%s holds %s bits); raise target_bpw or add smaller candidates", job->target_bpw,
                          least / weights, p->fmt->name, p->fmt->bits_mask == ((1u << 4) | (1u << 8)) ? "4 and 8" : "2, 3, 4 and 8");
    return 0;
}

int qd_pipeline_bpw_prepare(qd_pipeline *p, qd_err *err)
{
    const qp_job *job = p->job;
    if (job->target_bpw == 0 || p->bpw.n_cand) return 0;
    qd_bpw_plan b;
    memset(&b, 0, sizeof b);
    b.target = job->target_bpw;
    b.n_blocks = p->n_blocks;
    b.n_lin = qd_model_n_linears(p->m);
    size_t total = (size_t)b.n_blocks * b.n_lin;
    int rc = plan_candidates(p, &b, err);
    if (!rc) {
        b.choice = malloc(total * sizeof *b.choice);
        b.err = malloc(total * b.n_cand * sizeof *b.err);
        b.blk = malloc(total * b.n_cand * sizeof *b.blk);
        if (!b.choice || !b.err || !b.blk) rc = qd_err_set(err, QD_ENOMEM, "out of memory");
    }
    for (size_t i = 0; !rc && i < total; i++) b.choice[i] = -1;
    for (size_t i = 0; !rc && i < total * b.n_cand; i++) b.err[i] = b.blk[i] = NAN;
    char path[QD_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/bpw-plan.json", p->ckpt_dir);
    int have = !rc && qd_fs_exists(path);
    if (have) {
        rc = plan_load(p, &b, path, err);
        if (rc == QD_EMISMATCH && p->st.next_block == 0) {
            /* No block followed it yet: made again with the job's estimate. */
            QD_LOG(QD_LOG_WARN, "bpw_plan_remade", "job=%s reason=\"%s\"", job->id, err->msg);
            rc = 0;
            have = 0;
            for (size_t i = 0; i < total; i++) b.choice[i] = -1;
            for (size_t i = 0; i < total * b.n_cand; i++) b.err[i] = b.blk[i] = NAN;
        } else if (rc == QD_EMISMATCH) {
            qd_err_prefix(err, "the checkpoint's %d blocks followed a plan of another estimate; start the job again "
                          "in a new output (or delete it)", p->st.next_block);
        }
    }
    if (!rc && !have && p->st.next_block > 0) {
        rc = qd_err_set(err, QD_EFORMAT, "the checkpoint has %d blocks done but no bpw-plan.json (target_bpw's plan)",
                        p->st.next_block);
    } else if (!rc && !have) {
        double t0 = qd_clock_now_s();
        rc = probe(p, &b, err);
        if (!rc) rc = allocate(p, &b, err);
        b.seconds = qd_clock_now_s() - t0;
        if (!rc) rc = plan_save(p, &b, path, err);
        if (!rc)
            QD_LOG(QD_LOG_INFO, "bpw_plan", "job=%s target_bpw=%g bpw=%.5f candidates=%d seconds=%.2f", job->id, b.target,
                   b.bpw, b.n_cand, b.seconds);
    }
    if (rc) { qd_bpw_plan_free(&b); return rc; }
    p->bpw = b;
    /* job.serve: the report's kernel per layer, now as the plan writes them. */
    return job->serve.enabled ? qd_pipeline_check_serving(p, err) : 0;
}

/* The full module name of linear li in block b. */
static void module_name(const qd_pipeline *p, int b, int li, char *out, size_t cap)
{
    char prefix[160];
    qd_model_block_prefix(p->m, b, prefix, sizeof prefix);
    snprintf(out, cap, "%s%s", prefix, qd_model_linear(p->m, li)->name);
}

int qd_pipeline_bpw_config_groups(const qd_pipeline *p, cJSON *q, qd_err *err)
{
    const qd_bpw_plan *b = &p->bpw;
    if (!b->n_cand) return 0;
    if (qd_pipeline_bpw_is_dynamic(p)) return qd_pipeline_bpw_dynamic(p, q, err);
    cJSON *groups = cJSON_GetObjectItemCaseSensitive(q, "config_groups");
    if (!cJSON_IsObject(groups)) return qd_err_set(err, QD_EINVAL, "target_bpw: the format's config has no config_groups");
    /* The format's one group is replaced by one per candidate in use, each targeting its
     * modules by name (compressed-tensors and vLLM match a target equal to the module's name). */
    while (groups->child) cJSON_Delete(cJSON_DetachItemViaPointer(groups, groups->child));
    int total = b->n_blocks * b->n_lin, k = 0;
    for (int c = 0; c < b->n_cand; c++) {
        int used = 0;
        for (int i = 0; i < total && !used; i++) used = b->choice[i] == c;
        if (!used) continue;
        qd_fmt_config_in in = {
            .s = {.bits = b->cand_bits[c], .group_size = b->cand_group[c], .sym = p->job->sym, .desc_act = 0,
                  .static_groups = p->job->static_groups},
            .damp_percent = p->job->damp_percent, .true_sequential = p->job->true_sequential,
        };
        cJSON *one = p->fmt->quant_config(&in);
        cJSON *og = one ? cJSON_GetObjectItemCaseSensitive(one, "config_groups") : NULL;
        cJSON *g0 = cJSON_IsObject(og) ? cJSON_DetachItemViaPointer(og, og->child) : NULL;
        cJSON_Delete(one);
        cJSON *targets = cJSON_CreateArray();
        if (!g0 || !targets) { cJSON_Delete(g0); cJSON_Delete(targets); return qd_err_set(err, QD_ENOMEM, "out of memory"); }
        for (int i = 0; i < total; i++) {
            if (b->choice[i] != c) continue;
            char name[400];
            module_name(p, i / b->n_lin, i % b->n_lin, name, sizeof name);
            cJSON_AddItemToArray(targets, cJSON_CreateString(name));
        }
        cJSON_ReplaceItemInObjectCaseSensitive(g0, "targets", targets);
        char key[32];
        snprintf(key, sizeof key, "group_%d", k++);
        cJSON_AddItemToObject(groups, key, g0);
    }
    cJSON *meta = cJSON_GetObjectItemCaseSensitive(q, "meta");
    if (meta) {
        qd_json_add_exact(meta, "target_bpw", b->target);
        qd_json_add_exact(meta, "bpw", b->bpw);
    }
    return 0;
}

cJSON *qd_pipeline_bpw_report(const qd_pipeline *p)
{
    const qd_bpw_plan *b = &p->bpw;
    if (!b->n_cand) return NULL;
    cJSON *o = cJSON_CreateObject();
    cJSON *cands = o ? cJSON_AddArrayToObject(o, "candidates") : NULL;
    cJSON *layers = o ? cJSON_AddArrayToObject(o, "layers") : NULL;
    if (!cands || !layers) { cJSON_Delete(o); return NULL; }
    cJSON_AddNumberToObject(o, "target_bpw", b->target);
    cJSON_AddNumberToObject(o, "bpw", b->bpw);
    cJSON_AddNumberToObject(o, "plan_seconds", b->seconds);
    cJSON_AddStringToObject(o, "estimate", plan_estimate(p));
    cJSON_AddStringToObject(o, "error", "rel_err2: tr((W-Q) H (W-Q)^T) / tr(W H W^T) per candidate, Q the job's "
                                        "quantizer (estimate: gptq-block with the job's GPTQ options, or rtn-block) on "
                                        "the float model's calibration inputs; block_err2: the block's output with the "
                                        "linear's input group at the candidate (the group's linears alike), its error "
                                        "relative to each token's float output, squared, averaged over the first "
                                        "calibration sequences' tokens; the plan minimises the sum of block_err2 over "
                                        "the input groups within target_bpw, one choice per input group (q/k/v, gate/up "
                                        "share one)");
    for (int c = 0; c < b->n_cand; c++) {
        cJSON *x = cJSON_CreateObject();
        cJSON_AddNumberToObject(x, "bits", b->cand_bits[c]);
        cJSON_AddNumberToObject(x, "group_size", (double)b->cand_group[c]);
        cJSON_AddItemToArray(cands, x);
    }
    for (int i = 0; i < b->n_blocks * b->n_lin; i++) {
        int c = b->choice[i];
        if (c < 0) continue;
        const qd_linear_info *L = qd_model_linear(p->m, i % b->n_lin);
        char name[400], why[256];
        module_name(p, i / b->n_lin, i % b->n_lin, name, sizeof name);
        const double *e = b->blk + (size_t)i * b->n_cand, *re = b->err + (size_t)i * b->n_cand;
        double own = qd_pipeline_bpw_size_bits(p, L->n, L->k, b->cand_bits[c], b->cand_group[c]) / (double)(L->n * L->k);
        /* Why: its error here, and the next smaller candidate's (what the bits bought). */
        int smaller = -1;
        double sb = 0;
        for (int d = 0; d < b->n_cand; d++) {
            double bd = qd_pipeline_bpw_size_bits(p, L->n, L->k, b->cand_bits[d], b->cand_group[d]) / (double)(L->n * L->k);
            if (isfinite(e[d]) && bd < own && (smaller < 0 || bd > sb)) smaller = d, sb = bd;
        }
        if (smaller >= 0)
            snprintf(why, sizeof why, "block_err2 %.3g at %.4g bpw; the next smaller, %d bits g%lld at %.4g bpw, %.3g (x%.3g)",
                     e[c], own, b->cand_bits[smaller], (long long)b->cand_group[smaller], sb, e[smaller],
                     e[c] > 0 ? e[smaller] / e[c] : 0.0);
        else
            snprintf(why, sizeof why, "block_err2 %.3g at %.4g bpw, the smallest candidate", e[c], own);
        cJSON *l = cJSON_CreateObject();
        cJSON *ev = cJSON_CreateArray(), *bv = cJSON_CreateArray();
        if (!l || !ev || !bv) { cJSON_Delete(l); cJSON_Delete(ev); cJSON_Delete(bv); cJSON_Delete(o); return NULL; }
        cJSON_AddStringToObject(l, "name", name);
        cJSON_AddNumberToObject(l, "bits", b->cand_bits[c]);
        cJSON_AddNumberToObject(l, "group_size", (double)b->cand_group[c]);
        cJSON_AddNumberToObject(l, "bpw", own);
        for (int d = 0; d < b->n_cand; d++) {
            cJSON_AddItemToArray(ev, isfinite(re[d]) ? cJSON_CreateNumber(re[d]) : cJSON_CreateNull());
            cJSON_AddItemToArray(bv, isfinite(e[d]) ? cJSON_CreateNumber(e[d]) : cJSON_CreateNull());
        }
        cJSON_AddItemToObject(l, "rel_err2", ev);
        cJSON_AddItemToObject(l, "block_err2", bv);
        cJSON_AddStringToObject(l, "why", why);
        cJSON_AddItemToArray(layers, l);
    }
    return o;
}
