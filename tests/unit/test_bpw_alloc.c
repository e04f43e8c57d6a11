/* job.target_bpw's bit allocation (quant/algo/bpw_alloc.c) against an exhaustive search on
 * 6-linear toys: with whole-bit sizes and a budget of at most `units` bits it must find the
 * exact optimum (same least error, within budget); with steps coarser than a bit its answer
 * must fit the budget and be no worse than the exact optimum at the budget less one step
 * per linear (the most the rounding can cost). Refusals: a budget below the smallest
 * candidates, a linear without an allowed candidate. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quant/algo/bpw_alloc.h"
#include "test_util.h"

#define NL 6
#define NC 4

/* The least error over every combination within budget (INFINITY when none fits). */
static double exhaustive(const qd_bpw_item *it, double budget, int *best_choice)
{
    double best = INFINITY;
    int c[NL] = {0};
    long total = 1;
    for (int i = 0; i < NL; i++) total *= it[i].n_cand;
    for (long code = 0; code < total; code++) {
        long v = code;
        double e = 0, s = 0;
        int ok = 1;
        for (int i = 0; i < NL; i++) {
            c[i] = (int)(v % it[i].n_cand);
            v /= it[i].n_cand;
            if (!isfinite(it[i].err[c[i]]) || it[i].err[c[i]] < 0) ok = 0;
            e += it[i].err[c[i]];
            s += it[i].size_bits[c[i]];
        }
        if (ok && s <= budget && e < best) {
            best = e;
            if (best_choice) memcpy(best_choice, c, sizeof c);
        }
    }
    return best;
}

static void toy(test_rng *r, qd_bpw_item *it, double size[NL][NC], double e[NL][NC], int whole)
{
    /* Each linear: a weight count, candidates (bits, group) as a layer stores them, and an
     * error that falls with the size as RTN's does (about 4x per bit), with noise. */
    static const double bits[NC] = {3, 4, 4, 8};
    static const double group[NC] = {64, 192, 64, 128};
    for (int i = 0; i < NL; i++) {
        double w = whole ? 64 * (1 + (int)(test_rng_uniform(r) * 4)) : 1e5 * (1 + 9 * test_rng_uniform(r));
        double scale = 0.1 + test_rng_uniform(r);
        for (int c = 0; c < NC; c++) {
            size[i][c] = w * (bits[c] + 16.0 / group[c]);
            if (whole) size[i][c] = ceil(size[i][c]);
            e[i][c] = scale * pow(4.0, -bits[c]) * (1 + 0.01 * group[c]) * (0.8 + 0.4 * test_rng_uniform(r));
        }
        it[i].n_cand = NC;
        it[i].size_bits = size[i];
        it[i].err = e[i];
    }
}

int main(void)
{
    test_rng r;
    test_rng_seed(&r, 42);
    qd_err err = {0};
    double size[NL][NC], e[NL][NC];
    qd_bpw_item it[NL];
    int choice[NL], ref[NL];
    int exact_cases = 0, coarse_cases = 0;
    for (int trial = 0; trial < 200; trial++) {
        int whole = trial % 2 == 0;
        toy(&r, it, size, e, whole);
        if (trial % 10 == 3) e[trial % NL][1] = NAN;   /* a candidate that does not fit a linear */
        double lo = 0, hi = 0;
        for (int i = 0; i < NL; i++) {
            double a = INFINITY, b = 0;
            for (int c = 0; c < NC; c++) {
                if (!isfinite(e[i][c])) continue;
                if (size[i][c] < a) a = size[i][c];
                if (size[i][c] > b) b = size[i][c];
            }
            lo += a;
            hi += b;
        }
        double budget = lo + (hi - lo) * (0.05 + 0.9 * test_rng_uniform(&r));
        if (whole) budget = floor(budget);
        double es = -1, ss = -1;
        int units = whole ? 1 << 20 : 4096;
        CHECK_OK(qd_bpw_allocate(it, NL, budget, units, choice, &es, &ss, &err));
        double check_e = 0, check_s = 0;
        for (int i = 0; i < NL; i++) {
            CHECK(choice[i] >= 0 && choice[i] < NC);
            CHECK(isfinite(e[i][choice[i]]));
            check_e += e[i][choice[i]];
            check_s += size[i][choice[i]];
        }
        CHECK_NEAR(es, check_e, 1e-12 * fabs(check_e));
        CHECK_NEAR(ss, check_s, 1e-9 * check_s);
        CHECK(check_s <= budget);
        double best = exhaustive(it, budget, ref);
        if (whole) {
            /* One-bit steps: the exact optimum. */
            CHECK_NEAR(check_e, best, 1e-12 * best);
            exact_cases++;
        } else {
            double step = budget / units;
            double lower = exhaustive(it, budget - NL * step, NULL);
            CHECK(check_e >= best * (1 - 1e-12));
            CHECK(check_e <= lower * (1 + 1e-12));
            coarse_cases++;
        }
    }
    CHECK_INT(exact_cases, 100);
    CHECK_INT(coarse_cases, 100);

    /* Refusals. */
    toy(&r, it, size, e, 1);
    double lo = 0;
    for (int i = 0; i < NL; i++) lo += size[i][0] < size[i][1] ? size[i][0] : size[i][1];
    CHECK_ERR(qd_bpw_allocate(it, NL, lo * 0.5, 4096, choice, NULL, NULL, &err));
    CHECK_CONTAINS(err.msg, "smallest candidates need");
    for (int c = 0; c < NC; c++) e[2][c] = -1;
    CHECK_ERR(qd_bpw_allocate(it, NL, lo * 4, 4096, choice, NULL, NULL, &err));
    CHECK_CONTAINS(err.msg, "linear 2 has no allowed candidate");
    return test_finish();
}
