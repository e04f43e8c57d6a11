/* The pipeline's side of the TP-aware layout (job layout "tp_aware"): the one call
 * write_block_file makes before a block's tensors are written, and the summary
 * pipeline_finish puts into quantization_config and the report.
 *
 * This is the only file outside quant/pipeline that sees the pipeline's private state
 * (pipeline_internal.h): the permutation must act on a block's packed outputs just before
 * they are committed, after the block's forward has computed the next block's inputs with
 * the unpermuted weights, so calibration never sees the reorder. Because a block is
 * committed exactly once, a resumed job permutes every block exactly once too. */
#ifndef QUANT_TP_TP_PIPELINE_H
#define QUANT_TP_TP_PIPELINE_H

#include <stddef.h>

#include "quant/pipeline/pipeline_internal.h"

/* For a tp_aware job, permutes block's MLP pair in outs (indexed by linear) in place: the
 * packed down projection's rows and the column layers' outputs (packed, or float weights and
 * biases, which are then marked modified so they are written from memory). Does nothing for
 * a plain job or when the down projection stayed in float. Errors name the block and say
 * which shape rule failed. */
int qd_tp_layout_apply_block(qd_pipeline *p, int block, qd_linear_out *outs, qd_err *err);

/* What the finished output records about the layout. */
typedef struct qd_tp_layout_summary {
    int n_regex;                 /* 0 or 1 */
    char regex[4096];            /* Python regex of every down projection with a trivial g_idx */
    char note[1024];             /* the report's layout_note; "" for a plain job */
} qd_tp_layout_summary;

/* Fills s from the model and the layers the checkpoint state lists (works after a resume). */
int qd_tp_layout_summarize(const qd_pipeline *p, qd_tp_layout_summary *s, qd_err *err);

#endif
