/* The scheme table (scheme.h). Each row was read from compressed-tensors 0.20's own
 * presets (quantization.preset_name_to_scheme), so a llm-compressor recipe's name means
 * the same thing here; ../shared/ref/compressed-tensors.md lists the tensors each writes. */
#include "quant/formats/scheme.h"

#include <string.h>

#include "quant/formats/serving.h"

/* The order is part of the job spec's in-memory value (qp_job.scheme is an index + 1):
 * append new schemes at the end. */
static const qd_scheme table[] = {
    {"W4A16", "compressed-tensors", QD_GRID_INT, QD_SCALE_F16, 4, 128, 1, 1, QD_ACT_NONE,
     "int4 weights, groups of 128, symmetric; activations in the model dtype",
     "Hopper/Ampere: Machete or Marlin; Blackwell: Marlin"},
    {"W4A16_ASYM", "compressed-tensors", QD_GRID_INT, QD_SCALE_F16, 4, 128, 1, 0, QD_ACT_NONE,
     "int4 weights, groups of 128, with zero points", "Hopper/Ampere/Blackwell: Marlin"},
    {"W8A16", "compressed-tensors", QD_GRID_INT, QD_SCALE_F16, 8, 128, 1, 1, QD_ACT_NONE,
     "int8 weights, groups of 128, symmetric", "Hopper/Ampere: Machete or Marlin"},
    {"W4AFP8", "compressed-tensors", QD_GRID_INT, QD_SCALE_F16, 4, 128, 1, 1, QD_ACT_FP8_TOKEN,
     "int4 weights, groups of 128, symmetric; FP8 activations, dynamic per token",
     "Hopper: CutlassW4A8"},
    {"FP8", "float-quantized", QD_GRID_FP8_E4M3, QD_SCALE_F32, 8, -1, -1, 1, QD_ACT_FP8_TENSOR,
     "FP8 E4M3 weights, one scale per tensor; FP8 activations, static per tensor (calibrated)",
     "Hopper/Blackwell: CUTLASS FP8"},
    {"FP8_DYNAMIC", "float-quantized", QD_GRID_FP8_E4M3, QD_SCALE_F32, 8, -1, 1, 1, QD_ACT_FP8_TOKEN,
     "FP8 E4M3 weights, one scale per output channel; FP8 activations, dynamic per token",
     "Hopper/Blackwell: CUTLASS FP8"},
    {"FP8_BLOCK", "float-quantized", QD_GRID_FP8_E4M3, QD_SCALE_F32, 8, 128, 128, 1, QD_ACT_FP8_GROUP128,
     "FP8 E4M3 weights, 128x128 blocks; FP8 activations, dynamic in groups of 128",
     "Hopper/Blackwell: CUTLASS block FP8 or DeepGEMM"},
    {"NVFP4A16", "nvfp4-pack-quantized", QD_GRID_FP4_E2M1, QD_SCALE_FP8_GLOBAL, 4, 16, 1, 1, QD_ACT_NONE,
     "FP4 E2M1 weights, groups of 16 with FP8 scales and a global scale; activations in the model dtype",
     "Blackwell: FP4 weight-only (Marlin NVFP4 on Hopper)"},
    {"NVFP4", "nvfp4-pack-quantized", QD_GRID_FP4_E2M1, QD_SCALE_FP8_GLOBAL, 4, 16, 1, 1, QD_ACT_NVFP4,
     "NVFP4 weights as NVFP4A16; FP4 activations, groups of 16, calibrated global scale",
     "Blackwell: CUTLASS / FlashInfer NVFP4"},
    {"MXFP4A16", "mxfp4-pack-quantized", QD_GRID_FP4_E2M1, QD_SCALE_E8M0, 4, 32, 1, 1, QD_ACT_NONE,
     "FP4 E2M1 weights, groups of 32 with power-of-two (E8M0) scales; activations in the model dtype",
     "Blackwell: MXFP4 weight-only"},
    {"MXFP4", "mxfp4-pack-quantized", QD_GRID_FP4_E2M1, QD_SCALE_E8M0, 4, 32, 1, 1, QD_ACT_MXFP4,
     "MXFP4 weights as MXFP4A16; FP4 activations, dynamic in groups of 32", "Blackwell: MXFP4"},
};

size_t qd_scheme_count(void) { return sizeof table / sizeof table[0]; }
const qd_scheme *qd_scheme_at(size_t i) { return i < qd_scheme_count() ? &table[i] : NULL; }

const qd_scheme *qd_scheme_find(const char *name)
{
    if (!name) return NULL;
    for (size_t i = 0; i < qd_scheme_count(); i++)
        if (!strcmp(table[i].name, name)) return &table[i];
    return NULL;
}

int qd_scheme_index(const qd_scheme *s)
{
    return s >= table && s < table + qd_scheme_count() ? (int)(s - table) : -1;
}

int qd_scheme_srv_act(const qd_scheme *s)
{
    if (!s) return QD_SRV_ACT_AS_WRITTEN;
    switch (s->act) {
    case QD_ACT_NONE: return QD_SRV_ACT_NONE;
    case QD_ACT_NVFP4: case QD_ACT_MXFP4: return QD_SRV_ACT_FP4;
    default: return QD_SRV_ACT_FP8;
    }
}

int qd_scheme_act_static(const qd_scheme *s)
{
    return s && (s->act == QD_ACT_FP8_TENSOR || s->act == QD_ACT_NVFP4);
}
