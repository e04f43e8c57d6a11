/* Calibration samples: token windows of seq_len drawn from a corpus.
 *
 * Inputs: plain text (one document), JSONL (one document per line, the string under a
 * chosen field, "text" by default), or a token file (quant/model/token_file.h: one stream).
 * Each document is tokenized on its own with the tokenizer's default BOS handling.
 *
 * Styles:
 *   GPTQ: the documents' ids are concatenated into one stream and n_samples windows are
 *         drawn at uniformly random starts in [0, len - seq_len - 1] (as GPTQ's
 *         randint(0, len - seqlen - 1)), from a fixed seeded generator (splitmix64 with
 *         Lemire's unbiased range reduction) — the same seed gives the same samples on any
 *         machine.
 *   AWQ:  the documents (JSONL lines) are shuffled with the seed, as AutoAWQ shuffles its
 *         dataset (qd_calib_shuffle_order, the same generator), then taken in that order
 *         (those longer than max_doc_tokens skipped, as AutoAWQ skips lines over its
 *         max_seq_len), concatenated, and cut into consecutive blocks of seq_len; only the
 *         documents needed are tokenized. n_samples is the number of blocks returned. A
 *         single document (plain text, a token file) is cut from its start.
 * seq_len is clamped to the model's max_position_embeddings with a warning. A corpus too
 * small for the request is QD_EINVAL with a message giving both sizes. */
#ifndef QUANT_MODEL_CALIB_H
#define QUANT_MODEL_CALIB_H

#include <stddef.h>
#include <stdint.h>

#include "quant/core/error.h"
#include "quant/model/tokenizer/tokenizer.h"

typedef enum qd_calib_input {
    QD_CALIB_INPUT_AUTO = 0,   /* by extension: .jsonl → JSONL, .json/.bin → tokens, else text */
    QD_CALIB_INPUT_TEXT,
    QD_CALIB_INPUT_JSONL,
    QD_CALIB_INPUT_TOKENS,
} qd_calib_input;

typedef enum qd_calib_style {
    QD_CALIB_GPTQ = 0,         /* random windows of the concatenated stream */
    QD_CALIB_AWQ,              /* documents concatenated and split into blocks */
} qd_calib_style;

typedef struct qd_calib_opts {
    const char *path;
    qd_calib_input input;
    const char *field;         /* JSONL field; NULL: "text" */
    qd_calib_style style;
    int64_t n_samples;
    int64_t seq_len;
    uint64_t seed;
    int64_t max_doc_tokens;    /* AWQ: skip longer documents; 0: keep all */
    int64_t max_pos;           /* the model's max_position_embeddings; 0: no clamp */
} qd_calib_opts;

/* n_samples windows of seq_len ids, row-major; owned by the struct (qd_calib_free). */
typedef struct qd_calib_set {
    int64_t n_samples;
    int64_t seq_len;           /* after clamping */
    int32_t *ids;              /* [n_samples * seq_len] */
    int64_t corpus_tokens;     /* ids available in the corpus (after AWQ's skipping) */
    int64_t docs;              /* documents read */
} qd_calib_set;

qd_calib_opts qd_calib_opts_default(void);   /* GPTQ style, 128 x 2048, seed 0, field "text" */
/* Reads and samples. tok may be NULL only for token files. */
int qd_calib_load(const qd_calib_opts *o, const qd_tokenizer *tok, qd_calib_set *out, qd_err *err);
void qd_calib_free(qd_calib_set *s);                     /* accepts a zeroed struct */

/* The samplers on an id stream, for callers that already hold ids. out has room for
 * n_samples * seq_len ids. */
int qd_calib_sample_random(const int32_t *ids, size_t n, int64_t n_samples, int64_t seq_len,
                           uint64_t seed, int32_t *out, qd_err *err);
int qd_calib_sample_blocks(const int32_t *ids, size_t n, int64_t n_samples, int64_t seq_len,
                           int32_t *out, qd_err *err);
/* The AWQ style's document order: a seeded Fisher-Yates permutation of 0..n-1 into order. */
void qd_calib_shuffle_order(size_t n, uint64_t seed, size_t *order);

#endif
