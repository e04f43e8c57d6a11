/* The tensor-parallel-aware layout of an act-order GPTQ MLP (seed 003, "TP-aware
 * dequantization"; ../shared/ref/formats.md section 6), applied to packed tensors.
 *
 * An MLP pair is the column-parallel layers (llama gate_proj and up_proj, OPT fc1) feeding
 * the row-parallel one (down_proj, fc2). With desc_act the row-parallel layer's g_idx is a
 * scattered act-order map, so a rank's K shard needs every group's scales and zeros and the
 * serving side must all-gather the column layers' outputs and permute them. The fix is
 * offline: P = the stable argsort of down's g_idx; down's K rows are permuted by P (its
 * groups become contiguous and its g_idx becomes k / group_size), and the column layers'
 * output columns are permuted by the same P. y = down(act(x W1^T)) is unchanged because
 * act() is elementwise: permuting W1's outputs and W2's inputs together cancels.
 *
 * All functions work on qd_packed GPTQ tensors (qweight [K*b/32, N] packed along K, qzeros
 * [G, N*b/32] packed along N, scales [G, N], g_idx [K], bias [N]) in place and never touch
 * the zero-point encoding (v1 and v2 fields move as opaque codes). Permutations are arrays
 * of int64 indices: new position i takes old index perm[i]. */
#ifndef QUANT_TP_TP_LAYOUT_H
#define QUANT_TP_TP_LAYOUT_H

#include <stdint.h>

#include "quant/core/error.h"
#include "quant/formats/format.h"

/* perm (caller-allocated, [k]) = the stable argsort of g_idx [k] (ties keep ascending k,
 * as torch.argsort(stable=True) and exllamav2's q_perm). Negative entries are an error. */
int qd_tp_perm_from_g_idx(const int32_t *g_idx, int64_t k, int64_t *perm, qd_err *err);

/* Checks that a row-parallel K (= the column layers' N) of `ff` splits over tp ranks into
 * shards of whole groups and whole packed words: ff % tp == 0, (ff / tp) % group_size == 0
 * (group_size > 0) and (ff / tp) a multiple of the packing width (32 / bits values, 32 for
 * 3 bits). `what` names the layer in the error. */
int qd_tp_layout_check_shard(int64_t ff, int tp, int bits, int64_t group_size, const char *what,
                             qd_err *err);

/* Permutes the K rows of a row-parallel layer in place: new row i = old row perm[i]
 * (qweight unpacked along K, permuted, repacked); g_idx becomes i / group_size. Fails,
 * leaving p unchanged, when the permuted g_idx is not exactly i / group_size (the groups are
 * not each group_size contiguous members after sorting, e.g. perm is not from this g_idx). */
int qd_tp_permute_rows(qd_packed *p, const int64_t *perm, qd_err *err);

/* Permutes the N output columns of a column-parallel layer in place: qweight columns,
 * qzeros fields (unpacked along N, permuted, repacked), scales columns and bias. g_idx
 * (over K) is untouched. */
int qd_tp_permute_cols(qd_packed *p, const int64_t *perm, qd_err *err);

/* The same for a linear kept in float: w [n, k] (nn.Linear layout) rows and bias [n] (may
 * be NULL) are permuted in place. */
int qd_tp_permute_rows_f32(float *w, int64_t n, int64_t k, float *bias, const int64_t *perm,
                           qd_err *err);

/* One whole MLP pair: checks shapes (down->k == every column layer's n, sharding rules for
 * tp), computes P from down's g_idx, permutes down's rows and the column layers' columns.
 * cols may hold NULL entries (column layers kept in float: the caller permutes those with
 * qd_tp_permute_rows_f32 using perm_out). perm_out ([down->k], may be NULL) receives P.
 * A shape, sharding or group-structure error is found before anything is modified. */
int qd_tp_layout_apply_pair(qd_packed *down, qd_packed *const *cols, int n_cols, int tp,
                            int64_t *perm_out, qd_err *err);

#endif
