/* Start-up of the programs (quantctl, quantd-worker, quantd, the benchmarks, the tests): the
 * one place that turns the environment into the library's runtime options
 * (quant/core/runtime.h), and OpenBLAS's thread setting, which only a re-exec can change.
 * The library under quant/ reads no environment variable (tests/unit/test_no_getenv.sh
 * checks); the variables, what they set and their defaults are listed in docs/daemon.md
 * ("Environment variables"). */
#ifndef QUANTD_STARTUP_RUNTIME_ENV_H
#define QUANTD_STARTUP_RUNTIME_ENV_H

#include "quant/core/runtime.h"

/* Fills *o with qd_runtime_opts_default() overridden by the environment:
 *   QUANTD_LOG           debug|info|warn|error|off -> log_level
 *   QUANTD_THREADS       1..1024 -> threads
 *   QUANTD_CPU_CACHE_MB  a number of MB (0 = off) -> cpu_cache_mb
 *   QUANTD_CPU_KERNEL    portable|avx2 -> cpu_kernel
 *   QUANTD_GPTQ_FORM     inverse -> gptq_form
 *   QUANTD_FAULT_INJECT  OP:N -> fault_inject (borrowed from the environment)
 *   QUANTD_MAX_JSON_BYTES, QUANTD_MAX_TOKENIZER_BYTES, QUANTD_MAX_TEXT_BYTES
 *                        a positive number of bytes -> input_max_bytes (confine.h)
 * A value it cannot use leaves the default, as the library always did; a malformed
 * QUANTD_CPU_CACHE_MB is also logged as a warning (at the level QUANTD_LOG asks for). The
 * log level is not applied: the caller does that (qd_log_set_level(o->log_level)). */
void qst_runtime_from_env(qd_runtime_opts *o);

/* OpenBLAS reads OPENBLAS_THREAD_TIMEOUT once, as it loads; by default its idle threads
 * spin (sched_yield) for about 2^28 cycles after each call, taking the cores from the GPTQ
 * block kernel's own threads between the lazy GEMMs (measured on 2 cores: GPTQ 0.70 s ->
 * 0.62 s on a 4096 x 4096 layer with the variable at 4). Programs that run the CPU backend
 * call this first in main(): when the variable is unset it sets it to 4 (spin 2^4 cycles,
 * then sleep) and re-executes the program with the same argv, keeping pid and open files;
 * it returns only when the variable was already set (a user's own value is kept), argv is
 * NULL, or the re-exec failed (the program then runs on with OpenBLAS's default). */
void qst_openblas_reexec(char **argv);

/* Has glibc keep what the process frees for its next allocations: none is mapped on its own
 * (M_MMAP_MAX 0) and the heap's free top is never handed back (M_TRIM_THRESHOLD -1). A
 * block's work allocates and frees buffers of the same few sizes over and over (each part's
 * file, Hessian, factor, rows, codes); each fresh mapping is pages the kernel must zero on
 * first touch, which cost a Mixtral-shaped block's lead about a quarter of its time
 * (bench/results/malloc.md). What stays freed is handed back when a job opens and when a
 * worker has been idle (qd_rss_release); what the heap keeps beyond a job's live buffers is
 * counted in `quantctl estimate`, which admission trusts. Programs that quantize call it
 * first (qst_startup does). */
void qst_malloc_tune(void);

/* What every program does first: qst_openblas_reexec(argv) (when argv is not NULL), then
 * qst_malloc_tune(), qst_runtime_from_env(o), qd_log_set_level(o->log_level) and
 * qd_confine_set_limits(o->input_max_bytes). */
void qst_startup(char **argv, qd_runtime_opts *o);

#endif
