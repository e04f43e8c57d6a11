/* Job profiles: named sets of job fields for a purpose, applied under a job's own fields
 * (`quantctl submit --profile NAME`). See job.h (qp_job_profile). */
#include "quant/job/job.h"

#include <string.h>

static const struct { const char *name, *json, *what; } profiles[] = {
    /* Machete's case on H100/H200 (../shared/ref/compressed-tensors.md section 2): symmetric
     * 4-bit, group 128, compressed-tensors; the serve block makes the pre-flight check it at
     * TP 1 (override "serve" for another degree). Group 32 would fall to Marlin, and
     * asymmetric 8-bit at group 32 has no fast kernel at all. */
    {"vllm-hopper",
     "{\"format\":\"compressed-tensors\",\"bits\":4,\"group_size\":128,\"sym\":true,"
     "\"serve\":{\"engine\":\"vllm\",\"gpu\":\"hopper\",\"tp\":1}}",
     "vLLM on H100/H200: compressed-tensors, symmetric 4-bit, group 128 (Machete)"},
    /* FP8 W8A8 on H100/H200: FP8 weights per channel with dynamic per-token FP8 activations,
     * CUTLASS scaled_mm (serving.c, cutlass_fp8.*). The scheme sets format, bits, group_size
     * and sym, so the profile names none of them (a job's own ones must agree with it); the
     * method is the default, gptq, as in vllm-hopper. FP8_BLOCK would add the 128-block shard
     * rules; FP8_DYNAMIC shards at any tp whose shards are multiples of 16. */
    {"vllm-hopper-fp8",
     "{\"scheme\":\"FP8_DYNAMIC\",\"serve\":{\"engine\":\"vllm\",\"gpu\":\"hopper\",\"tp\":1}}",
     "vLLM on H100/H200: FP8_DYNAMIC, FP8 weights per channel and per-token FP8 activations (CUTLASS FP8)"},
    /* B200: NVFP4 weights (groups of 16, FP8 scales under a global scale) by GPTQ. vLLM serves
     * NVFP4A16 with FP4 Marlin (its FP4 GEMMs need FP4 activations, which NVFP4A16 leaves in
     * 16 bits); the serve block makes the pre-flight check that at TP 1. */
    {"vllm-blackwell",
     "{\"method\":\"gptq\",\"scheme\":\"NVFP4A16\",\"serve\":{\"engine\":\"vllm\",\"gpu\":\"blackwell\",\"tp\":1}}",
     "vLLM on B200: NVFP4A16 by GPTQ, NVFP4 weights in groups of 16 (FP4 Marlin)"},
};

const char *qp_job_profile(const char *name, const char **what)
{
    for (size_t i = 0; name && i < sizeof profiles / sizeof profiles[0]; i++)
        if (!strcmp(profiles[i].name, name)) {
            if (what) *what = profiles[i].what;
            return profiles[i].json;
        }
    return NULL;
}

const char *qp_job_profile_name(size_t i)
{
    return i < sizeof profiles / sizeof profiles[0] ? profiles[i].name : NULL;
}
