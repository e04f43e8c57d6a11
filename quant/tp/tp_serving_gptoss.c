/* The serving rule for gpt-oss's experts (see tp_serving.h). vLLM 0.32 builds a gpt-oss
 * layer's experts as one FusedMoE (vllm/model_executor/models/gpt_oss.py MLPBlock) and,
 * for every quant_method but mxfp4 and quark, loads them in GptOssModel._load_weights_other:
 * the float 3-D gate_up_proj / down_proj, or per expert its own names
 * mlp.experts.N.w13_weight_packed, w13_weight_scale, w13_bias, w2_* — what quantd writes for
 * compressed-tensors pack-quantized (quant/pipeline/output_experts.c). Per-expert
 * gate_proj/up_proj/down_proj tensors, which quantd writes in the other formats, match none
 * of its names and are skipped. The compressed-tensors scheme of expert 0 picks the MoE
 * method (compressed_tensors_moe/compressed_tensors_moe.py get_moe_method):
 * CompressedTensorsWNA16MoEMethod for weight-only int weights, whose backend
 * (fused_moe/oracle/int_wna16.py select_wna16_moe_backend) is the fused Marlin MoE kernel on
 * NVIDIA GPUs when the shape allows it (quantization/utils/marlin_utils.py
 * check_moe_marlin_supports_config: hidden_size a multiple of 128, group size -1, 32, 64 or
 * 128 dividing the experts' width per rank), else the Triton fused-MoE WNA16 kernel (groups
 * only). gpt-oss's own hidden_size, 2880, is not a multiple of 128: its experts get Triton. */
#include "quant/tp/tp_serving.h"

#include <stdio.h>
#include <string.h>

#include "quant/formats/format.h"

#define GPT_OSS_PY "vllm/model_executor/models/gpt_oss.py"

static void no_load(qd_srv_choice *c, const char *why)
{
    c->kernel = QD_SRV_NO_LOAD;
    c->fast = 0;
    snprintf(c->why, sizeof c->why, "will not load: %.*s", (int)sizeof c->why - 16, why);
}

void qd_tp_serving_gptoss_experts(const qd_model_config *cfg, const qd_serving_quant *q, int n_float, int per_linear,
                                  int tp, qd_srv_choice *c)
{
    memset(c, 0, sizeof *c);
    const qd_format *f = qd_format_find(q->format);
    int ct = f && f->grid == QD_GRID_INT && !strcmp(f->quant_method, "compressed-tensors");
    char why[sizeof c->why];
    if (n_float) {
        no_load(c, "vLLM loads gpt-oss's float experts only as the fused 3-D mlp.experts.gate_up_proj/down_proj; "
                   "per-expert gate_proj/up_proj/down_proj tensors are skipped [" GPT_OSS_PY " (_load_weights_other)]");
        return;
    }
    if (!ct || per_linear) {
        snprintf(why, sizeof why, "vLLM loads gpt-oss's quantized experts only as MXFP4 blocks, Quark, or its own "
                 "mlp.experts.N.w13_*/w2_* names, which quantd writes for compressed-tensors (W4A16, W8A16); %s's "
                 "per-expert gate_proj/up_proj/down_proj tensors%s are skipped [" GPT_OSS_PY " (_load_weights_other)]",
                 q->format, per_linear && ct ? " (a checkpoint written before that layout)" : "");
        no_load(c, why);
        return;
    }
    if (q->act == QD_SRV_ACT_FP8 || q->act == QD_SRV_ACT_FP4) {
        no_load(c, "the experts' FP8/FP4 activations choose a MoE method whose weights gpt-oss's loader copies as float "
                   "ones [" GPT_OSS_PY " (GptOssRoutedExperts.weight_loader)]");
        return;
    }
    if (!q->sym) {
        no_load(c, "zero points: vLLM's gpt-oss loader streams no mlp.experts.N.w13_weight_zero_point "
                   "[" GPT_OSS_PY " (_GPT_OSS_STREAMED_EXPERT_SUFFIX_TO_SHARD)]");
        return;
    }
    if (q->bits != 4 && q->bits != 8) {
        snprintf(why, sizeof why, "%d-bit experts: CompressedTensorsWNA16MoEMethod takes 4 or 8 bits "
                 "[vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors_moe/"
                 "compressed_tensors_moe.py (WNA16_SUPPORTED_BITS)]", q->bits);
        no_load(c, why);
        return;
    }
    int64_t H = cfg->hidden, I = cfg->moe_intermediate, gs = q->group_size;
    if (I % tp) {
        snprintf(why, sizeof why, "intermediate_size %lld is not divisible by tp %d [" GPT_OSS_PY " (MLPBlock)]",
                 (long long)I, tp);
        no_load(c, why);
        return;
    }
    int64_t Ip = I / tp;
    if (gs > 0 && (H % gs || Ip % gs)) {
        snprintf(why, sizeof why, "group size %lld must divide hidden_size %lld and the experts' width per rank %lld "
                 "[vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors_moe/"
                 "compressed_tensors_moe_wna16.py (create_weights)]", (long long)gs, (long long)H, (long long)Ip);
        no_load(c, why);
        return;
    }
    int marlin = H % 128 == 0 && (gs == -1 || gs == 32 || gs == 64 || gs == 128);
    if (marlin) {
        c->kernel = QD_SRV_MARLIN;
        c->fast = 1;
        snprintf(c->why, sizeof c->why, "fused Marlin MoE: CompressedTensorsWNA16MoEMethod with the experts streamed as "
                 "mlp.experts.N.w13_weight_packed/w2_* [" GPT_OSS_PY " (_load_weights_other), vllm/model_executor/"
                 "layers/fused_moe/oracle/int_wna16.py (select_wna16_moe_backend), vllm/model_executor/layers/"
                 "quantization/utils/marlin_utils.py (check_moe_marlin_supports_config)]");
        return;
    }
    if (gs > 0) {
        /* vLLM's fused-MoE Triton kernel (fused_moe/fused_moe.py, the WNA16 path): not a
         * plain fallback, the kernel gpt-oss's own hidden_size (2880, not a multiple of 128)
         * gets. */
        c->kernel = QD_SRV_TRITON_MOE;
        c->fast = 1;
        char miss[96];
        if (H % 128) snprintf(miss, sizeof miss, "hidden_size a multiple of 128, not %lld", (long long)H);
        else snprintf(miss, sizeof miss, "group size -1, 32, 64 or 128, not %lld", (long long)gs);
        snprintf(c->why, sizeof c->why, "Triton fused MoE (WNA16), the experts' kernel where Marlin's MoE kernel refuses: "
                 "it needs %s [vllm/model_executor/layers/quantization/utils/marlin_utils.py "
                 "(check_moe_marlin_supports_config), vllm/model_executor/layers/fused_moe/oracle/int_wna16.py "
                 "(select_wna16_moe_backend)]", miss);
        return;
    }
    no_load(c, "per-channel experts need Marlin's MoE kernel (hidden_size a multiple of 128); the others take groups only "
               "[vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors_moe/"
               "compressed_tensors_moe_wna16.py (__init__)]");
}
