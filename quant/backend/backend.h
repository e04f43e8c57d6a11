/* The compute backend interface: every algorithm and the model forward call these ops,
 * never BLAS, LAPACK, cuBLAS or cuSOLVER directly, so the same code runs on the CPU
 * (quant/backend/cpu, the reference) and on CUDA (quant/backend/cuda).
 *
 * Memory: every pointer passed to a compute op is backend memory, obtained from
 * qd_backend_alloc and filled with qd_backend_upload (on the CPU backend that is plain host
 * memory and upload/download are memcpy). Matrices are row-major F32 unless a parameter
 * says otherwise; `ld` is the row stride in elements.
 *
 * Errors: ops return 0 or a negative QD_E* code and put the reason into be->err (for CUDA:
 * the call, file, line and device). A backend is owned by one thread (one worker); it holds
 * its handles, streams and scratch memory — there are no globals.
 *
 * Sections: "memory" and "linear algebra" are used by quant/algo; "neural net" by
 * quant/model. Add an op by adding a line to QD_BACKEND_OPS_REQUIRED (or _OPTIONAL), a CPU
 * implementation and a test comparing it to a scalar reference. */
#ifndef QUANT_BACKEND_BACKEND_H
#define QUANT_BACKEND_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "quant/core/error.h"
#include "quant/core/runtime.h"

struct qd_quant_cfg;
struct qd_gptq_block_args;     /* quant/backend/gptq_block.h */

typedef struct qd_backend qd_backend;

/* RoPE's rotation for one forward: token at position p turns dims i and i + rot_dim/2 (or 2i and 2i + 1) of
 * each head by the angle p * inv_freq[i], and multiplies both by attn_scale (YaRN's and
 * LongRoPE's attention factor; 1 for the other types). inv_freq is float32 as transformers
 * computes it; the angle's product is taken in float32 too, as transformers does. */
#define QD_ROPE_MAX_HALF 512
typedef struct qd_rope_freqs {
    int64_t rot_dim;                    /* even, <= head_dim */
    int interleaved;                    /* 1: pair i is dims 2i and 2i + 1 instead (GLM-4's RoPE) */
    float attn_scale;
    float inv_freq[QD_ROPE_MAX_HALF];   /* [rot_dim / 2] */
} qd_rope_freqs;

/* Every op of the interface, listed once as X(return type, name, parameters): the ops table
 * below, the CPU backend's prototypes and table (cpu_internal.h, cpu_backend.c) and the
 * CUDA backend's (cuda_backend.c) are all made from these two lists, so an op's signature
 * is written here only, and a backend that lacks a required op does not build. A backend
 * may leave an optional op NULL. */
#define QD_BACKEND_OPS_REQUIRED(X) \
    /* ---- memory ---- */ \
    /* NULL on failure (be->err set). */ \
    X(void *, alloc, (qd_backend *be, size_t bytes)) \
    /* Accepts NULL. */ \
    X(void, free, (qd_backend *be, void *p)) \
    X(int, upload, (qd_backend *be, void *dst, const void *src_host, size_t bytes)) \
    X(int, download, (qd_backend *be, void *dst_host, const void *src, size_t bytes)) \
    X(int, copy, (qd_backend *be, void *dst, const void *src, size_t bytes)) \
    X(int, memset0, (qd_backend *be, void *dst, size_t bytes)) \
    X(int, sync, (qd_backend *be)) \
    \
    /* ---- linear algebra ---- */ \
    /* C[m,n] = alpha * op(A) op(B) + beta * C, op = transpose when t* is nonzero. */ \
    X(int, gemm, (qd_backend *be, int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, \
                  const float *a, int64_t lda, const float *b, int64_t ldb, float beta, \
                  float *c, int64_t ldc)) \
    /* Running-average Hessian, H [k,k] full symmetric: with n_seen rows already folded in \
     * and `rows` new rows X [rows, k] (ld ldx): H = H * n_seen / (n_seen + rows) + \
     * (2 / (n_seen + rows)) X^T X. Accumulates in F32 with a fixed reduction order. */ \
    X(int, hessian_accum, (qd_backend *be, float *h, int64_t k, const float *x, int64_t rows, \
                           int64_t ldx, int64_t n_seen)) \
    /* In place: H (k x k, symmetric positive definite) becomes the upper Cholesky factor U \
     * of H^-1 (H^-1 = U^T U), lower triangle zeroed. QD_ENUMERIC when H is not PD. */ \
    X(int, chol_inverse_upper, (qd_backend *be, float *h, int64_t k)) \
    /* One GPTQ block of columns (see quant/backend/gptq_block.h). */ \
    X(int, gptq_block, (qd_backend *be, const struct qd_gptq_block_args *args)) \
    /* Quantize-dequantize W [n, k] in place with groups along k (AWQ search). */ \
    X(int, fake_quant, (qd_backend *be, const struct qd_quant_cfg *cfg, float *w, int64_t n, \
                        int64_t k)) \
    /* w[r][c] *= s[c] (s of length cols); with inverse, w[r][c] /= s[c]. */ \
    X(int, scale_cols, (qd_backend *be, float *w, int64_t rows, int64_t cols, const float *s, \
                        int inverse)) \
    /* Returns sum((a-b)^2) over n elements in *out (double, host). */ \
    X(int, sq_diff_sum, (qd_backend *be, const float *a, const float *b, int64_t n, double *out)) \
    /* max |x[i]| over n elements into *out (host): the calibration inputs' range that the \
     * static activation scales of FP8 and NVFP4 are made from. NaN never wins. */ \
    X(int, abs_max, (qd_backend *be, const float *x, int64_t n, float *out)) \
    \
    /* ---- neural net (quant/model) ---- */ \
    X(int, rmsnorm, (qd_backend *be, float *y, const float *x, const float *w, int64_t rows, \
                     int64_t dim, float eps)) \
    X(int, layernorm, (qd_backend *be, float *y, const float *x, const float *w, const float *b, \
                       int64_t rows, int64_t dim, float eps)) \
    /* Rotate-half RoPE in place on x [tokens, n_heads * head_dim]; pos[t] (device memory) is \
     * the position of token t. f (host memory, read during the call) gives the rotated dims \
     * and the frequencies (quant/model/rope.h computes them for every scaling type). */ \
    X(int, rope, (qd_backend *be, float *x, int64_t tokens, int64_t n_heads, int64_t head_dim, \
                  const int32_t *pos, const qd_rope_freqs *f)) \
    /* Causal attention for `batch` independent sequences of `seq` tokens. q [batch*seq, \
     * n_heads*hd], k and v [batch*seq, n_kv*hd], out [batch*seq, n_heads*hd]; grouped-query \
     * when n_kv < n_heads. window > 0: query i sees keys j with i - window < j <= i only \
     * (sliding-window attention); 0 = the whole causal prefix. softcap > 0 caps the scaled \
     * scores before the softmax as transformers does (s = softcap * tanh(s / softcap), \
     * Gemma 2); 0 = none. */ \
    X(int, attention, (qd_backend *be, float *out, const float *q, const float *k, const float *v, \
                       int64_t batch, int64_t seq, int64_t n_heads, int64_t n_kv, int64_t hd, \
                       float scale, int64_t window, float softcap)) \
    /* attention (softcap none) with a learned sink per query head (gpt-oss): sinks [n_heads] \
     * (backend memory) joins each row's softmax as one more logit whose probability is \
     * dropped, p_j = exp(s_j - m) / (sum_i exp(s_i - m) + exp(sinks[h] - m)), m the max of \
     * the row's scores and the sink, as transformers' eager_attention_forward computes it. */ \
    X(int, attention_sink, (qd_backend *be, float *out, const float *q, const float *k, const float *v, \
                            int64_t batch, int64_t seq, int64_t n_heads, int64_t n_kv, int64_t hd, \
                            float scale, int64_t window, const float *sinks)) \
    /* attention (window and softcap none, F32) where query i of sequence b sees key j <= i only \
     * when keep[(b * seq + i) * seq + j] is nonzero (keep [batch, seq, seq] uint8, backend \
     * memory): the other keys' probabilities are exactly 0, as transformers' additive mask of \
     * the float minimum gives (DeepSeek-V3.2's indexer choice). Every row keeps one key or more. */ \
    X(int, attention_keep, (qd_backend *be, float *out, const float *q, const float *k, const float *v, \
                            int64_t batch, int64_t seq, int64_t n_heads, int64_t n_kv, int64_t hd, \
                            float scale, const uint8_t *keep)) \
    /* DeepSeek-V3.2's index scores: out[b, i, j] = sum_h (w[b, i, h] w_scale) relu((q[b, i, h, :] . \
     * k[b, j, :]) qk_scale) for the causal keys j <= i, 0 past them; q [batch*seq, n_heads*hd], \
     * k [batch*seq, hd], w [batch*seq, n_heads], out [batch, seq, seq]. Summed in F32 in that \
     * order (the dot over the dims, then the heads), as the CPU's scalar loop does. */ \
    X(int, dsa_scores, (qd_backend *be, float *out, const float *q, const float *k, const float *w, \
                        int64_t batch, int64_t seq, int64_t n_heads, int64_t hd, float qk_scale, float w_scale)) \
    X(int, silu_mul, (qd_backend *be, float *out, const float *gate, const float *up, int64_t n)) \
    /* gpt-oss's clamped SwiGLU: g = min(gate, limit), u = clamp(up, -limit, limit), \
     * out = (u + 1) * (g * sigmoid(alpha * g)), sigmoid(x) = 1 / (1 + exp(-x)). out may alias \
     * gate or up. */ \
    X(int, swiglu_clamp_mul, (qd_backend *be, float *out, const float *gate, const float *up, int64_t n, \
                              float alpha, float limit)) \
    /* GeGLU with the tanh GELU (torch's gelu(approximate="tanh"), HF "gelu_pytorch_tanh"): \
     * out = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) * up. out may alias gate. */ \
    X(int, gelu_tanh_mul, (qd_backend *be, float *out, const float *gate, const float *up, int64_t n)) \
    /* x = cap * tanh(x / cap) in place (Gemma 2's final logit soft-cap); cap > 0. */ \
    X(int, softcap, (qd_backend *be, float *x, int64_t n, float cap)) \
    /* x *= s in place (Granite's residual and logit multipliers, Cohere's logit scale). */ \
    X(int, scale, (qd_backend *be, float *x, int64_t n, float s)) \
    X(int, relu, (qd_backend *be, float *x, int64_t n)) \
    X(int, gelu, (qd_backend *be, float *x, int64_t n)) \
    /* The tanh GELU in place, x = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): HF's \
     * "gelu_pytorch_tanh" and "gelu_new" (StarCoder2's and Phi's plain MLPs). */ \
    X(int, gelu_tanh, (qd_backend *be, float *x, int64_t n)) \
    /* dst[r * ldd + c] = src[r * lds + c] for r < rows, c < cols: a block of columns copied \
     * between row-pitched matrices (GPT-NeoX's per-head [q; k; v] rows split into q, k, v). \
     * dst and src do not overlap. */ \
    X(int, copy_2d, (qd_backend *be, float *dst, int64_t ldd, const float *src, int64_t lds, int64_t rows, \
                     int64_t cols)) \
    /* xIELU in place (Apertus; transformers' XIELUActivation): x > 0: ap x^2 + beta x, else \
     * (expm1(min(x, eps)) - x) an + beta x, where the caller passes the effective \
     * coefficients ap = softplus(alpha_p) and an = beta + softplus(alpha_n). */ \
    X(int, xielu, (qd_backend *be, float *x, int64_t n, float ap, float an, float beta, float eps)) \
    /* y += x */ \
    X(int, add, (qd_backend *be, float *y, const float *x, int64_t n)) \
    X(int, add_bias, (qd_backend *be, float *y, const float *bias, int64_t rows, int64_t cols)) \
    /* Row gather (index-select): dst[i, :] = src[idx[i], :] for i < n_idx, rows of `cols` \
     * floats, dense; idx (backend memory, int32) holds rows of src, each in [0, src_rows). \
     * An index outside is QD_EINVAL (the CUDA kernel zeroes that row and flags it). The \
     * MoE forward gathers an expert's tokens with it, so they never leave the device. */ \
    X(int, gather_rows, (qd_backend *be, float *dst, const float *src, int64_t src_rows, const int32_t *idx, \
                         int64_t n_idx, int64_t cols)) \
    /* Weighted row scatter-add (index-add): dst[idx[i], :] += w[i] * src[i, :] for i < n_idx, \
     * in that order per element (the product rounded, then the sum), idx and w in backend \
     * memory. Precondition: the indices are distinct and in [0, dst_rows) — each dst row is \
     * then written by one i only, so the device runs one thread block per row without \
     * atomics and the result is deterministic; the CPU backend checks both (QD_EINVAL), \
     * the CUDA one the range (a row outside is skipped and flagged). An MoE expert's token \
     * list is distinct by construction. */ \
    X(int, scatter_add_rows, (qd_backend *be, float *dst, int64_t dst_rows, const float *src, const int32_t *idx, \
                              const float *w, int64_t n_idx, int64_t cols)) \
    /* logsumexp-based NLL: for each row r of logits [rows, vocab], nll[r] = lse - logit[target]. */ \
    X(int, nll_rows, (qd_backend *be, const float *logits, const int32_t *targets, int64_t rows, \
                      int64_t vocab, double *nll_host)) \
    /* ---- recurrent mixers (quant/model/model_mixer.c, model_gdn.c) ---- */ \
    /* Causal depthwise convolution over each of `batch` sequences of `seq` tokens, as \
     * torch's Conv1d(groups=ch, padding=kernel-1) cut to the first seq outputs: \
     * u[t, c] = x[t, c] * (gate_in ? gate_in[t, c] : 1), \
     * y[t, c] = act(bias[c] + sum_j w[c, j] u[t - kernel + 1 + j, c]) * (gate_out ? gate_out[t, c] : 1), \
     * u zero before a sequence's first token; act is SiLU when silu, else none. x, gate_in \
     * and gate_out are rows of stride ld (columns [0, ch) used), y [batch*seq, ch] dense (not \
     * aliasing the inputs); w [ch, kernel]; bias may be NULL. u in float, the sum in double \
     * rounded once (as torch's conv1d). LFM2's short convolution is C * conv(B * x); \
     * Mamba-2's is silu(conv(xBC) + bias); Gated DeltaNet's silu(conv(qkv)), without gates. */ \
    X(int, conv1d_causal, (qd_backend *be, float *y, const float *x, const float *gate_in, const float *gate_out, \
                           int64_t ld, int64_t batch, int64_t seq, int64_t ch, const float *w, const float *bias, \
                           int64_t kernel, int silu)) \
    /* Mamba-2's selective state-space scan (SSD) as its recurrence, per sequence and head h \
     * (of n_heads, head_dim p each, in n_groups groups sharing B and C, d_state n), state \
     * S [p, n] = 0 at each sequence's start: dt' = clamp(softplus(dt[t, h] + dt_bias[h]), dt_min, \
     * dt_max) (torch's softplus: x above 20 is kept), S = S exp(dt' a[h]) + dt' x[t, h, :] \
     * B[t, g(h), :]^T, y[t, h, :] = S C[t, g(h), :] + d[h] x[t, h, :]; then with z, y *= \
     * silu(z[t, h, :]) (the gate of the gated RMSNorm that follows). x, B and C are rows of \
     * stride ld (x [n_heads * p] wide, B and C [n_groups * n]); dt rows of stride ld_dt, z \
     * rows of stride ld_z (or NULL); y [batch*seq, n_heads * p] dense. a = -exp(A_log). */ \
    X(int, ssd_scan, (qd_backend *be, float *y, const float *x, const float *b, const float *c, int64_t ld, \
                      const float *dt, int64_t ld_dt, const float *z, int64_t ld_z, const float *a, \
                      const float *d, const float *dt_bias, float dt_min, float dt_max, int64_t batch, \
                      int64_t seq, int64_t n_heads, int64_t head_dim, int64_t n_groups, int64_t d_state)) \
    /* ---- recurrent mixers and gated attention (quant/model/model_gdn.c) ---- */ \
    /* out = sigmoid(gate) * x elementwise (a gated attention's output gate: Qwen3-Next, \
     * Qwen3.5); out may alias x or gate. */ \
    X(int, sigmoid_mul, (qd_backend *be, float *out, const float *gate, const float *x, int64_t n)) \
    /* The gated delta rule (Gated DeltaNet: Qwen3-Next, Qwen3.5) over `batch` sequences of \
     * `seq` tokens, the state zero at each start. Per token t and value head h, on key head \
     * h / (nv / nk): q and k (dk each) L2-normalised (x / sqrt(sum x^2 + 1e-6)), q also times \
     * dk^-1/2; beta = sigmoid(b[t, h]), g = -exp(a_log[h]) softplus(a[t, h] + dt_bias[h]); the \
     * state S [dk, dv] becomes S exp(g), then S + k ((v - S^T k) beta)^T, and out[t, h] = S^T q. \
     * qkv [rows, ld_qkv] holds q (nk*dk), k (nk*dk), v (nv*dv) from column 0; b and a [rows, \
     * ld_ba]; out [rows, nv*dv]. What transformers' recurrent form computes (its chunked one \
     * agrees to float rounding); the CPU keeps S in double, dk <= QD_GDN_MAX_DK. */ \
    X(int, gated_delta_rule, (qd_backend *be, float *out, const float *qkv, int64_t ld_qkv, const float *b, \
                              const float *a, int64_t ld_ba, const float *a_log, const float *dt_bias, \
                              int64_t batch, int64_t seq, int64_t nk, int64_t nv, int64_t dk, int64_t dv))

/* Largest key head the gated delta rule takes (Qwen3-Next, Qwen3.5: 128). */
#define QD_GDN_MAX_DK 256

/* The optional ops (NULL where the backend lacks them). */
#define QD_BACKEND_OPS_OPTIONAL(X) \
    /* GPTQ's LDL form (see quant/backend/gptq_block.h, ldl): in place, H (k x k, symmetric \
     * positive definite) becomes A = R diag(R)^-1 where H = R R^T with R upper triangular \
     * (positive diagonal), except that the diagonal holds D_jj = R_jj^2 (H = A D A^T with A \
     * unit upper: LDL^T, D packed on the diagonal as LAPACK's sytrf does); the lower \
     * triangle is zeroed. One Cholesky and no inverse. QD_ENUMERIC when H is not PD. */ \
    X(int, chol_ldl_upper, (qd_backend *be, float *h, int64_t k)) \
    /* bfloat16-input products, for the job's "compute": "bf16": the results of gemm with \
     * ta 0, tb 1, alpha 1, beta 0 (C = A B^T) and of hessian_accum, except that every input \
     * element is first rounded to bfloat16 (nearest even, subnormals to zero) and the exact \
     * products are summed in F32 (quant/backend/cpu/cpu_bf16.h). Inputs finite. */ \
    X(int, gemm_nt_bf16, (qd_backend *be, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, \
                          const float *b, int64_t ldb, float *c, int64_t ldc)) \
    X(int, hessian_accum_bf16, (qd_backend *be, float *h, int64_t k, const float *x, int64_t rows, \
                                int64_t ldx, int64_t n_seen)) \
    /* attention with both products (Q K^T, P V) on bf16-rounded inputs, F32 sums and an F32 \
     * softmax, as torch runs it in bf16; optional even with the two above (absent: a bf16 \
     * job's attention runs in F32). */ \
    X(int, attention_bf16, (qd_backend *be, float *out, const float *q, const float *k, const float *v, \
                            int64_t batch, int64_t seq, int64_t n_heads, int64_t n_kv, int64_t hd, \
                            float scale, int64_t window, float softcap)) \
    /* Hands memory the backend keeps cached but no buffer uses (the CPU backend's idle \
     * blocks) back to the system, so a job opening in a worker that ran others starts from \
     * its own memory, not theirs (quant/pipeline measures its peak from there). */ \
    X(void, trim, (qd_backend *be))

#define QD_BACKEND_OP_FIELD(ret, name, params) ret (*name) params;
typedef struct qd_backend_ops {
    QD_BACKEND_OPS_REQUIRED(QD_BACKEND_OP_FIELD)
    QD_BACKEND_OPS_OPTIONAL(QD_BACKEND_OP_FIELD)
} qd_backend_ops;
#undef QD_BACKEND_OP_FIELD

struct qd_backend {
    const qd_backend_ops *ops;
    void *impl;                /* backend-private state */
    const char *name;          /* "cpu", "cuda" */
    int device;                /* -1 for the CPU, else the CUDA device ordinal */
    int n_threads;             /* CPU threads the backend may use */
    /* What the bits of its results depend on besides their inputs (and the runtime options):
     * "cpu openblas=<core> gptq=<kernel> amx=<0|1> threads=N" (OpenBLAS picks its kernels by
     * CPU and its LAPACK path by thread count, quantd its GPTQ and bfloat16 kernels by CPU),
     * "cuda <device name> sm_XY". Two backends with the same desc give the same bytes for the
     * same work; quant/pipeline uses it before taking over a result made by another process
     * (a part). */
    char desc[112];
    /* 1 when gemm_nt_bf16 and hessian_accum_bf16 run on a bfloat16 unit (the CPU's AMX
     * tiles, CUDA's tensor cores); 0 when they are emulated as F32 products on rounded
     * copies, which costs a little more than F32 itself (or the backend has none). */
    int bf16_native;
    /* The runtime options it was opened with (a copy; fault_inject is NULL here): the
     * layers above read their own fields from it (GPTQ: gptq_form). */
    qd_runtime_opts rt;
    qd_err err;                /* last error */
    /* Set by the backend when a device error may have left it unusable: every CUDA, cuBLAS
     * or cuSOLVER failure (a sticky error poisons the whole context, and a non-sticky one
     * is not worth telling apart; running out of memory is not one). Nothing run on it
     * afterwards can be trusted: the owner closes it, and the worker fails its task and
     * exits so the daemon starts a fresh process with a fresh context. */
    int broken;
};

/* Creates a backend from a spec: "cpu" (rt->threads threads, or one per online CPU) or
 * "cuda:N". rt (may be NULL: qd_runtime_opts_default()) is copied into be->rt; with
 * QUANTD_FAULT_HOOKS, rt->fault_inject wraps the backend (backend_fault.h). *out is owned by
 * the caller. */
int qd_backend_open(const char *spec, const qd_runtime_opts *rt, qd_backend **out, qd_err *err);
void qd_backend_close(qd_backend *be);                      /* accepts NULL */
/* The CPU backend with n_threads threads (1..1024; rt->threads is not read), its block
 * cache and GPTQ kernel chosen by rt (may be NULL: the defaults). */
int qd_backend_cpu_open(int n_threads, const qd_runtime_opts *rt, qd_backend **out, qd_err *err);
#ifdef QUANTD_HAVE_CUDA
int qd_backend_cuda_open(int device, qd_backend **out, qd_err *err);
#endif
/* Number of usable CUDA devices (0 without CUDA support or without a GPU). */
int qd_backend_cuda_device_count(void);

/* Convenience wrappers (check be->ops and forward). */
static inline void *qd_backend_alloc(qd_backend *be, size_t bytes) { return be->ops->alloc(be, bytes); }
static inline void qd_backend_free(qd_backend *be, void *p) { be->ops->free(be, p); }
static inline int qd_backend_upload(qd_backend *be, void *d, const void *s, size_t n) { return be->ops->upload(be, d, s, n); }
static inline void qd_backend_trim(qd_backend *be) { if (be->ops->trim) be->ops->trim(be); }
static inline int qd_backend_download(qd_backend *be, void *d, const void *s, size_t n) { return be->ops->download(be, d, s, n); }

#endif
