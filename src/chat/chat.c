/* chat.c: locating, loading and rendering a model folder's chat template. */
#include "chat/chat.h"

#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/json.h"

#define N_SPECIAL 7
static const char *const SPECIAL[N_SPECIAL] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                               "pad_token", "cls_token", "mask_token"};

struct kchat_template {
    kjin_template *tpl;
    char *src; /* the template's text (kchat_source) */
    char *special[N_SPECIAL];
};

void kchat_free(kchat_template *t) {
    if (!t) return;
    kjin_free(t->tpl);
    free(t->src);
    for (int i = 0; i < N_SPECIAL; i++) free(t->special[i]);
    free(t);
}

const char *kchat_special_token(const kchat_template *t, const char *key) {
    for (int i = 0; i < N_SPECIAL; i++)
        if (!strcmp(SPECIAL[i], key)) return t->special[i];
    return NULL;
}

const char *kchat_source(const kchat_template *t) { return t->src; }

kiln_status kchat_parse(const char *source, kchat_template **out) {
    *out = NULL;
    kchat_template *t = calloc(1, sizeof *t);
    if (!t) return kiln_error(KILN_ENOMEM, "out of memory");
    kiln_status st = kjin_parse(source, strlen(source), &t->tpl);
    if (!st && !(t->src = strdup(source))) st = kiln_error(KILN_ENOMEM, "out of memory");
    if (st) {
        kjin_free(t->tpl);
        free(t);
        return st;
    }
    *out = t;
    return NULL;
}

/* A token given as "text" or as an AddedToken {"content": "text", ...}. */
static const char *token_string(const cJSON *v) {
    if (cJSON_IsString(v)) return v->valuestring;
    if (cJSON_IsObject(v)) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(v, "content");
        if (cJSON_IsString(c)) return c->valuestring;
    }
    return NULL;
}

/* chat_template as a string, or a list of {name, template}: the one named
 * name (default: "default"). */
static kiln_status pick_template(const cJSON *ct, const char *file, const char *name, const char **src) {
    const char *want = name ? name : "default";
    *src = NULL;
    if (cJSON_IsString(ct)) {
        if (name && strcmp(name, "default") != 0)
            return kiln_error(KILN_ENOTFOUND, "%s: no chat template named \"%s\" (only a default one)", file, name);
        *src = ct->valuestring;
        return NULL;
    }
    if (!cJSON_IsArray(ct)) return kiln_error(KILN_EINVAL, "%s: \"chat_template\": expected a string or a list", file);
    char names[512] = "";
    const cJSON *e;
    cJSON_ArrayForEach(e, ct) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(e, "name");
        const cJSON *tx = cJSON_GetObjectItemCaseSensitive(e, "template");
        if (!cJSON_IsString(n) || !cJSON_IsString(tx))
            return kiln_error(KILN_EINVAL, "%s: \"chat_template\": entries need a string name and template", file);
        if (!strcmp(n->valuestring, want)) {
            *src = tx->valuestring;
            return NULL;
        }
        size_t used = strlen(names);
        snprintf(names + used, sizeof names - used, "%s%s", used ? ", " : "", n->valuestring);
    }
    return kiln_error(KILN_ENOTFOUND, "%s: no chat template named \"%s\" (have: %s)", file, want, names);
}

kiln_status kchat_load_named(const char *dir, const char *name, kchat_template **out) {
    *out = NULL;
    char path[4096];
    cJSON *cfg = NULL;
    KILN_TRY(ku_check_model_dir(dir));
    KILN_TRY(ku_path_join(path, sizeof path, dir, "tokenizer_config.json"));
    if (ku_file_exists(path)) KILN_TRY(ku_json_load(path, &cfg));

    char *text = NULL;     /* owned template text */
    const char *src = NULL; /* borrowed from a JSON tree */
    cJSON *ctj = NULL;
    kiln_status st = NULL;
    char where[4200] = "";
    if (!st) st = ku_path_join(path, sizeof path, dir, "chat_template.jinja");
    if (!st && ku_file_exists(path) && (!name || !strcmp(name, "default"))) {
        st = ku_read_file(path, &text, NULL);
        snprintf(where, sizeof where, "%s", path);
    }
    if (!st && !text) {
        st = ku_path_join(path, sizeof path, dir, "chat_template.json");
        if (!st && ku_file_exists(path)) {
            st = ku_json_load(path, &ctj);
            const cJSON *ct = st ? NULL : cJSON_GetObjectItemCaseSensitive(ctj, "chat_template");
            if (!st && !ct) st = kiln_error(KILN_EINVAL, "%s: no \"chat_template\" key", path);
            if (!st) st = pick_template(ct, path, name, &src);
            snprintf(where, sizeof where, "%s", path);
        }
    }
    if (!st && !text && !src && cfg) {
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
        snprintf(where, sizeof where, "%s/tokenizer_config.json", dir);
        if (ct && !cJSON_IsNull(ct)) st = pick_template(ct, where, name, &src);
    }
    if (!st && !text && !src) st = kiln_error(KILN_ENOTFOUND, "%s: no chat template (looked for chat_template.jinja, chat_template.json and tokenizer_config.json)", dir);
    kchat_template *t = NULL;
    if (!st) {
        t = calloc(1, sizeof *t);
        if (!t) st = kiln_error(KILN_ENOMEM, "out of memory");
    }
    if (!st) {
        const char *s = text ? text : src;
        st = kiln_status_wrap(kjin_parse(s, strlen(s), &t->tpl), "%s: chat template", where);
        if (!st && !(t->src = strdup(s))) st = kiln_error(KILN_ENOMEM, "out of memory");
    }
    for (int i = 0; !st && cfg && i < N_SPECIAL; i++) {
        const char *v = token_string(cJSON_GetObjectItemCaseSensitive(cfg, SPECIAL[i]));
        if (v && !(t->special[i] = strdup(v))) st = kiln_error(KILN_ENOMEM, "out of memory");
    }
    free(text);
    cJSON_Delete(ctj);
    cJSON_Delete(cfg);
    if (st) {
        kchat_free(t);
        return st;
    }
    *out = t;
    return NULL;
}

kiln_status kchat_load(const char *dir, kchat_template **out) { return kchat_load_named(dir, NULL, out); }

/* Adds a borrowed subtree under key (cJSON references do not copy). */
static bool add_ref(cJSON *obj, const char *key, const cJSON *v) {
    cJSON *ref = v ? cJSON_CreateObjectReference(NULL) : cJSON_CreateNull();
    if (!ref) return false;
    if (v) {
        cJSON_Delete(ref);
        ref = cJSON_IsArray(v) ? cJSON_CreateArrayReference(v->child)
            : cJSON_IsObject(v) ? cJSON_CreateObjectReference(v->child)
                                : cJSON_Duplicate(v, true);
        if (!ref) return false;
    }
    cJSON_DeleteItemFromObjectCaseSensitive(obj, key);
    return cJSON_AddItemToObject(obj, key, ref);
}

kiln_status kchat_render(const kchat_template *t, const kchat_input *in, char **out) {
    *out = NULL;
    if (!in->messages || !cJSON_IsArray(in->messages)) return kiln_error(KILN_EINVAL, "messages: expected a JSON array");
    if (in->tools && !cJSON_IsNull(in->tools) && !cJSON_IsArray(in->tools))
        return kiln_error(KILN_EINVAL, "tools: expected a JSON array");
    if (in->extra && !cJSON_IsObject(in->extra)) return kiln_error(KILN_EINVAL, "extra template arguments: expected a JSON object");
    cJSON *vars = cJSON_CreateObject();
    bool ok = vars != NULL;
    ok = ok && add_ref(vars, "messages", in->messages);
    ok = ok && cJSON_AddBoolToObject(vars, "add_generation_prompt", in->add_generation_prompt);
    ok = ok && add_ref(vars, "tools", in->tools && !cJSON_IsNull(in->tools) ? in->tools : NULL);
    ok = ok && add_ref(vars, "documents", in->documents && !cJSON_IsNull(in->documents) ? in->documents : NULL);
    for (int i = 0; ok && i < N_SPECIAL; i++) {
        const char *v = t->special[i];
        if (i == 0 && in->bos_token) v = in->bos_token;
        if (i == 1 && in->eos_token) v = in->eos_token;
        if (v) ok = cJSON_AddStringToObject(vars, SPECIAL[i], v) != NULL;
    }
    if (ok && in->extra) { /* extra arguments override, as **kwargs do */
        const cJSON *e;
        cJSON_ArrayForEach(e, in->extra) ok = ok && add_ref(vars, e->string, e);
    }
    if (!ok) {
        cJSON_Delete(vars);
        return kiln_error(KILN_ENOMEM, "out of memory");
    }
    kiln_status st = kjin_render(t->tpl, vars, in->limits, out, NULL);
    cJSON_Delete(vars);
    return st;
}
