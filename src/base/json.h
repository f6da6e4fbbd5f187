/* json.h: typed, checked access to cJSON objects. A missing key yields the
 * default; a key of the wrong type is an error naming the key. */
#ifndef KILN_JSON_H
#define KILN_JSON_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"

kiln_status ku_json_load(const char *path, cJSON **out);
/* Loads a JSON file as Python's json module writes it: transformers' configs
 * may hold the bare tokens Infinity, -Infinity and NaN (mamba2's
 * "time_step_limit": [0.0, Infinity]), which cJSON rejects. Outside strings
 * they become 1e999 / -1e999 (parsed as +-inf) and null. */
kiln_status ku_json_load_py(const char *path, cJSON **out);

/* null counts as missing. */
const cJSON *ku_json_get(const cJSON *obj, const char *key);
kiln_status ku_json_int(const cJSON *obj, const char *key, int64_t def, int64_t *out);
kiln_status ku_json_num(const cJSON *obj, const char *key, double def, double *out);
kiln_status ku_json_bool(const cJSON *obj, const char *key, bool def, bool *out);
/* Borrowed from obj; def may be NULL. */
kiln_status ku_json_str(const cJSON *obj, const char *key, const char *def, const char **out);
/* An int or a list of ints (e.g. eos_token_id). Returns count in *n (<= cap). */
kiln_status ku_json_int_list(const cJSON *obj, const char *key, int64_t *out, int cap, int *n);

#endif
