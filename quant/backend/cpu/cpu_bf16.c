/* bfloat16-input products (see cpu_bf16.h): the choice between the tile unit and the
 * portable path, and the portable path itself. */
#include "quant/backend/cpu/cpu_bf16.h"

#include <cblas.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "quant/backend/cpu/cpu_amx.h"
#include "quant/backend/cpu/cpu_internal.h"
#include "quant/core/error.h"

#define PORTABLE_ROWS 2048   /* rows of A or X rounded into scratch at a time */

static int amx_state;
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;

static void amx_decide(void) { amx_state = cpu_amx_probe(); }

int cpu_bf16_amx_usable(void)
{
    pthread_once(&amx_once, amx_decide);
    return amx_state;
}

float cpu_bf16_round(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7f800000u) == 0) u &= 0x80000000u;          /* subnormal -> signed zero */
    else u += 0x7fffu + ((u >> 16) & 1u);                    /* nearest, ties to even */
    u &= 0xffff0000u;
    memcpy(&f, &u, sizeof f);
    return f;
}

void cpu_bf16_round_rows(float *dst, const float *src, int64_t rows, int64_t cols, int64_t ld)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) dst[r * cols + c] = cpu_bf16_round(src[r * ld + c]);
}

int cpu_bf16_gemm_nt(int amx, int n_threads, int64_t m, int64_t n, int64_t k, const float *a,
                     int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc)
{
    if (m <= 0 || n <= 0) return 0;
    if (amx) return cpu_amx_gemm_nt(n_threads, m, n, k, a, lda, b, ldb, c, ldc) ? QD_ENOMEM : 0;
    int64_t chunk = m < PORTABLE_ROWS ? m : PORTABLE_ROWS;
    float *br = malloc((size_t)(n * k) * sizeof *br), *ar = malloc((size_t)(chunk * k) * sizeof *ar);
    if (!br || !ar) {
        free(br);
        free(ar);
        return QD_ENOMEM;
    }
    cpu_bf16_round_rows(br, b, n, k, ldb);
    for (int64_t r0 = 0; r0 < m; r0 += chunk) {
        int64_t rows = m - r0 < chunk ? m - r0 : chunk;
        cpu_bf16_round_rows(ar, a + r0 * lda, rows, k, lda);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)rows, (blasint)n, (blasint)k, 1.0f, ar,
                    (blasint)k, br, (blasint)k, 0.0f, c + r0 * ldc, (blasint)ldc);
    }
    free(br);
    free(ar);
    return 0;
}

int cpu_bf16_syrk(int amx, int n_threads, int64_t k, const float *x, int64_t rows, int64_t ldx,
                  float alpha, float beta, float *h)
{
    if (rows <= 0 || k <= 0) return 0;
    if (amx) {
        if (cpu_amx_syrk(n_threads, k, x, rows, ldx, alpha, beta, h)) return QD_ENOMEM;
    } else {
        int64_t chunk = rows < PORTABLE_ROWS ? rows : PORTABLE_ROWS;
        float *xr = malloc((size_t)(chunk * k) * sizeof *xr);
        if (!xr) return QD_ENOMEM;
        for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
            int64_t nr = rows - r0 < chunk ? rows - r0 : chunk;
            cpu_bf16_round_rows(xr, x + r0 * ldx, nr, k, ldx);
            cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, (blasint)k, (blasint)nr, alpha, xr, (blasint)k,
                        r0 == 0 ? beta : 1.0f, h, (blasint)k);
        }
        free(xr);
    }
    cpu_symmetrize_from_upper(h, k);
    return 0;
}
