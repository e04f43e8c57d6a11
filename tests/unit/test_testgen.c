/* testgen (quantctl gen-model's generator), which writes tensor by tensor from each tensor's
 * place in the seed's sequence: its files hash to what the whole-model-in-memory generator
 * wrote before (goldens taken from that build, commit 591a143), a model sharded by size
 * holds byte for byte the same tensors with a correct index, an earlier model's files are
 * removed when the layout changes, and the generator's jump ahead equals drawing. */
#include "test_util.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "quant/core/fsutil.h"
#include "quant/core/rng.h"
#include "quant/core/safetensors.h"
#include "quant/model/testgen.h"

static uint64_t file_fnv1a(const char *path)
{
    char *b = NULL;
    size_t n = 0;
    qd_err err = {0};
    if (qd_fs_read_file(path, &b, &n, &err)) return 0;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)b[i]) * 1099511628211ull;
    free(b);
    return h;
}

static const char *gen(const char *name, const qd_testgen_opts *o)
{
    static char dirs[8][1024];
    static int slot;
    char *dir = dirs[slot++ & 7];
    snprintf(dir, 1024, "%s", test_path(test_tmpdir(), name));
    qd_err err = {0};
    int rc = qd_testgen_write(dir, o, &err);
    if (rc) fprintf(stderr, "testgen %s: %s\n", name, err.msg);
    CHECK_OK(rc);
    return dir;
}

/* FNV-1a of model.safetensors as the pre-streaming build wrote it for the same options
 * (quantctl gen-model with the options in each comment). */
static void test_bytes_unchanged(void)
{
    qd_testgen_opts o = qd_testgen_defaults(QD_ARCH_LLAMA);   /* (no options) */
    CHECK_INT(file_fnv1a(test_path(gen("g1", &o), "model.safetensors")), 0xb565659ae713e6b4ull);
    o.n_experts = 4;                                          /* --experts 4 --top-k 2 --dtype bf16 --seed 7 */
    o.top_k = 2;
    o.dtype = QD_DTYPE_BF16;
    o.seed = 7;
    CHECK_INT(file_fnv1a(test_path(gen("g2", &o), "model.safetensors")), 0x298ccf2c19f3a5ceull);
    o = qd_testgen_defaults(QD_ARCH_OPT);                     /* --arch opt --dtype f16 --layers 3 --hidden 128 */
    o.dtype = QD_DTYPE_F16;
    o.n_layers = 3;
    o.hidden = 128;
    o.intermediate = 320;
    CHECK_INT(file_fnv1a(test_path(gen("g3", &o), "model.safetensors")), 0xa71fb43bc9734f48ull);
    o = qd_testgen_defaults(QD_ARCH_LLAMA);   /* --layers 1 --hidden 256 --intermediate 512 --heads 4 --kv-heads 2
                                                 --vocab 300 --dtype f16 --seed 5: odd value counts */
    o.n_layers = 1;
    o.hidden = 256;
    o.intermediate = 512;
    o.vocab = 300;
    o.dtype = QD_DTYPE_F16;
    o.seed = 5;
    CHECK_INT(file_fnv1a(test_path(gen("g4", &o), "model.safetensors")), 0x0e0c6aaf8b64b5b9ull);
}

/* Every tensor of a equals b's, in the same dtype and shape, wherever b's shards put it. */
static void check_same_tensors(const char *a_dir, const char *b_dir)
{
    qd_err err = {0};
    st_model *a = NULL, *b = NULL;
    CHECK_OK(st_model_open(a_dir, &a, &err));
    CHECK_OK(st_model_open(b_dir, &b, &err));
    if (!a || !b) { st_model_close(a); st_model_close(b); return; }
    CHECK_INT(st_model_count(a), st_model_count(b));
    int same = 1;
    for (size_t i = 0; i < st_model_count(a); i++) {
        const st_tensor *x = st_model_tensor(a, i), *y = st_model_find(b, x->name);
        same &= y && x->dtype == y->dtype && x->numel == y->numel && x->end - x->begin == y->end - y->begin &&
                memcmp(x->data, y->data, x->end - x->begin) == 0;
    }
    CHECK(same);
    st_model_close(a);
    st_model_close(b);
}

static void test_sharded_by_size(void)
{
    qd_testgen_opts o = qd_testgen_defaults(QD_ARCH_LLAMA);
    o.dtype = QD_DTYPE_F16;
    const char *one = gen("one", &o);
    o.shard_size = 40000;   /* bytes: the 128 x 64 embedding (16 KiB) plus a few layers' worth */
    const char *sh = gen("sharded", &o);
    CHECK(!qd_fs_exists(test_path(sh, "model.safetensors")));
    check_same_tensors(one, sh);

    /* The index: total_size is the data of all shards, the weight_map names the shard that
     * holds each tensor, and no shard holds more than shard_size unless it is one tensor. */
    char *text = NULL;
    size_t len = 0;
    qd_err err = {0};
    CHECK_OK(qd_fs_read_file(test_path(sh, "model.safetensors.index.json"), &text, &len, &err));
    cJSON *idx = text ? cJSON_Parse(text) : NULL;
    free(text);
    CHECK(idx != NULL);
    if (!idx) return;
    cJSON *map = cJSON_GetObjectItem(idx, "weight_map");
    double total = cJSON_GetNumberValue(cJSON_GetObjectItem(cJSON_GetObjectItem(idx, "metadata"), "total_size"));
    uint64_t sum = 0;
    int n_map = cJSON_GetArraySize(map), counted = 0, n = 0;
    /* 7 shards by transformers' rule: e.g. the first holds the embedding and layer 0's norm,
     * q, k and v (32896 bytes), as o_proj would take it to 41088. */
    const char *first = cJSON_GetStringValue(cJSON_GetObjectItem(map, "model.embed_tokens.weight"));
    CHECK(first && sscanf(first, "model-00001-of-%5d.safetensors", &n) == 1);
    CHECK_INT(n, 7);
    for (int s = 1; s <= n; s++) {
        char name[64];
        snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s, n);
        st_file *f = NULL;
        CHECK_OK(st_file_open(test_path(sh, name), &f, &err));
        if (!f) continue;
        uint64_t bytes = 0;
        for (size_t i = 0; i < st_file_count(f); i++) {
            const st_tensor *t = st_file_tensor(f, i);
            bytes += t->end - t->begin;
            const cJSON *where = cJSON_GetObjectItem(map, t->name);
            CHECK_STR(cJSON_GetStringValue(where), name);
            counted++;
        }
        CHECK(bytes <= o.shard_size || st_file_count(f) == 1);
        sum += bytes;
        st_file_close(f);
    }
    CHECK_INT(counted, n_map);
    CHECK_INT((uint64_t)total, sum);
    cJSON_Delete(idx);

    /* Back to one file in the same directory: the index and shards go, the bytes are the
     * unsharded model's. */
    o.shard_size = 0;
    gen("sharded", &o);
    int n_shard_files = 0;
    for (int s = 1; s <= n; s++) {
        char name[64];
        snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s, n);
        n_shard_files += qd_fs_exists(test_path(sh, name));
    }
    CHECK_INT(n_shard_files, 0);
    CHECK(!qd_fs_exists(test_path(sh, "model.safetensors.index.json")));
    CHECK_INT(file_fnv1a(test_path(sh, "model.safetensors")), file_fnv1a(test_path(one, "model.safetensors")));
}

static void test_rng_skip(void)
{
    for (uint64_t n = 0; n < 70; n += 7) {
        uint64_t s = 12345;
        for (uint64_t i = 0; i < n; i++) (void)qd_splitmix64(&s);
        CHECK_INT(qd_splitmix64_skip(12345, n), s);
    }
    uint64_t s = UINT64_MAX - 3;   /* wraps as the additions do */
    (void)qd_splitmix64(&s);
    CHECK_INT(qd_splitmix64_skip(UINT64_MAX - 3, 1), s);
}

int main(void)
{
    TEST_RUN(test_bytes_unchanged);
    TEST_RUN(test_sharded_by_size);
    TEST_RUN(test_rng_skip);
    return test_finish();
}
