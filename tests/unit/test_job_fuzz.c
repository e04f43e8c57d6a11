/* Fuzzes the job spec parser on every test run, without libFuzzer: 100000 payloads made by
 * mutating the seed specs in tests/fuzz/corpus/job (and the canonical forms of the accepted
 * ones) with a fixed-seed RNG, each run through the libFuzzer target's harness
 * (tests/fuzz/job_fuzz_one.c), which checks field ranges, validation and the canonical-JSON
 * round trip. The mutator knows the spec's field names and values at the edges of their
 * ranges, so most mutants reach validation rather than stopping at the JSON syntax.
 * QUANTD_FUZZ_ITERS overrides the count. */
#include "test_util.h"

#include <stdlib.h>

#include "fuzz/fuzz_mutate.h"
#include "fuzz/job_fuzz_one.h"
#include "quant/job/job.h"

static const char *const TOKENS[] = {
    "\"version\":", "\"id\":", "\"model\":", "\"output\":", "\"method\":", "\"bits\":", "\"group_size\":",
    "\"sym\":", "\"desc_act\":", "\"static_groups\":", "\"true_sequential\":", "\"damp_percent\":",
    "\"format\":", "\"calibration\":", "\"eval\":", "\"modules_to_not_convert\":", "\"shard_size\":",
    "\"overwrite\":", "\"priority\":", "\"backend\":", "\"tp\":", "\"layout\":", "\"kernel_check\":",
    "\"path\":", "\"field\":", "\"samples\":", "\"seq_len\":", "\"seed\":", "\"style\":", "\"max_windows\":",
    "\"gptq\"", "\"awq\"", "\"rtn\"", "\"awq+gptq\"", "\"gptq_v2\"", "\"awq_gemm\"", "\"compressed-tensors\"", "\"serve\":", "\"engine\":", "\"gpu\":", "\"vllm\"",
    "\"hopper\"", "\"ampere\"", "\"auto\"", "\"cpu\"",
    "\"cuda\"", "\"plain\"", "\"tp_aware\"", "\"4GB\"", "\"0.5KiB\"", "\"1e3MB\"", "\" 7 tb \"", "\"x\"", "\"\"",
    "\"-a\"", "\".a\"", "\"a/b\"", "2", "3", "4", "8", "5", "0", "-1", "-2", "1", "1.5", "0.999999", "1e-300",
    "1e300", "-0", "1024", "1025", "1000000", "1000001", "1048576", "1048577", "2147483647", "2147483648",
    "-2147483649", "9007199254740991", "9007199254740992", "18446744073709551616", "true", "false", "null",
    "{}", "[]", "[\"lm_head\"]", "[\"\"]", "{\"path\":\"c.jsonl\"}", "\\u0000", "\\ud800", "\\u00e9", "\xc3\xa9",
    "\xff", ",", ":", "{", "}", "[", "]", "\"",
    "\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"",
};
#define N_TOKENS (sizeof TOKENS / sizeof TOKENS[0])

static void test_job_fuzz(void)
{
    fz_seeds seeds = {0};
    int n = fz_seeds_load_corpus(&seeds, "job");
    CHECK(n >= 5);
    if (n < 1) return;
    /* Every seed goes through the harness as is; the canonical form of each accepted one
     * becomes a seed too (a spec with every field spelled out). */
    int n_acc = 0;
    for (int i = 0; i < n; i++) {
        int acc = 0;
        CHECK_OK(job_fuzz_one(seeds.s[i].data, seeds.s[i].len, &acc));
        n_acc += acc;
        qp_job *j = NULL;
        if (acc && !qp_job_parse((const char *)seeds.s[i].data, seeds.s[i].len, &j, NULL)) {
            char *s = qp_job_to_json(j, QP_JOB_JSON_NO_ID);
            if (s) fz_seeds_add_str(&seeds, s);
            free(s);
            qp_job_free(j);
        }
    }
    CHECK(n_acc >= 4);
    fz_stats st = fz_run("job", &seeds, job_fuzz_one, 100000, 20250115, TOKENS, N_TOKENS, 8192, 4);
    CHECK_INT(st.broken, 0);
    /* The mutations must reach both outcomes, or the run tests little. */
    CHECK(st.accepted > st.iters / 50);
    CHECK(st.refused > st.iters / 4);
    fz_seeds_free(&seeds);
}

int main(void)
{
    TEST_RUN(test_job_fuzz);
    return test_finish();
}
