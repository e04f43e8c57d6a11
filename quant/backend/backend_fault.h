/* The backend fault hook, compiled only with -DQUANTD_FAULT_HOOKS=ON (test builds): it lets
 * a test make a backend fail the way a device error does, on a machine without a GPU.
 *
 * With the runtime options' fault_inject = "OP:N" (quant/core/runtime.h; the programs take
 * it from QUANTD_FAULT_INJECT), qd_backend_open wraps each backend it opens so that the Nth call of op OP (gemm, upload, download or sync) fails with
 * QD_EBACKEND, a message naming the call, the device, file and line as a CUDA failure's
 * does ("cuda:0: gemm failed: injected device fault ... (backend_fault.c:NN)"), and
 * be->broken set; every later call of those ops fails too, as a sticky CUDA error makes
 * every later call fail. The bfloat16 products (gemm_nt_bf16, hessian_accum_bf16, where the
 * backend has them) count as gemm calls, and the message names the op that failed.
 * Every other op (the kernels, gather_rows and scatter_add_rows included) passes through
 * uncounted: the MoE forward's device faults come through its router gemm, its experts'
 * gemms and the upload of each expert's token list, as they would on a GPU.
 * qd_backend_close removes the wrapper. */
#ifndef QUANT_BACKEND_BACKEND_FAULT_H
#define QUANT_BACKEND_BACKEND_FAULT_H

#include "quant/backend/backend.h"

#ifdef QUANTD_FAULT_HOOKS
/* Wraps be's ops per spec ("OP:N", N >= 1). The wrapper is owned by be until
 * qd_backend_fault_unwrap. QD_EINVAL names a malformed spec. */
int qd_backend_fault_wrap(qd_backend *be, const char *spec, qd_err *err);
/* Restores be's own ops and frees the wrapper; does nothing when be is not wrapped. */
void qd_backend_fault_unwrap(qd_backend *be);
#endif

#endif
