/* cmd_embed.c: embeddings and reranking scores from the command line.
 *
 *   kiln embed -m DIR (-p TEXT | -f FILE | --ids 1,2,3)... [--pooling cls|mean|max|last]
 *              [--normalize | --no-normalize] [--prompt NAME] [-t N]
 *     one JSON array per input, in order
 *   kiln rerank -m DIR -q QUERY [--instruction TEXT] [--sigmoid] [-t N] DOC...
 *     "index<TAB>score<TAB>document" per document, best first */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "cli/cli.h"
#include "embed/embed.h"
#include "tokenizer/tokenizer.h"

#define MAX_INPUTS 4096

typedef struct {
    int n;
    int32_t *ids[MAX_INPUTS];
    int64_t lens[MAX_INPUTS];
} input_list;

static void inputs_free(input_list *l) {
    for (int i = 0; i < l->n; i++) free(l->ids[i]);
}

static int fail(kiln_status st) {
    fprintf(stderr, "kiln: %s\n", kiln_status_msg(st));
    kiln_status_free(st);
    return 1;
}

static kiln_status parse_ids(const char *s, int32_t **ids, int64_t *n) {
    int64_t cap = 1;
    for (const char *p = s; *p; p++) cap += *p == ',';
    *ids = malloc(sizeof(int32_t) * (size_t)cap);
    if (!*ids) return kiln_error(KILN_ENOMEM, "out of memory");
    *n = 0;
    for (const char *p = s; *p;) {
        char *e;
        long v = strtol(p, &e, 10);
        if (e == p || v < 0 || v > INT32_MAX || (*e && *e != ',')) {
            free(*ids);
            return kiln_error(KILN_EINVAL, "--ids \"%s\": want comma-separated token ids", s);
        }
        (*ids)[(*n)++] = (int32_t)v;
        p = *e ? e + 1 : e;
    }
    return *n ? NULL : kiln_error(KILN_EINVAL, "--ids: no ids");
}

static kiln_status ctx_for(const kemb_model *m, const input_list *in, int threads, ke_ctx **c) {
    int64_t longest = 1;
    for (int i = 0; i < in->n; i++) longest = in->lens[i] > longest ? in->lens[i] : longest;
    const km_hparams *hp = ke_model_hparams(kemb_engine_model(m));
    int64_t n_ctx = hp->max_pos > 0 && hp->max_pos < 8192 ? hp->max_pos : 8192;
    if (longest > n_ctx)
        return kiln_error(KILN_ELIMIT, "an input has %lld tokens, more than the model's %lld", (long long)longest, (long long)n_ctx);
    return ke_ctx_create(kemb_engine_model(m), &(ke_ctx_params){.n_ctx = n_ctx, .n_cache = n_ctx * 4, .n_threads = threads, .pooling = true}, c);
}

/* Adds every line of path (empty lines skipped) through the tokenizer. */
static kiln_status add_file(input_list *in, const ktok *tok, const char *prompt, const char *path) {
    char *text;
    size_t len;
    KILN_TRY(ku_read_file(path, &text, &len));
    kiln_status st = NULL;
    for (char *line = text, *next; !st && line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        if (!*line) continue;
        if (in->n == MAX_INPUTS) st = kiln_error(KILN_ELIMIT, "%s: more than %d inputs", path, MAX_INPUTS);
        else if (!(st = kemb_encode(tok, prompt, line, &in->ids[in->n], &in->lens[in->n]))) in->n++;
    }
    free(text);
    return st;
}

#define EMBED_USAGE                                                                                                  \
    "usage: kiln embed -m DIR (-p TEXT | -f FILE | --ids 1,2,3)... [--pooling cls|mean|max|last]\n"                    \
    "                  [--normalize | --no-normalize] [--prompt NAME] [-t N]\n"                                       \
    "  one JSON array per input (-f: one input per line); --prompt prefixes a prompt of\n"                            \
    "  config_sentence_transformers.json (e.g. query, document)\n"
#define RERANK_USAGE                                                                                                 \
    "usage: kiln rerank -m DIR -q QUERY [--instruction TEXT] [--sigmoid] [-t N] DOC...\n"                              \
    "  index, score and document per line, best first: sentence-transformers' score (the logit of a\n"                \
    "  cross-encoder with an Identity activation, else its sigmoid; --sigmoid always), P(yes) of a\n"                 \
    "  decoder reranker\n"

int kiln_cmd_embed(int argc, char **argv) {
    const char *dir = NULL, *prompt_name = NULL;
    kemb_opts o = {KEMB_POOL_DEFAULT, -1};
    int threads = 0;
    /* texts are tokenized once the model is loaded: remember the arguments */
    const char *kinds[MAX_INPUTS], *args[MAX_INPUTS];
    int n_args = 0;
    static const char *const valued[] = {"-m", "--model", "-p", "-f", "--ids", "--pooling", "--prompt", "-t", "--threads", NULL};
    static const char *const flags[] = {"--normalize", "--no-normalize", NULL};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(EMBED_USAGE, stdout);
            return 0;
        }
        kiln_status st = kiln_option("embed", a, v, valued, flags);
        int64_t x = 0;
        if (!st && kiln_flag_in(a, valued)) i++;
        if (st) {
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) dir = v;
        else if (!strcmp(a, "-p") || !strcmp(a, "-f") || !strcmp(a, "--ids")) {
            if (n_args == MAX_INPUTS) st = kiln_error(KILN_EINVAL, "at most %d inputs (-p, -f, --ids)", MAX_INPUTS);
            else kinds[n_args] = a, args[n_args++] = v;
        } else if (!strcmp(a, "--pooling")) st = kemb_pooling_parse(v, &o.pooling);
        else if (!strcmp(a, "--normalize")) o.normalize = 1;
        else if (!strcmp(a, "--no-normalize")) o.normalize = 0;
        else if (!strcmp(a, "--prompt")) prompt_name = v;
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) st = kiln_parse_int(a, v, 0, 1024, &x), threads = (int)x;
        if (st) return fail(st);
    }
    if (!dir || !n_args) {
        fprintf(stderr, "kiln embed: -m DIR and at least one -p, -f or --ids are required\n");
        return 2;
    }
    kemb_model *m;
    kiln_status st = kemb_load(dir, &m);
    if (st) return fail(st);
    const char *prompt = prompt_name ? kemb_prompt(m, prompt_name) : NULL;
    if (prompt_name && !prompt) st = kiln_error(KILN_EINVAL, "%s: config_sentence_transformers.json has no prompt \"%s\"", dir, prompt_name);
    ktok *tok = NULL;
    input_list in = {0};
    for (int i = 0; !st && i < n_args; i++) {
        if (strcmp(kinds[i], "--ids") && !tok) st = ktok_load(dir, &tok);
        if (st) break;
        if (!strcmp(kinds[i], "-f")) st = add_file(&in, tok, prompt, args[i]);
        else if (!strcmp(kinds[i], "-p")) st = kemb_encode(tok, prompt, args[i], &in.ids[in.n], &in.lens[in.n]), in.n += !st;
        else st = parse_ids(args[i], &in.ids[in.n], &in.lens[in.n]), in.n += !st;
    }
    ke_ctx *c = NULL;
    float *out = NULL;
    if (!st) st = ctx_for(m, &in, threads, &c);
    int64_t dim = kemb_dim(m);
    if (!st && !(out = malloc(sizeof(float) * (size_t)(in.n * dim)))) st = kiln_error(KILN_ENOMEM, "out of memory");
    if (!st) st = kemb_embed(m, c, in.n, (const int32_t *const *)in.ids, in.lens, &o, out);
    for (int i = 0; !st && i < in.n; i++) {
        putchar('[');
        for (int64_t j = 0; j < dim; j++) printf("%s%.8g", j ? ", " : "", out[i * dim + j]);
        puts("]");
    }
    free(out);
    ke_ctx_free(c);
    inputs_free(&in);
    ktok_free(tok);
    kemb_free(m);
    return st ? fail(st) : 0;
}

int kiln_cmd_rerank(int argc, char **argv) {
    const char *dir = NULL, *query = NULL, *instruction = NULL, *docs[MAX_INPUTS];
    bool sigmoid = false;
    int threads = 0, n_docs = 0;
    static const char *const valued[] = {"-m", "--model", "-q", "--query", "--instruction", "-t", "--threads", NULL};
    static const char *const flags[] = {"--sigmoid", NULL};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(RERANK_USAGE, stdout);
            return 0;
        }
        kiln_status st = NULL;
        int64_t x = 0;
        if (a[0] != '-' || !a[1]) {
            if (n_docs == MAX_INPUTS) st = kiln_error(KILN_EINVAL, "at most %d documents", MAX_INPUTS);
            else docs[n_docs++] = a;
        } else if ((st = kiln_option("rerank", a, v, valued, flags))) {
        } else if (!strcmp(a, "--sigmoid")) sigmoid = true;
        else {
            i++;
            if (!strcmp(a, "-m") || !strcmp(a, "--model")) dir = v;
            else if (!strcmp(a, "-q") || !strcmp(a, "--query")) query = v;
            else if (!strcmp(a, "--instruction")) instruction = v;
            else st = kiln_parse_int(a, v, 0, 1024, &x), threads = (int)x;
        }
        if (st) return fail(st);
    }
    if (!dir || !query || !n_docs) {
        fprintf(stderr, "kiln rerank: -m DIR, -q QUERY and at least one document are required\n");
        return 2;
    }
    kemb_model *m;
    kiln_status st = kemb_load(dir, &m);
    if (st) return fail(st);
    ktok *tok = NULL;
    st = ktok_load(dir, &tok);
    input_list in = {0};
    int32_t *types[MAX_INPUTS] = {0};
    for (int i = 0; !st && i < n_docs; i++) {
        st = kemb_encode_pair(m, tok, instruction, query, docs[i], &in.ids[i], &types[i], &in.lens[i]);
        in.n += !st;
    }
    int32_t yes = -1, no = -1;
    if (!st && !kemb_is_cross_encoder(m)) st = kemb_yes_no(tok, &yes, &no);
    ke_ctx *c = NULL;
    float *scores = NULL;
    int *r = NULL;
    if (!st) st = ctx_for(m, &in, threads, &c);
    if (!st && (!(scores = malloc(sizeof(float) * (size_t)n_docs)) || !(r = malloc(sizeof(int) * (size_t)n_docs))))
        st = kiln_error(KILN_ENOMEM, "out of memory");
    if (!st) st = kemb_score(m, c, n_docs, (const int32_t *const *)in.ids, in.lens, (const int32_t *const *)types, yes, no, scores);
    for (int i = 0; !st && i < n_docs; i++) scores[i] = sigmoid ? kemb_sigmoid(scores[i]) : kemb_relevance(m, scores[i]);
    if (!st) st = kemb_rank(scores, n_docs, r);
    for (int i = 0; !st && i < n_docs; i++) printf("%d\t%.7g\t%s\n", r[i], scores[r[i]], docs[r[i]]);
    for (int i = 0; i < n_docs; i++) free(types[i]);
    free(scores), free(r);
    ke_ctx_free(c);
    inputs_free(&in);
    ktok_free(tok);
    kemb_free(m);
    return st ? fail(st) : 0;
}
