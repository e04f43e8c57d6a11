/* The bit allocation of job.target_bpw: each quantized linear takes one of its candidate
 * quantizations (bits, group size), and the choice minimises the sum of the candidates'
 * errors while the stored bits of every linear together stay within a budget. This is a
 * multiple-choice knapsack; it is solved by dynamic programming over the budget cut into
 * at most `units` equal steps, each candidate's size rounded up to whole steps (so the
 * result always fits the budget). Where every size is a whole number of bits and the budget
 * is at most `units` times their greatest common divisor, the steps are that divisor and the
 * answer is the exact optimum (tests/unit/test_bpw_alloc.c holds it to an exhaustive
 * search); otherwise it is the optimum of the rounded-up sizes, which can lose at most one
 * step per linear (and where the rounding leaves no fit, every linear's smallest candidate). */
#ifndef QUANT_ALGO_BPW_ALLOC_H
#define QUANT_ALGO_BPW_ALLOC_H

#include <stdint.h>

#include "quant/core/error.h"

/* One linear's candidates (borrowed arrays of n_cand entries). A candidate whose error is
 * not finite or is negative is not allowed for that linear. */
typedef struct qd_bpw_item {
    int n_cand;
    const double *size_bits;     /* the linear's stored bits with candidate c (codes, scales, zeros) */
    const double *err;           /* its error with candidate c (smaller is better) */
} qd_bpw_item;

/* The default number of budget steps: 2^17 (a step of 0.00076% of the budget). */
#define QD_BPW_UNITS_DEFAULT 131072

/* Chooses choice[i] (a candidate index) for each of the n items so that the sum of the
 * chosen size_bits is at most budget_bits and the sum of the chosen errors is least (see
 * the top of this file for the rounding). units: the budget's steps (at most 2^24; the
 * table needs n * (units + 1) bytes). QD_EINVAL when even the smallest allowed candidates
 * exceed the budget, or an item has none allowed (err says which and by how much);
 * QD_ENOMEM. *err_sum / *size_sum (may be NULL) get the chosen totals. */
int qd_bpw_allocate(const qd_bpw_item *items, int n, double budget_bits, int units, int *choice,
                    double *err_sum, double *size_sum, qd_err *err);

#endif
