/* Where a block's time and bytes went: seconds per stage, forward passes over the
 * calibration tokens, bytes written to the checkpoint. One record per committed block is
 * kept in state.json (so a resumed job reports every block), written to quantd_report.json
 * ("blocks" and "totals.stage_seconds") and sent with each block_done to the live status
 * ("last_block"). */
#ifndef QUANT_PIPELINE_COST_H
#define QUANT_PIPELINE_COST_H

#include <stdint.h>

typedef enum qd_stage {
    QD_STAGE_LOAD,          /* reading (and dequantizing) the block's weights */
    QD_STAGE_CALIBRATE,     /* capture forwards: the block run over the calibration inputs with
                               the Hessian / AWQ-input hooks (true-sequential re-runs included) */
    QD_STAGE_AWQ_SEARCH,    /* AWQ scale search and folding, and its clipping search */
    QD_STAGE_QUANTIZE,      /* GPTQ / RTN arithmetic */
    QD_STAGE_PACK,          /* the format's check and packing */
    QD_STAGE_ERROR,         /* per-layer relative error from the Hessian */
    QD_STAGE_KERNEL_CHECK,  /* the packed layer through the dequantizing kernel */
    QD_STAGE_FORWARD,       /* the quantized block run to make the next block's inputs */
    QD_STAGE_CHECKPOINT,    /* block file, next activations, state.json (fsynced) */
    QD_STAGE_COUNT
} qd_stage;

/* "load", "calibrate", "awq_search", "quantize", "pack", "error", "kernel_check",
 * "forward", "checkpoint"; NULL out of range. */
const char *qd_stage_name(qd_stage s);

typedef struct qd_block_cost {
    int block;
    double seconds;                     /* the whole block, wall clock */
    double stage[QD_STAGE_COUNT];       /* seconds per stage (their sum <= seconds) */
    int forward_passes;                 /* passes over all the calibration batches, partial ones
                                           included (AWQ's scoring passes over its 2048-token
                                           subsample are not counted: their time is awq_search's) */
    uint64_t bytes_written;             /* checkpoint bytes this block wrote (block file + activations) */
    /* MoE blocks: routed calibration tokens per expert (experts == 0 otherwise). */
    int experts;
    int64_t routed_min, routed_median, routed_max;
} qd_block_cost;

/* Sets c's MoE fields from n experts' routed-token counts (sorts routed in place). */
void qd_block_cost_set_coverage(qd_block_cost *c, int64_t *routed, int n);

struct cJSON;
/* {"block", "seconds", "stages": {name: s}, "forward_passes", "bytes_written"[, "moe_coverage":
 * {"experts", "min", "median", "max"}]}; the caller owns the tree. NULL when out of memory. */
struct cJSON *qd_block_cost_to_json(const qd_block_cost *c);
/* Reads what qd_block_cost_to_json wrote; missing members read as 0. */
void qd_block_cost_from_json(const struct cJSON *o, qd_block_cost *c);

#endif
