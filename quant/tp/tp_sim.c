/* The N-rank TP simulation (see tp_sim.h).
 *
 * Everything a rank needs (its backend, weight shards, buffers) is allocated by the calling
 * thread before any rank starts, so a rank can only fail inside a compute op; a failing rank
 * still walks through every barrier, so the others never wait forever. */
#include "quant/tp/tp_sim.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cblas.h>

#include "quant/backend/backend.h"
#include "quant/core/clock.h"
#include "quant/core/dtype.h"
#include "quant/tp/tp_layout.h"

void qd_tp_mlp_free(qd_tp_mlp *m)
{
    if (!m) return;
    for (int j = 0; j < 2; j++) {
        free(m->w_col[j]);
        free(m->b_col[j]);
    }
    free(m->g_idx_col);
    free(m->w_down);
    free(m->b_down);
    free(m->g_idx_down);
    memset(m, 0, sizeof *m);
}

static float *bias_f32(const qd_packed *p)
{
    if (!p->bias) return NULL;
    float *b = malloc((size_t)p->bias_len * sizeof *b);
    if (b)
        for (int64_t i = 0; i < p->bias_len; i++) b[i] = qd_f16_to_f32(p->bias[i]);
    return b;
}

static int32_t *g_idx_copy(const qd_packed *p)
{
    if (!p->g_idx) return NULL;
    int32_t *g = malloc((size_t)p->g_idx_len * sizeof *g);
    if (g) memcpy(g, p->g_idx, (size_t)p->g_idx_len * sizeof *g);
    return g;
}

int qd_tp_mlp_from_packed(const qd_format *f, const qd_packed *const *cols, int n_col, const qd_packed *down,
                          qd_tp_act act, qd_tp_mlp *out, qd_err *err)
{
    memset(out, 0, sizeof *out);
    if (n_col != (act == QD_TP_ACT_SILU_GLU ? 2 : 1))
        return qd_err_set(err, QD_EINVAL, "tp sim: %d column layers given, the activation needs %d", n_col,
                          act == QD_TP_ACT_SILU_GLU ? 2 : 1);
    out->hidden = down->n;
    out->ff = down->k;
    out->act = act;
    out->n_col = n_col;
    int rc = 0;
    for (int j = 0; j < n_col && !rc; j++) {
        if (cols[j]->n != out->ff || cols[j]->k != out->hidden)
            rc = qd_err_set(err, QD_ESHAPE, "tp sim: column layer %d is [%lld, %lld], expected [%lld, %lld]", j,
                            (long long)cols[j]->n, (long long)cols[j]->k, (long long)out->ff, (long long)out->hidden);
        if (!rc && j > 0 && (!cols[j]->g_idx) != (!cols[0]->g_idx))
            rc = qd_err_set(err, QD_EINVAL, "tp sim: column layers disagree on having a g_idx");
        if (!rc && j > 0 && cols[0]->g_idx &&
            memcmp(cols[j]->g_idx, cols[0]->g_idx, (size_t)out->hidden * sizeof(int32_t)))
            rc = qd_err_set(err, QD_EINVAL, "tp sim: gate and up have different g_idx (a fused column layer needs one)");
        if (rc) break;
        out->w_col[j] = malloc((size_t)(out->ff * out->hidden) * sizeof(float));
        if (!out->w_col[j]) { rc = qd_err_set(err, QD_ENOMEM, "tp sim: out of memory"); break; }
        rc = f->dequant_ref(cols[j], out->w_col[j], err);
        if (!rc && cols[j]->bias && !(out->b_col[j] = bias_f32(cols[j]))) rc = qd_err_set(err, QD_ENOMEM, "tp sim: out of memory");
    }
    if (!rc && cols[0]->g_idx && !(out->g_idx_col = g_idx_copy(cols[0]))) rc = qd_err_set(err, QD_ENOMEM, "tp sim: out of memory");
    if (!rc) {
        out->w_down = malloc((size_t)(out->ff * out->hidden) * sizeof(float));
        if (!out->w_down) rc = qd_err_set(err, QD_ENOMEM, "tp sim: out of memory");
    }
    if (!rc) rc = f->dequant_ref(down, out->w_down, err);
    if (!rc && down->bias && !(out->b_down = bias_f32(down))) rc = qd_err_set(err, QD_ENOMEM, "tp sim: out of memory");
    if (!rc && down->g_idx && !(out->g_idx_down = g_idx_copy(down))) rc = qd_err_set(err, QD_ENOMEM, "tp sim: out of memory");
    if (rc) qd_tp_mlp_free(out);
    return rc;
}

static float act_f(qd_tp_act a, float g, float u)
{
    switch (a) {
    case QD_TP_ACT_SILU_GLU: return g / (1.0f + expf(-g)) * u;
    case QD_TP_ACT_RELU: return g > 0 ? g : 0;
    default: return 0.5f * g * (1.0f + erff(g / sqrtf(2.0f)));
    }
}

int qd_tp_mlp_forward_ref(const qd_tp_mlp *m, const float *x, int64_t M, float *y, qd_err *err)
{
    const int64_t H = m->hidden, F = m->ff;
    float *h = malloc((size_t)F * sizeof *h);
    if (!h) return qd_err_set(err, QD_ENOMEM, "tp sim: out of memory");
    for (int64_t r = 0; r < M; r++) {
        const float *xr = x + r * H;
        for (int64_t n = 0; n < F; n++) {
            double a[2] = {0, 0};
            for (int j = 0; j < m->n_col; j++) {
                const float *w = m->w_col[j] + n * H;
                for (int64_t k = 0; k < H; k++) a[j] += (double)xr[k] * w[k];
                if (m->b_col[j]) a[j] += m->b_col[j][n];
            }
            h[n] = act_f(m->act, (float)a[0], (float)a[1]);
        }
        for (int64_t o = 0; o < H; o++) {
            const float *w = m->w_down + o * F;
            double a = m->b_down ? m->b_down[o] : 0;
            for (int64_t k = 0; k < F; k++) a += (double)h[k] * w[k];
            y[r * H + o] = (float)a;
        }
    }
    free(h);
    return 0;
}

uint64_t qd_tp_allgather_bytes_per_token(int64_t ff, int tp, int elem_bytes)
{
    return tp <= 1 ? 0 : (uint64_t)(tp - 1) * (uint64_t)ff * (uint64_t)elem_bytes;
}

/* ---- the ranks ---- */

typedef struct sim_shared sim_shared;

typedef struct sim_rank {
    sim_shared *s;
    int rank;
    qd_backend *be;                 /* owned */
    float *w1[2], *b1[2];           /* [S, H] column shard (K reordered by P1), [S] */
    float *w2;                      /* [H, S] row shard */
    float *xp;                      /* [M, H] X[:, P1] */
    float *y1[2];                   /* [M, S] */
    float *y1c;                     /* [M, S] naive: the chunk after the global permute */
    float *y2;                      /* [M, H] partial, then (after the all-reduce) the sum */
    uint64_t gathered, reduced;
    int rc;
    char msg[sizeof(((qd_err *)0)->msg)];
} sim_rank;

struct sim_shared {
    qd_tp_algo algo;
    const qd_tp_mlp *m;
    int tp;
    int64_t M, S;                   /* rows, shard width ff / tp */
    const float *x;
    const qd_runtime_opts *rt;      /* for each rank's CPU backend (may be NULL) */
    const int64_t *p1, *p2;         /* [H], [F] */
    float *y1g;                     /* [M, F] all-gather buffer */
    float *y2s;                     /* [tp, M, H] all-reduce buffer */
    pthread_barrier_t bar;
    pthread_mutex_t gate_mu;        /* start gate: go 0 wait, 1 run, -1 give up */
    pthread_cond_t gate_cv;
    int go;
    sim_rank *ranks;
};

static void rank_fail(sim_rank *r, int rc)
{
    if (!r->rc) {
        r->rc = rc;
        snprintf(r->msg, sizeof r->msg, "%s", r->be->err.msg);
    }
}

static void *rank_main(void *arg)
{
    sim_rank *r = arg;
    sim_shared *s = r->s;
    const qd_tp_mlp *m = s->m;
    qd_backend *be = r->be;
    const int64_t M = s->M, H = m->hidden, F = m->ff, S = s->S;
    int rc;
    pthread_mutex_lock(&s->gate_mu);
    while (s->go == 0) pthread_cond_wait(&s->gate_cv, &s->gate_mu);
    int go = s->go;
    pthread_mutex_unlock(&s->gate_mu);
    if (go < 0) return NULL;
    /* Line 1 (both): Y1_local = X[:, P1] @ W1_local, then the elementwise activation. */
    for (int64_t i = 0; i < M; i++)
        for (int64_t k = 0; k < H; k++) r->xp[i * H + k] = s->x[i * H + s->p1[k]];
    for (int j = 0; j < m->n_col; j++) {
        if ((rc = be->ops->gemm(be, 0, 1, M, S, H, 1.0f, r->xp, H, r->w1[j], H, 0.0f, r->y1[j], S))) rank_fail(r, rc);
        if (r->b1[j] && (rc = be->ops->add_bias(be, r->y1[j], r->b1[j], M, S))) rank_fail(r, rc);
    }
    if (m->act == QD_TP_ACT_SILU_GLU) rc = be->ops->silu_mul(be, r->y1[0], r->y1[0], r->y1[1], M * S);
    else if (m->act == QD_TP_ACT_RELU) rc = be->ops->relu(be, r->y1[0], M * S);
    else rc = be->ops->gelu(be, r->y1[0], M * S);
    if (rc) rank_fail(r, rc);
    const float *y1_local = r->y1[0];
    if (s->algo == QD_TP_ALGO_NAIVE) {
        /* Line 2: ALLGATHER(Y1_local) into the global [M, F]. */
        for (int64_t i = 0; i < M; i++) memcpy(s->y1g + i * F + r->rank * S, r->y1[0] + i * S, (size_t)S * sizeof(float));
        pthread_barrier_wait(&s->bar);
        r->gathered = (uint64_t)(s->tp - 1) * (uint64_t)(M * S) * sizeof(float);
        /* Lines 3-4: Y1_global[:, P2], then this rank's chunk. */
        for (int64_t i = 0; i < M; i++)
            for (int64_t c = 0; c < S; c++) r->y1c[i * S + c] = s->y1g[i * F + s->p2[r->rank * S + c]];
        y1_local = r->y1c;
    }
    /* GEMM with the row shard of W2, then ALLREDUCE(SUM). */
    if ((rc = be->ops->gemm(be, 0, 1, M, H, S, 1.0f, y1_local, S, r->w2, S, 0.0f, r->y2, H))) rank_fail(r, rc);
    memcpy(s->y2s + (size_t)r->rank * (size_t)(M * H), r->y2, (size_t)(M * H) * sizeof(float));
    r->reduced = (uint64_t)(M * H) * sizeof(float);
    pthread_barrier_wait(&s->bar);
    /* Every rank sums the partials in rank order, so all ranks get bit-identical results. */
    memcpy(r->y2, s->y2s, (size_t)(M * H) * sizeof(float));
    for (int q = 1; q < s->tp; q++) {
        const float *src = s->y2s + (size_t)q * (size_t)(M * H);
        for (int64_t i = 0; i < M * H; i++) r->y2[i] += src[i];
    }
    if (m->b_down && (rc = be->ops->add_bias(be, r->y2, m->b_down, M, H))) rank_fail(r, rc);
    return NULL;
}

static int perm_or_identity(const int32_t *g_idx, int64_t n, int64_t **out, qd_err *err)
{
    *out = malloc((size_t)n * sizeof **out);
    if (!*out) return qd_err_set(err, QD_ENOMEM, "tp sim: out of memory");
    if (!g_idx) {
        for (int64_t i = 0; i < n; i++) (*out)[i] = i;
        return 0;
    }
    return qd_tp_perm_from_g_idx(g_idx, n, *out, err);
}

static void ranks_free(sim_rank *rk, int tp)
{
    for (int q = 0; q < tp; q++) {
        sim_rank *r = &rk[q];
        if (!r->be) continue;
        for (int j = 0; j < 2; j++) {
            qd_backend_free(r->be, r->w1[j]);
            qd_backend_free(r->be, r->b1[j]);
            qd_backend_free(r->be, r->y1[j]);
        }
        qd_backend_free(r->be, r->w2);
        qd_backend_free(r->be, r->xp);
        qd_backend_free(r->be, r->y1c);
        qd_backend_free(r->be, r->y2);
        qd_backend_close(r->be);
    }
    free(rk);
}

/* Gives rank q its shards: W1[P1] rows [q*S, (q+1)*S) and W2[P2] (naive) or W2 (aware)
 * columns [q*S, (q+1)*S). */
static int rank_setup(sim_shared *s, sim_rank *r, int q, qd_err *err)
{
    const qd_tp_mlp *m = s->m;
    const int64_t M = s->M, H = m->hidden, F = m->ff, S = s->S;
    int rc = qd_backend_cpu_open(1, s->rt, &r->be, err);
    if (rc) return rc;
    r->s = s;
    r->rank = q;
    qd_backend *be = r->be;
    size_t fs = sizeof(float);
    for (int j = 0; j < m->n_col; j++) {
        r->w1[j] = qd_backend_alloc(be, (size_t)(S * H) * fs);
        r->y1[j] = qd_backend_alloc(be, (size_t)(M * S) * fs);
        if (m->b_col[j]) r->b1[j] = qd_backend_alloc(be, (size_t)S * fs);
        if (!r->w1[j] || !r->y1[j] || (m->b_col[j] && !r->b1[j])) return qd_err_set(err, QD_ENOMEM, "tp sim: out of memory");
        for (int64_t n = 0; n < S; n++) {
            const float *src = m->w_col[j] + (q * S + n) * H;
            for (int64_t k = 0; k < H; k++) r->w1[j][n * H + k] = src[s->p1[k]];
            if (r->b1[j]) r->b1[j][n] = m->b_col[j][q * S + n];
        }
    }
    r->w2 = qd_backend_alloc(be, (size_t)(H * S) * fs);
    r->xp = qd_backend_alloc(be, (size_t)(M * H) * fs);
    r->y1c = qd_backend_alloc(be, (size_t)(M * S) * fs);
    r->y2 = qd_backend_alloc(be, (size_t)(M * H) * fs);
    if (!r->w2 || !r->xp || !r->y1c || !r->y2) return qd_err_set(err, QD_ENOMEM, "tp sim: out of memory");
    for (int64_t o = 0; o < H; o++)
        for (int64_t c = 0; c < S; c++) {
            int64_t kk = q * S + c;
            r->w2[o * S + c] = m->w_down[o * F + (s->algo == QD_TP_ALGO_NAIVE ? s->p2[kk] : kk)];
        }
    return 0;
}

int qd_tp_sim_run(qd_tp_algo algo, const qd_tp_mlp *m, int tp, const float *x, int64_t M, float *y,
                  qd_tp_comm_stats *stats, const qd_runtime_opts *rt, qd_err *err)
{
    if (stats) memset(stats, 0, sizeof *stats);
    if (tp < 1 || tp > 256) return qd_err_set(err, QD_EINVAL, "tp sim: tp must be in 1..256, got %d", tp);
    if (M < 1) return qd_err_set(err, QD_EINVAL, "tp sim: needs at least one row, got %lld", (long long)M);
    if (m->ff % tp)
        return qd_err_set(err, QD_ESHAPE, "tp sim: intermediate size %lld does not split over tp=%d ranks", (long long)m->ff, tp);
    if (algo == QD_TP_ALGO_AWARE && m->g_idx_down)
        for (int64_t k = 1; k < m->ff; k++)
            if (m->g_idx_down[k] < m->g_idx_down[k - 1])
                return qd_err_set(err, QD_EINVAL,
                                  "tp sim: algorithm 3 (TP-aware) needs the row-parallel layer's g_idx sorted, but "
                                  "g_idx[%lld] = %d follows %d; write the checkpoint with layout tp_aware",
                                  (long long)k, m->g_idx_down[k], m->g_idx_down[k - 1]);
    sim_shared s;
    memset(&s, 0, sizeof s);
    s.algo = algo;
    s.m = m;
    s.tp = tp;
    s.M = M;
    s.S = m->ff / tp;
    s.x = x;
    s.rt = rt;
    pthread_mutex_init(&s.gate_mu, NULL);
    pthread_cond_init(&s.gate_cv, NULL);
    int64_t *p1 = NULL, *p2 = NULL;
    int blas_threads = openblas_get_num_threads();
    int rc = perm_or_identity(m->g_idx_col, m->hidden, &p1, err);
    if (!rc) rc = perm_or_identity(algo == QD_TP_ALGO_NAIVE ? m->g_idx_down : NULL, m->ff, &p2, err);
    s.p1 = p1;
    s.p2 = p2;
    s.y1g = malloc((size_t)(M * m->ff) * sizeof(float));
    s.y2s = malloc((size_t)tp * (size_t)(M * m->hidden) * sizeof(float));
    s.ranks = calloc((size_t)tp, sizeof *s.ranks);
    pthread_t *th = calloc((size_t)tp, sizeof *th);
    if (!rc && (!s.y1g || !s.y2s || !s.ranks || !th)) rc = qd_err_set(err, QD_ENOMEM, "tp sim: out of memory");
    for (int q = 0; q < tp && !rc; q++) rc = rank_setup(&s, &s.ranks[q], q, err);
    int bar_ok = 0, started = 0;
    if (!rc) {
        if (pthread_barrier_init(&s.bar, NULL, (unsigned)tp)) rc = qd_err_set(err, QD_EINVAL, "tp sim: cannot create a barrier");
        else bar_ok = 1;
    }
    double t0 = qd_clock_now_s();
    /* Ranks wait at a start gate, so a rank that cannot be created makes the started ones
     * return at once instead of waiting at a barrier for it. */
    for (int q = 0; q < tp && !rc; q++) {
        if (pthread_create(&th[q], NULL, rank_main, &s.ranks[q])) {
            rc = qd_err_set(err, QD_EINVAL, "tp sim: cannot start rank %d", q);
            break;
        }
        started++;
    }
    pthread_mutex_lock(&s.gate_mu);
    s.go = rc ? -1 : 1;
    pthread_cond_broadcast(&s.gate_cv);
    pthread_mutex_unlock(&s.gate_mu);
    for (int q = 0; q < started; q++) pthread_join(th[q], NULL);
    double t1 = qd_clock_now_s();
    for (int q = 0; q < tp && !rc; q++)
        if (s.ranks[q].rc) rc = qd_err_set(err, s.ranks[q].rc, "tp sim: rank %d: %s", q, s.ranks[q].msg);
    if (!rc) {
        const size_t nb = (size_t)(M * m->hidden) * sizeof(float);
        for (int q = 1; q < tp && !rc; q++)
            if (memcmp(s.ranks[q].y2, s.ranks[0].y2, nb))
                rc = qd_err_set(err, QD_ENUMERIC, "tp sim: rank %d's all-reduced output differs from rank 0's", q);
        if (!rc) memcpy(y, s.ranks[0].y2, nb);
        if (!rc && stats) {
            stats->seconds = t1 - t0;
            for (int q = 0; q < tp; q++) {
                stats->allgather_bytes += s.ranks[q].gathered;
                stats->allreduce_bytes += tp > 1 ? s.ranks[q].reduced : 0;
            }
            stats->allgathers = algo == QD_TP_ALGO_NAIVE ? 1 : 0;
            stats->allreduces = 1;
        }
    }
    if (bar_ok) pthread_barrier_destroy(&s.bar);
    if (s.ranks) ranks_free(s.ranks, tp);
    pthread_mutex_destroy(&s.gate_mu);
    pthread_cond_destroy(&s.gate_cv);
    free(th);
    free(s.y1g);
    free(s.y2s);
    free(p1);
    free(p2);
    openblas_set_num_threads(blas_threads);
    return rc;
}
