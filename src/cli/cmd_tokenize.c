/* cmd_tokenize.c: text <-> ids from the command line.
 *
 *   kiln tokenize -m DIR [--add-special] [--json] [-p TEXT | < stdin]
 *   kiln detokenize -m DIR [--skip-special] IDS...   (ids as args and/or comma-separated) */
#include "cli/cmd_tokenize.h"

#include <errno.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "tokenizer/tokenizer.h"

static int fail(kiln_status st) {
    fprintf(stderr, "kiln: %s\n", kiln_status_msg(st));
    kiln_status_free(st);
    return 1;
}

static char *read_stdin(size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t r = fread(buf + n, 1, cap - n, stdin);
        n += r;
        if (n < cap) break;
        char *nb = realloc(buf, cap * 2);
        if (!nb) {
            free(buf);
            return NULL;
        }
        buf = nb;
        cap *= 2;
    }
    *len = n;
    return buf;
}

static const char tokenize_usage[] =
    "usage: kiln tokenize [-m DIR] [--add-special] [--json] [-p TEXT | < stdin]\n"
    "  -m, --model DIR   the model's folder (tokenizer.json; default: the bundled demo model)\n"
    "  -p, --prompt TEXT the text (default: all of standard input)\n"
    "  --add-special     add the model's BOS/EOS as its tokenizer does for a prompt\n"
    "  --json            print {\"ids\": [...]}\n"
    "  --bench           print the load and encode times on stderr instead of the ids\n";

int kiln_cmd_tokenize(int argc, char **argv) {
    const char *dir = NULL, *text = NULL;
    bool add_special = false, json = false, bench = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool model = !strcmp(a, "-m") || !strcmp(a, "--model"), prompt = !strcmp(a, "-p") || !strcmp(a, "--prompt");
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(tokenize_usage, stdout);
            return 0;
        } else if (model || prompt) {
            if (i + 1 >= argc) {
                fprintf(stderr, "kiln tokenize: %s needs a value\n", a);
                return 2;
            }
            *(model ? &dir : &text) = argv[++i];
        } else if (!strcmp(a, "--add-special")) add_special = true;
        else if (!strcmp(a, "--json")) json = true;
        else if (!strcmp(a, "--bench")) bench = true;
        else if (a[0] != '-') {
            fprintf(stderr, "kiln tokenize: unexpected argument \"%s\": give the text with -p TEXT or on standard input\n", a);
            return 2;
        } else {
            fprintf(stderr, "kiln tokenize: unknown option %s\n%s", a, tokenize_usage);
            return 2;
        }
    }
    if (!dir) dir = kiln_default_model();
    ktok *t;
    double t0 = kiln_now_s();
    kiln_status st = ktok_load(dir, &t);
    double t_load = kiln_now_s() - t0;
    if (st) return fail(st);
    size_t len;
    char *owned = NULL;
    if (text) {
        len = strlen(text);
    } else {
        owned = read_stdin(&len);
        if (!owned) {
            ktok_free(t);
            fprintf(stderr, "kiln tokenize: cannot read stdin\n");
            return 1;
        }
        text = owned;
    }
    int32_t *ids;
    size_t n;
    t0 = kiln_now_s();
    st = ktok_encode(t, text, len, add_special, &ids, &n);
    double t_enc = kiln_now_s() - t0;
    if (!st && bench) {
        fprintf(stderr, "load %.1f ms, encode %zu bytes -> %zu ids in %.1f ms: %.2f MB/s\n", 1e3 * t_load, len, n,
                1e3 * t_enc, (double)len / 1e6 / t_enc);
        free(owned);
        free(ids);
        ktok_free(t);
        return 0;
    }
    free(owned);
    ktok_free(t);
    if (st) return fail(st);
    fputs(json ? "{\"ids\": [" : "", stdout);
    for (size_t i = 0; i < n; i++) printf(i ? (json ? ", %d" : " %d") : "%d", ids[i]);
    fputs(json ? "]}\n" : "\n", stdout);
    free(ids);
    return 0;
}

static const char detokenize_usage[] =
    "usage: kiln detokenize [-m DIR] [--skip-special] IDS...\n"
    "  IDS               token ids, as arguments and/or comma-separated (1,17,93 or 1 17 93)\n"
    "  -m, --model DIR   the model's folder (tokenizer.json; default: the bundled demo model)\n"
    "  --skip-special    leave special tokens out of the text\n";

int kiln_cmd_detokenize(int argc, char **argv) {
    const char *dir = NULL;
    bool skip = false;
    int32_t *ids = NULL;
    size_t n = 0;
    kiln_status st = NULL;
    for (int i = 1; i < argc && !st; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            free(ids);
            fputs(detokenize_usage, stdout);
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (i + 1 >= argc) st = kiln_error(KILN_EINVAL, "%s needs a value", a);
            else dir = argv[++i];
        } else if (!strcmp(a, "--skip-special")) {
            skip = true;
        } else if (a[0] == '-' && a[1] && !(a[1] >= '0' && a[1] <= '9')) {
            st = kiln_error(KILN_EINVAL, "unknown option %s (see kiln detokenize --help)", a);
        } else {
            int32_t *more;
            int m;
            st = kiln_parse_ids(a, &more, &m);
            int32_t *nv = st ? NULL : realloc(ids, (n + (size_t)m + 1) * sizeof *ids);
            if (!st && !nv) st = kiln_error(KILN_ENOMEM, "out of memory");
            if (!st) {
                ids = nv;
                memcpy(ids + n, more, (size_t)m * sizeof *ids);
                n += (size_t)m;
            }
            free(more);
        }
    }
    if (!st && n == 0) st = kiln_error(KILN_EINVAL, "give the token ids to decode (see kiln detokenize --help)");
    if (st) {
        free(ids);
        fprintf(stderr, "kiln detokenize: %s\n", kiln_status_msg(st));
        kiln_status_free(st);
        return 2;
    }
    if (!dir) dir = kiln_default_model();
    ktok *t;
    st = ktok_load(dir, &t);
    if (st) {
        free(ids);
        return fail(st);
    }
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= ktok_vocab_size(t) || !ktok_token_str(t, ids[i])) {
            fprintf(stderr, "kiln detokenize: token id %d is not in the vocabulary of %s (its ids are 0..%d)\n", ids[i], dir,
                    ktok_vocab_size(t) - 1);
            free(ids);
            ktok_free(t);
            return 1;
        }
    char *text;
    size_t len;
    st = ktok_decode(t, ids, n, skip, &text, &len);
    free(ids);
    ktok_free(t);
    if (st) return fail(st);
    fwrite(text, 1, len, stdout);
    fputc('\n', stdout);
    free(text);
    return 0;
}
