/* The float arrays of a part file, stored in fewer bytes when that loses nothing (part.h):
 * half precision when every value is exactly one, the upper triangle of a square matrix
 * whose lower triangle mirrors it or is zero. Each form is chosen by checking the array
 * itself, so the reader gets back the very bits the writer had. */
#include "quant/pipeline/part.h"

#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "quant/core/dtype.h"

static const char *const enc_names[] = {"f32", "bf16", "f16", "upper_sym", "upper_zero"};

static uint32_t bits_of(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

/* The halves: 1 when every value of x is exactly a BF16 (F16), the codes written to out. */
static int try_bf16(const float *x, uint64_t n, uint16_t *out)
{
    for (uint64_t i = 0; i < n; i++) {
        uint32_t u = bits_of(x[i]);
        if (u & 0xffffu) return 0;
        out[i] = (uint16_t)(u >> 16);
    }
    return 1;
}

static int try_f16(const float *x, uint64_t n, uint16_t *out)
{
    for (uint64_t i = 0; i < n; i++) {
        uint16_t h = qd_f32_to_f16(x[i]);
        if (bits_of(qd_f16_to_f32(h)) != bits_of(x[i])) return 0;
        out[i] = h;
    }
    return 1;
}

/* Tiles keep both the row and the column walk of the lower triangle in cache. */
#define TRI_TILE 64

/* 1 when m's lower triangle ([k, k], row-major) is the transpose of its upper (sym) or all
 * +0.0 bits (!sym). */
static int lower_is(const float *m, int64_t k, int sym)
{
    for (int64_t i0 = 0; i0 < k; i0 += TRI_TILE)
        for (int64_t j0 = 0; j0 <= i0; j0 += TRI_TILE) {
            int64_t i1 = i0 + TRI_TILE < k ? i0 + TRI_TILE : k, j1 = j0 + TRI_TILE < k ? j0 + TRI_TILE : k;
            for (int64_t i = i0; i < i1; i++)
                for (int64_t j = j0; j < j1 && j < i; j++) {
                    uint32_t lo = bits_of(m[i * k + j]);
                    if (sym ? lo != bits_of(m[j * k + i]) : lo != 0) return 0;
                }
        }
    return 1;
}

static uint64_t tri_count(int64_t k) { return (uint64_t)k * (uint64_t)(k + 1) / 2; }

int qd_part_farr_make(const char *name, const float *x, uint64_t n, int64_t k_square, qd_part_farr *a, qd_err *err)
{
    memset(a, 0, sizeof *a);
    a->arr = (qd_part_arr){name, x, n * sizeof(float)};
    if (k_square > 0) {
        if ((uint64_t)k_square * (uint64_t)k_square != n)
            return qd_err_set(err, QD_EINVAL, "part array %s: %llu values are not [%lld, %lld]", name,
                              (unsigned long long)n, (long long)k_square, (long long)k_square);
        int sym = lower_is(x, k_square, 1);
        if (!sym && !lower_is(x, k_square, 0)) return 0;
        float *t = malloc(tri_count(k_square) * sizeof *t);
        if (!t) return qd_err_set(err, QD_ENOMEM, "part array %s: out of memory", name);
        float *o = t;
        for (int64_t i = 0; i < k_square; i++) {   /* row i from its diagonal on */
            memcpy(o, x + i * k_square + i, (size_t)(k_square - i) * sizeof *t);
            o += k_square - i;
        }
        a->own = t;
        a->enc = sym ? QD_PART_ENC_UPPER_SYM : QD_PART_ENC_UPPER_ZERO;
        a->arr.data = t;
        a->arr.bytes = tri_count(k_square) * sizeof *t;
        return 0;
    }
    uint16_t *h = malloc((n ? n : 1) * sizeof *h);
    if (!h) return qd_err_set(err, QD_ENOMEM, "part array %s: out of memory", name);
    if (try_bf16(x, n, h)) a->enc = QD_PART_ENC_BF16;
    else if (try_f16(x, n, h)) a->enc = QD_PART_ENC_F16;
    else {
        free(h);
        return 0;
    }
    a->own = h;
    a->arr.data = h;
    a->arr.bytes = n * sizeof *h;
    return 0;
}

void qd_part_farr_free(qd_part_farr *a)
{
    if (!a) return;
    free(a->own);
    memset(a, 0, sizeof *a);
}

int qd_part_farr_note(cJSON *meta, const qd_part_farr *a)
{
    if (a->enc == QD_PART_ENC_F32) return 0;
    cJSON *enc = cJSON_GetObjectItemCaseSensitive(meta, "enc");
    if (!enc && !(enc = cJSON_AddObjectToObject(meta, "enc"))) return QD_ENOMEM;
    return cJSON_AddStringToObject(enc, a->arr.name, enc_names[a->enc]) ? 0 : QD_ENOMEM;
}

int qd_part_farr_read(const qd_part_file *f, const char *name, float *dst, uint64_t n, int64_t k_square, qd_err *err)
{
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(f->meta, "enc"), name);
    qd_part_enc enc = QD_PART_ENC_F32;
    if (e) {
        int found = 0;
        for (int i = 0; i < (int)(sizeof enc_names / sizeof enc_names[0]) && cJSON_IsString(e); i++)
            if (!strcmp(e->valuestring, enc_names[i])) { enc = (qd_part_enc)i; found = 1; }
        if (!found) return qd_err_set(err, QD_EFORMAT, "part file: array %s has an unknown encoding", name);
    }
    int tri = enc == QD_PART_ENC_UPPER_SYM || enc == QD_PART_ENC_UPPER_ZERO;
    if (tri && (k_square <= 0 || (uint64_t)k_square * (uint64_t)k_square != n))
        return qd_err_set(err, QD_EFORMAT, "part file: array %s is a triangle where a vector belongs", name);
    uint64_t bytes = tri ? tri_count(k_square) * sizeof(float) : n * (enc == QD_PART_ENC_F32 ? 4 : 2);
    const void *src = qd_part_file_arr(f, name, bytes, err);
    if (!src) return QD_EFORMAT;
    if (enc == QD_PART_ENC_F32) {
        memcpy(dst, src, bytes);
        return 0;
    }
    if (!tri) {
        /* The file's bytes may sit at any offset: copied out a value at a time. */
        const unsigned char *s = src;
        for (uint64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            dst[i] = enc == QD_PART_ENC_BF16 ? qd_bf16_to_f32(h) : qd_f16_to_f32(h);
        }
        return 0;
    }
    const int64_t k = k_square;
    const char *s = src;
    for (int64_t i = 0; i < k; i++) {
        memcpy(dst + i * k + i, s, (size_t)(k - i) * sizeof(float));
        s += (size_t)(k - i) * sizeof(float);
    }
    for (int64_t i0 = 0; i0 < k; i0 += TRI_TILE)
        for (int64_t j0 = 0; j0 <= i0; j0 += TRI_TILE) {
            int64_t i1 = i0 + TRI_TILE < k ? i0 + TRI_TILE : k, j1 = j0 + TRI_TILE < k ? j0 + TRI_TILE : k;
            for (int64_t i = i0; i < i1; i++)
                for (int64_t j = j0; j < j1 && j < i; j++)
                    dst[i * k + j] = enc == QD_PART_ENC_UPPER_SYM ? dst[j * k + i] : 0.0f;
        }
    return 0;
}
