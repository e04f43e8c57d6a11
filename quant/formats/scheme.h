/* Quantization schemes: the preset names compressed-tensors and llm-compressor use
 * (W4A16, FP8_DYNAMIC, NVFP4A16, ...), each the whole recipe of its weights (grid, bits,
 * group, symmetry, scale rule, rows sharing a scale), the activations it declares for the
 * server, and the output format it implies. A job names one in its `scheme` field; the job
 * spec takes the names from here and refuses a field that contradicts the scheme (bits,
 * group_size, sym, format), and the pipeline sets its quantizer from here. Nothing outside
 * quant/formats names a grid. docs/schemes.md is the user's table. */
#ifndef QUANT_FORMATS_SCHEME_H
#define QUANT_FORMATS_SCHEME_H

#include <stddef.h>
#include <stdint.h>

#include "quant/formats/grid.h"

/* The input activations a scheme declares (the server quantizes them; quantd only writes
 * the declaration, and for the static ones the scale it measured on the calibration data). */
typedef enum qd_act {
    QD_ACT_NONE = 0,           /* weight-only: activations stay in the model's dtype */
    QD_ACT_FP8_TOKEN,          /* FP8, dynamic, one scale per token */
    QD_ACT_FP8_GROUP128,       /* FP8, dynamic, groups of 128 */
    QD_ACT_FP8_TENSOR,         /* FP8, static, one scale per tensor: input_scale = amax / 448 */
    QD_ACT_NVFP4,              /* FP4, groups of 16, static global scale input_global_scale =
                                  448 * 6 / amax, local scales dynamic */
    QD_ACT_MXFP4,              /* FP4, dynamic, groups of 32, E8M0 scales */
} qd_act;

typedef struct qd_scheme {
    const char *name;          /* "W4A16", as compressed-tensors spells the preset */
    const char *format;        /* the output format it implies (a name in the format table) */
    qd_grid grid;
    qd_scale_rule scale_rule;
    int bits;
    int64_t group_size;        /* along K; -1 one group per row */
    int64_t row_block;         /* rows sharing a scale: 1, 128 (FP8 blocks), -1 (per tensor) */
    int sym;
    qd_act act;
    const char *summary;       /* one line for docs and errors */
    const char *serves;        /* where it is fastest, for the docs table */
} qd_scheme;

size_t qd_scheme_count(void);
const qd_scheme *qd_scheme_at(size_t i);        /* NULL past the end */
const qd_scheme *qd_scheme_find(const char *name);   /* exact name; NULL when unknown */
/* Index of s in the table, or -1. */
int qd_scheme_index(const qd_scheme *s);
/* The activations a scheme declares as the serving rules name them (serving.h qd_srv_act):
 * QD_SRV_ACT_NONE, _FP8 or _FP4; 0 (as the format is written) for NULL. */
int qd_scheme_srv_act(const qd_scheme *s);
/* 1 when the activation declaration needs a scale measured on calibration inputs. */
int qd_scheme_act_static(const qd_scheme *s);

#endif
