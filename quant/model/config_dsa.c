/* DeepSeek-V3.2's config keys beyond DeepSeek-V3's (DeepseekV32Config, transformers 5.23):
 * the sparse-attention indexer's index_topk (2048), index_head_dim (128) and index_n_heads
 * (64). Everything else is V3's (parse_deepseek in config_family.c, same defaults). What
 * transformers' DeepseekV32 does not compute, or computes one fixed way whatever a key says,
 * is refused by name when the key asks otherwise:
 *   - q_lora_rank null: the indexer reads q_a_layernorm's output, so there must be one;
 *   - rope_interleave false: V3.2's MLA always turns interleaved pairs (the key is V3's);
 *   - indexer_rope_interleave true: the indexer's RoPE is always the half-split one;
 *   - index_topk_freq / index_topk_pattern / index_skip_topk_offset (vLLM's IndexCache, layers
 *     reusing another layer's choice): transformers runs every layer's indexer;
 *   - layer_types other than "indexed_attention", mlp_layer_types other than dense layers
 *     first then sparse ones (the forward's first_k_dense_replace; transformers reads the list). */
#include <cjson/cJSON.h>
#include <string.h>

#include "quant/model/config_internal.h"

int qd_config_dsa_is(const char *architecture) { return !strcmp(architecture, "DeepseekV32ForCausalLM"); }

/* mlp_layer_types: n_dense leading "dense", then "sparse" only; first_dense becomes n_dense. */
static int mlp_layer_types(const cJSON *root, const char *what, qd_model_config *c, qd_err *err)
{
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(root, "mlp_layer_types"), *e;
    if (!lt || cJSON_IsNull(lt)) return 0;
    if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != c->n_layers)
        return qd_err_set(err, QD_EFORMAT, "%s: mlp_layer_types must list num_hidden_layers (%lld) entries", what,
                          (long long)c->n_layers);
    int64_t i = 0, n_dense = -1;
    cJSON_ArrayForEach(e, lt) {
        const char *v = cJSON_IsString(e) ? e->valuestring : "";
        int dense = !strcmp(v, "dense");
        if (!dense && strcmp(v, "sparse"))
            return qd_err_set(err, QD_EFORMAT, "%s: mlp_layer_types[%lld] \"%s\" is neither \"dense\" nor \"sparse\"",
                              what, (long long)i, v);
        if (!dense && n_dense < 0) n_dense = i;
        if (dense && n_dense >= 0)
            return qd_err_set(err, QD_EUNSUPPORTED, "%s: mlp_layer_types has a dense layer %lld after a sparse one; "
                              "only dense layers first, then sparse ones, are supported for %s", what, (long long)i,
                              c->architecture);
        i++;
    }
    c->first_dense = n_dense < 0 ? c->n_layers : n_dense;
    return 0;
}

int qd_config_dsa_parse(const cJSON *root, const char *what, qd_model_config *c, qd_err *err)
{
    int rc, on = 0;
    c->index_topk = 2048;
    c->index_head_dim = 128;
    c->index_heads = 64;
    if ((rc = qd_cfg_get_int(root, "index_topk", &c->index_topk, what, err)) ||
        (rc = qd_cfg_get_int(root, "index_head_dim", &c->index_head_dim, what, err)) ||
        (rc = qd_cfg_get_int(root, "index_n_heads", &c->index_heads, what, err)))
        return rc;
    if (c->index_topk < 1 || c->index_heads < 1 || c->index_head_dim < c->qk_rope_dim)
        return qd_err_set(err, QD_EFORMAT, "%s: index_topk %lld and index_n_heads %lld must be positive, index_head_dim "
                          "%lld at least qk_rope_head_dim %lld", what, (long long)c->index_topk, (long long)c->index_heads,
                          (long long)c->index_head_dim, (long long)c->qk_rope_dim);
    if (c->q_lora_rank <= 0)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: q_lora_rank null is not supported for %s (its indexer reads "
                          "q_a_layernorm's output)", what, c->architecture);
    if (!c->rope_interleave)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: rope_interleave false is not supported for %s (its attention always "
                          "turns interleaved pairs)", what, c->architecture);
    if ((rc = qd_cfg_get_bool(root, "indexer_rope_interleave", &on, what, err))) return rc;
    if (on)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: indexer_rope_interleave true is not supported for %s (transformers' "
                          "indexer turns the half-split pairs)", what, c->architecture);
    int64_t freq = 1;
    if ((rc = qd_cfg_get_int(root, "index_topk_freq", &freq, what, err))) return rc;
    if (freq != 1)
        return qd_err_set(err, QD_EUNSUPPORTED, "%s: index_topk_freq %lld is not supported for %s (layers reusing "
                          "another's choice; transformers runs every layer's indexer)", what, (long long)freq,
                          c->architecture);
    static const char *const reuse[] = {"index_topk_pattern"};
    if ((rc = qd_cfg_refuse_foreign(root, reuse, 1, 0, what, "transformers' DeepseekV32", err))) return rc;
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(root, "layer_types"), *e;
    if (cJSON_IsArray(lt))
        cJSON_ArrayForEach(e, lt)
            if (!cJSON_IsString(e) || strcmp(e->valuestring, "indexed_attention"))
                return qd_err_set(err, QD_EUNSUPPORTED, "%s: layer_types other than \"indexed_attention\" are not "
                                  "supported for %s", what, c->architecture);
    return mlp_layer_types(root, what, c, err);
}
