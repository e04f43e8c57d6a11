/* Worker wire protocol: every message type through encode and the streaming decoder (whole,
 * one byte at a time, random chunks), and the failures: bad magic, foreign version, zero and
 * oversize lengths, truncated frames, bad bodies (which must not break the stream), and the
 * per-type validation rules. */
#include "test_util.h"

#include <stdlib.h>
#include <string.h>

#include "proto/wire.h"

#define NMSG 16

/* A sample of every type (two of task and task_done, to cover "all" and a block index). */
static void make_msgs(qp_msg *m)
{
    qp_msg_init(&m[0], QP_MSG_HELLO);
    m[0].hello.worker = "cuda0";
    m[0].hello.pid = 4242;
    m[0].hello.backend = "cuda";
    m[0].hello.device = "NVIDIA H100 80GB HBM3";
    m[0].hello.selftest_ok = 1;
    m[0].hello.selftest = "dequant gemv: max rel err 1.2e-4 over 6 formats";

    qp_msg_init(&m[1], QP_MSG_TASK);
    m[1].task.job_id = "j-0011223344556677";
    m[1].task.job = "{\"version\":1,\"model\":\"/m\",\"bits\":4,\"calibration\":{\"path\":\"c \\\"q\\\" \\u00e9\"}}";
    m[1].task.checkpoint_dir = "/out/x/.quantd";
    m[1].task.fence = 9007199254740991ULL;

    qp_msg_init(&m[2], QP_MSG_TASK);
    m[2].task.job_id = "j2";
    m[2].task.job = "{}";
    m[2].task.block = 7;
    m[2].task.checkpoint_dir = "/c";
    m[2].task.fence = 3;
    m[2].task.fanout = 1;

    qp_msg_init(&m[3], QP_MSG_PROGRESS);
    m[3].progress.job_id = "j2";
    m[3].progress.stage = "quantize";
    m[3].progress.block = 7;
    m[3].progress.n_blocks = 22;
    m[3].progress.layer = "model.layers.7.self_attn.o_proj";
    m[3].progress.fraction = 0.3333333333333333;
    m[3].progress.eta_s = 81.125;
    m[3].progress.layer_error = 1.0e-7;

    qp_msg_init(&m[4], QP_MSG_BLOCK_DONE);
    m[4].block_done.job_id = "j2";
    m[4].block_done.block = 7;
    m[4].block_done.n_blocks = 22;
    m[4].block_done.seconds = 12.5;
    m[4].block_done.fence = 3;
    m[4].block_done.cost = "{\"block\":7,\"seconds\":12.5,\"stages\":{\"calibrate\":6.25},\"forward_passes\":4}";

    qp_msg_init(&m[5], QP_MSG_TASK_DONE);
    m[5].task_done.job_id = "j2";
    m[5].task_done.job_finished = 0;

    qp_msg_init(&m[6], QP_MSG_TASK_DONE);
    m[6].task_done.job_id = "j2";
    m[6].task_done.job_finished = 1;
    m[6].task_done.output = "/out/x";
    m[6].task_done.report = "{\"layers\":154,\"ppl_after\":12.9}";

    qp_msg_init(&m[7], QP_MSG_TASK_FAILED);
    m[7].task_failed.job_id = "j2";
    m[7].task_failed.error = "model.layers.7.mlp.up_proj: Cholesky failed at damp 0.1";
    m[7].task_failed.code = -6;
    m[7].task_failed.retryable = 1;
    m[7].task_failed.exiting = 1;            /* optional, and it survives the round trip */

    qp_msg_init(&m[8], QP_MSG_HEARTBEAT);
    m[8].heartbeat.t_ms = 1700000000000LL;
    m[8].heartbeat.rss_bytes = 123456789;

    qp_msg_init(&m[9], QP_MSG_CANCEL);
    m[9].cancel.job_id = "j2";
    m[9].cancel.reason = "user";

    qp_msg_init(&m[10], QP_MSG_SHUTDOWN);
    m[10].shutdown.graceful = 1;

    static char *names[] = { "model.layers.3.self_attn.q_proj", "model.layers.3.mlp.experts.7.down_proj", "" };
    qp_msg_init(&m[11], QP_MSG_PARTS);
    m[11].parts.job_id = "j2";
    m[11].parts.block = 3;
    m[11].parts.step = "quantize";
    m[11].parts.n = 4;                   /* fewer names than parts is allowed */
    m[11].parts.names.v = names;
    m[11].parts.names.n = 3;
    m[11].parts.fence = 3;

    qp_msg_init(&m[12], QP_MSG_PART);
    m[12].part.job_id = "j2";
    m[12].part.job = "{\"version\":1}";
    m[12].part.checkpoint_dir = "/out/x/.quantd";
    m[12].part.block = 3;
    m[12].part.step = "quantize";
    m[12].part.index = 3;
    m[12].part.fence = 3;

    qp_msg_init(&m[13], QP_MSG_PART_DONE);
    m[13].part_done.job_id = "j2";
    m[13].part_done.block = 3;
    m[13].part_done.step = "quantize";
    m[13].part_done.index = 1;
    m[13].part_done.ok = 0;
    m[13].part_done.error = "part input .quantd/parts/003-q-0001.bin: checksum mismatch";
    m[13].part_done.seconds = 0.25;

    qp_msg_init(&m[14], QP_MSG_PARTS_DONE);
    m[14].parts_done.job_id = "j2";
    m[14].parts_done.block = 3;
    m[14].parts_done.step = "quantize";

    qp_msg_init(&m[15], QP_MSG_PART_STOP);
    m[15].part_stop.job_id = "j2";
    m[15].part_stop.block = 3;
    m[15].part_stop.step = "factor";
    m[15].part_stop.index = 7;
}

static int streq(const char *a, const char *b) { return (!a && !b) || (a && b && !strcmp(a, b)); }

/* Compares by re-encoding: the JSON text covers every field of every type. */
static void check_same_msg(const qp_msg *a, const qp_msg *b)
{
    CHECK_INT(a->type, b->type);
    char *ja = qp_msg_to_json(a, NULL), *jb = qp_msg_to_json(b, NULL);
    CHECK_STR(ja, jb);
    free(ja);
    free(jb);
    if (a->type == QP_MSG_TASK) {
        CHECK_INT(a->task.block, b->task.block);
        CHECK(a->task.fence == b->task.fence);
        CHECK_INT(a->task.fanout, b->task.fanout);   /* m[1] leaves it out: false */
    }
    if (a->type == QP_MSG_PROGRESS) {
        CHECK(a->progress.fraction == b->progress.fraction);
        CHECK(a->progress.layer_error == b->progress.layer_error);
        CHECK(streq(a->progress.layer, b->progress.layer));
    }
}

/* Encodes all messages into one byte stream. */
static uint8_t *stream_of(const qp_msg *m, size_t n, size_t *len)
{
    uint8_t *all = NULL;
    *len = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t *f;
        size_t fl;
        qp_err err = { 0 };
        int rc = qp_wire_encode(&m[i], &f, &fl, &err);
        test_checks++;
        if (rc) { TEST_FAIL_("encode %s: %s", qp_msg_type_name(m[i].type), err.msg); continue; }
        all = realloc(all, *len + fl);
        memcpy(all + *len, f, fl);
        *len += fl;
        free(f);
    }
    return all;
}

/* Feeds the stream in chunks chosen by step(), checking each message comes out whole. */
static void decode_in_chunks(const uint8_t *s, size_t len, const qp_msg *want, size_t n, test_rng *rng, size_t fixed)
{
    qp_wire_decoder d;
    qp_wire_decoder_init(&d, 0);
    size_t got = 0, pos = 0;
    qp_err err = { 0 };
    while (pos < len) {
        size_t c = fixed ? fixed : 1 + test_rng_u64(rng) % 97;
        if (c > len - pos) c = len - pos;
        CHECK_OK(qp_wire_decoder_feed(&d, s + pos, c, &err));
        pos += c;
        qp_msg m;
        int rc;
        while ((rc = qp_wire_decoder_next(&d, &m, &err)) == 1) {
            if (got < n) check_same_msg(&want[got], &m);
            got++;
            qp_msg_clear(&m);
        }
        CHECK_INT(rc, 0);
    }
    CHECK_INT(got, n);
    CHECK_INT(qp_wire_decoder_pending(&d), 0);
    qp_wire_decoder_free(&d);
}

static void test_round_trip_every_type(void)
{
    qp_msg m[NMSG];
    make_msgs(m);
    for (int i = 0; i < NMSG; i++) {
        qp_err err = { 0 };
        char *j = qp_msg_to_json(&m[i], &err);
        CHECK(j != NULL);
        if (!j) { fprintf(stderr, "  %s: %s\n", qp_msg_type_name(m[i].type), err.msg); continue; }
        qp_msg back;
        CHECK_OK(qp_msg_from_json(&back, j, strlen(j), &err));
        check_same_msg(&m[i], &back);
        qp_msg_clear(&back);
        free(j);
    }
    /* The JSON itself, for two types, so the field names are pinned down. */
    char *j = qp_msg_to_json(&m[1], NULL);
    CHECK_CONTAINS(j, "\"type\":\"task\",\"job_id\":\"j-0011223344556677\",\"job\":{\"version\":1,");
    CHECK_CONTAINS(j, "\"block\":\"all\",\"checkpoint_dir\":\"/out/x/.quantd\",\"fence\":9007199254740991,\"fanout\":false}");
    free(j);
    j = qp_msg_to_json(&m[10], NULL);
    CHECK_STR(j, "{\"type\":\"shutdown\",\"graceful\":true}");
    free(j);
    j = qp_msg_to_json(&m[11], NULL);
    CHECK_STR(j, "{\"type\":\"parts\",\"job_id\":\"j2\",\"block\":3,\"step\":\"quantize\",\"n\":4,\"names\":"
                 "[\"model.layers.3.self_attn.q_proj\",\"model.layers.3.mlp.experts.7.down_proj\",\"\"],\"fence\":3}");
    free(j);
    j = qp_msg_to_json(&m[14], NULL);
    CHECK_STR(j, "{\"type\":\"parts_done\",\"job_id\":\"j2\",\"block\":3,\"step\":\"quantize\"}");
    free(j);
    j = qp_msg_to_json(&m[15], NULL);
    CHECK_STR(j, "{\"type\":\"part_stop\",\"job_id\":\"j2\",\"block\":3,\"step\":\"factor\",\"index\":7}");
    free(j);
    /* The names come back owned by the decoded message, in order. */
    j = qp_msg_to_json(&m[11], NULL);
    qp_msg back;
    CHECK_OK(qp_msg_from_json(&back, j, strlen(j), NULL));
    CHECK_INT(back.parts.names.n, 3);
    if (back.parts.names.n == 3) {
        CHECK_STR(back.parts.names.v[1], "model.layers.3.mlp.experts.7.down_proj");
        CHECK_STR(back.parts.names.v[2], "");
    }
    qp_msg_clear(&back);
    free(j);
    /* Without names: left out of the JSON, none after decoding. */
    qp_msg nn = m[11];
    nn.parts.names.v = NULL;
    nn.parts.names.n = 0;
    j = qp_msg_to_json(&nn, NULL);
    CHECK(j && !strstr(j, "names"));
    CHECK_OK(qp_msg_from_json(&back, j, strlen(j), NULL));
    CHECK(back.parts.names.n == 0 && back.parts.names.v == NULL);
    qp_msg_clear(&back);
    free(j);
    /* The frame header: magic, version, little-endian length. */
    uint8_t *f;
    size_t fl;
    CHECK_OK(qp_wire_encode(&m[10], &f, &fl, NULL));
    CHECK_INT(fl, 8 + strlen("{\"type\":\"shutdown\",\"graceful\":true}"));
    CHECK(f[0] == 'Q' && f[1] == 'D' && f[2] == 'W' && f[3] == QP_WIRE_VERSION);
    CHECK_INT(f[4] | f[5] << 8 | f[6] << 16 | (uint32_t)f[7] << 24, fl - 8);
    free(f);
}

static void test_stream_chunking(void)
{
    qp_msg m[NMSG];
    make_msgs(m);
    size_t len;
    uint8_t *s = stream_of(m, NMSG, &len);
    test_rng rng;
    test_rng_seed(&rng, 12345);
    decode_in_chunks(s, len, m, NMSG, &rng, len);   /* everything at once */
    decode_in_chunks(s, len, m, NMSG, &rng, 1);     /* one byte at a time */
    for (int rep = 0; rep < 50; rep++) decode_in_chunks(s, len, m, NMSG, &rng, 0);
    free(s);
}

static void test_framing_errors(void)
{
    qp_msg m[NMSG];
    make_msgs(m);
    uint8_t *f;
    size_t fl;
    CHECK_OK(qp_wire_encode(&m[8], &f, &fl, NULL));
    qp_wire_decoder d;
    qp_err err = { 0 };
    qp_msg out;

    /* Bad magic is caught on its first wrong byte, and the stream stays broken. */
    qp_wire_decoder_init(&d, 0);
    CHECK_INT(qp_wire_decoder_feed(&d, "Q", 1, &err), 0);
    CHECK_INT(qp_wire_decoder_feed(&d, "X", 1, &err), QP_EFORMAT);
    CHECK_CONTAINS(err.msg, "wire: bad frame magic (byte 1 is 0x58, expected 0x44)");
    CHECK(qp_wire_decoder_broken(&d));
    CHECK_INT(qp_wire_decoder_next(&d, &out, &err), QP_EFORMAT);
    CHECK_INT(qp_wire_decoder_feed(&d, f, fl, &err), QP_EFORMAT);
    qp_wire_decoder_free(&d);

    /* Text where a frame should be (someone printed to the pipe). */
    qp_wire_decoder_init(&d, 0);
    const char *junk = "Segmentation fault\n";
    CHECK_INT(qp_wire_decoder_feed(&d, junk, strlen(junk), &err), QP_EFORMAT);
    qp_wire_decoder_free(&d);

    /* Another protocol version. */
    uint8_t hdr[8];
    qp_wire_header(hdr, 10);
    hdr[3] = 1;   /* a worker from before the parts messages */
    qp_wire_decoder_init(&d, 0);
    CHECK_INT(qp_wire_decoder_feed(&d, hdr, 8, &err), QP_EMISMATCH);
    CHECK_STR(err.msg, "wire: frame version 1, this side speaks 3");
    qp_wire_decoder_free(&d);

    /* Oversize and zero lengths are refused from the header alone. */
    qp_wire_decoder_init(&d, 1024);
    qp_wire_header(hdr, 1025);
    CHECK_INT(qp_wire_decoder_feed(&d, hdr, 8, &err), QP_EFORMAT);
    CHECK_STR(err.msg, "wire: frame payload of 1025 bytes exceeds the 1024-byte limit");
    qp_wire_decoder_free(&d);
    qp_wire_decoder_init(&d, 0);
    qp_wire_header(hdr, 0xffffffffu);
    CHECK_INT(qp_wire_decoder_feed(&d, hdr, 8, &err), QP_EFORMAT);
    qp_wire_decoder_free(&d);
    qp_wire_decoder_init(&d, 0);
    qp_wire_header(hdr, 0);
    CHECK_INT(qp_wire_decoder_feed(&d, hdr, 8, &err), QP_EFORMAT);
    CHECK_STR(err.msg, "wire: frame with an empty payload");
    qp_wire_decoder_free(&d);

    /* Truncated: no message, bytes left pending (the caller reports it at EOF). */
    qp_wire_decoder_init(&d, 0);
    CHECK_OK(qp_wire_decoder_feed(&d, f, fl - 1, &err));
    CHECK_INT(qp_wire_decoder_next(&d, &out, &err), 0);
    CHECK_INT(qp_wire_decoder_pending(&d), fl - 1);
    CHECK(!qp_wire_decoder_broken(&d));
    CHECK_OK(qp_wire_decoder_feed(&d, f + fl - 1, 1, &err));   /* the last byte completes it */
    CHECK_INT(qp_wire_decoder_next(&d, &out, &err), 1);
    CHECK_INT(out.type, QP_MSG_HEARTBEAT);
    qp_msg_clear(&out);
    qp_wire_decoder_free(&d);

    /* A good frame followed by garbage: the good one is delivered, then the error. */
    qp_wire_decoder_init(&d, 0);
    CHECK_OK(qp_wire_decoder_feed(&d, f, fl, &err));
    CHECK_OK(qp_wire_decoder_feed(&d, "GARBAGE!", 8, &err));   /* feed only checks the next frame */
    CHECK_INT(qp_wire_decoder_next(&d, &out, &err), 1);
    qp_msg_clear(&out);
    CHECK_INT(qp_wire_decoder_next(&d, &out, &err), QP_EFORMAT);
    CHECK(qp_wire_decoder_broken(&d));
    qp_wire_decoder_free(&d);
    qp_wire_decoder_free(NULL);

    /* Encoding refuses payloads the other side would refuse. */
    uint8_t *g;
    size_t gl;
    CHECK_ERR(qp_wire_frame("", 0, &g, &gl, NULL));
    free(f);
}

/* Frames a raw payload and decodes it: must fail alone, and the stream must go on. */
static void bad_body_at(int line, const char *payload, const char *want)
{
    qp_msg m[NMSG];
    make_msgs(m);
    uint8_t *f, *good;
    size_t fl, gl;
    qp_err err = { 0 };
    CHECK_OK(qp_wire_frame(payload, strlen(payload), &f, &fl, NULL));
    CHECK_OK(qp_wire_encode(&m[9], &good, &gl, NULL));
    qp_wire_decoder d;
    qp_wire_decoder_init(&d, 0);
    qp_wire_decoder_feed(&d, f, fl, NULL);
    qp_wire_decoder_feed(&d, good, gl, NULL);
    qp_msg out;
    int rc = qp_wire_decoder_next(&d, &out, &err);
    test_checks++;
    if (rc >= 0) TEST_FAIL_("line %d: %s decoded (rc %d)", line, payload, rc);
    else if (!strstr(err.msg, want)) TEST_FAIL_("line %d: %s: got \"%s\", expected \"%s\"", line, payload, err.msg, want);
    CHECK(!qp_wire_decoder_broken(&d));
    CHECK_INT(qp_wire_decoder_next(&d, &out, &err), 1);
    CHECK_INT(out.type, QP_MSG_CANCEL);
    qp_msg_clear(&out);
    qp_wire_decoder_free(&d);
    free(f);
    free(good);
}
#define BAD_BODY(p, want) bad_body_at(__LINE__, p, want)

static void test_bad_bodies(void)
{
    BAD_BODY("not json", "wire: message payload is not valid JSON");
    BAD_BODY("[1]", "wire: message payload must be a JSON object, got an array");
    BAD_BODY("{\"type\":\"dance\"}", "wire.type: \"dance\" is not a known message type");
    BAD_BODY("{\"job_id\":\"a\"}", "wire.type: nothing is not a known message type");
    BAD_BODY("{\"type\":\"hello\",\"backend\":\"cpu\",\"protocol\":1,\"selftest_ok\":true}", "wire.hello.worker: missing");
    BAD_BODY("{\"type\":\"hello\",\"worker\":\"w\",\"backend\":\"cpu\",\"protocol\":1,\"selftest_ok\":1}",
             "wire.hello.selftest_ok: must be true or false, got 1");
    BAD_BODY("{\"type\":\"task\",\"job_id\":\"a\",\"job\":\"{}\",\"block\":0,\"checkpoint_dir\":\"c\",\"fence\":1}",
             "wire.task.job: must be an object, got \"{}\"");
    BAD_BODY("{\"type\":\"task\",\"job_id\":\"a\",\"job\":{},\"block\":\"some\",\"checkpoint_dir\":\"c\",\"fence\":1}",
             "wire.task.block: must be a block index or \"all\", got a string");
    BAD_BODY("{\"type\":\"task\",\"job_id\":\"a\",\"job\":{},\"block\":-2,\"checkpoint_dir\":\"c\",\"fence\":1}",
             "wire.task.block: must be a block index or \"all\", got -2");
    BAD_BODY("{\"type\":\"task\",\"job_id\":\"a\",\"job\":{},\"block\":\"all\",\"checkpoint_dir\":\"c\",\"fence\":0}",
             "wire.task.fence: must be a fencing token >= 1");
    BAD_BODY("{\"type\":\"task\",\"job_id\":\"a b\",\"job\":{},\"block\":\"all\",\"checkpoint_dir\":\"c\",\"fence\":1}",
             "wire.task.job_id: \"a b\" is not a valid job id");
    BAD_BODY("{\"type\":\"progress\",\"job_id\":\"a\",\"stage\":\"s\",\"fraction\":1.5}",
             "wire.progress.fraction: must be in [0, 1], got 1.5");
    BAD_BODY("{\"type\":\"progress\",\"job_id\":\"a\",\"stage\":\"s\",\"fraction\":0.5,\"block\":5,\"n_blocks\":5}",
             "wire.progress.block: 5 is not below n_blocks 5");
    BAD_BODY("{\"type\":\"progress\",\"job_id\":\"a\",\"stage\":\"s\",\"fraction\":0.5,\"eta_s\":-3}",
             "wire.progress.eta_s: must be >= 0 or -1 (unknown), got -3");
    BAD_BODY("{\"type\":\"progress\",\"job_id\":\"a\",\"fraction\":0.5}", "wire.progress.stage: missing");
    BAD_BODY("{\"type\":\"block_done\",\"job_id\":\"a\",\"block\":3,\"n_blocks\":3,\"fence\":1}",
             "wire.block_done.block: 3 is not in [0, n_blocks 3)");
    BAD_BODY("{\"type\":\"task_done\",\"job_id\":\"a\",\"job_finished\":true}",
             "wire.task_done.output: required when job_finished is true");
    BAD_BODY("{\"type\":\"task_done\",\"job_id\":\"a\",\"job_finished\":true,\"output\":\"o\",\"report\":[]}",
             "wire.task_done.report: must be an object, got an array");
    BAD_BODY("{\"type\":\"task_failed\",\"job_id\":\"a\",\"retryable\":false}", "wire.task_failed.error: missing");
    BAD_BODY("{\"type\":\"task_failed\",\"job_id\":\"a\",\"error\":\"\",\"retryable\":false}", "wire.task_failed.error: required");
    BAD_BODY("{\"type\":\"heartbeat\"}", "wire.heartbeat.t_ms: missing");
    BAD_BODY("{\"type\":\"heartbeat\",\"t_ms\":1.5}", "wire.heartbeat.t_ms: must be an integer, got 1.5");
    BAD_BODY("{\"type\":\"cancel\"}", "wire.cancel.job_id: missing");
    BAD_BODY("{\"type\":\"shutdown\",\"graceful\":\"yes\"}", "wire.shutdown.graceful: must be true or false");
    /* parts */
    BAD_BODY("{\"type\":\"parts\",\"block\":0,\"step\":\"quantize\",\"n\":2,\"fence\":1}", "wire.parts.job_id: missing");
    BAD_BODY("{\"type\":\"parts\",\"job_id\":\"a\",\"step\":\"quantize\",\"n\":2,\"fence\":1}", "wire.parts.block: missing");
    BAD_BODY("{\"type\":\"parts\",\"job_id\":\"a\",\"block\":0,\"n\":2,\"fence\":1}", "wire.parts.step: missing");
    BAD_BODY("{\"type\":\"parts\",\"job_id\":\"a\",\"block\":0,\"step\":\"quantize\",\"fence\":1}", "wire.parts.n: missing");
    BAD_BODY("{\"type\":\"parts\",\"job_id\":\"a\",\"block\":0,\"step\":\"quantize\",\"n\":2}", "wire.parts.fence: missing");
    BAD_BODY("{\"type\":\"parts\",\"job_id\":\"a\",\"block\":-1,\"step\":\"quantize\",\"n\":2,\"fence\":1}",
             "wire.parts.block: must be a block index >= 0, got -1");
    BAD_BODY("{\"type\":\"parts\",\"job_id\":\"a\",\"block\":0,\"step\":\"forward\",\"n\":2,\"fence\":1}",
             "wire.parts.step: \"forward\" is not a step that runs as parts (quantize, factor)");
    BAD_BODY("{\"type\":\"parts\",\"job_id\":\"a\",\"block\":0,\"step\":\"quantize\",\"n\":0,\"fence\":1}",
             "wire.parts.n: must be in [1, 4096], got 0");
    BAD_BODY("{\"type\":\"parts\",\"job_id\":\"a\",\"block\":0,\"step\":\"quantize\",\"n\":4097,\"fence\":1}",
             "wire.parts.n: must be in [1, 4096], got 4097");
    BAD_BODY("{\"type\":\"parts\",\"job_id\":\"a\",\"block\":0,\"step\":\"quantize\",\"n\":2,\"fence\":0}",
             "wire.parts.fence: must be a fencing token >= 1");
    BAD_BODY("{\"type\":\"parts\",\"job_id\":\"a\",\"block\":0,\"step\":\"quantize\",\"n\":1,\"names\":[\"x\",\"y\"],\"fence\":1}",
             "wire.parts.names: 2 names for 1 parts");
    BAD_BODY("{\"type\":\"parts\",\"job_id\":\"a\",\"block\":0,\"step\":\"quantize\",\"n\":2,\"names\":\"x\",\"fence\":1}",
             "wire.parts.names: must be an array of strings, got \"x\"");
    BAD_BODY("{\"type\":\"parts\",\"job_id\":\"a\",\"block\":0,\"step\":\"quantize\",\"n\":2,\"names\":[\"x\",3],\"fence\":1}",
             "wire.parts.names[1]: must be a string, got 3");
    {
        char p[512];
        snprintf(p, sizeof p, "{\"type\":\"parts\",\"job_id\":\"a\",\"block\":0,\"step\":\"quantize\",\"n\":2,\"names\":[\"%0161d\"],"
                 "\"fence\":1}", 0);
        BAD_BODY(p, "wire.parts.names[0]: longer than 160 bytes");
    }
    /* part */
    BAD_BODY("{\"type\":\"part\",\"job_id\":\"a\",\"checkpoint_dir\":\"c\",\"block\":0,\"step\":\"quantize\",\"index\":0,\"fence\":1}",
             "wire.part.job: missing");
    BAD_BODY("{\"type\":\"part\",\"job_id\":\"a\",\"job\":[],\"checkpoint_dir\":\"c\",\"block\":0,\"step\":\"quantize\",\"index\":0,"
             "\"fence\":1}", "wire.part.job: must be an object, got an array");
    BAD_BODY("{\"type\":\"part\",\"job_id\":\"a\",\"job\":{},\"block\":0,\"step\":\"quantize\",\"index\":0,\"fence\":1}",
             "wire.part.checkpoint_dir: missing");
    BAD_BODY("{\"type\":\"part\",\"job_id\":\"a\",\"job\":{},\"checkpoint_dir\":\"c\",\"step\":\"quantize\",\"index\":0,\"fence\":1}",
             "wire.part.block: missing");
    BAD_BODY("{\"type\":\"part\",\"job_id\":\"a\",\"job\":{},\"checkpoint_dir\":\"c\",\"block\":0,\"index\":0,\"fence\":1}",
             "wire.part.step: missing");
    BAD_BODY("{\"type\":\"part\",\"job_id\":\"a\",\"job\":{},\"checkpoint_dir\":\"c\",\"block\":0,\"step\":\"quantize\",\"fence\":1}",
             "wire.part.index: missing");
    BAD_BODY("{\"type\":\"part\",\"job_id\":\"a\",\"job\":{},\"checkpoint_dir\":\"c\",\"block\":0,\"step\":\"quantize\",\"index\":0}",
             "wire.part.fence: missing");
    BAD_BODY("{\"type\":\"part\",\"job_id\":\"a\",\"job\":{},\"checkpoint_dir\":\"c\",\"block\":0,\"step\":\"quantize\",\"index\":-1,"
             "\"fence\":1}", "wire.part.index: must be in [0, 4096), got -1");
    BAD_BODY("{\"type\":\"part\",\"job_id\":\"a\",\"job\":{},\"checkpoint_dir\":\"c\",\"block\":0,\"step\":\"quantize\",\"index\":4096,"
             "\"fence\":1}", "wire.part.index: must be in [0, 4096), got 4096");
    BAD_BODY("{\"type\":\"part\",\"job_id\":\"a\",\"job\":{},\"checkpoint_dir\":\"c\",\"block\":-3,\"step\":\"quantize\",\"index\":0,"
             "\"fence\":1}", "wire.part.block: must be a block index >= 0, got -3");
    BAD_BODY("{\"type\":\"part\",\"job_id\":\"a\",\"job\":{},\"checkpoint_dir\":\"c\",\"block\":0,\"step\":\"pack\",\"index\":0,"
             "\"fence\":1}", "wire.part.step: \"pack\" is not a step that runs as parts (quantize, factor)");
    BAD_BODY("{\"type\":\"part\",\"job_id\":\"a\",\"job\":{},\"checkpoint_dir\":\"c\",\"block\":0,\"step\":\"quantize\",\"index\":0,"
             "\"fence\":0}", "wire.part.fence: must be a fencing token >= 1");
    /* part_done */
    BAD_BODY("{\"type\":\"part_done\",\"block\":0,\"step\":\"quantize\",\"index\":0,\"ok\":true}", "wire.part_done.job_id: missing");
    BAD_BODY("{\"type\":\"part_done\",\"job_id\":\"a\",\"step\":\"quantize\",\"index\":0,\"ok\":true}", "wire.part_done.block: missing");
    BAD_BODY("{\"type\":\"part_done\",\"job_id\":\"a\",\"block\":0,\"index\":0,\"ok\":true}", "wire.part_done.step: missing");
    BAD_BODY("{\"type\":\"part_done\",\"job_id\":\"a\",\"block\":0,\"step\":\"quantize\",\"ok\":true}", "wire.part_done.index: missing");
    BAD_BODY("{\"type\":\"part_done\",\"job_id\":\"a\",\"block\":0,\"step\":\"quantize\",\"index\":0}", "wire.part_done.ok: missing");
    BAD_BODY("{\"type\":\"part_done\",\"job_id\":\"a\",\"block\":0,\"step\":\"quantize\",\"index\":0,\"ok\":1}",
             "wire.part_done.ok: must be true or false, got 1");
    BAD_BODY("{\"type\":\"part_done\",\"job_id\":\"a\",\"block\":0,\"step\":\"quantize\",\"index\":0,\"ok\":false,\"error\":5}",
             "wire.part_done.error: must be a string, got 5");
    BAD_BODY("{\"type\":\"part_done\",\"job_id\":\"a\",\"block\":0,\"step\":\"quantize\",\"index\":0,\"ok\":true,\"seconds\":-1}",
             "wire.part_done.seconds: must not be negative");
    BAD_BODY("{\"type\":\"part_done\",\"job_id\":\"a\",\"block\":0,\"step\":\"quantize\",\"index\":9999,\"ok\":true}",
             "wire.part_done.index: must be in [0, 4096), got 9999");
    BAD_BODY("{\"type\":\"part_done\",\"job_id\":\"a\",\"block\":-1,\"step\":\"quantize\",\"index\":0,\"ok\":true}",
             "wire.part_done.block: must be a block index >= 0, got -1");
    BAD_BODY("{\"type\":\"part_done\",\"job_id\":\"a\",\"block\":0,\"step\":\"\",\"index\":0,\"ok\":true}",
             "wire.part_done.step: required");
    /* parts_done */
    BAD_BODY("{\"type\":\"parts_done\",\"block\":0,\"step\":\"quantize\"}", "wire.parts_done.job_id: missing");
    BAD_BODY("{\"type\":\"parts_done\",\"job_id\":\"a\",\"step\":\"quantize\"}", "wire.parts_done.block: missing");
    BAD_BODY("{\"type\":\"parts_done\",\"job_id\":\"a\",\"block\":0}", "wire.parts_done.step: missing");
    BAD_BODY("{\"type\":\"parts_done\",\"job_id\":\"a\",\"block\":-1,\"step\":\"quantize\"}",
             "wire.parts_done.block: must be a block index >= 0, got -1");
    BAD_BODY("{\"type\":\"parts_done\",\"job_id\":\"a\",\"block\":1,\"step\":\"Quantize\"}",
             "wire.parts_done.step: \"Quantize\" is not a step that runs as parts (quantize, factor)");
    /* part_stop */
    BAD_BODY("{\"type\":\"part_stop\",\"block\":0,\"step\":\"quantize\",\"index\":0}", "wire.part_stop.job_id: missing");
    BAD_BODY("{\"type\":\"part_stop\",\"job_id\":\"a\",\"block\":0,\"step\":\"quantize\"}", "wire.part_stop.index: missing");
    BAD_BODY("{\"type\":\"part_stop\",\"job_id\":\"a\",\"block\":0,\"step\":\"quantize\",\"index\":4096}",
             "wire.part_stop.index: must be in [0, 4096), got 4096");
    BAD_BODY("{\"type\":\"part_stop\",\"job_id\":\"a\",\"block\":0,\"step\":\"pack\",\"index\":0}",
             "wire.part_stop.step: \"pack\" is not a step that runs as parts (quantize, factor)");
    /* Unknown fields are ignored (a compatible addition), absent optional ones take defaults. */
    const char *ok = "{\"type\":\"progress\",\"job_id\":\"a\",\"stage\":\"load\",\"fraction\":0,\"gpu_temp\":71}";
    qp_msg m;
    qp_err err = { 0 };
    CHECK_OK(qp_msg_from_json(&m, ok, strlen(ok), &err));
    CHECK_INT(m.progress.block, -1);
    CHECK(m.progress.eta_s == -1 && m.progress.layer_error == -1 && m.progress.layer == NULL);
    qp_msg_clear(&m);
}

static void test_encode_validation(void)
{
    qp_msg m;
    qp_err err = { 0 };
    qp_msg_init(&m, QP_MSG_TASK);
    m.task.job_id = "a";
    m.task.job = "{\"x\":";
    m.task.checkpoint_dir = "c";
    m.task.fence = 1;
    CHECK(qp_msg_to_json(&m, &err) == NULL);
    CHECK_STR(err.msg, "wire.task.job: must be a JSON object");
    m.task.job = "{}";
    m.task.fence = 0;
    CHECK(qp_msg_to_json(&m, &err) == NULL);
    m.task.fence = 1ULL << 60;
    CHECK(qp_msg_to_json(&m, &err) == NULL);
    CHECK_CONTAINS(err.msg, "wire.task.fence: must be at most 2^53 - 1");
    qp_msg_init(&m, QP_MSG_PROGRESS);
    m.progress.job_id = "a";
    m.progress.stage = "s";
    m.progress.fraction = 0.0 / 0.0;
    CHECK(qp_msg_to_json(&m, &err) == NULL);
    CHECK_STR(err.msg, "wire.progress.fraction: must be a finite number");
    m.type = (qp_msg_type)99;
    uint8_t *f = (uint8_t *)1;
    size_t fl = 1;
    CHECK_ERR(qp_wire_encode(&m, &f, &fl, &err));
    CHECK(f == NULL && fl == 0);
    CHECK_STR(qp_msg_type_name(QP_MSG_BLOCK_DONE), "block_done");
    CHECK(qp_msg_type_name(QP_MSG_NONE) == NULL);
    qp_msg_clear(NULL);
}

/* Random bytes into the decoder, and random edits of a valid stream: errors, never crashes,
 * and every message that does come out is valid enough to re-encode. */
static void test_random_input_never_crashes(void)
{
    qp_msg m[NMSG];
    make_msgs(m);
    size_t len;
    uint8_t *s = stream_of(m, NMSG, &len);
    uint8_t *t = malloc(len);
    test_rng rng;
    test_rng_seed(&rng, 99);
    for (int it = 0; it < 2000; it++) {
        memcpy(t, s, len);
        if (it % 4 == 0) {
            for (size_t i = 0; i < len; i++) t[i] = (uint8_t)test_rng_u64(&rng);
        } else {
            for (int e = 0; e < 3; e++) t[test_rng_u64(&rng) % len] = (uint8_t)test_rng_u64(&rng);
        }
        qp_wire_decoder d;
        qp_wire_decoder_init(&d, 4096);
        size_t pos = 0;
        while (pos < len && !qp_wire_decoder_broken(&d)) {
            size_t c = 1 + test_rng_u64(&rng) % 64;
            if (c > len - pos) c = len - pos;
            qp_wire_decoder_feed(&d, t + pos, c, NULL);
            pos += c;
            qp_msg out;
            int rc;
            while ((rc = qp_wire_decoder_next(&d, &out, NULL)) != 0 && !qp_wire_decoder_broken(&d)) {
                if (rc == 1) {
                    char *j = qp_msg_to_json(&out, NULL);
                    test_checks++;
                    if (!j) TEST_FAIL_("a decoded %s message does not re-encode", qp_msg_type_name(out.type));
                    free(j);
                    qp_msg_clear(&out);
                }
            }
        }
        qp_wire_decoder_free(&d);
    }
    free(t);
    free(s);
}

int main(void)
{
    TEST_RUN(test_round_trip_every_type);
    TEST_RUN(test_stream_chunking);
    TEST_RUN(test_framing_errors);
    TEST_RUN(test_bad_bodies);
    TEST_RUN(test_encode_validation);
    TEST_RUN(test_random_input_never_crashes);
    return test_finish();
}
