/* The runtime options' defaults (see runtime.h). */
#include "quant/core/runtime.h"

#include <stddef.h>

#include "quant/core/log.h"

qd_runtime_opts qd_runtime_opts_default(void)
{
    return (qd_runtime_opts){
        .log_level = QD_LOG_INFO,
        .threads = 0,
        .cpu_cache_mb = -1,
        .cpu_kernel = QD_CPU_KERNEL_AUTO,
        .gptq_form = QD_GPTQ_FORM_AUTO,
        .fault_inject = NULL,
    };
}
