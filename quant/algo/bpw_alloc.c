/* Multiple-choice knapsack for job.target_bpw (bpw_alloc.h): a dynamic programme over the
 * budget in whole steps, best[j] = the least error of the items so far within j steps. */
#include "quant/algo/bpw_alloc.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int cand_ok(const qd_bpw_item *it, int c)
{
    return isfinite(it->err[c]) && it->err[c] >= 0 && isfinite(it->size_bits[c]) && it->size_bits[c] >= 0;
}

int qd_bpw_allocate(const qd_bpw_item *items, int n, double budget_bits, int units, int *choice,
                    double *err_sum, double *size_sum, qd_err *err)
{
    if (n <= 0) return qd_err_set(err, QD_EINVAL, "bit allocation: no linears to allocate");
    if (units < 1 || units > (1 << 24)) return qd_err_set(err, QD_EINVAL, "bit allocation: %d budget steps (1 to 2^24)", units);
    if (!(budget_bits > 0) || !isfinite(budget_bits))
        return qd_err_set(err, QD_EINVAL, "bit allocation: budget %g bits is not positive", budget_bits);
    /* The smallest allowed size of each item: the budget must hold their sum. */
    double min_sum = 0;
    int whole = 1;
    for (int i = 0; i < n; i++) {
        double lo = INFINITY;
        for (int c = 0; c < items[i].n_cand; c++) {
            if (!cand_ok(&items[i], c)) continue;
            if (items[i].size_bits[c] < lo) lo = items[i].size_bits[c];
            if (items[i].size_bits[c] != floor(items[i].size_bits[c])) whole = 0;
        }
        if (!isfinite(lo)) return qd_err_set(err, QD_EINVAL, "bit allocation: linear %d has no allowed candidate", i);
        min_sum += lo;
    }
    if (min_sum > budget_bits)
        return qd_err_set(err, QD_EINVAL, "bit allocation: the smallest candidates need %.6g bits, over the budget of %.6g "
                          "(%.4g%% more)", min_sum, budget_bits, 100.0 * (min_sum / budget_bits - 1.0));
    /* Whole-bit sizes: steps of their greatest common divisor where the budget holds at most
     * `units` of them (then nothing is rounded and the answer is exact), else budget / units. */
    double unit = budget_bits / units;
    if (whole) {
        uint64_t gcd = 0;
        for (int i = 0; i < n; i++)
            for (int c = 0; c < items[i].n_cand; c++) {
                if (!cand_ok(&items[i], c)) continue;
                uint64_t a = (uint64_t)items[i].size_bits[c], b = gcd;
                while (b) { uint64_t t = a % b; a = b; b = t; }
                gcd = a;
            }
        if (gcd > 0 && budget_bits / (double)gcd <= units) unit = (double)gcd;
    }
    int64_t cap = (int64_t)floor(budget_bits / unit + 1e-9);
    size_t W = (size_t)cap + 1;
    double *best = malloc(W * sizeof *best), *next = malloc(W * sizeof *next);
    unsigned char *pick = malloc((size_t)n * W);
    int64_t *steps = NULL;
    int cmax = 0;
    for (int i = 0; i < n; i++) if (items[i].n_cand > cmax) cmax = items[i].n_cand;
    if (cmax > 255) { free(best); free(next); free(pick); return qd_err_set(err, QD_EINVAL, "bit allocation: %d candidates (at most 255)", cmax); }
    steps = malloc((size_t)cmax * sizeof *steps);
    if (!best || !next || !pick || !steps) {
        free(best); free(next); free(pick); free(steps);
        return qd_err_set(err, QD_ENOMEM, "bit allocation: out of memory for %d linears x %lld steps", n, (long long)W);
    }
    for (size_t j = 0; j < W; j++) best[j] = 0.0;
    for (int i = 0; i < n; i++) {
        const qd_bpw_item *it = &items[i];
        for (int c = 0; c < it->n_cand; c++)
            steps[c] = cand_ok(it, c) ? (int64_t)ceil(it->size_bits[c] / unit - 1e-9) : -1;
        unsigned char *row = pick + (size_t)i * W;
        for (size_t j = 0; j < W; j++) {
            double b = INFINITY;
            int bc = 255;
            for (int c = 0; c < it->n_cand; c++) {
                if (steps[c] < 0 || steps[c] > (int64_t)j) continue;
                double v = best[j - (size_t)steps[c]] + it->err[c];
                /* Ties go to the smaller candidate, then the earlier one. */
                if (v < b || (v == b && bc != 255 && it->size_bits[c] < it->size_bits[bc])) { b = v; bc = c; }
            }
            next[j] = b;
            row[j] = (unsigned char)bc;
        }
        double *t = best; best = next; next = t;
    }
    int rc = 0;
    if (!isfinite(best[cap])) {
        /* The rounded-up sizes no longer fit (the budget is within n steps of the minimum):
         * every item's smallest allowed candidate fits, the least error among equals. */
        double es = 0, ss = 0;
        for (int i = 0; i < n; i++) {
            int bc = -1;
            for (int c = 0; c < items[i].n_cand; c++) {
                if (!cand_ok(&items[i], c)) continue;
                if (bc < 0 || items[i].size_bits[c] < items[i].size_bits[bc] ||
                    (items[i].size_bits[c] == items[i].size_bits[bc] && items[i].err[c] < items[i].err[bc]))
                    bc = c;
            }
            choice[i] = bc;
            es += items[i].err[bc];
            ss += items[i].size_bits[bc];
        }
        if (err_sum) *err_sum = es;
        if (size_sum) *size_sum = ss;
    } else {
        double es = 0, ss = 0;
        size_t j = (size_t)cap;
        for (int i = n - 1; i >= 0; i--) {
            int c = pick[(size_t)i * W + j];
            choice[i] = c;
            es += items[i].err[c];
            ss += items[i].size_bits[c];
            j -= (size_t)ceil(items[i].size_bits[c] / unit - 1e-9);
        }
        if (err_sum) *err_sum = es;
        if (size_sum) *size_sum = ss;
    }
    free(best); free(next); free(pick); free(steps);
    return rc;
}
