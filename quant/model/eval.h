/* Perplexity, the GPTQ way: the token stream is cut into consecutive non-overlapping
 * windows of seq_len (remainder dropped, no BOS inserted per window; a BOS at the stream's
 * start is the tokenizer's default, see qd_eval_text_tokens), each window is an
 * independent forward from position 0, the NLL of tokens 1..seq_len-1 of every window is
 * summed in double, and ppl = exp(sum / (windows * (seq_len - 1))).
 *
 * Windows are processed block-major, in passes: the hidden states of a pass's windows
 * (at most act_bytes, at least one batch) are held while each block is loaded once and
 * every batch of batch_rows tokens goes through it, then the block is freed. A stream that
 * fits one pass (the usual eval of a few hundred windows) therefore loads, and for a
 * quantized checkpoint dequantizes, every block exactly once; a longer one once per pass,
 * unless every block fits cache_bytes and stays loaded. Memory is bounded by act_bytes (twice
 * that with a reference model: its hidden states count in the same budget), one block's
 * F32 weights (or cache_bytes) and one batch's scratch, never by the stream length. The
 * batches are those of a window-by-batch loop, so the result does not depend on act_bytes. */
#ifndef QUANT_MODEL_EVAL_H
#define QUANT_MODEL_EVAL_H

#include <stddef.h>
#include <stdint.h>

#include "quant/model/model.h"

/* 1 GiB: 64 windows of 2048 tokens of a 7B model (hidden 4096) in one pass. */
#define QD_EVAL_ACT_BYTES_DEFAULT (1ull << 30)

typedef struct qd_eval_opts {
    int64_t seq_len;           /* window length (>= 2, <= max_position_embeddings) */
    int64_t max_windows;       /* 0: all windows */
    int64_t batch_rows;        /* tokens per batch; 0: 4096 (at least one window) */
    uint64_t cache_bytes;      /* keep all blocks loaded between passes when they fit; 0: 1 GiB */
    uint64_t act_bytes;        /* hidden states held per pass (both models'); 0: QD_EVAL_ACT_BYTES_DEFAULT */
    /* Called after each pass; a nonzero return cancels (QD_ECANCELLED). May be NULL. */
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
/* The eval stream of a text file (eval_text.c): the whole file tokenized once with the
 * tokenizer in tokenizer_dir, BOS first exactly when that tokenizer adds one by default
 * (add_bos_token), as transformers and lm-eval do. quantctl eval --text and a job's eval
 * both read their text through this. *ids is malloc'd and owned by the caller (free). */
int qd_eval_text_tokens(const char *tokenizer_dir, const char *text_path, int32_t **ids, size_t *n, qd_err *err);
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
