/* The job's calibration token ids: the job's calibration file tokenized with the model's
 * tokenizer (or read as pre-tokenized ids) and sampled GPTQ-style or AWQ-style into n_seq
 * sequences of seq_len tokens, deterministic for the job's seed. A job without a
 * calibration path (RTN) gets at most 8 sequences of at most 512 ids drawn from the
 * model's vocabulary with the seed: RTN does not need them, they only feed the per-layer
 * error report. *ids is malloc'd
 * [n_seq * seq_len], owned by the caller. */
#ifndef QUANT_PIPELINE_CALIB_TOKENS_H
#define QUANT_PIPELINE_CALIB_TOKENS_H

#include <stdint.h>

#include "quant/core/error.h"
#include "quant/job/job.h"
#include "quant/model/model.h"

int qd_pipeline_calib_tokens(const qp_job *job, qd_model *m, int32_t **ids, int64_t *n_seq,
                             int64_t *seq_len, qd_err *err);

#endif
