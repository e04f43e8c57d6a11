/* job.scheme (quant/job/job.c, quant/formats/scheme.h): a preset sets bits, group_size, sym
 * and format; a field the job also gives must agree, else the job is refused naming both;
 * the static-activation presets are refused with what to use instead; a float format
 * without a scheme is refused; the canonical form carries the scheme only when given, so
 * a job without one keeps its derived id. */
#include "test_util.h"

#include <stdlib.h>
#include <string.h>

#include "quant/formats/scheme.h"
#include "quant/job/job.h"

#define BASE "\"model\": \"/m\", \"output\": \"/o\", \"calibration\": {\"path\": \"/c.jsonl\"}"

static qp_job *parse(const char *json, qp_err *err)
{
    qp_job *j = NULL;
    memset(err, 0, sizeof *err);
    if (qp_job_parse(json, strlen(json), &j, err)) return NULL;
    return j;
}

static void test_sets_fields(void)
{
    static const struct { const char *scheme, *format; int bits, gs, sym; } want[] = {
        {"W4A16", "compressed-tensors", 4, 128, 1},    {"W4A16_ASYM", "compressed-tensors", 4, 128, 0},
        {"W8A16", "compressed-tensors", 8, 128, 1},    {"W4AFP8", "compressed-tensors", 4, 128, 1},
        {"FP8_DYNAMIC", "float-quantized", 8, -1, 1},  {"FP8_BLOCK", "float-quantized", 8, 128, 1},
        {"NVFP4A16", "nvfp4-pack-quantized", 4, 16, 1}, {"MXFP4A16", "mxfp4-pack-quantized", 4, 32, 1},
        {"FP8", "float-quantized", 8, -1, 1},          {"NVFP4", "nvfp4-pack-quantized", 4, 16, 1},
        {"MXFP4", "mxfp4-pack-quantized", 4, 32, 1},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        char json[512];
        qp_err err;
        /* method awq defaults to sym false: the scheme's sym wins when the job says nothing */
        snprintf(json, sizeof json, "{" BASE ", \"method\": \"awq\", \"scheme\": \"%s\"}", want[i].scheme);
        qp_job *j = parse(json, &err);
        CHECK(j != NULL);
        if (!j) { fprintf(stderr, "%s: %s\n", want[i].scheme, err.msg); continue; }
        CHECK_STR(qp_format_name(j->format), want[i].format);
        CHECK_INT(j->bits, want[i].bits);
        CHECK_INT(j->group_size, want[i].gs);
        CHECK_INT(j->sym, want[i].sym);
        CHECK_STR(qp_job_scheme(j)->name, want[i].scheme);
        char *c = qp_job_to_json(j, 0);
        char needle[64];
        snprintf(needle, sizeof needle, "\"scheme\":\"%s\"", want[i].scheme);
        CHECK_CONTAINS(c, needle);
        /* the canonical form parses back to the same job */
        qp_job *k = parse(c, &err);
        CHECK(k && k->scheme == j->scheme && k->format == j->format);
        qp_job_free(k);
        free(c);
        qp_job_free(j);
    }
}

static void test_refusals(void)
{
    static const struct { const char *extra, *want; } bad[] = {
        {"\"scheme\": \"W4A16\", \"bits\": 8", "job.bits: 8 contradicts scheme W4A16"},
        {"\"scheme\": \"NVFP4A16\", \"group_size\": 32", "job.group_size: 32 contradicts scheme NVFP4A16"},
        {"\"scheme\": \"W4A16\", \"sym\": false", "job.sym: false contradicts scheme W4A16"},
        {"\"scheme\": \"FP8_DYNAMIC\", \"format\": \"gptq\"", "job.format: gptq contradicts scheme FP8_DYNAMIC"},
        {"\"scheme\": \"FP8\", \"method\": \"rtn\"", "job.scheme: FP8 declares a static activation scale"},
        {"\"scheme\": \"NVFP4\", \"method\": \"rtn\"", "or scheme NVFP4A16"},
        {"\"scheme\": \"W3A16\"", "job.scheme: \"W3A16\" is not one of W4A16"},
        {"\"format\": \"nvfp4-pack-quantized\", \"bits\": 4, \"group_size\": 16",
         "job.format: nvfp4-pack-quantized is written through a scheme (NVFP4A16"},
        {"\"scheme\": 4", "job.scheme"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char json[512];
        qp_err err;
        snprintf(json, sizeof json, "{" BASE ", %s}", bad[i].extra);
        qp_job *j = parse(json, &err);
        CHECK(j == NULL);
        qp_job_free(j);
        CHECK_CONTAINS(err.msg, bad[i].want);
    }
    /* Agreeing fields are fine. */
    qp_err err;
    qp_job *j = parse("{" BASE ", \"scheme\": \"FP8_BLOCK\", \"bits\": 8, \"group_size\": 128, \"sym\": true, "
                      "\"format\": \"float-quantized\"}", &err);
    CHECK(j != NULL);
    qp_job_free(j);
}

static void test_no_scheme_unchanged(void)
{
    qp_err err;
    qp_job *j = parse("{" BASE "}", &err);
    CHECK(j != NULL);
    if (!j) return;
    CHECK_INT(j->scheme, 0);
    CHECK(qp_job_scheme(j) == NULL);
    char *c = qp_job_to_json(j, 0);
    CHECK(strstr(c, "scheme") == NULL);
    free(c);
    qp_job_free(j);
}

int main(void)
{
    TEST_RUN(test_sets_fields);
    TEST_RUN(test_refusals);
    TEST_RUN(test_no_scheme_unchanged);
    return test_finish();
}
