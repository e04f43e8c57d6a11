/* Inside the serving check (tp_serving.c): one input group's linears as the layers vLLM
 * builds from them. A part is the group's linears [first, last) as one vLLM linear (fused
 * when more than one), or, with first == last, a layer vLLM builds unquantized from block
 * tensors quantd does not treat as linears (named by name). */
#ifndef QUANT_TP_TP_SERVING_PARTS_H
#define QUANT_TP_TP_SERVING_PARTS_H

#include "quant/formats/serving.h"
#include "quant/model/model.h"

typedef struct qd_srv_part {
    int first, last;
    const char *fused;        /* vLLM's name of the fused layer ("fused_qkv_a_proj"); NULL: the linear's own */
    const char *name;         /* first == last: the layer's name after the block prefix */
    int row_parallel;         /* RowParallelLinear */
    int replicated;           /* ReplicatedLinear or disable_tp: the whole layer on every rank (checked as at tp 1) */
    int64_t per_shard;        /* column-parallel: out features per rank; -1: n / tp, 0 when tp does not divide n */
    int n_members;            /* fused: each member's out features per rank (FP8 blocks check them); 0 unknown */
    int64_t member_n[QD_SRV_MAX_PARTS];
    char no_load[200];        /* set: vLLM cannot build the layer at this tp, and why */
} qd_srv_part;

/* Multi-head latent attention (cfg->kv_lora_rank > 0): the parts of attention group G
 * (tp_serving_mla.c). Returns their count, or -1 when G holds a linear vLLM's MLA does not
 * build (the caller refuses by name). */
int qd_tp_serving_mla_parts(const qd_model *m, const qd_input_group *G, int tp, qd_srv_part *parts, int cap);

#endif
