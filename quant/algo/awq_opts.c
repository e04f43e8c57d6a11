/* The AWQ options' defaults and their validation (awq.h). Their own file so the memory
 * estimate (quant/pipeline/estimate.c), which the daemon's admission links without the
 * backend (libqadmit, docs/architecture.md), reads the defaults without linking the search. */
#include "quant/algo/awq.h"

qd_awq_opts qd_awq_opts_default(void)
{
    qd_awq_opts o = {.n_grid = 20, .duo_scaling = 0, .clip = 1, .clip_n_grid = 20,
                     .clip_max_shrink = 0.5f, .clip_n_tokens = 512, .chunk_rows = 2048,
                     .ref_cache_bytes = (int64_t)256 << 20, .gram = 1};
    return o;
}

int qd_awq_opts_validate(const qd_awq_opts *o, qd_err *err)
{
    if (!o) return qd_err_set(err, QD_EINVAL, "awq: options missing");
    if (o->n_grid < 1) return qd_err_set(err, QD_EINVAL, "awq: n_grid %d must be positive", o->n_grid);
    if (o->clip_n_grid < 1)
        return qd_err_set(err, QD_EINVAL, "awq: clip_n_grid %d must be positive", o->clip_n_grid);
    if (!(o->clip_max_shrink >= 0.0f && o->clip_max_shrink < 1.0f))
        return qd_err_set(err, QD_EINVAL, "awq: clip_max_shrink %g must be in [0, 1)",
                          (double)o->clip_max_shrink);
    if (o->clip_n_tokens < 1)
        return qd_err_set(err, QD_EINVAL, "awq: clip_n_tokens %lld must be positive",
                          (long long)o->clip_n_tokens);
    if (o->chunk_rows < 1)
        return qd_err_set(err, QD_EINVAL, "awq: chunk_rows %lld must be positive", (long long)o->chunk_rows);
    return 0;
}
