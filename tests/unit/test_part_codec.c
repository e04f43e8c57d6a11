/* The part files' compact float forms (part.h, part_codec.c): each form gives back the
 * very bits written, is taken only where it does (one value off and the array stays F32),
 * and a file that names an unknown form or the wrong size is refused; a part output whose
 * group indices, row block or scale rule the layer cannot have is refused before its codes
 * are decoded. */
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "quant/core/dtype.h"
#include "quant/formats/qlayer.h"
#include "quant/pipeline/part.h"
#include "test_util.h"

static int dirfd_g = -1;
/* The backend the crafted outputs name as their maker (only its desc is read). */
static qd_backend maker_be_s = {.desc = "cpu openblas=test gptq=portable amx=0 threads=1"};
static const qd_backend *maker_be = &maker_be_s;

/* Writes x through the codec and reads it back: returns the form taken, *same whether the
 * bits came back. */
static qd_part_enc round_trip(const float *x, uint64_t n, int64_t k, int *same)
{
    qd_err err = {0};
    qd_part_farr a;
    *same = 0;
    CHECK_OK(qd_part_farr_make("x", x, n, k, &a, &err));
    cJSON *meta = cJSON_CreateObject();
    CHECK_OK(qd_part_farr_note(meta, &a));
    qd_part_arr arr = a.arr;
    CHECK_OK(qd_part_file_write(dirfd_g, "t.part", meta, &arr, 1, NULL, &err));
    qd_part_enc enc = a.enc;
    uint64_t want = enc == QD_PART_ENC_F32 ? n * 4 : enc <= QD_PART_ENC_F16 ? n * 2 : (uint64_t)(k * (k + 1) / 2) * 4;
    CHECK(a.arr.bytes == want);
    qd_part_farr_free(&a);
    cJSON_Delete(meta);
    qd_part_file f;
    CHECK_OK(qd_part_file_read(dirfd_g, "t.part", &f, &err));
    float *y = malloc(n * sizeof *y);
    memset(y, 0x7f, n * sizeof *y);
    CHECK_OK(qd_part_farr_read(&f, "x", y, n, k, &err));
    *same = !memcmp(x, y, n * sizeof *y);
    free(y);
    qd_part_file_free(&f);
    return enc;
}

static void test_halves(void)
{
    enum { N = 1000 };
    float x[N];
    int same;
    for (int i = 0; i < N; i++) x[i] = qd_bf16_to_f32(qd_f32_to_bf16(sinf((float)i) * 3e4f));
    x[7] = -0.0f;
    CHECK_INT(round_trip(x, N, 0, &same), QD_PART_ENC_BF16);
    CHECK(same);
    for (int i = 0; i < N; i++) x[i] = qd_f16_to_f32(qd_f32_to_f16(cosf((float)i) * 100.0f));
    x[3] = 6.0e-8f;              /* an F16 subnormal */
    x[3] = qd_f16_to_f32(qd_f32_to_f16(x[3]));
    CHECK_INT(round_trip(x, N, 0, &same), QD_PART_ENC_F16);
    CHECK(same);
    x[N - 1] = 1.0f + 1.0f / 4096;   /* exact in neither half: the whole array stays F32 */
    CHECK_INT(round_trip(x, N, 0, &same), QD_PART_ENC_F32);
    CHECK(same);
    x[N - 1] = 1e30f;                /* beyond F16, and not a BF16 */
    CHECK_INT(round_trip(x, N, 0, &same), QD_PART_ENC_F32);
    CHECK(same);
}

static void test_triangles(void)
{
    const int64_t ks[] = {1, 5, 64, 65, 130};
    for (size_t t = 0; t < sizeof ks / sizeof ks[0]; t++) {
        int64_t k = ks[t];
        float *m = malloc((size_t)(k * k) * sizeof *m);
        int same;
        for (int64_t i = 0; i < k; i++)
            for (int64_t j = i; j < k; j++) m[i * k + j] = m[j * k + i] = (float)(i * 7 + j) / 3.0f;
        CHECK_INT(round_trip(m, (uint64_t)(k * k), k, &same), QD_PART_ENC_UPPER_SYM);
        CHECK(same);
        for (int64_t i = 0; i < k; i++)
            for (int64_t j = 0; j < i; j++) m[i * k + j] = 0.0f;
        /* k = 1 has no lower triangle: it is symmetric first */
        CHECK_INT(round_trip(m, (uint64_t)(k * k), k, &same), k == 1 ? QD_PART_ENC_UPPER_SYM : QD_PART_ENC_UPPER_ZERO);
        CHECK(same);
        if (k > 1) {
            m[(k - 1) * k] = -0.0f;  /* a negative zero is not +0.0: kept whole */
            CHECK_INT(round_trip(m, (uint64_t)(k * k), k, &same), QD_PART_ENC_F32);
            CHECK(same);
            m[(k - 1) * k] = 0.0f;
            m[k - 1] = nextafterf(m[k - 1], 1e9f);   /* one entry off symmetric, lower zero: still the zero form */
            CHECK_INT(round_trip(m, (uint64_t)(k * k), k, &same), QD_PART_ENC_UPPER_ZERO);
            CHECK(same);
            for (int64_t i = 0; i < k; i++)
                for (int64_t j = 0; j < i; j++) m[i * k + j] = m[j * k + i];
            m[k * k - 2] = nextafterf(m[k * k - 2], -1e9f);   /* lower off by one ulp: F32 */
            CHECK_INT(round_trip(m, (uint64_t)(k * k), k, &same), QD_PART_ENC_F32);
            CHECK(same);
        }
        free(m);
    }
}

/* A file naming an unknown form, or a triangle where a vector belongs, is refused. */
static void test_refused(void)
{
    qd_err err = {0};
    float v[4] = {1, 2, 3, 4}, y[4];
    qd_part_arr arr = {"x", v, sizeof v};
    cJSON *meta = cJSON_CreateObject();
    cJSON_AddStringToObject(cJSON_AddObjectToObject(meta, "enc"), "x", "f8");
    CHECK_OK(qd_part_file_write(dirfd_g, "t.part", meta, &arr, 1, NULL, &err));
    qd_part_file f;
    CHECK_OK(qd_part_file_read(dirfd_g, "t.part", &f, &err));
    CHECK_INT(qd_part_farr_read(&f, "x", y, 4, 0, &err), QD_EFORMAT);
    CHECK(strstr(err.msg, "unknown encoding") != NULL);
    qd_part_file_free(&f);
    cJSON_Delete(meta);
    meta = cJSON_CreateObject();
    cJSON_AddStringToObject(cJSON_AddObjectToObject(meta, "enc"), "x", "upper_sym");
    CHECK_OK(qd_part_file_write(dirfd_g, "t.part", meta, &arr, 1, NULL, &err));
    CHECK_OK(qd_part_file_read(dirfd_g, "t.part", &f, &err));
    CHECK_INT(qd_part_farr_read(&f, "x", y, 4, 0, &err), QD_EFORMAT);
    CHECK_INT(qd_part_farr_read(&f, "x", y, 4, 3, &err), QD_EFORMAT);   /* 3 x 3 is not 4 values */
    CHECK_INT(qd_part_farr_read(&f, "x", y, 4, 2, &err), QD_EFORMAT);   /* 2 x 2's triangle is 3 values, not 4 */
    qd_part_file_free(&f);
    cJSON_Delete(meta);
}

/* A part's output file as a worker writes it (part_quant.c's write_out), for a [4, 8] layer
 * of 4 bits in groups of 4, its rows decoded from the codes by the reader; the fields named
 * are then set to what a damaged or hostile file could hold. */
static int read_crafted(int32_t g_idx3, double row_block, double rule, double gscale, float *dq)
{
    enum { ROWS = 4, K = 8, G = 2, R_COUNT = 11 };   /* part_quant.c's result record: 11 doubles */
    uint8_t q[ROWS * K];
    float scales[G * ROWS];
    int32_t zeros[G * ROWS], g_idx[K];
    double res[R_COUNT] = {0}, stage[QD_STAGE_COUNT] = {0}, trace[2] = {0};
    for (int i = 0; i < ROWS * K; i++) q[i] = (uint8_t)(i % 16);
    for (int i = 0; i < G * ROWS; i++) { scales[i] = 0.5f + (float)i; zeros[i] = 8; }
    for (int c = 0; c < K; c++) g_idx[c] = c / 4;
    g_idx[3] = g_idx3;
    res[9] = ROWS;
    res[10] = K;
    cJSON *meta = cJSON_CreateObject();
    cJSON_AddStringToObject(meta, "in_checksum", "00000000000000aa");
    cJSON_AddStringToObject(meta, "worker", "w1");
    char maker[160];
    qd_part_maker_desc(maker_be, maker, sizeof maker);
    cJSON_AddStringToObject(meta, "made_by", maker);
    cJSON_AddStringToObject(meta, "name", "l");
    cJSON_AddStringToObject(meta, "method", "rtn");
    cJSON_AddStringToObject(meta, "note", "");
    double lv[] = {ROWS, K, 4, 1, 4, G, 0, rule, gscale, row_block};
    cJSON_AddItemToObject(meta, "layer", cJSON_CreateDoubleArray(lv, 10));
    cJSON_AddBoolToObject(meta, "dq_from_codes", 1);
    qd_part_arr a[] = {{"res", res, sizeof res}, {"stage", stage, sizeof stage}, {"trace", trace, sizeof trace},
                       {"q", q, sizeof q}, {"scales", scales, sizeof scales}, {"zeros", zeros, sizeof zeros},
                       {"g_idx", g_idx, sizeof g_idx}};
    char name[96];
    qd_qpart_name_out(name, sizeof name, 0, 0, 0xaa, maker);
    qd_err err = {0};
    CHECK_OK(qd_part_file_write(dirfd_g, name, meta, a, 7, NULL, &err));
    cJSON_Delete(meta);
    qd_qpart_in in;
    memset(&in, 0, sizeof in);
    in.r0 = 0;
    in.r1 = ROWS;
    in.res.n = ROWS;
    in.res.k = K;
    qd_qpart_out out;
    char worker[64];
    int rc = qd_qpart_read_out(dirfd_g, 0, 0, 0xaa, maker_be, &in, &out, worker, &err);
    if (!rc) {
        memcpy(dq, out.dq.w, sizeof(float) * ROWS * K);
        /* what the reader decoded is the layer's own decode */
        float ref[ROWS * K];
        qd_qlayer_dequant_ref(&out.layer, ref);
        CHECK(!memcmp(ref, dq, sizeof ref));
        qd_qpart_out_free(&out);
    }
    return rc;
}

/* The lead decodes a part's rows from the file's codes: a group index, row block or global
 * scale the layer cannot have is refused before any decoding. */
static void test_out_refused(void)
{
    float dq[32];
    CHECK_OK(read_crafted(0, 1, 0, 0, dq));
    CHECK(dq[1] == 0.5f * (1.0f - 8.0f));         /* row 0, column 1: scale 0.5, code 1, zero 8 */
    CHECK(dq[8 + 4] == 5.5f * (12.0f - 8.0f));    /* row 1, column 4 (group 1): scales[1 * 4 + 1] */
    CHECK_INT(read_crafted(2, 1, 0, 0, dq), QD_EFORMAT);     /* group 2 of 2 */
    CHECK_INT(read_crafted(-1, 1, 0, 0, dq), QD_EFORMAT);
    CHECK_INT(read_crafted(0, -2, 0, 0, dq), QD_EFORMAT);    /* row block */
    CHECK_INT(read_crafted(0, 1.5, 0, 0, dq), QD_EFORMAT);
    CHECK_INT(read_crafted(0, 1, 7, 0, dq), QD_EFORMAT);     /* no such scale rule */
    CHECK_INT(read_crafted(0, 1, 2, 0, dq), QD_EFORMAT);     /* NVFP4's rule without a global scale */
}

int main(void)
{
    char tmpl[] = "/tmp/qd-part-codec-XXXXXX";
    if (!mkdtemp(tmpl)) return 1;
    dirfd_g = open(tmpl, O_RDONLY | O_DIRECTORY);
    TEST_RUN(test_halves);
    TEST_RUN(test_triangles);
    TEST_RUN(test_refused);
    TEST_RUN(test_out_refused);
    qd_part_files_remove(dirfd_g, NULL);
    close(dirfd_g);
    rmdir(tmpl);
    return test_finish();
}
