/* Writes random llama / OPT checkpoints, tiny or full-sized (see testgen.h). The tensor list
 * is built from the same config the loader parses (config.json's text is parsed back before
 * it is written), so the generator and the loader cannot disagree about which biases or
 * projections exist.
 *
 * Values are drawn in list order from one sequence (tensor i starts where tensor i - 1
 * ended), but a safetensors file stores its tensors sorted by name. Rather than hold the
 * model in memory to reorder it, each tensor is made on its own when the file wants it: the
 * generator jumps to the tensor's first value (tg_rng_at) and the values are made, converted
 * and appended in chunks of TG_CHUNK, so memory stays at a few MiB whatever the model's
 * size, and the bytes are those the whole-model version wrote. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "quant/core/fsutil.h"
#include "quant/core/jsonfile.h"
#include "quant/core/minifloat.h"
#include "quant/core/rng.h"
#include "quant/core/safetensors.h"
#include "quant/model/model.h"
#include "quant/model/model_fp8.h"
#include "quant/model/testgen.h"

qd_testgen_opts qd_testgen_defaults(qd_arch_family family)
{
    qd_testgen_opts o;
    memset(&o, 0, sizeof o);
    o.family = family;
    o.hidden = 64;
    o.intermediate = 160;
    o.n_layers = 2;
    o.n_heads = 4;
    o.n_kv_heads = family == QD_ARCH_OPT ? 4 : 2;
    o.vocab = 128;
    o.max_pos = 128;
    o.rope_theta = 10000.0f;
    o.norm_eps = 1e-5f;
    o.dtype = QD_DTYPE_F32;
    o.n_shards = 1;
    o.seed = 1;
    return o;
}

typedef struct tg_rng { uint64_t s; int have; float spare; } tg_rng;

/* Values made, converted and appended at a time: 4 MiB of floats. */
#define TG_CHUNK ((size_t)1 << 20)

static uint64_t tg_next(tg_rng *r) { return qd_splitmix64(&r->s); }

static float tg_normal(tg_rng *r)
{
    if (r->have) { r->have = 0; return r->spare; }
    double u1 = ((tg_next(r) >> 11) + 1.0) * 0x1.0p-53, u2 = (tg_next(r) >> 11) * 0x1.0p-53;
    double mag = sqrt(-2.0 * log(u1));
    r->spare = (float)(mag * sin(2.0 * M_PI * u2));
    r->have = 1;
    return (float)(mag * cos(2.0 * M_PI * u2));
}

/* The generator as it stands after `k` values of the sequence from seed. Values come in
 * pairs, each pair from two draws; an odd k stops inside a pair, whose second value then
 * waits as the spare. */
static tg_rng tg_rng_at(uint64_t seed, uint64_t k)
{
    tg_rng r = {.s = qd_splitmix64_skip(seed, k & ~(uint64_t)1)};
    if (k & 1) (void)tg_normal(&r);
    return r;
}

enum tg_kind { TG_LINEAR, TG_BIAS, TG_NORM_W, TG_NORM_B, TG_EMBED };

typedef struct tg_tensor {
    char name[160];
    int ndim;
    int64_t shape[2];
    enum tg_kind kind;
    uint64_t numel;
    uint64_t first;      /* index of its first value in the seed's sequence */
} tg_tensor;

typedef struct tg_list { tg_tensor *t; size_t n, cap; } tg_list;

static int tg_add(tg_list *l, enum tg_kind kind, int64_t d0, int64_t d1, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int tg_add(tg_list *l, enum tg_kind kind, int64_t d0, int64_t d1, const char *fmt, ...)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        tg_tensor *t = realloc(l->t, cap * sizeof *t);
        if (!t) return QD_ENOMEM;
        l->t = t;
        l->cap = cap;
    }
    tg_tensor *t = &l->t[l->n++];
    memset(t, 0, sizeof *t);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    t->kind = kind;
    t->ndim = d1 > 0 ? 2 : 1;
    t->shape[0] = d0;
    t->shape[1] = d1;
    return 0;
}

/* config.json's text into *text (the caller's) and the config the loader will parse from it. */
static int make_config(const qd_testgen_opts *o, char **text, qd_model_config *cfg, qd_err *err)
{
    cJSON *c = cJSON_CreateObject();
    const char *arch = o->architecture ? o->architecture
                     : o->family == QD_ARCH_OPT ? "OPTForCausalLM"
                     : o->n_experts > 0 ? "MixtralForCausalLM" : "LlamaForCausalLM";
    cJSON *a = cJSON_AddArrayToObject(c, "architectures");
    cJSON_AddItemToArray(a, cJSON_CreateString(arch));
    const char *dt = o->dtype == QD_DTYPE_F16 ? "float16" : o->dtype == QD_DTYPE_BF16 ? "bfloat16" : "float32";
    if (o->family == QD_ARCH_OPT) {
        cJSON_AddStringToObject(c, "model_type", "opt");
        cJSON_AddNumberToObject(c, "hidden_size", (double)o->hidden);
        cJSON_AddNumberToObject(c, "ffn_dim", (double)o->intermediate);
        cJSON_AddNumberToObject(c, "num_hidden_layers", (double)o->n_layers);
        cJSON_AddNumberToObject(c, "num_attention_heads", (double)o->n_heads);
        cJSON_AddNumberToObject(c, "word_embed_proj_dim", (double)(o->word_embed_proj_dim ? o->word_embed_proj_dim : o->hidden));
        cJSON_AddBoolToObject(c, "do_layer_norm_before", !o->post_ln);
        cJSON_AddStringToObject(c, "activation_function", "relu");
        cJSON_AddBoolToObject(c, "enable_bias", 1);
    } else {
        cJSON_AddStringToObject(c, "model_type", strstr(arch, "Qwen2") ? "qwen2" : strstr(arch, "Mistral") ? "mistral"
                                                 : strstr(arch, "Mixtral") ? "mixtral" : "llama");
        if (o->n_experts > 0) {
            cJSON_AddNumberToObject(c, "num_local_experts", (double)o->n_experts);
            cJSON_AddNumberToObject(c, "num_experts_per_tok", (double)(o->top_k > 0 ? o->top_k : 2));
        }
        cJSON_AddNumberToObject(c, "hidden_size", (double)o->hidden);
        cJSON_AddNumberToObject(c, "intermediate_size", (double)o->intermediate);
        cJSON_AddNumberToObject(c, "num_hidden_layers", (double)o->n_layers);
        cJSON_AddNumberToObject(c, "num_attention_heads", (double)o->n_heads);
        cJSON_AddNumberToObject(c, "num_key_value_heads", (double)(o->n_kv_heads ? o->n_kv_heads : o->n_heads));
        if (o->head_dim) cJSON_AddNumberToObject(c, "head_dim", (double)o->head_dim);
        cJSON_AddNumberToObject(c, "rms_norm_eps", o->norm_eps);
        cJSON_AddNumberToObject(c, "rope_theta", o->rope_theta);
        cJSON_AddStringToObject(c, "hidden_act", "silu");
        cJSON_AddBoolToObject(c, "attention_bias", o->attention_bias);
    }
    cJSON_AddNumberToObject(c, "vocab_size", (double)o->vocab);
    cJSON_AddNumberToObject(c, "max_position_embeddings", (double)o->max_pos);
    cJSON_AddBoolToObject(c, "tie_word_embeddings", o->tie_word_embeddings);
    cJSON_AddNumberToObject(c, "bos_token_id", 1);
    cJSON_AddNumberToObject(c, "eos_token_id", 2);
    cJSON_AddStringToObject(c, "torch_dtype", dt);
    char *s = cJSON_Print(c);
    cJSON_Delete(c);
    if (!s) return qd_err_set(err, QD_ENOMEM, "testgen: out of memory");
    int rc = qd_model_config_parse(s, "testgen config", cfg, err);
    if (rc) free(s);
    else *text = s;
    return rc;
}

/* The tensor list of a checkpoint with this config, in the order values are drawn. */
static int build_list(const qd_model_config *c, tg_list *l)
{
    int64_t H = c->hidden, F = c->intermediate, qd = c->n_heads * c->head_dim, kvd = c->n_kv_heads * c->head_dim;
    int64_t pd = c->word_embed_proj_dim;
    int rc = 0;
    if (c->family == QD_ARCH_LLAMA) {
        rc |= tg_add(l, TG_EMBED, c->vocab, H, "model.embed_tokens.weight");
        for (int64_t i = 0; i < c->n_layers; i++) {
            const char *p = "model.layers";
            rc |= tg_add(l, TG_NORM_W, H, 0, "%s.%lld.input_layernorm.weight", p, (long long)i);
            rc |= tg_add(l, TG_LINEAR, qd, H, "%s.%lld.self_attn.q_proj.weight", p, (long long)i);
            rc |= tg_add(l, TG_LINEAR, kvd, H, "%s.%lld.self_attn.k_proj.weight", p, (long long)i);
            rc |= tg_add(l, TG_LINEAR, kvd, H, "%s.%lld.self_attn.v_proj.weight", p, (long long)i);
            if (c->qkv_bias) {
                rc |= tg_add(l, TG_BIAS, qd, 0, "%s.%lld.self_attn.q_proj.bias", p, (long long)i);
                rc |= tg_add(l, TG_BIAS, kvd, 0, "%s.%lld.self_attn.k_proj.bias", p, (long long)i);
                rc |= tg_add(l, TG_BIAS, kvd, 0, "%s.%lld.self_attn.v_proj.bias", p, (long long)i);
            }
            rc |= tg_add(l, TG_LINEAR, H, qd, "%s.%lld.self_attn.o_proj.weight", p, (long long)i);
            if (c->o_bias) rc |= tg_add(l, TG_BIAS, H, 0, "%s.%lld.self_attn.o_proj.bias", p, (long long)i);
            rc |= tg_add(l, TG_NORM_W, H, 0, "%s.%lld.post_attention_layernorm.weight", p, (long long)i);
            if (c->n_experts > 0) {
                rc |= tg_add(l, TG_LINEAR, c->n_experts, H, "%s.%lld.block_sparse_moe.gate.weight", p, (long long)i);
                for (int64_t e = 0; e < c->n_experts; e++) {
                    const char *x = "block_sparse_moe.experts";
                    rc |= tg_add(l, TG_LINEAR, c->moe_intermediate, H, "%s.%lld.%s.%lld.w1.weight", p, (long long)i, x, (long long)e);
                    rc |= tg_add(l, TG_LINEAR, H, c->moe_intermediate, "%s.%lld.%s.%lld.w2.weight", p, (long long)i, x, (long long)e);
                    rc |= tg_add(l, TG_LINEAR, c->moe_intermediate, H, "%s.%lld.%s.%lld.w3.weight", p, (long long)i, x, (long long)e);
                }
                continue;
            }
            rc |= tg_add(l, TG_LINEAR, F, H, "%s.%lld.mlp.gate_proj.weight", p, (long long)i);
            rc |= tg_add(l, TG_LINEAR, F, H, "%s.%lld.mlp.up_proj.weight", p, (long long)i);
            rc |= tg_add(l, TG_LINEAR, H, F, "%s.%lld.mlp.down_proj.weight", p, (long long)i);
        }
        rc |= tg_add(l, TG_NORM_W, H, 0, "model.norm.weight");
        if (!c->tie_word_embeddings) rc |= tg_add(l, TG_LINEAR, c->vocab, H, "lm_head.weight");
    } else {
        rc |= tg_add(l, TG_EMBED, c->vocab, pd, "model.decoder.embed_tokens.weight");
        rc |= tg_add(l, TG_EMBED, c->max_pos + c->pos_offset, H, "model.decoder.embed_positions.weight");
        if (pd != H) {
            rc |= tg_add(l, TG_LINEAR, H, pd, "model.decoder.project_in.weight");
            rc |= tg_add(l, TG_LINEAR, pd, H, "model.decoder.project_out.weight");
        }
        for (int64_t i = 0; i < c->n_layers; i++) {
            const char *p = "model.decoder.layers";
            static const char *attn[4] = {"q_proj", "k_proj", "v_proj", "out_proj"};
            rc |= tg_add(l, TG_NORM_W, H, 0, "%s.%lld.self_attn_layer_norm.weight", p, (long long)i);
            rc |= tg_add(l, TG_NORM_B, H, 0, "%s.%lld.self_attn_layer_norm.bias", p, (long long)i);
            for (int j = 0; j < 4; j++) {
                rc |= tg_add(l, TG_LINEAR, H, H, "%s.%lld.self_attn.%s.weight", p, (long long)i, attn[j]);
                rc |= tg_add(l, TG_BIAS, H, 0, "%s.%lld.self_attn.%s.bias", p, (long long)i, attn[j]);
            }
            rc |= tg_add(l, TG_NORM_W, H, 0, "%s.%lld.final_layer_norm.weight", p, (long long)i);
            rc |= tg_add(l, TG_NORM_B, H, 0, "%s.%lld.final_layer_norm.bias", p, (long long)i);
            rc |= tg_add(l, TG_LINEAR, F, H, "%s.%lld.fc1.weight", p, (long long)i);
            rc |= tg_add(l, TG_BIAS, F, 0, "%s.%lld.fc1.bias", p, (long long)i);
            rc |= tg_add(l, TG_LINEAR, H, F, "%s.%lld.fc2.weight", p, (long long)i);
            rc |= tg_add(l, TG_BIAS, H, 0, "%s.%lld.fc2.bias", p, (long long)i);
        }
        if (c->do_layer_norm_before) {
            rc |= tg_add(l, TG_NORM_W, H, 0, "model.decoder.final_layer_norm.weight");
            rc |= tg_add(l, TG_NORM_B, H, 0, "model.decoder.final_layer_norm.bias");
        }
        if (!c->tie_word_embeddings) rc |= tg_add(l, TG_LINEAR, c->vocab, pd, "lm_head.weight");
    }
    return rc ? QD_ENOMEM : 0;
}

/* Makes tensor t's values from its place in the sequence and appends them to w in
 * o->dtype. f holds TG_CHUNK floats, conv TG_CHUNK values of o->dtype. */
static int stream_tensor(st_writer *w, const tg_tensor *t, const qd_testgen_opts *o, float *f, void *conv,
                         qd_err *err)
{
    tg_rng r = tg_rng_at(o->seed, t->first);
    float s = t->kind == TG_LINEAR ? (float)(1.0 / sqrt((double)t->shape[1])) : t->kind == TG_EMBED ? 0.5f : 0.1f;
    size_t esz = qd_dtype_size(o->dtype);
    for (uint64_t done = 0; done < t->numel;) {
        size_t n = t->numel - done < TG_CHUNK ? (size_t)(t->numel - done) : TG_CHUNK;
        for (size_t i = 0; i < n; i++) {
            float v = s * tg_normal(&r);
            if (t->kind == TG_NORM_W) v += 1.0f;
            f[i] = o->round_f16 ? qd_f32_round_f16(v) : v;
        }
        const void *out = f;
        if (o->dtype != QD_DTYPE_F32) {
            int rc = qd_convert_from_f32(o->dtype, f, conv, n);
            if (rc) return qd_err_set(err, rc, "testgen: cannot convert %s to %s", t->name, qd_dtype_name(o->dtype));
            out = conv;
        }
        int rc = st_writer_append(w, out, n * esz, err);
        if (rc) return rc;
        done += n;
    }
    return 0;
}

/* Writes shard s of the plan: the header, then each tensor made in the file's order. */
static int write_shard(const char *dir, const tg_list *l, const st_shard_plan *plan, size_t s,
                       const qd_testgen_opts *o, float *f, void *conv, qd_err *err)
{
    st_writer *w = NULL;
    if (st_writer_init(&w)) return qd_err_set(err, QD_ENOMEM, "testgen: out of memory");
    size_t a = plan->start[s], b = plan->start[s + 1];
    int rc = 0;
    for (size_t i = a; i < b && !rc; i++)
        rc = st_writer_declare(w, l->t[i].name, o->dtype, l->t[i].ndim, l->t[i].shape, err);
    char fname[64], path[4096];
    st_shard_file_name(plan, s, fname, sizeof fname);
    snprintf(path, sizeof path, "%s/%s", dir, fname);
    if (!rc) rc = st_writer_begin(w, path, err);
    for (size_t k = 0; k < b - a && !rc; k++)
        rc = stream_tensor(w, &l->t[a + st_writer_tensor_at(w, k)], o, f, conv, err);
    if (!rc) rc = st_writer_finish(w, err);
    st_writer_free(w);
    return rc;
}

/* Removes what an earlier model in dir left that the new one does not overwrite, as
 * transformers' save_pretrained does: the loader prefers model.safetensors to an index, so
 * a stale single file would hide new shards, and shards of another count waste the disk.
 * Called once the new files are in place. */
static int remove_stale(const char *dir, const st_shard_plan *plan, qd_err *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, plan->n_shards > 1 ? "model.safetensors" : "model.safetensors.index.json");
    if (unlink(path) != 0 && errno != ENOENT) return qd_err_set(err, QD_EIO, "%s: cannot remove: %s", path, strerror(errno));
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    int rc = 0;
    while (!rc && (e = readdir(d))) {
        unsigned i, n;
        int end = 0;
        if (sscanf(e->d_name, "model-%5u-of-%5u.safetensors%n", &i, &n, &end) != 2 || end != 32 || e->d_name[end])
            continue;
        if (plan->n_shards > 1 && n == plan->n_shards) continue;   /* one of ours */
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (unlink(path) != 0 && errno != ENOENT) rc = qd_err_set(err, QD_EIO, "%s: cannot remove: %s", path, strerror(errno));
    }
    closedir(d);
    return rc;
}

int qd_testgen_write(const char *dir, const qd_testgen_opts *o, qd_err *err)
{
    if (o->dtype != QD_DTYPE_F32 && o->dtype != QD_DTYPE_F16 && o->dtype != QD_DTYPE_BF16)
        return qd_err_set(err, QD_EINVAL, "testgen: dtype %s is not F32, F16 or BF16", qd_dtype_name(o->dtype));
    int rc = qd_fs_mkdir_p(dir, err);
    if (rc) return rc;
    qd_model_config cfg;
    char *config = NULL, path[4096];
    if ((rc = make_config(o, &config, &cfg, err))) return rc;
    tg_list l = {0};
    st_shard_plan plan = {0};
    uint64_t *bytes = NULL;
    const char **names = NULL;
    float *f = NULL;
    void *conv = NULL;
    if ((rc = build_list(&cfg, &l))) { qd_err_set(err, rc, "testgen: out of memory"); goto done; }
    bytes = malloc((l.n ? l.n : 1) * sizeof *bytes);
    names = malloc((l.n ? l.n : 1) * sizeof *names);
    f = malloc(TG_CHUNK * sizeof *f);
    conv = malloc(TG_CHUNK * qd_dtype_size(o->dtype));
    if (!bytes || !names || !f || !conv) { rc = qd_err_set(err, QD_ENOMEM, "testgen: out of memory"); goto done; }
    uint64_t first = 0;
    for (size_t i = 0; i < l.n; i++) {
        tg_tensor *t = &l.t[i];
        t->numel = (uint64_t)t->shape[0] * (uint64_t)(t->ndim == 2 ? t->shape[1] : 1);
        t->first = first;
        first += t->numel;
        bytes[i] = t->numel * qd_dtype_size(o->dtype);
        names[i] = t->name;
    }
    rc = o->shard_size ? st_shard_plan_by_size(bytes, l.n, o->shard_size, &plan)
                       : st_shard_plan_by_count(bytes, l.n, o->n_shards < 1 ? 1 : (size_t)o->n_shards, &plan);
    if (rc) { qd_err_set(err, rc, "testgen: out of memory"); goto done; }
    /* Refused up front rather than after filling the disk (a 70B-shaped model is 138 GB). */
    uint64_t free_bytes;
    if (qd_fs_free_bytes(dir, &free_bytes, NULL) == 0 && free_bytes < plan.total_bytes) {
        rc = qd_err_set(err, QD_ERESOURCE, "testgen: the model needs %.2f GB and %s has %.2f GB free",
                        plan.total_bytes / 1e9, dir, free_bytes / 1e9);
        goto done;
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    if ((rc = qd_fs_write_atomic(path, config, strlen(config), err))) goto done;
    for (size_t s = 0; s < plan.n_shards && !rc; s++) rc = write_shard(dir, &l, &plan, s, o, f, conv, err);
    if (!rc && plan.n_shards > 1) rc = st_shard_index_write(dir, &plan, names, err);
    if (!rc) rc = remove_stale(dir, &plan, err);
done:
    st_shard_plan_free(&plan);
    free(conv);
    free(f);
    free(names);
    free(bytes);
    free(l.t);
    free(config);
    return rc;
}

/* ---- FP8-block copies (qd_testgen_fp8) ---- */

/* Whether name is the weight of one of m's block linears. */
static int fp8_is_linear(const qd_model *m, const char *name)
{
    const qd_model_config *c = qd_model_cfg(m);
    char w[400], prefix[200];
    for (int b = 0; b < c->n_layers; b++) {
        if (qd_model_block_prefix(m, b, prefix, sizeof prefix)) continue;
        size_t pl = strlen(prefix);
        if (strncmp(name, prefix, pl)) continue;
        for (int li = 0; li < qd_model_n_linears(m); li++) {
            if (!qd_model_block_has_linear(m, b, li)) continue;
            snprintf(w, sizeof w, "%s.weight", qd_model_linear(m, li)->name);
            if (!strcmp(name + pl, w)) return 1;
        }
    }
    return 0;
}

/* w [n, k] → codes [n, k] and scales [sn, sk], and the dequantized weight into dq. */
static void fp8_encode(const float *w, int64_t n, int64_t k, int64_t bn, int64_t bk, uint8_t *codes, float *scales,
                       float *dq)
{
    int64_t sn = (n + bn - 1) / bn, sk = (k + bk - 1) / bk;
    for (int64_t bi = 0; bi < sn; bi++)
        for (int64_t bj = 0; bj < sk; bj++) {
            int64_t i1 = (bi + 1) * bn < n ? (bi + 1) * bn : n, j1 = (bj + 1) * bk < k ? (bj + 1) * bk : k;
            float amax = 0.0f;
            for (int64_t i = bi * bn; i < i1; i++)
                for (int64_t j = bj * bk; j < j1; j++) amax = fmaxf(amax, fabsf(w[i * k + j]));
            float s = amax > 0.0f ? amax / QD_FP8_E4M3_MAX : 1.0f;
            scales[bi * sk + bj] = s;
            for (int64_t i = bi * bn; i < i1; i++)
                for (int64_t j = bj * bk; j < j1; j++) codes[i * k + j] = qd_f32_to_fp8_e4m3(w[i * k + j] / s);
        }
    qd_fp8_block_dequant(codes, n, k, scales, bn, bk, 0, n, dq);
}

/* config.json of src with quantization_config (fp8 != 0) or without, written to dir. */
static int fp8_write_config(const char *src, const char *dir, int fp8, int64_t bn, int64_t bk, qd_err *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", src);
    cJSON *cfg = NULL;
    int rc = qd_json_read_object_literal(path, QD_INPUT_JSON, &cfg, err);
    if (rc) return rc;
    cJSON_DeleteItemFromObjectCaseSensitive(cfg, "quantization_config");
    if (fp8) {
        cJSON *q = cJSON_AddObjectToObject(cfg, "quantization_config");
        cJSON_AddStringToObject(q, "activation_scheme", "dynamic");
        cJSON_AddStringToObject(q, "fmt", "e4m3");
        cJSON_AddStringToObject(q, "quant_method", "fp8");
        cJSON *bs = cJSON_AddArrayToObject(q, "weight_block_size");
        cJSON_AddItemToArray(bs, cJSON_CreateNumber((double)bn));
        cJSON_AddItemToArray(bs, cJSON_CreateNumber((double)bk));
    }
    char *text = cJSON_Print(cfg);
    cJSON_Delete(cfg);
    if (!text) return qd_err_set(err, QD_ENOMEM, "testgen: out of memory");
    snprintf(path, sizeof path, "%s/config.json", dir);
    rc = qd_fs_write_atomic(path, text, strlen(text), err);
    free(text);
    return rc;
}

int qd_testgen_fp8(const char *src, const char *out, int64_t bn, int64_t bk, const char *twin, qd_backend *be,
                   qd_err *err)
{
    if (bn < 1 || bk < 1) return qd_err_set(err, QD_EINVAL, "testgen: FP8 blocks of %lld x %lld", (long long)bn, (long long)bk);
    qd_model *m = NULL;
    int rc = qd_model_open(src, be, &m, err);
    if (rc) return rc;
    const st_model *sm = qd_model_tensors(m);
    st_writer *w8 = NULL, *wt = NULL;
    if (st_writer_init(&w8) || (twin && st_writer_init(&wt))) { rc = qd_err_set(err, QD_ENOMEM, "testgen: out of memory"); goto done; }
    for (size_t i = 0; i < st_model_count(sm) && !rc; i++) {
        const st_tensor *t = st_model_tensor(sm, i);
        if (t->ndim != 2 || !fp8_is_linear(m, t->name)) {
            rc = st_writer_add(w8, t->name, t->dtype, t->ndim, t->shape, t->data, err);
            if (!rc && wt) rc = st_writer_add(wt, t->name, t->dtype, t->ndim, t->shape, t->data, err);
            continue;
        }
        int64_t n = t->shape[0], k = t->shape[1], ss[2] = {(n + bn - 1) / bn, (k + bk - 1) / bk};
        char sname[400];
        snprintf(sname, sizeof sname, "%.*s_scale_inv", (int)(sizeof sname - 16), t->name);
        float *f = malloc((size_t)(n * k) * sizeof *f), *dq = malloc((size_t)(n * k) * sizeof *dq);
        float *sc = malloc((size_t)(ss[0] * ss[1]) * sizeof *sc);
        uint8_t *codes = malloc((size_t)(n * k));
        if (!f || !dq || !sc || !codes) rc = qd_err_set(err, QD_ENOMEM, "testgen: out of memory");
        if (!rc) rc = st_tensor_read_f32(t, f, err);
        if (!rc) {
            fp8_encode(f, n, k, bn, bk, codes, sc, dq);
            rc = st_writer_add_copy(w8, t->name, QD_DTYPE_F8_E4M3, 2, t->shape, codes, err);
        }
        if (!rc) rc = st_writer_add_copy(w8, sname, QD_DTYPE_F32, 2, ss, sc, err);
        if (!rc && wt) rc = st_writer_add_copy(wt, t->name, QD_DTYPE_F32, 2, t->shape, dq, err);
        free(f);
        free(dq);
        free(sc);
        free(codes);
    }
    char path[4096];
    if (!rc) rc = qd_fs_mkdir_p(out, err);
    if (!rc) rc = fp8_write_config(src, out, 1, bn, bk, err);
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    if (!rc) rc = st_writer_write(w8, path, err);
    if (!rc && wt) {
        if (!(rc = qd_fs_mkdir_p(twin, err))) rc = fp8_write_config(src, twin, 0, bn, bk, err);
        snprintf(path, sizeof path, "%s/model.safetensors", twin);
        if (!rc) rc = st_writer_write(wt, path, err);
    }
done:
    st_writer_free(w8);
    st_writer_free(wt);
    qd_model_close(m);
    return rc;
}
