/* Perplexity, the GPTQ way: the token stream is cut into consecutive non-overlapping
 * windows of seq_len (remainder dropped, no BOS inserted per window), each window is an
 * independent forward from position 0, the NLL of tokens 1..seq_len-1 of every window is
 * summed in double, and ppl = exp(sum / (windows * (seq_len - 1))).
 *
 * Windows are processed in batches, block by block: every block's weights stay loaded
 * when all of them fit the cache budget (small models), otherwise each block is loaded
 * and freed once per batch. Memory is bounded by the batch size, not the stream length. */
#ifndef QUANT_MODEL_EVAL_H
#define QUANT_MODEL_EVAL_H

#include <stddef.h>
#include <stdint.h>

#include "quant/model/model.h"

typedef struct qd_eval_opts {
    int64_t seq_len;           /* window length (>= 2, <= max_position_embeddings) */
    int64_t max_windows;       /* 0: all windows */
    int64_t batch_rows;        /* tokens per batch; 0: 4096 (at least one window) */
    uint64_t cache_bytes;      /* keep all blocks loaded when they fit; 0: 1 GiB */
    /* Called after each batch; a nonzero return cancels (QD_ECANCELLED). May be NULL. */
    int (*progress)(void *ud, int64_t windows_done, int64_t windows_total);
    void *ud;
} qd_eval_opts;

typedef struct qd_eval_result {
    double ppl;
    double nll_sum;            /* nats */
    double mean_nll;
    int64_t windows;
    int64_t predicted;         /* windows * (seq_len - 1) */
    int64_t tokens;            /* windows * seq_len (tokens read) */
    int64_t seq_len;
    double seconds;            /* wall time of the evaluation */
    /* Against a reference model (qd_eval_ppl_vs; zero otherwise), over the same tokens: */
    int has_ref;
    double ref_ppl;            /* the reference's perplexity */
    double kl_mean;            /* mean KL(P_ref || P) per predicted token, nats */
    double kl_max;             /* the largest per-token KL */
    double top1_agree;         /* fraction of tokens whose argmax agrees with the reference's */
} qd_eval_result;

qd_eval_opts qd_eval_opts_default(int64_t seq_len);
/* Evaluates ids[0..n) (host). QD_EINVAL when the stream is shorter than one window. */
int qd_eval_ppl(qd_model *m, const int32_t *ids, size_t n, const qd_eval_opts *o,
                qd_eval_result *out, qd_err *err);
/* The same, plus how far m's next-token distributions are from ref's (e.g. the float model
 * a checkpoint was quantized from): the KL divergence, the way llama.cpp's
 * --kl-divergence reports it, and top-1 agreement. Both models must share the vocabulary;
 * ref is borrowed, and both run window batch by window batch. */
int qd_eval_ppl_vs(qd_model *m, qd_model *ref, const int32_t *ids, size_t n, const qd_eval_opts *o,
                   qd_eval_result *out, qd_err *err);

#endif
