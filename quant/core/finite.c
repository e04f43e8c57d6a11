/* Finiteness scans (see finite.h). */
#include "quant/core/finite.h"

#include <math.h>
#include <string.h>

#define FINITE_CHUNK 2048   /* 8 KiB: stays in L1 for the second look */

int64_t qd_f32_first_nonfinite(const float *x, int64_t n)
{
    for (int64_t i0 = 0; i0 < n; i0 += FINITE_CHUNK) {
        const int64_t m = n - i0 < FINITE_CHUNK ? n - i0 : FINITE_CHUNK;
        const float *p = x + i0;
        uint32_t bad = 0;
        for (int64_t i = 0; i < m; i++) {   /* all exponent bits set: NaN or infinity */
            uint32_t u;
            memcpy(&u, &p[i], sizeof u);
            bad |= (uint32_t)((u & 0x7f800000u) == 0x7f800000u);
        }
        if (!bad) continue;
        for (int64_t i = 0; i < m; i++)
            if (!isfinite(p[i])) return i0 + i;
    }
    return -1;
}
