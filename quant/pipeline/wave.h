/* How a wave of independent input groups (a MoE block's experts' gate/up, then their down)
 * is cut into capture passes under a Hessian budget: the fewest passes the budget allows,
 * of even sizes. Even, not greedy: eight 784 MiB down Hessians under 4 GiB go four and four,
 * not five and three, so a pass's parts and its quantize step's fan-out split evenly over
 * workers, and no pass holds more Hessians than it must. Pure arithmetic; no allocation. */
#ifndef QUANT_PIPELINE_WAVE_H
#define QUANT_PIPELINE_WAVE_H

#include <stdint.h>

/* How many groups the next pass takes. bytes[0..n): the Hessian bytes of the wave's groups
 * still to capture, in capture order (n >= 1). The passes are counted by filling each, in
 * order, as far as the budget goes (a group over the budget goes alone); this pass then
 * takes ceil(n / passes) groups, fewer where the budget stops it first. Called again on
 * what is left, the passes' sizes differ by at most one for groups of one size. Returns a
 * count in [1, n]. */
int qd_wave_take(const uint64_t *bytes, int n, uint64_t budget);

/* The largest pass over n groups of `each` Hessian bytes (qd_wave_take's first): for the
 * estimate. 0 when n is 0. */
uint64_t qd_wave_most(uint64_t n, uint64_t each, uint64_t budget);

#endif
