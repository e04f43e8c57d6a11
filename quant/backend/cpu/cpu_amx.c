/* The AMX-BF16 side of cpu_bf16.h: packing F32 operands into bfloat16 tiles and the
 * 32 x 32 tile kernel.
 *
 * Tiles (palette 1, each 16 rows x 64 bytes): 0-3 hold a 32 x 32 block of C in F32, 4-5
 * two 16-row slices of A (16 rows x 32 bf16 of k), 6-7 two 16-column slices of B in the
 * pair-interleaved ("VNNI") layout TDPBF16PS reads: row r of a B tile holds, for each of
 * its 16 columns, the two bf16 values at k = 2r and 2r + 1. Each C element is summed over
 * k in steps of 32 in increasing order, by one tile, whatever the thread split.
 *
 * Linux hands the tile state to a process only on request (arch_prctl ARCH_REQ_XCOMP_PERM);
 * each thread loads the tile configuration before its first tile instruction and releases
 * the tiles when done, so a thread not in a product keeps a small saved state. */
#include "quant/backend/cpu/cpu_amx.h"

#include <cpuid.h>
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "quant/core/parallel.h"

#define AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512bf16")))
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

#define TILE_ELEMS 512          /* bf16 per A or B tile: 16 rows x 32 */
#define A_MC 256                /* rows of A converted at a time by one thread */
#define KC_TILES 32             /* k-steps of 32 per pass over a C block (k-blocking) */
#define B_BYTES_L2 ((int64_t)1 << 20)   /* B columns per pass sized to this many bytes */
#define SYRK_TC 2048            /* calibration rows per packing of the Hessian's operands */

int cpu_amx_probe(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    int amx = (d >> 22 & 1) && (d >> 24 & 1);           /* AMX-BF16, AMX-TILE */
    int avx512 = (b >> 16 & 1) && (b >> 30 & 1);        /* AVX512F, AVX512BW */
    unsigned a1, b1, c1, d1;
    if (!amx || !avx512 || !__get_cpuid_count(7, 1, &a1, &b1, &c1, &d1) || !(a1 >> 5 & 1)) return 0;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c >> 27 & 1)) return 0;     /* OSXSAVE */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    unsigned need = (1u << 1) | (1u << 2) | (7u << 5) | (3u << 17);   /* SSE AVX AVX-512 AMX */
    if ((lo & need) != need) return 0;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

typedef struct amx_cfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg;

AMX_TARGET static void amx_begin(void)
{
    amx_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = 16;
        cfg.colsb[t] = 64;
    }
    _tile_loadconfig(&cfg);
}

AMX_TARGET static void amx_end(void) { _tile_release(); }

/* One 32 x 32 block of C: tiles of A at a0 / a1 (rows 0-15 / 16-31; a_stride bytes between
 * a tile's rows, a_step bf16 from one k-step's tile to the next), of B at b0 / b1 (columns
 * 0-15 / 16-31, contiguous tiles of TILE_ELEMS), over nk k-steps. C (ldc floats per row,
 * `rows` x `cols` of it valid, at most 32 each) is added to when accumulate, else set. */
AMX_TARGET static void amx_block(const uint16_t *a0, const uint16_t *a1, int64_t a_stride, int64_t a_step,
                                 const uint16_t *b0, const uint16_t *b1, int64_t nk, float *c, int64_t ldc,
                                 int rows, int cols, int accumulate)
{
    float tmp[32 * 32] __attribute__((aligned(64)));
    int full = rows == 32 && cols == 32;
    float *cp = full ? c : tmp;
    int64_t ld = full ? ldc : 32;
    if (accumulate) {
        if (!full) {
            memset(tmp, 0, sizeof tmp);
            for (int i = 0; i < rows; i++) memcpy(tmp + i * 32, c + i * ldc, (size_t)cols * sizeof(float));
        }
        _tile_loadd(0, cp, ld * 4);
        _tile_loadd(1, cp + 16, ld * 4);
        _tile_loadd(2, cp + 16 * ld, ld * 4);
        _tile_loadd(3, cp + 16 * ld + 16, ld * 4);
    } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    }
    for (int64_t s = 0; s < nk; s++) {
        _tile_loadd(4, a0 + s * a_step, a_stride);
        _tile_loadd(5, a1 + s * a_step, a_stride);
        _tile_loadd(6, b0 + s * TILE_ELEMS, 64);
        _tile_loadd(7, b1 + s * TILE_ELEMS, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, cp, ld * 4);
    _tile_stored(1, cp + 16, ld * 4);
    _tile_stored(2, cp + 16 * ld, ld * 4);
    _tile_stored(3, cp + 16 * ld + 16, ld * 4);
    if (!full)
        for (int i = 0; i < rows; i++) memcpy(c + i * ldc, tmp + i * 32, (size_t)cols * sizeof(float));
}

/* 32 F32 values from p (the first `valid` of them; the rest read as 0) as 32 bf16. */
AMX_TARGET static __m512i amx_cvt32(const float *p, int valid)
{
    __mmask16 m0 = valid >= 16 ? 0xffff : (__mmask16)((1u << (valid > 0 ? valid : 0)) - 1);
    int v1 = valid - 16;
    __mmask16 m1 = v1 >= 16 ? 0xffff : (__mmask16)((1u << (v1 > 0 ? v1 : 0)) - 1);
    __m512 lo = _mm512_maskz_loadu_ps(m0, p), hi = _mm512_maskz_loadu_ps(m1, p + 16);
    return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);   /* lo's 16 values first */
}

/* ---- y = x W^T ------------------------------------------------------------------------ */

typedef struct gemm_ctx {
    int64_t m, n, k, kp, nk, lda, ldb, ldc, npb;   /* npb: 32-column blocks of packed B */
    const float *a, *b;
    float *c;
    uint16_t *bp;      /* [2 * npb][nk] tiles */
    uint16_t *abuf;    /* per share: [A_MC][kp] */
} gemm_ctx;

/* Slice jb (16 rows of B [n, k], a row being a column of C) as nk tiles at bp + jb * nk
 * tiles; rows past n and k past its end read as 0. */
AMX_TARGET static void pack_nk_slice(const float *b, int64_t n, int64_t k, int64_t ldb, int64_t nk, int64_t jb,
                                     uint16_t *bp)
{
    const __m512i rowoff = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                              _mm512_set1_epi32(16));
    for (int64_t s = 0; s < nk; s++) {
        uint32_t *tile = (uint32_t *)(bp + (jb * nk + s) * TILE_ELEMS);
        for (int col = 0; col < 16; col++) {
            int64_t row = jb * 16 + col;
            __m512i v = row < n ? amx_cvt32(b + row * ldb + s * 32, (int)(k - s * 32)) : _mm512_setzero_si512();
            /* dword r of v (the pair k = 2r, 2r + 1) goes to tile row r, column col */
            _mm512_i32scatter_epi32(tile + col, rowoff, v, 4);
        }
    }
}

/* Slice fb (16 columns of X [rows, ncols], the k dimension running down the rows) as nk
 * tiles at bp + fb * nk tiles: tile row r interleaves rows 2r and 2r + 1. */
AMX_TARGET static void pack_kn_slice(const float *x, int64_t rows, int64_t ncols, int64_t ldx, int64_t nk, int64_t fb,
                                     uint16_t *bp)
{
    __m512i il = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                  23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    int64_t f0 = fb * 16;
    int fv = (int)(ncols - f0 < 16 ? (ncols - f0 > 0 ? ncols - f0 : 0) : 16);
    __mmask16 fm = fv >= 16 ? 0xffff : (__mmask16)((1u << fv) - 1);
    for (int64_t st = 0; st < nk; st++) {
        uint16_t *bt = bp + (fb * nk + st) * TILE_ELEMS;
        for (int r = 0; r < 16; r++) {
            int64_t t0 = st * 32 + 2 * r;
            __m512 x0 = t0 < rows ? _mm512_maskz_loadu_ps(fm, x + t0 * ldx + f0) : _mm512_setzero_ps();
            __m512 x1 = t0 + 1 < rows ? _mm512_maskz_loadu_ps(fm, x + (t0 + 1) * ldx + f0) : _mm512_setzero_ps();
            __m512i v = (__m512i)_mm512_cvtne2ps_pbh(x1, x0);
            _mm512_storeu_si512(bt + r * 32, _mm512_permutexvar_epi16(il, v));
        }
    }
}

/* B tiles of 16-row slices [lo, hi) of W. */
AMX_TARGET static void gemm_pack_b(void *ctx, int t, int64_t lo, int64_t hi)
{
    (void)t;
    gemm_ctx *g = ctx;
    for (int64_t jb = lo; jb < hi; jb++) pack_nk_slice(g->b, g->n, g->k, g->ldb, g->nk, jb, g->bp);
}

AMX_TARGET static void gemm_rows(void *ctx, int t, int64_t lo, int64_t hi)
{
    gemm_ctx *g = ctx;
    uint16_t *ab = g->abuf + (int64_t)t * A_MC * g->kp;
    int64_t nc = B_BYTES_L2 / (g->kp < KC_TILES * 32 ? g->kp : KC_TILES * 32) / 2 / 32;  /* 32-col blocks */
    if (nc < 1) nc = 1;
    amx_begin();
    for (int64_t r0 = lo * 32; r0 < hi * 32 && r0 < g->m; r0 += A_MC) {
        int64_t rows = g->m - r0 < A_MC ? g->m - r0 : A_MC;
        if (rows > hi * 32 - r0) rows = hi * 32 - r0;
        int64_t rows32 = (rows + 31) / 32 * 32;
        for (int64_t i = 0; i < rows32; i++)
            for (int64_t s = 0; s < g->nk; s++) {
                __m512i v = i < rows ? amx_cvt32(g->a + (r0 + i) * g->lda + s * 32, (int)(g->k - s * 32))
                                     : _mm512_setzero_si512();
                _mm512_storeu_si512(ab + i * g->kp + s * 32, v);
            }
        for (int64_t s0 = 0; s0 < g->nk; s0 += KC_TILES) {
            int64_t ns = g->nk - s0 < KC_TILES ? g->nk - s0 : KC_TILES;
            for (int64_t j0 = 0; j0 < g->npb; j0 += nc) {
                int64_t j1 = j0 + nc < g->npb ? j0 + nc : g->npb;
                for (int64_t i = 0; i < rows32; i += 32) {
                    int rv = (int)(rows - i < 32 ? rows - i : 32);
                    for (int64_t jp = j0; jp < j1; jp++) {
                        int64_t col = jp * 32;
                        int cv = (int)(g->n - col < 32 ? g->n - col : 32);
                        const uint16_t *b0 = g->bp + ((2 * jp) * g->nk + s0) * TILE_ELEMS;
                        const uint16_t *b1 = g->bp + ((2 * jp + 1) * g->nk + s0) * TILE_ELEMS;
                        const uint16_t *a0 = ab + i * g->kp + s0 * 32;
                        amx_block(a0, a0 + 16 * g->kp, g->kp * 2, 32, b0, b1, ns,
                                  g->c + (r0 + i) * g->ldc + col, g->ldc, rv, cv, s0 > 0);
                    }
                }
            }
        }
    }
    amx_end();
}

int cpu_amx_gemm_nt(int n_threads, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                    const float *b, int64_t ldb, float *c, int64_t ldc)
{
    gemm_ctx g = {.m = m, .n = n, .k = k, .lda = lda, .ldb = ldb, .ldc = ldc, .a = a, .b = b, .c = c};
    g.nk = (k + 31) / 32;
    g.kp = g.nk * 32;
    g.npb = (n + 31) / 32;
    int64_t panels = (m + 31) / 32;
    int shares = qd_parallel_shares(n_threads, panels, 1);
    g.bp = aligned_alloc(64, (size_t)(2 * g.npb * g.nk) * TILE_ELEMS * sizeof(uint16_t));
    g.abuf = aligned_alloc(64, (size_t)shares * A_MC * (size_t)g.kp * sizeof(uint16_t));
    if (!g.bp || !g.abuf) {
        free(g.bp);
        free(g.abuf);
        return -1;
    }
    qd_parallel_for(n_threads, 2 * g.npb, 1, gemm_pack_b, &g);
    qd_parallel_for(n_threads, panels, 1, gemm_rows, &g);
    free(g.bp);
    free(g.abuf);
    return 0;
}

/* ---- H += X^T X ------------------------------------------------------------------------ */

typedef struct syrk_ctx {
    int64_t k, nfb, nk, rows, ldx, nblk;   /* nfb: 16-feature slices (even); nblk: upper 32-blocks */
    const float *x;                       /* this chunk's first row */
    float *h;
    uint16_t *bp, *ap;                    /* [nfb][nk] tiles each */
} syrk_ctx;

/* B tiles (token pairs interleaved) of feature slices [lo, hi), then their A tiles: a
 * slice's A tile is its B tile transposed as 32-bit pairs. */
AMX_TARGET static void syrk_pack(void *ctx, int t, int64_t lo, int64_t hi)
{
    (void)t;
    syrk_ctx *s = ctx;
    const __m512i rowoff = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                              _mm512_set1_epi32(16));
    for (int64_t fb = lo; fb < hi; fb++) {
        pack_kn_slice(s->x, s->rows, s->k, s->ldx, s->nk, fb, s->bp);
        for (int64_t st = 0; st < s->nk; st++) {
            const uint16_t *bt = s->bp + (fb * s->nk + st) * TILE_ELEMS;
            uint32_t *at = (uint32_t *)(s->ap + (fb * s->nk + st) * TILE_ELEMS);
            for (int col = 0; col < 16; col++)
                _mm512_storeu_si512(at + col * 16, _mm512_i32gather_epi32(rowoff, (const uint32_t *)bt + col, 4));
        }
    }
}

AMX_TARGET static void syrk_blocks(void *ctx, int t, int64_t lo, int64_t hi)
{
    (void)t;
    syrk_ctx *s = ctx;
    int64_t nb = s->nfb / 2;
    amx_begin();
    /* block index -> (I, J) with I <= J, row-major over the upper triangle */
    int64_t I = 0, rem = lo;
    while (rem >= nb - I) {
        rem -= nb - I;
        I++;
    }
    int64_t J = I + rem;
    for (int64_t q = lo; q < hi; q++) {
        int rv = (int)(s->k - I * 32 < 32 ? s->k - I * 32 : 32);
        int cv = (int)(s->k - J * 32 < 32 ? s->k - J * 32 : 32);
        const uint16_t *a0 = s->ap + (2 * I * s->nk) * TILE_ELEMS, *a1 = s->ap + ((2 * I + 1) * s->nk) * TILE_ELEMS;
        const uint16_t *b0 = s->bp + (2 * J * s->nk) * TILE_ELEMS, *b1 = s->bp + ((2 * J + 1) * s->nk) * TILE_ELEMS;
        amx_block(a0, a1, 64, TILE_ELEMS, b0, b1, s->nk, s->h + I * 32 * s->k + J * 32, s->k, rv, cv, 1);
        if (++J == nb) J = ++I;
    }
    amx_end();
}

int cpu_amx_syrk(int n_threads, int64_t k, const float *x, int64_t rows, int64_t ldx, float alpha,
                 float beta, float *h)
{
    syrk_ctx s = {.k = k, .ldx = ldx, .h = h};
    s.nfb = (k + 31) / 32 * 2;
    int64_t nk_max = SYRK_TC / 32;
    size_t bytes = (size_t)(s.nfb * nk_max) * TILE_ELEMS * sizeof(uint16_t);
    s.bp = aligned_alloc(64, bytes);
    s.ap = aligned_alloc(64, bytes);
    if (!s.bp || !s.ap) {
        free(s.bp);
        free(s.ap);
        return -1;
    }
    /* The tiles add X^T X onto H' = (beta / alpha) H; then H = alpha H'. */
    float pre = beta / alpha;
    for (int64_t i = 0; i < k * k; i++) h[i] = beta == 0.0f ? 0.0f : pre * h[i];
    int64_t nb = s.nfb / 2;
    s.nblk = nb * (nb + 1) / 2;
    for (int64_t r0 = 0; r0 < rows; r0 += SYRK_TC) {
        s.rows = rows - r0 < SYRK_TC ? rows - r0 : SYRK_TC;
        s.nk = (s.rows + 31) / 32;
        s.x = x + r0 * ldx;
        qd_parallel_for(n_threads, s.nfb, 1, syrk_pack, &s);
        qd_parallel_for(n_threads, s.nblk, 1, syrk_blocks, &s);
    }
    for (int64_t i = 0; i < k * k; i++) h[i] *= alpha;
    free(s.bp);
    free(s.ap);
    return 0;
}

/* ---- one thread's small products (the attention's, split by its caller) --------------- */

int64_t cpu_amx_packed_elems(int64_t n, int64_t k) { return 2 * ((n + 31) / 32) * ((k + 31) / 32) * TILE_ELEMS; }

void cpu_amx_pack_nk(const float *b, int64_t n, int64_t k, int64_t ldb, uint16_t *bp)
{
    int64_t nk = (k + 31) / 32;
    for (int64_t jb = 0; jb < 2 * ((n + 31) / 32); jb++) pack_nk_slice(b, n, k, ldb, nk, jb, bp);
}

void cpu_amx_pack_kn(const float *b, int64_t k, int64_t n, int64_t ldb, uint16_t *bp)
{
    int64_t nk = (k + 31) / 32;
    for (int64_t jb = 0; jb < 2 * ((n + 31) / 32); jb++) pack_kn_slice(b, k, n, ldb, nk, jb, bp);
}

AMX_TARGET void cpu_amx_gemm_packed(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const uint16_t *bp,
                                    int64_t k_packed, float alpha, float *c, int64_t ldc, uint16_t *scratch)
{
    int64_t nk = (k + 31) / 32, kp = nk * 32, nk_b = (k_packed + 31) / 32, npb = (n + 31) / 32;
    amx_begin();
    for (int64_t i0 = 0; i0 < m; i0 += 32) {
        int rows = (int)(m - i0 < 32 ? m - i0 : 32);
        for (int64_t i = 0; i < 32; i++)
            for (int64_t s = 0; s < nk; s++)
                _mm512_storeu_si512(scratch + i * kp + s * 32,
                                    i < rows ? amx_cvt32(a + (i0 + i) * lda + s * 32, (int)(k - s * 32))
                                             : _mm512_setzero_si512());
        for (int64_t jp = 0; jp < npb; jp++) {
            int cols = (int)(n - jp * 32 < 32 ? n - jp * 32 : 32);
            amx_block(scratch, scratch + 16 * kp, kp * 2, 32, bp + (2 * jp * nk_b) * TILE_ELEMS,
                      bp + ((2 * jp + 1) * nk_b) * TILE_ELEMS, nk, c + i0 * ldc + jp * 32, ldc, rows, cols, 0);
        }
        if (alpha != 1.0f)
            for (int64_t i = 0; i < rows; i++)
                for (int64_t j = 0; j < n; j++) c[(i0 + i) * ldc + j] *= alpha;
    }
    amx_end();
}
