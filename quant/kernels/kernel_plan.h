/* Launch plan of the CUDA dequantizing matmul, as plain host C: which kernel (GEMV or
 * tensor-core GEMM), grid and block sizes, the K split of the GEMV, the template row count
 * of each GEMV launch, and the scratch the launch needs. quant/kernels/cuda/kcuda_matmul.cu
 * launches exactly what this says, and tests/unit/test_kernel_plan.c checks it on any
 * machine, GPU or not (shapes, limits, workspace sizes, error paths). */
#ifndef QUANT_KERNELS_KERNEL_PLAN_H
#define QUANT_KERNELS_KERNEL_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "quant/core/error.h"
#include "quant/kernels/kernels.h"

/* GEMV: 128 threads, each owning 4 adjacent gptq columns (one awq word = 8 channels), a
 * block covering KPLAN_GV_KC K-rows; the K split is summed by a second kernel in order. */
#define KPLAN_GV_THREADS 128
#define KPLAN_GV_KC 256               /* K-rows per GEMV block (a multiple of 32) */
#define KPLAN_REDUCE_THREADS 256
/* Float-grid GEMV (QD_KMAT_FLOAT): a warp per output row, its lanes streaming the row's
 * codes in 16-byte chunks; 4 warps a block; no K split, no workspace. It needs K % 32 == 0
 * (whole aligned chunks, FP8 and FP4 alike) and a group size of -1 or a multiple of 8 (one
 * scale per 8 codes); other float weights take the GEMM, which decodes any shape. */
#define KPLAN_FV_THREADS 128
#define KPLAN_FV_ROWS (KPLAN_FV_THREADS / 32)
/* GEMM: 64 x 64 output tiles of 4 warps, K steps of 32. */
#define KPLAN_GM_BM 64
#define KPLAN_GM_BN 64
#define KPLAN_GM_BK 32
#define KPLAN_GM_THREADS 128
/* CUDA's grid limits (y and z; x is 2^31 - 1). */
#define KPLAN_GRID_X_MAX 2147483647LL
#define KPLAN_GRID_Y_MAX 65535LL

typedef struct qd_kplan {
    int gemv;                 /* 1: GEMV, 0: tensor-core GEMM */
    int threads;              /* threads per block of the main kernel */
    unsigned grid_x, grid_y;  /* grid of the main kernel (per launch) */
    /* GEMV only */
    int ksplit;               /* K blocks of KPLAN_GV_KC rows (grid_y); 1 for float */
    int64_t cols_per_block;   /* output columns one block covers */
    int64_t launches;         /* launches of QD_KERNEL_GEMV_MAX_ROWS rows or fewer */
    int64_t reduce_blocks;    /* blocks of the reduction for a full launch of rows (0: none) */
    size_t workspace_bytes;   /* partial sums: ksplit x min(rows, 8) x N floats (0 for float) */
} qd_kplan;

/* Plans y[rows, N] = x . dequant(m)^T (m already validated by the caller or not: the plan
 * validates it). QD_EUNSUPPORTED names the limit a shape exceeds. A float weight the GEMV
 * cannot read (see KPLAN_FV_THREADS) is planned as a GEMM whatever path asks. */
int qd_kplan_make(const qd_kmat *m, int64_t rows, qd_kpath path, qd_kplan *out, qd_err *err);
/* 1 when m is a float weight the float GEMV reads (K % 32 == 0, group size -1 or a
 * multiple of 8). */
int qd_kplan_float_gemv_ok(const qd_kmat *m);
/* Template row count (1, 2, 4 or 8) the GEMV instantiates for a launch of mr rows (1..8). */
int qd_kplan_gemv_mr(int64_t mr);

#endif
