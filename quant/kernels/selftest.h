/* Kernel self-test: every format x bit width x group size x layout the kernels support
 * (the float grids: every case of qd_selftest_float_cases, by hand and per float format),
 * on random packed layers and random inputs (never zeros), each kernel path (GEMV, GEMM)
 * compared with qd_kernel_matmul_ref under a named tolerance, plus the achieved bandwidth
 * of the batch-1 kernel against the device's measured copy bandwidth. A worker runs the
 * quick variant at start and refuses work if it fails; `quantctl selftest` runs it by hand. */
#ifndef QUANT_KERNELS_SELFTEST_H
#define QUANT_KERNELS_SELFTEST_H

#include <stdint.h>
#include <stdio.h>

#include "quant/backend/backend.h"
#include "quant/core/error.h"
#include "quant/formats/format.h"

/* Tolerance of one comparison: |y - ref| <= abs * mag + rel * |ref|, where mag is
 * sum_k |x_k w_k| for that output (the scale of any dot product's rounding error). */
typedef struct qd_selftest_tol {
    const char *name;        /* "f32-accum", "f16-tensor-core" */
    double abs, rel;
} qd_selftest_tol;

typedef struct qd_selftest_report {
    int cases;               /* kernel x layer x batch comparisons run */
    int failures;
    char first_failure[256]; /* "" when none */
    double copy_gbps;        /* measured copy bandwidth (bytes read + written per second / 1e9) */
    double gemv_gbps;        /* best packed-weight GB/s of the batch-1 kernel */
    double gemv_frac;        /* gemv_gbps / copy_gbps */
    char device[96];         /* "cpu (avx2)", "cuda:0 NVIDIA H100 ..." */
} qd_selftest_report;

/* Runs the self-test on be (CPU or CUDA). quick: fewer shapes and batches (a second or two).
 * log (may be NULL) receives one line per case and the first mismatches of a failure.
 * Returns 0 when every case passed, QD_EMISMATCH when one failed (rep says which), or
 * another negative code when the test could not run. */
int qd_selftest_run(qd_backend *be, int quick, FILE *log, qd_selftest_report *rep, qd_err *err);

/* One packed-layer case the kernels read: a format, a bit width it holds, a group size
 * (32, 64, 128 or -1, one group per row) and act-order (a g_idx that is not k / group
 * size; only for formats with g_idx and real groups). */
typedef struct qd_selftest_case {
    const qd_format *fmt;
    int bits;
    int64_t group_size;
    int act_order;
} qd_selftest_case;
#define QD_SELFTEST_MAX_CASES 256

/* Every such case of the integer formats of the table (the float formats have their
 * cases below), in (format, bits, group size, act-order) order,
 * into out; returns how many it wrote (at most cap; QD_SELFTEST_MAX_CASES holds them all).
 * The self-test and the decode tests enumerate their layers with it. */
int qd_selftest_cases(qd_selftest_case *out, int cap);

/* Builds a random packed layer [n, k] for tests: random codes, F16 scales, zeros (>= 1 for
 * gptq v1), and with act_order a random g_idx with equal groups. *out is owned by the
 * caller (qd_packed_free). A float format (kernel QD_FMT_KERNEL_FLOAT) gets the layer of
 * its float case (below) with these bits and group size, or failing that its first case
 * with these bits (NVFP4 has one group size), through qd_selftest_make_float_layer;
 * act_order is ignored there. */
int qd_selftest_make_layer(const qd_format *fmt, int bits, int64_t group_size, int act_order,
                           int64_t n, int64_t k, uint64_t seed, qd_packed *out, qd_err *err);

/* One float-grid layer the kernels read (QD_KMAT_FLOAT): a grid, its scale rule, the
 * groups along K and the rows sharing a scale. fmt is a float format of the table that
 * packs such a layer, or NULL for the layout built by hand (format.h's qd_packed float
 * fields filled directly), which covers the kernels before, and apart from, any format. */
typedef struct qd_selftest_fcase {
    const qd_format *fmt;
    const char *name;          /* "fp8-tensor", "fp8-channel", "fp8-block128", "fp8-g128",
                                  "nvfp4-g16", "mxfp4-g32" */
    qd_grid grid;
    qd_scale_rule scale_rule;
    int64_t group_size;        /* > 0, or -1 */
    int64_t row_block;         /* > 0, or -1 */
} qd_selftest_fcase;
#define QD_SELFTEST_MAX_FCASES 64

/* The float cases: every variant built by hand (fmt NULL), then for each float format of
 * the table, in table order, the variants its pack accepts (tried on a small layer). Returns
 * how many it wrote (at most cap). */
int qd_selftest_float_cases(qd_selftest_fcase *out, int cap);

/* Builds a random float layer [n, k] of case c: codes that are never NaN, positive scales
 * of the rule (F32; E4M3 values under a global scale of 448 * 6 / amax; powers of two for
 * E8M0), equal for rows that share them. By hand when c->fmt is NULL, else packed by
 * c->fmt->pack from a qd_qlayer. *out is owned by the caller (qd_packed_free). */
int qd_selftest_make_float_layer(const qd_selftest_fcase *c, int64_t n, int64_t k, uint64_t seed,
                                 qd_packed *out, qd_err *err);

#endif
