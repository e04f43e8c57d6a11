/* The job's calibration ids through quant/model/calib (see calib_tokens.h). */
#include "quant/pipeline/calib_tokens.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "quant/core/rng.h"
#include "quant/model/calib.h"
#include "quant/model/tokenizer/tokenizer.h"

int qd_pipeline_calib_tokens(const qp_job *job, qd_model *m, int32_t **ids, int64_t *n_seq,
                             int64_t *seq_len, qd_err *err)
{
    const qd_model_config *cfg = qd_model_cfg(m);
    const qp_job_calib *c = &job->calibration;
    *ids = NULL;
    if (!c->path) {
        /* RTN without data: random ids only feed the per-layer error report, so a few
         * short sequences are enough (8 x at most 512 tokens). */
        int64_t L = c->seq_len < cfg->max_pos ? c->seq_len : cfg->max_pos;
        if (L > 512) L = 512;
        int64_t S = c->samples < 8 ? c->samples : 8;
        int32_t *v = malloc((size_t)(S * L) * sizeof *v);
        if (!v) return qd_err_set(err, QD_ENOMEM, "out of memory for calibration ids");
        uint64_t st = c->seed;
        for (int64_t i = 0; i < S * L; i++) v[i] = (int32_t)(qd_splitmix64(&st) % (uint64_t)cfg->vocab);
        *ids = v;
        *n_seq = S;
        *seq_len = L;
        return 0;
    }
    /* A directory (or a device) is a mistake in the job, not a passing I/O error: say so, and
     * make it final rather than retried. */
    struct stat sb;
    if (stat(c->path, &sb) == 0 && !S_ISREG(sb.st_mode))
        return qd_err_set(err, QD_EINVAL, "calibration.path %s is %s, not a file", c->path,
                          S_ISDIR(sb.st_mode) ? "a directory" : "not a regular file");
    qd_calib_opts o = qd_calib_opts_default();
    o.path = c->path;
    o.field = c->field;
    o.style = c->style == QP_CALIB_AWQ ? QD_CALIB_AWQ : QD_CALIB_GPTQ;
    o.n_samples = c->samples;
    o.seq_len = c->seq_len;
    o.seed = c->seed;
    o.max_pos = cfg->max_pos;
    qd_tokenizer *tok = NULL;
    int rc = qd_tokenizer_load(job->model, &tok, err);
    if (rc) {
        /* Token files need no tokenizer. */
        size_t l = strlen(c->path);
        int tokens = (l > 5 && !strcmp(c->path + l - 5, ".json")) || (l > 4 && !strcmp(c->path + l - 4, ".bin"));
        if (!tokens) return qd_err_prefix(err, "calibration needs the model's tokenizer");
        tok = NULL;
    }
    qd_calib_set set;
    memset(&set, 0, sizeof set);
    rc = qd_calib_load(&o, tok, &set, err);
    qd_tokenizer_free(tok);
    if (rc) return qd_err_prefix(err, "calibration");
    for (int64_t i = 0; i < set.n_samples * set.seq_len; i++) {
        if (set.ids[i] < 0 || set.ids[i] >= cfg->vocab) {
            int32_t bad = set.ids[i];
            qd_calib_free(&set);
            return qd_err_set(err, QD_EINVAL, "calibration %s: token id %d is outside the model's vocabulary (%lld)",
                              c->path, bad, (long long)cfg->vocab);
        }
    }
    *ids = set.ids;
    *n_seq = set.n_samples;
    *seq_len = set.seq_len;
    set.ids = NULL;
    qd_calib_free(&set);
    return 0;
}
