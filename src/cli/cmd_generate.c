/* cmd_generate.c: `kiln generate`, one sequence through the engine with
 * the generation library's sampler, limits and stop strings. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "grammar/grammar.h"
#include "base/file.h"
#include "base/npy.h"
#include "chat/chat.h"
#include "cli/cli.h"
#include "mlir/kmlir.h"
#include "engine/engine.h"
#include "vision/vision.h"
#include "engine/textio.h"
#include "gen/params.h"
#include "gen/session.h"
#include "spec/spec.h"

static void usage(FILE *f) {
    fprintf(f, "usage: kiln generate [-m DIR] (-p TEXT | -f FILE | --prompt-ids IDS) [options]\n"
               "  -m, --model DIR       checkpoint folder (default: the bundled demo model)\n"
               "  -p, --prompt TEXT     prompt text (tokenized with the model's tokenizer)\n"
               "  -f, --file FILE       read the prompt text from FILE\n"
               "  --chat                apply the model's chat template to the prompt as a user message\n"
               "  --system TEXT         with --chat: a system message first\n"
               "  --prompt-ids IDS      prompt token ids instead of text, e.g. 1,17,93\n"
               "  --image FILE         vision-language models: a PNG, JPEG, WebP or GIF image (repeatable, up to 16): each at\n"
               "                       the prompt's next image token (one image without one: first); with --chat the\n"
               "                       user message holds the images, then the text, and the template places them\n"
               "  --video F1,F2,...    Qwen2-VL / Qwen2.5-VL: a video as its frames (PNG, JPEG, WebP or GIF files of one size,\n"
               "                       comma-separated, in order; repeatable): each at the prompt's next <|video_pad|>\n"
               "                       (with --chat: after the images, as {\"type\": \"video\"} parts)\n"
               "  --no-display-prompt   do not echo the prompt\n"
               "  --force-ids IDS       teacher forcing: feed these ids instead of sampling\n"
               "  --logits-out FILE     write float32 .npy [rows, vocab]: row 0 at the last prompt\n"
               "                        position, row i after the i-th generated or forced token\n"
               "  -c, --ctx-size N      context size (default: the model's, at most 4096)\n"
               "  -t, --threads N       threads (default: all CPUs)\n"
               KILN_CACHE_TYPE_HELP
               "  --backend mlir        run each step compiled by MLIR 16 (its ExecutionEngine, or mlir-opt +\n"
               "                        mlir-cpu-runner): slow, a check\n"
               "  --dialect tosa        with --backend mlir: emit TOSA where it has the op (default linalg)\n"
               "  --json                print one JSON object with the ids, finish reason and timings\n"
               "                        (with --n-probs N: each generated token's log-probability and its top N)\n"
               "sampling (as llama.cpp):\n");
    kgen_print_flags(f);
    kspec_print_flags(f);
}

/* Without a tokenizer, tokens have no text. */
static const char *no_text(void *ud, int32_t id, size_t *len) {
    (void)ud, (void)id;
    *len = 0;
    return NULL;
}

enum { KILN_MAX_IMAGES = 16 }; /* --image flags (with --video's videos), as the server's per-request bound */
enum { KILN_MAX_FRAMES = 256 }; /* frames of one --video */

typedef struct {
    const char *dir, *logits_out, *text, *file, *system;
    const char *images[KILN_MAX_IMAGES]; /* --image, in order */
    int n_images;
    const char *videos[KILN_MAX_IMAGES]; /* --video: comma-separated frame files */
    int n_videos;
    int32_t *prompt, *forced;
    int n_prompt, n_forced;
    int64_t n_ctx, threads;
    int cache_k, cache_v; /* kg_dtype of the KV cache (--cache-type-k/-v) */
    bool json, chat, no_display, mlir, mlir_tosa;
    kgen_params gp;
    char *echo;     /* the prompt text, printed once every check on it has passed */
    size_t echo_len;
    kspec_params sp;
    kspec_stats spec; /* with speculation: what it guessed and kept */
    char *out_text; /* everything generated, for --json */
    size_t out_len, out_cap;
} opts;

static kiln_status parse(opts *o, int argc, char **argv, bool *help) {
    KILN_TRY(kgen_params_init(&o->gp));
    kspec_params_init(&o->sp);
    for (int i = 1; i < argc;) {
        bool used;
        KILN_TRY(kgen_parse_flag(&o->gp, argc, argv, &i, &used));
        if (used) continue;
        KILN_TRY(kspec_parse_flag(&o->sp, argc, argv, &i, &used));
        if (used) continue;
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            *help = true;
            return NULL;
        }
        static const char *const flags[] = {"--json", "--chat", "--no-display-prompt", NULL};
        static const char *const valued[] = {"-m", "--model", "--prompt-ids", "--force-ids", "-c", "--ctx-size", "-t",
                                             "--threads", "--logits-out", "-p", "--prompt", "-f", "--file", "--system",
                                             "--image", "--video", "--backend", "--dialect", KILN_CACHE_TYPE_OPTS, NULL};
        KILN_TRY(kiln_option("generate", a, v, valued, flags));
        bool takes = kiln_flag_in(a, valued);
        kiln_status cst = NULL;
        if (kiln_cache_type_opt(a, v, &o->cache_k, &o->cache_v, &cst)) {
            KILN_TRY(cst);
            i += 2;
            continue;
        }
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) o->dir = v;
        else if (!strcmp(a, "--prompt-ids")) KILN_TRYF(kiln_parse_ids(v, &o->prompt, &o->n_prompt), "--prompt-ids");
        else if (!strcmp(a, "--force-ids")) KILN_TRYF(kiln_parse_ids(v, &o->forced, &o->n_forced), "--force-ids");
        else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) KILN_TRY(kiln_parse_int(a, v, 0, 1 << 30, &o->n_ctx));
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) KILN_TRY(kiln_parse_int(a, v, 0, 1024, &o->threads));
        else if (!strcmp(a, "--logits-out")) o->logits_out = v;
        else if (!strcmp(a, "--json")) o->json = true;
        else if (!strcmp(a, "--chat")) o->chat = true;
        else if (!strcmp(a, "--no-display-prompt")) o->no_display = true;
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) o->text = v;
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) o->file = v;
        else if (!strcmp(a, "--system")) o->system = v;
        else if (!strcmp(a, "--image")) {
            if (o->n_images + o->n_videos == KILN_MAX_IMAGES) return kiln_error(KILN_ELIMIT, "--image: at most %d images", KILN_MAX_IMAGES);
            o->images[o->n_images++] = v;
        } else if (!strcmp(a, "--video")) {
            if (o->n_images + o->n_videos == KILN_MAX_IMAGES)
                return kiln_error(KILN_ELIMIT, "--video: at most %d images and videos", KILN_MAX_IMAGES);
            o->videos[o->n_videos++] = v;
        } else if (!strcmp(a, "--backend")) {
            if (!strcmp(v, "mlir")) {
                KILN_TRY(kmlir_tools());
                o->mlir = true;
            } else if (strcmp(v, "native")) return kiln_error(KILN_EINVAL, "--backend %s: expected native or mlir", v);
        } else if (!strcmp(a, "--dialect")) {
            if (!strcmp(v, "tosa")) o->mlir_tosa = true;
            else if (strcmp(v, "linalg")) return kiln_error(KILN_EINVAL, "--dialect %s: expected linalg or tosa", v);
        }
        i += takes ? 2 : 1;
    }
    if (o->mlir_tosa && !o->mlir) return kiln_error(KILN_EINVAL, "--dialect tosa applies to --backend mlir");
    if (!!o->prompt + !!o->text + !!o->file > 1) return kiln_error(KILN_EINVAL, "give one of -p, -f and --prompt-ids");
    if (o->prompt && o->n_prompt == 0) return kiln_error(KILN_EINVAL, "--prompt-ids: the prompt is empty");
    if (o->chat && o->prompt) return kiln_error(KILN_EINVAL, "--chat needs a text prompt (-p or -f)");
    if (o->system && !o->chat) return kiln_error(KILN_EINVAL, "--system needs --chat");
    if (o->gp.n_probs > 0 && !o->json) return kiln_error(KILN_EINVAL, "--n-probs reports in the --json output: add --json");
    if (o->gp.n_probs > 0 && o->n_forced) return kiln_error(KILN_EINVAL, "--n-probs does not apply to --force-ids (nothing is sampled)");
    if (kspec_enabled(&o->sp) && (o->forced || o->logits_out))
        return kiln_error(KILN_EINVAL, "speculative decoding (--spec-ngram, --model-draft) does not combine with --force-ids or --logits-out");
    return kgen_params_validate(&o->gp);
}

static kiln_status keep_text(opts *o, const char *t, size_t n) {
    if (o->out_len + n + 1 > o->out_cap) {
        size_t nc = (o->out_len + n + 1) * 2;
        char *p = realloc(o->out_text, nc);
        if (!p) return kiln_error(KILN_ENOMEM, "out of memory");
        o->out_text = p;
        o->out_cap = nc;
    }
    memcpy(o->out_text + o->out_len, t, n);
    o->out_len += n;
    o->out_text[o->out_len] = 0;
    return NULL;
}

/* The prompt as ids: given, or the text (from -p/-f, through the chat
 * template with --chat) tokenized. Echoes the text unless asked not to. */
static kiln_status prompt_ids(opts *o, const ktok *tok) {
    if (o->prompt) return NULL;
    char *text = NULL;
    size_t len = 0;
    if (o->file) KILN_TRY(ku_read_file(o->file, &text, &len));
    else if (o->text) {
        text = strdup(o->text);
        len = strlen(o->text);
    } else {
        return kiln_error(KILN_EINVAL, "give a prompt: -p TEXT, -f FILE or --prompt-ids IDS (see kiln generate --help)");
    }
    if (!text) return kiln_error(KILN_ENOMEM, "out of memory");
    if (!tok) {
        free(text);
        return kiln_error(KILN_ENOTFOUND, "%s has no tokenizer.json: give the prompt as --prompt-ids", o->dir);
    }
    bool add_special = true;
    kiln_status st = NULL;
    if (o->chat) {
        kchat_template *t;
        st = kchat_load(o->dir, &t);
        if (st) {
            free(text);
            return kiln_status_wrap(st, "--chat");
        }
        cJSON *msgs = cJSON_CreateArray();
        if (o->system) {
            cJSON *m = cJSON_CreateObject();
            cJSON_AddStringToObject(m, "role", "system");
            cJSON_AddStringToObject(m, "content", o->system);
            cJSON_AddItemToArray(msgs, m);
        }
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "user");
        if (o->n_images + o->n_videos) { /* content parts, images (then videos) first, as transformers' examples pass them */
            cJSON *parts = cJSON_AddArrayToObject(m, "content");
            for (int i = 0; i < o->n_images + o->n_videos; i++) {
                cJSON *ip = cJSON_CreateObject();
                cJSON_AddStringToObject(ip, "type", i < o->n_images ? "image" : "video");
                cJSON_AddItemToArray(parts, ip);
            }
            cJSON *tp = cJSON_CreateObject();
            cJSON_AddStringToObject(tp, "type", "text");
            cJSON_AddStringToObject(tp, "text", text);
            cJSON_AddItemToArray(parts, tp);
        } else {
            cJSON_AddStringToObject(m, "content", text);
        }
        cJSON_AddItemToArray(msgs, m);
        free(text);
        text = NULL;
        kchat_input in = {.messages = msgs, .add_generation_prompt = true};
        st = kchat_render(t, &in, &text);
        cJSON_Delete(msgs);
        kchat_free(t);
        if (st) return st;
        len = strlen(text);
        add_special = false; /* the template writes its own special tokens */
    }
    size_t n;
    st = ktok_encode(tok, text, len, add_special, &o->prompt, &n);
    if (!st && n == 0) st = kiln_error(KILN_EINVAL, "the prompt is empty after tokenization");
    o->n_prompt = (int)n;
    if (!st && !o->json && !o->no_display && !o->chat) {
        o->echo = text, o->echo_len = len;
        return NULL;
    }
    free(text);
    return st;
}

typedef struct {
    int32_t *ids;
    int64_t n, cap;
    float *rows;
    int64_t n_rows, vocab;
    cJSON *probs; /* --n-probs: per generated token {id, logprob, top: [{id, logprob}]} */
} record;

static kiln_status keep_probs(record *r, const kgen_sample *s) {
    if (!r->probs && !(r->probs = cJSON_CreateArray())) return kiln_error(KILN_ENOMEM, "out of memory");
    cJSON *e = cJSON_CreateObject(), *top = cJSON_CreateArray();
    if (!e || !top) {
        cJSON_Delete(e), cJSON_Delete(top);
        return kiln_error(KILN_ENOMEM, "out of memory");
    }
    cJSON_AddItemToArray(r->probs, e);
    cJSON_AddNumberToObject(e, "id", s->token);
    cJSON_AddNumberToObject(e, "logprob", isfinite(s->logprob) ? s->logprob : -1e30);
    cJSON_AddItemToObject(e, "top", top);
    for (int32_t i = 0; i < s->n_top; i++) {
        cJSON *t = cJSON_CreateObject();
        if (!t) return kiln_error(KILN_ENOMEM, "out of memory");
        cJSON_AddItemToArray(top, t);
        cJSON_AddNumberToObject(t, "id", s->top[i].id);
        cJSON_AddNumberToObject(t, "logprob", isfinite(s->top[i].logprob) ? s->top[i].logprob : -1e30);
    }
    return NULL;
}

static kiln_status keep_row(record *r, const float *lg) {
    if (!r->rows && r->n_rows) return NULL;
    float *p = realloc(r->rows, sizeof(float) * (size_t)((r->n_rows + 1) * r->vocab));
    if (!p) return kiln_error(KILN_ENOMEM, "out of memory");
    r->rows = p;
    memcpy(p + r->n_rows++ * r->vocab, lg, sizeof(float) * (size_t)r->vocab);
    return NULL;
}

static kiln_status keep_id(record *r, int32_t id) {
    if (r->n == r->cap) {
        int64_t nc = r->cap ? r->cap * 2 : 64;
        int32_t *p = realloc(r->ids, sizeof(int32_t) * (size_t)nc);
        if (!p) return kiln_error(KILN_ENOMEM, "out of memory");
        r->ids = p;
        r->cap = nc;
    }
    r->ids[r->n++] = id;
    return NULL;
}

/* --image: the images' features (in order, concatenated), the prompt with
 * each placeholder expanded to its image's block, and per prompt token its
 * inputs (feature row, span, M-RoPE positions). */
typedef struct {
    float *feat, *deep;
    kvis_inputs x;
} image_input;

/* One --video: its comma-separated frame files, decoded, through the video processor. */
static kiln_status load_video(const kvis_model *vm, const char *list, kvis_pixels *px) {
    kimg_image *fr = calloc(KILN_MAX_FRAMES, sizeof *fr);
    char *copy = strdup(list);
    kiln_status st = !fr || !copy ? kiln_error(KILN_ENOMEM, "out of memory") : NULL;
    int n = 0;
    for (char *save = NULL, *f = copy ? strtok_r(copy, ",", &save) : NULL; f && !st; f = strtok_r(NULL, ",", &save)) {
        if (n == KILN_MAX_FRAMES) st = kiln_error(KILN_ELIMIT, "at most %d frames", KILN_MAX_FRAMES);
        else if ((st = kimg_load(f, &fr[n]))) st = kiln_status_wrap(st, "frame %d (%s)", n + 1, f);
        else n++;
    }
    if (!st && n == 0) st = kiln_error(KILN_EINVAL, "no frame files");
    if (!st) st = kvis_pixels_from_video(vm, fr, n, px);
    for (int i = 0; i < n; i++) kimg_free(&fr[i]);
    free(fr), free(copy);
    return st;
}

static kiln_status add_images(opts *o, const ke_model *m, image_input *im) {
    kvis_model *vm = ke_model_vision(m);
    if (!vm) return kiln_error(KILN_EUNSUPPORTED, "%s: %s is not a vision-language model (no vision_config)", o->n_images ? "--image" : "--video", o->dir);
    kvis_pixels px[KILN_MAX_IMAGES] = {0};
    int64_t E = ke_model_hparams(m)->hidden, total = 0;
    kiln_status st = NULL;
    int n = 0;
    for (; n < o->n_images && !st; n++) {
        kimg_image img;
        st = kimg_load(o->images[n], &img);
        if (!st) st = kvis_pixels_from_image(vm, &img, &px[n]);
        kimg_free(&img);
        if (st) st = kiln_status_wrap(st, "--image %s", o->images[n]);
    }
    for (int v = 0; v < o->n_videos && !st; v++, n++) {
        st = load_video(vm, o->videos[v], &px[n]);
        if (st) st = kiln_status_wrap(st, "--video %s", o->videos[v]);
    }
    if (!st) st = kvis_encode_images(vm, px, n, (int)o->threads, &im->feat, &im->deep, &total);
    int32_t *ids = NULL;
    int ni = 0, nm = o->n_images + o->n_videos;
    if (!st) st = kvis_expand_images(vm, px, nm, o->prompt, o->n_prompt, kc_bos_id(ke_model_checkpoint(m)), &ids, &ni);
    if (!st) st = kvis_inputs_build(vm, px, nm, im->feat, im->deep, total, E, ids, ni, &im->x);
    for (int i = 0; i < n; i++) kvis_pixels_free(&px[i]);
    if (st) {
        free(ids);
        return kiln_status_wrap(st, "%s", !o->n_videos ? "--image" : o->n_images ? "--image / --video" : "--video");
    }
    free(o->prompt);
    o->prompt = ids, o->n_prompt = ni;
    return NULL;
}

/* One sampled token, as the plain loop below handles it: its text shown or
 * kept, its id recorded unless a stop string ended generation. */
typedef struct {
    opts *o;
    record *rec;
    bool has_tok;
} spec_out;

static kiln_status spec_emit(void *ud, int i, const kgen_step *s) {
    (void)i;
    spec_out *w = ud;
    if (s->text_len) {
        if (w->o->json) KILN_TRY(keep_text(w->o, s->text, s->text_len));
        else fwrite(s->text, 1, s->text_len, stdout), fflush(stdout);
    }
    kgen_finish f = s->finish;
    if (f != KGEN_CONTINUE && f != KGEN_FINISH_EOS && f != KGEN_FINISH_LENGTH && f != KGEN_FINISH_GRAMMAR) return NULL;
    KILN_TRY(keep_id(w->rec, s->token));
    if (!w->o->json && !w->has_tok) printf("%d ", s->token), fflush(stdout);
    return NULL;
}

static kiln_status run(opts *o, record *rec, const char **finish, double *t) {
    ke_model *m = NULL;
    ke_ctx *c = NULL;
    kgen_session *g = NULL;
    ktok *tok = NULL;
    ke_model *draft = NULL;
    kspec *sp = NULL;
    kspec_seq *sq = NULL;
    ke_text_vocab tv = {0};
    ke_text_detok td = {0};
    kgr_vocab *gv = NULL;
    double t0 = kiln_now_s();
    kiln_status st = ke_model_load(o->dir, &m);
    if (!st) {
        kiln_status ts = ktok_load(o->dir, &tok);
        if (ts && kiln_status_code(ts) != KILN_ENOTFOUND) st = ts; /* a broken tokenizer is an error; none is fine */
        else kiln_status_free(ts);
    }
    if (!st) st = prompt_ids(o, tok);
    image_input img = {0};
    if (!st && o->n_images + o->n_videos) st = add_images(o, m, &img);
    if (!st) st = ke_ctx_create(m, &(ke_ctx_params){.n_ctx = o->n_ctx, .n_threads = (int)o->threads, .cache_type_k = o->cache_k, .cache_type_v = o->cache_v, .compile = {.mlir = o->mlir, .mlir_tosa = o->mlir_tosa}}, &c);
    if (!st) kiln_warn_ctx(m, ke_ctx_n_ctx(c));
    if (!st && o->sp.draft) st = kspec_load_draft(o->sp.draft, m, o->dir, &draft);
    if (!st && kspec_enabled(&o->sp)) st = kspec_create(&o->sp, c, draft, &sp);
    t[0] = kiln_now_s() - t0;
    if (st) goto out;
    const km_hparams *hp = ke_model_hparams(m);
    rec->vocab = hp->vocab;
    if (o->n_prompt > ke_ctx_n_ctx(c)) {
        st = kiln_error(KILN_ELIMIT, "the prompt has %d tokens, more than the context size %lld (raise --ctx-size)",
                        o->n_prompt, (long long)ke_ctx_n_ctx(c));
        goto out;
    }
    int32_t eos[16];
    int n_eos = 0;
    st = kc_eos_ids(ke_model_checkpoint(m), eos, 16, &n_eos);
    kgen_vocab v = {(int32_t)hp->vocab, no_text, NULL, NULL, NULL};
    if (tok) {
        ke_text_vocab_init(&tv, tok, (int32_t)hp->vocab);
        v = ke_text_vocab_get(&tv);
    }
    if (!st && tok && o->gp.grammar) {
        st = kgr_vocab_create(tok, (int32_t)hp->vocab, eos, n_eos, &gv);
        v.grammar = gv;
    }
    if (!st)
        st = kgen_session_create(&o->gp, &v, (int32_t)ke_ctx_n_ctx(c), eos, n_eos, o->prompt, o->n_prompt, &g);
    if (!st && tok) {
        st = ke_text_detok_init(&td, tok, true);
        if (!st) {
            kgen_detok d = ke_text_detok_get(&td);
            kgen_session_set_detok(g, &d);
        }
    }
    int seq = 0;
    if (!st) st = ke_seq_open(c, &seq);
    if (st) goto out;
    if (o->echo) {
        fwrite(o->echo, 1, o->echo_len, stdout);
        fflush(stdout);
    }
    int *seqs = calloc((size_t)o->n_prompt, sizeof(int));
    if (!seqs) {
        st = kiln_error(KILN_ENOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < o->n_prompt; i++) seqs[i] = seq;
    const float *lg;
    int nr;
    double t1 = kiln_now_s();
    st = ke_decode_ex(c, &(ke_batch){o->n_prompt, o->prompt, seqs, NULL}, o->n_images + o->n_videos ? &(ke_inputs){img.x.embd, img.x.span, img.x.pos3, img.x.embd_add, img.x.cross, img.x.cross_keys, img.x.types} : NULL,
                      &lg, &nr);
    free(seqs);
    t[1] = kiln_now_s() - t1;
    double t2 = kiln_now_s();
    kgen_finish f = o->n_forced ? KGEN_CONTINUE : kgen_session_start(g);
    if (!st && sp) { /* speculative: the same tokens, fewer steps */
        st = kspec_seq_create(sp, seq, o->prompt, o->n_prompt, &sq);
        spec_out w = {o, rec, tok != NULL};
        if (!st) st = kspec_generate(sp, sq, g, lg, spec_emit, &w, &f);
        if (sq) kspec_seq_stats(sq, &o->spec);
    }
    while (!st && !sp) {
        if (o->logits_out) KILN_TRY(keep_row(rec, lg));
        int32_t next;
        if (o->n_forced) {
            if (rec->n == o->n_forced) {
                f = KGEN_FINISH_LENGTH;
                break;
            }
            next = o->forced[rec->n];
        } else {
            if (f != KGEN_CONTINUE) break;
            kgen_step s;
            st = kgen_session_step(g, lg, &s);
            if (st) break;
            f = s.finish;
            if (s.text_len) {
                if (o->json) st = keep_text(o, s.text, s.text_len);
                else fwrite(s.text, 1, s.text_len, stdout), fflush(stdout);
            }
            if (st || (f != KGEN_CONTINUE && f != KGEN_FINISH_EOS && f != KGEN_FINISH_LENGTH && f != KGEN_FINISH_GRAMMAR)) break;
            next = s.token;
            if (o->gp.n_probs > 0) st = keep_probs(rec, &s.sample); /* one entry per generated id */
            if (st) break;
        }
        st = keep_id(rec, next);
        if (!st && !o->json && !tok) {
            printf("%d ", next);
            fflush(stdout);
        }
        if (st || (f != KGEN_CONTINUE && !o->logits_out)) break;
        if (ke_seq_len(c, seq) >= ke_ctx_n_ctx(c)) {
            f = KGEN_FINISH_CONTEXT;
            break;
        }
        st = ke_decode(c, &(ke_batch){1, &next, &seq, NULL}, &lg, &nr);
        if (!st && f != KGEN_CONTINUE && o->logits_out) {
            KILN_TRY(keep_row(rec, lg)); /* the row after the last token */
            break;
        }
    }
    t[2] = kiln_now_s() - t2;
    *finish = kgen_finish_reason(f) ? kgen_finish_reason(f) : "length";
out:
    kspec_seq_destroy(sq);
    kspec_destroy(sp);
    ke_model_free(draft);
    free(img.feat), free(img.deep);
    kvis_inputs_free(&img.x);
    kgen_session_destroy(g);
    ke_text_detok_free(&td);
    ke_text_vocab_free(&tv);
    kgr_vocab_free(gv);
    ktok_free(tok);
    ke_ctx_free(c);
    ke_model_free(m);
    return st;
}

int kiln_cmd_generate(int argc, char **argv) {
    opts o = {0};
    bool help = false;
    kiln_status st = parse(&o, argc, argv, &help);
    if (help) {
        usage(stdout);
        kgen_params_free(&o.gp);
        return 0;
    }
    if (!o.dir) o.dir = kiln_default_model();
    record rec = {0};
    const char *finish = "length";
    double t[3] = {0};
    if (!st) st = run(&o, &rec, &finish, t);
    if (!st && o.logits_out) st = ku_npy_write_f32(o.logits_out, rec.rows, rec.n_rows, rec.vocab);
    if (!st) {
        if (o.json) {
            printf("{\"model\": \"%s\", \"prompt_ids\": [", o.dir);
            for (int i = 0; i < o.n_prompt; i++) printf("%s%d", i ? ", " : "", o.prompt[i]);
            printf("], \"generated_ids\": [");
            for (int64_t i = 0; i < rec.n; i++) printf("%s%d", i ? ", " : "", rec.ids[i]);
            printf("]");
            if (rec.probs) {
                char *pj = cJSON_PrintUnformatted(rec.probs);
                printf(", \"probs\": %s", pj ? pj : "null");
                free(pj);
            }
            if (o.out_text) {
                cJSON *js = cJSON_CreateString(o.out_text);
                char *esc = js ? cJSON_PrintUnformatted(js) : NULL;
                printf(", \"text\": %s", esc ? esc : "null");
                free(esc);
                cJSON_Delete(js);
            }
            printf(", \"finish_reason\": \"%s\", \"timings\": {\"load_s\": %.4f, \"prompt_s\": %.4f, \"generate_s\": %.4f, "
                   "\"prompt_tok_s\": %.2f, \"generate_tok_s\": %.2f",
                   finish, t[0], t[1], t[2], t[1] > 0 ? o.n_prompt / t[1] : 0, t[2] > 0 ? (double)rec.n / t[2] : 0);
            if (kspec_enabled(&o.sp)) /* llama-server's names */
                printf(", \"draft_n\": %lld, \"draft_n_accepted\": %lld, \"spec_steps\": %lld", (long long)o.spec.drafted,
                       (long long)o.spec.accepted, (long long)o.spec.rounds);
            printf("}}\n");
        } else {
            printf("\n");
            fflush(stdout);
            fprintf(stderr, "kiln: %d prompt tokens in %.3f s (%.1f tok/s), %lld generated in %.3f s (%.1f tok/s), finish: %s\n",
                    o.n_prompt, t[1], t[1] > 0 ? o.n_prompt / t[1] : 0, (long long)rec.n, t[2],
                    t[2] > 0 ? (double)rec.n / t[2] : 0, finish);
            if (kspec_enabled(&o.sp))
                fprintf(stderr, "kiln: speculative: %lld guessed, %lld kept (%.1f%%), %lld target steps\n", (long long)o.spec.drafted,
                        (long long)o.spec.accepted, o.spec.drafted ? 100.0 * (double)o.spec.accepted / (double)o.spec.drafted : 0.0,
                        (long long)o.spec.rounds);
        }
    }
    cJSON_Delete(rec.probs);
    free(o.echo);
    free(rec.ids), free(rec.rows), free(o.prompt), free(o.forced), free(o.out_text);
    kgen_params_free(&o.gp);
    return st ? kiln_fail(st) : 0;
}
