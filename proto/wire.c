/* Wire framing and the streaming decoder (messages themselves are in wire_msg.c).
 *
 * The decoder keeps one growable buffer: feed() appends, next_frame() hands out frames in
 * place and only compacts when the consumed prefix is large, so a stream of small messages
 * costs no copying beyond the append. Header checks run on every prefix length, so a peer
 * writing garbage is caught after at most 8 bytes, not after it has sent max_payload. */
#include "proto/wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const uint8_t magic[3] = { 'Q', 'D', 'W' };

void qp_wire_header(uint8_t hdr[QP_WIRE_HEADER_BYTES], uint32_t n)
{
    memcpy(hdr, magic, 3);
    hdr[3] = QP_WIRE_VERSION;
    hdr[4] = (uint8_t)n;
    hdr[5] = (uint8_t)(n >> 8);
    hdr[6] = (uint8_t)(n >> 16);
    hdr[7] = (uint8_t)(n >> 24);
}

int qp_wire_frame(const void *payload, size_t n, uint8_t **frame, size_t *frame_len, qp_err *err)
{
    *frame = NULL;
    *frame_len = 0;
    if (n == 0 || n > QP_WIRE_MAX_PAYLOAD)
        return qp_err_set(err, QP_EINVAL, "wire: payload of %zu bytes is outside 1..%u", n, QP_WIRE_MAX_PAYLOAD);
    uint8_t *f = malloc(QP_WIRE_HEADER_BYTES + n);
    if (!f) return qp_err_set(err, QP_ENOMEM, "wire: out of memory for a %zu-byte frame", n);
    qp_wire_header(f, (uint32_t)n);
    memcpy(f + QP_WIRE_HEADER_BYTES, payload, n);
    *frame = f;
    *frame_len = QP_WIRE_HEADER_BYTES + n;
    return 0;
}

int qp_wire_encode(const qp_msg *m, uint8_t **frame, size_t *frame_len, qp_err *err)
{
    *frame = NULL;
    *frame_len = 0;
    char *json = qp_msg_to_json(m, err);
    if (!json) return err ? err->code : QP_EINVAL;
    int rc = qp_wire_frame(json, strlen(json), frame, frame_len, err);
    free(json);
    return rc;
}

void qp_wire_decoder_init(qp_wire_decoder *d, uint32_t max_payload)
{
    memset(d, 0, sizeof *d);
    d->max_payload = max_payload ? max_payload : QP_WIRE_MAX_PAYLOAD;
}

void qp_wire_decoder_free(qp_wire_decoder *d)
{
    if (!d) return;
    free(d->buf);
    memset(d, 0, sizeof *d);
}

int qp_wire_decoder_broken(const qp_wire_decoder *d) { return d->broken; }
size_t qp_wire_decoder_pending(const qp_wire_decoder *d) { return d->len - d->off; }

static int fail(qp_wire_decoder *d, qp_err *err, int code, const char *what)
{
    d->broken = 1;
    qp_err_set(&d->broken_err, code, "%s", what);
    if (err) *err = d->broken_err;
    return code;
}

/* Checks as much of the header at d->off as has arrived. 0 when nothing is wrong yet. */
static int check_header(qp_wire_decoder *d, qp_err *err)
{
    /* Nothing held (and buf maybe still NULL, where even buf + 0 is undefined; found by
     * fuzzing): nothing can be wrong yet. */
    if (d->off == d->len) return 0;
    const uint8_t *h = d->buf + d->off;
    size_t have = d->len - d->off;
    char msg[160];
    for (size_t i = 0; i < 3 && i < have; i++)
        if (h[i] != magic[i]) {
            snprintf(msg, sizeof msg, "wire: bad frame magic (byte %zu is 0x%02x, expected 0x%02x): the peer is not speaking the quantd worker protocol",
                     i, h[i], magic[i]);
            return fail(d, err, QP_EFORMAT, msg);
        }
    if (have >= 4 && h[3] != QP_WIRE_VERSION) {
        snprintf(msg, sizeof msg, "wire: frame version %u, this side speaks %d", h[3], QP_WIRE_VERSION);
        return fail(d, err, QP_EMISMATCH, msg);
    }
    if (have >= QP_WIRE_HEADER_BYTES) {
        uint32_t n = (uint32_t)h[4] | (uint32_t)h[5] << 8 | (uint32_t)h[6] << 16 | (uint32_t)h[7] << 24;
        if (n == 0) return fail(d, err, QP_EFORMAT, "wire: frame with an empty payload");
        if (n > d->max_payload) {
            snprintf(msg, sizeof msg, "wire: frame payload of %u bytes exceeds the %u-byte limit", n, d->max_payload);
            return fail(d, err, QP_EFORMAT, msg);
        }
    }
    return 0;
}

int qp_wire_decoder_feed(qp_wire_decoder *d, const void *data, size_t n, qp_err *err)
{
    if (d->broken) {
        if (err) *err = d->broken_err;
        return d->broken_err.code;
    }
    if (n == 0) return 0;
    if (d->off && d->off == d->len) d->off = d->len = 0;
    if (d->len + n > d->cap) {
        /* Drop the consumed prefix before growing. */
        if (d->off) {
            memmove(d->buf, d->buf + d->off, d->len - d->off);
            d->len -= d->off;
            d->off = 0;
        }
        size_t cap = d->cap ? d->cap : 4096;
        while (cap < d->len + n) cap *= 2;
        if (cap != d->cap) {
            uint8_t *b = realloc(d->buf, cap);
            if (!b) return qp_err_set(err, QP_ENOMEM, "wire: out of memory buffering %zu bytes", d->len + n);
            d->buf = b;
            d->cap = cap;
        }
    }
    memcpy(d->buf + d->len, data, n);
    d->len += n;
    return check_header(d, err);
}

int qp_wire_decoder_next_frame(qp_wire_decoder *d, const char **payload, size_t *n, qp_err *err)
{
    if (d->broken) {
        if (err) *err = d->broken_err;
        return d->broken_err.code;
    }
    int rc = check_header(d, err);
    if (rc) return rc;
    size_t have = d->len - d->off;
    if (have < QP_WIRE_HEADER_BYTES) return 0;
    const uint8_t *h = d->buf + d->off;
    uint32_t len = (uint32_t)h[4] | (uint32_t)h[5] << 8 | (uint32_t)h[6] << 16 | (uint32_t)h[7] << 24;
    if (have < QP_WIRE_HEADER_BYTES + (size_t)len) return 0;
    *payload = (const char *)h + QP_WIRE_HEADER_BYTES;
    *n = len;
    d->off += QP_WIRE_HEADER_BYTES + len;
    /* The payload stays valid until the next feed: feed is the only call that moves bytes.
     * A bad header after this frame is reported by the next call, so this frame still counts. */
    return 1;
}

int qp_wire_decoder_next(qp_wire_decoder *d, qp_msg *m, qp_err *err)
{
    memset(m, 0, sizeof *m);
    const char *p = NULL;
    size_t n = 0;
    int rc = qp_wire_decoder_next_frame(d, &p, &n, err);
    if (rc <= 0) return rc;
    rc = qp_msg_from_json(m, p, n, err);
    return rc ? rc : 1;
}
