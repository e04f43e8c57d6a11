/* Tokenizers: text -> token ids (and back) for the models quantd calibrates and evaluates.
 *
 * One handle covers the BPE tokenizers LLM checkpoints ship:
 *   - HF tokenizer.json with a BPE model, either byte-level (GPT-2, OPT, Llama-3, Qwen2: a
 *     regex pre-tokenizer run through PCRE2, bytes mapped with GPT-2's bytes_to_unicode) or
 *     SentencePiece-style (Llama-2, Mistral, tok512: '▁' metaspace normaliser, byte fallback);
 *   - the older vocab.json + merges.txt pair (GPT-2 / OPT);
 *   - a SentencePiece tokenizer.model (BPE type; merge priority = piece score).
 * Special added tokens found in the text are matched before BPE. Whether a BOS id is
 * prepended follows tokenizer_config.json (add_bos_token / bos_token) or the tokenizer.json
 * post-processor template, and the caller can force it either way.
 *
 * A handle is immutable after loading, so one may be shared by threads that each encode. */
#ifndef QUANT_MODEL_TOKENIZER_TOKENIZER_H
#define QUANT_MODEL_TOKENIZER_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "quant/core/error.h"

typedef struct qd_tokenizer qd_tokenizer;

/* What to do about the BOS token in qd_tokenizer_encode. */
enum qd_tok_bos {
    QD_TOK_BOS_DEFAULT = 0,  /* as the tokenizer's config says */
    QD_TOK_BOS_ON = 1,       /* always prepend (QD_EINVAL if the tokenizer has no BOS token) */
    QD_TOK_BOS_OFF = 2,      /* never prepend */
};

/* Flags for qd_tokenizer_decode. */
enum qd_tok_decode_flags {
    QD_TOK_DECODE_SKIP_SPECIAL = 1,  /* leave out special/control tokens (BOS, EOS, ...) */
};

/* Loads the tokenizer in directory dir: tokenizer.json if present, else vocab.json +
 * merges.txt, else tokenizer.model; tokenizer_config.json beside it is read when present.
 * *out is owned by the caller (qd_tokenizer_free). QD_ENOTFOUND when dir holds none of them,
 * QD_EFORMAT for malformed files, QD_EUNSUPPORTED for non-BPE models. */
int qd_tokenizer_load(const char *dir, qd_tokenizer **out, qd_err *err);
/* Loads one specific file: a tokenizer.json, or a SentencePiece .model (by extension). The
 * directory of path is searched for tokenizer_config.json. */
int qd_tokenizer_load_file(const char *path, qd_tokenizer **out, qd_err *err);
/* Loads a tokenizer.json from memory (len bytes, no NUL needed); `what` names the source in
 * errors. No tokenizer_config.json is read. For tests and fuzzing. */
int qd_tokenizer_load_json_text(const char *json, size_t len, const char *what, qd_tokenizer **out, qd_err *err);
void qd_tokenizer_free(qd_tokenizer *tok);

/* Encodes len bytes of UTF-8 text. *ids is malloc'd and owned by the caller; *n_ids is its
 * length. No EOS is ever appended. */
int qd_tokenizer_encode(const qd_tokenizer *tok, const char *text, size_t len, int bos_mode,
                        int32_t **ids, size_t *n_ids, qd_err *err);
/* Decodes ids to UTF-8 bytes; *text is malloc'd, NUL-terminated (not counted in *len) and
 * owned by the caller. flags: qd_tok_decode_flags. QD_EINVAL for an id out of range. */
int qd_tokenizer_decode(const qd_tokenizer *tok, const int32_t *ids, size_t n_ids, int flags,
                        char **text, size_t *len, qd_err *err);

/* Number of ids (largest id + 1, added tokens included). */
int32_t qd_tokenizer_vocab_size(const qd_tokenizer *tok);
/* Special ids, or -1 when the tokenizer has none. */
int32_t qd_tokenizer_bos_id(const qd_tokenizer *tok);
int32_t qd_tokenizer_eos_id(const qd_tokenizer *tok);
int32_t qd_tokenizer_unk_id(const qd_tokenizer *tok);
/* 1 when encode prepends BOS by default. */
int qd_tokenizer_adds_bos(const qd_tokenizer *tok);
/* The vocabulary string of an id as stored (byte-level or '▁' alphabet), borrowed from the
 * handle; NULL for an id out of range or a hole in the id space. */
const char *qd_tokenizer_piece(const qd_tokenizer *tok, int32_t id);
/* Id of a vocabulary string (exact match), or -1. */
int32_t qd_tokenizer_piece_id(const qd_tokenizer *tok, const char *piece);
/* Short description of the kind: "bpe-bytelevel", "bpe-spm". Borrowed, static. */
const char *qd_tokenizer_kind(const qd_tokenizer *tok);

#endif
