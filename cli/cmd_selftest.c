/* quantctl selftest: runs the dequantizing-kernel self-test on a device.
 *
 *   quantctl selftest [--device cpu|cuda:N] [--quick]
 *
 * Every format x bit width x group size x layout the kernels support, each kernel path
 * against the scalar reference under a named tolerance (quant/kernels/selftest.h), then
 * the batch-1 kernel's bandwidth as a fraction of the device's measured copy bandwidth.
 * One line per case on stderr, a JSON summary on stdout; exit 1 on any failure. */
#include <stdio.h>
#include <string.h>

#include "cli/quantctl.h"
#include "quant/backend/backend.h"
#include "quant/kernels/selftest.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: quantctl selftest [--device cpu|cuda:N] [--quick]\n"
               "  --device D   backend to test (default cpu)\n"
               "  --quick      fewer shapes and batches (what a worker runs at start)\n");
}

int cmd_selftest(int argc, char **argv, const qd_runtime_opts *rt)
{
    const char *device = "cpu";
    int quick = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc) device = argv[++i];
        else if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { usage(stdout); return QCTL_OK; }
        else {
            fprintf(stderr, "quantctl selftest: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return QCTL_USAGE;
        }
    }
    qd_err err = {0};
    qd_backend *be = NULL;
    if (qd_backend_open(device, rt, &be, &err)) {
        fprintf(stderr, "quantctl selftest: %s\n", err.msg);
        return err.code == QD_EINVAL ? QCTL_USAGE : QCTL_FAIL;
    }
    qd_selftest_report rep;
    int rc = qd_selftest_run(be, quick, stderr, &rep, &err);
    qd_backend_close(be);
    if (rc && rc != QD_EMISMATCH) {
        fprintf(stderr, "quantctl selftest: %s\n", err.msg);
        return QCTL_FAIL;
    }
    printf("{\"device\":\"%s\",\"quick\":%s,\"cases\":%d,\"failures\":%d,\"copy_gbps\":%.2f,"
           "\"gemv_gbps\":%.2f,\"gemv_frac_of_copy\":%.3f,\"ok\":%s}\n",
           rep.device, quick ? "true" : "false", rep.cases, rep.failures, rep.copy_gbps, rep.gemv_gbps,
           rep.gemv_frac, rc ? "false" : "true");
    if (rc) {
        fprintf(stderr, "quantctl selftest: %s\n", err.msg);
        return QCTL_FAIL;
    }
    return QCTL_OK;
}
