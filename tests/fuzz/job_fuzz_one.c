/* The job spec fuzz harness: runs one payload through qp_job_parse and checks what every
 * accepted job must satisfy (every field inside its allowed set, the cross-field rules of
 * job.md, validation passing again) and that the canonical JSON is a fixed point: printing
 * an accepted job, parsing that and printing again gives the same bytes and the same id, and
 * a derived id is the hash of the spec. A refusal must be a negative code, no job, and a
 * message that names the field ("job..."). */
#include "fuzz/job_fuzz_one.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/job/job.h"

static int fail(const char *why, const char *detail)
{
    fprintf(stderr, "job_fuzz_one: invariant broken: %s%s%s\n", why, detail ? ": " : "", detail ? detail : "");
    return -1;
}

/* Field ranges an accepted job must be inside, whatever the payload said. */
static int check_fields(const qp_job *j)
{
    if (j->version != QP_JOB_VERSION) return fail("version", NULL);
    if (j->bits != 2 && j->bits != 3 && j->bits != 4 && j->bits != 8) return fail("bits outside {2, 3, 4, 8}", NULL);
    if (j->group_size == 0 || j->group_size < -1) return fail("group_size", NULL);
    if (!(j->damp_percent > 0 && j->damp_percent < 1)) return fail("damp_percent", NULL);
    if (!qp_method_name(j->method) || !qp_format_name(j->format) || !qp_backend_name(j->backend) ||
        !qp_layout_name(j->layout) || !qp_calib_style_name(j->calibration.style))
        return fail("an enum outside its names", NULL);
    if (j->format == QP_FORMAT_AWQ_GEMM && (j->bits != 4 || j->desc_act || j->group_size < 1))
        return fail("awq_gemm with bits != 4, desc_act or group_size -1", NULL);
    if (!strcmp(qp_format_name(j->format), "compressed-tensors") &&
        ((j->bits != 4 && j->bits != 8) || (j->desc_act && !j->static_groups)))
        return fail("compressed-tensors with bits outside {4, 8} or act-order without static groups", NULL);
    if (j->serve.enabled && (strcmp(j->serve.engine, "vllm") || j->serve.tp < 1 ||
                             (strcmp(j->serve.gpu, "hopper") && strcmp(j->serve.gpu, "ampere"))))
        return fail("serve outside vllm/hopper|ampere/tp >= 1", NULL);
    if (j->desc_act && j->method != QP_METHOD_GPTQ && j->method != QP_METHOD_AWQ_GPTQ)
        return fail("desc_act without a GPTQ method", NULL);
    if (j->layout == QP_LAYOUT_TP_AWARE && !j->desc_act) return fail("tp_aware without desc_act", NULL);
    if (!j->model || !j->model[0] || !j->output || !j->output[0]) return fail("model/output missing", NULL);
    if (j->method != QP_METHOD_RTN && (!j->calibration.path || !j->calibration.path[0]))
        return fail("calibration.path missing", NULL);
    if (j->calibration.samples < 1 || j->calibration.seq_len < 1 || j->tp < 1 || j->shard_size < 1)
        return fail("a count below 1", NULL);
    if (j->eval.enabled && (!j->eval.path || j->eval.seq_len < 1 || j->eval.max_windows < 0)) return fail("eval", NULL);
    if (strlen(j->id) < 1 || strlen(j->id) > QP_JOB_ID_MAX) return fail("id length", j->id);
    for (size_t i = 0; i < j->n_modules_to_not_convert; i++)
        if (!j->modules_to_not_convert[i] || !j->modules_to_not_convert[i][0]) return fail("empty module name", NULL);
    qp_err err = {0};
    if (qp_job_validate(j, &err)) return fail("an accepted job fails validation", err.msg);
    return 0;
}

static int check_roundtrip(const qp_job *j)
{
    int bad = 0;
    char *s1 = qp_job_to_json(j, 0), *s2 = NULL, *s3 = NULL;
    qp_job *k = NULL, *d = NULL;
    qp_err err = {0};
    if (!s1) { bad = fail("to_json failed", NULL); goto out; }
    if (qp_job_parse(s1, strlen(s1), &k, &err)) { bad = fail("the canonical JSON is refused", err.msg); goto out; }
    if (strcmp(j->id, k->id)) { bad = fail("the id changed on re-parsing", k->id); goto out; }
    if (!(s2 = qp_job_to_json(k, 0)) || strcmp(s1, s2)) { bad = fail("the canonical JSON is not a fixed point", s2); goto out; }
    if (!(d = qp_job_dup(j)) || !(s3 = qp_job_to_json(d, 0)) || strcmp(s1, s3)) { bad = fail("dup differs", s3); goto out; }
    if (j->id_derived) {
        char id[QP_JOB_ID_MAX + 1];
        if (qp_job_derive_id(j, id) || strcmp(id, j->id)) { bad = fail("derived id is not the hash of the spec", id); goto out; }
    }
    /* The fingerprint form and the pretty form must print too. */
    char *o = qp_job_to_json(j, QP_JOB_JSON_OUTPUT_ONLY), *p = qp_job_to_json(j, QP_JOB_JSON_PRETTY | QP_JOB_JSON_NO_ID);
    if (!o || !p) bad = fail("to_json with flags failed", NULL);
    free(o);
    free(p);
out:
    free(s1);
    free(s2);
    free(s3);
    qp_job_free(k);
    qp_job_free(d);
    return bad ? -1 : 0;
}

int job_fuzz_one(const uint8_t *data, size_t size, int *accepted)
{
    qp_job *j = (qp_job *)(uintptr_t)1;   /* the parser must set it, whatever the outcome */
    qp_err err = {0};
    int bad = 0;
    if (accepted) *accepted = 0;
    int rc = qp_job_parse((const char *)data, size, &j, &err);
    if (rc == 0) {
        if (!j) return fail("success without a job", NULL);
        if (accepted) *accepted = 1;
        bad = check_fields(j) || check_roundtrip(j);
        qp_job_free(j);
    } else {
        if (rc > 0) bad = fail("an error path returned a positive code", NULL);
        if (j) bad = fail("a refused spec still produced a job", NULL);
        if (strncmp(err.msg, "job", 3)) bad = fail("the message does not name the field", err.msg);
    }
    return bad ? -1 : 0;
}
