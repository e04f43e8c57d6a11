/* GPTQ for one linear layer (see gptq.h): prepares H and W on the host (dead columns,
 * static groups, act-order permutation, damping), factorises on the backend with damping
 * retries, runs the block loop through the backend's gptq_block and gemm ops, and undoes
 * the permutation into a qd_qlayer. Where the backend has chol_ldl_upper (the CPU) the
 * loop runs in the LDL form (quant/backend/gptq_block.h): one Cholesky instead of Cholesky
 * plus triangular inverse, and two levels of lazy updates. */
#include "quant/algo/gptq.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "quant/backend/gptq_block.h"
#include "quant/core/clock.h"
#include "quant/core/finite.h"
#include "quant/core/log.h"
#include "quant/core/parallel.h"

qd_gptq_opts qd_gptq_opts_default(void)
{
    qd_gptq_opts o = {.quant = qd_quant_cfg_default(), .damp_percent = 0.01, .desc_act = 0,
                      .static_groups = 0, .block_size = 128, .max_damp_retries = 3};
    return o;
}

int qd_gptq_opts_validate(const qd_gptq_opts *o, qd_err *err)
{
    if (!o) return qd_err_set(err, QD_EINVAL, "gptq: options missing");
    int rc = qd_quant_cfg_validate(&o->quant, err);
    if (rc) return rc;
    if (o->quant.clip_ratio != 1.0f)
        return qd_err_set(err, QD_EINVAL, "gptq: clip_ratio %g is not supported (must be 1)",
                          (double)o->quant.clip_ratio);
    if (!(o->damp_percent > 0.0 && o->damp_percent < 1.0))
        return qd_err_set(err, QD_EINVAL, "damp_percent: %g is not in (0, 1)", o->damp_percent);
    if (o->block_size < 1 || o->block_size > 4096)
        return qd_err_set(err, QD_EINVAL, "gptq: block_size %lld is not in 1..4096", (long long)o->block_size);
    if (o->max_damp_retries < 0 || o->max_damp_retries > 10)
        return qd_err_set(err, QD_EINVAL, "gptq: max_damp_retries %d is not in 0..10", o->max_damp_retries);
    return 0;
}

void qd_gptq_result_free(qd_gptq_result *r)
{
    if (!r) return;
    qd_qlayer_free(&r->layer);
    if (r->deq_be) qd_backend_free(r->deq_be, r->deq);
    else free(r->deq);
    memset(r, 0, sizeof *r);
}

typedef struct diag_key { float d; int64_t i; } diag_key;

static int diag_key_cmp(const void *pa, const void *pb)
{
    const diag_key *a = pa, *b = pb;
    if (a->d > b->d) return -1;
    if (a->d < b->d) return 1;
    return a->i < b->i ? -1 : a->i > b->i;    /* equal values keep their order: stable */
}

void qd_gptq_act_order_perm(const float *diag, int64_t k, int64_t *perm)
{
    diag_key *keys = malloc((size_t)k * sizeof *keys);
    if (!keys) {            /* cannot sort: keep the identity (still a valid order) */
        for (int64_t i = 0; i < k; i++) perm[i] = i;
        return;
    }
    for (int64_t i = 0; i < k; i++) keys[i] = (diag_key){diag[i], i};
    qsort(keys, (size_t)k, sizeof *keys, diag_key_cmp);
    for (int64_t i = 0; i < k; i++) perm[i] = keys[i].i;
    free(keys);
}

/* Round-to-nearest for the whole layer, used when no damping makes H^-1 factorisable. */
static int gptq_fallback_rtn(const qd_quant_cfg *c, const float *w, int64_t n, int64_t k,
                             qd_gptq_result *out, qd_err *err)
{
    int64_t G = out->layer.n_groups;
    float *zf = malloc((size_t)(G * n) * sizeof *zf);
    if (!zf) return qd_err_set(err, QD_ENOMEM, "gptq: out of memory for the RTN fallback");
    int rc = qd_rtn_quantize(c, w, n, k, out->layer.q, out->layer.scales, zf, out->deq, err);
    if (!rc)
        for (int64_t i = 0; i < G * n; i++) out->layer.zeros[i] = (int32_t)lrintf(zf[i]);
    free(zf);
    return rc;
}

/* Backend buffers of one run. */
typedef struct gptq_dev {
    float *h, *w, *err, *scales, *zeros;
    float *acc;                /* LDL form: the corrections to w, [n, k] */
    float *q;                  /* or NULL: where Q goes when w is the caller's (host, not owned) */
    uint8_t *codes;
    int32_t *col_group;
    float *col_weight;         /* or NULL: scale search on dynamic groups, H's diagonal [k] in
                                * processing order (gptq_block.h) */
    double *loss;              /* host backends: [n] GPTQ's column losses per row (malloc) */
} gptq_dev;

static void gptq_dev_free(qd_backend *be, gptq_dev *d)
{
    qd_backend_free(be, d->h);
    qd_backend_free(be, d->w);
    qd_backend_free(be, d->err);
    qd_backend_free(be, d->acc);
    qd_backend_free(be, d->scales);
    qd_backend_free(be, d->zeros);
    qd_backend_free(be, d->codes);
    qd_backend_free(be, d->col_group);
    qd_backend_free(be, d->col_weight);
    free(d->loss);
}

/* QD_ECANCELLED when o->stop says so (checked once per column block). */
static int gptq_stopped(const qd_gptq_opts *o, qd_err *err)
{
    if (!o->stop || !atomic_load_explicit(o->stop, memory_order_relaxed)) return 0;
    return qd_err_set(err, QD_ECANCELLED, "gptq: stopped");
}

/* The column loop on the backend: W (processing order) is in d->w, Hinv in d->h. Leaves Q
 * in d->w and the codes in d->codes. */
static int gptq_run_blocks(qd_backend *be, const qd_gptq_opts *o, gptq_dev *d, int64_t n,
                           int64_t k, int find_params, qd_err *err)
{
    const int64_t B = o->block_size;
    for (int64_t i1 = 0; i1 < k; i1 += B) {
        if (gptq_stopped(o, err)) return QD_ECANCELLED;
        int64_t i2 = i1 + B < k ? i1 + B : k;
        qd_gptq_block_args a = {
            .cfg = &o->quant, .n = n, .k = k, .i1 = i1, .i2 = i2, .w = d->w, .ldw = k,
            .hinv = d->h, .ldh = k, .err = d->err, .lde = B, .codes = d->codes, .ldc = k,
            .scales = d->scales, .zeros = d->zeros, .col_group = d->col_group,
            .find_params = find_params, .loss = d->loss, .col_weight = d->col_weight,
        };
        int rc = be->ops->gptq_block(be, &a);
        if (rc) return qd_err_set(err, rc, "gptq: block [%lld, %lld): %s", (long long)i1, (long long)i2, be->err.msg);
        if (i2 < k) {
            /* W[:, i2:] -= Err1 @ Hinv[i1:i2, i2:] */
            rc = be->ops->gemm(be, 0, 0, n, k - i2, i2 - i1, -1.0f, d->err, B, d->h + i1 * k + i2, k,
                               1.0f, d->w + i2, k);
            if (rc) return qd_err_set(err, rc, "gptq: trailing update after block [%lld, %lld): %s",
                                      (long long)i1, (long long)i2, be->err.msg);
        }
    }
    return 0;
}

/* Blocks per super-block in the LDL form: inside a super-block the next blocks get their
 * corrections from each block's errors (small GEMMs), and the columns past it get them
 * once per super-block, so the big trailing GEMM has an inner dimension of
 * GPTQ_SUPER_BLOCKS * block_size. Measured on a 2-core Zen 4 with OpenBLAS 0.3.21: 4
 * (512-deep) was no faster than 1 (the 128-deep GEMMs already run at 80-95% of SGEMM and
 * the narrow in-super-block GEMMs cost what the deeper ones save), so 1: one level. */
#define GPTQ_SUPER_BLOCKS 1

/* Columns of one super-block (the error buffer's width): no wider than the layer. */
static int64_t gptq_super_cols(int64_t block_size, int64_t k)
{
    return block_size * GPTQ_SUPER_BLOCKS < k ? block_size * GPTQ_SUPER_BLOCKS : k;
}

/* The column loop in the LDL form (see gptq_block.h): W (processing order, original
 * values) in d->w, A in d->h, corrections in d->acc, d->err holds [n, S] errors of one
 * super-block. Leaves Q in d->w and the codes in d->codes. */
static int gptq_run_blocks_ldl(qd_backend *be, const qd_gptq_opts *o, gptq_dev *d, int64_t n,
                               int64_t k, int find_params, qd_err *err)
{
    const int64_t B = o->block_size, S = gptq_super_cols(B, k);
    for (int64_t s1 = 0; s1 < k; s1 += S) {
        int64_t s2 = s1 + S < k ? s1 + S : k;
        for (int64_t i1 = s1; i1 < s2; i1 += B) {
            if (gptq_stopped(o, err)) return QD_ECANCELLED;
            int64_t i2 = i1 + B < s2 ? i1 + B : s2;
            qd_gptq_block_args a = {
                .cfg = &o->quant, .n = n, .k = k, .i1 = i1, .i2 = i2, .w = d->w, .ldw = k,
                .hinv = d->h, .ldh = k, .err = d->err + (i1 - s1), .lde = S, .codes = d->codes,
                .ldc = k, .scales = d->scales, .zeros = d->zeros, .col_group = d->col_group,
                .find_params = find_params, .ldl = 1, .acc = i1 == 0 ? NULL : d->acc, .lda = k,
                .q = d->q, .ldq = k, .loss = d->loss, .col_weight = d->col_weight,
            };
            int rc = be->ops->gptq_block(be, &a);
            if (rc) return qd_err_set(err, rc, "gptq: block [%lld, %lld): %s", (long long)i1, (long long)i2, be->err.msg);
            if (i2 < s2) {
                /* acc[:, i2:s2] += Err1 @ A[i1:i2, i2:s2]; the first writes start from zero */
                rc = be->ops->gemm(be, 0, 0, n, s2 - i2, i2 - i1, 1.0f, d->err + (i1 - s1), S,
                                   d->h + i1 * k + i2, k, i1 == 0 ? 0.0f : 1.0f, d->acc + i2, k);
                if (rc) return qd_err_set(err, rc, "gptq: update inside columns [%lld, %lld): %s",
                                          (long long)s1, (long long)s2, be->err.msg);
            }
        }
        if (s2 < k) {
            /* acc[:, s2:] += Err[:, s1:s2] @ A[s1:s2, s2:] */
            int rc = be->ops->gemm(be, 0, 0, n, k - s2, s2 - s1, 1.0f, d->err, S, d->h + s1 * k + s2, k,
                                   s1 == 0 ? 0.0f : 1.0f, d->acc + s2, k);
            if (rc) return qd_err_set(err, rc, "gptq: trailing update after columns [%lld, %lld): %s",
                                      (long long)s1, (long long)s2, be->err.msg);
        }
    }
    return 0;
}

/* One run of qd_gptq_quantize_h: its settings and every buffer it owns, host and backend.
 * The steps below fill it in order; gptq_run_free releases what they left. */
typedef struct gptq_run {
    qd_backend *be;
    const qd_gptq_opts *o;
    const float *w, *h;          /* the caller's weights [n, k] and Hessian [k, k] (or its diagonal) */
    int64_t hs;                  /* H's diagonal entry i is h[i * hs]: k + 1, or 1 when h is the
                                    diagonal alone (a run given its factor) */
    int64_t n, k, gs, G;         /* shape, group length, groups */
    int grouped, static_groups, find_params;
    /* On the CPU backend host memory is backend memory: without act-order the working W
     * becomes Q in place inside out->deq and the codes land in out->layer.q directly, and
     * H is built straight into the factorisation buffer, so nothing is copied twice. */
    int host, ldl, in_place;
    int direct;                  /* the block op reads the caller's w (see gptq_prepare) */
    int fac_shared;              /* d.h belongs to a qd_gptq_shared, not to this run */
    size_t wbytes, hbytes;
    float *wp;                   /* W in processing order */
    float *hp;                   /* H in processing order (non-CPU) */
    uint8_t *codes;
    float *hdiag, *scales, *zeros;
    float *hw;                   /* scale search (else NULL): H's own diagonal [k], original
                                  * order, 0 for a dead column: each column's weight in its
                                  * group's error (its input energy) */
    int64_t *perm;
    int32_t *col_group;
    gptq_dev d;
    double t0, t_chol_start, t_chol, t_loop, t_loop_end;
} gptq_run;

/* The arguments: shape, options, and every weight and Hessian entry finite. */
static int gptq_check(qd_backend *be, const qd_gptq_opts *o, const float *w, int64_t n, int64_t k,
                      const float *h, int64_t hs, int check_h, qd_err *err)
{
    if (!be || !w || !h) return qd_err_set(err, QD_EINVAL, "gptq: NULL backend, weights or Hessian");
    int rc = qd_gptq_opts_validate(o, err);
    if (rc) return rc;
    if (n <= 0 || k <= 0)
        return qd_err_set(err, QD_EINVAL, "gptq: weight shape [%lld, %lld] must be positive", (long long)n, (long long)k);
    int64_t i = qd_f32_first_nonfinite(w, n * k);
    if (i >= 0)
        return qd_err_set(err, QD_ENUMERIC, "gptq: weight [%lld][%lld] is %g (not finite)",
                          (long long)(i / k), (long long)(i % k), (double)w[i]);
    if (check_h && hs == 1 && (i = qd_f32_first_nonfinite(h, k)) >= 0)
        return qd_err_set(err, QD_ENUMERIC, "gptq: Hessian entry [%lld][%lld] is %g (not finite)", (long long)i,
                          (long long)i, (double)h[i]);
    if (check_h && hs != 1 && (i = qd_f32_first_nonfinite(h, k * k)) >= 0)
        return qd_err_set(err, QD_ENUMERIC, "gptq: Hessian entry [%lld][%lld] is %g (not finite)",
                          (long long)(i / k), (long long)(i % k), (double)h[i]);
    return 0;
}

/* The run's settings, the result's layer and the host buffers. */
static int gptq_setup(gptq_run *g, qd_backend *be, const qd_gptq_opts *o, const float *w, int64_t n, int64_t k,
                      const float *h, int64_t hs, qd_gptq_result *out, qd_err *err)
{
    const qd_quant_cfg *c = &o->quant;
    g->be = be;
    g->o = o;
    g->w = w;
    g->h = h;
    g->hs = hs;
    g->n = n;
    g->k = k;
    g->gs = qd_quant_group_len(c, k);
    g->grouped = c->group_size > 0;
    /* Rows that share a scale (FP8 blocks, one scale per tensor) take it from the original
     * weights before the first column, as static groups do: a scale found later from one
     * row's updated weights could not be the block's. */
    g->static_groups = g->grouped && (o->static_groups || (c->row_block != 1 && c->row_block != 0));
    g->find_params = g->grouped && !g->static_groups;
    int rc = qd_qlayer_alloc(&out->layer, n, k, c->bits, c->sym, c->group_size, 0, err);
    if (rc) return rc;
    qd_qlayer_set_grid(&out->layer, c);
    g->G = out->layer.n_groups;
    g->t0 = qd_clock_now_s();
    g->host = be->device < 0;
    /* The LDL form where the backend has it (one Cholesky, no inverse); the runtime
     * options' QD_GPTQ_FORM_INVERSE (QUANTD_GPTQ_FORM=inverse) keeps the U form (tests
     * compare the two). */
    g->ldl = be->ops->chol_ldl_upper != NULL && be->rt.gptq_form != QD_GPTQ_FORM_INVERSE;
    g->in_place = g->host && !o->desc_act;
    g->wbytes = (size_t)(n * k) * sizeof(float);
    g->hbytes = (size_t)(k * k) * sizeof(float);
    g->hdiag = malloc((size_t)k * sizeof *g->hdiag);
    g->perm = malloc((size_t)k * sizeof *g->perm);
    g->col_group = malloc((size_t)k * sizeof *g->col_group);
    g->scales = calloc((size_t)(g->G * n), sizeof *g->scales);
    g->zeros = calloc((size_t)(g->G * n), sizeof *g->zeros);
    /* On the CPU deq comes from the backend's cached blocks: the working W of the next
     * layer of the same shape then starts on pages already faulted in. */
    out->deq = g->host ? qd_backend_alloc(be, g->wbytes) : malloc(g->wbytes);
    out->deq_be = g->host && out->deq ? be : NULL;
    g->wp = g->in_place ? out->deq : g->host ? qd_backend_alloc(be, g->wbytes) : malloc(g->wbytes);
    if (!g->wp || !g->hdiag || !g->perm || !g->col_group || !g->scales || !g->zeros || !out->deq)
        return qd_err_set(err, QD_ENOMEM, "gptq: out of memory for a [%lld, %lld] layer", (long long)n, (long long)k);
    if (c->scale_search == QD_SCALE_SEARCH_MSE) {
        if (!(g->hw = malloc((size_t)k * sizeof *g->hw)))
            return qd_err_set(err, QD_ENOMEM, "gptq: out of memory");
        for (int64_t i = 0; i < k; i++) g->hw[i] = h[i * hs];
    }
    return 0;
}

/* hdiag (H's diagonal, a dead column's 0 set to 1; dead[] gets those columns, *n_dead their
 * count) and the processing order perm (act order: by that diagonal). Only H decides them,
 * so the factorisation a shared factor holds is the one a run of any weight computes. */
static void gptq_diag_order(gptq_run *g, int64_t *dead, int64_t *n_dead)
{
    const int64_t k = g->k;
    for (int64_t i = 0; i < k; i++) {
        g->hdiag[i] = g->h[i * g->hs];
        if (g->hdiag[i] == 0.0f) {
            g->hdiag[i] = 1.0f;
            dead[(*n_dead)++] = i;
        }
    }
    if (g->o->desc_act) qd_gptq_act_order_perm(g->hdiag, k, g->perm);
    else for (int64_t i = 0; i < k; i++) g->perm[i] = i;
}

/* Static groups' parameters of rows [lo, hi): each row with its dead columns zeroed, as
 * the reference finds them on the unpermuted weights. */
typedef struct static_params_ctx {
    gptq_run *g;
    const int64_t *dead;
    int64_t n_dead;
    int oom;                     /* set by a share that could not get its row buffer */
} static_params_ctx;

static void static_params_rows(void *ctx, int t, int64_t lo, int64_t hi)
{
    static_params_ctx *sp = ctx;
    gptq_run *g = sp->g;
    const qd_quant_cfg *c = &g->o->quant;
    const int64_t n = g->n, k = g->k, gs = g->gs;
    (void)t;
    float *row = malloc((size_t)k * sizeof *row);
    if (!row) { __atomic_store_n(&sp->oom, 1, __ATOMIC_RELAXED); return; }
    for (int64_t r = lo; r < hi; r++) {
        memcpy(row, g->w + r * k, (size_t)k * sizeof *row);
        for (int64_t i = 0; i < sp->n_dead; i++) row[sp->dead[i]] = 0.0f;
        for (int64_t gi = 0; gi < g->G; gi++) {
            int64_t k0 = gi * gs, len = k - k0 < gs ? k - k0 : gs;
            qd_quant_params_w(c, row + k0, len, 1, g->hw ? g->hw + k0 : NULL, &g->scales[gi * n + r],
                              &g->zeros[gi * n + r]);
        }
    }
    free(row);
}

/* Columns: dead ones (H[i][i] == 0: H[i][i] = 1 and W[:, i] = 0; hdiag keeps the fixed
 * diagonal in the original order), the act-order permutation, W in processing order, static
 * groups' parameters and each column's group. */
static int gptq_prepare(gptq_run *g, qd_gptq_result *out, qd_err *err)
{
    const qd_quant_cfg *c = &g->o->quant;
    const int64_t n = g->n, k = g->k, gs = g->gs;
    /* One group spanning K: the reference finds its parameters on the weights as given,
     * before dead columns are zeroed. */
    if (!g->grouped) {
        for (int64_t r = 0; r < n; r++) qd_quant_params_w(c, g->w + r * k, k, 1, g->hw, &g->scales[r], &g->zeros[r]);
        qd_quant_params_rows(c, g->scales, n, 1);
    }
    int64_t *dead = malloc((size_t)k * sizeof *dead);
    if (!dead) return qd_err_set(err, QD_ENOMEM, "gptq: out of memory");
    gptq_diag_order(g, dead, &out->dead_columns);

    /* The LDL form only reads the original weights, so on the CPU without act-order or dead
     * columns the block op reads the caller's w directly and writes Q into out->deq: no
     * working copy. Otherwise W is copied (permuted) into wp. */
    g->direct = g->in_place && g->ldl && out->dead_columns == 0;
    for (int64_t r = 0; r < n && !g->direct; r++) {
        const float *src = g->w + r * k;
        float *dst = g->wp + r * k;
        if (g->o->desc_act) for (int64_t j = 0; j < k; j++) dst[j] = src[g->perm[j]];
        else memcpy(dst, src, (size_t)k * sizeof(float));
    }
    if (g->static_groups) {
        /* Rows are independent: spread over the backend's threads (the search reads every
         * value once per candidate); each share has its own row buffer. */
        static_params_ctx sp = {.g = g, .dead = dead, .n_dead = out->dead_columns};
        int nt = c->scale_search == QD_SCALE_SEARCH_MSE && g->be->n_threads > 1 ? g->be->n_threads : 1;
        qd_parallel_for(nt, n, 16, static_params_rows, &sp);
        if (sp.oom) { free(dead); return qd_err_set(err, QD_ENOMEM, "gptq: out of memory"); }
        qd_quant_params_rows(c, g->scales, n, g->G);
    }
    if (out->dead_columns) {
        int64_t *pos = malloc((size_t)k * sizeof *pos);      /* original column -> processing position */
        if (!pos) { free(dead); return qd_err_set(err, QD_ENOMEM, "gptq: out of memory"); }
        for (int64_t j = 0; j < k; j++) pos[g->perm[j]] = j;
        for (int64_t r = 0; r < n; r++)
            for (int64_t i = 0; i < out->dead_columns; i++) g->wp[r * k + pos[dead[i]]] = 0.0f;
        free(pos);
    }
    free(dead);
    for (int64_t j = 0; j < k; j++)
        g->col_group[j] = !g->grouped ? 0 : g->static_groups ? (int32_t)(g->perm[j] / gs) : (int32_t)(j / gs);
    return 0;
}

/* H in processing order, damped by damp_percent of its mean diagonal, factorised on the
 * backend (LDL or the inverse's Cholesky); each failed try multiplies the damping by 10, up
 * to max_damp_retries. *factored = 0 when every try failed (the caller falls back to RTN). */
static int gptq_factor(gptq_run *g, qd_gptq_result *out, int *factored, qd_err *err)
{
    qd_backend *be = g->be;
    const qd_gptq_opts *o = g->o;
    const int64_t k = g->k;
    if (g->hs != k + 1) return qd_err_set(err, QD_EINVAL, "gptq: a Hessian's diagonal alone, and no factor of it");
    double mean = 0.0;
    for (int64_t j = 0; j < k; j++) mean += g->hdiag[g->perm[j]];
    mean /= (double)k;
    g->d.h = qd_backend_alloc(be, g->hbytes);
    if (!g->d.h) return qd_err_set(err, QD_ERESOURCE, "gptq: %s", be->err.msg);
    if (!g->host) {
        g->hp = malloc(g->hbytes);
        if (!g->hp) return qd_err_set(err, QD_ENOMEM, "gptq: out of memory for H");
    }
    *factored = 0;
    g->t_chol_start = qd_clock_now_s();
    for (int attempt = 0; attempt <= o->max_damp_retries; attempt++) {
        double pct = o->damp_percent * pow(10.0, attempt);
        float damp = (float)(pct * mean);
        /* The factorisation overwrites its input, so every attempt rebuilds H (permuted,
         * dead diagonal fixed, damped) from the caller's copy. */
        float *dst = g->host ? g->d.h : g->hp;
        for (int64_t i = 0; i < k; i++) {
            const float *src = g->h + g->perm[i] * k;
            float *row = dst + i * k;
            if (o->desc_act) for (int64_t j = 0; j < k; j++) row[j] = src[g->perm[j]];
            else memcpy(row, src, (size_t)k * sizeof(float));
            row[i] = g->hdiag[g->perm[i]] + damp;
        }
        int rc;
        if (!g->host && (rc = qd_backend_upload(be, g->d.h, g->hp, g->hbytes)))
            return qd_err_set(err, rc, "gptq: upload of H failed: %s", be->err.msg);
        out->damp_percent = pct;
        out->damp = damp;
        out->damp_retries = attempt;
        rc = g->ldl ? be->ops->chol_ldl_upper(be, g->d.h, k) : be->ops->chol_inverse_upper(be, g->d.h, k);
        if (rc == 0) { *factored = 1; break; }
        if (rc != QD_ENUMERIC) return qd_err_set(err, rc, "gptq: %s", be->err.msg);
        QD_LOG(QD_LOG_WARN, "gptq damping retry", "n=%lld k=%lld damp_percent=%g reason=\"%s\"",
               (long long)g->n, (long long)k, pct, be->err.msg);
    }
    free(g->hp);
    g->hp = NULL;
    g->t_chol = qd_clock_now_s();
    return 0;
}

/* The column loop's backend buffers, filled: W, codes, the error block, LDL's corrections,
 * the groups' parameters and each column's group. */
static int gptq_upload(gptq_run *g, qd_gptq_result *out, qd_err *err)
{
    qd_backend *be = g->be;
    gptq_dev *d = &g->d;
    const int64_t n = g->n, k = g->k, G = g->G;
    d->w = g->direct ? (float *)g->w : g->host ? g->wp : qd_backend_alloc(be, g->wbytes);   /* direct: only read */
    d->q = g->direct ? g->wp : NULL;
    d->codes = g->in_place ? out->layer.q : qd_backend_alloc(be, (size_t)(n * k));
    const int64_t err_cols = g->ldl ? gptq_super_cols(g->o->block_size, k) : g->o->block_size;
    d->err = qd_backend_alloc(be, (size_t)(n * err_cols) * sizeof(float));
    /* Never read before written: block 0 takes no corrections and the first updates of
     * every column have beta 0. */
    if (g->ldl && k > g->o->block_size) {
        d->acc = qd_backend_alloc(be, g->wbytes);
        if (!d->acc) return qd_err_set(err, QD_ERESOURCE, "gptq: %s", be->err.msg);
    }
    d->scales = qd_backend_alloc(be, (size_t)(G * n) * sizeof(float));
    d->zeros = qd_backend_alloc(be, (size_t)(G * n) * sizeof(float));
    d->col_group = qd_backend_alloc(be, (size_t)k * sizeof(int32_t));
    if (!d->w || !d->err || !d->codes || !d->scales || !d->zeros || !d->col_group)
        return qd_err_set(err, QD_ERESOURCE, "gptq: %s", be->err.msg);
    if (g->host && !(d->loss = calloc((size_t)n, sizeof *d->loss)))
        return qd_err_set(err, QD_ENOMEM, "gptq: out of memory");
    int rc;
    if (g->hw && g->find_params) {
        /* Dynamic groups are runs of processing columns: their weights follow the order. */
        float *cw = malloc((size_t)k * sizeof *cw);
        d->col_weight = qd_backend_alloc(be, (size_t)k * sizeof(float));
        if (!cw || !d->col_weight) {
            free(cw);
            return qd_err_set(err, QD_ERESOURCE, "gptq: out of memory for the column weights");
        }
        for (int64_t j = 0; j < k; j++) cw[j] = g->hw[g->perm[j]];
        rc = qd_backend_upload(be, d->col_weight, cw, (size_t)k * sizeof(float));
        free(cw);
        if (rc) return qd_err_set(err, rc, "gptq: upload failed: %s", be->err.msg);
    }
    if ((!g->host && (rc = qd_backend_upload(be, d->w, g->wp, g->wbytes))) ||
        (rc = qd_backend_upload(be, d->scales, g->scales, (size_t)(G * n) * sizeof(float))) ||
        (rc = qd_backend_upload(be, d->zeros, g->zeros, (size_t)(G * n) * sizeof(float))) ||
        (rc = qd_backend_upload(be, d->col_group, g->col_group, (size_t)k * sizeof(int32_t))))
        return qd_err_set(err, rc, "gptq: upload failed: %s", be->err.msg);
    return 0;
}

/* The results back on the host: Q and the codes in processing order, then unpermuted;
 * g_idx; the groups' scales (finite and positive, so every dequantized weight is finite)
 * and zeros. */
static int gptq_collect(gptq_run *g, qd_gptq_result *out, qd_err *err)
{
    qd_backend *be = g->be;
    const int64_t n = g->n, k = g->k, G = g->G, gs = g->gs;
    int rc;
    if ((!g->host && (rc = qd_backend_download(be, g->wp, g->d.w, g->wbytes))) ||
        (rc = qd_backend_download(be, g->scales, g->d.scales, (size_t)(G * n) * sizeof(float))) ||
        (rc = qd_backend_download(be, g->zeros, g->d.zeros, (size_t)(G * n) * sizeof(float))))
        return qd_err_set(err, rc, "gptq: download failed: %s", be->err.msg);
    if (!g->in_place) {
        g->codes = g->host ? g->d.codes : malloc((size_t)(n * k));
        if (!g->codes) return qd_err_set(err, QD_ENOMEM, "gptq: out of memory");
        if (!g->host && (rc = qd_backend_download(be, g->codes, g->d.codes, (size_t)(n * k))))
            return qd_err_set(err, rc, "gptq: download failed: %s", be->err.msg);
        /* Processing column j is original column perm[j]. */
        for (int64_t r = 0; r < n; r++) {
            const float *src = g->wp + r * k;
            const uint8_t *csrc = g->codes + r * k;
            float *dq = out->deq + r * k;
            uint8_t *cq = out->layer.q + r * k;
            for (int64_t j = 0; j < k; j++) {
                dq[g->perm[j]] = src[j];
                cq[g->perm[j]] = csrc[j];
            }
        }
    }
    for (int64_t j = 0; j < k; j++)
        out->layer.g_idx[g->perm[j]] = !g->grouped ? 0 : g->static_groups ? (int32_t)(g->perm[j] / gs) : (int32_t)(j / gs);
    for (int64_t i = 0; i < G * n; i++) {
        if (!isfinite(g->scales[i]) || !(g->scales[i] > 0.0f))
            return qd_err_set(err, QD_ENUMERIC, "gptq: scale of group %lld, row %lld is %g",
                              (long long)(i / n), (long long)(i % n), (double)g->scales[i]);
        out->layer.scales[i] = g->scales[i];
        out->layer.zeros[i] = (int32_t)lrintf(g->zeros[i]);
    }
    return 0;
}

/* out->h_err from the column losses: their sum is tr(D' Hf D'^T) for the H that was
 * factored (Hf: damped, dead diagonal set to 1) and D' = W' - Q (W': dead columns zeroed).
 * Hf differs from the caller's H only on the diagonal, and a dead column's inputs are all
 * zero, so tr((W - Q) H (W - Q)^T) = sum - sum_i (Hf_ii - H_ii) ||D'[:, i]||^2: an O(n k)
 * correction, in original column order. */
static int gptq_h_err(gptq_run *g, qd_gptq_result *out, qd_err *err)
{
    out->h_err = -1.0;
    if (!g->d.loss) return 0;
    const int64_t n = g->n, k = g->k;
    /* c[i] = Hf_ii - H_ii as gptq_factor built Hf (in float); live[i] = 0 on dead columns */
    double *c = malloc((size_t)(2 * k) * sizeof *c), *live = c ? c + k : NULL;
    if (!c) return qd_err_set(err, QD_ENOMEM, "gptq: out of memory");
    for (int64_t i = 0; i < k; i++) {
        const float hii = g->h[i * g->hs];
        c[i] = (double)(g->hdiag[i] + (float)out->damp) - (double)hii;
        live[i] = hii == 0.0f ? 0.0 : 1.0;
    }
    double sum = 0.0, fix = 0.0;
    for (int64_t r = 0; r < n; r++) {
        const float *wr = g->w + r * k, *qr = out->deq + r * k;
        for (int64_t i = 0; i < k; i++) {
            const double d = live[i] * (double)wr[i] - (double)qr[i];
            fix += c[i] * d * d;
        }
        sum += g->d.loss[r];
    }
    free(c);
    out->h_err = fmax(sum - fix, 0.0);
    return 0;
}

static void gptq_run_free(gptq_run *g, qd_gptq_result *out)
{
    qd_backend *be = g->be;
    /* Buffers that alias host arrays are not the backend's to free. */
    if (g->d.w == g->wp || g->direct) g->d.w = NULL;
    if (g->fac_shared) g->d.h = NULL;
    if (g->in_place && g->d.codes == out->layer.q) g->d.codes = NULL;
    if (g->host && g->codes == g->d.codes) g->codes = NULL;
    if (be) gptq_dev_free(be, &g->d);
    if (g->wp != out->deq) {
        if (g->host) qd_backend_free(be, g->wp);
        else free(g->wp);
    }
    free(g->hp);
    free(g->codes);
    free(g->hdiag);
    free(g->hw);
    free(g->perm);
    free(g->col_group);
    free(g->scales);
    free(g->zeros);
}

void qd_gptq_shared_free(qd_gptq_shared *s)
{
    if (!s) return;
    if (s->fac && s->be) qd_backend_free(s->be, s->fac);
    memset(s, 0, sizeof *s);
}

/* Whether sh holds the factor this run would compute. */
static int gptq_shared_fits(const qd_gptq_shared *sh, const gptq_run *g, const void *key, int64_t n_seen)
{
    const qd_gptq_opts *o = g->o;
    return sh && sh->key && sh->key == key && sh->n_seen == n_seen && sh->k == g->k && sh->be == g->be &&
           sh->ldl == g->ldl && sh->desc_act == o->desc_act && sh->damp_opt == o->damp_percent &&
           sh->max_damp_retries == o->max_damp_retries;
}

/* The factor: sh's when it fits, else computed (and handed to sh when given). */
static int gptq_factor_shared(gptq_run *g, qd_gptq_result *out, const void *key, int64_t n_seen, qd_gptq_shared *sh,
                              int *factored, qd_err *err)
{
    if (gptq_shared_fits(sh, g, key, n_seen)) {
        g->d.h = sh->fac;
        g->fac_shared = 1;
        *factored = sh->factored;
        out->damp_percent = sh->damp_percent;
        out->damp = sh->damp;
        out->damp_retries = sh->damp_retries;
        g->t_chol_start = g->t_chol = qd_clock_now_s();
        return 0;
    }
    int rc = gptq_factor(g, out, factored, err);
    if (rc || !sh) return rc;
    qd_gptq_shared_free(sh);
    *sh = (qd_gptq_shared){.key = key, .k = g->k, .n_seen = n_seen, .desc_act = g->o->desc_act,
                           .max_damp_retries = g->o->max_damp_retries, .damp_opt = g->o->damp_percent,
                           .be = g->be, .fac = g->d.h, .ldl = g->ldl, .factored = *factored,
                           .damp_percent = out->damp_percent, .damp = out->damp, .damp_retries = out->damp_retries};
    g->fac_shared = 1;
    return 0;
}

static int gptq_quantize(qd_backend *be, const qd_gptq_opts *o, const float *w, int64_t n, int64_t k,
                         const float *h, int64_t hs, const void *key, int64_t n_seen, qd_gptq_shared *sh,
                         qd_gptq_result *out, qd_err *err)
{
    if (!out) return qd_err_set(err, QD_EINVAL, "gptq: NULL result");
    memset(out, 0, sizeof *out);
    /* A shared factor was made from this H (the same accumulator, as many rows): it was
     * checked then. */
    int rc = gptq_check(be, o, w, n, k, h, hs, !(sh && key && sh->key == key && sh->n_seen == n_seen), err);
    if (rc) return rc;
    /* NVFP4 without a global scale from the caller: the weight's own (one layer alone). */
    qd_gptq_opts own;
    if (o->quant.scale_rule == QD_SCALE_FP8_GLOBAL && o->quant.global_scale == 0.0f) {
        own = *o;
        own.quant.global_scale = qd_quant_global_scale(qd_quant_amax(w, n * k));
        o = &own;
    }
    gptq_run g;
    memset(&g, 0, sizeof g);
    int factored = 0;
    rc = gptq_setup(&g, be, o, w, n, k, h, hs, out, err);
    if (!rc) rc = gptq_prepare(&g, out, err);
    if (!rc) rc = gptq_factor_shared(&g, out, key, n_seen, sh, &factored, err);
    if (!rc && !factored) {
        QD_LOG(QD_LOG_WARN, "gptq fallback rtn", "n=%lld k=%lld tries=%d", (long long)n, (long long)k,
               o->max_damp_retries + 1);
        out->fallback_rtn = 1;
        out->h_err = -1.0;
        rc = gptq_fallback_rtn(&o->quant, w, n, k, out, err);
        out->seconds = qd_clock_now_s() - g.t0;
    } else if (!rc) {
        rc = gptq_upload(&g, out, err);
        g.t_loop = qd_clock_now_s();
        if (!rc) rc = g.ldl ? gptq_run_blocks_ldl(be, o, &g.d, n, k, g.find_params, err)
                            : gptq_run_blocks(be, o, &g.d, n, k, g.find_params, err);
        if (!rc && (rc = be->ops->sync(be))) rc = qd_err_set(err, rc, "gptq: %s", be->err.msg);
        g.t_loop_end = qd_clock_now_s();
        if (!rc) rc = gptq_collect(&g, out, err);
        if (!rc) rc = gptq_h_err(&g, out, err);
        if (!rc) {
            out->seconds = qd_clock_now_s() - g.t0;
            QD_LOG(QD_LOG_DEBUG, "gptq timing", "n=%lld k=%lld prep_s=%.3f chol_s=%.3f upload_s=%.3f loop_s=%.3f post_s=%.3f",
                   (long long)n, (long long)k, g.t_chol_start - g.t0, g.t_chol - g.t_chol_start, g.t_loop - g.t_chol,
                   g.t_loop_end - g.t_loop, qd_clock_now_s() - g.t_loop_end);
        }
    }
    gptq_run_free(&g, out);
    if (rc) qd_gptq_result_free(out);
    return rc;
}

/* The factor of host H [k, k] for o on be, as gptq_factor_shared makes it for its first
 * linear, into *sh keyed to key. */
static int gptq_shared_make_h(qd_backend *be, const qd_gptq_opts *o, const float *h, int64_t k, const void *key,
                              int64_t n_seen, qd_gptq_shared *sh, qd_err *err)
{
    int rc = qd_gptq_opts_validate(o, err);
    if (rc) return rc;
    int64_t i = qd_f32_first_nonfinite(h, k * k);
    if (i >= 0)
        return qd_err_set(err, QD_ENUMERIC, "gptq: Hessian entry [%lld][%lld] is %g (not finite)",
                          (long long)(i / k), (long long)(i % k), (double)h[i]);
    gptq_run g;
    memset(&g, 0, sizeof g);
    g.be = be;
    g.o = o;
    g.h = h;
    g.hs = k + 1;
    g.k = k;
    g.host = be->device < 0;
    g.ldl = be->ops->chol_ldl_upper != NULL && be->rt.gptq_form != QD_GPTQ_FORM_INVERSE;   /* as gptq_setup */
    g.hbytes = (size_t)(k * k) * sizeof(float);
    g.hdiag = malloc((size_t)k * sizeof *g.hdiag);
    g.perm = malloc((size_t)k * sizeof *g.perm);
    int64_t *dead = malloc((size_t)k * sizeof *dead), n_dead = 0;
    qd_gptq_result out;
    memset(&out, 0, sizeof out);
    int factored = 0;
    if (!g.hdiag || !g.perm || !dead) rc = qd_err_set(err, QD_ENOMEM, "gptq: out of memory");
    if (!rc) {
        gptq_diag_order(&g, dead, &n_dead);
        rc = gptq_factor(&g, &out, &factored, err);
    }
    if (!rc) {
        qd_gptq_shared_free(sh);
        *sh = (qd_gptq_shared){.key = key, .k = k, .n_seen = n_seen, .desc_act = o->desc_act,
                               .max_damp_retries = o->max_damp_retries, .damp_opt = o->damp_percent, .be = be,
                               .fac = g.d.h, .ldl = g.ldl, .factored = factored, .damp_percent = out.damp_percent,
                               .damp = out.damp, .damp_retries = out.damp_retries};
        g.d.h = NULL;
    }
    if (g.d.h) qd_backend_free(be, g.d.h);
    free(g.hp);
    free(g.hdiag);
    free(g.perm);
    free(dead);
    return rc;
}

int qd_gptq_shared_make(qd_backend *be, const qd_gptq_opts *o, const qd_gptq_hessian *acc, qd_gptq_shared *sh,
                        qd_err *err)
{
    if (!be || !acc || !acc->h || acc->n_seen <= 0) return qd_err_set(err, QD_EINVAL, "gptq: no Hessian to factor");
    int64_t k = acc->k;
    if (acc->be->device < 0) return gptq_shared_make_h(be, o, acc->h, k, acc, acc->n_seen, sh, err);
    float *h = malloc((size_t)(k * k) * sizeof *h);
    if (!h) return qd_err_set(err, QD_ENOMEM, "gptq: out of memory for a host copy of H");
    int rc = qd_gptq_hessian_download(acc, h, err);
    if (!rc) rc = gptq_shared_make_h(be, o, h, k, acc, acc->n_seen, sh, err);
    free(h);
    return rc;
}

int qd_gptq_shared_adopt(qd_backend *be, const qd_gptq_hessian *acc, const qd_gptq_shared *rec, const float *fac_host,
                         qd_gptq_shared *sh, qd_err *err)
{
    size_t bytes = (size_t)(rec->k * rec->k) * sizeof(float);
    if (!acc || acc->k != rec->k) return qd_err_set(err, QD_ESHAPE, "gptq: a shared factor of another width");
    float *fac = qd_backend_alloc(be, bytes);
    if (!fac) return qd_err_set(err, QD_ERESOURCE, "gptq: %s", be->err.msg);
    int rc = qd_backend_upload(be, fac, fac_host, bytes);
    if (rc) { qd_backend_free(be, fac); return qd_err_set(err, rc, "gptq: %s", be->err.msg); }
    qd_gptq_shared_free(sh);
    *sh = *rec;
    sh->key = acc;
    sh->n_seen = acc->n_seen;
    sh->be = be;
    sh->fac = fac;
    return 0;
}

int qd_gptq_quantize_h(qd_backend *be, const qd_gptq_opts *o, const float *w, int64_t n, int64_t k,
                       const float *h, qd_gptq_result *out, qd_err *err)
{
    return gptq_quantize(be, o, w, n, k, h, k + 1, h, 0, NULL, out, err);
}

int qd_gptq_quantize(qd_backend *be, const qd_gptq_opts *o, const float *w, int64_t n, int64_t k,
                     const qd_gptq_hessian *acc, qd_gptq_result *out, qd_err *err)
{
    return qd_gptq_quantize_shared(be, o, w, n, k, acc, NULL, out, err);
}

int qd_gptq_quantize_shared(qd_backend *be, const qd_gptq_opts *o, const float *w, int64_t n, int64_t k,
                            const qd_gptq_hessian *acc, qd_gptq_shared *shared, qd_gptq_result *out, qd_err *err)
{
    if (out) memset(out, 0, sizeof *out);
    if (!acc || (!acc->h && !acc->diag)) return qd_err_set(err, QD_EINVAL, "gptq: no Hessian accumulator");
    if (acc->k != k)
        return qd_err_set(err, QD_ESHAPE, "gptq: the Hessian has %lld features but the weight [%lld, %lld] has %lld",
                          (long long)acc->k, (long long)n, (long long)k, (long long)k);
    if (acc->n_seen <= 0) return qd_err_set(err, QD_EINVAL, "gptq: no calibration rows were added to the Hessian");
    if (!be) return qd_err_set(err, QD_EINVAL, "gptq: NULL backend");
    /* H's diagonal alone (host memory): enough with the factor made from H, which must be
     * shared's (gptq_factor refuses to make one from it). */
    if (!acc->h) {
        if (!shared || shared->key != acc || shared->n_seen != acc->n_seen)
            return qd_err_set(err, QD_EINVAL, "gptq: a Hessian's diagonal alone, without the factor made from it");
        return gptq_quantize(be, o, w, n, k, acc->diag, 1, acc, acc->n_seen, shared, out, err);
    }
    /* On the CPU backend the accumulator is host memory already. */
    if (acc->be->device < 0) return gptq_quantize(be, o, w, n, k, acc->h, k + 1, acc, acc->n_seen, shared, out, err);
    float *h = malloc((size_t)(k * k) * sizeof *h);
    if (!h) return qd_err_set(err, QD_ENOMEM, "gptq: out of memory for a host copy of H");
    int rc = qd_gptq_hessian_download(acc, h, err);
    if (!rc) rc = gptq_quantize(be, o, w, n, k, h, k + 1, acc, acc->n_seen, shared, out, err);
    free(h);
    return rc;
}
