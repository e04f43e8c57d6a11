/* A wave's capture passes under the Hessian budget (wave.h). */
#include "quant/pipeline/wave.h"

/* Groups from bytes[0] that fit one pass filled in order: at least one. */
static int wave_fill(const uint64_t *bytes, int n, uint64_t budget)
{
    uint64_t sum = bytes[0];
    int take = 1;
    while (take < n && sum <= budget && bytes[take] <= budget - sum) sum += bytes[take++];
    return take;
}

/* The fewest passes over bytes[0..n): filling each in order is optimal for runs kept in
 * order. */
static int wave_passes(const uint64_t *bytes, int n, uint64_t budget)
{
    int passes = 0;
    for (int i = 0; i < n; passes++) i += wave_fill(bytes + i, n - i, budget);
    return passes;
}

int qd_wave_take(const uint64_t *bytes, int n, uint64_t budget)
{
    if (n <= 1) return 1;
    int passes = wave_passes(bytes, n, budget);
    int fit = wave_fill(bytes, n, budget);
    int take = (n + passes - 1) / passes;
    if (take > fit) take = fit;
    /* Groups of several sizes: an even pass could leave a rest that needs one pass more;
     * take more then (fit itself leaves passes - 1). */
    while (take < fit && wave_passes(bytes + take, n - take, budget) > passes - 1) take++;
    return take;
}

uint64_t qd_wave_most(uint64_t n, uint64_t each, uint64_t budget)
{
    if (n == 0) return 0;
    uint64_t per = each > 0 && budget / each > 0 ? budget / each : 1;
    if (per > n) per = n;
    uint64_t passes = (n + per - 1) / per;
    return (n + passes - 1) / passes;
}
