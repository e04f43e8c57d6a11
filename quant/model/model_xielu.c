/* Apertus's MLP activation, xIELU, with its per-layer learned parameters: the block's
 * mlp.act_fn.alpha_p and alpha_n ([1]) and the buffers beta and eps (scalars, stored in the
 * model's dtype as transformers saves them), read once per block load into host floats.
 * The effective coefficients are formed here as XIELUActivation does in float32:
 * ap = softplus(alpha_p), an = beta + softplus(alpha_n) (softplus(x) = log1p(exp(x)), x
 * itself above torch's threshold 20); the backend's xielu op applies them. */
#include <math.h>
#include <stdio.h>

#include "quant/model/model_internal.h"

static float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

int qd_xielu_load(qd_model *m, int block, qd_block_weights *bw, qd_err *err)
{
    static const char *const names[4] = {"alpha_p", "alpha_n", "beta", "eps"};
    float v[4];
    for (int i = 0; i < 4; i++) {
        char name[512];
        int n = snprintf(name, sizeof name, m->arch->block_fmt, block);
        snprintf(name + n, sizeof name - n, "%s.%s", m->arch->xielu, names[i]);
        const st_tensor *t = qd_model_tfind(m, name);
        if (!t) return qd_err_set(err, QD_EFORMAT, "%s: tensor missing (xIELU's %s)", name, names[i]);
        int fl = t->dtype == QD_DTYPE_F32 || t->dtype == QD_DTYPE_BF16 || t->dtype == QD_DTYPE_F16;
        if (t->numel != 1 || !fl)
            return qd_err_set(err, QD_ESHAPE, "%s: xIELU's %s must be one F32, BF16 or F16 value, not %llu %s", name,
                              names[i], (unsigned long long)t->numel, qd_dtype_name(t->dtype));
        if (qd_convert_to_f32(t->dtype, t->data, &v[i], 1))
            return qd_err_set(err, QD_EFORMAT, "%s: cannot convert %s", name, qd_dtype_name(t->dtype));
        if (!isfinite(v[i])) return qd_model_refuse_nonfinite(name, t->ndim, t->shape, 0, v[i], err);
    }
    float sp_n = softplus(v[1]);
    bw->xielu[0] = softplus(v[0]);
    bw->xielu[1] = v[2] + sp_n;
    bw->xielu[2] = v[2];
    bw->xielu[3] = v[3];
    return 0;
}

int qd_fwd_xielu(qd_model *m, const qd_block_weights *bw, float *x, int64_t n, qd_err *err)
{
    int rc = m->be->ops->xielu(m->be, x, n, bw->xielu[0], bw->xielu[1], bw->xielu[2], bw->xielu[3]);
    if (rc) return qd_err_set(err, rc, "block %d xielu: %s", bw->block, m->be->err.msg);
    return 0;
}
