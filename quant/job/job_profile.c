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
