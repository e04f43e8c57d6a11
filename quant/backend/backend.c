/* Opening and closing compute backends by spec ("cpu", "cuda:N"), and counting CUDA
 * devices. The CPU backend is always built; CUDA only with QUANTD_HAVE_CUDA. */
#include "quant/backend/backend.h"
#include "quant/backend/backend_fault.h"
#include "quant/backend/cpu/cpu_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef QUANTD_HAVE_CUDA
#include <cuda_runtime_api.h>
/* Provided by the CUDA backend (quant/backend/cuda): releases the handles, streams and
 * scratch memory of a backend opened with qd_backend_cuda_open, then the struct itself. */
void qd_backend_cuda_close(qd_backend *be);
#endif

/* CPU threads: rt->threads when set, else the online CPUs. */
static int backend_cpu_threads(const qd_runtime_opts *rt)
{
    if (rt->threads >= 1 && rt->threads <= 1024) return rt->threads;
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n >= 1 && n <= 1024 ? (int)n : 1;
}

static int backend_open_spec(const char *spec, const qd_runtime_opts *rt, qd_backend **out, qd_err *err);

int qd_backend_open(const char *spec, const qd_runtime_opts *rt, qd_backend **out, qd_err *err)
{
    qd_runtime_opts def = qd_runtime_opts_default();
    if (!rt) rt = &def;
    int rc = backend_open_spec(spec, rt, out, err);
    if (!rc) {
        (*out)->rt = *rt;
        (*out)->rt.fault_inject = NULL;
    }
#ifdef QUANTD_FAULT_HOOKS
    const char *fault = rt->fault_inject;
    if (!rc && fault && *fault && (rc = qd_backend_fault_wrap(*out, fault, err))) {
        qd_backend_close(*out);
        *out = NULL;
    }
#endif
    return rc;
}

static int backend_open_spec(const char *spec, const qd_runtime_opts *rt, qd_backend **out, qd_err *err)
{
    if (!out) return qd_err_set(err, QD_EINVAL, "backend: NULL output pointer");
    *out = NULL;
    if (!spec) return qd_err_set(err, QD_EINVAL, "backend: no spec given (expected \"cpu\" or \"cuda:N\")");
    if (!strcmp(spec, "cpu")) return qd_backend_cpu_open(backend_cpu_threads(rt), rt, out, err);
    if (!strncmp(spec, "cuda:", 5)) {
        const char *num = spec + 5;
        char *end = NULL;
        errno = 0;
        long dev = strtol(num, &end, 10);
        if (!*num || *end || errno || dev < 0 || dev > 1023)
            return qd_err_set(err, QD_EINVAL, "backend '%s': the device must be a number, as in \"cuda:0\"", spec);
#ifdef QUANTD_HAVE_CUDA
        int count = qd_backend_cuda_device_count();
        if (dev >= count)
            return qd_err_set(err, QD_ENOTFOUND, "backend '%s': only %d CUDA device(s) are visible", spec, count);
        return qd_backend_cuda_open((int)dev, out, err);
#else
        return qd_err_set(err, QD_EUNSUPPORTED, "backend '%s': this build has no CUDA support", spec);
#endif
    }
    return qd_err_set(err, QD_EINVAL, "backend '%s': unknown spec (expected \"cpu\" or \"cuda:N\")", spec);
}

void qd_backend_close(qd_backend *be)
{
    if (!be) return;
#ifdef QUANTD_FAULT_HOOKS
    qd_backend_fault_unwrap(be);
#endif
#ifdef QUANTD_HAVE_CUDA
    if (be->device >= 0) {
        qd_backend_cuda_close(be);
        return;
    }
#endif
    qd_backend_cpu_close(be);
}

int qd_backend_cuda_device_count(void)
{
#ifdef QUANTD_HAVE_CUDA
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();   /* clear the sticky "no device" error */
        return 0;
    }
    return n;
#else
    return 0;
#endif
}
