/* gpt-oss jobs written in compressed-tensors pack-quantized: the experts go out in the
 * per-expert w13_* / w2_* layout vLLM's gpt-oss loader streams (output_experts.c), and what
 * that layout cannot hold is refused here, before any work, by name:
 *   - zero points (sym false): the loader's streamed names have none
 *     (vllm/model_executor/models/gpt_oss.py _GPT_OSS_STREAMED_EXPERT_SUFFIX_TO_SHARD), and
 *     mlp.experts.N.w13_weight_zero_point falls into _load_weights_other's branch for the
 *     fused 3-D ".w13_weight" tensors, which cannot index it;
 *   - FP8 activations (scheme W4AFP8): vLLM then takes CompressedTensorsW4A8Fp8MoEMethod,
 *     whose weights GptOssRoutedExperts.weight_loader loads as float ones (transposed);
 *   - an expert left in float, or a layer's experts in different bits or group sizes
 *     (target_bpw): vLLM gives all of a layer's experts the scheme of expert 0's gate_proj,
 *     up_proj and down_proj (compressed_tensors_moe.py get_moe_method) in one buffer.
 * The other formats keep the per-expert gate_proj/up_proj/down_proj linears, which quantd
 * reads back and vLLM does not load (`quantctl check-serving` says so). */
#include "quant/pipeline/pipeline_internal.h"

#include <stdio.h>
#include <string.h>

#include "quant/formats/scheme.h"

int qd_pipeline_gptoss_vllm_layout(const qd_pipeline *p)
{
    return qd_model_cfg(p->m)->layout == QD_LAYOUT_GPT_OSS && p->fmt && p->fmt->grid == QD_GRID_INT &&
           !strcmp(p->fmt->quant_method, "compressed-tensors");
}

int qd_pipeline_gptoss_check(const qd_pipeline *p, qd_err *err)
{
    if (!qd_pipeline_gptoss_vllm_layout(p)) return 0;
    const qp_job *job = p->job;
    const char *fmt = p->fmt->name;
    if (!job->sym)
        return qd_err_set(err, QD_EUNSUPPORTED, "sym false: gpt-oss's experts in %s have no zero point name vLLM's "
                          "gpt-oss loader reads (mlp.experts.N.w13_weight_packed/_scale, w2_*: vllm/model_executor/"
                          "models/gpt_oss.py); use sym true, or another format", fmt);
    const qd_scheme *s = qp_job_scheme(job);
    if (s && s->act != QD_ACT_NONE)
        return qd_err_set(err, QD_EUNSUPPORTED, "scheme %s: vLLM's gpt-oss loader reads quantized experts only as "
                          "weight-only (W4A16, W8A16: CompressedTensorsWNA16MoEMethod; vllm/model_executor/models/"
                          "gpt_oss.py GptOssRoutedExperts.weight_loader)", s->name);
    if (job->target_bpw != 0)
        return qd_err_set(err, QD_EUNSUPPORTED, "target_bpw: vLLM gives all of a gpt-oss layer's experts one bits and "
                          "group size (vllm/model_executor/layers/quantization/compressed_tensors/"
                          "compressed_tensors_moe/compressed_tensors_moe.py get_moe_method), so %s cannot mix them",
                          fmt);
    for (int b = 0; b < p->n_blocks; b++) {
        for (int li = 0; li < qd_model_n_linears(p->m); li++) {
            const qd_linear_info *L = qd_model_linear(p->m, li);
            qd_linear_plan plan;
            if (L->expert < 0) continue;
            qd_pipeline_plan_linear(p, b, li, &plan);
            if (plan.quantize || plan.absent) continue;
            char prefix[160];
            qd_model_block_prefix(p->m, b, prefix, sizeof prefix);
            return qd_err_set(err, QD_EUNSUPPORTED, "%s%s would stay in float (%s): vLLM's gpt-oss loader reads a "
                              "layer's experts all quantized in one scheme in %s (mlp.experts.N.w13_weight_packed, ...; "
                              "vllm/model_executor/models/gpt_oss.py); quantize every expert, or keep the whole model "
                              "in float", prefix, L->name, plan.why, fmt);
        }
    }
    return 0;
}
