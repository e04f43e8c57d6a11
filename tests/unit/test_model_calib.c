/* Calibration sampling: deterministic seeded random windows that are true sub-windows of
 * the stream, AWQ blocks, seq_len clamping, clear errors for a corpus too small, and (with
 * ../shared/data) JSONL documents tokenized as the C4 golden ids say; the AWQ style's
 * seeded document shuffle (a permutation, reproducible, different per seed). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/core/fsutil.h"
#include "quant/model/calib.h"
#include "quant/model/token_file.h"
#include "test_util.h"

static void test_random_windows(void)
{
    size_t n = 1000;
    int32_t *ids = malloc(n * sizeof *ids);
    for (size_t i = 0; i < n; i++) ids[i] = (int32_t)i;
    int64_t S = 50, L = 64;
    int32_t *a = malloc((size_t)(S * L) * 4), *b = malloc((size_t)(S * L) * 4);
    qd_err err = {0};
    CHECK_OK(qd_calib_sample_random(ids, n, S, L, 7, a, &err));
    CHECK_OK(qd_calib_sample_random(ids, n, S, L, 7, b, &err));
    CHECK(!memcmp(a, b, (size_t)(S * L) * 4));
    int distinct = 0;
    for (int64_t s = 0; s < S; s++) {
        int32_t st = a[s * L];
        CHECK(st >= 0 && st <= (int32_t)(n - L - 1));
        for (int64_t j = 1; j < L; j++) if (a[s * L + j] != st + j) { CHECK(0); break; }
        if (s && st != a[(s - 1) * L]) distinct++;
    }
    CHECK(distinct > S / 2);
    CHECK_OK(qd_calib_sample_random(ids, n, S, L, 8, b, &err));
    CHECK(memcmp(a, b, (size_t)(S * L) * 4) != 0);
    /* Exactly seq_len + 1 tokens: the only start is 0. */
    CHECK_OK(qd_calib_sample_random(ids, (size_t)L + 1, 3, L, 1, b, &err));
    CHECK_INT(b[0], 0);
    CHECK_INT(b[2 * L], 0);
    /* Too small: an error naming both sizes, never a loop. */
    CHECK_INT(qd_calib_sample_random(ids, (size_t)L, 3, L, 1, b, &err), QD_EINVAL);
    CHECK_CONTAINS(err.msg, "64");
    CHECK_OK(qd_calib_sample_blocks(ids, n, 15, L, a, &err));
    CHECK_INT(a[14 * L + 63], 14 * 64 + 63);
    CHECK_INT(qd_calib_sample_blocks(ids, n, 16, L, a, &err), QD_EINVAL);
    CHECK_CONTAINS(err.msg, "1000 tokens");
    free(ids);
    free(a);
    free(b);
}

static void test_token_file_and_clamp(void)
{
    size_t n = 3000;
    int32_t *ids = malloc(n * sizeof *ids);
    for (size_t i = 0; i < n; i++) ids[i] = (int32_t)(i % 500);
    qd_err err = {0};
    const char *path = test_path(test_tmpdir(), "calib.json");
    CHECK_OK(qd_token_file_write_json(path, ids, n, &err));
    qd_calib_opts o = qd_calib_opts_default();
    o.path = path;
    o.n_samples = 4;
    o.seq_len = 4096;
    o.max_pos = 256;
    o.seed = 3;
    qd_calib_set s;
    CHECK_OK(qd_calib_load(&o, NULL, &s, &err));
    CHECK_INT(s.seq_len, 256);
    CHECK_INT(s.n_samples, 4);
    CHECK_INT(s.corpus_tokens, 3000);
    int32_t st = s.ids[256];
    CHECK_INT(s.ids[256 + 255], (st + 255) % 500);
    qd_calib_free(&s);
    o.style = QD_CALIB_AWQ;
    o.n_samples = 11;
    CHECK_OK(qd_calib_load(&o, NULL, &s, &err));   /* one document: cut from its start */
    CHECK_INT(s.ids[10 * 256], (10 * 256) % 500);
    qd_calib_free(&s);
    o.n_samples = 12;
    CHECK_INT(qd_calib_load(&o, NULL, &s, &err), QD_EINVAL);
    CHECK(s.ids == NULL);
    qd_calib_free(&s);
    o.path = test_path(test_tmpdir(), "calib.txt");
    CHECK_INT(qd_calib_load(&o, NULL, &s, &err), QD_EINVAL);   /* text without a tokenizer */
    free(ids);
}

static void test_shuffle_order(void)
{
    enum { N = 50 };
    size_t a[N], b[N], c[N];
    int seen[N] = {0}, moved = 0;
    qd_calib_shuffle_order(N, 0, a);
    qd_calib_shuffle_order(N, 0, b);
    qd_calib_shuffle_order(N, 1, c);
    for (int i = 0; i < N; i++) {
        CHECK(a[i] < N);
        if (a[i] < N) seen[a[i]]++;
        moved += a[i] != (size_t)i;
    }
    for (int i = 0; i < N; i++) CHECK_INT(seen[i], 1);    /* a permutation */
    CHECK(moved > N / 2);                                   /* seed 0 shuffles too */
    CHECK(!memcmp(a, b, sizeof a));                         /* reproducible */
    CHECK(memcmp(a, c, sizeof a) != 0);                     /* the seed matters */
    qd_calib_shuffle_order(1, 7, a);
    CHECK_INT(a[0], 0);
}

static int32_t *read_json_ids(const char *path, size_t *n)
{
    int32_t *ids = NULL;
    qd_err err = {0};
    if (qd_token_file_read(path, &ids, n, &err)) return NULL;
    return ids;
}

static void test_c4_jsonl(void)
{
    const char *data = test_shared_data();
    if (!data) { fprintf(stderr, "shared data absent: skipping the C4 check\n"); return; }
    qd_err err = {0};
    qd_tokenizer *tok = NULL;
    CHECK_OK(qd_tokenizer_load(test_path(data, "models/stories260K"), &tok, &err));
    if (!tok) return;
    size_t ng = 0;
    int32_t *gold = read_json_ids(test_path(data, "goldens/tok512/c4_doc0.ids.json"), &ng);
    CHECK_INT(ng, 1135);
    /* Document 0 alone (its 1135 ids cover four blocks of 256): the golden ids, BOS first. */
    char *buf = NULL;
    size_t len = 0;
    CHECK_OK(qd_fs_read_file(test_path(data, "text/c4/c4-calib.jsonl"), &buf, &len, &err));
    const char *nl = buf ? memchr(buf, '\n', len) : NULL;
    const char *one = test_path(test_tmpdir(), "doc0.jsonl");
    CHECK(nl && !qd_fs_write_atomic(one, buf, (size_t)(nl - buf + 1), &err));
    free(buf);
    qd_calib_opts o = qd_calib_opts_default();
    o.path = one;
    o.style = QD_CALIB_AWQ;
    o.n_samples = 4;
    o.seq_len = 256;
    qd_calib_set s, s2;
    CHECK_OK(qd_calib_load(&o, tok, &s, &err));
    CHECK(s.ids && gold && !memcmp(s.ids, gold, 1024 * 4));
    qd_calib_free(&s);
    /* The whole file: shuffled documents, the same for the same seed, BOS starts block 0. */
    o.path = test_path(data, "text/c4/c4-calib.jsonl");
    o.n_samples = 8;
    CHECK_OK(qd_calib_load(&o, tok, &s, &err));
    CHECK_OK(qd_calib_load(&o, tok, &s2, &err));
    CHECK(s.ids && s2.ids && !memcmp(s.ids, s2.ids, 2048 * 4));
    CHECK(s.ids && gold && s.ids[0] == gold[0] && memcmp(s.ids, gold, 1024 * 4) != 0);
    CHECK(s.docs >= 1 && s.docs < 40);                        /* stopped tokenizing early */
    qd_calib_free(&s2);
    o.seed = 1;
    CHECK_OK(qd_calib_load(&o, tok, &s2, &err));
    CHECK(s.ids && s2.ids && memcmp(s.ids, s2.ids, 2048 * 4) != 0);
    qd_calib_free(&s);
    qd_calib_free(&s2);
    o.field = "missing";
    CHECK_INT(qd_calib_load(&o, tok, &s, &err), QD_EFORMAT);
    CHECK_CONTAINS(err.msg, "is not a JSON object with a \"missing\" string");
    free(gold);
    qd_tokenizer_free(tok);
}

int main(void)
{
    TEST_RUN(test_random_windows);
    TEST_RUN(test_token_file_and_clamp);
    TEST_RUN(test_shuffle_order);
    TEST_RUN(test_c4_jsonl);
    return test_finish();
}
