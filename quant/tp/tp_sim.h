/* An N-rank tensor-parallel simulation of one quantized MLP in one process, to show that
 * the TP-aware layout (tp_layout.h) computes the same function as the plain act-order
 * layout while skipping a collective.
 *
 * Ranks are threads, each with its own CPU backend (one BLAS thread each) and its own copy of
 * its weight shards; collectives are shared buffers and a barrier, so what each rank
 * receives is counted exactly. Two algorithms of the seed paper (003, Hoque et al.):
 *   Algorithm 2 (naive), on a plain act-order checkpoint: Y1_local = X[:, P1] @ W1[P1]_local
 *     (column shard), ALLGATHER(Y1), Y1[:, P2], CHUNK by rank, Y2_local = Y1_local @
 *     W2[P2]_local (row shard), ALLREDUCE(Y2);
 *   Algorithm 3 (TP-aware), on a checkpoint written with layout tp_aware:
 *     Y1_local = X[:, P1] @ W1[P1, P2]_local, Y2_local = Y1_local @ W2_local, ALLREDUCE(Y2).
 * P1 is the stable argsort of the column layers' g_idx, P2 that of the row-parallel
 * layer's (the ExllamaV2 data-locality reorder, paper Algorithm 1). Weights are
 * dequantized once (format table dequant_ref), so this checks the data flow and the
 * arithmetic, not a kernel's speed (bench/tp_bench.c times packed kernels).
 *
 * The simulation sets OpenBLAS to one thread while it runs and restores the previous count. */
#ifndef QUANT_TP_TP_SIM_H
#define QUANT_TP_TP_SIM_H

#include <stdint.h>

#include "quant/core/error.h"
#include "quant/core/runtime.h"
#include "quant/formats/format.h"

typedef enum qd_tp_act {
    QD_TP_ACT_SILU_GLU = 0,   /* llama: silu(x Wg^T) * (x Wu^T), column layers gate, up */
    QD_TP_ACT_RELU,           /* OPT fc1 */
    QD_TP_ACT_GELU,
} qd_tp_act;

typedef enum qd_tp_algo {
    QD_TP_ALGO_NAIVE = 0,     /* paper Algorithm 2 */
    QD_TP_ALGO_AWARE,         /* paper Algorithm 3 */
} qd_tp_algo;

/* One MLP as a checkpoint stores it, dequantized to F32 (nn.Linear layouts). Everything
 * owned (qd_tp_mlp_free). */
typedef struct qd_tp_mlp {
    int64_t hidden, ff;
    qd_tp_act act;
    int n_col;                /* 2 (gate, up) with SILU_GLU, else 1 */
    float *w_col[2];          /* [ff, hidden] */
    float *b_col[2];          /* [ff] or NULL */
    int32_t *g_idx_col;       /* [hidden] the column layers' g_idx (P1), or NULL (identity) */
    float *w_down;            /* [hidden, ff] */
    float *b_down;            /* [hidden] or NULL */
    int32_t *g_idx_down;      /* [ff] the row-parallel layer's g_idx (P2), or NULL (identity) */
} qd_tp_mlp;

/* What the collectives of one run moved (F32, as simulated). */
typedef struct qd_tp_comm_stats {
    int allgathers, allreduces;
    uint64_t allgather_bytes;   /* summed over ranks: what each rank received from the others */
    uint64_t allreduce_bytes;   /* summed over ranks: the partial sums each rank contributed */
    double seconds;             /* wall time of the ranks' work */
} qd_tp_comm_stats;

/* Builds an MLP from packed layers of format f: cols[0..n_col) (gate, up or fc1) and down.
 * g_idx arrays are copied; biases converted from F16. On failure *out is zeroed. */
int qd_tp_mlp_from_packed(const qd_format *f, const qd_packed *const *cols, int n_col,
                          const qd_packed *down, qd_tp_act act, qd_tp_mlp *out, qd_err *err);
void qd_tp_mlp_free(qd_tp_mlp *m);   /* accepts zeroed structs */

/* Unsharded reference: y [M, hidden] = down(act(x W1^T + b1)) + b2 for x [M, hidden], with
 * plain loops and double accumulation (host memory). */
int qd_tp_mlp_forward_ref(const qd_tp_mlp *m, const float *x, int64_t M, float *y, qd_err *err);

/* Runs algo over tp ranks on x [M, hidden] (host) and writes rank 0's result to y [M,
 * hidden] (host); fails if the ranks' results differ. NAIVE needs ff % tp == 0; AWARE also
 * needs m->g_idx_down to be sorted (a tp_aware checkpoint), otherwise the error says to
 * write the checkpoint with layout tp_aware. stats may be NULL. Each rank opens a one-thread
 * CPU backend with rt (may be NULL: the defaults). */
int qd_tp_sim_run(qd_tp_algo algo, const qd_tp_mlp *m, int tp, const float *x, int64_t M, float *y,
                  qd_tp_comm_stats *stats, const qd_runtime_opts *rt, qd_err *err);

/* Bytes the naive algorithm's all-gather moves per token: every rank receives the other
 * ranks' (tp - 1) / tp * ff activations, tp * that in all = (tp - 1) * ff * elem_bytes
 * (elem_bytes 2 for FP16 serving). The TP-aware algorithm moves none. */
uint64_t qd_tp_allgather_bytes_per_token(int64_t ff, int tp, int elem_bytes);

struct qd_model;

/* Reads block `block`'s MLP pair of a quantized checkpoint opened with qd_model_open
 * (GPTQ formats; llama gate/up/down or OPT fc1/fc2) into *as_stored, and, when with_aware
 * is non-NULL, the same pair after the TP-aware permutation for tp ranks (tp_layout.h,
 * applied in memory; a checkpoint already written tp_aware comes back unchanged, its
 * down g_idx already sorted). Both are owned by the caller (qd_tp_mlp_free). */
int qd_tp_mlp_load(struct qd_model *m, int block, int tp, qd_tp_mlp *as_stored, qd_tp_mlp *with_aware,
                   qd_err *err);

#endif
