/* safetensors reader, writer, sharded models and fsutil: byte-exact comparison with files
 * the Python library wrote (tests/data, made by make_st_golden.py), round trips of every
 * dtype, one malformed file per validation rule with its message checked, sharded and
 * refused checkpoints, and atomic writes that leave no temp files behind. */
#include "test_util.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "quant/core/fsutil.h"
#include "quant/core/safetensors.h"

/* ---- helpers ---- */

static const char *data_dir(void)
{
    static char buf[1024];
    const char *src = getenv("QUANTD_SOURCE_DIR");
    if (src) { snprintf(buf, sizeof buf, "%s/tests/data", src); return buf; }
    /* Outside ctest, fall back on this file's location (absolute under CMake). */
    snprintf(buf, sizeof buf, "%s", __FILE__);
    char *s = strrchr(buf, '/');
    if (s) { *s = '\0'; s = strrchr(buf, '/'); }
    if (s) strcpy(s, "/data");
    else snprintf(buf, sizeof buf, "tests/data");
    return buf;
}

/* Must match pattern() in tests/data/make_st_golden.py. */
static uint8_t pattern_byte(size_t i, int seed, int is_bool)
{
    if (is_bool) return (uint8_t)((i + (size_t)seed) % 3 == 0);
    return (uint8_t)((i * 37 + (size_t)seed * 11 + 5) & 0xff);
}

typedef struct gspec { const char *name; qd_dtype dt; int ndim; int64_t shape[2]; int seed; } gspec;

/* Must match MIXED in tests/data/make_st_golden.py. */
static const gspec MIXED[] = {
    {"model.embed", QD_DTYPE_F32, 2, {3, 4}, 1},
    {"layers.10.w", QD_DTYPE_F16, 2, {2, 3}, 2},
    {"layers.2.w", QD_DTYPE_F16, 1, {5}, 3},
    {"Zeta", QD_DTYPE_BF16, 2, {2, 2}, 4},
    {"a_b", QD_DTYPE_I32, 1, {3}, 5},
    {"a.b", QD_DTYPE_I32, 2, {1, 1}, 6},
    {"big", QD_DTYPE_I64, 1, {2}, 7},
    {"dbl", QD_DTYPE_F64, 0, {0}, 8},
    {"u8", QD_DTYPE_U8, 1, {7}, 9},
    {"i8", QD_DTYPE_I8, 1, {3}, 10},
    {"i16", QD_DTYPE_I16, 1, {3}, 11},
    {"u16", QD_DTYPE_U16, 1, {1}, 12},
    {"u32", QD_DTYPE_U32, 1, {2}, 13},
    {"u64", QD_DTYPE_U64, 1, {1}, 14},
    {"flags", QD_DTYPE_BOOL, 1, {5}, 15},
    {"empty", QD_DTYPE_F32, 2, {0, 3}, 16},
    {"caf\xc3\xa9", QD_DTYPE_F32, 1, {1}, 17},
    {"q\"\\\n\t\x01/", QD_DTYPE_F16, 1, {1}, 18},
    {"e4", QD_DTYPE_F8_E4M3, 1, {2}, 19},
    {"a_e5", QD_DTYPE_F8_E5M2, 1, {3}, 20},
};
#define N_MIXED (sizeof MIXED / sizeof MIXED[0])

static size_t gspec_bytes(const gspec *g)
{
    size_t n = 1;
    for (int d = 0; d < g->ndim; d++) n *= (size_t)g->shape[d];
    return n * qd_dtype_size(g->dt);
}

/* Writes a file from raw parts: an 8-byte length (hlen_override when nonzero, else the
 * header's own length), the header text and data_len bytes of zeros. */
static const char *write_raw(const char *name, const char *header, uint64_t hlen_override, size_t data_len)
{
    const char *p = test_path(test_tmpdir(), name);
    size_t hl = strlen(header);
    uint64_t n = hlen_override ? hlen_override : hl;
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)(n >> (8 * i));
    char *zeros = calloc(1, data_len + 1);
    struct iovec iov[3] = { { len8, 8 }, { (void *)header, hl }, { zeros, data_len } };
    qd_err err = {0};
    if (qd_fs_write_atomic_iov(p, iov, 3, &err) != 0) fprintf(stderr, "%s\n", err.msg);
    free(zeros);
    return p;
}

static void expect_bad(const char *file, const char *header, uint64_t hlen, size_t data_len, const char *want1,
                       const char *want2)
{
    const char *p = write_raw(file, header, hlen, data_len);
    st_file *f = NULL;
    qd_err err = {0};
    int rc = st_file_open(p, &f, &err);
    CHECK_INT(rc, QD_EFORMAT);
    CHECK(f == NULL);
    CHECK_CONTAINS(err.msg, file);   /* the message names the file */
    CHECK_CONTAINS(err.msg, want1);
    if (want2) CHECK_CONTAINS(err.msg, want2);
    st_file_close(f);
}

/* ---- golden byte comparisons ---- */

static void test_golden_mixed_bytes(void)
{
    st_writer *w;
    qd_err err = {0};
    uint8_t *bufs[N_MIXED];
    CHECK_OK(st_writer_init(&w));
    /* Add in reverse so the writer, not the insertion order, decides the file order. */
    for (size_t k = N_MIXED; k-- > 0;) {
        const gspec *g = &MIXED[k];
        size_t nb = gspec_bytes(g);
        bufs[k] = malloc(nb + 1);
        for (size_t i = 0; i < nb; i++) bufs[k][i] = pattern_byte(i, g->seed, g->dt == QD_DTYPE_BOOL);
        CHECK_OK(st_writer_add(w, g->name, g->dt, g->ndim, g->shape, bufs[k], &err));
    }
    const char *dir = test_fresh_dir("golden");
    const char *out = test_path(dir, "mixed.safetensors");
    CHECK_OK(st_writer_write(w, out, &err));
    CHECK(test_files_equal(out, test_path(data_dir(), "st_golden_mixed.safetensors")));
    int tmps;
    CHECK_INT(test_count_entries(dir, &tmps), 1);
    CHECK_INT(tmps, 0);
    st_writer_free(w);
    for (size_t k = 0; k < N_MIXED; k++) free(bufs[k]);
}

static void test_golden_empty_bytes(void)
{
    st_writer *w;
    qd_err err = {0};
    CHECK_OK(st_writer_init(&w));
    const char *out = test_path(test_tmpdir(), "empty.safetensors");
    CHECK_OK(st_writer_write(w, out, &err));
    CHECK(test_files_equal(out, test_path(data_dir(), "st_golden_empty.safetensors")));
    st_writer_free(w);

    st_file *f;
    CHECK_OK(st_file_open(out, &f, &err));
    CHECK_INT(st_file_count(f), 0);
    CHECK_STR(st_file_metadata(f, "format"), "pt");
    CHECK(st_file_find(f, "x") == NULL);
    st_file_close(f);
}

static void test_golden_mixed_read(void)
{
    st_file *f;
    qd_err err = {0};
    const char *p = test_path(data_dir(), "st_golden_mixed.safetensors");
    CHECK_OK(st_file_open(p, &f, &err));
    if (!f) { fprintf(stderr, "%s\n", err.msg); return; }
    CHECK_INT(st_file_count(f), N_MIXED);
    CHECK_STR(st_file_metadata(f, "format"), "pt");
    CHECK(st_file_metadata(f, "nope") == NULL);
    CHECK_STR(st_file_tensor(f, 0)->name, "u64");        /* highest dtype rank first */
    CHECK_STR(st_file_tensor(f, N_MIXED - 1)->name, "flags");
    CHECK(st_file_tensor(f, N_MIXED) == NULL);
    for (size_t k = 0; k < N_MIXED; k++) {
        const gspec *g = &MIXED[k];
        const st_tensor *t = st_file_find(f, g->name);
        CHECK(t != NULL);
        if (!t) continue;
        CHECK_INT(t->dtype, g->dt);
        CHECK_INT(t->ndim, g->ndim);
        for (int d = 0; d < g->ndim; d++) CHECK_INT(t->shape[d], g->shape[d]);
        CHECK_INT(t->end - t->begin, gspec_bytes(g));
        int same = 1;
        for (size_t i = 0; i < gspec_bytes(g); i++)
            same &= ((const uint8_t *)t->data)[i] == pattern_byte(i, g->seed, g->dt == QD_DTYPE_BOOL);
        CHECK(same);
    }
    st_file_close(f);
}

static void test_golden_values_read(void)
{
    st_file *f;
    qd_err err = {0};
    float v[8];
    CHECK_OK(st_file_open(test_path(data_dir(), "st_golden_values.safetensors"), &f, &err));
    if (!f) { fprintf(stderr, "%s\n", err.msg); return; }
    const st_tensor *t = st_file_find(f, "f32");
    CHECK_OK(st_tensor_read_f32(t, v, &err));
    CHECK_NEAR(v[1], 1.5, 0);
    CHECK_NEAR(v[2], -2.25, 0);
    CHECK_NEAR(v[4], 3.0e38f, 0);
    CHECK(signbit(v[5]) && v[5] == 0.0f);
    t = st_file_find(f, "f16");
    CHECK_INT(t->numel, 5);
    CHECK_OK(st_tensor_read_f32(t, v, &err));
    CHECK_NEAR(v[0], 0.5, 0);
    CHECK_NEAR(v[1], -1.25, 0);
    CHECK_NEAR(v[2], 65504.0, 0);
    CHECK(isinf(v[3]) && v[3] > 0);
    CHECK_NEAR(v[4], 5.9604644775390625e-08, 0);   /* 6e-8 rounds to the smallest F16 subnormal */
    t = st_file_find(f, "i32");
    CHECK_OK(st_tensor_read_f32(t, v, &err));
    CHECK_NEAR(v[0], -7, 0);
    CHECK_NEAR(v[2], 2147483648.0, 0);
    t = st_file_find(f, "f64");
    CHECK_OK(st_tensor_read_f32(t, v, &err));
    CHECK_NEAR(v[0], (float)(1.0 / 3.0), 0);
    t = st_file_find(f, "i8");
    CHECK_OK(st_tensor_read_f32(t, v, &err));
    CHECK_NEAR(v[0], -128, 0);
    t = st_file_find(f, "u8");   /* at an odd offset, so this also covers the unaligned path */
    CHECK_OK(st_tensor_read_f32(t, v, &err));
    CHECK_NEAR(v[1], 255, 0);
    st_file_close(f);

    CHECK_OK(st_file_open(test_path(data_dir(), "st_golden_values_bf16.safetensors"), &f, &err));
    if (!f) return;
    CHECK_OK(st_tensor_read_f32(st_file_find(f, "bf16"), v, &err));
    CHECK_NEAR(v[0], 1.0, 0);
    CHECK_NEAR(v[1], -2.0, 0);
    CHECK_NEAR(v[2], 3.140625, 0);
    CHECK_NEAR(v[3], 0.0078125, 0);
    st_file_close(f);
}

/* ---- round trips ---- */

static void test_roundtrip_every_dtype(void)
{
    test_rng r;
    test_rng_seed(&r, 42);
    qd_err err = {0};
    for (int dt = 1; dt < QD_DTYPE_COUNT; dt++) {
        st_writer *w;
        CHECK_OK(st_writer_init(&w));
        int64_t shape[3] = {3, 5, 7};
        size_t n = 105, es = qd_dtype_size((qd_dtype)dt);
        uint8_t *buf = malloc(n * es), *u8 = malloc(3);
        for (size_t i = 0; i < n * es; i++) buf[i] = dt == QD_DTYPE_BOOL ? (uint8_t)(test_rng_u64(&r) & 1) : (uint8_t)test_rng_u64(&r);
        /* A 3-byte U8 tensor rides along so each file mixes dtypes and sizes. */
        u8[0] = 1; u8[1] = 2; u8[2] = 3;
        CHECK_OK(st_writer_add(w, "t", (qd_dtype)dt, 3, shape, buf, &err));
        int64_t s1 = 3;
        if (dt != QD_DTYPE_U8) CHECK_OK(st_writer_add_copy(w, "odd", QD_DTYPE_U8, 1, &s1, u8, &err));
        CHECK_OK(st_writer_set_metadata(w, "note", "dtype test"));
        CHECK_INT(st_writer_data_bytes(w), n * es + (dt != QD_DTYPE_U8 ? 3 : 0));
        free(u8);   /* the copy must not depend on this buffer */
        char name[64];
        snprintf(name, sizeof name, "rt_%s.safetensors", qd_dtype_name((qd_dtype)dt));
        const char *p = test_path(test_tmpdir(), name);
        CHECK_OK(st_writer_write(w, p, &err));
        st_writer_free(w);

        st_file *f;
        CHECK_OK(st_file_open(p, &f, &err));
        if (!f) { fprintf(stderr, "%s\n", err.msg); free(buf); continue; }
        CHECK_STR(st_file_metadata(f, "note"), "dtype test");
        CHECK_STR(st_file_metadata(f, "format"), "pt");
        const st_tensor *t = st_file_find(f, "t");
        CHECK(t && t->dtype == dt && t->ndim == 3 && t->shape[2] == 7 && t->numel == n);
        if (t) {
            CHECK(memcmp(t->data, buf, n * es) == 0);
            float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
            int conv = qd_convert_to_f32((qd_dtype)dt, buf, b, n);
            int rc = st_tensor_read_f32(t, a, &err);
            if (conv == 0) {
                CHECK_OK(rc);
                CHECK(memcmp(a, b, n * sizeof *a) == 0);
            } else {
                CHECK_INT(rc, QD_EUNSUPPORTED);
                CHECK_CONTAINS(err.msg, qd_dtype_name((qd_dtype)dt));
            }
            free(a);
            free(b);
        }
        if (dt != QD_DTYPE_U8) {
            const st_tensor *o = st_file_find(f, "odd");
            CHECK(o && memcmp(o->data, "\1\2\3", 3) == 0);
        }
        st_file_close(f);
        free(buf);
    }
}

/* st_tensor_release: a file-mapped tensor's pages go back and a later read gets the same
 * bytes from the file; a tensor in a caller's buffer (st_file_open_memory) is left alone,
 * since MADV_DONTNEED would zero that memory. */
static void test_tensor_release(void)
{
    qd_err err = {0};
    const size_t n = 3 << 12;   /* 48 KiB of F32: whole pages inside the data */
    float *v = malloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++) v[i] = (float)i * 0.25f - 7.0f;
    st_writer *w;
    CHECK_OK(st_writer_init(&w));
    int64_t shape[1] = {(int64_t)n};
    CHECK_OK(st_writer_add(w, "big", QD_DTYPE_F32, 1, shape, v, &err));
    const char *p = test_path(test_tmpdir(), "release.safetensors");
    CHECK_OK(st_writer_write(w, p, &err));
    st_writer_free(w);

    st_file *f = NULL;
    CHECK_OK(st_file_open(p, &f, &err));
    const st_tensor *t = f ? st_file_find(f, "big") : NULL;
    CHECK(t && t->mapped);
    if (t) {
        st_tensor_release(t);
        CHECK(memcmp(t->data, v, n * sizeof *v) == 0);
    }

    /* The same file's bytes in a buffer of ours, page-aligned so whole pages would qualify. */
    size_t len = 0;
    FILE *fp = fopen(p, "rb");
    CHECK(fp != NULL);
    fseek(fp, 0, SEEK_END);
    len = (size_t)ftell(fp);
    fseek(fp, 0, SEEK_SET);
    void *buf = NULL;
    CHECK(posix_memalign(&buf, 1 << 16, len) == 0);
    CHECK(fread(buf, 1, len, fp) == len);
    fclose(fp);
    st_file *m = NULL;
    CHECK_OK(st_file_open_memory(buf, len, "memory", &m, &err));
    const st_tensor *tm = m ? st_file_find(m, "big") : NULL;
    CHECK(tm && !tm->mapped);
    if (tm) {
        st_tensor_release(tm);
        CHECK(memcmp(tm->data, v, n * sizeof *v) == 0);
    }
    st_file_close(m);
    st_file_close(f);
    free(buf);
    free(v);
}

static void test_zero_element_tensors(void)
{
    st_writer *w;
    qd_err err = {0};
    CHECK_OK(st_writer_init(&w));
    int64_t s0[2] = {0, 4}, s1[1] = {2};
    float two[2] = {1, 2};
    CHECK_OK(st_writer_add(w, "z", QD_DTYPE_F32, 2, s0, NULL, &err));
    CHECK_OK(st_writer_add(w, "a", QD_DTYPE_F32, 1, s1, two, &err));
    CHECK_OK(st_writer_add(w, "scalar", QD_DTYPE_F32, 0, NULL, two, &err));
    const char *p = test_path(test_tmpdir(), "zero.safetensors");
    CHECK_OK(st_writer_write(w, p, &err));
    st_writer_free(w);
    st_file *f;
    CHECK_OK(st_file_open(p, &f, &err));
    if (!f) return;
    CHECK_INT(st_file_count(f), 3);
    const st_tensor *z = st_file_find(f, "z"), *s = st_file_find(f, "scalar");
    CHECK(z && z->numel == 0 && z->begin == z->end);
    CHECK(s && s->numel == 1 && s->ndim == 0);
    float v[2] = {7, 7};
    CHECK_OK(st_tensor_read_f32(z, v, &err));
    CHECK_NEAR(v[0], 7, 0);
    st_file_close(f);

    /* A zero-tensor file without metadata, as a hand-written header. */
    const char *e = write_raw("zero_tensors.safetensors", "{}      ", 0, 0);
    CHECK_OK(st_file_open(e, &f, &err));
    CHECK(f && st_file_count(f) == 0);
    st_file_close(f);
}

static void test_writer_errors(void)
{
    st_writer *w;
    qd_err err = {0};
    float x[4] = {0};
    int64_t s[2] = {2, 2}, neg[2] = {2, -1};
    CHECK_OK(st_writer_init(&w));
    CHECK_OK(st_writer_add(w, "w", QD_DTYPE_F32, 2, s, x, &err));
    CHECK_ERR(st_writer_add(w, "w", QD_DTYPE_F16, 2, s, x, &err));
    CHECK_CONTAINS(err.msg, "duplicate tensor name 'w'");
    CHECK_ERR(st_writer_add(w, "n", QD_DTYPE_F32, 2, neg, x, &err));
    CHECK_CONTAINS(err.msg, "negative");
    CHECK_ERR(st_writer_add(w, "d", QD_DTYPE_INVALID, 2, s, x, &err));
    CHECK_ERR(st_writer_add(w, "__metadata__", QD_DTYPE_F32, 2, s, x, &err));
    CHECK_ERR(st_writer_add(w, "null", QD_DTYPE_F32, 2, s, NULL, &err));
    CHECK_ERR(st_writer_add(w, "bad\xff", QD_DTYPE_F32, 2, s, x, &err));
    CHECK_CONTAINS(err.msg, "UTF-8");
    CHECK_INT(st_writer_set_metadata(w, "k", "\xc0\x80"), QD_EINVAL);
    CHECK_INT(st_writer_data_bytes(w), 16);
    const char *bad = test_path(test_tmpdir(), "no/such/dir/x.safetensors");
    CHECK_ERR(st_writer_write(w, bad, &err));
    CHECK_CONTAINS(err.msg, "no/such/dir");
    st_writer_free(w);
    st_writer_free(NULL);
    st_file_close(NULL);
    st_model_close(NULL);
}

/* Thousands of tensors: name lookups must stay fast (binary search, hashed duplicates). */
static void test_many_tensors(void)
{
    enum { N = 6000 };
    st_writer *w;
    qd_err err = {0};
    static uint16_t vals[N];
    CHECK_OK(st_writer_init(&w));
    for (int i = 0; i < N; i++) {
        char name[64];
        snprintf(name, sizeof name, "model.layers.%d.mlp.w%d.weight", i / 7, i % 7);
        vals[i] = qd_f32_to_f16((float)(i % 2048));   /* integers up to 2048 are exact in F16 */
        int64_t one = 1;
        CHECK_OK(st_writer_add(w, name, QD_DTYPE_F16, 1, &one, &vals[i], &err));
    }
    const char *p = test_path(test_tmpdir(), "many.safetensors");
    CHECK_OK(st_writer_write(w, p, &err));
    st_writer_free(w);
    st_file *f;
    CHECK_OK(st_file_open(p, &f, &err));
    if (!f) return;
    CHECK_INT(st_file_count(f), N);
    int ok = 1;
    for (int i = 0; i < N; i++) {
        char name[64];
        snprintf(name, sizeof name, "model.layers.%d.mlp.w%d.weight", i / 7, i % 7);
        const st_tensor *t = st_file_find(f, name);
        float v;
        ok &= t && st_tensor_read_f32(t, &v, &err) == 0 && v == (float)(i % 2048);
    }
    CHECK(ok);
    st_file_close(f);
}

/* ---- malformed files: one per rule ---- */

static void test_malformed(void)
{
    const char *T = "{\"__metadata__\":{\"format\":\"pt\"},";
    char h[512];

    /* Truncated: fewer than 8 bytes. */
    {
        const char *p = test_path(test_tmpdir(), "trunc5.safetensors");
        qd_err err = {0};
        CHECK_OK(qd_fs_write_atomic(p, "\x10\0\0\0\0", 5, &err));
        st_file *f = NULL;
        CHECK_INT(st_file_open(p, &f, &err), QD_EFORMAT);
        CHECK_CONTAINS(err.msg, "trunc5.safetensors");
        CHECK_CONTAINS(err.msg, "truncated");
    }
    /* Data cut short: the last tensor runs past the file end. */
    snprintf(h, sizeof h, "%s\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", T);
    expect_bad("short_data.safetensors", h, 0, 10, "end at data byte 16", "holds 10 bytes");
    /* Header length past the end of the file. */
    expect_bad("hlen_past.safetensors", "{}", 1000, 0, "runs past the end", NULL);
    /* Header too long. */
    expect_bad("hlen_huge.safetensors", "{}", 200000000ull, 0, "header too long", "100000000");
    /* Overlapping offsets. */
    snprintf(h, sizeof h, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                          "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}");
    expect_bad("overlap.safetensors", h, 0, 12, "tensor 'b'", "overlaps tensor 'a'");
    /* A gap between tensors, and one at the start. */
    snprintf(h, sizeof h, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                          "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}");
    expect_bad("gap.safetensors", h, 0, 20, "tensor 'b'", "gap of 4 bytes");
    snprintf(h, sizeof h, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}");
    expect_bad("gap0.safetensors", h, 0, 16, "tensor 'a'", "gap of 8 bytes");
    /* Unknown dtype. */
    snprintf(h, sizeof h, "%s\"w\":{\"dtype\":\"F17\",\"shape\":[2],\"data_offsets\":[0,8]}}", T);
    expect_bad("dtype.safetensors", h, 0, 8, "tensor 'w'", "unknown dtype 'F17'");
    /* Size that disagrees with shape x dtype. */
    snprintf(h, sizeof h, "%s\"lm_head.weight\":{\"dtype\":\"F32\",\"shape\":[4,4],\"data_offsets\":[0,10]}}", T);
    expect_bad("size.safetensors", h, 0, 10, "tensor 'lm_head.weight'", "wrong size");
    /* Duplicate names, including one spelt with an escape. */
    snprintf(h, sizeof h, "{\"ab\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                          "\"a\\u0062\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}");
    expect_bad("dup.safetensors", h, 0, 2, "duplicate tensor name 'ab'", NULL);
    /* Not JSON, several ways. */
    expect_bad("nojson1.safetensors", "{\"a\":", 0, 0, "not valid JSON", NULL);
    expect_bad("nojson2.safetensors", "not json at all!", 0, 0, "not valid JSON", "'{'");
    expect_bad("nojson3.safetensors", "{\"a\" 1}", 0, 0, "not valid JSON", "':'");
    expect_bad("nojson4.safetensors", "{}x      ", 0, 0, "not valid JSON", "after the closing");
    expect_bad("nojson5.safetensors", "{\"a\xff\":1}", 0, 0, "UTF-8", NULL);
    /* Negative shape. */
    snprintf(h, sizeof h, "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,-3],\"data_offsets\":[0,0]}}");
    expect_bad("negshape.safetensors", h, 0, 0, "tensor 'w'", "shape[1] is negative");
    /* Non-integer shape, offsets the wrong way round, missing field, unknown field. */
    snprintf(h, sizeof h, "{\"w\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,0]}}");
    expect_bad("fracshape.safetensors", h, 0, 0, "tensor 'w'", "not an integer");
    snprintf(h, sizeof h, "{\"w\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,0]}}");
    expect_bad("backwards.safetensors", h, 0, 0, "tensor 'w'", "end before they begin");
    snprintf(h, sizeof h, "{\"w\":{\"dtype\":\"U8\",\"data_offsets\":[0,0]}}");
    expect_bad("noshape.safetensors", h, 0, 0, "tensor 'w'", "no 'shape'");
    snprintf(h, sizeof h, "{\"w\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0],\"x\":1}}");
    expect_bad("extra.safetensors", h, 0, 0, "tensor 'w'", "unknown field 'x'");
    snprintf(h, sizeof h, "{\"w\":{\"dtype\":\"U8\",\"shape\":[0],\"shape\":[0],\"data_offsets\":[0,0]}}");
    expect_bad("dupfield.safetensors", h, 0, 0, "tensor 'w'", "duplicate field 'shape'");
    snprintf(h, sizeof h, "{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,99999999999999999999]}}");
    expect_bad("bigoff.safetensors", h, 0, 0, "tensor 'w'", "too large");
    /* Metadata values must be strings; __metadata__ once. */
    expect_bad("meta.safetensors", "{\"__metadata__\":{\"format\":1}}", 0, 0, "__metadata__", "not a string");
    expect_bad("meta2.safetensors", "{\"__metadata__\":{},\"__metadata__\":{}}", 0, 0, "duplicate __metadata__", NULL);
    expect_bad("meta3.safetensors", "{\"__metadata__\":{\"k\":\"a\",\"k\":\"b\"}}", 0, 0, "duplicate __metadata__ key 'k'",
               NULL);
    /* Extra bytes after the last tensor. */
    snprintf(h, sizeof h, "{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}");
    expect_bad("trailing.safetensors", h, 0, 5, "end at data byte 1", "holds 5 bytes");

    /* A missing file is ENOTFOUND, not a format error. */
    st_file *f = NULL;
    qd_err err = {0};
    CHECK_INT(st_file_open(test_path(test_tmpdir(), "missing.safetensors"), &f, &err), QD_ENOTFOUND);

    /* st_header_parse on its own: data pointers stay NULL and reading says so. */
    const char *hh = "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
    CHECK_OK(st_header_parse(hh, strlen(hh), 4, "hdr", &f, &err));
    if (f) {
        CHECK(st_file_tensor(f, 0)->data == NULL);
        float v;
        CHECK_ERR(st_tensor_read_f32(st_file_tensor(f, 0), &v, &err));
        st_file_close(f);
    }
    CHECK_ERR(st_header_parse(hh, strlen(hh), 8, "hdr", &f, &err));
    CHECK_CONTAINS(err.msg, "hdr:");
}

/* ---- sharded models ---- */

static void write_shard(const char *path, const char **names, int n, float base)
{
    st_writer *w;
    qd_err err = {0};
    float data[8][6];
    st_writer_init(&w);
    for (int i = 0; i < n; i++) {
        int64_t s[2] = {2, 3};
        for (int j = 0; j < 6; j++) data[i][j] = base + (float)(i * 10 + j);
        st_writer_add_copy(w, names[i], QD_DTYPE_F32, 2, s, data[i], &err);
    }
    if (st_writer_write(w, path, &err)) fprintf(stderr, "%s\n", err.msg);
    st_writer_free(w);
}

static void write_index(const char *dir, const char *json)
{
    qd_err err = {0};
    if (qd_fs_write_atomic(test_path(dir, "model.safetensors.index.json"), json, strlen(json), &err))
        fprintf(stderr, "%s\n", err.msg);
}

static void test_sharded_model(void)
{
    const char *dir = test_fresh_dir("sharded");
    const char *s1[] = {"model.embed_tokens.weight", "model.layers.0.w"};
    const char *s2[] = {"model.layers.1.w", "lm_head.weight"};
    write_shard(test_path(dir, "model-00001-of-00002.safetensors"), s1, 2, 0);
    write_shard(test_path(dir, "model-00002-of-00002.safetensors"), s2, 2, 100);
    write_index(dir, "{\"metadata\":{\"total_size\":96},\"weight_map\":{"
                     "\"model.embed_tokens.weight\":\"model-00001-of-00002.safetensors\","
                     "\"model.layers.0.w\":\"model-00001-of-00002.safetensors\","
                     "\"model.layers.1.w\":\"model-00002-of-00002.safetensors\","
                     "\"lm_head.weight\":\"model-00002-of-00002.safetensors\"}}");
    st_model *m = NULL;
    qd_err err = {0};
    CHECK_OK(st_model_open(dir, &m, &err));
    if (!m) { fprintf(stderr, "%s\n", err.msg); return; }
    CHECK_INT(st_model_count(m), 4);
    CHECK(st_model_tensor(m, 4) == NULL);
    CHECK_STR(st_model_shard_of(m, "lm_head.weight"), "model-00002-of-00002.safetensors");
    CHECK_STR(st_model_shard_of(m, "model.layers.0.w"), "model-00001-of-00002.safetensors");
    CHECK(st_model_shard_of(m, "nope") == NULL);
    CHECK(st_model_find(m, "model.layers.1.w") != NULL);
    float v[6];
    int64_t shape[2] = {2, 3}, wrong[2] = {3, 2};
    CHECK_OK(st_model_read_f32(m, "model.layers.1.w", 2, shape, v, &err));
    CHECK_NEAR(v[5], 105, 0);
    CHECK_OK(st_model_read_f32(m, "lm_head.weight", -1, NULL, v, &err));
    CHECK_NEAR(v[0], 110, 0);
    CHECK_INT(st_model_read_f32(m, "model.layers.1.w", 2, wrong, v, &err), QD_ESHAPE);
    CHECK_CONTAINS(err.msg, "model.layers.1.w");
    CHECK_CONTAINS(err.msg, "[2, 3]");
    CHECK_CONTAINS(err.msg, "[3, 2]");
    CHECK_INT(st_model_read_f32(m, "absent", -1, NULL, v, &err), QD_ENOTFOUND);
    CHECK_CONTAINS(err.msg, "absent");
    st_model_close(m);

    /* weight_map names a tensor its shard does not hold. */
    write_index(dir, "{\"weight_map\":{\"model.layers.0.w\":\"model-00002-of-00002.safetensors\"}}");
    CHECK_INT(st_model_open(dir, &m, &err), QD_EFORMAT);
    CHECK_CONTAINS(err.msg, "model.layers.0.w");
    CHECK_CONTAINS(err.msg, "no such tensor");
    /* weight_map names a shard that is not there. */
    write_index(dir, "{\"weight_map\":{\"x\":\"model-00003-of-00002.safetensors\"}}");
    CHECK_INT(st_model_open(dir, &m, &err), QD_ENOTFOUND);
    CHECK_CONTAINS(err.msg, "model-00003-of-00002.safetensors");
    /* Paths out of the directory are refused. */
    write_index(dir, "{\"weight_map\":{\"x\":\"../model-00001-of-00002.safetensors\"}}");
    CHECK_INT(st_model_open(dir, &m, &err), QD_EFORMAT);
    /* The index itself must be JSON with a weight_map. */
    write_index(dir, "{\"weight_map\":");
    CHECK_INT(st_model_open(dir, &m, &err), QD_EFORMAT);
    CHECK_CONTAINS(err.msg, "model.safetensors.index.json");
    /* A bad shard fails the whole open, naming the shard. */
    write_index(dir, "{\"weight_map\":{\"model.layers.0.w\":\"model-00001-of-00002.safetensors\"}}");
    qd_fs_write_atomic(test_path(dir, "model-00001-of-00002.safetensors"), "\x02\0\0\0\0\0\0\0{}", 10, &err);
    CHECK_INT(st_model_open(dir, &m, &err), QD_EFORMAT);
    CHECK_CONTAINS(err.msg, "model-00001-of-00002.safetensors");
    CHECK(m == NULL);
}

static void test_single_and_refused(void)
{
    qd_err err = {0};
    st_model *m = NULL;
    const char *dir = test_fresh_dir("single");
    const char *names[] = {"w"};
    write_shard(test_path(dir, "model.safetensors"), names, 1, 1);
    CHECK_OK(st_model_open(dir, &m, &err));
    CHECK(m && st_model_count(m) == 1);
    CHECK_STR(m ? st_model_shard_of(m, "w") : NULL, "model.safetensors");
    st_model_close(m);
    /* A file path works as a one-shard model too. */
    CHECK_OK(st_model_open(test_path(dir, "model.safetensors"), &m, &err));
    st_model_close(m);

    const char *bin = test_fresh_dir("binonly");
    CHECK_OK(qd_fs_write_atomic(test_path(bin, "pytorch_model.bin"), "PK", 2, &err));
    CHECK_INT(st_model_open(bin, &m, &err), QD_EUNSUPPORTED);
    CHECK_CONTAINS(err.msg, "pytorch_model.bin");
    CHECK_CONTAINS(err.msg, "convert");
    CHECK_CONTAINS(err.msg, "safetensors");

    const char *none = test_fresh_dir("nomodel");
    CHECK_INT(st_model_open(none, &m, &err), QD_ENOTFOUND);
    CHECK_CONTAINS(err.msg, "model.safetensors");
    CHECK_INT(st_model_open(test_path(none, "absent"), &m, &err), QD_ENOTFOUND);
}

static void test_shared_models(void)
{
    const char *d = test_shared_data();
    if (!d) { printf("skip: no shared data for test_shared_models\n"); return; }
    const char *models[] = {"models/stories260K", "models/tiny-llama-c4"};
    for (int k = 0; k < 2; k++) {
        char dir[1024];
        snprintf(dir, sizeof dir, "%s/%s", d, models[k]);
        st_model *m = NULL;
        qd_err err = {0};
        CHECK_OK(st_model_open(dir, &m, &err));
        if (!m) { fprintf(stderr, "%s\n", err.msg); continue; }
        const st_tensor *t = st_model_find(m, "model.embed_tokens.weight");
        CHECK(t != NULL);
        CHECK(st_model_count(m) > 10);
        if (t) {
            CHECK_INT(t->shape[0], 512);
            float *v = malloc(t->numel * sizeof *v);
            CHECK_OK(st_model_read_f32(m, t->name, 2, t->shape, v, &err));
            int finite = 1;
            for (uint64_t i = 0; i < t->numel; i++) finite &= isfinite(v[i]);
            CHECK(finite);
            free(v);
        }
        st_model_close(m);
    }
}

/* ---- fsutil ---- */

static void test_fsutil(void)
{
    qd_err err = {0};
    const char *dir = test_fresh_dir("fs");
    const char *p = test_path(dir, "a.txt");
    CHECK_OK(qd_fs_write_atomic(p, "hello", 5, &err));
    CHECK_OK(qd_fs_write_atomic(p, "bye", 3, &err));   /* replaces */
    char *b = NULL;
    size_t n = 0;
    CHECK_OK(qd_fs_read_file(p, &b, &n, &err));
    CHECK_INT(n, 3);
    CHECK_STR(b, "bye");
    free(b);
    int tmps;
    CHECK_INT(test_count_entries(dir, &tmps), 1);
    CHECK_INT(tmps, 0);

    /* More buffers than IOV_MAX, some empty. */
    enum { K = 3000 };
    static char chars[K];
    static struct iovec iov[K];
    for (int i = 0; i < K; i++) {
        chars[i] = (char)('a' + i % 26);
        iov[i].iov_base = &chars[i];
        iov[i].iov_len = i % 5 == 4 ? 0 : 1;
    }
    CHECK_OK(qd_fs_write_atomic_iov(test_path(dir, "iov.bin"), iov, K, &err));
    CHECK_OK(qd_fs_read_file(test_path(dir, "iov.bin"), &b, &n, &err));
    CHECK_INT(n, K - K / 5);
    int ok = 1;
    for (size_t i = 0, j = 0; i < K; i++)
        if (i % 5 != 4) ok &= b[j++] == chars[i];
    CHECK(ok);
    free(b);

    CHECK_OK(qd_fs_copy_file(test_path(dir, "iov.bin"), test_path(dir, "copy.bin"), &err));
    CHECK(test_files_equal(test_path(dir, "iov.bin"), test_path(dir, "copy.bin")));
    CHECK_INT(test_count_entries(dir, &tmps), 3);
    CHECK_INT(tmps, 0);
    CHECK_ERR(qd_fs_copy_file(test_path(dir, "absent"), test_path(dir, "c2"), &err));
    CHECK_CONTAINS(err.msg, "absent");

    /* A failed write (directory missing) leaves nothing behind and names the path. */
    CHECK_ERR(qd_fs_write_atomic(test_path(dir, "nodir/x"), "x", 1, &err));
    CHECK_CONTAINS(err.msg, "nodir");
    CHECK_INT(test_count_entries(dir, &tmps), 3);

    const char *deep = test_path(dir, "x/y/z/");
    CHECK_OK(qd_fs_mkdir_p(deep, &err));
    CHECK_OK(qd_fs_mkdir_p(deep, &err));
    CHECK(qd_fs_exists(test_path(dir, "x/y/z")));
    CHECK_OK(qd_fs_write_atomic(test_path(dir, "x/y/z/f"), "1", 1, &err));
    CHECK_OK(qd_fs_write_atomic(test_path(dir, "x/y/g"), "1", 1, &err));
    CHECK_ERR(qd_fs_mkdir_p(test_path(dir, "x/y/g/h"), &err));
    CHECK_OK(qd_fs_fsync_parent(test_path(dir, "x/y/g"), &err));
    /* Tree sizes: every regular file below, a link not followed (nor counted), a file alone. */
    CHECK_OK(qd_fs_write_atomic(test_path(dir, "x/big"), chars, 1000, &err));
    CHECK(symlink(test_path(dir, "iov.bin"), test_path(dir, "x/y/link")) == 0);
    CHECK_INT((int64_t)qd_fs_tree_bytes(test_path(dir, "x")), 1002);
    CHECK_INT((int64_t)qd_fs_tree_bytes(test_path(dir, "x/big")), 1000);
    CHECK_INT((int64_t)qd_fs_tree_bytes(test_path(dir, "x/y/link")), 0);
    CHECK_INT((int64_t)qd_fs_tree_bytes(test_path(dir, "absent")), 0);
    CHECK_OK(qd_fs_remove_tree(test_path(dir, "x"), &err));
    CHECK(!qd_fs_exists(test_path(dir, "x")));
    CHECK_OK(qd_fs_remove_tree(test_path(dir, "x"), &err));   /* missing is fine */
    CHECK_ERR(qd_fs_read_file(test_path(dir, "x"), &b, &n, &err));

    uint64_t fb = 0;
    CHECK_OK(qd_fs_free_bytes(dir, &fb, &err));
    CHECK(fb > 0);
}

int main(void)
{
    TEST_RUN(test_golden_mixed_bytes);
    TEST_RUN(test_golden_empty_bytes);
    TEST_RUN(test_golden_mixed_read);
    TEST_RUN(test_golden_values_read);
    TEST_RUN(test_roundtrip_every_dtype);
    TEST_RUN(test_zero_element_tensors);
    TEST_RUN(test_tensor_release);
    TEST_RUN(test_writer_errors);
    TEST_RUN(test_many_tensors);
    TEST_RUN(test_malformed);
    TEST_RUN(test_sharded_model);
    TEST_RUN(test_single_and_refused);
    TEST_RUN(test_shared_models);
    TEST_RUN(test_fsutil);
    return test_finish();
}
