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
    fprintf(f, "usage: kiln pull ORG/NAME[@REVISION] [--include GLOB]... [--exclude GLOB]... [--local-dir DIR]\n"
               "  downloads a Hugging Face model repository into the Hugging Face cache and prints\n"
               "  the snapshot folder; files already there (from kiln or Hugging Face tools) are reused,\n"
               "  a cut download resumes, every file is checked against the hub's sha256 / git sha1\n"
               "  REVISION             a branch, tag or commit (default main)\n"
               "  --include GLOB       fetch the files matching GLOB (repeatable; a GLOB ending in / is a\n"
               "                       folder); default: *.safetensors *.json *.jinja tokenizer.model\n"
               "                       *.tiktoken merges.txt vocab.txt, without consolidated*.safetensors\n"
               "                       original/ onnx/ openvino/ coreml/ (second copies of the weights)\n"
               "  --exclude GLOB       leave out the files matching GLOB (repeatable)\n"
               "  --local-dir DIR      also place the files themselves in DIR (hard links to the cache's\n"
               "                       copies where the file system allows, else copies) and print DIR\n"
               "  --max-workers N      files downloaded at once (1-64, default 8)\n"
               "environment: HF_TOKEN (gated and private repositories; else the file $HF_HOME/token),\n"
               "  HF_ENDPOINT (default https://huggingface.co), HF_HUB_CACHE or HF_HOME (the cache,\n"
               "  default ~/.cache/huggingface/hub)\n"
               "Every command then takes -m ORG/NAME[@REVISION] for the cached snapshot, and\n"
               "-hf ORG/NAME[@REVISION] pulls first.\n");
}

/* One bar for the whole pull (files arrive in parallel), and a line per file
 * as it lands. Calls come one at a time (khub_opts.progress). */
enum { MAX_TRACKED = 256 };
typedef struct {
    kiln_progress bar;
    const char *spec;
    bool started;
    int n, landed;
    struct {
        char name[256];
        int64_t done, total;
        bool landed;
    } f[MAX_TRACKED];
} progress_state;

static void on_progress(void *ctx, const char *file, int64_t done, int64_t total) {
    progress_state *s = ctx;
    int i = 0;
    while (i < s->n && strcmp(s->f[i].name, file)) i++;
    if (i == s->n && s->n < MAX_TRACKED) snprintf(s->f[s->n++].name, sizeof s->f[i].name, "%s", file);
    if (i < s->n) s->f[i].done = done, s->f[i].total = total;
    if (!s->started) {
        kiln_progress_start(&s->bar, s->spec);
        s->started = true;
    }
    if (done == total && (i == s->n || !s->f[i].landed)) {
        if (i < s->n) s->f[i].landed = true;
        s->landed++;
        kiln_progress_end(&s->bar); /* the line above the bar */
        fprintf(stderr, "  %-48s %10.1f MiB\n", file, (double)done / 1048576.0);
        kiln_progress_start(&s->bar, s->spec);
    }
    int64_t sum = 0, of = 0;
    for (int k = 0; k < s->n; k++) sum += s->f[k].done, of += s->f[k].total > 0 ? s->f[k].total : s->f[k].done;
    char note[96];
    snprintf(note, sizeof note, "%d files in, %.1f / %.1f MiB", s->landed, (double)sum / 1048576.0, (double)of / 1048576.0);
    kiln_progress_update(&s->bar, of > 0 ? (double)sum / (double)of : 0, note, false);
}

static kiln_status pull(const char *spec, const khub_opts *base, char *out, size_t cap) {
    progress_state *ps = calloc(1, sizeof *ps);
    if (!ps) return kiln_error(KILN_ENOMEM, "out of memory");
    ps->spec = spec;
    khub_opts o = base ? *base : (khub_opts){0};
    o.progress = on_progress, o.progress_ctx = ps;
    kiln_status st = khub_pull(spec, &o, out, cap);
    if (ps->started) kiln_progress_end(&ps->bar);
    free(ps);
    return st;
}

int kiln_cmd_pull(int argc, char **argv) {
    const char *spec = NULL;
    const char **inc = calloc((size_t)argc, sizeof *inc), **exc = calloc((size_t)argc, sizeof *exc);
    int ni = 0, ne = 0, rc = 1, workers = 0;
    const char *local_dir = NULL;
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
        } else if (!strcmp(a, "--local-dir")) {
            if (!v || !*v) {
                fprintf(stderr, "kiln pull: --local-dir needs a folder\n");
                goto done;
            }
            local_dir = v, i++;
        } else if (!strcmp(a, "--max-workers")) {
            int64_t x;
            kiln_status st = kiln_parse_int(a, v, 1, 64, &x);
            if (st) {
                kiln_fail(st);
                goto done;
            }
            workers = (int)x, i++;
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
    khub_opts o = {.include = inc, .n_include = ni, .exclude = exc, .n_exclude = ne, .workers = workers, .local_dir = local_dir};
    kiln_status st = pull(spec, &o, snap, sizeof snap);
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
        kiln_status st = hf ? pull(v, NULL, paths[used], sizeof paths[used]) : khub_resolve(v, NULL, paths[used], sizeof paths[used]);
        if (st) {
            kiln_fail(st);
            return false;
        }
        if (hf) argv[i - 1] = "-m";
        argv[i] = paths[used++];
    }
    return true;
}
