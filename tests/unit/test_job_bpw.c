/* job.target_bpw and its candidates: what is accepted, the canonical form (written only when
 * given), and every combination refused by name. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/job/job.h"
#include "test_util.h"

static int parse(const char *extra, qp_job **job, qp_err *err)
{
    char buf[1024];
    snprintf(buf, sizeof buf, "{\"id\":\"t\",\"model\":\"/m\",\"output\":\"/o\",\"calibration\":{\"path\":\"c.jsonl\"}%s%s}",
             extra[0] ? "," : "", extra);
    *job = NULL;
    return qp_job_parse(buf, strlen(buf), job, err);
}

static void refused(const char *extra, const char *words)
{
    qp_job *job = NULL;
    qp_err err = {0};
    CHECK_ERR(parse(extra, &job, &err));
    CHECK(job == NULL);
    CHECK_CONTAINS(err.msg, words);
}

int main(void)
{
    qp_job *job = NULL;
    qp_err err = {0};
    CHECK_OK(parse("\"format\":\"compressed-tensors\",\"target_bpw\":4.25,\"bpw_bits\":[4,8],\"bpw_group_sizes\":[64,192]",
                   &job, &err));
    CHECK(job->target_bpw == 4.25);
    CHECK_INT(job->n_bpw_bits, 2);
    CHECK_INT(job->bpw_bits[1], 8);
    CHECK_INT(job->n_bpw_group_sizes, 2);
    CHECK_INT(job->bpw_group_sizes[1], 192);
    char *js = qp_job_to_json(job, QP_JOB_JSON_OUTPUT_ONLY);
    CHECK_CONTAINS(js, "\"target_bpw\":4.25,\"bpw_bits\":[4,8],\"bpw_group_sizes\":[64,192]");
    free(js);
    qp_job *d = qp_job_dup(job);
    CHECK(d && d->n_bpw_group_sizes == 2 && d->bpw_group_sizes[0] == 64);
    qp_job_free(d);
    qp_job_free(job);
    /* Off: no key in the canonical form. */
    CHECK_OK(parse("\"format\":\"compressed-tensors\",\"target_bpw\":null", &job, &err));
    js = qp_job_to_json(job, 0);
    CHECK(!strstr(js, "bpw"));
    free(js);
    qp_job_free(job);

    refused("\"format\":\"compressed-tensors\",\"target_bpw\":0.5", "job.target_bpw: must be a number");
    refused("\"format\":\"compressed-tensors\",\"target_bpw\":\"4\"", "job.target_bpw: must be a number");
    /* GPTQ's format holds the plan as `dynamic` overrides, with 2, 3, 4 and 8 bits. */
    CHECK_OK(parse("\"target_bpw\":3.5,\"bpw_bits\":[3,4],\"bpw_group_sizes\":[64,192]", &job, &err));
    CHECK_INT(job->bpw_bits[0], 3);
    qp_job_free(job);
    CHECK_OK(parse("\"format\":\"gptq_v2\",\"target_bpw\":2.5,\"bpw_bits\":[2,3,4,8]", &job, &err));
    qp_job_free(job);
    refused("\"format\":\"awq_gemm\",\"method\":\"gptq\",\"target_bpw\":4.25", "format awq_gemm cannot hold mixed bits");
    refused("\"target_bpw\":4.25,\"bpw_bits\":[4,5]", "job.bpw_bits[1]:");
    refused("\"method\":\"awq\",\"format\":\"compressed-tensors\",\"target_bpw\":4.25", "method awq searches");
    refused("\"format\":\"compressed-tensors\",\"desc_act\":true,\"static_groups\":false,\"target_bpw\":4.25",
            "job.static_groups: compressed-tensors holds act-order (desc_act) weights only with static groups");
    refused("\"scheme\":\"W4A16\",\"target_bpw\":4.25", "not with a scheme (W4A16)");
    refused("\"format\":\"compressed-tensors\",\"bpw_bits\":[4]", "job.bpw_bits: given without target_bpw");
    refused("\"format\":\"compressed-tensors\",\"bpw_group_sizes\":[64]", "job.bpw_group_sizes: given without target_bpw");
    refused("\"format\":\"compressed-tensors\",\"target_bpw\":4.25,\"bpw_bits\":[3,4]", "job.bpw_bits[0]:");
    refused("\"format\":\"compressed-tensors\",\"target_bpw\":4.25,\"bpw_bits\":[4,4]", "4 is listed twice");
    refused("\"format\":\"compressed-tensors\",\"target_bpw\":4.25,\"bpw_bits\":[]", "must be an array of 1 to 8");
    refused("\"format\":\"compressed-tensors\",\"target_bpw\":4.25,\"bpw_group_sizes\":[0]", "job.bpw_group_sizes[0]:");
    return test_finish();
}
