/* Private layout of qd_tokenizer shared by the tok_*.c files (not for use outside
 * quant/model/tokenizer/, but for quant/model/token_file.c's use of the growable id array
 * at the end). The loaders (tok_json.c, tok_vocab_merges.c, tok_spmodel.c) fill the
 * vocabulary, merges and pipeline description; tok_tokenizer.c runs the pipeline: special
 * token split -> normalisers -> pre-tokenisers -> BPE (tok_bpe.c) per piece. */
#ifndef QUANT_MODEL_TOKENIZER_TOK_INTERNAL_H
#define QUANT_MODEL_TOKENIZER_TOK_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "quant/core/error.h"
#include "quant/model/tokenizer/tokenizer.h"

/* ---- tok_hash.c: two small open-addressing hash maps -------------------------------- */

/* String -> int32. Keys are NOT copied: they must outlive the map (they point into the
 * tokenizer's piece strings). */
typedef struct tok_strmap_slot { const char *s; uint32_t len; uint32_t hash; int32_t val; } tok_strmap_slot;
typedef struct tok_strmap { tok_strmap_slot *slots; uint32_t cap, n; } tok_strmap;

int tok_strmap_init(tok_strmap *m, size_t expect);
/* Inserts or overwrites. QD_ENOMEM on growth failure. */
int tok_strmap_put(tok_strmap *m, const char *s, size_t len, int32_t val);
/* Returns the value or -1 when absent. */
int32_t tok_strmap_get(const tok_strmap *m, const char *s, size_t len);
void tok_strmap_free(tok_strmap *m);

/* Pair of ids -> (rank, merged id). */
typedef struct tok_pairmap_slot { uint64_t key; int32_t rank; int32_t id; } tok_pairmap_slot;
typedef struct tok_pairmap { tok_pairmap_slot *slots; uint32_t cap, n; } tok_pairmap;

int tok_pairmap_init(tok_pairmap *m, size_t expect);
/* Inserts when absent; an existing pair keeps its (better, earlier) rank. */
int tok_pairmap_put(tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t id);
/* 1 and fills rank/id when present, else 0. */
int tok_pairmap_get(const tok_pairmap *m, int32_t a, int32_t b, int32_t *rank, int32_t *id);
void tok_pairmap_free(tok_pairmap *m);

/* ---- tok_bpe.c: the merge engine ------------------------------------------------------ */

/* Scratch buffers reused across words (one per encode call, never shared). */
typedef struct tok_bpe_work {
    int32_t *prev, *next;
    uint32_t *heap;          /* triples (rank, left, right) flattened */
    size_t cap_sym, cap_heap, n_heap;
} tok_bpe_work;

/* Merges ids[0..n) in place by rank (lowest first, ties leftmost) with a binary heap and a
 * linked list of symbols, so a 1 MB unsplit text costs O(n log n). *n_out is the length
 * after merging. */
int tok_bpe_merge(const tok_pairmap *merges, tok_bpe_work *w, int32_t *ids, size_t n, size_t *n_out);
void tok_bpe_work_free(tok_bpe_work *w);

/* ---- the tokenizer ---------------------------------------------------------------------- */

enum tok_norm_kind { TOK_NORM_PREPEND, TOK_NORM_REPLACE, TOK_NORM_COLLAPSE_WS };
typedef struct tok_norm_step { int kind; char *a, *b; } tok_norm_step;   /* a, b owned */

enum tok_pre_kind { TOK_PRE_SPLIT, TOK_PRE_BYTELEVEL, TOK_PRE_METASPACE };
enum tok_prepend { TOK_PREPEND_NEVER, TOK_PREPEND_FIRST, TOK_PREPEND_ALWAYS };
typedef struct tok_pre_step {
    int kind;
    void *re;               /* pcre2_code_8 * (owned), NULL when no regex */
    int add_prefix_space;   /* ByteLevel */
    int prepend_scheme;     /* Metaspace */
    int split;              /* Metaspace: split before each '▁' */
} tok_pre_step;

enum tok_piece_flags { TOK_PIECE_SPECIAL = 1, TOK_PIECE_BYTE = 2 };

typedef struct tok_special { const char *s; uint32_t len; int32_t id; } tok_special;

struct qd_tokenizer {
    int32_t n_vocab;
    char **piece;            /* [n_vocab], each owned, NULL for holes */
    uint32_t *piece_len;
    uint8_t *piece_flags;
    tok_strmap vocab;
    tok_pairmap merges;

    int byte_level;          /* pieces are spelled in GPT-2's bytes_to_unicode alphabet */
    int byte_fallback;
    int fuse_unk;
    int ignore_merges;       /* a whole pre-token found in the vocab is emitted as is */
    int32_t unk_id, bos_id, eos_id;
    int add_bos;
    int decode_strip_space;  /* drop the one leading space the '▁' prefix introduced */

    tok_norm_step *norm; int n_norm;
    tok_pre_step *pre; int n_pre;

    tok_special *special; int n_special;   /* longest first; strings borrowed from piece[] */
    uint8_t special_first[256];            /* 1 when some special starts with that byte */

    int32_t byte_id[256];       /* <0xNN> pieces (byte fallback), -1 when absent */
    int32_t bytelevel_id[256];  /* byte-level: id of each byte's mapped character */
};

/* Allocates an empty handle with room for n_vocab ids. */
int tok_alloc(qd_tokenizer **out, int32_t n_vocab, qd_err *err);
/* Records piece id (copied). Grows the id space when id >= n_vocab. */
int tok_set_piece(qd_tokenizer *t, int32_t id, const char *s, size_t len, qd_err *err);
/* Adds a special token (the piece must already be set). */
int tok_add_special(qd_tokenizer *t, int32_t id, qd_err *err);
/* Builds the vocab map, byte tables and the special-token index; call once after loading. */
int tok_finalize(qd_tokenizer *t, qd_err *err);
/* Reads tokenizer_config.json in dir when present: add_bos_token, bos_token, eos_token. */
int tok_apply_config(qd_tokenizer *t, const char *dir, qd_err *err);

/* Loaders. */
int tok_load_json(qd_tokenizer **out, const char *path, qd_err *err);
int tok_load_vocab_merges(qd_tokenizer **out, const char *vocab_path, const char *merges_path, qd_err *err);
int tok_load_spmodel(qd_tokenizer **out, const char *path, qd_err *err);

/* ---- tok_bytelevel.c ----------------------------------------------------------------- */

/* GPT-2's pre-tokenizer regex. */
extern const char tok_gpt2_pattern[];
/* Compiles a pattern (UTF + Unicode properties, JIT when available). literal: match the
 * string as is. Returns the pcre2 code or NULL with err set. */
void *tok_regex_compile(const char *pattern, int literal, qd_err *err);
void tok_regex_free(void *re);
/* Calls emit(ctx, off, len) for each consecutive piece of s[0..n): the matches and the
 * gaps between them ("Isolated" behaviour). */
int tok_regex_split(void *re, const char *s, size_t n,
                    int (*emit)(void *ctx, size_t off, size_t len), void *ctx, qd_err *err);
/* GPT-2 bytes_to_unicode: the code point byte b is spelled as. */
uint32_t tok_byte_to_cp(uint8_t b);
/* Inverse, or -1 when cp is not in the table. */
int tok_cp_to_byte(uint32_t cp);
/* Encodes cp as UTF-8 into out (>= 4 bytes); returns the length. */
int tok_utf8_put(uint32_t cp, char *out);
/* Decodes one code point at s (n bytes left); returns its length (1 for an invalid byte,
 * with *cp = 0xFFFFFFFF). */
int tok_utf8_get(const char *s, size_t n, uint32_t *cp);

/* ---- tok_spm.c ------------------------------------------------------------------------- */

/* Initial symbols of a non-byte-level piece: one id per character present in the vocab,
 * else its UTF-8 bytes as <0xNN> ids (byte fallback), else unk. Appends to *ids. */
int tok_spm_initial_symbols(const qd_tokenizer *t, const char *s, size_t n,
                            int32_t **ids, size_t *n_ids, size_t *cap, qd_err *err);
/* Applies the normaliser steps; *out malloc'd (owned by the caller). */
int tok_normalize(const qd_tokenizer *t, const char *s, size_t n, char **out, size_t *n_out, qd_err *err);
/* Appends the decoded bytes of id for a '▁'-alphabet piece. */
int tok_spm_decode_piece(const qd_tokenizer *t, int32_t id, char **buf, size_t *len, size_t *cap);

/* Growable int32 / byte arrays. */
int tok_ids_push(int32_t **ids, size_t *n, size_t *cap, int32_t v);
int tok_bytes_push(char **buf, size_t *len, size_t *cap, const char *s, size_t n);

#endif
