/* The checkpoint state (.quantd/state.json) and the per-layer results that also make up
 * the final report.
 *
 * state.json carries QD_STATE_VERSION, the fingerprint (model files, output-changing job
 * options, calibration token ids, backend), the next block to run, the block whose inputs
 * the activation file holds (acts_block; absent in older checkpoints: next_block), every finished
 * layer's result, and the measured peaks of memory and disk so far (optional fields). It is written atomically and last, after the block's tensors and the next
 * block's activations: it is the commit point of a block. */
#ifndef QUANT_PIPELINE_STATE_H
#define QUANT_PIPELINE_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "quant/core/error.h"
#include "quant/pipeline/cost.h"

/* .quantd/state.json; bump when its meaning or the blocks' content changes (2: AWQ scales
 * v -> o per KV channel under GQA, so version-1 blocks would not match). A checkpoint of
 * another version is refused (qd_state_load), and the job starts over with overwrite. */
#define QD_STATE_VERSION 2

typedef struct qd_layer_result {
    char name[160];          /* full module name: "model.layers.3.self_attn.q_proj" */
    char method[16];         /* "gptq", "awq", "rtn", "awq+gptq", "float" (left unquantized) */
    int block;
    int64_t n, k;
    double damp;             /* GPTQ damping fraction used (0 when not GPTQ) */
    int fallback;            /* GPTQ fell back to RTN */
    double rel_error;        /* ||W X - Q X|| / ||W X|| on this layer's calibration inputs */
    double rel_error_direct; /* the same over the first job.error_direct_rows input rows,
                                computed directly (debugging); -1: not computed */
    double seconds;
    int kernel_checked;      /* the packed layer went through the kernel self-check */
    double kernel_max_err;   /* its max |kernel - reference| relative to max |reference| */
    char note[160];          /* why left in float, awq alpha, ... */
    int64_t routed_tokens;   /* MoE expert: calibration tokens routed to it; -1 otherwise */
    char worker[64];         /* the workers that ran its parts when the block's parts were
                                spread over several ("cpu-0,cpu-1", docs/parallel.md); "" otherwise */
    int n_parts;             /* the row ranges it was quantized in (0 or 1: one) */
    double part_seconds_max; /* with several: the slowest part's GPTQ seconds (seconds is their sum) */
} qd_layer_result;

typedef struct qd_fingerprint {
    char model[65];          /* sha256 hex: config.json, every safetensors header, size, edges */
    char options[65];        /* sha256 hex of the job's output-changing options */
    char calib[65];          /* sha256 hex of the calibration token ids */
    char backend[16];        /* "cpu", "cuda" */
} qd_fingerprint;

typedef struct qd_ckpt_state {
    int version;
    qd_fingerprint fp;
    int next_block, n_blocks;
    int acts_block;          /* the block whose inputs .quantd/acts-NNN.bin holds (0: none, the
                                embedding is recomputed); blocks acts_block..next_block-1 are
                                re-run on resume (job.checkpoint) */
    int cross_backend;       /* some block was computed on another backend */
    double seconds;          /* quantization seconds so far, all runs */
    qd_layer_result *layers; /* owned */
    size_t n_layers, cap_layers;
    qd_block_cost *blocks;   /* owned: one per committed block, in commit order */
    size_t n_blocks_cost, cap_blocks_cost;
    char awq_note[160];      /* how AWQ treated v->o under GQA, etc. */
    uint64_t fence;          /* lease fencing token of the last commit (0: none); a
                                commit under a lower token is refused (proto/redis.md) */
    uint64_t peak_rss_bytes; /* measured peaks so far, the most over every run of the job
                                (qd_pipeline_sample_peaks): the resident set of the process */
    uint64_t peak_disk_bytes;/* ... and the output directory's bytes (checkpoint + output);
                                both optional in state.json, absent (0) in older checkpoints */
    char compute[8];         /* the arithmetic the job's blocks ran with, "f32" or "bf16" (its
                                "compute", "auto" resolved once: qd_pipeline_compute_resolve);
                                "" in checkpoints older than "auto", which ran f32 unless the job
                                said bf16 */
} qd_ckpt_state;

void qd_state_init(qd_ckpt_state *s);
void qd_state_free(qd_ckpt_state *s);                    /* frees layers and blocks; accepts zeroed */
int qd_state_add_layer(qd_ckpt_state *s, const qd_layer_result *r);
/* Records a committed block's cost (replacing an earlier record of the same block). */
int qd_state_add_block_cost(qd_ckpt_state *s, const qd_block_cost *c);
/* Loads path; QD_ENOTFOUND when there is none, QD_EMISMATCH for another version. */
int qd_state_load(const char *path, qd_ckpt_state *s, qd_err *err);
int qd_state_save(const char *path, const qd_ckpt_state *s, qd_err *err);
/* Compares fingerprints; on mismatch says which part differs (backend differences are not
 * a mismatch: the caller records cross_backend). */
int qd_fingerprint_check(const qd_fingerprint *have, const qd_fingerprint *want, qd_err *err);
/* Fingerprint of a model directory: config.json bytes, and for every *.safetensors file
 * (sorted by name) its name, size, header and the first and last MiB of its data. Hashing
 * every weight byte of a 70B model would take minutes; headers plus sizes plus edges catch
 * a different or re-saved checkpoint in practice. */
int qd_fingerprint_model_dir(const char *dir, char hex[65], qd_err *err);
/* One layer's result as a JSON object (for state.json and quantd_report.json); the caller
 * owns the returned tree (cJSON_Delete). */
struct cJSON;
struct cJSON *qd_layer_result_to_json(const qd_layer_result *r);

#endif
