/* Job spec: every validation message, the defaults per method, the canonical JSON round
 * trip, the derived id, size strings, and SHA-256 against the FIPS 180-4 vectors. */
#include "test_util.h"

#include <stdlib.h>
#include <string.h>

#include "quant/formats/scheme.h"
#include "quant/job/hash.h"
#include "quant/job/job.h"

#define BASE "\"model\":\"/models/llama\",\"output\":\"/out/llama-w4\",\"calibration\":{\"path\":\"c4.jsonl\"}"

static qp_job *parse_ok(const char *json)
{
    qp_job *job = NULL;
    qp_err err = { 0 };
    int rc = qp_job_parse(json, strlen(json), &job, &err);
    test_checks++;
    if (rc != 0 || !job) TEST_FAIL_("parse of %s failed: %s", json, err.msg);
    return job;
}

/* The parse must fail with a message containing want. */
static void expect_err_at(int line, const char *json, size_t len, const char *want)
{
    qp_job *job = NULL;
    qp_err err = { 0 };
    int rc = qp_job_parse(json, len, &job, &err);
    test_checks++;
    if (rc >= 0 || job) {
        TEST_FAIL_("line %d: %s parsed, expected \"%s\"", line, json, want);
        qp_job_free(job);
        return;
    }
    if (err.code != rc || !strstr(err.msg, want))
        TEST_FAIL_("line %d: %s: got \"%s\" (code %d/%d), expected \"%s\"", line, json, err.msg, rc, err.code, want);
}
#define EXPECT_ERR(json, want) expect_err_at(__LINE__, json, strlen(json), want)

static void test_sha256_vectors(void)
{
    char hex[65];
    qp_sha256_hex("", 0, hex);
    CHECK_STR(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    qp_sha256_hex("abc", 3, hex);
    CHECK_STR(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    qp_sha256_hex(two, strlen(two), hex);
    CHECK_STR(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    /* One million 'a', fed in odd-sized pieces to exercise the buffering. */
    qp_sha256 s;
    qp_sha256_init(&s);
    char chunk[997];
    memset(chunk, 'a', sizeof chunk);
    size_t left = 1000000;
    while (left) {
        size_t n = left < sizeof chunk ? left : sizeof chunk;
        qp_sha256_update(&s, chunk, n);
        left -= n;
    }
    uint8_t d[32];
    qp_sha256_final(&s, d);
    char got[65];
    for (int i = 0; i < 32; i++) sprintf(got + 2 * i, "%02x", d[i]);
    CHECK_STR(got, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

static void test_bad_json(void)
{
    EXPECT_ERR("", "job: invalid JSON: the text ends early");
    EXPECT_ERR("{", "job: invalid JSON");
    EXPECT_ERR("{\"bits\": }", "job: invalid JSON at line 1, column 10");
    EXPECT_ERR("{\n  \"bits\": 4,\n  oops\n}", "job: invalid JSON at line 3, column");
    EXPECT_ERR("{} trailing", "job: invalid JSON at line 1, column 4, near 'trailing'");
    EXPECT_ERR("[1, 2]", "job: expected a JSON object, got an array");
    EXPECT_ERR("42", "job: expected a JSON object, got 42");
    EXPECT_ERR("\"job\"", "job: expected a JSON object, got \"job\"");
    /* Not NUL-terminated: the parser must respect len. */
    const char buf[] = { '{', '}', 'x' };
    expect_err_at(__LINE__, buf, 2, "job.model: required");
    /* Over the size limit, whatever it contains. */
    size_t n = QP_JOB_MAX_BYTES + 1;
    char *big = malloc(n + 1);
    memset(big, ' ', n);
    big[0] = '{';
    big[n - 1] = '}';
    big[n] = '\0';
    expect_err_at(__LINE__, big, n, "job: payload is 65537 bytes; the limit is 65536");
    free(big);
}

static void test_version(void)
{
    EXPECT_ERR("{\"version\": 2, " BASE "}", "job.version: 2 is newer than this quantd understands (it reads version 1)");
    EXPECT_ERR("{\"version\": 0, " BASE "}", "job.version: must be a positive integer, got 0");
    EXPECT_ERR("{\"version\": \"1\", " BASE "}", "job.version: must be a positive integer, got a string");
    qp_job *j = parse_ok("{\"version\": 1, " BASE "}");
    if (j) CHECK_INT(j->version, 1);
    qp_job_free(j);
    j = parse_ok("{" BASE "}");   /* absent means 1 */
    if (j) CHECK_INT(j->version, 1);
    qp_job_free(j);
    /* A newer version is refused with its own code, so callers can say "upgrade". */
    qp_job *job = NULL;
    qp_err err = { 0 };
    const char *v2 = "{\"version\": 7}";
    CHECK_INT(qp_job_parse(v2, strlen(v2), &job, &err), QP_EUNSUPPORTED);
}

static void test_unknown_and_duplicate_fields(void)
{
    EXPECT_ERR("{" BASE ", \"bitz\": 4}", "job.bitz: unknown field (did you mean 'bits'?)");
    EXPECT_ERR("{" BASE ", \"Bits\": 4}", "job.Bits: unknown field (did you mean 'bits'?)");
    EXPECT_ERR("{" BASE ", \"groupsize\": 128}", "job.groupsize: unknown field (did you mean 'group_size'?)");
    EXPECT_ERR("{" BASE ", \"temperature\": 1}", "job.temperature: unknown field");
    EXPECT_ERR("{\"model\":\"m\",\"output\":\"o\",\"calibration\":{\"path\":\"c\",\"smaples\":4}}",
               "job.calibration.smaples: unknown field (did you mean 'samples'?)");
    EXPECT_ERR("{" BASE ", \"eval\": {\"path\": \"w\", \"windows\": 3}}", "job.eval.windows: unknown field");
    EXPECT_ERR("{" BASE ", \"bits\": 4, \"bits\": 8}", "job.bits: given more than once");
}

static void test_required(void)
{
    EXPECT_ERR("{\"output\":\"o\",\"calibration\":{\"path\":\"c\"}}", "job.model: required");
    EXPECT_ERR("{\"model\":\"m\",\"calibration\":{\"path\":\"c\"}}", "job.output: required");
    EXPECT_ERR("{\"model\":\"\",\"output\":\"o\",\"calibration\":{\"path\":\"c\"}}", "job.model: must not be empty");
    EXPECT_ERR("{\"model\":5,\"output\":\"o\",\"calibration\":{\"path\":\"c\"}}", "job.model: must be a string, got 5");
    EXPECT_ERR("{\"model\":\"m\",\"output\":\"o\"}", "job.calibration: required for method gptq");
    EXPECT_ERR("{\"model\":\"m\",\"output\":\"o\",\"method\":\"awq\"}", "job.calibration: required for method awq");
    EXPECT_ERR("{\"model\":\"m\",\"output\":\"o\",\"calibration\":{}}", "job.calibration.path: required for method gptq");
    /* rtn needs no calibration data. */
    qp_job *j = parse_ok("{\"model\":\"m\",\"output\":\"o\",\"method\":\"rtn\"}");
    if (j) CHECK(j->calibration.path == NULL);
    qp_job_free(j);
}

static void test_field_types_and_ranges(void)
{
    EXPECT_ERR("{" BASE ", \"method\": \"gguf\"}", "job.method: \"gguf\" is not one of gptq, awq, rtn, awq+gptq");
    EXPECT_ERR("{" BASE ", \"method\": 1}", "job.method: must be a string, got 1");
    EXPECT_ERR("{" BASE ", \"bits\": 5}", "job.bits: 5 is not one of 2, 3, 4, 8");
    EXPECT_ERR("{" BASE ", \"bits\": 4.5}", "job.bits: 4.5 is not one of 2, 3, 4, 8");
    EXPECT_ERR("{" BASE ", \"bits\": \"4\"}", "job.bits: \"4\" is not one of 2, 3, 4, 8");
    EXPECT_ERR("{" BASE ", \"group_size\": 0}", "job.group_size: must be -1 (one group per column) or a positive integer, got 0");
    EXPECT_ERR("{" BASE ", \"group_size\": -2}", "job.group_size: must be -1 (one group per column) or a positive integer, got -2");
    EXPECT_ERR("{" BASE ", \"group_size\": 64.5}", "job.group_size: must be -1 (one group per column) or a positive integer, got 64.5");
    EXPECT_ERR("{" BASE ", \"group_size\": \"128\"}", "job.group_size: must be -1 (one group per column) or a positive integer, got a string");
    EXPECT_ERR("{" BASE ", \"sym\": \"yes\"}", "job.sym: must be true or false, got \"yes\"");
    EXPECT_ERR("{" BASE ", \"desc_act\": 1}", "job.desc_act: must be true or false, got 1");
    EXPECT_ERR("{" BASE ", \"static_groups\": 0}", "job.static_groups: must be true or false, got 0");
    EXPECT_ERR("{" BASE ", \"true_sequential\": []}", "job.true_sequential: must be true or false, got an array");
    EXPECT_ERR("{" BASE ", \"damp_percent\": 0}", "job.damp_percent: must be a number greater than 0 and less than 1, got 0");
    EXPECT_ERR("{" BASE ", \"damp_percent\": 1}", "job.damp_percent: must be a number greater than 0 and less than 1, got 1");
    EXPECT_ERR("{" BASE ", \"damp_percent\": -0.1}", "job.damp_percent: must be a number greater than 0 and less than 1, got -0.1");
    EXPECT_ERR("{" BASE ", \"damp_percent\": \"0.01\"}", "job.damp_percent: must be a number greater than 0 and less than 1, got a string");
    EXPECT_ERR("{" BASE ", \"format\": \"gguf\"}", "job.format: \"gguf\" is not one of gptq, gptq_v2, awq_gemm, compressed-tensors");
    EXPECT_ERR("{" BASE ", \"overwrite\": \"true\"}", "job.overwrite: must be true or false, got \"true\"");
    EXPECT_ERR("{" BASE ", \"priority\": 1.5}", "job.priority: must be an integer, got 1.5");
    EXPECT_ERR("{" BASE ", \"priority\": 1e12}", "job.priority: must be an integer, got 1e+12");
    EXPECT_ERR("{" BASE ", \"backend\": \"tpu\"}", "job.backend: \"tpu\" is not one of auto, cpu, cuda");
    EXPECT_ERR("{" BASE ", \"tp\": 0}", "job.tp: must be an integer >= 1 (at most 1024), got 0");
    EXPECT_ERR("{" BASE ", \"layout\": \"sharded\"}", "job.layout: \"sharded\" is not one of plain, tp_aware");
    EXPECT_ERR("{" BASE ", \"kernel_check\": \"no\"}", "job.kernel_check: must be true or false, got \"no\"");
    EXPECT_ERR("{" BASE ", \"id\": \"a b\"}", "job.id: must be 1 to 64 letters, digits");
    EXPECT_ERR("{" BASE ", \"id\": \"-x\"}", "job.id: must be 1 to 64 letters");
    EXPECT_ERR("{" BASE ", \"id\": \"a:b\"}", "job.id: must be 1 to 64 letters");
    EXPECT_ERR("{" BASE ", \"id\": \"\"}", "job.id: must not be empty");
    EXPECT_ERR("{" BASE ", \"id\": 12}", "job.id: must be a string, got 12");
    EXPECT_ERR("{" BASE ", \"id\": \"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"}", "job.id: must be 1 to 64");
}

static void test_calibration_and_eval(void)
{
    const char *mo = "\"model\":\"m\",\"output\":\"o\",";
    char buf[512];
#define CAL(body, want) do { snprintf(buf, sizeof buf, "{%s\"calibration\":%s}", mo, body); EXPECT_ERR(buf, want); } while (0)
    CAL("\"c4.jsonl\"", "job.calibration: must be an object like {\"path\": \"c4.jsonl\"}, got \"c4.jsonl\"");
    CAL("{\"path\":\"\"}", "job.calibration.path: must not be empty");
    CAL("{\"path\":\"c\",\"samples\":0}", "job.calibration.samples: must be a positive integer (at most 1000000), got 0");
    CAL("{\"path\":\"c\",\"samples\":-3}", "job.calibration.samples: must be a positive integer (at most 1000000), got -3");
    CAL("{\"path\":\"c\",\"samples\":2.5}", "job.calibration.samples: must be a positive integer (at most 1000000), got 2.5");
    CAL("{\"path\":\"c\",\"samples\":\"128\"}", "job.calibration.samples: must be a positive integer (at most 1000000), got a string");
    CAL("{\"path\":\"c\",\"seq_len\":0}", "job.calibration.seq_len: must be a positive integer (at most 1048576), got 0");
    CAL("{\"path\":\"c\",\"seed\":-1}", "job.calibration.seed: must be a non-negative integer, got -1");
    CAL("{\"path\":\"c\",\"style\":\"random\"}", "job.calibration.style: \"random\" is not one of gptq, awq");
    CAL("{\"path\":\"c\",\"field\":\"\"}", "job.calibration.field: must not be empty");
    CAL("{\"path\":\"c\",\"shards\":0}", "job.calibration.shards: must be an integer from 1 to 16, got 0");
    CAL("{\"path\":\"c\",\"shards\":17}", "job.calibration.shards: must be an integer from 1 to 16, got 17");
    CAL("{\"path\":\"c\",\"shards\":\"all\"}", "job.calibration.shards: must be an integer from 1 to 16, got a string");
#undef CAL
    EXPECT_ERR("{" BASE ", \"eval\": \"wiki\"}", "job.eval: must be an object like {\"path\": \"wiki.test.raw\"}, got \"wiki\"");
    EXPECT_ERR("{" BASE ", \"eval\": {}}", "job.eval.path: required when eval is given");
    EXPECT_ERR("{" BASE ", \"eval\": {\"path\":\"w\",\"seq_len\":0}}", "job.eval.seq_len: must be a positive integer (at most 1048576), got 0");
    EXPECT_ERR("{" BASE ", \"eval\": {\"path\":\"w\",\"max_windows\":-1}}", "job.eval.max_windows: must be 0 (all windows) or a positive integer, got -1");

    qp_job *j = parse_ok("{\"model\":\"m\",\"output\":\"o\",\"calibration\":{\"path\":\"c\",\"field\":\"content\",\"samples\":16,"
                         "\"seq_len\":256,\"seed\":42,\"style\":\"awq\",\"shards\":4},\"eval\":{\"path\":\"w\",\"seq_len\":512,\"max_windows\":8}}");
    if (j) {
        CHECK_INT(j->calibration.shards, 4);
        CHECK_STR(j->calibration.path, "c");
        CHECK_STR(j->calibration.field, "content");
        CHECK_INT(j->calibration.samples, 16);
        CHECK_INT(j->calibration.seq_len, 256);
        CHECK_INT(j->calibration.seed, 42);
        CHECK_INT(j->calibration.style, QP_CALIB_AWQ);
        CHECK_INT(j->eval.enabled, 1);
        CHECK_STR(j->eval.path, "w");
        CHECK_INT(j->eval.seq_len, 512);
        CHECK_INT(j->eval.max_windows, 8);
    }
    qp_job_free(j);
    /* The style picks the seq_len default when seq_len is absent. */
    j = parse_ok("{\"model\":\"m\",\"output\":\"o\",\"calibration\":{\"path\":\"c\",\"style\":\"awq\"}}");
    if (j) CHECK_INT(j->calibration.seq_len, 512);
    qp_job_free(j);
    j = parse_ok("{\"model\":\"m\",\"output\":\"o\",\"method\":\"awq\",\"calibration\":{\"path\":\"c\",\"style\":\"gptq\"}}");
    if (j) CHECK_INT(j->calibration.seq_len, 2048);
    qp_job_free(j);
}

static void test_modules_and_shard_size(void)
{
    EXPECT_ERR("{" BASE ", \"modules_to_not_convert\": \"lm_head\"}",
               "job.modules_to_not_convert: must be an array of module names, got \"lm_head\"");
    EXPECT_ERR("{" BASE ", \"modules_to_not_convert\": [\"a\", 3]}", "job.modules_to_not_convert[1]: must be a non-empty string, got 3");
    EXPECT_ERR("{" BASE ", \"modules_to_not_convert\": [\"\"]}", "job.modules_to_not_convert[0]: must be a non-empty string");
    EXPECT_ERR("{" BASE ", \"shard_size\": \"4 potatoes\"}",
               "job.shard_size: must be a positive number of bytes or a size like \"4GB\" or \"500MB\", got \"4 potatoes\"");
    EXPECT_ERR("{" BASE ", \"shard_size\": 0}", "job.shard_size: must be a positive number of bytes");
    EXPECT_ERR("{" BASE ", \"shard_size\": -5}", "job.shard_size: must be a positive number of bytes");
    EXPECT_ERR("{" BASE ", \"shard_size\": 1.5}", "job.shard_size: must be a positive number of bytes");
    EXPECT_ERR("{" BASE ", \"shard_size\": true}", "got true");
    qp_job *j = parse_ok("{" BASE ", \"modules_to_not_convert\": [\"mlp.down_proj\", \"lm_head\"], \"shard_size\": \"500MB\"}");
    if (j) {
        CHECK_INT(j->n_modules_to_not_convert, 2);
        CHECK_STR(j->modules_to_not_convert[0], "mlp.down_proj");
        CHECK_STR(j->modules_to_not_convert[1], "lm_head");
        CHECK_INT(j->shard_size, 500000000);
    }
    qp_job_free(j);
    j = parse_ok("{" BASE ", \"shard_size\": 1234}");
    if (j) CHECK_INT(j->shard_size, 1234);
    qp_job_free(j);

    uint64_t v = 0;
    CHECK_OK(qp_size_parse("4GB", &v)); CHECK_INT(v, 4000000000LL);
    CHECK_OK(qp_size_parse("4gb", &v)); CHECK_INT(v, 4000000000LL);
    CHECK_OK(qp_size_parse("1.5GiB", &v)); CHECK_INT(v, 1610612736LL);
    CHECK_OK(qp_size_parse("1.1GB", &v)); CHECK_INT(v, 1100000000LL);
    CHECK_OK(qp_size_parse("64 KiB", &v)); CHECK_INT(v, 65536);
    CHECK_OK(qp_size_parse("100", &v)); CHECK_INT(v, 100);
    CHECK_OK(qp_size_parse("100B", &v)); CHECK_INT(v, 100);
    CHECK_OK(qp_size_parse("2TB", &v)); CHECK_INT(v, 2000000000000LL);
    CHECK_ERR(qp_size_parse("0.5B", &v));
    CHECK_ERR(qp_size_parse("-4GB", &v));
    CHECK_ERR(qp_size_parse("GB", &v));
    CHECK_ERR(qp_size_parse("4XB", &v));
    CHECK_ERR(qp_size_parse("", &v));
    CHECK_ERR(qp_size_parse("nan", &v));
}

static void test_cross_field_rules(void)
{
    EXPECT_ERR("{" BASE ", \"format\": \"awq_gemm\", \"bits\": 3}",
               "job.format: awq_gemm holds 4-bit weights only, but job.bits is 3; use format gptq or gptq_v2");
    EXPECT_ERR("{" BASE ", \"format\": \"awq_gemm\", \"desc_act\": true, \"static_groups\": false}",
               "job.format: awq_gemm has no g_idx, so it cannot hold act-order (desc_act) weights without static groups");
    EXPECT_ERR("{" BASE ", \"format\": \"awq_gemm\", \"group_size\": -1}",
               "job.group_size: awq_gemm needs a positive group size");
    EXPECT_ERR("{" BASE ", \"method\": \"awq\", \"desc_act\": true}",
               "job.desc_act: only methods gptq and awq+gptq quantize columns in activation order; method awq has no act-order");
    EXPECT_ERR("{" BASE ", \"method\": \"rtn\", \"desc_act\": true}", "method rtn has no act-order");
    EXPECT_ERR("{" BASE ", \"layout\": \"tp_aware\", \"desc_act\": false}",
               "job.layout: tp_aware reorders act-order GPTQ weights, so it needs method gptq or awq+gptq with desc_act true "
               "(this job has method gptq, desc_act false)");
    EXPECT_ERR("{" BASE ", \"method\": \"rtn\", \"layout\": \"tp_aware\"}", "this job has method rtn");
    /* Allowed combinations. */
    qp_job *j = parse_ok("{" BASE ", \"layout\": \"tp_aware\", \"desc_act\": true, \"tp\": 4}");
    if (j) { CHECK_INT(j->layout, QP_LAYOUT_TP_AWARE); CHECK_INT(j->tp, 4); CHECK_INT(j->static_groups, 0); }
    qp_job_free(j);
    j = parse_ok("{" BASE ", \"layout\": \"tp_aware\", \"tp\": 2}");   /* act-order by default, no static groups */
    if (j) { CHECK_INT(j->desc_act, 1); CHECK_INT(j->static_groups, 0); }
    qp_job_free(j);
    j = parse_ok("{" BASE ", \"desc_act\": false}");   /* static_groups follows desc_act */
    if (j) CHECK_INT(j->static_groups, 0);
    qp_job_free(j);
    j = parse_ok("{" BASE ", \"desc_act\": false, \"static_groups\": true}");   /* pointless, but harmless */
    if (j) CHECK_INT(j->static_groups, 1);
    qp_job_free(j);
    j = parse_ok("{" BASE ", \"format\": \"awq_gemm\", \"sym\": false}");   /* the plain layout: any format */
    if (j) { CHECK_INT(j->desc_act, 1); CHECK_INT(j->static_groups, 1); }
    qp_job_free(j);
    j = parse_ok("{" BASE ", \"method\": \"awq+gptq\", \"desc_act\": true, \"bits\": 3}");
    if (j) { CHECK_INT(j->desc_act, 1); CHECK_INT(j->format, QP_FORMAT_GPTQ); }
    qp_job_free(j);
    j = parse_ok("{" BASE ", \"group_size\": -1, \"format\": \"gptq_v2\", \"sym\": false}");
    if (j) { CHECK_INT(j->group_size, -1); CHECK_INT(j->format, QP_FORMAT_GPTQ_V2); CHECK_INT(j->sym, 0); }
    qp_job_free(j);
}

static void test_defaults_per_method(void)
{
    static const struct {
        const char *method;
        int sym, format, style, seq_len, act_order;
    } cases[] = {
        { "gptq", 1, QP_FORMAT_GPTQ, QP_CALIB_GPTQ, 2048, 1 },
        { "rtn", 1, QP_FORMAT_GPTQ, QP_CALIB_GPTQ, 2048, 0 },
        { "awq", 0, QP_FORMAT_AWQ_GEMM, QP_CALIB_AWQ, 512, 0 },
        { "awq+gptq", 0, QP_FORMAT_AWQ_GEMM, QP_CALIB_AWQ, 512, 1 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char buf[256];
        snprintf(buf, sizeof buf, "{" BASE ", \"method\": \"%s\"}", cases[i].method);
        qp_job *j = parse_ok(buf);
        if (!j) continue;
        CHECK_STR(qp_method_name(j->method), cases[i].method);
        CHECK_INT(j->bits, 4);
        CHECK_INT(j->group_size, 128);
        CHECK_NEAR(j->damp_percent, 0.01, 0);
        CHECK_INT(j->sym, cases[i].sym);
        CHECK_INT(j->desc_act, cases[i].act_order);        /* act-order with static groups */
        CHECK_INT(j->static_groups, cases[i].act_order);
        CHECK_INT(j->true_sequential, 1);
        CHECK_INT(j->format, cases[i].format);
        CHECK_INT(j->calibration.samples, 128);
        CHECK_INT(j->calibration.seq_len, cases[i].seq_len);
        CHECK_INT(j->calibration.style, cases[i].style);
        CHECK_INT(j->calibration.seed, 0);
        CHECK_STR(j->calibration.field, "text");
        CHECK_INT(j->eval.enabled, 0);
        CHECK_INT(j->n_modules_to_not_convert, 0);
        CHECK_INT(j->shard_size, 4000000000LL);
        CHECK_INT(j->overwrite, 0);
        CHECK_INT(j->priority, 0);
        CHECK_INT(j->backend, QP_BACKEND_AUTO);
        CHECK_INT(j->tp, 1);
        CHECK_INT(j->layout, QP_LAYOUT_PLAIN);
        CHECK_INT(j->kernel_check, 1);
        CHECK_INT(j->id_derived, 1);
        qp_job_free(j);
    }
    /* AWQ at a width awq_gemm cannot hold defaults to the GPTQ format. */
    qp_job *j = parse_ok("{" BASE ", \"method\": \"awq\", \"bits\": 3}");
    if (j) CHECK_INT(j->format, QP_FORMAT_GPTQ);
    qp_job_free(j);
    j = parse_ok("{" BASE ", \"method\": \"awq+gptq\", \"bits\": 8}");
    if (j) CHECK_INT(j->format, QP_FORMAT_GPTQ);
    qp_job_free(j);
    /* JSON null means "use the default". */
    j = parse_ok("{" BASE ", \"bits\": null, \"eval\": null, \"modules_to_not_convert\": null}");
    if (j) { CHECK_INT(j->bits, 4); CHECK_INT(j->eval.enabled, 0); }
    qp_job_free(j);
    /* A job built in code passes the same validation. */
    qp_job *c = calloc(1, sizeof *c);
    CHECK_OK(qp_job_init_defaults(c, QP_METHOD_RTN));
    qp_err err = { 0 };
    CHECK_INT(qp_job_validate(c, &err), QP_EINVAL);    /* no id yet */
    strcpy(c->id, "manual-1");
    CHECK_INT(qp_job_validate(c, &err), QP_ENOTFOUND); /* no model */
    CHECK_CONTAINS(err.msg, "job.model: required");
    c->model = strdup("m");
    c->output = strdup("o");
    CHECK_OK(qp_job_validate(c, &err));
    c->bits = 5;
    CHECK_ERR(qp_job_validate(c, &err));
    CHECK_CONTAINS(err.msg, "job.bits: 5 is not one of 2, 3, 4, 8");
    qp_job_free(c);
    qp_job_free(NULL);
}

static const char *const canonical_min =
    "{\"version\":1,\"id\":\"ID\",\"model\":\"/models/llama\",\"output\":\"/out/llama-w4\",\"method\":\"gptq\",\"bits\":4,"
    "\"group_size\":128,\"sym\":true,\"desc_act\":true,\"static_groups\":true,\"true_sequential\":true,"
    "\"damp_percent\":0.01,\"scale_search\":\"mse\",\"format\":\"gptq\",\"calibration\":{\"path\":\"c4.jsonl\",\"field\":\"text\",\"samples\":128,"
    "\"seq_len\":2048,\"seed\":0,\"style\":\"gptq\"},\"eval\":null,\"modules_to_not_convert\":[],\"shard_size\":4000000000,"
    "\"overwrite\":false,\"priority\":0,\"backend\":\"auto\",\"tp\":1,\"layout\":\"plain\",\"kernel_check\":true}";

static void test_canonical_round_trip(void)
{
    qp_job *j = parse_ok("{" BASE "}");
    if (!j) return;
    char *s = qp_job_to_json(j, 0);
    char want[2048];
    /* The expected text with the derived id in place of ID. */
    const char *at = strstr(canonical_min, "ID");
    snprintf(want, sizeof want, "%.*s%s%s", (int)(at - canonical_min), canonical_min, j->id, at + 2);
    CHECK_STR(s, want);
    /* Parsing the canonical form gives the same canonical form, byte for byte. */
    qp_job *k = parse_ok(s);
    char *s2 = k ? qp_job_to_json(k, 0) : NULL;
    CHECK_STR(s2, s);
    CHECK_INT(k ? k->id_derived : -1, 0);   /* the id is now given, not derived */
    free(s2);
    qp_job_free(k);
    /* The pretty form parses back to the same thing too. */
    char *p = qp_job_to_json(j, QP_JOB_JSON_PRETTY);
    CHECK(p && strchr(p, '\n'));
    k = p ? parse_ok(p) : NULL;
    s2 = k ? qp_job_to_json(k, 0) : NULL;
    CHECK_STR(s2, s);
    free(s2);
    free(p);
    qp_job_free(k);
    free(s);

    /* A spec with every field set survives a round trip, and so does its deep copy. */
    const char *full = "{\"version\":1,\"id\":\"job-7\",\"model\":\"m\",\"output\":\"o\",\"method\":\"awq+gptq\",\"bits\":3,"
        "\"group_size\":64,\"sym\":false,\"desc_act\":true,\"static_groups\":true,\"true_sequential\":false,"
        "\"damp_percent\":0.05,\"format\":\"gptq_v2\",\"calibration\":{\"path\":\"c\",\"field\":\"body\",\"samples\":32,"
        "\"seq_len\":1024,\"seed\":9007199254740991,\"style\":\"gptq\"},\"eval\":{\"path\":\"w\",\"seq_len\":256,\"max_windows\":4},"
        "\"modules_to_not_convert\":[\"down_proj\"],\"shard_size\":1500000000,\"overwrite\":true,\"priority\":-3,"
        "\"backend\":\"cuda\",\"tp\":2,\"layout\":\"tp_aware\",\"kernel_check\":false}";
    k = parse_ok(full);
    s = k ? qp_job_to_json(k, 0) : NULL;
    CHECK_STR(s, full);
    qp_job *d = k ? qp_job_dup(k) : NULL;
    s2 = d ? qp_job_to_json(d, 0) : NULL;
    CHECK_STR(s2, full);
    free(s);
    free(s2);
    qp_job_free(d);
    qp_job_free(k);
    qp_job_free(j);
}

static void test_derived_id(void)
{
    qp_job *a = parse_ok("{" BASE "}");
    /* Same job: other whitespace, other key order, defaults spelled out. */
    qp_job *b = parse_ok("{ \"calibration\" : { \"seq_len\": 2048, \"path\": \"c4.jsonl\" },\n \"output\": \"/out/llama-w4\","
                         " \"bits\": 4, \"method\": \"gptq\", \"model\": \"/models/llama\", \"version\": 1 }");
    qp_job *c = parse_ok("{" BASE ", \"bits\": 8}");
    qp_job *d = parse_ok("{" BASE ", \"id\": \"mine\"}");
    if (!a || !b || !c || !d) goto out;
    CHECK_INT(strlen(a->id), 18);
    CHECK(strncmp(a->id, "j-", 2) == 0);
    CHECK(strspn(a->id + 2, "0123456789abcdef") == 16);
    CHECK_STR(a->id, b->id);
    CHECK(strcmp(a->id, c->id) != 0);
    CHECK_STR(d->id, "mine");
    CHECK_INT(d->id_derived, 0);
    /* The id is the SHA-256 of the canonical JSON without "id". */
    char *noid = qp_job_to_json(a, QP_JOB_JSON_NO_ID);
    CHECK(noid && !strstr(noid, "\"id\""));
    char hex[65];
    qp_sha256_hex(noid, strlen(noid), hex);
    CHECK(strncmp(a->id + 2, hex, 16) == 0);
    free(noid);
    char again[QP_JOB_ID_MAX + 1];
    CHECK_OK(qp_job_derive_id(d, again));   /* an explicit id does not change the derivation */
    CHECK_STR(again, a->id);
    /* The output-only form ignores what does not change the output bytes. */
    qp_job *e = parse_ok("{\"model\":\"/models/llama\",\"output\":\"/elsewhere\",\"calibration\":{\"path\":\"other.jsonl\"},"
                         " \"priority\": 9, \"overwrite\": true, \"backend\": \"cpu\","
                         " \"eval\": {\"path\": \"w\"}, \"kernel_check\": false}");
    char *oa = qp_job_to_json(a, QP_JOB_JSON_OUTPUT_ONLY), *oe = e ? qp_job_to_json(e, QP_JOB_JSON_OUTPUT_ONLY) : NULL;
    CHECK_STR(oa, oe);
    CHECK(oa && !strstr(oa, "output\"") && !strstr(oa, "priority") && !strstr(oa, "\"path\""));
    char *oc = qp_job_to_json(c, QP_JOB_JSON_OUTPUT_ONLY);
    CHECK(oc && oa && strcmp(oa, oc) != 0);
    free(oa); free(oe); free(oc);
    qp_job_free(e);
out:
    qp_job_free(a); qp_job_free(b); qp_job_free(c); qp_job_free(d);
}

/* The MoE options: defaults, refusals by name, and ids that do not move for jobs that leave
 * them at their defaults (every dense model's job keeps the id it had before). */
static void test_moe_options(void)
{
    qp_job *a = parse_ok("{" BASE "}");
    qp_job *b = parse_ok("{" BASE ", \"moe\": {\"calibrate_all_experts\": true, \"min_tokens\": 32}}");
    qp_job *c = parse_ok("{" BASE ", \"moe\": {\"calibrate_all_experts\": false, \"min_tokens\": 4}}");
    if (!a || !b || !c) goto out;
    CHECK_INT(a->moe.calibrate_all_experts, 1);
    CHECK_INT(a->moe.min_tokens, QP_MOE_MIN_TOKENS_DEFAULT);
    CHECK_STR(a->id, b->id);
    CHECK(strcmp(a->id, c->id) != 0);
    CHECK_INT(c->moe.calibrate_all_experts, 0);
    CHECK_INT(c->moe.min_tokens, 4);
    char *js = qp_job_to_json(c, 0);
    qp_job *d = js ? parse_ok(js) : NULL;
    CHECK(d && d->moe.min_tokens == 4 && !d->moe.calibrate_all_experts);
    free(js);
    qp_job_free(d);
    EXPECT_ERR("{" BASE ", \"moe\": {\"calibrate_all\": true}}", "calibrate_all");
    EXPECT_ERR("{" BASE ", \"moe\": {\"min_tokens\": -1}}", "job.moe.min_tokens");
    EXPECT_ERR("{" BASE ", \"moe\": true}", "job.moe");
    qp_job *e = parse_ok("{" BASE ", \"moe\": {\"awq_shared_input\": true}}");
    CHECK(e && e->moe.awq_shared_input && strcmp(e->id, a->id) != 0);
    char *je = e ? qp_job_to_json(e, QP_JOB_JSON_OUTPUT_ONLY) : NULL;
    CHECK(je && strstr(je, "\"awq_shared_input\":true"));   /* changes the output: fingerprinted */
    free(je);
    qp_job_free(e);
    CHECK_INT(a->moe.awq_shared_input, 0);
    EXPECT_ERR("{" BASE ", \"moe\": {\"awq_shared_input\": 1}}", "job.moe.awq_shared_input");
out:
    qp_job_free(a); qp_job_free(b); qp_job_free(c);
}

/* awq.stats_tokens: default 8192, AWQ methods only, 0 = every token, fingerprinted (it
 * changes the output) and absent from the canonical form at the default. */
static void test_awq_options(void)
{
    qp_job *a = parse_ok("{" BASE ", \"method\": \"awq\"}");
    qp_job *b = parse_ok("{" BASE ", \"method\": \"awq\", \"awq\": {\"stats_tokens\": 8192}}");
    qp_job *c = parse_ok("{" BASE ", \"method\": \"awq+gptq\", \"awq\": {\"stats_tokens\": 0}}");
    if (!a || !b || !c) goto out;
    CHECK((long long)a->awq.stats_tokens == QP_AWQ_STATS_TOKENS_DEFAULT);
    CHECK_STR(a->id, b->id);
    CHECK((long long)c->awq.stats_tokens == 0);
    char *ja = qp_job_to_json(a, QP_JOB_JSON_OUTPUT_ONLY), *jc = qp_job_to_json(c, QP_JOB_JSON_OUTPUT_ONLY);
    CHECK(ja && !strstr(ja, "\"awq\":"));
    CHECK(jc && strstr(jc, "\"awq\":{\"stats_tokens\":0}"));   /* changes the output: fingerprinted */
    char *js = qp_job_to_json(c, 0);
    qp_job *d = js ? parse_ok(js) : NULL;
    CHECK(d && d->awq.stats_tokens == 0);
    free(ja); free(jc); free(js);
    qp_job_free(d);
    EXPECT_ERR("{" BASE ", \"method\": \"gptq\", \"awq\": {\"stats_tokens\": 0}}",
               "job.awq: given for method gptq");
    EXPECT_ERR("{" BASE ", \"method\": \"rtn\", \"awq\": {}}", "job.awq: given for method rtn");
    EXPECT_ERR("{" BASE ", \"method\": \"awq\", \"awq\": {\"stats_tokens\": -1}}",
               "job.awq.stats_tokens: must be 0 (every token) or a positive integer");
    EXPECT_ERR("{" BASE ", \"method\": \"awq\", \"awq\": {\"n_grid\": 10}}", "n_grid");
    EXPECT_ERR("{" BASE ", \"method\": \"awq\", \"awq\": 8192}", "job.awq: must be an object");
out:
    qp_job_free(a); qp_job_free(b); qp_job_free(c);
}

/* compute: auto (default), f32 or bf16, fingerprinted (it changes the output) and absent from
 * the canonical form at auto, so jobs that never named it keep their ids. */
static void test_compute(void)
{
    qp_job *a = parse_ok("{" BASE "}");
    qp_job *b = parse_ok("{" BASE ", \"compute\": \"f32\"}");
    qp_job *c = parse_ok("{" BASE ", \"compute\": \"bf16\"}");
    qp_job *e = parse_ok("{" BASE ", \"compute\": \"auto\"}");
    if (!a || !b || !c || !e) goto out;
    CHECK_INT(a->compute, QP_COMPUTE_AUTO);
    CHECK_INT(b->compute, QP_COMPUTE_F32);
    CHECK_INT(c->compute, QP_COMPUTE_BF16);
    CHECK_INT(e->compute, QP_COMPUTE_AUTO);
    CHECK_STR(a->id, e->id);
    CHECK(strcmp(a->id, b->id) != 0);
    CHECK(strcmp(a->id, c->id) != 0);
    CHECK(strcmp(b->id, c->id) != 0);
    char *fa = qp_job_to_json(a, QP_JOB_JSON_OUTPUT_ONLY), *fb = qp_job_to_json(b, QP_JOB_JSON_OUTPUT_ONLY);
    char *fc = qp_job_to_json(c, QP_JOB_JSON_OUTPUT_ONLY);
    CHECK(fa && !strstr(fa, "compute"));
    CHECK(fb && strstr(fb, "\"compute\":\"f32\""));
    CHECK(fc && strstr(fc, "\"compute\":\"bf16\""));
    /* Each value survives the full form's round trip (the daemon hands workers that form). */
    qp_job *src[3] = {a, b, c};
    for (int i = 0; i < 3; i++) {
        char *js = qp_job_to_json(src[i], 0);
        qp_job *d = js ? parse_ok(js) : NULL;
        CHECK(d && d->compute == src[i]->compute);
        free(js);
        qp_job_free(d);
    }
    free(fa); free(fb); free(fc);
    EXPECT_ERR("{" BASE ", \"compute\": \"fp16\"}", "job.compute: \"fp16\" is not one of f32, bf16, auto");
    EXPECT_ERR("{" BASE ", \"compute\": 16}", "job.compute");
    CHECK_STR(qp_compute_name(QP_COMPUTE_AUTO), "auto");
    CHECK(qp_compute_name((qp_compute)3) == NULL);
out:
    qp_job_free(a); qp_job_free(b); qp_job_free(c); qp_job_free(e);
}

/* kernel_check_rows: default 64, range, refused without kernel_check, kept by the canonical
 * form only when not the default (a job's id does not change), out of the fingerprint. */
static void test_kernel_check_rows(void)
{
    qp_job *a = parse_ok("{" BASE "}");
    qp_job *b = parse_ok("{" BASE ", \"kernel_check_rows\": 64}");
    qp_job *c = parse_ok("{" BASE ", \"kernel_check_rows\": 8}");
    if (!a || !b || !c) goto out;
    CHECK_INT(a->kernel_check_rows, QP_KERNEL_CHECK_ROWS_DEFAULT);
    CHECK_STR(a->id, b->id);
    CHECK_INT(c->kernel_check_rows, 8);
    char *js = qp_job_to_json(c, 0), *fa = qp_job_to_json(a, QP_JOB_JSON_OUTPUT_ONLY), *fc = qp_job_to_json(c, QP_JOB_JSON_OUTPUT_ONLY);
    qp_job *d = js ? parse_ok(js) : NULL;
    CHECK(d && d->kernel_check_rows == 8);
    CHECK(fa && fc && !strcmp(fa, fc));   /* the output does not depend on it */
    free(js); free(fa); free(fc);
    qp_job_free(d);
    EXPECT_ERR("{" BASE ", \"kernel_check_rows\": 0}", "job.kernel_check_rows: must be an integer from 1 to 65536");
    EXPECT_ERR("{" BASE ", \"kernel_check_rows\": 65537}", "job.kernel_check_rows");
    EXPECT_ERR("{" BASE ", \"kernel_check_rows\": \"64\"}", "job.kernel_check_rows");
    EXPECT_ERR("{" BASE ", \"kernel_check\": false, \"kernel_check_rows\": 16}", "given while kernel_check is false");
out:
    qp_job_free(a); qp_job_free(b); qp_job_free(c);
}

/* checkpoint.acts_every: default 4, range, unknown keys refused, out
 * of the fingerprint, kept by the canonical form; layout tp_aware keeps every block's. */
static void test_checkpoint_options(void)
{
    qp_job *a = parse_ok("{" BASE "}");
    qp_job *c = parse_ok("{" BASE ", \"checkpoint\": {\"acts_every\": 8}}");
    qp_job *t = parse_ok("{" BASE ", \"method\": \"gptq\", \"desc_act\": true, \"layout\": \"tp_aware\", \"tp\": 2}");
    if (!a || !c || !t) goto out;
    CHECK_INT(a->checkpoint.acts_every, QP_CKPT_ACTS_EVERY_DEFAULT);
    CHECK_INT(c->checkpoint.acts_every, 8);
    CHECK_INT(qp_job_acts_every(a), QP_CKPT_ACTS_EVERY_DEFAULT);
    CHECK_INT(qp_job_acts_every(t), 1);
    char *js = qp_job_to_json(c, 0), *fa = qp_job_to_json(a, QP_JOB_JSON_OUTPUT_ONLY), *fc = qp_job_to_json(c, QP_JOB_JSON_OUTPUT_ONLY);
    qp_job *d = js ? parse_ok(js) : NULL;
    CHECK(d && d->checkpoint.acts_every == 8);
    CHECK(fa && fc && !strcmp(fa, fc));   /* the output does not depend on it */
    free(js); free(fa); free(fc);
    qp_job_free(d);
    EXPECT_ERR("{" BASE ", \"checkpoint\": {\"acts_every\": 0}}", "job.checkpoint.acts_every: must be an integer >= 1");
    EXPECT_ERR("{" BASE ", \"checkpoint\": {\"acts_minutes\": 10}}", "acts_minutes");
    EXPECT_ERR("{" BASE ", \"checkpoint\": {\"acts_every_blocks\": 2}}", "acts_every_blocks");
    EXPECT_ERR("{" BASE ", \"checkpoint\": 4}", "job.checkpoint: must be an object");
    /* error_direct_rows: default 0 (off), range, kept by the canonical form, out of the fingerprint. */
    qp_job *e = parse_ok("{" BASE ", \"error_direct_rows\": 4096}");
    CHECK(a->error_direct_rows == 0 && e && e->error_direct_rows == 4096);
    char *je = e ? qp_job_to_json(e, 0) : NULL, *fe = e ? qp_job_to_json(e, QP_JOB_JSON_OUTPUT_ONLY) : NULL;
    qp_job *e2 = je ? parse_ok(je) : NULL;
    CHECK(e2 && e2->error_direct_rows == 4096);
    char *fa2 = qp_job_to_json(a, QP_JOB_JSON_OUTPUT_ONLY);
    CHECK(fe && fa2 && !strcmp(fe, fa2));
    free(je); free(fe); free(fa2);
    qp_job_free(e); qp_job_free(e2);
    EXPECT_ERR("{" BASE ", \"error_direct_rows\": -1}", "job.error_direct_rows: must be an integer from 0 (off)");
    EXPECT_ERR("{" BASE ", \"method\": \"gptq\", \"desc_act\": true, \"layout\": \"tp_aware\", \"tp\": 2, "
               "\"checkpoint\": {\"acts_every\": 2}}", "must be 1 with layout tp_aware");
out:
    qp_job_free(a); qp_job_free(c); qp_job_free(t);
}

/* workers: "all" (0) by default, a count 1..4096 or "all"; kept by the canonical form only when
 * not "all" (older jobs keep their ids); out of the fingerprint (it changes no output byte). */
static void test_workers(void)
{
    qp_job *a = parse_ok("{" BASE "}");
    qp_job *all = parse_ok("{" BASE ", \"workers\": \"all\"}");
    qp_job *one = parse_ok("{" BASE ", \"workers\": 1}");
    qp_job *max = parse_ok("{" BASE ", \"workers\": 4096}");
    qp_job *three = parse_ok("{" BASE ", \"workers\": 3.0}");
    qp_job *nul = parse_ok("{" BASE ", \"workers\": null}");   /* null is absent, as for every field */
    if (!a || !all || !one || !max || !three || !nul) goto out;
    CHECK_INT(nul->workers, QP_JOB_WORKERS_ALL);
    CHECK_INT(a->workers, QP_JOB_WORKERS_ALL);
    CHECK_INT(all->workers, QP_JOB_WORKERS_ALL);
    CHECK_INT(one->workers, 1);
    CHECK_INT(max->workers, 4096);
    CHECK_INT(three->workers, 3);
    CHECK_STR(a->id, all->id);             /* "all" is the default: the same job */
    CHECK(strcmp(a->id, one->id) != 0);    /* another spec, another derived id */
    char *ja = qp_job_to_json(a, 0), *j1 = qp_job_to_json(one, 0);
    CHECK(ja && !strstr(ja, "workers"));
    CHECK_CONTAINS(j1, "\"priority\":0,\"workers\":1,\"backend\"");
    qp_job *back = j1 ? parse_ok(j1) : NULL;
    CHECK(back && back->workers == 1);
    qp_job_free(back);
    char *fa = qp_job_to_json(a, QP_JOB_JSON_OUTPUT_ONLY), *f1 = qp_job_to_json(one, QP_JOB_JSON_OUTPUT_ONLY);
    CHECK(fa && f1 && !strcmp(fa, f1));   /* not in the fingerprint */
    free(ja); free(j1); free(fa); free(f1);
    qp_job *dup = qp_job_dup(max);
    CHECK(dup && dup->workers == 4096);
    qp_job_free(dup);
    const char *want = "job.workers: must be \"all\" or a whole number of workers from 1 to 4096, got ";
    EXPECT_ERR("{" BASE ", \"workers\": 0}", "job.workers: must be \"all\" or a whole number of workers from 1 to 4096, got 0");
    EXPECT_ERR("{" BASE ", \"workers\": -1}", "got -1");
    EXPECT_ERR("{" BASE ", \"workers\": 4097}", "got 4097");
    EXPECT_ERR("{" BASE ", \"workers\": 2.5}", "got 2.5");
    EXPECT_ERR("{" BASE ", \"workers\": 1e300}", want);
    EXPECT_ERR("{" BASE ", \"workers\": \"ALL\"}", "got \"ALL\"");
    EXPECT_ERR("{" BASE ", \"workers\": \"2\"}", "got \"2\"");
    EXPECT_ERR("{" BASE ", \"workers\": true}", "got true");
    EXPECT_ERR("{" BASE ", \"workers\": [2]}", "got an array");
    /* A job built in code is checked too. */
    a->workers = -2;
    qp_err err = {0};
    CHECK_ERR(qp_job_validate(a, &err));
    CHECK_CONTAINS(err.msg, "job.workers: must be \"all\"");
out:
    qp_job_free(a); qp_job_free(all); qp_job_free(one); qp_job_free(max); qp_job_free(three); qp_job_free(nul);
}

static void test_names(void)
{
    qp_method m;
    qp_format f;
    CHECK_OK(qp_method_parse("awq+gptq", &m)); CHECK_INT(m, QP_METHOD_AWQ_GPTQ);
    CHECK_ERR(qp_method_parse("AWQ", &m));
    CHECK_OK(qp_format_parse("gptq_v2", &f)); CHECK_INT(f, QP_FORMAT_GPTQ_V2);
    CHECK_ERR(qp_format_parse("exl2", &f));
    CHECK_STR(qp_format_name(QP_FORMAT_AWQ_GEMM), "awq_gemm");
    CHECK(qp_method_name((qp_method)17) == NULL);
    CHECK_STR(qp_backend_name(QP_BACKEND_CUDA), "cuda");
    CHECK_STR(qp_layout_name(QP_LAYOUT_TP_AWARE), "tp_aware");
    CHECK_STR(qp_calib_style_name(QP_CALIB_AWQ), "awq");
}

/* Random byte edits of a valid spec must parse or fail with a message, never crash. */
static void test_mutations_never_crash(void)
{
    const char *full = "{\"id\":\"j1\",\"model\":\"m\",\"output\":\"o\",\"method\":\"awq\",\"bits\":4,"
                       "\"calibration\":{\"path\":\"c\",\"samples\":8},\"eval\":{\"path\":\"w\"},"
                       "\"modules_to_not_convert\":[\"a\"],\"shard_size\":\"1MB\"}";
    static const char alphabet[] = "{}[]\":,0123456789.-+eE truefalsnul\\ab";
    test_rng rng;
    test_rng_seed(&rng, 7);
    size_t n = strlen(full);
    char buf[512];
    int failed = 0, passed = 0;
    for (int it = 0; it < 3000; it++) {
        memcpy(buf, full, n + 1);
        int edits = 1 + (int)(test_rng_u64(&rng) % 4);
        for (int e = 0; e < edits; e++)
            buf[test_rng_u64(&rng) % n] = alphabet[test_rng_u64(&rng) % (sizeof alphabet - 1)];
        qp_job *j = NULL;
        qp_err err = { 0 };
        int rc = qp_job_parse(buf, n, &j, &err);
        if (rc == 0) {
            passed++;
            char *c = qp_job_to_json(j, 0);
            qp_job *k = NULL;
            CHECK(c && qp_job_parse(c, strlen(c), &k, NULL) == 0);   /* what we write, we read */
            free(c);
            qp_job_free(k);
        } else {
            failed++;
            test_checks++;
            if (j != NULL || !err.msg[0] || strncmp(err.msg, "job", 3) != 0) TEST_FAIL_("%s: bad failure \"%s\"", buf, err.msg);
        }
        qp_job_free(j);
    }
    CHECK(failed > 0 && passed > 0);
}

/* job.serve and the profiles (issue #17 part 3); without serve the canonical form has none. */
static void test_serve_and_profile(void)
{
    qp_job *j = parse_ok("{" BASE "}");
    CHECK(j && !j->serve.enabled);
    char *canon = j ? qp_job_to_json(j, 0) : NULL;
    CHECK(canon && !strstr(canon, "serve"));
    free(canon);
    qp_job_free(j);
    j = parse_ok("{" BASE ", \"format\": \"compressed-tensors\", \"serve\": {\"engine\": \"vllm\", \"gpu\": \"hopper\", \"tp\": 4}}");
    CHECK(j && j->serve.enabled && j->serve.tp == 4);
    if (j) {
        CHECK_STR(j->serve.gpu, "hopper");
        canon = qp_job_to_json(j, 0);
        CHECK_CONTAINS(canon, "\"serve\":{\"engine\":\"vllm\",\"gpu\":\"hopper\",\"tp\":4}");
        qp_job *back = canon ? parse_ok(canon) : NULL;
        CHECK(back && back->serve.enabled && back->serve.tp == 4 && !strcmp(back->serve.gpu, "hopper"));
        qp_job_free(back);
        free(canon);
        /* Not part of the output fingerprint: serving somewhere else writes the same bytes. */
        canon = qp_job_to_json(j, QP_JOB_JSON_OUTPUT_ONLY);
        CHECK(canon && !strstr(canon, "serve"));
        free(canon);
    }
    qp_job_free(j);
    j = parse_ok("{" BASE ", \"serve\": {\"engine\": \"vllm\", \"gpu\": \"ampere\"}}");
    CHECK(j && j->serve.tp == 1);
    qp_job_free(j);
    EXPECT_ERR("{" BASE ", \"serve\": {\"engine\": \"vllm\", \"gpu\": \"volta\"}}",
               "job.serve.gpu: \"volta\" is not one of hopper, ampere, blackwell");
    j = parse_ok("{" BASE ", \"serve\": {\"engine\": \"vllm\", \"gpu\": \"blackwell\", \"tp\": 2}}");
    CHECK(j && !strcmp(j->serve.gpu, "blackwell") && j->serve.tp == 2);
    qp_job_free(j);
    EXPECT_ERR("{" BASE ", \"serve\": {\"engine\": \"sglang\", \"gpu\": \"hopper\"}}",
               "job.serve.engine: \"sglang\" is not one of vllm");
    EXPECT_ERR("{" BASE ", \"serve\": {\"gpu\": \"hopper\"}}", "job.serve.engine: required");
    EXPECT_ERR("{" BASE ", \"serve\": {\"engine\": \"vllm\", \"gpu\": \"hopper\", \"tp\": 0}}", "job.serve.tp");
    EXPECT_ERR("{" BASE ", \"serve\": {\"engine\": \"vllm\", \"gpu\": \"hopper\", \"fp8\": true}}", "fp8");
    EXPECT_ERR("{" BASE ", \"serve\": \"vllm\"}", "job.serve: must be an object");
    EXPECT_ERR("{" BASE ", \"format\": \"compressed-tensors\", \"desc_act\": true, \"static_groups\": true, "
               "\"tp\": 2, \"layout\": \"tp_aware\"}", "job.layout: tp_aware reorders the g_idx of act-order weights, "
               "and format compressed-tensors stores none");
    /* The vllm-hopper profile is a valid set of job fields. */
    const char *what = NULL, *pj = qp_job_profile("vllm-hopper", &what);
    CHECK(pj && what);
    CHECK(qp_job_profile("nope", NULL) == NULL);
    CHECK_STR(qp_job_profile_name(0), "vllm-hopper");
    if (pj) {
        char buf[1024];
        snprintf(buf, sizeof buf, "{" BASE ", %s", pj + 1);
        j = parse_ok(buf);
        CHECK(j && !strcmp(qp_format_name(j->format), "compressed-tensors") && j->bits == 4 && j->group_size == 128 &&
              j->sym && j->serve.enabled);
        qp_job_free(j);
    }
    /* The issue #35 profiles: a scheme and a serve block, nothing the scheme sets (a job's own
     * bits or format must agree with the scheme, as they must without a profile). */
    static const struct { const char *name, *scheme, *gpu; int bits; int64_t group; } fl[] = {
        {"vllm-hopper-fp8", "FP8_DYNAMIC", "hopper", 8, -1},
        {"vllm-blackwell", "NVFP4A16", "blackwell", 4, 16},
    };
    for (size_t i = 0; i < sizeof fl / sizeof fl[0]; i++) {
        pj = qp_job_profile(fl[i].name, &what);
        CHECK(pj && what);
        CHECK_STR(qp_job_profile_name(i + 1), fl[i].name);
        if (!pj) continue;
        char buf[1024];
        snprintf(buf, sizeof buf, "{" BASE ", %s", pj + 1);
        j = parse_ok(buf);
        CHECK(j && qp_job_scheme(j) && !strcmp(qp_job_scheme(j)->name, fl[i].scheme) && j->bits == fl[i].bits &&
              j->group_size == fl[i].group && j->method == QP_METHOD_GPTQ && j->serve.enabled &&
              !strcmp(j->serve.gpu, fl[i].gpu) && j->serve.tp == 1);
        qp_job_free(j);
        /* A job's bits that disagree with the profile's scheme are refused with the reason. */
        snprintf(buf, sizeof buf, "{" BASE ", \"bits\": 2, %s", pj + 1);
        EXPECT_ERR(buf, "contradicts scheme");
    }
    CHECK(qp_job_profile_name(3) == NULL);
}

int main(void)
{
    TEST_RUN(test_sha256_vectors);
    TEST_RUN(test_bad_json);
    TEST_RUN(test_version);
    TEST_RUN(test_unknown_and_duplicate_fields);
    TEST_RUN(test_required);
    TEST_RUN(test_field_types_and_ranges);
    TEST_RUN(test_calibration_and_eval);
    TEST_RUN(test_modules_and_shard_size);
    TEST_RUN(test_cross_field_rules);
    TEST_RUN(test_defaults_per_method);
    TEST_RUN(test_serve_and_profile);
    TEST_RUN(test_canonical_round_trip);
    TEST_RUN(test_derived_id);
    TEST_RUN(test_moe_options);
    TEST_RUN(test_awq_options);
    TEST_RUN(test_kernel_check_rows);
    TEST_RUN(test_compute);
    TEST_RUN(test_checkpoint_options);
    TEST_RUN(test_workers);
    TEST_RUN(test_names);
    TEST_RUN(test_mutations_never_crash);
    return test_finish();
}
