/* Loading quantized output directories: a tiny random llama is quantized here with RTN
 * and packed with the format table (gptq sym, gptq_v2 asym, awq_gemm), written as a
 * checkpoint with quantization_config, and opened again: every linear the loader
 * dequantizes must equal the qlayer's dequantized weights, and the forward must match a
 * float checkpoint holding those same weights. */
#include <stdlib.h>

#include "quant/core/fsutil.h"
#include "quant/core/safetensors.h"
#include "quant/formats/format.h"
#include "quant/formats/quantizer.h"
#include "quant/model/block.h"
#include "quant/model/testgen.h"
#include "test_util.h"

static qd_backend *be;

static int is_linear_weight(const char *name)
{
    static const char *lin[] = {"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight",
                                "gate_proj.weight", "up_proj.weight", "down_proj.weight"};
    if (strncmp(name, "model.layers.", 13)) return 0;
    for (size_t i = 0; i < sizeof lin / sizeof lin[0]; i++) {
        size_t a = strlen(name), b = strlen(lin[i]);
        if (a > b && !strcmp(name + a - b, lin[i])) return 1;
    }
    return 0;
}

/* Writes src quantized with fmt into qdir and the dequantized weights as F32 into fdir. */
static void quantize_dir(const char *src, const char *fmt_name, int sym, const char *qdir, const char *fdir)
{
    qd_err err = {0};
    st_model *st = NULL;
    CHECK_OK(st_model_open(src, &st, &err));
    if (!st) return;
    const qd_format *fmt = qd_format_find(fmt_name);
    CHECK(fmt != NULL);
    qd_quant_cfg qc = qd_quant_cfg_default();
    qc.bits = 4;
    qc.group_size = 32;
    qc.sym = sym;
    qc.zero_min1 = !strcmp(fmt_name, "gptq") && !sym;
    st_writer *wq = NULL, *wf = NULL;
    CHECK_OK(st_writer_init(&wq));
    CHECK_OK(st_writer_init(&wf));
    CHECK_OK(qd_fs_mkdir_p(qdir, &err));
    CHECK_OK(qd_fs_mkdir_p(fdir, &err));
    for (size_t i = 0; i < st_model_count(st); i++) {
        const st_tensor *t = st_model_tensor(st, i);
        if (!is_linear_weight(t->name)) {
            CHECK_OK(st_writer_add_copy(wq, t->name, t->dtype, t->ndim, t->shape, t->data, &err));
            CHECK_OK(st_writer_add_copy(wf, t->name, t->dtype, t->ndim, t->shape, t->data, &err));
            continue;
        }
        int64_t n = t->shape[0], k = t->shape[1];
        float *w = malloc((size_t)(n * k) * 4), *deq = malloc((size_t)(n * k) * 4);
        CHECK_OK(st_tensor_read_f32(t, w, &err));
        qd_qlayer l;
        memset(&l, 0, sizeof l);
        CHECK_OK(qd_rtn_quantize_qlayer(&qc, w, n, k, &l, deq, &err));
        qd_qlayer_dequant_ref(&l, deq);
        qd_packed p;
        memset(&p, 0, sizeof p);
        int rc = fmt->pack(&l, &p, &err);
        if (rc) fprintf(stderr, "%s: %s\n", t->name, err.msg);
        CHECK_OK(rc);
        char base[256], nm[300];
        snprintf(base, sizeof base, "%.*s", (int)(strlen(t->name) - 7), t->name);   /* drop ".weight" */
        snprintf(nm, sizeof nm, "%s.qweight", base);
        CHECK_OK(st_writer_add_copy(wq, nm, QD_DTYPE_I32, 2, p.qweight_shape, p.qweight, &err));
        snprintf(nm, sizeof nm, "%s.qzeros", base);
        CHECK_OK(st_writer_add_copy(wq, nm, QD_DTYPE_I32, 2, p.qzeros_shape, p.qzeros, &err));
        snprintf(nm, sizeof nm, "%s.scales", base);
        CHECK_OK(st_writer_add_copy(wq, nm, QD_DTYPE_F16, 2, p.scales_shape, p.scales, &err));
        if (p.g_idx) {
            snprintf(nm, sizeof nm, "%s.g_idx", base);
            CHECK_OK(st_writer_add_copy(wq, nm, QD_DTYPE_I32, 1, &p.g_idx_len, p.g_idx, &err));
        }
        CHECK_OK(st_writer_add_copy(wf, t->name, QD_DTYPE_F32, 2, t->shape, deq, &err));
        qd_packed_free(&p);
        qd_qlayer_free(&l);
        free(w);
        free(deq);
    }
    CHECK_OK(st_writer_write(wq, test_path(qdir, "model.safetensors"), &err));
    CHECK_OK(st_writer_write(wf, test_path(fdir, "model.safetensors"), &err));
    st_writer_free(wq);
    st_writer_free(wf);
    st_model_close(st);

    char *cfg = NULL;
    size_t len = 0;
    CHECK_OK(qd_fs_read_file(test_path(src, "config.json"), &cfg, &len, &err));
    CHECK_OK(qd_fs_write_atomic(test_path(fdir, "config.json"), cfg, len, &err));
    char q[512], out[8192];
    if (!strcmp(fmt_name, "awq_gemm"))
        snprintf(q, sizeof q, "{\"quant_method\":\"awq\",\"bits\":4,\"group_size\":32,\"zero_point\":true,\"version\":\"gemm\"}");
    else
        snprintf(q, sizeof q, "{\"quant_method\":\"gptq\",\"bits\":4,\"group_size\":32,\"desc_act\":false,\"sym\":%s,"
                 "\"checkpoint_format\":\"%s\"}", sym ? "true" : "false", fmt_name);
    char *brace = strrchr(cfg, '}');
    snprintf(out, sizeof out, "%.*s,\"quantization_config\":%s}\n", (int)(brace - cfg), cfg, q);
    CHECK_OK(qd_fs_write_atomic(test_path(qdir, "config.json"), out, strlen(out), &err));
    free(cfg);
}

static void check_format(const char *fmt, int sym)
{
    qd_testgen_opts o = qd_testgen_defaults(QD_ARCH_LLAMA);
    o.intermediate = 128;
    const char *src = test_path(test_tmpdir(), "src");
    qd_err err = {0};
    if (!qd_fs_exists(src)) CHECK_OK(qd_testgen_write(src, &o, &err));
    char qdir[512], fdir[512];
    snprintf(qdir, sizeof qdir, "%s/q_%s", test_tmpdir(), fmt);
    snprintf(fdir, sizeof fdir, "%s/f_%s", test_tmpdir(), fmt);
    quantize_dir(src, fmt, sym, qdir, fdir);

    qd_model *mq = NULL, *mf = NULL;
    int rc = qd_model_open(qdir, be, &mq, &err);
    if (rc) fprintf(stderr, "%s\n", err.msg);
    CHECK_OK(rc);
    CHECK_OK(qd_model_open(fdir, be, &mf, &err));
    if (!mq || !mf) { qd_model_close(mq); qd_model_close(mf); return; }
    CHECK(qd_model_cfg(mq)->quantized);
    CHECK_STR(qd_model_cfg(mq)->quant_format, fmt);
    qd_block_weights *bq = NULL, *bf = NULL;
    CHECK_OK(qd_block_load(mq, 1, &bq, &err));
    CHECK_OK(qd_block_load(mf, 1, &bf, &err));
    double worst = 0;
    for (int i = 0; bq && bf && i < qd_model_n_linears(mq); i++) {
        const qd_linear_info *L = qd_model_linear(mq, i);
        double d = test_max_abs_diff(bq->w[i], bf->w[i], (size_t)(L->n * L->k));
        if (d > worst) worst = d;
    }
    CHECK(worst == 0.0);
    qd_block_free(mq, bq);
    qd_block_free(mf, bf);
    int T = 16, V = (int)o.vocab;
    int32_t ids[16];
    for (int i = 0; i < T; i++) ids[i] = (i * 37 + 5) % V;
    float *a = malloc((size_t)T * V * 4), *b = malloc((size_t)T * V * 4);
    CHECK_OK(qd_model_forward(mq, ids, 1, T, a, &err));
    CHECK_OK(qd_model_forward(mf, ids, 1, T, b, &err));
    CHECK(test_max_abs_diff(a, b, (size_t)T * V) == 0.0);
    free(a);
    free(b);
    qd_model_close(mq);
    qd_model_close(mf);
}

static void test_gptq_sym(void) { check_format("gptq", 1); }
static void test_gptq_v2_asym(void) { check_format("gptq_v2", 0); }
static void test_awq_gemm(void) { check_format("awq_gemm", 0); }

int main(void)
{
    qd_err err = {0};
    if (qd_backend_cpu_open(2, NULL, &be, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    TEST_RUN(test_gptq_sym);
    TEST_RUN(test_gptq_v2_asym);
    TEST_RUN(test_awq_gemm);
    qd_backend_close(be);
    return test_finish();
}
