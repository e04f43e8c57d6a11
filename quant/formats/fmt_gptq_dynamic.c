/* GPTQ's `dynamic` overrides (fmt_gptq_dynamic.h). Python's re.match asks whether the regex
 * matches some prefix of the name; a POSIX extended regex "^(pattern)" asks the same, and
 * whether such a match exists does not depend on the two engines' different choice among
 * matches, so the answer is vLLM's for every pattern both read alike. Patterns that read
 * differently (Python-only syntax) are refused rather than guessed. */
#include "quant/formats/fmt_gptq_dynamic.h"

#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The rule's regex, without its "+:" / "-:" prefix; *skip 1 for "-:". */
static const char *rule_regex(const char *key, int *skip)
{
    *skip = !strncmp(key, "-:", 2);
    return !strncmp(key, "-:", 2) || !strncmp(key, "+:", 2) ? key + 2 : key;
}

/* Compiles "^(re)"; QD_EUNSUPPORTED naming the rule for syntax quantd would read otherwise.
 * Python's \d, \w and \s (on the ASCII names of modules) become their POSIX classes, as
 * quantd's own tp_aware rules and other tools' write \d+ for a layer index; any other
 * class escape or "(?" group is refused. */
static int rule_compile(const char *key, const char *re, regex_t *out, const char *what, qd_err *err)
{
    size_t n = strlen(re);
    char *full = malloc(12 * n + 4);
    if (!full) return qd_err_set(err, QD_ENOMEM, "out of memory");
    size_t o = 0;
    int in_br = 0;
    full[o++] = '^';
    full[o++] = '(';
    for (const char *c = re; *c; c++) {
        if (c[0] == '(' && c[1] == '?' && !in_br) {
            free(full);
            return qd_err_set(err, QD_EUNSUPPORTED, "%s: quantization_config.dynamic \"%s\": \"(?\" groups are Python "
                              "regex syntax quantd does not read (it matches POSIX extended regexes)", what, key);
        }
        if (c[0] == '[' && !in_br) in_br = 1;
        else if (c[0] == ']' && in_br && c[-1] != '[') in_br = 0;
        if (c[0] != '\\' || !c[1]) { full[o++] = c[0]; continue; }
        const char *cls = c[1] == 'd' ? "0-9" : c[1] == 'w' ? "A-Za-z0-9_" : c[1] == 's' ? "[:space:]" : NULL;
        int word = c[1] == '_' || (c[1] >= '0' && c[1] <= '9') || (c[1] >= 'a' && c[1] <= 'z') || (c[1] >= 'A' && c[1] <= 'Z');
        if (word && !cls) {
            free(full);
            return qd_err_set(err, QD_EUNSUPPORTED, "%s: quantization_config.dynamic \"%s\": the class \\%c is Python "
                              "regex syntax quantd does not read (it matches POSIX extended regexes)", what, key, c[1]);
        }
        if (cls) o += (size_t)sprintf(full + o, in_br ? "%s" : "[%s]", cls);
        else { full[o++] = c[0]; full[o++] = c[1]; }
        c++;
    }
    full[o++] = ')';
    full[o] = 0;
    int rc = regcomp(out, full, REG_EXTENDED | REG_NOSUB);
    free(full);
    if (rc) return qd_err_set(err, QD_EFORMAT, "%s: quantization_config.dynamic \"%s\" is not a regex quantd reads", what, key);
    return 0;
}

/* One rule's value: an object of bits, group_size, desc_act, sym (each checked). */
static int rule_value(const cJSON *r, const char *what, int *bits, int64_t *gs, int *sym, int *has_sym, qd_err *err)
{
    if (!cJSON_IsObject(r))
        return qd_err_set(err, QD_EFORMAT, "%s: quantization_config.dynamic \"%s\" must map to an object", what, r->string);
    *has_sym = 0;
    for (const cJSON *v = r->child; v; v = v->next) {
        const char *k = v->string;
        if (!strcmp(k, "bits")) {
            if (!cJSON_IsNumber(v) || (v->valueint != 2 && v->valueint != 3 && v->valueint != 4 && v->valueint != 8) ||
                v->valuedouble != v->valueint)
                return qd_err_set(err, QD_EFORMAT, "%s: quantization_config.dynamic \"%s\": bits must be 2, 3, 4 or 8",
                                  what, r->string);
            *bits = v->valueint;
        } else if (!strcmp(k, "group_size")) {
            if (!cJSON_IsNumber(v) || v->valuedouble != (double)(int64_t)v->valuedouble ||
                (v->valuedouble < 1 && v->valuedouble != -1))
                return qd_err_set(err, QD_EFORMAT, "%s: quantization_config.dynamic \"%s\": group_size must be -1 or "
                                  "positive", what, r->string);
            *gs = (int64_t)v->valuedouble;
        } else if (!strcmp(k, "desc_act") || !strcmp(k, "sym")) {
            if (!cJSON_IsBool(v))
                return qd_err_set(err, QD_EFORMAT, "%s: quantization_config.dynamic \"%s\": %s must be true or false",
                                  what, r->string, k);
            if (!strcmp(k, "sym")) {
                *sym = cJSON_IsTrue(v);
                *has_sym = 1;
            }
        } else {
            return qd_err_set(err, QD_EUNSUPPORTED, "%s: quantization_config.dynamic \"%s\": the override \"%s\" is not "
                              "read by quantd (it reads bits, group_size, desc_act and sym)", what, r->string, k);
        }
    }
    return 0;
}

static const cJSON *dynamic_of(const cJSON *q, const char *what, qd_err *err, int *rc)
{
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(q, "dynamic");
    *rc = 0;
    if (!d || cJSON_IsNull(d)) return NULL;
    if (!cJSON_IsObject(d)) *rc = qd_err_set(err, QD_EFORMAT, "%s: quantization_config.dynamic must be an object", what);
    return *rc ? NULL : d;
}

int qd_gptq_dynamic_check(const cJSON *q, int top_bits, int64_t top_gs, int top_sym, int *mixed, const char *what,
                          qd_err *err)
{
    *mixed = 0;
    int rc;
    const cJSON *d = dynamic_of(q, what, err, &rc);
    for (const cJSON *r = d ? d->child : NULL; r && !rc; r = r->next) {
        int skip, bits = top_bits, sym = top_sym, has_sym;
        int64_t gs = top_gs;
        regex_t re;
        const char *pat = rule_regex(r->string, &skip);
        if ((rc = rule_compile(r->string, pat, &re, what, err))) break;
        regfree(&re);
        if (skip) continue;   /* its value is ignored, as vLLM and GPTQModel ignore it */
        if ((rc = rule_value(r, what, &bits, &gs, &sym, &has_sym, err))) break;
        if (has_sym && sym != top_sym)
            rc = qd_err_set(err, QD_EUNSUPPORTED, "%s: quantization_config.dynamic \"%s\": sym %s differs from the "
                            "top-level sym (quantd reads one symmetry per GPTQ checkpoint)", what, r->string,
                            sym ? "true" : "false");
        if (bits != top_bits || gs != top_gs) *mixed = 1;
    }
    return rc;
}

int qd_gptq_dynamic_lookup(const cJSON *q, const char *name, int *bits, int64_t *gs, qd_err *err)
{
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(q, "bits"), *g = cJSON_GetObjectItemCaseSensitive(q, "group_size");
    if (!cJSON_IsNumber(b) || !cJSON_IsNumber(g))
        return qd_err_set(err, QD_EFORMAT, "quantization_config: bits and group_size must be numbers");
    *bits = b->valueint;
    *gs = (int64_t)g->valuedouble;
    int rc;
    const cJSON *d = dynamic_of(q, "quantization_config", err, &rc);
    for (const cJSON *r = d ? d->child : NULL; r && !rc; r = r->next) {
        int skip, sym = 1, has_sym;
        regex_t re;
        const char *pat = rule_regex(r->string, &skip);
        if ((rc = rule_compile(r->string, pat, &re, "quantization_config", err))) break;
        int hit = regexec(&re, name, 0, NULL, 0) == 0;
        regfree(&re);
        if (!hit) continue;
        if (skip) return QD_GPTQ_DYN_SKIP;
        int bb = *bits;
        int64_t gg = *gs;
        if ((rc = rule_value(r, "quantization_config", &bb, &gg, &sym, &has_sym, err))) break;
        *bits = bb;
        *gs = gg;
        return QD_GPTQ_DYN_SET;
    }
    return rc ? rc : QD_GPTQ_DYN_NONE;
}

int qd_gptq_dynamic_agree(const cJSON *q, const char *name, int bits, int64_t gs, int64_t k, qd_err *err)
{
    int rb = 0;
    int64_t rg = 0;
    int m = qd_gptq_dynamic_lookup(q, name, &rb, &rg, err);
    if (m < 0) return m;
    if (m == QD_GPTQ_DYN_SKIP)
        return qd_err_set(err, QD_EFORMAT, "%s: quantization_config.dynamic leaves it unquantized (a \"-:\" rule), but "
                          "it is stored packed (%d bits)", name, bits);
    const int64_t g_file = gs == k ? -1 : gs, g_rule = rg == k ? -1 : rg;
    if (rb != bits || g_rule != g_file)
        return qd_err_set(err, QD_EFORMAT, "%s: its tensors are %d bits, group size %lld, but quantization_config%s says "
                          "%d bits, group size %lld", name, bits, (long long)gs,
                          m == QD_GPTQ_DYN_SET ? ".dynamic" : " (no dynamic rule matches it)", rb, (long long)rg);
    return 0;
}
