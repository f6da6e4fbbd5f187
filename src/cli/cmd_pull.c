/* cmd_pull.c: `kiln pull` (the work is in hub/hub.h). */
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "cli/cmd_pull.h"
#include "cli/progress.h"
#include "hub/hub.h"

static void usage(FILE *f) {
    fprintf(f, "usage: kiln pull ORG/NAME[@REVISION] [--include GLOB]... [--exclude GLOB]...\n"
               "  downloads a Hugging Face model repository into the Hugging Face cache and prints\n"
               "  the snapshot folder; files already there (from kiln or Hugging Face tools) are reused,\n"
               "  a cut download resumes, every file is checked against the hub's sha256 / git sha1\n"
               "  REVISION             a branch, tag or commit (default main)\n"
               "  --include GLOB       fetch the files matching GLOB (repeatable; a GLOB ending in / is a\n"
               "                       folder); default: *.safetensors *.json *.jinja tokenizer.model\n"
               "                       *.tiktoken merges.txt vocab.txt, without consolidated*.safetensors\n"
               "                       original/ onnx/ openvino/ coreml/ (second copies of the weights)\n"
               "  --exclude GLOB       leave out the files matching GLOB (repeatable)\n"
               "environment: HF_TOKEN (gated and private repositories; else the file $HF_HOME/token),\n"
               "  HF_ENDPOINT (default https://huggingface.co), HF_HUB_CACHE or HF_HOME (the cache,\n"
               "  default ~/.cache/huggingface/hub)\n"
               "Every command then takes -m ORG/NAME[@REVISION] for the cached snapshot, and\n"
               "-hf ORG/NAME[@REVISION] pulls first.\n");
}

typedef struct {
    kiln_progress bar;
    char file[256];
    bool started;
} progress_state;

static void on_progress(void *ctx, const char *file, int64_t done, int64_t total) {
    progress_state *s = ctx;
    if (!s->started || strcmp(s->file, file)) {
        if (s->started) kiln_progress_end(&s->bar);
        snprintf(s->file, sizeof s->file, "%s", file);
        kiln_progress_start(&s->bar, s->file);
        s->started = true;
    }
    char note[64];
    if (total > 0) snprintf(note, sizeof note, "%.1f / %.1f MiB", (double)done / 1048576.0, (double)total / 1048576.0);
    else snprintf(note, sizeof note, "%.1f MiB", (double)done / 1048576.0);
    kiln_progress_update(&s->bar, total > 0 ? (double)done / (double)total : 0, note, done == total);
    if (done == total) {
        kiln_progress_end(&s->bar);
        fprintf(stderr, "  %-48s %10.1f MiB\n", file, (double)done / 1048576.0);
        s->started = false;
    }
}

static kiln_status pull(const char *spec, const char *const *inc, int ni, const char *const *exc, int ne, char *out, size_t cap) {
    progress_state ps = {0};
    khub_opts o = {.include = inc, .n_include = ni, .exclude = exc, .n_exclude = ne, .progress = on_progress, .progress_ctx = &ps};
    kiln_status st = khub_pull(spec, &o, out, cap);
    if (ps.started) kiln_progress_end(&ps.bar);
    return st;
}

int kiln_cmd_pull(int argc, char **argv) {
    const char *spec = NULL;
    const char **inc = calloc((size_t)argc, sizeof *inc), **exc = calloc((size_t)argc, sizeof *exc);
    int ni = 0, ne = 0, rc = 1;
    if (!inc || !exc) goto done;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            rc = 0;
            goto done;
        }
        if (!strcmp(a, "--include") || !strcmp(a, "--exclude")) {
            if (!v) {
                fprintf(stderr, "kiln pull: %s needs a value\n", a);
                goto done;
            }
            if (a[2] == 'i') inc[ni++] = v;
            else exc[ne++] = v;
            i++;
        } else if (a[0] == '-') {
            fprintf(stderr, "kiln pull: unknown option %s\n\n", a);
            usage(stderr);
            goto done;
        } else if (spec) {
            fprintf(stderr, "kiln pull: one repository at a time (\"%s\" and \"%s\")\n", spec, a);
            goto done;
        } else {
            spec = a;
        }
    }
    if (!spec) {
        fprintf(stderr, "kiln pull: which repository? (e.g. kiln pull Qwen/Qwen3-0.6B)\n\n");
        usage(stderr);
        goto done;
    }
    char snap[PATH_MAX];
    kiln_status st = pull(spec, inc, ni, exc, ne, snap, sizeof snap);
    if (st) {
        kiln_fail(st);
        goto done;
    }
    printf("%s\n", snap);
    rc = 0;
done:
    free(inc);
    free(exc);
    return rc;
}

bool kiln_resolve_model_args(int argc, char **argv) {
    static char paths[8][PATH_MAX];
    int used = 0;
    for (int i = 1; i + 1 < argc; i++) {
        const char *a = argv[i], *v = argv[i + 1];
        bool hf = !strcmp(a, "-hf") || !strcmp(a, "--hf-repo");
        if (!hf && strcmp(a, "-m") && strcmp(a, "--model")) continue;
        i++;
        struct stat sb;
        if (!hf && (stat(v, &sb) == 0 || !khub_is_repo_id(v))) continue; /* a path: the command judges it */
        if (used == (int)(sizeof paths / sizeof paths[0])) {
            fprintf(stderr, "kiln: too many models named\n");
            return false;
        }
        kiln_status st = hf ? pull(v, NULL, 0, NULL, 0, paths[used], sizeof paths[used]) : khub_resolve(v, NULL, paths[used], sizeof paths[used]);
        if (st) {
            kiln_fail(st);
            return false;
        }
        if (hf) argv[i - 1] = "-m";
        argv[i] = paths[used++];
    }
    return true;
}
