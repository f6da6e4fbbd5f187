/* cmd_template.c: kiln template -m DIR --messages FILE.json
 *   [--add-generation-prompt] [--tools FILE.json] [--documents FILE.json]
 *   [--kwargs JSON] [--template-name NAME]
 * Prints the rendered prompt. Needs only the tokenizer files of DIR. */
#include "cli/cmd_template.h"

#include <stdio.h>
#include <string.h>

#include "base/json.h"
#include "chat/chat.h"
#include "cli/cli.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: kiln template [-m DIR] --messages FILE.json [--add-generation-prompt]\n"
            "                     [--tools FILE.json] [--documents FILE.json] [--kwargs JSON]\n"
            "                     [--template-name NAME]\n"
            "  -m, --model DIR          the model's folder (its chat template; default: the bundled demo model)\n"
            "  --messages FILE.json     [{\"role\": ..., \"content\": ...}, ...] or {\"messages\": [...]}\n"
            "  --add-generation-prompt  end with the assistant's turn opening\n"
            "  --tools, --documents     JSON files passed to the template as tools / documents\n"
            "  --kwargs JSON            extra template variables, a JSON object\n"
            "  --template-name NAME     one of the tokenizer's named templates (e.g. tool_use)\n");
}

int kiln_cmd_template(int argc, char **argv) {
    const char *dir = NULL, *msgs = NULL, *tools = NULL, *docs = NULL, *kwargs = NULL, *name = NULL;
    bool agp = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char **slot = !strcmp(a, "-m") || !strcmp(a, "--model") ? &dir
                          : !strcmp(a, "--messages") ? &msgs
                          : !strcmp(a, "--tools") ? &tools
                          : !strcmp(a, "--documents") ? &docs
                          : !strcmp(a, "--kwargs") ? &kwargs
                          : !strcmp(a, "--template-name") ? &name : NULL;
        if (slot) {
            if (i + 1 >= argc) {
                fprintf(stderr, "kiln template: %s needs a value\n", a);
                return 2;
            }
            *slot = argv[++i];
        } else if (!strcmp(a, "--add-generation-prompt")) {
            agp = true;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "kiln template: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!msgs) {
        fprintf(stderr, "kiln template: --messages FILE.json is required\n");
        usage(stderr);
        return 2;
    }
    if (!dir) dir = kiln_default_model();
    cJSON *jm = NULL, *jt = NULL, *jd = NULL, *jk = NULL;
    kchat_template *t = NULL;
    char *out = NULL;
    kiln_status st = ku_json_load(msgs, &jm);
    if (!st && tools) st = ku_json_load(tools, &jt);
    if (!st && docs) st = ku_json_load(docs, &jd);
    if (!st && kwargs) {
        jk = cJSON_Parse(kwargs);
        if (!jk || !cJSON_IsObject(jk)) st = kiln_error(KILN_EINVAL, "--kwargs: expected a JSON object");
    }
    if (!st) st = kchat_load_named(dir, name, &t);
    if (!st) {
        /* {"messages": [...]} is accepted as well as a bare array */
        const cJSON *m = cJSON_IsObject(jm) ? cJSON_GetObjectItemCaseSensitive(jm, "messages") : jm;
        kchat_input in = {.messages = m, .tools = jt, .documents = jd, .extra = jk, .add_generation_prompt = agp};
        st = kchat_render(t, &in, &out);
    }
    int rc = 0;
    if (st) {
        fprintf(stderr, "kiln template: %s\n", kiln_status_msg(st));
        kiln_status_free(st);
        rc = 1;
    } else {
        fputs(out, stdout);
    }
    free(out);
    kchat_free(t);
    cJSON_Delete(jm);
    cJSON_Delete(jt);
    cJSON_Delete(jd);
    cJSON_Delete(jk);
    return rc;
}
