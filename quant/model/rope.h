/* RoPE frequencies for one forward, from the model's config: plain, linear, dynamic NTK,
 * llama3, YaRN and LongRoPE, computed the way transformers' modeling_rope_utils does (in
 * float32), including the two types whose frequencies depend on the sequence: dynamic
 * (the base grows once the sequence passes max_position_embeddings) and LongRoPE (long
 * factors once it passes original_max_position_embeddings). */
#ifndef QUANT_MODEL_ROPE_H
#define QUANT_MODEL_ROPE_H

#include <stdint.h>

#include "quant/backend/backend.h"
#include "quant/model/config.h"

/* Fills f for a forward whose positions run up to seq_len - 1 (rotated dims: head_dim times
 * partial_rotary_factor), for the full-attention layers (sliding 0: c->rope, rope_theta) or
 * the sliding-window ones (c->rope_local, rope_theta_local: Gemma 3's local base). QD_EINVAL
 * when the rotated dims exceed the table. */
int qd_rope_freqs_compute(const qd_model_config *c, int sliding, int64_t seq_len, qd_rope_freqs *f, qd_err *err);
/* The longest sequence the model's positions allow: max_position_embeddings, except for
 * dynamic scaling, which extends it by its factor. */
int64_t qd_rope_max_seq(const qd_model_config *c);

#endif
