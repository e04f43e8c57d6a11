/* job.scale_search (quant/job/job.c): "minmax" or "mse", mse by default for method gptq
 * (min-max for the others, and for schemes whose rows share a scale); mse refused by name
 * with the AWQ methods and with such schemes; the canonical form carries it when it is
 * "mse" and always for method gptq (so a gptq job written before mse was its default, which
 * has no key and meant min-max, never shares a fingerprint with one that searches), and
 * parses back to the same job. */
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
    CHECK_INT(j->scale_search, QD_SCALE_SEARCH_MSE);            /* gptq's default */
    char *c = qp_job_to_json(j, 0);
    CHECK_CONTAINS(c, "\"scale_search\":\"mse\"");
    free(c);
    qp_job_free(j);
    /* Min-max by default, and no key in the form (their ids as before): rtn, awq, awq+gptq,
     * and gptq with a scheme whose rows share a scale. */
    static const char *minmax[] = {"\"method\": \"rtn\"", "\"method\": \"awq\"", "\"method\": \"awq+gptq\"",
                                   "\"scheme\": \"FP8_BLOCK\""};
    for (size_t i = 0; i < sizeof minmax / sizeof minmax[0]; i++) {
        char json[512];
        snprintf(json, sizeof json, "{" BASE ", %s}", minmax[i]);
        j = parse(json, &err);
        CHECK(j != NULL);
        if (!j) { fprintf(stderr, "%s: %s\n", minmax[i], err.msg); continue; }
        CHECK_INT(j->scale_search, QD_SCALE_SEARCH_MINMAX);
        c = qp_job_to_json(j, 0);
        if (j->method == QP_METHOD_GPTQ) CHECK_CONTAINS(c, "\"scale_search\":\"minmax\"");
        else CHECK(strstr(c, "scale_search") == NULL);
        qp_job *k = parse(c, &err);
        CHECK(k && k->scale_search == QD_SCALE_SEARCH_MINMAX);
        qp_job_free(k);
        free(c);
        qp_job_free(j);
    }
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
    /* gptq with minmax given: named in the form, so it parses back as min-max. */
    j = parse("{" BASE ", \"scale_search\": \"minmax\"}", &err);
    CHECK(j && j->scale_search == QD_SCALE_SEARCH_MINMAX);
    c = j ? qp_job_to_json(j, 0) : NULL;
    CHECK_CONTAINS(c ? c : "", "\"scale_search\":\"minmax\"");
    qp_job *k = c ? parse(c, &err) : NULL;
    CHECK(k && k->scale_search == QD_SCALE_SEARCH_MINMAX);
    qp_job_free(k);
    free(c);
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
