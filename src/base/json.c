#include "base/json.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"

kiln_status ku_json_load(const char *path, cJSON **out) {
    char *text;
    size_t len;
    *out = NULL;
    KILN_TRY(ku_read_file(path, &text, &len));
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!j) {
        size_t off = end ? (size_t)(end - text) : 0;
        free(text);
        return kiln_error(KILN_EINVAL, "%s: invalid JSON near byte %zu", path, off);
    }
    free(text);
    *out = j;
    return NULL;
}

kiln_status ku_json_load_py(const char *path, cJSON **out) {
    char *text, *fixed;
    size_t len, k = 0;
    *out = NULL;
    KILN_TRY(ku_read_file(path, &text, &len));
    fixed = malloc(len * 2 + 1); /* each rewrite grows its token by at most 1/3 */
    if (!fixed) {
        free(text);
        return kiln_error(KILN_ENOMEM, "%s: out of memory", path);
    }
    int in_str = 0;
    for (size_t i = 0; i < len;) {
        char ch = text[i];
        if (in_str) {
            fixed[k++] = text[i++];
            if (ch == '\\' && i < len) fixed[k++] = text[i++];
            else if (ch == '"') in_str = 0;
            continue;
        }
        static const struct { const char *from, *to; } rw[] = {{"-Infinity", "-1e999"}, {"Infinity", "1e999"}, {"NaN", "null"}};
        int done = 0;
        for (size_t r = 0; r < 3 && !done; r++) {
            size_t fl = strlen(rw[r].from);
            if (len - i >= fl && memcmp(text + i, rw[r].from, fl) == 0) {
                memcpy(fixed + k, rw[r].to, strlen(rw[r].to));
                k += strlen(rw[r].to);
                i += fl;
                done = 1;
            }
        }
        if (done) continue;
        in_str = ch == '"';
        fixed[k++] = text[i++];
    }
    free(text);
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(fixed, k, &end, 0);
    size_t off = end ? (size_t)(end - fixed) : 0;
    free(fixed);
    if (!j) return kiln_error(KILN_EINVAL, "%s: invalid JSON near byte %zu", path, off);
    *out = j;
    return NULL;
}

const cJSON *ku_json_get(const cJSON *obj, const char *key) {
    if (!obj || !cJSON_IsObject(obj)) return NULL;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return (v && !cJSON_IsNull(v)) ? v : NULL;
}

kiln_status ku_json_num(const cJSON *obj, const char *key, double def, double *out) {
    const cJSON *v = ku_json_get(obj, key);
    *out = def;
    if (!v) return NULL;
    if (!cJSON_IsNumber(v)) return kiln_error(KILN_EINVAL, "\"%s\": expected a number", key);
    *out = v->valuedouble;
    return NULL;
}

kiln_status ku_json_int(const cJSON *obj, const char *key, int64_t def, int64_t *out) {
    const cJSON *v = ku_json_get(obj, key);
    *out = def;
    if (!v) return NULL;
    double d = v->valuedouble;
    if (!cJSON_IsNumber(v) || d != floor(d) || fabs(d) > 9.0e15)
        return kiln_error(KILN_EINVAL, "\"%s\": expected an integer", key);
    *out = (int64_t)d;
    return NULL;
}

kiln_status ku_json_bool(const cJSON *obj, const char *key, bool def, bool *out) {
    const cJSON *v = ku_json_get(obj, key);
    *out = def;
    if (!v) return NULL;
    if (!cJSON_IsBool(v)) return kiln_error(KILN_EINVAL, "\"%s\": expected true or false", key);
    *out = cJSON_IsTrue(v);
    return NULL;
}

kiln_status ku_json_str(const cJSON *obj, const char *key, const char *def, const char **out) {
    const cJSON *v = ku_json_get(obj, key);
    *out = def;
    if (!v) return NULL;
    if (!cJSON_IsString(v)) return kiln_error(KILN_EINVAL, "\"%s\": expected a string", key);
    *out = v->valuestring;
    return NULL;
}

kiln_status ku_json_int_list(const cJSON *obj, const char *key, int64_t *out, int cap, int *n) {
    const cJSON *v = ku_json_get(obj, key);
    *n = 0;
    if (!v) return NULL;
    if (cJSON_IsNumber(v)) {
        if (cap < 1) return kiln_error(KILN_EINVAL, "\"%s\": too many values", key);
        return ku_json_int(obj, key, 0, &out[(*n)++]);
    }
    if (!cJSON_IsArray(v)) return kiln_error(KILN_EINVAL, "\"%s\": expected an integer or a list of integers", key);
    const cJSON *e;
    cJSON_ArrayForEach(e, v) {
        if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble))
            return kiln_error(KILN_EINVAL, "\"%s\": expected a list of integers", key);
        if (*n >= cap) return kiln_error(KILN_EINVAL, "\"%s\": more than %d values", key, cap);
        out[(*n)++] = (int64_t)e->valuedouble;
    }
    return NULL;
}
