/* chat_test.c: chat templates against @huggingface/jinja's renders
 * (tests/data/chat, made by tools/jinja_oracle.mjs) and the folder loader. */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/json.h"
#include "chat/chat.h"
#include "kt.h"

#define FIXED_NOW 1752582896 /* the oracle's frozen clock, 2025-07-15 12:34:56 UTC */

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Sorted names in dir ending in ext (malloc'ed array of malloc'ed names). */
static int list_dir(const char *dir, const char *ext, char ***out) {
    DIR *d = opendir(dir);
    int n = 0, cap = 0;
    char **v = NULL;
    if (!d) return -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name), el = strlen(ext);
        if (l <= el || strcmp(e->d_name + l - el, ext) != 0) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            v = realloc(v, (size_t)cap * sizeof *v);
        }
        v[n++] = strndup(e->d_name, l - el);
    }
    closedir(d);
    qsort(v, (size_t)n, sizeof *v, cmp_str);
    *out = v;
    return n;
}

static void show_diff(const char *want, const char *got) {
    size_t i = 0;
    while (want[i] && want[i] == got[i]) i++;
    size_t from = i > 40 ? i - 40 : 0;
    fprintf(stderr, "    first difference at byte %zu\n    want: %.80s\n    got:  %.80s\n", i, want + from, got + from);
}

KT_TEST(chat_oracle_renders) {
    char tdir[4096], idir[4096], edir[4096];
    kt_path(tdir, sizeof tdir, "tests/data/chat/templates");
    kt_path(idir, sizeof idir, "tests/data/chat/inputs");
    kt_path(edir, sizeof edir, "tests/data/chat/expected");
    char **tn = NULL, **in = NULL;
    int nt = list_dir(tdir, ".jinja", &tn), ni = list_dir(idir, ".json", &in);
    KT_CHECKF(nt > 0 && ni > 0, "no templates or inputs under tests/data/chat");
    cJSON **inputs = calloc((size_t)ni, sizeof *inputs);
    for (int i = 0; i < ni; i++) {
        char p[4200];
        snprintf(p, sizeof p, "%s/%s.json", idir, in[i]);
        KT_CHECK_OK(ku_json_load(p, &inputs[i]));
    }
    kjin_limits lim = kjin_limits_default();
    lim.now = FIXED_NOW;
    int pairs = 0, match = 0, raised = 0, shown = 0, tmpl_ok = 0;
    for (int t = 0; t < nt; t++) {
        char p[4200];
        snprintf(p, sizeof p, "%s/%s.jinja", tdir, tn[t]);
        char *src = NULL;
        KT_CHECK_OK(ku_read_file(p, &src, NULL));
        snprintf(p, sizeof p, "%s/%s.json", edir, tn[t]);
        cJSON *exp = NULL;
        KT_CHECK_OK(ku_json_load(p, &exp));
        kchat_template *ct = NULL;
        kiln_status pst = kchat_parse(src, &ct);
        int tmatch = 0;
        for (int i = 0; i < ni; i++) {
            const cJSON *e = cJSON_GetObjectItemCaseSensitive(exp, in[i]);
            if (!e) continue;
            pairs++;
            const cJSON *want = cJSON_GetObjectItemCaseSensitive(e, "out");
            char *got = NULL;
            kiln_status st = pst;
            if (!pst) {
                const cJSON *inp = inputs[i];
                kchat_input ki = {
                    .messages = cJSON_GetObjectItemCaseSensitive(inp, "messages"),
                    .tools = cJSON_GetObjectItemCaseSensitive(inp, "tools"),
                    .documents = cJSON_GetObjectItemCaseSensitive(inp, "documents"),
                    .extra = cJSON_GetObjectItemCaseSensitive(inp, "kwargs"),
                    .add_generation_prompt = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(inp, "add_generation_prompt")),
                    .bos_token = "<s>",
                    .eos_token = "</s>",
                    .limits = &lim,
                };
                st = kchat_render(ct, &ki, &got);
            }
            bool ok;
            if (want) ok = !st && strcmp(got, want->valuestring) == 0;
            else ok = st != NULL;
            if (!want) raised++;
            if (ok) {
                match++;
                tmatch++;
            } else if (shown++ < 12) {
                fprintf(stderr, "  mismatch: %s x %s: ", tn[t], in[i]);
                if (!want) fprintf(stderr, "expected an error (%s), got success\n",
                                   cJSON_GetObjectItemCaseSensitive(e, "error")->valuestring);
                else if (st) fprintf(stderr, "error %s\n", kiln_status_msg(st));
                else {
                    fputc('\n', stderr);
                    show_diff(want->valuestring, got);
                }
            }
            if (st != pst) kiln_status_free(st);
            free(got);
        }
        tmpl_ok += tmatch == cJSON_GetArraySize(exp);
        kiln_status_free(pst);
        kchat_free(ct);
        cJSON_Delete(exp);
        free(src);
    }
    fprintf(stderr, "  chat templates: %d/%d (template, input) pairs match @huggingface/jinja (%d of them errors); "
                    "%d/%d templates fully\n", match, pairs, raised, tmpl_ok, nt);
    for (int i = 0; i < ni; i++) cJSON_Delete(inputs[i]), free(in[i]);
    for (int t = 0; t < nt; t++) free(tn[t]);
    free(inputs);
    free(in);
    free(tn);
    KT_CHECK_EQ(match, pairs);
}
