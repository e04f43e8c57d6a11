/* The config.json fuzz harness: an accepted config must describe a model the forward pass
 * can build (a supported family matching its architecture string, positive sizes, heads that
 * divide as attention needs, an even head_dim, positive eps and theta, a quantization_config
 * in the format table's terms) and parsing must be deterministic; a refusal must name the
 * source and leave the output untouched. */
#include "fuzz/model_config_fuzz_one.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/formats/format.h"
#include "quant/model/config.h"

#define WHAT "fuzz/config.json"

static int fail(const char *why, const char *detail)
{
    fprintf(stderr, "model_config_fuzz_one: invariant broken: %s%s%s\n", why, detail ? ": " : "", detail ? detail : "");
    return -1;
}

static int terminated(const char *s, size_t cap) { return memchr(s, 0, cap) != NULL; }

static int check_config(const qd_model_config *c)
{
    if (!terminated(c->architecture, sizeof c->architecture) || !terminated(c->model_type, sizeof c->model_type) ||
        !terminated(c->activation, sizeof c->activation) || !terminated(c->torch_dtype, sizeof c->torch_dtype) ||
        !terminated(c->quant_format, sizeof c->quant_format))
        return fail("an unterminated string", NULL);
    if (c->family == QD_ARCH_UNKNOWN || c->family != qd_arch_family_of(c->architecture))
        return fail("family does not match the architecture", c->architecture);
    if (c->hidden <= 0 || c->intermediate <= 0 || c->n_layers <= 0 || c->n_heads <= 0 || c->vocab <= 0 || c->max_pos <= 0)
        return fail("a non-positive size", NULL);
    if (c->n_kv_heads <= 0 || c->n_heads % c->n_kv_heads) return fail("kv heads do not divide heads", NULL);
    if (c->head_dim <= 0 || c->head_dim % 2) return fail("head_dim not positive and even", NULL);
    if (!(c->norm_eps > 0) || !(c->rope_theta > 0)) return fail("eps or theta not positive", NULL);
    if (c->family == QD_ARCH_LLAMA && strcmp(c->activation, c->layout == QD_LAYOUT_GEMMA ? "gelu_pytorch_tanh" : "silu"))
        return fail("rotary decoder with an activation of another family", c->activation);
    if (c->family == QD_ARCH_OPT && strcmp(c->activation, "relu") && strcmp(c->activation, "gelu"))
        return fail("OPT activation", c->activation);
    if (c->word_embed_proj_dim <= 0) return fail("word_embed_proj_dim", NULL);
    if (c->quantized) {
        if (c->quant_bits != 2 && c->quant_bits != 3 && c->quant_bits != 4 && c->quant_bits != 8)
            return fail("quant bits outside {2, 3, 4, 8}", NULL);
        if (!qd_format_find(c->quant_format))
            return fail("quant format not in the table", c->quant_format);
        if (c->quant_group_size == 0 || c->quant_group_size < -1) return fail("quant group size", NULL);
    }
    return 0;
}

/* Fields compared one by one: the struct has padding, so memcmp would compare garbage. */
static int same(const qd_model_config *a, const qd_model_config *b)
{
    return !strcmp(a->architecture, b->architecture) && !strcmp(a->model_type, b->model_type) &&
           a->family == b->family && a->hidden == b->hidden && a->intermediate == b->intermediate &&
           a->n_layers == b->n_layers && a->n_heads == b->n_heads && a->n_kv_heads == b->n_kv_heads &&
           a->head_dim == b->head_dim && a->vocab == b->vocab && a->max_pos == b->max_pos &&
           a->norm_eps == b->norm_eps && a->rope_theta == b->rope_theta && a->qkv_bias == b->qkv_bias &&
           a->o_bias == b->o_bias && a->mlp_bias == b->mlp_bias && a->quantized == b->quantized &&
           a->quant_bits == b->quant_bits && a->quant_group_size == b->quant_group_size &&
           !strcmp(a->quant_format, b->quant_format) && a->bos_id == b->bos_id && a->eos_id == b->eos_id;
}

int model_config_fuzz_one(const uint8_t *data, size_t size, int *accepted)
{
    if (accepted) *accepted = 0;
    /* The parser takes NUL-terminated text (config files are read whole and terminated). */
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    qd_model_config c, c2, untouched;
    memset(&untouched, 0x5a, sizeof untouched);
    c = untouched;
    qd_err err = {0};
    int bad = 0, rc = qd_model_config_parse(text, WHAT, &c, &err);
    if (rc == 0) {
        if (accepted) *accepted = 1;
        bad = check_config(&c);
        memset(&c2, 0, sizeof c2);
        if (!bad && (qd_model_config_parse(text, WHAT, &c2, &err) || !same(&c, &c2)))
            bad = fail("parsing the same text twice differs", NULL);
    } else {
        if (rc > 0) bad = fail("an error path returned a positive code", NULL);
        if (memcmp(&c, &untouched, sizeof c)) bad = fail("a refused config wrote the output", NULL);
        if (strncmp(err.msg, WHAT ":", strlen(WHAT) + 1)) bad = fail("the message does not name the source", err.msg);
    }
    free(text);
    return bad ? -1 : 0;
}
