/* recipe.c: mlx-lm's mixed-precision predicates (mlx_lm/convert.py,
 * mixed_quant_predicate_builder), themselves after llama.cpp's Q4_K_M choices. */
#include <stdlib.h>
#include <string.h>

#include "quant/quant.h"

static const struct {
    const char *name;
    int low, high;
} recipes[] = {{"mixed_2_6", 2, 6}, {"mixed_3_4", 3, 4}, {"mixed_3_6", 3, 6}, {"mixed_4_6", 4, 6}};

kiln_status kq_recipe_parse(const char *name, kq_recipe *out) {
    for (size_t i = 0; i < sizeof recipes / sizeof recipes[0]; i++)
        if (!strcmp(name, recipes[i].name)) {
            *out = (kq_recipe){recipes[i].low, recipes[i].high};
            return NULL;
        }
    return kiln_error(KILN_EINVAL, "unknown mixed recipe \"%.64s\" (mixed_2_6, mixed_3_4, mixed_3_6, mixed_4_6)", name);
}

/* Component k of a dotted path as mlx-lm reads it: int(path.split(".")[k])
 * when the path has that many components, else 0. (A component that is not a
 * number makes Python raise; none of the supported layouts has one.) */
static int64_t layer_index(const char *path, int k) {
    const char *p = path;
    for (int i = 0; i < k; i++) {
        p = strchr(p, '.');
        if (!p) return 0;
        p++;
    }
    return strtoll(p, NULL, 10);
}

static int64_t py_mod(int64_t a, int64_t m) { return ((a % m) + m) % m; }

int kq_recipe_bits(const kq_recipe *r, const char *path, int layer_pos, int64_t n_layers) {
    int64_t index = layer_index(path, layer_pos);
    bool more = index < n_layers / 8 || index >= 7 * n_layers / 8 || py_mod(index - n_layers / 8, 3) == 2;
    if ((strstr(path, "v_proj") || strstr(path, "v_a_proj") || strstr(path, "v_b_proj")) && more) return r->high_bits;
    if (strstr(path, "down_proj") && more) return r->high_bits;
    if (strstr(path, "lm_head")) return r->high_bits;
    return r->low_bits;
}
