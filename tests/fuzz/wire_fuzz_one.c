/* The wire protocol fuzz harness. One input is a byte stream as a peer might write it; the
 * harness decodes it twice, once fed whole and once cut into chunks (sizes from the first
 * byte: single bytes, small or large pieces, empty feeds), and requires the same outcome:
 * the same messages in the same order, the same per-frame errors, the same break (code) or
 * the same pending byte count. Every decoded message must validate, encode again, and decode
 * from its own frame to the same canonical JSON. The stream without its first byte is also
 * parsed as one message payload (qp_msg_from_json), with the same round trip when accepted
 * and a cleared message plus a "wire..." message when refused. */
#include "fuzz/wire_fuzz_one.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/wire.h"

#define MAX_OUTCOMES 64

static int fail(const char *why, const char *detail)
{
    fprintf(stderr, "wire_fuzz_one: invariant broken: %s%s%s\n", why, detail ? ": " : "", detail ? detail : "");
    return -1;
}

/* What one next() call gave: a message (its canonical JSON) or a per-frame error code. */
typedef struct outcome { int rc; char *json; } outcome;

typedef struct run {
    outcome o[MAX_OUTCOMES];
    int n;
    int broken, broken_code;
    size_t pending;
    int bad;
} run;

/* A decoded message must validate, encode, and decode from its own frame to the same JSON.
 * Returns its canonical JSON (malloc'd) or NULL after reporting. */
static char *check_message(const qp_msg *m)
{
    qp_err err = {0};
    if (qp_msg_validate(m, &err)) { fail("a decoded message does not validate", err.msg); return NULL; }
    char *json = qp_msg_to_json(m, &err);
    if (!json) { fail("a decoded message does not serialise", err.msg); return NULL; }
    uint8_t *frame = NULL;
    size_t flen = 0;
    if (qp_wire_encode(m, &frame, &flen, &err)) { fail("a decoded message does not encode", err.msg); free(json); return NULL; }
    qp_wire_decoder d;
    qp_wire_decoder_init(&d, 0);
    qp_msg m2;
    int rc = qp_wire_decoder_feed(&d, frame, flen, &err);
    if (!rc) rc = qp_wire_decoder_next(&d, &m2, &err);
    int ok = rc == 1 && qp_wire_decoder_pending(&d) == 0 && m2.type == m->type;
    char *json2 = ok ? qp_msg_to_json(&m2, &err) : NULL;
    if (!ok || !json2 || strcmp(json, json2)) {
        fail("a re-encoded message decodes differently", json2 ? json2 : err.msg);
        free(json);
        json = NULL;
    }
    if (rc == 1) qp_msg_clear(&m2);
    free(json2);
    free(frame);
    qp_wire_decoder_free(&d);
    return json;
}

/* Takes every message the decoder has now. */
static void drain(qp_wire_decoder *d, run *r)
{
    for (;;) {
        qp_msg m;
        qp_err err = {0};
        int rc = qp_wire_decoder_next(d, &m, &err);
        if (rc == 0 || qp_wire_decoder_broken(d)) return;
        /* Past MAX_OUTCOMES frames are still consumed and checked, just not compared. */
        outcome spare, *o = r->n < MAX_OUTCOMES ? &r->o[r->n++] : &spare;
        o->rc = rc;
        o->json = NULL;
        if (rc == 1) {
            if (!(o->json = check_message(&m))) r->bad = 1;
            qp_msg_clear(&m);
            if (o == &spare) free(spare.json);
        } else if (m.type != QP_MSG_NONE) {
            r->bad = fail("a refused frame left a message behind", NULL);
        } else if (strncmp(err.msg, "wire", 4)) {
            r->bad = fail("a bad body's message does not name the field", err.msg);
        }
    }
}

/* Decodes stream; chunked != 0 cuts it with a generator seeded by seed. */
static void decode(const uint8_t *s, size_t n, int chunked, unsigned seed, run *r)
{
    qp_wire_decoder d;
    qp_wire_decoder_init(&d, 0);
    memset(r, 0, sizeof *r);
    size_t pos = 0;
    uint32_t x = seed * 2654435761u + 12345u;
    while (pos < n || !chunked) {
        size_t k = n - pos;
        if (chunked) {
            x = x * 1103515245u + 12345u;
            switch (seed % 4) {
            case 0: k = 1; break;
            case 1: k = (x >> 16) % 9; break;               /* 0..8, empty feeds included */
            case 2: k = 1 + (x >> 16) % 300; break;
            default: k = (x >> 16) % 2 ? 1 + (x >> 20) % 16 : 7; break;   /* around the header size */
            }
            if (k > n - pos) k = n - pos;
        }
        qp_err err = {0};
        int rc = qp_wire_decoder_feed(&d, s + pos, k, &err);
        pos += k;
        if (rc < 0 && !qp_wire_decoder_broken(&d)) { r->bad = fail("feed failed without breaking the stream", err.msg); break; }
        if (!qp_wire_decoder_broken(&d)) drain(&d, r);
        if (qp_wire_decoder_broken(&d) || !chunked) break;
    }
    r->broken = qp_wire_decoder_broken(&d);
    r->broken_code = r->broken ? d.broken_err.code : 0;
    if (r->broken && strncmp(d.broken_err.msg, "wire", 4)) r->bad = fail("a framing error does not say wire", d.broken_err.msg);
    r->pending = r->broken ? 0 : qp_wire_decoder_pending(&d);
    qp_wire_decoder_free(&d);
}

static void run_free(run *r)
{
    for (int i = 0; i < r->n; i++) free(r->o[i].json);
}

static int compare(const run *a, const run *b)
{
    if (a->n != b->n) return fail("chunking changed the number of messages", NULL);
    for (int i = 0; i < a->n; i++) {
        if (a->o[i].rc != b->o[i].rc) return fail("chunking changed a frame's outcome", NULL);
        if (a->o[i].json && (!b->o[i].json || strcmp(a->o[i].json, b->o[i].json)))
            return fail("chunking changed a message", b->o[i].json);
    }
    if (a->broken != b->broken || a->broken_code != b->broken_code) return fail("chunking changed the stream's break", NULL);
    if (a->pending != b->pending) return fail("chunking changed the pending byte count", NULL);
    return 0;
}

/* The bytes as one payload, without framing. */
static int check_payload(const uint8_t *p, size_t n, int *accepted)
{
    qp_msg m;
    qp_err err = {0};
    int rc = qp_msg_from_json(&m, (const char *)p, n, &err);
    if (rc == 0) {
        *accepted = 1;
        char *json = check_message(&m);
        qp_msg_clear(&m);
        if (!json) return -1;
        free(json);
        return 0;
    }
    if (rc > 0) return fail("from_json returned a positive code", NULL);
    if (m.type != QP_MSG_NONE) return fail("a refused payload left a message behind", NULL);
    if (strncmp(err.msg, "wire", 4)) return fail("a refused payload's message does not say wire", err.msg);
    return 0;
}

int wire_fuzz_one(const uint8_t *data, size_t size, int *accepted)
{
    int acc = 0, bad = 0;
    if (accepted) *accepted = 0;
    if (size < 1) return 0;
    const uint8_t *s = data + 1;
    size_t n = size - 1;
    run whole, cut;
    decode(s, n, 0, 0, &whole);
    decode(s, n, 1, data[0], &cut);
    bad = whole.bad || cut.bad || compare(&whole, &cut);
    for (int i = 0; i < whole.n; i++) acc |= whole.o[i].rc == 1;
    run_free(&whole);
    run_free(&cut);
    if (check_payload(s, n, &acc)) bad = 1;
    if (accepted) *accepted = acc;
    return bad ? -1 : 0;
}
