/* Streamed safetensors writing and HF sharding: a file streamed in pieces of any size is
 * byte for byte the one st_writer_write makes, a stream that goes wrong (too many bytes,
 * too few, freed half way) leaves neither the file nor its temp, the atomic file handle
 * commits or leaves the old file alone, and the shard plan follows transformers' rule with
 * an index that names every tensor's shard. */
#include "test_util.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "quant/core/fsutil.h"
#include "quant/core/safetensors.h"

/* Four tensors of three dtypes, added out of data order. */
enum { N_T = 4 };
static const char *T_NAME[N_T] = {"b.weight", "a.weight", "c.scale", "d.bytes"};
static const qd_dtype T_DTYPE[N_T] = {QD_DTYPE_F16, QD_DTYPE_F32, QD_DTYPE_F32, QD_DTYPE_U8};
static const int64_t T_SHAPE[N_T][2] = {{3, 5}, {7, 2}, {1, 1}, {3, 3}};
static unsigned char t_data[N_T][64];

static size_t t_bytes(int i) { return (size_t)(T_SHAPE[i][0] * T_SHAPE[i][1]) * qd_dtype_size(T_DTYPE[i]); }

static void test_stream_equals_write(void)
{
    qd_err err = {0};
    for (int i = 0; i < N_T; i++)
        for (size_t j = 0; j < sizeof t_data[i]; j++) t_data[i][j] = (unsigned char)(31 * i + 7 * j);
    const char *dir = test_fresh_dir("stream");
    st_writer *w;
    CHECK_OK(st_writer_init(&w));
    for (int i = 0; i < N_T; i++) CHECK_OK(st_writer_add(w, T_NAME[i], T_DTYPE[i], 2, T_SHAPE[i], t_data[i], &err));
    CHECK_OK(st_writer_write(w, test_path(dir, "whole.safetensors"), &err));
    st_writer_free(w);

    for (size_t piece = 1; piece <= 64; piece *= 4) {
        CHECK_OK(st_writer_init(&w));
        for (int i = 0; i < N_T; i++) CHECK_OK(st_writer_declare(w, T_NAME[i], T_DTYPE[i], 2, T_SHAPE[i], &err));
        CHECK_INT(st_writer_tensor_at(w, 0), (size_t)-1);   /* no order before begin */
        const char *p = test_path(dir, "streamed.safetensors");
        CHECK_OK(st_writer_begin(w, p, &err));
        /* Data order: F32 before F16 before U8 (the library's dtype rank), then by name. */
        CHECK_INT(st_writer_tensor_at(w, 0), 1);
        CHECK_INT(st_writer_tensor_at(w, 1), 2);
        CHECK_INT(st_writer_tensor_at(w, 2), 0);
        CHECK_INT(st_writer_tensor_at(w, 3), 3);
        CHECK_INT(st_writer_tensor_at(w, 4), (size_t)-1);
        for (size_t k = 0; k < N_T; k++) {
            size_t i = st_writer_tensor_at(w, k), n = t_bytes((int)i);
            for (size_t off = 0; off < n; off += piece)
                CHECK_OK(st_writer_append(w, t_data[i] + off, n - off < piece ? n - off : piece, &err));
        }
        CHECK_OK(st_writer_finish(w, &err));
        st_writer_free(w);
        CHECK(test_files_equal(p, test_path(dir, "whole.safetensors")));
    }
    CHECK_INT(test_count_entries(dir, NULL), 2);   /* no temp files left */
}

static void test_stream_errors(void)
{
    qd_err err = {0};
    const char *dir = test_fresh_dir("stream_bad");
    const char *p = test_path(dir, "x.safetensors");
    int64_t shape[1] = {4};
    float x[5] = {1, 2, 3, 4, 5};
    st_writer *w;

    /* A declared tensor has no data for st_writer_write. */
    CHECK_OK(st_writer_init(&w));
    CHECK_OK(st_writer_declare(w, "t", QD_DTYPE_F32, 1, shape, &err));
    CHECK_ERR(st_writer_write(w, p, &err));
    CHECK_CONTAINS(err.msg, "declared without data");
    CHECK_ERR(st_writer_append(w, x, 4, &err));
    CHECK_CONTAINS(err.msg, "without st_writer_begin");

    /* Past the end: refused, and the stream is over. */
    CHECK_OK(st_writer_begin(w, p, &err));
    CHECK_ERR(st_writer_add(w, "late", QD_DTYPE_F32, 1, shape, x, &err));
    CHECK_CONTAINS(err.msg, "after st_writer_begin");
    CHECK_ERR(st_writer_append(w, x, 20, &err));
    CHECK_CONTAINS(err.msg, "past the 16 bytes");
    CHECK_ERR(st_writer_finish(w, &err));
    CHECK_INT(test_count_entries(dir, NULL), 0);

    /* Too few bytes: finish refuses and removes the temp file. */
    CHECK_OK(st_writer_begin(w, p, &err));
    CHECK_OK(st_writer_append(w, x, 12, &err));
    CHECK_ERR(st_writer_finish(w, &err));
    CHECK_CONTAINS(err.msg, "12 of 16 bytes");
    CHECK_INT(test_count_entries(dir, NULL), 0);

    /* Freed half way: nothing stays. */
    CHECK_OK(st_writer_begin(w, p, &err));
    CHECK_OK(st_writer_append(w, x, 8, &err));
    CHECK_INT(test_count_entries(dir, NULL), 1);   /* the temp file */
    st_writer_free(w);
    CHECK_INT(test_count_entries(dir, NULL), 0);
}

static void test_atomic_file(void)
{
    qd_err err = {0};
    const char *dir = test_fresh_dir("atomic");
    const char *p = test_path(dir, "f.txt");
    CHECK_OK(qd_fs_write_atomic(p, "old", 3, &err));
    qd_fs_atomic *a = NULL;
    CHECK_OK(qd_fs_atomic_open(p, &a, &err));
    CHECK_OK(qd_fs_atomic_write(a, "ne", 2, &err));
    qd_fs_atomic_abort(a);   /* the old file stays, the temp goes */
    qd_fs_atomic_abort(NULL);
    char *b = NULL;
    size_t n = 0;
    CHECK_OK(qd_fs_read_file(p, &b, &n, &err));
    CHECK_STR(b, "old");
    free(b);
    CHECK_INT(test_count_entries(dir, NULL), 1);
    CHECK_OK(qd_fs_atomic_open(p, &a, &err));
    CHECK_OK(qd_fs_atomic_write(a, "ne", 2, &err));
    CHECK_OK(qd_fs_atomic_write(a, "w", 1, &err));
    CHECK_OK(qd_fs_atomic_commit(a, &err));
    CHECK_OK(qd_fs_read_file(p, &b, &n, &err));
    CHECK_STR(b, "new");
    free(b);
    CHECK_INT(test_count_entries(dir, NULL), 1);
    CHECK_ERR(qd_fs_atomic_open(test_path(dir, "no/such/f"), &a, &err));
    CHECK(a == NULL);
}

static void test_shard_plan(void)
{
    st_shard_plan p;
    char name[64];
    /* transformers' rule: a shard closes when the next tensor would pass the limit; 20 > 10
     * gets a shard of its own. */
    const uint64_t bytes[6] = {5, 5, 5, 20, 1, 1};
    CHECK_OK(st_shard_plan_by_size(bytes, 6, 10, &p));
    CHECK_INT(p.n_shards, 4);
    const size_t want[5] = {0, 2, 3, 4, 6};
    for (int i = 0; i < 5; i++) CHECK_INT(p.start[i], want[i]);
    CHECK_INT(p.total_bytes, 37);
    st_shard_file_name(&p, 2, name, sizeof name);
    CHECK_STR(name, "model-00003-of-00004.safetensors");

    /* The index: total_size and each name's shard. */
    qd_err err = {0};
    const char *dir = test_fresh_dir("index");
    const char *names[6] = {"a", "b", "c", "d", "e", "f"};
    CHECK_OK(st_shard_index_write(dir, &p, names, &err));
    char *text = NULL;
    size_t n = 0;
    CHECK_OK(qd_fs_read_file(test_path(dir, "model.safetensors.index.json"), &text, &n, &err));
    cJSON *idx = text ? cJSON_Parse(text) : NULL;
    free(text);
    CHECK(idx != NULL);
    if (idx) {
        CHECK_INT(cJSON_GetNumberValue(cJSON_GetObjectItem(cJSON_GetObjectItem(idx, "metadata"), "total_size")), 37);
        cJSON *map = cJSON_GetObjectItem(idx, "weight_map");
        CHECK_INT(cJSON_GetArraySize(map), 6);
        CHECK_STR(cJSON_GetStringValue(cJSON_GetObjectItem(map, "b")), "model-00001-of-00004.safetensors");
        CHECK_STR(cJSON_GetStringValue(cJSON_GetObjectItem(map, "d")), "model-00003-of-00004.safetensors");
        CHECK_STR(cJSON_GetStringValue(cJSON_GetObjectItem(map, "f")), "model-00004-of-00004.safetensors");
        cJSON_Delete(idx);
    }
    st_shard_plan_free(&p);

    /* No limit, or nothing to split: one shard, named model.safetensors. */
    CHECK_OK(st_shard_plan_by_size(bytes, 6, 0, &p));
    CHECK_INT(p.n_shards, 1);
    CHECK_INT(p.start[1], 6);
    st_shard_file_name(&p, 0, name, sizeof name);
    CHECK_STR(name, "model.safetensors");
    st_shard_plan_free(&p);
    CHECK_OK(st_shard_plan_by_size(bytes, 0, 10, &p));
    CHECK_INT(p.n_shards, 1);
    CHECK_INT(p.start[1], 0);
    st_shard_plan_free(&p);

    /* By count: s * n / n_shards, clamped to the tensor count. */
    CHECK_OK(st_shard_plan_by_count(bytes, 6, 4, &p));
    CHECK_INT(p.n_shards, 4);
    const size_t want_c[5] = {0, 1, 3, 4, 6};
    for (int i = 0; i < 5; i++) CHECK_INT(p.start[i], want_c[i]);
    st_shard_plan_free(&p);
    CHECK_OK(st_shard_plan_by_count(bytes, 2, 9, &p));
    CHECK_INT(p.n_shards, 2);
    st_shard_plan_free(&p);
    st_shard_plan_free(NULL);
}

int main(void)
{
    TEST_RUN(test_stream_equals_write);
    TEST_RUN(test_stream_errors);
    TEST_RUN(test_atomic_file);
    TEST_RUN(test_shard_plan);
    return test_finish();
}
