/* quantd_report.json: what a job did, per layer and in total. Versioned
 * (QD_REPORT_VERSION); readers ignore fields they do not know. */
#ifndef QUANT_PIPELINE_REPORT_H
#define QUANT_PIPELINE_REPORT_H

#include "quant/core/error.h"
#include "quant/job/job.h"
#include "quant/pipeline/pipeline.h"
#include "quant/pipeline/state.h"
#include "quant/tp/tp_serving.h"

#define QD_REPORT_VERSION 1

typedef struct qd_report_extra {
    const char *backend;         /* backend of the final run */
    int have_ppl;
    double ppl_before, ppl_after;
    int64_t eval_tokens, eval_windows, eval_seq_len;
    double wall_seconds;         /* this run, open to finish */
    const char *layout_note;     /* TP-aware layout, or NULL */
    const qd_serving_report *serving;   /* job.serve: the vLLM kernel per layer, or NULL */
    const qd_pipeline_estimate *estimate;   /* the pre-flight estimate of the final run, or NULL:
                                               "resources" compares it with st's measured peaks */
    struct cJSON *bpw;           /* job.target_bpw: each layer's bits and why (borrowed), or NULL */
} qd_report_extra;

/* Writes <out_dir>/quantd_report.json atomically. */
int qd_report_write(const char *out_dir, const qp_job *job, const qd_ckpt_state *st,
                    const qd_report_extra *x, qd_err *err);

/* The estimate against what was measured: {"estimate": {peak_ram_bytes, disk_bytes},
 * "measured": {peak_rss_bytes, peak_disk_bytes}, "ratio": {ram, disk}} (estimate / measured,
 * null when nothing was measured). The measured peaks are st's: the most over every run of
 * the job, each run's resident set counted from the pipeline's open in its process (the
 * model's mmapped pages it read included: core/rss.h). Owned by the caller; NULL when out
 * of memory. */
struct cJSON *qd_report_resources(const qd_pipeline_estimate *est, const qd_ckpt_state *st);

/* MoE coverage per block from the layer results (each expert's routed calibration tokens):
 * [{block, experts, min, median, max, below_min_tokens: [expert module names]}], or NULL
 * for a dense model. Owned by the caller. */
struct cJSON *qd_report_moe_coverage(const qd_ckpt_state *st);

#endif
