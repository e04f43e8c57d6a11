/* Dequantizing matrix kernels: y[M, N] = x[M, K] . dequant(W)^T, read straight from the
 * packed checkpoint tensors (quant/formats/format.h), so no float copy of the weight ever
 * exists. x and y are F32; the weight is decoded as the format's dequant_ref does:
 * W[n][k] = scale[g][n] * (q[k][n] - zero[g][n]) with the format's zero offset, or on the
 * float grids W[n][k] = value(code) * scale.
 *
 * A qd_kmat describes one packed weight in one of four layouts:
 *   QD_KMAT_GPTQ            gptq / gptq_v2 as stored. Without act-order the group of input
 *                           feature k is k / group_size; with act-order (act_order = 1) it
 *                           is read through g_idx for every k (the "naive" layout).
 *   QD_KMAT_GPTQ_REORDERED  the exllama layout: qweight rows sorted by group (a stable sort
 *                           of k by g_idx, built by qd_kmat_reorder) so row i belongs to
 *                           group i / group_size, and perm[i] names the input feature of
 *                           row i; the kernels read x through perm. Same result as the plain
 *                           layout, with contiguous groups.
 *   QD_KMAT_AWQ             awq_gemm (4-bit, interleaved along N, raw zeros).
 *   QD_KMAT_FLOAT           the float grids (formats whose kernel is QD_FMT_KERNEL_FLOAT):
 *                           fcodes [N, K] FP8 E4M3 bytes or [N, K/2] FP4 E2M1 nibble pairs
 *                           (even k low), fscales [R, G] F32 with R = N / row_block rows of
 *                           scales (1 for row_block -1) and G groups along K (1 for -1);
 *                           W[n][k] = value(code) * s, s = fscales[(n / row_block) * G +
 *                           k / group_size], divided by global_scale (in F32, before the
 *                           product) under QD_SCALE_FP8_GLOBAL. Named "fp8" (E4M3, F32
 *                           scales per tensor, channel, group or 128x128 block), "nvfp4"
 *                           (E2M1, FP8 group scales under a global scale) and "mxfp4" (E2M1,
 *                           E8M0 power-of-two group scales). Any N; K even for FP4.
 *
 * Implementations: qd_kernel_matmul_ref (scalar, the reference every other is tested
 * against), qd_kernel_matmul_cpu (AVX2+FMA+F16C when the CPU has it, else portable C; a
 * GEMV for M <= 8 and a blocked GEMM above), and on CUDA a GEMV for M <= 8 and a
 * tensor-core (WMMA half) GEMM above (quant/kernels/cuda). qd_kernel_matmul dispatches on
 * the backend. qd_kernel_dequant_cpu decodes a whole weight to F32 with the CPU kernel's
 * tile decoder. */
#ifndef QUANT_KERNELS_KERNELS_H
#define QUANT_KERNELS_KERNELS_H

#include <stdint.h>

#include "quant/backend/backend.h"
#include "quant/core/error.h"
#include "quant/formats/format.h"

typedef enum qd_kmat_layout {
    QD_KMAT_GPTQ = 0,
    QD_KMAT_GPTQ_REORDERED = 1,
    QD_KMAT_AWQ = 2,
    QD_KMAT_FLOAT = 3,
} qd_kmat_layout;

typedef struct qd_kmat {
    qd_kmat_layout layout;
    int bits;                   /* gptq: 2, 3, 4, 8; awq: 4; float: 8 (FP8) or 4 (FP4) */
    int64_t n, k;               /* W is [N, K] (nn.Linear) */
    int64_t group_size;         /* > 0, or -1 for one group */
    int64_t n_groups;
    int zero_offset;            /* added to every stored zero (1 for gptq v1) */
    int act_order;              /* QD_KMAT_GPTQ: groups read through g_idx */
    const int32_t *qweight;     /* gptq [K*b/32, N]; awq [K, N/8] */
    const int32_t *qzeros;      /* gptq [G, N*b/32]; awq [G, N/8] */
    const uint16_t *scales;     /* [G, N] F16 bits */
    const int32_t *g_idx;       /* [K] when act_order, else NULL */
    const int32_t *perm;        /* [K] for QD_KMAT_GPTQ_REORDERED, else NULL */
    /* QD_KMAT_FLOAT only (the integer arrays above are then NULL; group_size and n_groups
     * are the scales' groups along K): */
    qd_grid grid;               /* QD_GRID_FP8_E4M3 or QD_GRID_FP4_E2M1 */
    qd_scale_rule scale_rule;   /* FP8: QD_SCALE_F32; FP4: QD_SCALE_FP8_GLOBAL or QD_SCALE_E8M0 */
    float global_scale;         /* QD_SCALE_FP8_GLOBAL: divides every scale; else unused */
    int64_t row_block;          /* rows sharing a scale row: > 0, or -1 for all */
    int64_t n_scale_rows;       /* R */
    const uint8_t *fcodes;      /* FP8 [N, K]; FP4 [N, K/2] */
    const float *fscales;       /* [R, G] */
    /* Ownership of the arrays: NULL/0 for a view (qd_kmat_from_packed), owns_host for
     * malloc'd arrays (qd_kmat_reorder), owner for backend memory (qd_kmat_upload). */
    int owns_host;
    qd_backend *owner;
} qd_kmat;

/* Which kernel shape to run: AUTO picks GEMV for M <= 8 and GEMM above. */
typedef enum qd_kpath { QD_KPATH_AUTO = 0, QD_KPATH_GEMV = 1, QD_KPATH_GEMM = 2 } qd_kpath;

/* CPU instruction set for qd_kernel_matmul_cpu: AUTO uses AVX2 when the CPU has it. */
typedef enum qd_kcpu_isa { QD_KCPU_AUTO = 0, QD_KCPU_PORTABLE = 1, QD_KCPU_AVX2 = 2 } qd_kcpu_isa;

#define QD_KERNEL_GEMV_MAX_ROWS 8

/* A view of packed tensors (no copy; p must outlive *out). The layout follows fmt->kernel:
 * QD_KMAT_AWQ for awq_gemm, QD_KMAT_FLOAT for the float formats, else QD_KMAT_GPTQ, with
 * act_order set when g_idx is not k / group_size. */
int qd_kmat_from_packed(const qd_format *fmt, const qd_packed *p, qd_kmat *out, qd_err *err);
/* The QD_KMAT_FLOAT view of p's float arrays (grid, scale rule, global scale, row block,
 * fcodes, fscales and their shapes), whatever format packed them: what qd_kmat_from_packed
 * does for a float format, and what tests and the self-test use for layers built by hand. */
int qd_kmat_from_float(const qd_packed *p, qd_kmat *out, qd_err *err);
/* Builds the exllama layout of a QD_KMAT_GPTQ host weight: *out owns new host arrays
 * (qd_kmat_free). Every group must hold exactly group_size features (true of GPTQ's
 * act-order g_idx); a trivial g_idx gives the identity permutation. */
int qd_kmat_reorder(const qd_kmat *src, qd_kmat *out, qd_err *err);
/* Copies a host qd_kmat into backend memory of be; *dev owns it (qd_kmat_free). */
int qd_kmat_upload(qd_backend *be, const qd_kmat *host, qd_kmat *dev, qd_err *err);
void qd_kmat_free(qd_kmat *m);                 /* frees what m owns; accepts NULL and views */
/* Bytes of packed weight data a matmul streams (qweight + qzeros + scales + g_idx/perm;
 * fcodes + fscales). */
int64_t qd_kmat_bytes(const qd_kmat *m);
/* "gptq", "gptq-actorder", "gptq-reordered", "awq", "fp8", "nvfp4", "mxfp4". */
const char *qd_kmat_layout_name(const qd_kmat *m);

/* Scalar reference, host memory: decodes each weight with the format's rules and sums in
 * double. mag (may be NULL) receives sum_k |x[m][k] * W[n][k]| per output, the scale that
 * float rounding errors are measured against. */
int qd_kernel_matmul_ref(const qd_kmat *m, const float *x, int64_t rows, float *y, double *mag,
                         qd_err *err);
/* CPU kernel, host memory, single-threaded. */
int qd_kernel_matmul_cpu(const qd_kmat *m, const float *x, int64_t rows, float *y, qd_kpath path,
                         qd_kcpu_isa isa, qd_err *err);
/* "avx2" or "portable": what QD_KCPU_AUTO runs on this CPU. */
const char *qd_kernel_cpu_isa_name(void);

/* Decodes a packed linear to W [N, K] F32 in host memory w, bit for bit what
 * fmt->dequant_ref writes (and refusing what it refuses; a float format: bit for bit the
 * rule of QD_KMAT_FLOAT above, which its dequant_ref implements), with the CPU kernel's tile
 * decoder: scales and zeros converted once per group and column, whole words decoded at a
 * time, the output rows split over n_threads threads (clamped to 1..64, fewer for small
 * layers; the calling thread takes a share). For loading quantized checkpoints, where the
 * reference's per-value calls dominated (bench/results/eval-speed.md). */
int qd_kernel_dequant_cpu(const qd_format *fmt, const qd_packed *p, float *w, int n_threads,
                          qd_kcpu_isa isa, qd_err *err);

/* Runs the kernel of be's device: m, x and y are backend memory (qd_kmat_upload). */
int qd_kernel_matmul(qd_backend *be, const qd_kmat *m, const float *x, int64_t rows, float *y,
                     qd_kpath path, qd_err *err);

/* Per-layer kernel check for the pipeline: runs the packed layer through be's kernel on
 * x_host [rows, K] (a slice of the calibration inputs) and compares with be's float gemm
 * of the weights it must decode to: w_ref (host [N, K], borrowed: the pipeline passes the
 * quantizer's own Q, so a packing error shows as well as a kernel error, and no pass of
 * the per-value reference decoder runs over the layer), or when w_ref is NULL the format's
 * fmt->dequant_ref of p. *max_rel_err = max |y_kernel - y_float| / max |y_float| over the
 * output (0 when the output is all zero). */
int qd_kernel_check_layer(qd_backend *be, const qd_format *fmt, const qd_packed *p, const float *w_ref,
                          const float *x_host, int64_t rows, double *max_rel_err, qd_err *err);

#endif
