/* GPTQ's `dynamic` per-module overrides in quantization_config (GPTQModel's QuantizeConfig.dynamic,
 * read by vLLM's gptq_utils.py get_dynamic_override): an object whose keys are regexes, matched
 * with Python's re.match (anchored at the start, not at the end) against a module's name, the
 * first matching key in file order deciding. "+:" (or no prefix) overrides the top-level keys
 * for the modules it matches; "-:" leaves them unquantized.
 *
 * What quantd reads: "-:" rules (a module left in float, which the loader sees from its plain
 * weight) and "+:" rules whose values hold bits, group_size, desc_act and sym; any other key
 * in a rule's value is refused by name, and so is a regex that uses syntax beyond POSIX
 * extended regexes (Python's "(?" groups, backslash classes other than \d, \w and \s, which
 * become their POSIX classes), which quantd matches with regcomp and would otherwise read
 * differently from vLLM. A mixed checkpoint's layer is read at the widths its tensors store,
 * which must be the widths its rule gives (qd_gptq_dynamic_agree). */
#ifndef QUANT_FORMATS_FMT_GPTQ_DYNAMIC_H
#define QUANT_FORMATS_FMT_GPTQ_DYNAMIC_H

#include <stdint.h>

#include <cjson/cJSON.h>
#include "quant/core/error.h"

/* What a rule said for one module. */
typedef enum qd_gptq_dyn_match {
    QD_GPTQ_DYN_NONE = 0,   /* no rule matches: the top-level bits and group size */
    QD_GPTQ_DYN_SET = 1,    /* a "+:" rule matches (its keys, the top-level ones for the rest) */
    QD_GPTQ_DYN_SKIP = 2,   /* a "-:" rule matches: the module is not quantized */
} qd_gptq_dyn_match;

/* Checks q's `dynamic` (absent or null: nothing to check) as described above; *mixed set to 1
 * when a "+:" rule gives bits or a group size other than the top-level ones (top_bits,
 * top_gs), 0 otherwise. A rule whose sym differs from top_sym is refused (quantd's reader
 * takes one symmetry per checkpoint). `what` names the file in messages. 0 or a negative code. */
int qd_gptq_dynamic_check(const cJSON *q, int top_bits, int64_t top_gs, int top_sym, int *mixed, const char *what,
                          qd_err *err);

/* The bits and group size module `name` gets, as vLLM's override_config gives them: the first
 * rule whose regex re.match-es name; *bits and *gs are the top-level ones unless that rule
 * overrides them. Returns a qd_gptq_dyn_match, or a negative code (err set) when q's top-level
 * bits / group_size are missing or a rule is not readable. */
int qd_gptq_dynamic_lookup(const cJSON *q, const char *name, int *bits, int64_t *gs, qd_err *err);

/* Whether module `name` of a mixed checkpoint, whose tensors say `bits` and group size `gs`
 * (-1: one group) over k inputs, is what q's rules give it (qd_gptq_dynamic_lookup; a group
 * of k inputs and -1 are the same). 0 when it is; QD_EFORMAT naming the module, its tensors'
 * width and the rule's when not, or when a "-:" rule leaves it in float and it is packed: a
 * loader that follows the rules (vLLM) would build that layer for other tensors, so quantd
 * does not read what the file stores instead. */
int qd_gptq_dynamic_agree(const cJSON *q, const char *name, int bits, int64_t gs, int64_t k, qd_err *err);

#endif
