/* job.scale_search (quant/job/job.c): "minmax" (the default) or "mse"; refused by name with
 * the AWQ methods and with a scheme whose rows share a scale; the canonical form carries it
 * only when it is "mse", so a job without it keeps its derived id; the pipeline's quantizer
 * config takes it. */
#include "test_util.h"

#include <stdlib.h>
#include <string.h>

#include "quant/formats/quantizer.h"
#include "quant/job/job.h"

#define BASE "\"model\": \"/m\", \"output\": \"/o\", \"calibration\": {\"path\": \"/c.jsonl\"}"

static qp_job *parse(const char *json, qp_err *err)
{
    qp_job *j = NULL;
    memset(err, 0, sizeof *err);
    if (qp_job_parse(json, strlen(json), &j, err)) return NULL;
    return j;
}

static void test_parse(void)
{
    qp_err err;
    qp_job *j = parse("{" BASE "}", &err);
    CHECK(j != NULL);
    if (!j) return;
    CHECK_INT(j->scale_search, QD_SCALE_SEARCH_MINMAX);
    char *c = qp_job_to_json(j, 0);
    CHECK(strstr(c, "scale_search") == NULL);
    free(c);
    qp_job_free(j);
    static const char *ok[] = {"\"method\": \"gptq\"", "\"method\": \"rtn\"", "\"method\": \"gptq\", \"desc_act\": true",
                               "\"method\": \"rtn\", \"scheme\": \"NVFP4A16\"", "\"method\": \"gptq\", \"scheme\": \"FP8_DYNAMIC\""};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        char json[512];
        snprintf(json, sizeof json, "{" BASE ", %s, \"scale_search\": \"mse\"}", ok[i]);
        j = parse(json, &err);
        CHECK(j != NULL);
        if (!j) { fprintf(stderr, "%s: %s\n", ok[i], err.msg); continue; }
        CHECK_INT(j->scale_search, QD_SCALE_SEARCH_MSE);
        c = qp_job_to_json(j, 0);
        CHECK_CONTAINS(c, "\"scale_search\":\"mse\"");
        qp_job *k = parse(c, &err);       /* the canonical form parses back */
        CHECK(k && k->scale_search == QD_SCALE_SEARCH_MSE);
        qp_job_free(k);
        free(c);
        qp_job_free(j);
    }
    j = parse("{" BASE ", \"scale_search\": \"minmax\"}", &err);
    CHECK(j && j->scale_search == QD_SCALE_SEARCH_MINMAX);
    qp_job_free(j);
}

static void test_refusals(void)
{
    static const struct { const char *extra, *want; } bad[] = {
        {"\"method\": \"awq\", \"scale_search\": \"mse\"", "job.scale_search: mse is not used with method awq"},
        {"\"method\": \"awq+gptq\", \"scale_search\": \"mse\"", "job.scale_search: mse is not used with method awq+gptq"},
        {"\"scheme\": \"FP8_BLOCK\", \"scale_search\": \"mse\"", "scheme FP8_BLOCK shares one scale across rows"},
        {"\"scale_search\": \"l2\"", "job.scale_search"},
        {"\"scale_search\": 1", "job.scale_search"},
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
}

int main(void)
{
    TEST_RUN(test_parse);
    TEST_RUN(test_refusals);
    return test_finish();
}
