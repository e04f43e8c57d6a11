/* The pre-flight estimate of a job (qd_pipeline_estimate_job, pipeline.h): peak host memory
 * and peak disk, from config.json and the job alone, before a weight is read. The pipeline
 * refuses a job whose estimate exceeds free memory or disk, the daemon admits jobs by it and
 * publishes it in the job's status, `quantctl estimate` prints it, and every report sets it
 * beside the peaks the run measured (report.c's resources). Each term below names what it stands for in the code, so a
 * change there (a buffer, a file) shows which term to change. It is meant as an upper bound
 * that is not far above reality: test_estimate runs real jobs and holds the estimate between
 * the measured peak and twice it.
 *
 * The figures assume the CPU backend, where every buffer is host memory; on a GPU most of the
 * RAM terms live in device memory instead, so the host estimate is high there. */
#include "quant/formats/scheme.h"
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <cjson/cJSON.h>

#include "quant/algo/awq.h"
#include "quant/core/fsutil.h"
#include "quant/core/meminfo.h"
#include "quant/core/safetensors.h"
#include "quant/model/eval.h"
#include "quant/model/model.h"
#include "quant/pipeline/acts.h"
#include "quant/pipeline/pipeline_internal.h"
#include "quant/pipeline/wave.h"

/* Code, shared libraries, the BLAS library's thread buffers, the tokenizer, allocator slack:
 * what a quantctl process holds beside a job's own buffers (about 10 MiB measured for the
 * smallest job; a job of large BLAS products touches about 2 MiB more of OpenBLAS's buffers
 * per thread; rounded up for 16 threads). */
#define EST_BASE_BYTES (48ull << 20)
/* What the heap keeps beside a job's live buffers: every program keeps its freed memory for
 * its next allocations (qst_malloc_tune), so a freed buffer's room is reused only by those
 * that fit in it. Measured on test_estimate's synthetic jobs at 0.5% to 2% of their buffers
 * (bench/results/malloc.md): counted as 1/24 of them. */
#define EST_HEAP_KEPT_DIV 24
/* Forward scratch per row of a batch for models with experts, in units of the widest
 * activation row (8 rows of floats); a dense model's is counted buffer by buffer. */
#define EST_SCRATCH_ROWS 8

static uint64_t u64max(uint64_t a, uint64_t b) { return a > b ? a : b; }
/* buffers, and the room the heap keeps beside them (EST_HEAP_KEPT_DIV) */
static uint64_t heap_kept(uint64_t buffers) { return buffers + buffers / EST_HEAP_KEPT_DIV; }
static uint64_t u64min(uint64_t a, uint64_t b) { return a < b ? a : b; }

/* Calibration rows the pipeline will embed (qd_pipeline_calib_tokens): samples x seq_len
 * clamped to the context, or RTN's few random sequences when it has no data. */
static uint64_t calib_rows(const qp_job *job, const qd_model_config *cfg)
{
    uint64_t L = (uint64_t)job->calibration.seq_len, S = (uint64_t)job->calibration.samples;
    if (cfg->max_pos > 0) L = u64min(L, (uint64_t)cfg->max_pos);
    if (!job->calibration.path) {
        L = u64min(L, 512);
        S = u64min(S, 8);
    }
    return S * L;
}

/* Bytes of one float element of the model's unquantized tensors (copied in their dtype). */
static uint64_t float_bytes(const qd_model_config *cfg)
{
    return !strcmp(cfg->torch_dtype, "float32") ? 4 : 2;
}

/* The eval at the end (pipeline_finish.c, quant/model/eval.h): the held hidden states of one
 * pass (the whole stream when it fits the default budget), the stream's ids and text, and a
 * window's logits on device and host. The stream has at most one token per byte of text. */
static uint64_t eval_bytes(const qp_job *job, const qd_model_config *cfg)
{
    if (!job->eval.enabled) return 0;
    uint64_t L = (uint64_t)job->eval.seq_len, text = 0;
    struct stat sb;
    if (job->eval.path && stat(job->eval.path, &sb) == 0) text = (uint64_t)sb.st_size;
    uint64_t windows = (text + 1) / (L ? L : 1);
    if (job->eval.max_windows > 0) windows = u64min(windows, (uint64_t)job->eval.max_windows);
    uint64_t hidden = u64min(QD_EVAL_ACT_BYTES_DEFAULT, windows * L * (uint64_t)cfg->hidden * 4);
    return hidden + (text + 1) * 4 + text + L * (uint64_t)cfg->vocab * 4 * 2;
}

/* The part files of the largest fan-out and the largest part's memory (part.h). A part is
 * a row range of a linear (at most QD_PART_ROWS rows, part.h's rule, mirrored by
 * part_ranges); its input names its rows of the weight in the model's files (without AWQ,
 * a dense model in BF16, F16 or F32) or holds them (in half precision when read from a
 * half-precision checkpoint, else F32, twice with AWQ's clipped copy), its output the codes in a byte and the group scales and zeros (the lead decodes
 * the rows from the codes); each group's Hessian is one file, its upper triangle, with the
 * upper triangle of GPTQ's factorisation of it beside it; every file has a header of a few
 * KiB at most. Where a form does not apply (part.h: each is checked) a file is larger. A step fans out only with more than one part: q/k/v, o, gate/up, down each alone
 * when true-sequential (AWQ too), the whole block otherwise; a MoE wave as many experts as
 * the capture's Hessian budget holds. */
#define EST_PART_FILE_BYTES (8ull << 10)
#define EST_PART_ROWS 2048

static uint64_t part_ranges(uint64_t n) { return n <= EST_PART_ROWS ? 1 : (n + EST_PART_ROWS - 1) / EST_PART_ROWS; }

typedef struct part_step {
    uint64_t bytes, parts;
} part_step;

/* Adds `count` linears of n rows and k inputs, and `groups` Hessians of k x k (tri upper
 * triangles of F32 each: 1, or 2 with GPTQ's factorisation beside it), to s. */
static void step_add(part_step *s, uint64_t count, uint64_t n, uint64_t k, uint64_t groups, uint64_t per, uint64_t tri)
{
    uint64_t parts = count * part_ranges(n);
    s->parts += parts;
    s->bytes += count * n * k * per + groups * tri * (k * (k + 1) / 2 * 4) + (2 * parts + groups) * EST_PART_FILE_BYTES;
}

static uint64_t step_bytes(part_step s) { return s.parts > 1 ? s.bytes : 0; }

static int plain_dense(const qd_model_config *cfg) { return cfg->n_experts <= 0; }
#define EST_CPART_MAX 16   /* part.h's QD_CPART_MAX */

/* The capture step's files and parts (part_capture.c): a dense block's passes cut at its
 * forward batches (more than one batch; at most QD_CPART_MAX parts) when the job runs neither
 * AWQ nor GPTAQ (counted whatever the backend: only the CPU backend cuts them). A cut pass's
 * files: its half's input over every calibration row, the inputs its groups' hooks saw (the
 * float pass without true-sequential: every group's; true-sequential: at most the down
 * projection's), the half's outputs (the last forward's), and the block's state files (its
 * quantized linears in F32: the whole block by the last forward). A part holds the block's
 * F32 weights, its rows' input, outputs and records, and a forward batch's scratch; the lead
 * reads one part's records at a time, and may run a part itself (part_lead_bytes). */
/* A MoE block's capture passes over its experts, cut by experts (part_capture.c) for GPTQ
 * true-sequential: each wave's pass (gate/up, then down: as many experts as the Hessian
 * budget holds) goes out as at most QD_CPART_MAX parts of its groups. Its files: the MLP
 * half's input over every row (once a pass), a down part's experts' quantized gate/up in F32
 * in its input, and each part's Hessians' upper triangles. A part holds the block without its
 * linears (its norms and router) and its experts' linears it sets (a down part's gate/up,
 * beside its input file), that input, its groups' Hessians and a forward batch's scratch;
 * the lead decodes a part's Hessians into its own and runs a part itself on its own block
 * (no second copy of the weights). */
static uint64_t capture_terms_moe(const qp_job *job, const qd_model_config *cfg, uint64_t rows, qd_pipeline_estimate *est)
{
    if (job->method != QP_METHOD_GPTQ || !job->true_sequential || job->gptaq || rows == 0) return 0;
    uint64_t h = (uint64_t)cfg->hidden, mi = (uint64_t)cfg->moe_intermediate, si = (uint64_t)cfg->shared_intermediate;
    uint64_t E = (uint64_t)cfg->n_experts;
    uint64_t e_gu = qd_wave_most(E, h * h * 4, QD_WAVE_HESSIAN_BYTES);
    uint64_t e_dn = qd_wave_most(E, mi * mi * 4, QD_WAVE_HESSIAN_BYTES);
    uint64_t per_gu = (e_gu + EST_CPART_MAX - 1) / EST_CPART_MAX, per_dn = (e_dn + EST_CPART_MAX - 1) / EST_CPART_MAX;
    uint64_t params = E * h + 8 * h;   /* the router, the norms */
    uint64_t x = rows * h * 4;
    uint64_t in_gu = 0, in_dn = per_dn * 2 * mi * h * 4;                     /* a part's input file */
    uint64_t hs_gu = per_gu * h * h * 4, hs_dn = per_dn * mi * mi * 4;        /* a part's Hessians */
    uint64_t disk = x + u64max(e_gu * h * (h + 1) / 2 * 4, e_dn * (2 * mi * h + mi * (mi + 1) / 2) * 4) +
                    2 * (e_gu + 1) * EST_PART_FILE_BYTES;
    est->part_disk_bytes = u64max(est->part_disk_bytes, disk);
    uint64_t scratch = u64max(4096, (uint64_t)job->calibration.seq_len) * (3 * h + 2 * u64max(mi, si) + E) * 4;
    /* A part's input file and its Hessians with their triangles' copy for its output; a
     * helper also loads the linears it sets (the lead's own part runs on the lead's). */
    uint64_t own = x + u64max(in_gu + hs_gu + hs_gu / 2, in_dn + hs_dn + hs_dn / 2) + scratch;
    est->part_ram_bytes = u64max(est->part_ram_bytes, EST_BASE_BYTES + params * 4 + own + in_dn);
    est->part_lead_bytes = u64max(est->part_lead_bytes, own);
    return params * 4 + in_dn;   /* what a helper keeps loaded between its capture parts */
}

/* The capture parts' terms (above for a MoE block); returns what a helper keeps loaded
 * between its capture parts (worker.c: until a part of another block, or 60 idle seconds),
 * beside the block's other parts it runs meanwhile: 0 when the passes are not cut. */
static uint64_t capture_terms(const qp_job *job, const qd_model_config *cfg, qd_pipeline_estimate *est)
{
    int awq = job->method == QP_METHOD_AWQ || job->method == QP_METHOD_AWQ_GPTQ;
    if (!awq && cfg->n_experts > 0) return capture_terms_moe(job, cfg, calib_rows(job, cfg), est);
    uint64_t L = (uint64_t)job->calibration.seq_len, rows = calib_rows(job, cfg);
    if (awq || job->gptaq || !plain_dense(cfg) || L == 0 || rows == 0) return 0;
    if (cfg->max_pos > 0) L = u64min(L, (uint64_t)cfg->max_pos);
    if (!job->calibration.path) L = u64min(L, 512);
    uint64_t bs = 4096 / L ? 4096 / L : 1, n_seq = rows / L, nb = (n_seq + bs - 1) / bs;
    if (nb < 2) return 0;
    uint64_t P = u64min(nb, EST_CPART_MAX), part_rows = (nb + P - 1) / P * bs * L;
    uint64_t h = (uint64_t)cfg->hidden, inter = (uint64_t)cfg->intermediate;
    uint64_t qd = (uint64_t)(cfg->n_heads * cfg->head_dim), kvd = (uint64_t)(cfg->n_kv_heads * cfg->head_dim);
    int seq = job->method == QP_METHOD_GPTQ && job->true_sequential;
    uint64_t rec = seq ? u64max(inter, qd) : h + qd + h + inter;   /* the widest pass's recorded inputs per row */
    uint64_t params = h * qd * 2 + h * kvd * 2 + 3 * h * inter;
    /* With shards a part sums its shard's Hessians and records only its kept rows (the
     * activation the down projection's pass keeps, true-sequential): the upper triangles, a
     * part each. */
    uint64_t tri = 0, hs = 0;   /* the files' triangles; a part's Hessians (and the lead's decoded copy) */
    if (job->calibration.shards > 1) {
        P = u64min(u64min(nb, (uint64_t)job->calibration.shards), EST_CPART_MAX);
        part_rows = (nb + P - 1) / P * bs * L;
        rec = seq ? u64max(inter, qd) : 0;
        uint64_t k2 = seq ? inter * inter : 2 * h * h + qd * qd + inter * inter;
        tri = P * (k2 / 2 + h + qd + inter) * 4;
        hs = k2 * 4;
    }
    uint64_t disk = params * 4 + rows * (2 * h + rec) * 4 + tri + 2 * P * EST_PART_FILE_BYTES;
    est->part_disk_bytes = u64max(est->part_disk_bytes, disk);
    uint64_t batch_rows = u64max(4096, L);
    uint64_t scratch = batch_rows * (3 * h + 2 * qd + 2 * kvd + 2 * inter) * 4;
    uint64_t part = EST_BASE_BYTES + params * 4 + part_rows * (3 * h + rec) * 4 + scratch + hs;
    est->part_ram_bytes = u64max(est->part_ram_bytes, part);
    est->part_lead_bytes = part + part_rows * rec * 4 + hs;
    return params * 4;   /* the block, as the lead held it at the pass */
}

static void part_terms(const qp_job *job, const qd_model_config *cfg, qd_pipeline_estimate *est)
{
    int awq = job->method == QP_METHOD_AWQ || job->method == QP_METHOD_AWQ_GPTQ;
    int seq = awq || (job->method == QP_METHOD_GPTQ && job->true_sequential);
    int plain = !cfg->quantized && !cfg->source_fp8 && !cfg->source_mxfp4;
    int half = !awq && plain && (!strcmp(cfg->torch_dtype, "float16") || !strcmp(cfg->torch_dtype, "bfloat16"));
    /* Without AWQ a dense model's rows are read from its own files (part_src.c): the code
     * and its share of the group scales and zeros (at most 1 byte a weight at group 16)
     * alone. Experts may be slices of fused tensors, which travel in the files. */
    int src = !awq && plain && cfg->n_experts <= 0 &&
              (half || !strcmp(cfg->torch_dtype, "float32") || !cfg->torch_dtype[0]);
    uint64_t per = awq ? 9 : src ? 2 : half ? 3 : 5;   /* bytes per weight element: in (+ clipped), code */
    uint64_t hb = job->method == QP_METHOD_GPTQ || job->method == QP_METHOD_AWQ_GPTQ ? 2 : 1;   /* triangles */
    uint64_t h = (uint64_t)cfg->hidden, qd = (uint64_t)(cfg->n_heads * cfg->head_dim);
    uint64_t kvd = (uint64_t)(cfg->n_kv_heads * cfg->head_dim), inter = (uint64_t)cfg->intermediate;
    uint64_t E = (uint64_t)(cfg->n_experts > 0 ? cfg->n_experts : 0), mi = (uint64_t)cfg->moe_intermediate;
    part_step qkv = {0}, o = {0}, gu = {0}, dn = {0}, all = {0};
    step_add(&qkv, 1, qd, h, 1, per, hb);
    step_add(&qkv, 2, kvd, h, 0, per, hb);
    step_add(&o, 1, h, qd, 1, per, hb);
    if (E) {
        /* experts' waves (pipeline_block.c), or every expert at once without waves; AWQ one
         * expert's gate/up at a time */
        uint64_t e1 = awq ? 1 : seq ? qd_wave_most(E, h * h * 4, QD_WAVE_HESSIAN_BYTES) : E;
        uint64_t e2 = awq ? 1 : seq ? qd_wave_most(E, mi * mi * 4, QD_WAVE_HESSIAN_BYTES) : E;
        step_add(&gu, 2 * e1, mi, h, e1, per, hb);
        step_add(&dn, e2, h, mi, e2, per, hb);
    } else {
        step_add(&gu, 2, inter, h, 1, per, hb);
        step_add(&dn, 1, h, inter, 1, per, hb);
    }
    uint64_t big = u64max(u64max(step_bytes(qkv), step_bytes(o)), u64max(step_bytes(gu), step_bytes(dn)));
    if (!seq) {
        all.bytes = qkv.bytes + o.bytes + gu.bytes + dn.bytes;
        all.parts = qkv.parts + o.parts + gu.parts + dn.parts;
        big = step_bytes(all);
    }
    est->part_disk_bytes = big;
    uint64_t k = u64max(u64max(h, qd), u64max(inter, mi)), rows = u64min(u64max(h, u64max(inter, qd)), EST_PART_ROWS);
    uint64_t quant = EST_BASE_BYTES + 4 * k * k * 4 + rows * k * (8 + 9 + 9);   /* a quantize or factor part */
    est->part_ram_bytes = quant;
    uint64_t kept = capture_terms(job, cfg, est);   /* raises part_ram_bytes to a capture part's */
    est->part_ram_bytes = u64max(est->part_ram_bytes, quant + kept);
    est->part_ram_bytes = EST_BASE_BYTES + heap_kept(est->part_ram_bytes - EST_BASE_BYTES);
    est->part_lead_bytes = heap_kept(est->part_lead_bytes);
}

/* A vision-language model's tensors outside the text tower's blocks (vision tower,
 * projector, embeddings, lm_head), copied to the output as they are: their bytes, from the
 * safetensors headers (no weight is read). 0 when they cannot be opened: the job's own
 * open reports that. */
static uint64_t vlm_rest_bytes(const char *dir)
{
    static const char *const blocks[] = {"model.layers.", "model.language_model.layers.", "language_model.model.layers."};
    st_model *m = NULL;
    qd_err e = {0};
    if (st_model_open(dir, &m, &e)) return 0;
    uint64_t n = 0;
    for (size_t i = 0; i < st_model_count(m); i++) {
        const st_tensor *t = st_model_tensor(m, i);
        int in_block = 0;
        for (size_t b = 0; b < sizeof blocks / sizeof blocks[0]; b++) in_block |= !strncmp(t->name, blocks[b], strlen(blocks[b]));
        if (!in_block) n += (uint64_t)t->numel * qd_dtype_size(t->dtype);
    }
    st_model_close(m);
    return n;
}

int qd_pipeline_estimate_job(const qp_job *job, qd_pipeline_estimate *est, qd_err *err)
{
    qd_model_config cfg;
    int rc = qd_model_config_load(job->model, &cfg, err);
    if (rc) return rc;
    memset(est, 0, sizeof *est);
    uint64_t rows = calib_rows(job, &cfg);
    uint64_t h = (uint64_t)cfg.hidden, inter = (uint64_t)cfg.intermediate, V = (uint64_t)cfg.vocab;
    uint64_t kvd = (uint64_t)(cfg.n_kv_heads * cfg.head_dim), qd = (uint64_t)(cfg.n_heads * cfg.head_dim);
    uint64_t attn_params = h * qd * 2 + h * kvd * 2;
    if (cfg.kv_lora_rank > 0) {
        /* Latent attention: q_a/q_b (or q_proj), kv_a, kv_b, o_proj. */
        uint64_t H = (uint64_t)cfg.n_heads, qk = (uint64_t)(cfg.qk_nope_dim + cfg.qk_rope_dim);
        uint64_t ql = (uint64_t)cfg.q_lora_rank, kl = (uint64_t)cfg.kv_lora_rank;
        attn_params = (ql ? h * ql + ql * H * qk : h * H * qk) + h * (kl + (uint64_t)cfg.qk_rope_dim) +
                      kl * H * (uint64_t)(cfg.qk_nope_dim + cfg.v_head_dim) + H * (uint64_t)cfg.v_head_dim * h;
        /* DeepSeek-V3.2's indexer: wq_b, and wk, weights_proj and k_norm in float. */
        if (cfg.index_topk > 0)
            attn_params += ql * (uint64_t)(cfg.index_heads * cfg.index_head_dim) +
                           h * (uint64_t)(cfg.index_head_dim + cfg.index_heads) + 2 * (uint64_t)cfg.index_head_dim;
    }
    /* A hybrid's recurrent layer holds its mixer instead of attention (model_mixer.c): the
     * block is the larger kind; mix_rows is the mixer's forward scratch per row (in_proj's
     * output, the convolution's, the scan's) and mix_wide its widest linear's rows. */
    uint64_t mix_rows = 0, mix_wide = 0, mix_in = 0;
    if (cfg.layout == QD_LAYOUT_LFM2) {
        mix_wide = 3 * h;
        mix_rows = 4 * h;
        attn_params = u64max(attn_params, 4 * h * h + h * (uint64_t)cfg.mixer.conv_kernel);
    } else if (cfg.layout == QD_LAYOUT_GRANITE_HYBRID) {
        uint64_t in = (uint64_t)(cfg.mixer.ssm_heads * cfg.mixer.ssm_head_dim), gn = (uint64_t)(cfg.mixer.ssm_groups * cfg.mixer.ssm_state);
        uint64_t conv = in + 2 * gn;
        mix_wide = in + conv + (uint64_t)cfg.mixer.ssm_heads;
        mix_rows = mix_wide + conv + in;
        mix_in = in;
        attn_params = u64max(attn_params, h * mix_wide + in * h + conv * (uint64_t)cfg.mixer.conv_kernel + in);
    }
    uint64_t block_params = attn_params + (cfg.family == QD_ARCH_OPT ? 2 : 3) * h * inter;
    uint64_t n_linears = cfg.family == QD_ARCH_OPT ? 6 : 7;
    if (cfg.n_experts > 0) {
        /* Every expert's three linears, the shared expert's, and the float router. */
        inter = (uint64_t)(cfg.moe_intermediate > cfg.shared_intermediate ? cfg.moe_intermediate : cfg.shared_intermediate);
        block_params = attn_params + 3 * h * (uint64_t)(cfg.n_experts * cfg.moe_intermediate) +
                       3 * h * (uint64_t)cfg.shared_intermediate + h * (uint64_t)cfg.n_experts;
        n_linears = 4 + 3 * (uint64_t)cfg.n_experts + (cfg.shared_intermediate > 0 ? 3 : 0);
        if (cfg.layout == QD_LAYOUT_GRANITE_HYBRID) {
            /* Granite-4's shared_mlp beside the experts: input_linear [2 FF, H], output_linear. */
            block_params += 3 * h * (uint64_t)cfg.intermediate;
            inter = u64max(inter, (uint64_t)cfg.intermediate);
            n_linears += 2;
        }
    }
    uint64_t widest = u64max(u64max(inter, h), mix_in);   /* Mamba-2's out_proj reads its inner width */
    est->n_blocks = (int)cfg.n_layers;

    /* ---- memory ---- */
    /* Calibration hidden states of one block, in and out (p->acts and y, F32 in memory), the
     * residual stream between the block's halves (p->mid, true-sequential and AWQ), and the
     * host copy an activation file is written from (pipeline_block.c) or read into on a
     * resume (pipeline.c): its size is the file's, BF16 for a half-precision model; none
     * when the job writes no activation file (no more blocks than checkpoint.acts_every). */
    int sequential = job->method == QP_METHOD_AWQ || job->method == QP_METHOD_AWQ_GPTQ ||
                     (job->method == QP_METHOD_GPTQ && job->true_sequential);
    est->act_bytes = rows * h * 4;
    qd_dtype wdt = !strcmp(cfg.torch_dtype, "float16") ? QD_DTYPE_F16 : !strcmp(cfg.torch_dtype, "bfloat16") ? QD_DTYPE_BF16 : QD_DTYPE_F32;
    uint64_t act_file = qd_acts_file_bytes((int64_t)rows, (int64_t)h, qd_acts_dtype_for(wdt));
    uint64_t acts_written = ((uint64_t)cfg.n_layers - 1) / (uint64_t)qp_job_acts_every(job);
    uint64_t acts = est->act_bytes * (sequential ? 3 : 2) + (acts_written > 0 ? act_file : 0);
    /* job.gptaq (pipeline_gptaq.c): the float stream in and out, and every input group's
     * float-model input the float pass keeps (q/k/v and gate/up read the hidden width, o_proj
     * the attention's, down_proj the intermediate). */
    if (job->gptaq) acts += 2 * est->act_bytes + rows * (2 * h + qd + inter) * 4;
    /* A dense true-sequential GPTQ block may keep its MLP activation for the final forward
     * (pipeline_block.c): live with the three copies above, added at the end once the peak
     * without it is known (qd_pipeline_mlp_keep_decide). An AWQ block keeps it always: it is
     * the input its down capture holds for the clip search, which the AWQ term counts. */
    int awq_method = job->method == QP_METHOD_AWQ || job->method == QP_METHOD_AWQ_GPTQ;
    if (cfg.n_experts == 0 && (awq_method || (job->method == QP_METHOD_GPTQ && job->true_sequential)))
        est->mlp_act_bytes = rows * (uint64_t)cfg.intermediate * 4;
    /* One block's F32 weights and an override's, and the linear being quantized: its loaded
     * copy and its Q (pipeline_block.c frees both once Q is in the block's weights). These
     * count the parameters config.json gives, as F32, whatever the file stores: an FP8-block
     * source (DeepSeek-V3's F8_E4M3 weights, a quarter of these bytes on disk) is dequantized
     * into the same F32 block when it is loaded (model_fp8.c), its scales read one linear at
     * a time (a few KiB: not counted). The
     * widest linear: an MLP one (a MoE model's dense layers too: DeepSeek's first) or q/o. */
    uint64_t widest_linear = h * u64max(u64max(u64max(inter, (uint64_t)cfg.intermediate), qd), mix_wide);
    uint64_t weights = block_params * 4 * 2 + 2 * widest_linear * 4;
    /* One forward batch: batch_seqs * seq_len rows, 4096 or one sequence when longer. */
    uint64_t batch_rows = u64max(4096, (uint64_t)job->calibration.seq_len);
    /* A dense block's forward scratch (model_forward.c), per row of a batch: the norm's
     * copy, the sub-block's output and a capture pass's discarded output (3 x hidden), q
     * and the attention's output (2 x heads x head_dim), k and v (2 x kv_heads x head_dim),
     * the MLP's two intermediate rows (2 x intermediate). */
    uint64_t scratch = cfg.n_experts > 0 ? batch_rows * widest * 4 * EST_SCRATCH_ROWS
                                         : batch_rows * (3 * h + 2 * qd + 2 * kvd + 2 * inter) * 4;
    if (cfg.kv_lora_rank > 0) {
        /* Latent attention assembles the heads, padded to one width, on the host (6 copies)
         * and in backend scratch (7): model_mla.c. */
        uint64_t qk = (uint64_t)(cfg.qk_nope_dim + cfg.qk_rope_dim), v = (uint64_t)cfg.v_head_dim;
        scratch += batch_rows * (uint64_t)cfg.n_heads * u64max(qk, v) * 4 * 13;
        /* DeepSeek-V3.2's indexer (model_dsa.c): q, k, the weights and the RoPE parts in backend
         * memory and on the host, and the scores [rows, seq] (floats) and keys kept (bytes) in both. */
        if (cfg.index_topk > 0)
            scratch += batch_rows * ((uint64_t)((cfg.index_heads + 1) * (cfg.index_head_dim + cfg.qk_rope_dim) +
                                                cfg.index_heads) * 4 * 2 +
                                     (uint64_t)job->calibration.seq_len * 5 * 2);
    }
    scratch += batch_rows * mix_rows * 4;
    uint64_t hess = widest * widest * 4 * 3;                        /* H, Hinv, work */
    if (job->gptaq) hess += widest * widest * 4 * 4;               /* GPTAQ: dXXT, P, D U^T, U */
    /* calibration.shards: a pass fills its Hessians a shard at a time, beside the sums so far
     * (pipeline_capture.c): twice each Hessian of the pass. */
    uint64_t per_shard = job->calibration.shards > 1 ? 2 : 1;
    if (cfg.n_experts > 0 && (job->method == QP_METHOD_RTN || (job->method == QP_METHOD_GPTQ && !job->true_sequential))) {
        /* One calibration pass fills every group's Hessian at once: every expert's two. */
        uint64_t mi = (uint64_t)cfg.moe_intermediate, si = (uint64_t)cfg.shared_intermediate;
        hess += per_shard * ((uint64_t)cfg.n_experts * (h * h + mi * mi) + (si ? h * h + si * si : 0) + 2 * h * h) * 4;
    }
    if (cfg.n_experts > 0 && job->method == QP_METHOD_GPTQ && job->true_sequential) {
        /* A capture pass fills a wave of experts' Hessians at once, up to the wave budget,
         * the wave's passes of even sizes (wave.h): the largest pass's. */
        uint64_t mi = (uint64_t)cfg.moe_intermediate, E = (uint64_t)cfg.n_experts;
        hess += per_shard * u64max(qd_wave_most(E, h * h * 4, QD_WAVE_HESSIAN_BYTES) * h * h * 4,
                                   qd_wave_most(E, mi * mi * 4, QD_WAVE_HESSIAN_BYTES) * mi * mi * 4);
    }
    if (cfg.n_experts == 0 && per_shard > 1) {
        /* A dense block's pass: one group's (true-sequential), or all four at once. */
        int all = job->method == QP_METHOD_RTN || (job->method == QP_METHOD_GPTQ && !job->true_sequential);
        uint64_t pass = all ? (2 * h * h + qd * qd + inter * inter) * 4 : widest * widest * 4;
        hess = u64max(hess, 2 * pass);
    }
    /* AWQ (quant/algo/awq.c, pipeline_awq.c), for its largest input group (gate/up or q/k/v,
     * input width hidden), the larger of its two phases, plus six copies of the group's
     * weights at most (the candidates' fake-quantized weights and their copies, the clip
     * search's four working matrices):
     * - the scale search: the module losses' rows (AWQ_SEARCH_TOKENS tokens: the MLP's input,
     *   its reference output and a candidate's, the gate and up rows; the attention's
     *   reference output, one forward batch's scratch output and candidate output); with
     *   experts, also an expert's own capture of its input over every row and its reference
     *   outputs W X, cached only while they fit qd_awq_opts.ref_cache_bytes (a dense block's
     *   own-loss groups use the Gram form, which needs neither);
     * - the true-sequential quantization: down_proj's input over every calibration row, held
     *   for the clip search and the block's final forward. */
    uint64_t group_n = u64max(2 * inter, qd + 2 * kvd);
    uint64_t search = (uint64_t)AWQ_SEARCH_TOKENS * (4 * h + 2 * inter) * 4 + 2 * batch_rows * h * 4;
    if (cfg.n_experts > 0)
        search += rows * widest * 4 + u64min(rows * group_n * 4, (uint64_t)qd_awq_opts_default().ref_cache_bytes);
    uint64_t awq = (job->method == QP_METHOD_AWQ || job->method == QP_METHOD_AWQ_GPTQ)
                       ? u64max(search, rows * widest * 4) + 6 * h * group_n * 4 : 0;
    if (awq && cfg.n_experts > 0 && job->moe.awq_shared_input)
        /* The experts' shared-input search (pipeline_awq_moe.c): every expert's gate/up fake-quantized
         * per candidate, and the scored rows' residual stream, input and output. */
        awq += 2 * (uint64_t)cfg.n_experts * (uint64_t)cfg.moe_intermediate * h * 4 + 3 * (uint64_t)AWQ_SEARCH_TOKENS * h * 4;
    /* Resident for the whole job: lm_head converted to F32 when it is at most 256 MiB
     * (model_load.c; larger ones in 64 MiB chunks), and the calibration ids. */
    uint64_t lm = V * h * 4 <= (256ull << 20) ? V * h * 4 : (64ull << 20);
    uint64_t resident = EST_BASE_BYTES + lm + rows * 4;
    /* error_direct_rows (debugging): every group's first rows kept on the host (at most one
     * group per linear), and one layer's outputs and inputs on the backend. */
    uint64_t dr = (uint64_t)job->error_direct_rows;
    uint64_t direct = dr ? dr * widest * 4 * (n_linears + 2) : 0;
    /* The eval runs two models side by side (the output and the float reference), each with
     * its own forward scratch and one block's F32 weights. */
    uint64_t eval = job->eval.enabled ? eval_bytes(job, &cfg) + 2 * (scratch + block_params * 4) : 0;
    /* "compute": "bf16" (quant/backend/cpu/cpu_bf16.h): one projection's weights rounded
     * (an F32 copy on the portable path, twice the AMX tiles' bf16 packing), its input's
     * rounded rows (2048 F32 rows on the portable path; on the tiles each thread's 256 bf16
     * rows, 16 threads counted: the same bytes), and the Hessian's two packed copies of 2048
     * rows. They live while the forward and the Hessian's update run, when of GPTQ's buffers
     * only the Hessian being filled is: they count where they exceed GPTQ's other two
     * (measured on a 7B-shaped block: the peak RSS did not move). */
    /* auto may resolve to bf16 on a bfloat16 checkpoint (the backend decides: counted). */
    int bf16_on = job->compute == QP_COMPUTE_BF16 || (job->compute == QP_COMPUTE_AUTO && wdt == QD_DTYPE_BF16);
    uint64_t bf16 = bf16_on ? widest * u64max(h, inter) * 4 + 2048 * widest * 4 + 2 * 2048 * (widest + 32) * 2 : 0;
    hess = u64max(hess, widest * widest * 4 + bf16);
    est->peak_ram_bytes = resident + heap_kept(weights + acts + hess + scratch + awq + direct + eval);
    est->acts_ram_bytes = acts;
    qd_mem_limits ml;
    qd_mem_limits_read(NULL, &ml);
    if (est->mlp_act_bytes && awq_method) {
        est->keep_mlp_act = 1;
    } else if (est->mlp_act_bytes && qd_pipeline_mlp_keep_decide(est->mlp_act_bytes, est->peak_ram_bytes, ml.phys_bytes)) {
        est->keep_mlp_act = 1;
        est->mlp_act_added_bytes = est->mlp_act_bytes;
        est->peak_ram_bytes += est->mlp_act_bytes;
        est->acts_ram_bytes += est->mlp_act_bytes;
    }

    /* ---- disk ---- */
    /* A packed block: the weights at bits per parameter; per group and output column an F16
     * scale and a zero (up to 4 bytes in the formats' storage); g_idx (4 bytes per input
     * column of each linear); the block's norms in float. */
    uint64_t gs = job->group_size > 0 ? (uint64_t)job->group_size : h;
    /* The float schemes store one scale per group and no zero: E4M3 or E8M0 (1 byte) for
     * FP4, F32 for FP8 (at most: blocks and tensors share theirs). */
    const qd_scheme *sc = qp_job_scheme(job);
    uint64_t per_group = !sc || sc->grid == QD_GRID_INT ? 6 : sc->grid == QD_GRID_FP4_E2M1 ? 1 : 4;
    uint64_t q_block = block_params * (uint64_t)job->bits / 8 + block_params / gs * per_group + n_linears * widest * 4 + 4 * h * 4;
    /* target_bpw: at most that many bits per weight, scales and zeros counted. */
    if (job->target_bpw > 0)
        q_block = (uint64_t)((double)block_params * job->target_bpw / 8.0) + n_linears * widest * 4 + 4 * h * 4;
    /* The float rest of the output: embeddings, lm_head when untied, learned positions where
     * the architecture has them (OPT; a RoPE model stores none, whatever its
     * max_position_embeddings), final norm. */
    uint64_t fb = float_bytes(&cfg);
    uint64_t rest = V * h * fb * (cfg.tie_word_embeddings ? 1 : 2) + (uint64_t)qd_model_config_pos_rows(&cfg) * h * fb +
                    4 * h * fb;
    uint64_t vlm_rest = cfg.multimodal ? vlm_rest_bytes(job->model) : 0;
    if (vlm_rest) rest = vlm_rest;
    /* Checkpoint: every block file, and the activation files: one after every
     * checkpoint.acts_every-th block but the last, two of them for an instant once there is
     * an older one (acts-i is removed after acts-(i + every) is written); the output is
     * written while the checkpoint is still there. */
    est->acts_disk_bytes = u64min(acts_written, 2) * act_file;
    uint64_t ckpt = q_block * (uint64_t)cfg.n_layers + est->acts_disk_bytes;
    uint64_t output = q_block * (uint64_t)cfg.n_layers + rest;
    est->disk_bytes = ckpt + output;
    if (job->workers != 1) part_terms(job, &cfg, est);
    return 0;
}

int qd_pipeline_mlp_keep_decide(uint64_t keep_bytes, uint64_t peak_without, uint64_t phys_bytes)
{
    if (keep_bytes <= QD_MLP_KEEP_BYTES) return 1;
    return phys_bytes > 0 && peak_without + keep_bytes <= phys_bytes / 2;
}

int qd_pipeline_estimate_fit(qd_pipeline_estimate *est, uint64_t avail_bytes)
{
    uint64_t added = est->mlp_act_added_bytes;
    if (!est->keep_mlp_act || added <= QD_MLP_KEEP_BYTES || est->peak_ram_bytes <= avail_bytes ||
        est->peak_ram_bytes - added > avail_bytes)
        return 0;
    est->keep_mlp_act = 0;
    est->mlp_act_added_bytes = 0;
    est->peak_ram_bytes -= added;
    est->acts_ram_bytes -= added;
    return 1;
}

cJSON *qd_pipeline_estimate_to_json(const qd_pipeline_estimate *est)
{
    cJSON *o = cJSON_CreateObject();
    if (!o || !cJSON_AddNumberToObject(o, "peak_ram_bytes", (double)est->peak_ram_bytes) ||
        !cJSON_AddNumberToObject(o, "disk_bytes", (double)est->disk_bytes) ||
        !cJSON_AddNumberToObject(o, "mlp_act_kept_bytes", (double)(est->keep_mlp_act ? est->mlp_act_bytes : 0)) ||
        !cJSON_AddNumberToObject(o, "part_disk_bytes", (double)est->part_disk_bytes) ||
        !cJSON_AddNumberToObject(o, "part_ram_bytes", (double)est->part_ram_bytes) ||
        !cJSON_AddNumberToObject(o, "part_lead_bytes", (double)est->part_lead_bytes)) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

void qd_pipeline_estimate_hint(const qd_pipeline_estimate *est, int which, char *buf, size_t cap)
{
    if (which == 0) {
        double acts = est->acts_ram_bytes / 1e9, rest = (est->peak_ram_bytes - est->acts_ram_bytes) / 1e9;
        if (est->acts_ram_bytes * 4 >= est->peak_ram_bytes)
            snprintf(buf, cap, "(%.2f GB of it is calibration activations: fewer calibration samples or a shorter "
                     "seq_len lower that part; the other %.2f GB is the model's)", acts, rest);
        else
            snprintf(buf, cap, "(only %.2f GB of it is calibration activations; the other %.2f GB is one block's "
                     "weights, Hessians and the model's resident tensors, which no job setting lowers: run it on a "
                     "machine with more memory)", acts, rest);
        return;
    }
    double files = est->acts_disk_bytes / 1e9, rest = (est->disk_bytes - est->acts_disk_bytes) / 1e9;
    if (est->acts_disk_bytes > 0)
        snprintf(buf, cap, "(%.2f GB of it is activation files: a checkpoint.acts_every of %d or more writes none, "
                 "at the cost of recomputing more blocks on a resume; the other %.2f GB is the output and the "
                 "checkpoint's packed blocks: free space or choose another output directory)",
                 files, est->n_blocks, rest);
    else
        snprintf(buf, cap, "(it is the output and the checkpoint's packed blocks, which no job setting lowers: free "
                 "space or choose another output directory)");
}

int qd_pipeline_check_disk(const qd_pipeline_estimate *est, uint64_t free_bytes, uint64_t held_bytes, const char *where,
                           qd_err *err)
{
    uint64_t need = est->disk_bytes > held_bytes ? est->disk_bytes - held_bytes : 0;
    if (free_bytes >= need) return 0;
    char hint[512], figures[200], shown[QD_ERR_MSG_MAX];
    qd_pipeline_estimate_hint(est, 1, hint, sizeof hint);
    /* What is held is often a checkpoint of a few MB beside a figure of GB. */
    char held[32];
    if (held_bytes >= 1000000000ull) snprintf(held, sizeof held, "%.2f GB", held_bytes / 1e9);
    else snprintf(held, sizeof held, "%.0f MB", held_bytes / 1e6);
    if (held_bytes > 0)
        snprintf(figures, sizeof figures, "the job needs about %.2f GB more (%.2f GB in all, %s of it already in the "
                 "output directory from an earlier attempt), %.2f GB free", need / 1e9, est->disk_bytes / 1e9, held,
                 free_bytes / 1e9);
    else
        snprintf(figures, sizeof figures, "the job needs about %.2f GB, %.2f GB free", need / 1e9, free_bytes / 1e9);
    /* The directory's end when the whole message would not fit: the hint stays whole. */
    int rest = snprintf(NULL, 0, "not enough disk under : %s %s", figures, hint);
    size_t room = rest > 0 && rest < QD_ERR_MSG_MAX - 16 ? (size_t)(QD_ERR_MSG_MAX - 1 - rest) : 16;
    return qd_err_set(err, QD_EPREFLIGHT, "not enough disk under %s: %s %s", qd_fs_path_tail(where, room, shown, sizeof shown),
                      figures, hint);
}
