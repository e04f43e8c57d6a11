/* The TP-aware permutation on packed GPTQ tensors (see tp_layout.h). */
#include "quant/tp/tp_layout.h"

#include <stdlib.h>
#include <string.h>

/* Values per packed block that must stay whole inside one rank's shard: a 32-bit word holds
 * 32 / bits values, except 3 bits, whose 32 values span 3 words. */
static int64_t pack_width(int bits)
{
    return bits == 3 ? 32 : 32 / bits;
}

static int packed_sane(const qd_packed *p, const char *what, qd_err *err)
{
    if (!p || !p->qweight || !p->qzeros || !p->scales)
        return qd_err_set(err, QD_EINVAL, "tp layout: %s has no packed qweight/qzeros/scales", what);
    if (p->bits != 2 && p->bits != 3 && p->bits != 4 && p->bits != 8)
        return qd_err_set(err, QD_EINVAL, "tp layout: %s has %d bits; GPTQ packing holds 2, 3, 4 or 8", what, p->bits);
    if (p->k % 32 || p->n % 32)
        return qd_err_set(err, QD_ESHAPE, "tp layout: %s is [%lld, %lld]; GPTQ needs K and N multiples of 32", what,
                          (long long)p->n, (long long)p->k);
    if (p->qweight_shape[0] != p->k * p->bits / 32 || p->qweight_shape[1] != p->n ||
        p->qzeros_shape[0] != p->n_groups || p->qzeros_shape[1] != p->n * p->bits / 32 ||
        p->scales_shape[0] != p->n_groups || p->scales_shape[1] != p->n)
        return qd_err_set(err, QD_ESHAPE,
                          "tp layout: %s tensors do not match a [%lld, %lld] %d-bit layer with %lld groups (qweight "
                          "[%lld, %lld], qzeros [%lld, %lld], scales [%lld, %lld])",
                          what, (long long)p->n, (long long)p->k, p->bits, (long long)p->n_groups,
                          (long long)p->qweight_shape[0], (long long)p->qweight_shape[1], (long long)p->qzeros_shape[0],
                          (long long)p->qzeros_shape[1], (long long)p->scales_shape[0], (long long)p->scales_shape[1]);
    if (p->bias && p->bias_len != p->n)
        return qd_err_set(err, QD_ESHAPE, "tp layout: %s bias has %lld entries, expected %lld", what,
                          (long long)p->bias_len, (long long)p->n);
    return 0;
}

static int perm_valid(const int64_t *perm, int64_t n, qd_err *err)
{
    unsigned char *seen = calloc((size_t)n, 1);
    if (!seen) return qd_err_set(err, QD_ENOMEM, "tp layout: out of memory");
    for (int64_t i = 0; i < n; i++) {
        if (perm[i] < 0 || perm[i] >= n || seen[perm[i]]) {
            free(seen);
            return qd_err_set(err, QD_EINVAL, "tp layout: entry %lld of the permutation (%lld) is out of range or repeated",
                              (long long)i, (long long)perm[i]);
        }
        seen[perm[i]] = 1;
    }
    free(seen);
    return 0;
}

int qd_tp_perm_from_g_idx(const int32_t *g_idx, int64_t k, int64_t *perm, qd_err *err)
{
    /* A counting sort is stable by construction and linear in K. */
    int64_t max = -1;
    for (int64_t i = 0; i < k; i++) {
        if (g_idx[i] < 0) return qd_err_set(err, QD_EINVAL, "tp layout: g_idx[%lld] = %d is negative", (long long)i, g_idx[i]);
        if (g_idx[i] > max) max = g_idx[i];
    }
    if (k == 0) return 0;
    int64_t *start = calloc((size_t)(max + 2), sizeof *start);
    if (!start) return qd_err_set(err, QD_ENOMEM, "tp layout: out of memory");
    for (int64_t i = 0; i < k; i++) start[g_idx[i] + 1]++;
    for (int64_t g = 0; g <= max; g++) start[g + 1] += start[g];
    for (int64_t i = 0; i < k; i++) perm[start[g_idx[i]]++] = i;
    free(start);
    return 0;
}

int qd_tp_layout_check_shard(int64_t ff, int tp, int bits, int64_t group_size, const char *what, qd_err *err)
{
    if (tp < 1) return qd_err_set(err, QD_EINVAL, "tp layout: tp must be >= 1, got %d", tp);
    if (ff % tp)
        return qd_err_set(err, QD_ESHAPE, "tp layout: %s has %lld input features, which do not split over tp=%d ranks",
                          what, (long long)ff, tp);
    int64_t shard = ff / tp;
    if (group_size > 0 && shard % group_size)
        return qd_err_set(err, QD_ESHAPE,
                          "tp layout: %s has %lld input features; each of tp=%d ranks would get %lld, not a multiple of "
                          "group_size %lld (the intermediate size must be divisible by tp x group_size = %lld)",
                          what, (long long)ff, tp, (long long)shard, (long long)group_size, (long long)(tp * group_size));
    int64_t w = pack_width(bits);
    if (shard % w)
        return qd_err_set(err, QD_ESHAPE,
                          "tp layout: %s has %lld input features; each of tp=%d ranks would get %lld, which splits a "
                          "%d-bit packed block of %lld values (needs a multiple of tp x %lld = %lld)",
                          what, (long long)ff, tp, (long long)shard, bits, (long long)w, (long long)w, (long long)(tp * w));
    return 0;
}

int qd_tp_permute_rows(qd_packed *p, const int64_t *perm, qd_err *err)
{
    int rc = packed_sane(p, "row-parallel layer", err);
    if (rc) return rc;
    if (!p->g_idx || p->g_idx_len != p->k)
        return qd_err_set(err, QD_EINVAL, "tp layout: the row-parallel layer has no g_idx of length %lld (a format "
                                          "without g_idx cannot hold act-order weights)", (long long)p->k);
    const int64_t K = p->k, N = p->n, gs = p->group_size;
    if ((rc = perm_valid(perm, K, err))) return rc;
    /* Check first, so a bad permutation leaves the layer untouched. */
    for (int64_t i = 0; i < K; i++) {
        int64_t want = gs > 0 ? i / gs : 0;
        if (p->g_idx[perm[i]] != want)
            return qd_err_set(err, QD_EINVAL,
                              "tp layout: after sorting, row %lld has group %d but a trivial g_idx needs %lld (every group "
                              "must have exactly group_size %lld members)",
                              (long long)i, p->g_idx[perm[i]], (long long)want, (long long)gs);
    }
    int32_t *in = malloc((size_t)K * sizeof *in), *out = malloc((size_t)K * sizeof *out);
    if (!in || !out) {
        free(in);
        free(out);
        return qd_err_set(err, QD_ENOMEM, "tp layout: out of memory");
    }
    /* qweight packs along K, so each column's codes are unpacked, permuted and repacked. */
    for (int64_t c = 0; c < N; c++) {
        qd_unpack_bits(p->bits, p->qweight + c, K, N, in, 1);
        for (int64_t i = 0; i < K; i++) out[i] = in[perm[i]];
        qd_pack_bits(p->bits, out, K, 1, p->qweight + c, N);
    }
    for (int64_t i = 0; i < K; i++) p->g_idx[i] = (int32_t)(gs > 0 ? i / gs : 0);
    free(in);
    free(out);
    return 0;
}

int qd_tp_permute_cols(qd_packed *p, const int64_t *perm, qd_err *err)
{
    int rc = packed_sane(p, "column-parallel layer", err);
    if (rc) return rc;
    const int64_t N = p->n, G = p->n_groups, rows = p->qweight_shape[0], nw = p->qzeros_shape[1];
    if ((rc = perm_valid(perm, N, err))) return rc;
    int32_t *wtmp = malloc((size_t)N * sizeof *wtmp), *vin = malloc((size_t)N * sizeof *vin);
    uint16_t *htmp = malloc((size_t)N * sizeof *htmp);
    if (!wtmp || !vin || !htmp) {
        free(wtmp);
        free(vin);
        free(htmp);
        return qd_err_set(err, QD_ENOMEM, "tp layout: out of memory");
    }
    /* qweight packs along K: a column is whole words, so columns move as words. */
    for (int64_t r = 0; r < rows; r++) {
        int32_t *row = p->qweight + r * N;
        for (int64_t j = 0; j < N; j++) wtmp[j] = row[perm[j]];
        memcpy(row, wtmp, (size_t)N * sizeof *row);
    }
    /* qzeros pack along N: unpack a group's fields, permute, repack. */
    for (int64_t g = 0; g < G; g++) {
        qd_unpack_bits(p->bits, p->qzeros + g * nw, N, 1, vin, 1);
        for (int64_t j = 0; j < N; j++) wtmp[j] = vin[perm[j]];
        qd_pack_bits(p->bits, wtmp, N, 1, p->qzeros + g * nw, 1);
    }
    for (int64_t g = 0; g < G; g++) {
        uint16_t *row = p->scales + g * N;
        for (int64_t j = 0; j < N; j++) htmp[j] = row[perm[j]];
        memcpy(row, htmp, (size_t)N * sizeof *row);
    }
    if (p->bias) {
        for (int64_t j = 0; j < N; j++) htmp[j] = p->bias[perm[j]];
        memcpy(p->bias, htmp, (size_t)N * sizeof *htmp);
    }
    free(wtmp);
    free(vin);
    free(htmp);
    return 0;
}

int qd_tp_permute_rows_f32(float *w, int64_t n, int64_t k, float *bias, const int64_t *perm, qd_err *err)
{
    int rc = perm_valid(perm, n, err);
    if (rc) return rc;
    float *tmp = malloc((size_t)(n * k) * sizeof *tmp);
    if (!tmp) return qd_err_set(err, QD_ENOMEM, "tp layout: out of memory for a [%lld, %lld] float weight", (long long)n, (long long)k);
    for (int64_t i = 0; i < n; i++) memcpy(tmp + i * k, w + perm[i] * k, (size_t)k * sizeof *w);
    memcpy(w, tmp, (size_t)(n * k) * sizeof *w);
    if (bias) {
        for (int64_t i = 0; i < n; i++) tmp[i] = bias[perm[i]];
        memcpy(bias, tmp, (size_t)n * sizeof *bias);
    }
    free(tmp);
    return 0;
}

int qd_tp_layout_apply_pair(qd_packed *down, qd_packed *const *cols, int n_cols, int tp, int64_t *perm_out, qd_err *err)
{
    int rc = packed_sane(down, "row-parallel layer", err);
    if (rc) return rc;
    if (!down->g_idx)
        return qd_err_set(err, QD_EINVAL, "tp layout: the row-parallel layer has no g_idx (tp_aware needs gptq or "
                                          "gptq_v2 with desc_act)");
    if ((rc = qd_tp_layout_check_shard(down->k, tp, down->bits, down->group_size, "the row-parallel layer", err))) return rc;
    for (int j = 0; j < n_cols; j++) {
        if (!cols[j]) continue;
        if ((rc = packed_sane(cols[j], "column-parallel layer", err))) return rc;
        if (cols[j]->n != down->k)
            return qd_err_set(err, QD_ESHAPE, "tp layout: column-parallel layer %d has %lld outputs but the row-parallel "
                                              "layer has %lld inputs", j, (long long)cols[j]->n, (long long)down->k);
        /* Column layers shard N; their qzeros pack along N, so the same rule applies. */
        if ((rc = qd_tp_layout_check_shard(cols[j]->n, tp, cols[j]->bits, -1, "a column-parallel layer's outputs", err)))
            return rc;
    }
    int64_t *perm = malloc((size_t)down->k * sizeof *perm);
    if (!perm) return qd_err_set(err, QD_ENOMEM, "tp layout: out of memory");
    rc = qd_tp_perm_from_g_idx(down->g_idx, down->k, perm, err);
    /* Rows first: it validates the group structure and changes nothing when that fails. The
     * column permutations can then only fail for memory, before touching their layer. */
    if (!rc) rc = qd_tp_permute_rows(down, perm, err);
    for (int j = 0; j < n_cols && !rc; j++)
        if (cols[j]) rc = qd_tp_permute_cols(cols[j], perm, err);
    if (!rc && perm_out) memcpy(perm_out, perm, (size_t)down->k * sizeof *perm);
    free(perm);
    return rc;
}
