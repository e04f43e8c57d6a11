/* The runtime options: what a process chooses once at start-up about how the library runs
 * (log level, CPU threads, the CPU backend's block cache and GPTQ kernel, GPTQ's
 * factorisation form, the test builds' fault hook). The library never reads the environment:
 * the programs (quantctl, quantd-worker, quantd, the benchmarks, the tests) fill this struct,
 * usually with qst_runtime_from_env (startup/runtime_env.h, which maps each QUANTD_*
 * variable to a field; docs/daemon.md "Environment variables" lists them), and pass it in:
 * qd_backend_open and qd_backend_cpu_open take it and keep a copy in the backend (be->rt),
 * so every layer that holds a backend reads its own fields there. Only the log level is
 * process-wide (qd_log_set_level).
 *
 * A NULL options pointer means qd_runtime_opts_default(). None of these settings changes a
 * quantized output byte except gptq_form and cpu_kernel, which exist so tests can compare
 * the forms and kernels (they agree within the tolerances test_gptq names). */
#ifndef QUANT_CORE_RUNTIME_H
#define QUANT_CORE_RUNTIME_H

#include <stdint.h>

#include "quant/core/confine.h"

/* The CPU backend's GPTQ block kernel (QUANTD_CPU_KERNEL). */
typedef enum qd_cpu_kernel {
    QD_CPU_KERNEL_AUTO = 0,      /* the widest this CPU has: AVX-512, AVX2, else portable C */
    QD_CPU_KERNEL_PORTABLE = 1,  /* "portable": the plain C kernel */
    QD_CPU_KERNEL_AVX2 = 2,      /* "avx2": the 8-lane kernel even on AVX-512 machines */
} qd_cpu_kernel;

/* GPTQ's factorisation (QUANTD_GPTQ_FORM). */
typedef enum qd_gptq_form {
    QD_GPTQ_FORM_AUTO = 0,       /* the LDL form where the backend has chol_ldl_upper, else U */
    QD_GPTQ_FORM_INVERSE = 1,    /* "inverse": the reference's U form (Cholesky of H^-1) */
} qd_gptq_form;

typedef struct qd_runtime_opts {
    int log_level;               /* QUANTD_LOG: a QD_LOG_* level (quant/core/log.h); default QD_LOG_INFO */
    int threads;                 /* QUANTD_THREADS: threads of a backend opened as "cpu" (1..1024);
                                  * 0 (default) = the online CPUs. qd_backend_cpu_open takes its
                                  * count as an argument and ignores this field. */
    int64_t cpu_cache_mb;        /* QUANTD_CPU_CACHE_MB: the CPU backend's cache of freed large
                                  * blocks, in MB; 0 turns it off; -1 (default) = 1/8 of the
                                  * physical memory, at most 4 GiB */
    qd_cpu_kernel cpu_kernel;    /* QUANTD_CPU_KERNEL; default QD_CPU_KERNEL_AUTO. Anything but
                                  * auto also keeps "compute": "bf16" off the AMX tiles (its
                                  * portable path: same arithmetic, other summation order) */
    qd_gptq_form gptq_form;      /* QUANTD_GPTQ_FORM; default QD_GPTQ_FORM_AUTO */
    const char *fault_inject;    /* QUANTD_FAULT_INJECT, "OP:N" (builds with QUANTD_FAULT_HOOKS
                                  * only, see quant/backend/backend_fault.h); NULL (default) =
                                  * none. Borrowed; read only while qd_backend_open runs. */
    uint64_t input_max_bytes[QD_INPUT_KINDS]; /* QUANTD_MAX_JSON_BYTES, _TOKENIZER_BYTES,
                                  * _TEXT_BYTES: the size limits of the files a job names
                                  * (confine.h); 0 (default) = confine.h's defaults. Process-wide
                                  * once the program applies them (qd_confine_set_limits). */
} qd_runtime_opts;

/* The defaults above: what a process that sets nothing gets. */
qd_runtime_opts qd_runtime_opts_default(void);

#endif
