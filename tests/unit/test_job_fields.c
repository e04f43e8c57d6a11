/* The job spec's field table (qp_job_fields) against the parser, and docs/jobs.md against
 * the table: the one place a field, its type and its default are written down for users.
 *
 * Against the parser: every field the table lists is read (a job setting it to its example
 * parses and prints a different canonical form), its default is what the parser fills
 * (leaving it out and spelling out the default give the same canonical form, which prints
 * that default), "required" fields are refused when missing, an enum's names are exactly
 * the ones the parser lists when it refuses another, and a key the table lacks is refused in
 * every object, naming it. The canonical form prints no key the table lacks, in the table's
 * order.
 *
 * Against docs/jobs.md: it has exactly one table headed field | type | default | meaning;
 * every field of the table has a row and every row names a field the parser accepts; each
 * row's type and default are the table's (rendered as render_default does); each enum's
 * names appear in its meaning. Every ```json block is a job the parser accepts, unless the
 * line before it is <!-- refused: MESSAGE -->, when the parser must refuse it with MESSAGE;
 * a block after <!-- canonical --> must be the canonical form of the example before it. The
 * accepted examples must cover every method and every format, and a MoE option. */
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "quant/formats/format.h"
#include "quant/formats/scheme.h"
#include "quant/job/job.h"

/* ---- JSON helpers ----------------------------------------------------------------- */

/* The member at a dotted path, or NULL. */
static cJSON *get_path(const cJSON *o, const char *path)
{
    char buf[128];
    snprintf(buf, sizeof buf, "%s", path);
    char *dot = strchr(buf, '.');
    if (dot) *dot = '\0';
    cJSON *v = cJSON_GetObjectItemCaseSensitive(o, buf);
    return dot ? (cJSON_IsObject(v) ? get_path(v, dot + 1) : NULL) : v;
}

/* Sets the member at a dotted path to val (taken over), making the object above it when
 * missing. */
static void set_path(cJSON *o, const char *path, cJSON *val)
{
    char buf[128];
    snprintf(buf, sizeof buf, "%s", path);
    char *dot = strchr(buf, '.');
    if (!dot) {
        if (cJSON_GetObjectItemCaseSensitive(o, buf)) cJSON_ReplaceItemInObjectCaseSensitive(o, buf, val);
        else cJSON_AddItemToObject(o, buf, val);
        return;
    }
    *dot = '\0';
    cJSON *sub = cJSON_GetObjectItemCaseSensitive(o, buf);
    if (!cJSON_IsObject(sub)) {
        cJSON_DeleteItemFromObjectCaseSensitive(o, buf);
        sub = cJSON_AddObjectToObject(o, buf);
    }
    set_path(sub, dot + 1, val);
}

static void remove_path(cJSON *o, const char *path)
{
    const char *dot = strrchr(path, '.');
    if (!dot) { cJSON_DeleteItemFromObjectCaseSensitive(o, path); return; }
    char parent[128];
    snprintf(parent, sizeof parent, "%.*s", (int)(dot - path), path);
    cJSON *p = get_path(o, parent);
    if (p) cJSON_DeleteItemFromObjectCaseSensitive(p, dot + 1);
}

/* Parses spec as a job: 0 with *canon its canonical form (malloc'd), or the parser's code
 * with its message in err. */
static int canon_of(const cJSON *spec, char **canon, qp_err *err)
{
    *canon = NULL;
    memset(err, 0, sizeof *err);
    char *text = cJSON_PrintUnformatted(spec);
    qp_job *job = NULL;
    int rc = qp_job_parse(text, strlen(text), &job, err);
    free(text);
    if (rc) return rc;
    *canon = qp_job_to_json(job, 0);
    qp_job_free(job);
    return *canon ? 0 : QP_ENOMEM;
}

static int is_awq_method(const char *m) { return m && (!strcmp(m, "awq") || !strcmp(m, "awq+gptq")); }

static int is_gptq_method(const char *m) { return m && (!strcmp(m, "gptq") || !strcmp(m, "awq+gptq")); }

/* The field's default for a method as JSON text ("required" and "derived" are no JSON). */
static const char *default_for(const qp_job_field *f, const char *method)
{
    if (!is_gptq_method(method) && f->def_no_gptq) return f->def_no_gptq;
    return is_awq_method(method) && f->def_awq ? f->def_awq : f->def;
}

static int def_is_json(const char *d) { return strcmp(d, "required") && strcmp(d, "derived"); }

/* The jobs every check starts from: each method, gptq with act-order (which layout
 * tp_aware needs), and gptq in compressed-tensors with target_bpw (which bpw_bits and
 * bpw_group_sizes need). "full" adds an eval and a serve object, so that their fields have an
 * object to sit in. An explicit id keeps derived ids out of the comparisons. */
static const char *const base_methods[] = { "gptq", "awq", "rtn", "awq+gptq", "gptq", "gptq" };
#define N_BASES 6

static cJSON *make_base(size_t b, int full)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", "t");
    cJSON_AddStringToObject(o, "model", "/models/m");
    cJSON_AddStringToObject(o, "output", "/out/o");
    cJSON_AddStringToObject(o, "method", base_methods[b]);
    if (b == 4) cJSON_AddTrueToObject(o, "desc_act");
    if (b == 5) {
        cJSON_AddStringToObject(o, "format", "compressed-tensors");
        cJSON_AddNumberToObject(o, "target_bpw", 4.5);
    }
    cJSON *c = cJSON_AddObjectToObject(o, "calibration");
    cJSON_AddStringToObject(c, "path", "c4.jsonl");
    if (full) {
        cJSON *e = cJSON_AddObjectToObject(o, "eval");
        cJSON_AddStringToObject(e, "path", "wiki.test.raw");
        cJSON *s = cJSON_AddObjectToObject(o, "serve");
        cJSON_AddStringToObject(s, "engine", "vllm");
        cJSON_AddStringToObject(s, "gpu", "hopper");
    }
    return o;
}

/* Fields inside eval and serve need those objects; the others start from the plain job. */
static int needs_full(const qp_job_field *f)
{
    return !strncmp(f->name, "eval.", 5) || !strncmp(f->name, "serve.", 6);
}

/* ---- the table against the parser --------------------------------------------------- */

static void test_table_shape(void)
{
    size_t n = 0;
    const qp_job_field *t = qp_job_fields(&n);
    CHECK(n > 30);
    static const char *const types[] = { "integer", "number", "bool", "string", "object", "array of strings",
                                         "integer or string", "array of integers", NULL };
    for (size_t i = 0; i < n; i++) {
        const qp_job_field *f = &t[i];
        CHECK(qp_job_field_find(f->name) == f);   /* unique */
        int type_ok = 0;
        for (size_t k = 0; types[k]; k++) type_ok |= !strcmp(types[k], f->type);
        if (!type_ok) TEST_FAIL_("%s: type \"%s\" is not one the doc uses", f->name, f->type);
        const char *dot = strchr(f->name, '.');
        if (dot) {
            char parent[64];
            snprintf(parent, sizeof parent, "%.*s", (int)(dot - f->name), f->name);
            const qp_job_field *p = qp_job_field_find(parent);
            if (!p || strcmp(p->type, "object") || strchr(dot + 1, '.'))
                TEST_FAIL_("%s: its parent %s is not an object field of the table", f->name, parent);
            if (p && p > f) TEST_FAIL_("%s: listed before its object %s", f->name, parent);
        }
        const char *json[] = { def_is_json(f->def) ? f->def : NULL, f->def_awq, f->example, f->def_no_gptq };
        for (size_t k = 0; k < 4; k++) {
            if (!json[k]) continue;
            cJSON *v = cJSON_Parse(json[k]);
            if (!v) TEST_FAIL_("%s: \"%s\" is not JSON", f->name, json[k]);
            cJSON_Delete(v);
        }
        if (f->values || qp_job_field_value(f, 0)) {
            CHECK_STR(f->type, "string");
            if (!qp_job_field_value(f, 0)) TEST_FAIL_("%s: an enum with no names", f->name);
        }
    }
    CHECK(qp_job_field_find("no_such_field") == NULL);
    CHECK(qp_job_field_value(qp_job_field_find("bits"), 0) == NULL);
}

/* Leaving a field out and giving its default mean the same job, whose canonical form prints
 * that default (where it prints the field at all). */
static void test_defaults(void)
{
    size_t n = 0;
    const qp_job_field *t = qp_job_fields(&n);
    for (size_t i = 0; i < n; i++) {
        const qp_job_field *f = &t[i];
        if (!def_is_json(f->def)) continue;
        int accepted = 0;
        for (size_t b = 0; b < 4; b++) {
            const char *d = default_for(f, base_methods[b]);
            cJSON *without = make_base(b, needs_full(f)), *with = make_base(b, needs_full(f));
            remove_path(without, f->name);
            set_path(with, f->name, cJSON_Parse(d));
            char *cw = NULL, *co = NULL;
            qp_err ew, eo;
            int rw = canon_of(with, &cw, &ew), ro = canon_of(without, &co, &eo);
            if (ro) TEST_FAIL_("%s left out (method %s): refused: %s", f->name, base_methods[b], eo.msg);
            if (!rw && !ro) {
                accepted++;
                if (strcmp(cw, co))
                    TEST_FAIL_("%s: %s (the table's default for method %s) is not the parser's:\n  given:   %s\n"
                               "  left out: %s", f->name, d, base_methods[b], cw, co);
                cJSON *canon = cJSON_Parse(co), *want = cJSON_Parse(d);
                const cJSON *got = get_path(canon, f->name);
                test_checks++;
                if (got && !cJSON_Compare(got, want, 1)) {
                    char *g = cJSON_PrintUnformatted(got);
                    TEST_FAIL_("%s: the canonical form prints %s where the table's default (method %s) is %s",
                               f->name, g, base_methods[b], d);
                    free(g);
                }
                cJSON_Delete(canon);
                cJSON_Delete(want);
            }
            free(cw);
            free(co);
            cJSON_Delete(without);
            cJSON_Delete(with);
        }
        if (!accepted) TEST_FAIL_("%s: its default is refused for every method", f->name);
    }
}

/* Every key of a canonical form (recursively into objects) is a table field, in the table's
 * order. */
static void check_canon_keys(const cJSON *o, const char *prefix, const char *canon)
{
    const qp_job_field *last = NULL;
    for (const cJSON *c = o->child; c; c = c->next) {
        char name[128];
        snprintf(name, sizeof name, "%s%s%s", prefix, prefix[0] ? "." : "", c->string);
        const qp_job_field *f = qp_job_field_find(name);
        test_checks++;
        if (!f) { TEST_FAIL_("the canonical form prints %s, which the field table lacks: %s", name, canon); continue; }
        if (last && f < last) TEST_FAIL_("the canonical form prints %s after %s, against the table's order", name, last->name);
        last = f;
        if (cJSON_IsObject(c)) check_canon_keys(c, name, canon);
    }
}

/* Setting a field to its example is accepted by some job and changes the canonical form: the
 * parser reads the field (not merely lets the key through) and the canonical form keeps it. */
static void test_examples(void)
{
    size_t n = 0;
    const qp_job_field *t = qp_job_fields(&n);
    for (size_t i = 0; i < n; i++) {
        const qp_job_field *f = &t[i];
        if (!f->example) continue;
        int accepted = 0;
        char why[QP_ERR_MSG_MAX] = "";
        for (size_t b = 0; b < N_BASES; b++) {
            const char *d = default_for(f, base_methods[b]);
            cJSON *ex = cJSON_Parse(f->example), *dj = def_is_json(d) ? cJSON_Parse(d) : NULL;
            int same = dj && cJSON_Compare(ex, dj, 1);
            cJSON_Delete(dj);
            cJSON *base = make_base(b, needs_full(f)), *with = make_base(b, needs_full(f));
            const cJSON *cur = get_path(base, f->name);
            same |= cur && cJSON_Compare(cur, ex, 1);
            set_path(with, f->name, ex);
            char *cb = NULL, *cw = NULL;
            qp_err eb, ew;
            int rb = canon_of(base, &cb, &eb), rw = same ? -1 : canon_of(with, &cw, &ew);
            CHECK_INT(rb, 0);
            if (rw && !same) snprintf(why, sizeof why, "%s", ew.msg);
            if (!rb && !rw) {
                accepted++;
                if (!strcmp(cb, cw))
                    TEST_FAIL_("%s = %s (method %s) leaves the canonical form as it was: %s", f->name, f->example,
                               base_methods[b], cw);
                cJSON *cj = cJSON_Parse(cw);
                check_canon_keys(cj, "", cw);
                /* The canonical form is a fixed point. */
                char *again = NULL;
                qp_err ea;
                CHECK_INT(canon_of(cj, &again, &ea), 0);
                if (again) CHECK_STR(again, cw);
                free(again);
                cJSON_Delete(cj);
            }
            free(cb);
            free(cw);
            cJSON_Delete(base);
            cJSON_Delete(with);
        }
        if (!accepted) TEST_FAIL_("%s = %s is refused by every job tried; last: %s", f->name, f->example, why);
    }
}

/* "required": a job without the field is refused, naming it (calibration only for the
 * methods that calibrate); "derived" (id): a job without one gets "j-" + a hash. */
static void test_required(void)
{
    size_t n = 0;
    const qp_job_field *t = qp_job_fields(&n);
    for (size_t i = 0; i < n; i++) {
        const qp_job_field *f = &t[i];
        if (def_is_json(f->def)) continue;
        cJSON *spec = make_base(0, 1);
        test_checks++;
        if (!get_path(spec, f->name)) TEST_FAIL_("%s: required, but the test's base job lacks it", f->name);
        if (!strcmp(f->name, "calibration.path")) set_path(spec, "calibration", cJSON_CreateObject());
        else remove_path(spec, f->name);
        char *c = NULL;
        qp_err err;
        int rc = canon_of(spec, &c, &err);
        if (!strcmp(f->def, "derived")) {
            CHECK_INT(rc, 0);
            CHECK_CONTAINS(c, "\"id\":\"j-");
        } else {
            char want[96];
            snprintf(want, sizeof want, "job.%s: required", f->name);
            test_checks++;
            if (!rc) TEST_FAIL_("%s is \"required\", but a job without it was accepted: %s", f->name, c);
            else CHECK_CONTAINS(err.msg, want);
        }
        free(c);
        cJSON_Delete(spec);
    }
}

/* Each name of an enum is accepted by some job, and another is refused with the parser's
 * list of names, which must be the table's. */
static void test_enums(void)
{
    size_t n = 0;
    const qp_job_field *t = qp_job_fields(&n);
    for (size_t i = 0; i < n; i++) {
        const qp_job_field *f = &t[i];
        if (!qp_job_field_value(f, 0)) continue;
        char list[256] = "";
        for (size_t k = 0; qp_job_field_value(f, k); k++) {
            const char *v = qp_job_field_value(f, k);
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", k ? ", " : "", v);
            int accepted = 0;
            for (size_t b = 0; b < N_BASES && !accepted; b++) {
                cJSON *spec = make_base(b, needs_full(f));
                set_path(spec, f->name, cJSON_CreateString(v));
                /* A float format is written through a scheme: the job names both. */
                const qd_format *fd = !strcmp(f->name, "format") ? qd_format_find(v) : NULL;
                for (size_t s = 0; fd && fd->grid != QD_GRID_INT && s < qd_scheme_count(); s++)
                    if (!strcmp(qd_scheme_at(s)->format, v)) {
                        set_path(spec, "scheme", cJSON_CreateString(qd_scheme_at(s)->name));
                        cJSON_DeleteItemFromObject(spec, "bits");
                        cJSON_DeleteItemFromObject(spec, "group_size");
                        cJSON_DeleteItemFromObject(spec, "sym");
                        break;
                    }
                char *c = NULL;
                qp_err err;
                accepted = canon_of(spec, &c, &err) == 0;
                free(c);
                cJSON_Delete(spec);
            }
            test_checks++;
            if (!accepted) TEST_FAIL_("%s: \"%s\" is refused by every job tried", f->name, v);
        }
        cJSON *spec = make_base(1, needs_full(f));
        set_path(spec, f->name, cJSON_CreateString("not-a-value"));
        char *c = NULL, want[400];
        qp_err err;
        CHECK(canon_of(spec, &c, &err) != 0);
        snprintf(want, sizeof want, "job.%s: \"not-a-value\" is not one of %s", f->name, list);
        CHECK_STR(err.msg, want);
        free(c);
        cJSON_Delete(spec);
    }
}

/* A key the table does not list is refused in the job and in each of its objects. */
static void test_unknown_keys(void)
{
    size_t n = 0;
    const qp_job_field *t = qp_job_fields(&n);
    for (size_t i = 0; i <= n; i++) {
        if (i < n && strcmp(t[i].type, "object")) continue;
        char path[96], want[128];
        snprintf(path, sizeof path, "%s%szz_unknown", i < n ? t[i].name : "", i < n ? "." : "");
        snprintf(want, sizeof want, "job.%s: unknown field", path);
        cJSON *spec = make_base(1, 1);   /* awq: the awq object is refused for the others */
        set_path(spec, path, cJSON_CreateNumber(1));
        char *c = NULL;
        qp_err err;
        CHECK(canon_of(spec, &c, &err) != 0);
        CHECK_CONTAINS(err.msg, want);
        free(c);
        cJSON_Delete(spec);
    }
}

/* ---- docs/jobs.md against the table ------------------------------------------------- */

static char *read_doc(const char *path)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    long len = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *s = malloc((size_t)len + 1);
    if (s && fread(s, 1, (size_t)len, fp) != (size_t)len) { free(s); s = NULL; }
    if (s) s[len] = '\0';
    fclose(fp);
    return s;
}

/* The default cell the doc must show: `JSON`, with the other methods' own after it (gptq's
 * is the first), or the words required / derived. */
static void render_default(const qp_job_field *f, char *out, size_t cap)
{
    if (!def_is_json(f->def)) snprintf(out, cap, "%s", f->def);
    else if (f->def_no_gptq && f->def_awq && !strcmp(f->def_no_gptq, f->def_awq))
        snprintf(out, cap, "`%s`; rtn, awq, awq+gptq: `%s`", f->def, f->def_no_gptq);
    else if (f->def_no_gptq) snprintf(out, cap, "`%s`; rtn, awq: `%s`", f->def, f->def_no_gptq);
    else if (f->def_awq) snprintf(out, cap, "`%s`; awq, awq+gptq: `%s`", f->def, f->def_awq);
    else snprintf(out, cap, "`%s`", f->def);
}

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t') s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r')) s[--n] = '\0';
    return s;
}

/* Splits a table row on the '|' that are not escaped; returns the number of cells. */
static size_t split_row(char *line, char **cells, size_t max)
{
    size_t n = 0;
    char *p = line;
    if (*p == '|') p++;
    char *start = p;
    for (; *p; p++) {
        if (*p == '\\' && p[1]) { p++; continue; }
        if (*p != '|') continue;
        *p = '\0';
        if (n < max) cells[n] = trim(start);
        n++;
        start = p + 1;
    }
    if (*trim(start) && n < max) cells[n++] = trim(start);
    return n;
}

/* The job a doc row's field name would make, to quote the parser's refusal. */
static void refusal_of(const char *name, char *out, size_t cap)
{
    cJSON *spec = make_base(2, 0);
    set_path(spec, name, cJSON_CreateNumber(1));
    char *c = NULL;
    qp_err err;
    if (canon_of(spec, &c, &err)) snprintf(out, cap, "%s", err.msg);
    else snprintf(out, cap, "(accepted, yet not in the table)");
    free(c);
    cJSON_Delete(spec);
}

/* The doc's text without whitespace outside strings, for comparing with a compact form. */
static void squeeze(const char *in, char *out, size_t cap)
{
    size_t k = 0;
    int str = 0;
    for (const char *p = in; *p && k + 1 < cap; p++) {
        if (str) {
            out[k++] = *p;
            if (*p == '\\' && p[1] && k + 1 < cap) out[k++] = *++p;
            else if (*p == '"') str = 0;
        } else if (*p == '"') {
            str = 1;
            out[k++] = *p;
        } else if (*p != ' ' && *p != '\n' && *p != '\t' && *p != '\r') {
            out[k++] = *p;
        }
    }
    out[k] = '\0';
}

typedef struct doc_cover {
    int methods[8], formats[16], moe;
} doc_cover;

static void cover(doc_cover *cv, const qp_job *job)
{
    if ((unsigned)job->method < 8) cv->methods[job->method] = 1;
    if ((unsigned)job->format < 16) cv->formats[job->format] = 1;
    cv->moe |= !job->moe.calibrate_all_experts || job->moe.awq_shared_input ||
               job->moe.min_tokens != QP_MOE_MIN_TOKENS_DEFAULT;
}

/* One ```json block at doc line `line`; mark is the comment line before it, if any. */
static void check_example(const char *block, int line, const char *mark, char **prev_canon, doc_cover *cv)
{
    qp_job *job = NULL;
    qp_err err;
    memset(&err, 0, sizeof err);
    int rc = qp_job_parse(block, strlen(block), &job, &err);
    test_checks++;
    if (mark && !strncmp(mark, "<!-- refused:", 13)) {
        char want[256];
        snprintf(want, sizeof want, "%s", mark + 13);
        char *end = strstr(want, "-->");
        if (end) *end = '\0';
        char *w = trim(want);
        if (!rc) TEST_FAIL_("docs/jobs.md:%d: marked refused (%s), but the parser accepts it", line, w);
        else if (!strstr(err.msg, w))
            TEST_FAIL_("docs/jobs.md:%d: refused with \"%s\", the doc says \"%s\"", line, err.msg, w);
        qp_job_free(job);
        return;
    }
    if (rc) {
        TEST_FAIL_("docs/jobs.md:%d: the parser refuses this example: %s", line, err.msg);
        return;
    }
    char *canon = qp_job_to_json(job, 0);
    if (mark && !strncmp(mark, "<!-- canonical", 14)) {
        size_t cap = strlen(block) + 1;
        char *sq = malloc(cap);
        squeeze(block, sq, cap);
        test_checks++;
        if (!*prev_canon) TEST_FAIL_("docs/jobs.md:%d: a canonical form with no example before it", line);
        else if (strcmp(sq, *prev_canon))
            TEST_FAIL_("docs/jobs.md:%d: not the canonical form of the example before it, which is\n%s", line,
                       *prev_canon);
        free(sq);
    }
    cover(cv, job);
    free(*prev_canon);
    *prev_canon = canon;
    qp_job_free(job);
}

static void test_doc(void)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/docs/jobs.md", test_source_dir());
    char *doc = read_doc(path);
    test_checks++;
    if (!doc) { TEST_FAIL_("cannot read %s", path); return; }
    size_t n = 0;
    const qp_job_field *t = qp_job_fields(&n);
    int *row_of = calloc(n, sizeof *row_of);
    int tables = 0, in_table = 0, in_field_table = 0, fence = 0, json = 0, json_line = 0, line = 0;
    char mark[512] = "", last[512] = "";
    char *block = NULL, *prev_canon = NULL;
    size_t blen = 0;
    doc_cover cv;
    memset(&cv, 0, sizeof cv);
    for (char *p = doc, *nl; p && *p; p = nl ? nl + 1 : NULL) {
        nl = strchr(p, '\n');
        if (nl) *nl = '\0';
        line++;
        if (!strncmp(p, "```", 3)) {
            if (!fence) {
                fence = 1;
                json = !strcmp(trim(p + 3), "json");
                json_line = line + 1;
                blen = 0;
                if (block) block[0] = '\0';
                snprintf(mark, sizeof mark, "%s", last);
            } else {
                if (json) check_example(block ? block : "", json_line, strncmp(mark, "<!--", 4) ? NULL : mark,
                                        &prev_canon, &cv);
                fence = json = 0;
            }
            in_table = 0;
            continue;
        }
        if (fence) {
            if (json) {
                size_t k = strlen(p);
                block = realloc(block, blen + k + 2);
                memcpy(block + blen, p, k);
                blen += k;
                block[blen++] = '\n';
                block[blen] = '\0';
            }
            continue;
        }
        if (*trim(p)) snprintf(last, sizeof last, "%s", trim(p));
        if (p[0] != '|') { in_table = in_field_table = 0; continue; }
        char *cells[8];
        char row[4096];
        snprintf(row, sizeof row, "%s", p);
        size_t nc = split_row(row, cells, 8);
        if (!in_table) {
            in_table = 1;
            in_field_table = nc >= 1 && !strcmp(cells[0], "field");
            if (in_field_table) {
                tables++;
                if (nc != 4 || strcmp(cells[1], "type") || strcmp(cells[2], "default") || strcmp(cells[3], "meaning"))
                    TEST_FAIL_("docs/jobs.md:%d: the field table's header must be | field | type | default | meaning |",
                               line);
            }
            continue;
        }
        if (!in_field_table || strspn(p, "|-: ") == strlen(p)) continue;
        test_checks++;
        size_t nl_ = strlen(cells[0]);
        if (nc != 4 || nl_ < 3 || cells[0][0] != '`' || cells[0][nl_ - 1] != '`') {
            TEST_FAIL_("docs/jobs.md:%d: a row needs 4 cells and the field in backticks: %s", line, p);
            continue;
        }
        cells[0][nl_ - 1] = '\0';
        const char *name = cells[0] + 1;
        const qp_job_field *f = qp_job_field_find(name);
        if (!f) {
            char why[QP_ERR_MSG_MAX];
            refusal_of(name, why, sizeof why);
            TEST_FAIL_("docs/jobs.md:%d: names field %s, which the parser refuses: %s", line, name, why);
            continue;
        }
        size_t i = (size_t)(f - t);
        if (row_of[i]) TEST_FAIL_("docs/jobs.md:%d: %s has a row already (line %d)", line, name, row_of[i]);
        row_of[i] = line;
        if (strcmp(cells[1], f->type))
            TEST_FAIL_("docs/jobs.md:%d: %s: type \"%s\", the parser's is \"%s\"", line, name, cells[1], f->type);
        char want[256];
        render_default(f, want, sizeof want);
        if (strcmp(cells[2], want))
            TEST_FAIL_("docs/jobs.md:%d: %s: default \"%s\", the parser's is \"%s\"", line, name, cells[2], want);
        for (size_t k = 0; qp_job_field_value(f, k); k++) {
            char v[64];
            snprintf(v, sizeof v, "`%s`", qp_job_field_value(f, k));
            if (!strstr(cells[3], v))
                TEST_FAIL_("docs/jobs.md:%d: %s: the meaning does not name the value %s", line, name, v);
        }
    }
    test_checks++;
    if (tables != 1) TEST_FAIL_("docs/jobs.md has %d tables headed | field | ...; it must have exactly one", tables);
    for (size_t i = 0; i < n; i++) {
        if (row_of[i]) continue;
        char want[256];
        render_default(&t[i], want, sizeof want);
        TEST_FAIL_("docs/jobs.md lacks the field %s; add the row | `%s` | %s | %s | ... |", t[i].name, t[i].name,
                   t[i].type, want);
    }
    /* Worked examples for every method and format, and a MoE option. */
    const qp_job_field *fm = qp_job_field_find("method"), *ff = qp_job_field_find("format");
    for (size_t k = 0; qp_job_field_value(fm, k); k++)
        if (!cv.methods[k]) TEST_FAIL_("docs/jobs.md has no example of method %s", qp_job_field_value(fm, k));
    for (size_t k = 0; qp_job_field_value(ff, k) && k < 16; k++)
        if (!cv.formats[k]) TEST_FAIL_("docs/jobs.md has no example of format %s", qp_job_field_value(ff, k));
    if (!cv.moe) TEST_FAIL_("docs/jobs.md has no example with a moe option");
    free(prev_canon);
    free(block);
    free(row_of);
    free(doc);
}

int main(void)
{
    TEST_RUN(test_table_shape);
    TEST_RUN(test_defaults);
    TEST_RUN(test_examples);
    TEST_RUN(test_required);
    TEST_RUN(test_enums);
    TEST_RUN(test_unknown_keys);
    TEST_RUN(test_doc);
    return test_finish();
}
