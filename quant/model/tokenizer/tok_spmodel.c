/* Reads a SentencePiece `tokenizer.model` (a protobuf ModelProto) for models that ship no
 * tokenizer.json, e.g. Llama-2. Only BPE models are accepted. The merge table is derived the
 * way sentencepiece's BPE encoder behaves: adjacent symbols merge when their concatenation is
 * a piece, best piece score first, leftmost on ties. We enumerate every split of every normal
 * piece into two pieces and rank it by the piece's score (equal scores share a rank, so the
 * engine's leftmost tie-break applies). The normaliser is the spec's dummy prefix, whitespace
 * escaping and optional whitespace collapsing; precompiled NFKC maps are not applied.
 *
 * Wire format used (sentencepiece_model.proto): ModelProto{1: repeated SentencePiece,
 * 2: TrainerSpec, 3: NormalizerSpec}; SentencePiece{1: piece, 2: score (float),
 * 3: type (1 normal, 2 unknown, 3 control, 4 user defined, 5 unused, 6 byte)};
 * TrainerSpec{3: model_type (1 unigram, 2 bpe), 35: byte_fallback, 40: unk_id, 41: bos_id,
 * 42: eos_id}; NormalizerSpec{1: name, 3: add_dummy_prefix, 4: remove_extra_whitespaces}. */
#include "quant/model/tokenizer/tok_internal.h"
#include "quant/core/confine.h"
#include "quant/core/fsutil.h"
#include "quant/core/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { SP_NORMAL = 1, SP_UNKNOWN = 2, SP_CONTROL = 3, SP_USER = 4, SP_UNUSED = 5, SP_BYTE = 6 };

typedef struct pb { const uint8_t *p, *end; } pb;

static int pb_varint(pb *b, uint64_t *v)
{
    uint64_t r = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (b->p >= b->end) return -1;
        uint8_t c = *b->p++;
        r |= (uint64_t)(c & 0x7F) << shift;
        if (!(c & 0x80)) { *v = r; return 0; }
    }
    return -1;
}

/* Reads one field header and, for wire type 2, the payload bounds. */
typedef struct pb_field { uint32_t num, wire; uint64_t v; const uint8_t *data; size_t len; } pb_field;

static int pb_next(pb *b, pb_field *f)
{
    uint64_t key;
    if (pb_varint(b, &key)) return -1;
    f->num = (uint32_t)(key >> 3);
    f->wire = (uint32_t)(key & 7);
    switch (f->wire) {
    case 0: return pb_varint(b, &f->v);
    case 1: if (b->end - b->p < 8) return -1; f->data = b->p; b->p += 8; return 0;
    case 5: if (b->end - b->p < 4) return -1; f->data = b->p; b->p += 4; return 0;
    case 2:
        if (pb_varint(b, &f->v) || f->v > (uint64_t)(b->end - b->p)) return -1;
        f->data = b->p;
        f->len = (size_t)f->v;
        b->p += f->len;
        return 0;
    default: return -1;   /* groups are not used by sentencepiece */
    }
}

typedef struct sp_piece { const uint8_t *s; size_t len; float score; int type; } sp_piece;

typedef struct sp_model {
    sp_piece *pieces;
    size_t n, cap;
    int model_type, byte_fallback;
    int64_t unk_id, bos_id, eos_id;
    int add_dummy_prefix, remove_extra_ws;
    char norm_name[64];
} sp_model;

static int parse_piece(const uint8_t *d, size_t n, sp_piece *out)
{
    pb b = {d, d + n};
    pb_field f = {0};
    *out = (sp_piece){(const uint8_t *)"", 0, 0.0f, SP_NORMAL};
    while (b.p < b.end) {
        if (pb_next(&b, &f)) return -1;
        if (f.num == 1 && f.wire == 2) { out->s = f.data; out->len = f.len; }
        else if (f.num == 2 && f.wire == 5) memcpy(&out->score, f.data, 4);
        else if (f.num == 3 && f.wire == 0) out->type = (int)f.v;
    }
    return 0;
}

static int parse_model(const uint8_t *d, size_t n, sp_model *m)
{
    pb b = {d, d + n};
    pb_field f;
    m->model_type = 1;   /* proto defaults */
    m->unk_id = 0; m->bos_id = 1; m->eos_id = 2;
    m->add_dummy_prefix = 1; m->remove_extra_ws = 1;
    while (b.p < b.end) {
        if (pb_next(&b, &f)) return -1;
        if (f.num == 1 && f.wire == 2) {
            if (m->n == m->cap) {
                size_t nc = m->cap ? m->cap * 2 : 1024;
                sp_piece *p = realloc(m->pieces, nc * sizeof *p);
                if (!p) return QD_ENOMEM;
                m->pieces = p;
                m->cap = nc;
            }
            if (parse_piece(f.data, f.len, &m->pieces[m->n++])) return -1;
        } else if ((f.num == 2 || f.num == 3) && f.wire == 2) {
            pb s = {f.data, f.data + f.len};
            pb_field g;
            while (s.p < s.end) {
                if (pb_next(&s, &g)) return -1;
                if (f.num == 2 && g.wire == 0) {
                    if (g.num == 3) m->model_type = (int)g.v;
                    else if (g.num == 35) m->byte_fallback = g.v != 0;
                    else if (g.num == 40) m->unk_id = (int32_t)g.v;
                    else if (g.num == 41) m->bos_id = (int32_t)g.v;
                    else if (g.num == 42) m->eos_id = (int32_t)g.v;
                } else if (f.num == 3) {
                    if (g.num == 1 && g.wire == 2) snprintf(m->norm_name, sizeof m->norm_name, "%.*s", (int)g.len, (const char *)g.data);
                    else if (g.num == 3 && g.wire == 0) m->add_dummy_prefix = g.v != 0;
                    else if (g.num == 4 && g.wire == 0) m->remove_extra_ws = g.v != 0;
                }
            }
        }
    }
    return 0;
}

static int float_desc(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x > y ? -1 : x < y ? 1 : 0;
}

/* Rank of a score among the distinct scores, best first (binary search in sorted unique). */
static int32_t score_rank(const float *uniq, size_t n, float s)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (uniq[mid] > s) lo = mid + 1; else hi = mid;
    }
    return (int32_t)lo;
}

static int build(qd_tokenizer **out, const sp_model *m, const char *path, qd_err *err)
{
    int rc = tok_alloc(out, (int32_t)m->n, err);
    if (rc) return rc;
    qd_tokenizer *t = *out;
    int has_bytes = 0;
    for (size_t i = 0; i < m->n; i++) {
        if ((rc = tok_set_piece(t, (int32_t)i, (const char *)m->pieces[i].s, m->pieces[i].len, err))) return rc;
        has_bytes |= m->pieces[i].type == SP_BYTE;
    }
    t->byte_fallback = m->byte_fallback || has_bytes;
    t->norm = calloc(3, sizeof *t->norm);
    if (!t->norm) return qd_err_set(err, QD_ENOMEM, "%s: out of memory", path);
    if (m->remove_extra_ws) t->norm[t->n_norm++] = (tok_norm_step){TOK_NORM_COLLAPSE_WS, NULL, NULL};
    t->norm[t->n_norm] = (tok_norm_step){TOK_NORM_REPLACE, strdup(" "), strdup("\xE2\x96\x81")};
    if (!t->norm[t->n_norm++].b) return qd_err_set(err, QD_ENOMEM, "%s: out of memory", path);
    if (m->add_dummy_prefix) {
        t->norm[t->n_norm] = (tok_norm_step){TOK_NORM_PREPEND, strdup("\xE2\x96\x81"), NULL};
        if (!t->norm[t->n_norm++].a) return qd_err_set(err, QD_ENOMEM, "%s: out of memory", path);
        t->decode_strip_space = 1;
    }
    if ((rc = tok_finalize(t, err))) return rc;
    for (size_t i = 0; i < m->n; i++) {
        int ty = m->pieces[i].type;
        if (ty == SP_CONTROL || ty == SP_UNKNOWN) t->piece_flags[i] |= TOK_PIECE_SPECIAL;
        if (ty == SP_USER) {   /* matched in the text before BPE, decoded as written */
            if ((rc = tok_add_special(t, (int32_t)i, err))) return rc;
            t->piece_flags[i] &= (uint8_t)~TOK_PIECE_SPECIAL;
        }
    }
    if ((rc = tok_finalize(t, err))) return rc;

    float *uniq = malloc((m->n + 1) * sizeof *uniq);
    if (!uniq) return qd_err_set(err, QD_ENOMEM, "%s: out of memory", path);
    size_t nu = 0;
    for (size_t i = 0; i < m->n; i++)
        if (m->pieces[i].type == SP_NORMAL || m->pieces[i].type == SP_USER) uniq[nu++] = m->pieces[i].score;
    qsort(uniq, nu, sizeof *uniq, float_desc);
    size_t k = 0;
    for (size_t i = 0; i < nu; i++) if (k == 0 || uniq[k - 1] != uniq[i]) uniq[k++] = uniq[i];
    nu = k;
    rc = tok_pairmap_init(&t->merges, m->n * 4);
    for (size_t i = 0; i < m->n && !rc; i++) {
        const sp_piece *p = &m->pieces[i];
        if (p->type != SP_NORMAL && p->type != SP_USER) continue;
        int32_t rank = score_rank(uniq, nu, p->score);
        for (size_t cut = 1; cut < p->len && !rc; cut++) {
            if ((p->s[cut] & 0xC0) == 0x80) continue;   /* split only between characters */
            int32_t l = tok_strmap_get(&t->vocab, (const char *)p->s, cut);
            int32_t r = tok_strmap_get(&t->vocab, (const char *)p->s + cut, p->len - cut);
            if (l < 0 || r < 0) continue;
            int tl = m->pieces[l].type, tr = m->pieces[r].type;
            if ((tl != SP_NORMAL && tl != SP_USER) || (tr != SP_NORMAL && tr != SP_USER)) continue;
            rc = tok_pairmap_put(&t->merges, l, r, rank, (int32_t)i);
        }
    }
    free(uniq);
    if (rc) return qd_err_set(err, rc, "%s: out of memory building merges", path);

    int32_t nv = (int32_t)m->n;
    t->unk_id = m->unk_id >= 0 && m->unk_id < nv ? (int32_t)m->unk_id : -1;
    t->bos_id = m->bos_id >= 0 && m->bos_id < nv ? (int32_t)m->bos_id : -1;
    t->eos_id = m->eos_id >= 0 && m->eos_id < nv ? (int32_t)m->eos_id : -1;
    /* Llama-style models prepend BOS; tokenizer_config.json may say otherwise. */
    t->add_bos = t->bos_id >= 0;
    return 0;
}

int tok_load_spmodel(qd_tokenizer **out, const char *path, qd_err *err)
{
    char *buf;
    size_t len;
    *out = NULL;
    int rc = qd_input_read(path, QD_INPUT_TOKENIZER, &buf, &len, err);
    if (rc) return rc;
    sp_model m = {0};
    rc = parse_model((const uint8_t *)buf, len, &m);
    if (rc == QD_ENOMEM) rc = qd_err_set(err, rc, "%s: out of memory", path);
    else if (rc) rc = qd_err_set(err, QD_EFORMAT, "%s: not a valid SentencePiece model (protobuf parse failed)", path);
    else if (m.n == 0) rc = qd_err_set(err, QD_EFORMAT, "%s: SentencePiece model has no pieces", path);
    else if (m.model_type != 2)
        rc = qd_err_set(err, QD_EUNSUPPORTED, "%s: SentencePiece model_type %d is not supported (only BPE = 2)", path, m.model_type);
    if (!rc) {
        if (m.norm_name[0] && strcmp(m.norm_name, "identity"))
            QD_LOG(QD_LOG_WARN, "tokenizer_spm_normalizer_ignored", "file=%s name=%s", path, m.norm_name);
        rc = build(out, &m, path, err);
        if (rc) { qd_tokenizer_free(*out); *out = NULL; }
    }
    free(m.pieces);
    free(buf);
    return rc;
}
