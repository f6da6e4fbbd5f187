/* chat.h: chat templates of model folders (prefix kchat_).
 *
 * Finds a checkpoint's template the way transformers does
 * (chat_template.jinja, then chat_template.json, then tokenizer_config.json's
 * "chat_template", a string or a list of {name, template}), reads the special
 * token strings from tokenizer_config.json, and renders a conversation with
 * the variables transformers passes: messages, add_generation_prompt, tools,
 * documents, bos_token, eos_token, ... and any extra keyword arguments.
 * A loaded template is immutable: render it from several threads at once. */
#ifndef KILN_CHAT_H
#define KILN_CHAT_H

#include <cjson/cJSON.h>
#include <stdbool.h>

#include "base/status.h"
#include "chat/jinja.h"

typedef struct kchat_template kchat_template;

/* The folder's default template; KILN_ENOTFOUND when it has none. */
kiln_status kchat_load(const char *dir, kchat_template **out);
/* A named template ("default", "tool_use", ...) from a list of templates;
 * name NULL means the default. KILN_ENOTFOUND names the ones available. */
kiln_status kchat_load_named(const char *dir, const char *name, kchat_template **out);
/* From template text (no special tokens unless the input gives them). */
kiln_status kchat_parse(const char *source, kchat_template **out);
void kchat_free(kchat_template *t);

/* The template's text (borrowed): what tool-call formats are detected from. */
const char *kchat_source(const kchat_template *t);

/* The special token strings from tokenizer_config.json (borrowed; NULL if
 * absent). key: "bos_token", "eos_token", "unk_token", "pad_token", ... */
const char *kchat_special_token(const kchat_template *t, const char *key);

typedef struct {
    const cJSON *messages;  /* array of {role, content, ...}; required */
    const cJSON *tools;     /* array or NULL (renders as none) */
    const cJSON *documents; /* array or NULL (renders as none) */
    const cJSON *extra;     /* object of extra variables (enable_thinking, ...) or NULL */
    bool add_generation_prompt;
    const char *bos_token, *eos_token; /* override the folder's; NULL keeps them */
    const kjin_limits *limits;         /* NULL: kjin_limits_default() */
} kchat_input;

/* Renders into *out (malloc'ed, NUL-terminated). Template errors, including
 * raise_exception(), come back as KILN_EINVAL with their message. */
kiln_status kchat_render(const kchat_template *t, const kchat_input *in, char **out);

#endif
