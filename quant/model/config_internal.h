/* Shared by the config.json readers (config.c, config_rope.c): typed field getters that
 * keep the default when a key is absent or null and name the key when its type is wrong. */
#ifndef QUANT_MODEL_CONFIG_INTERNAL_H
#define QUANT_MODEL_CONFIG_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>

#include "quant/model/config.h"

int qd_cfg_get_int(const cJSON *o, const char *key, int64_t *out, const char *what, qd_err *err);
int qd_cfg_get_float(const cJSON *o, const char *key, float *out, const char *what, qd_err *err);
int qd_cfg_get_bool(const cJSON *o, const char *key, int *out, const char *what, qd_err *err);
int qd_cfg_get_str(const cJSON *o, const char *key, char *out, size_t cap, const char *what, qd_err *err);
/* The RoPE keys (config_rope.c): sets c->rope_theta and c->rope. */
int qd_config_rope_parse(const cJSON *root, const char *what, qd_model_config *c, qd_err *err);

#endif
