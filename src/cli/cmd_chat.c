/* cmd_chat.c: `kiln chat`, a conversation in the terminal, as llama-cli's
 * conversation mode. Each turn renders the whole conversation through the
 * model's chat template; the sequence keeps the previous turns' KV, so only
 * the tokens that follow what it holds are computed (when the rendering of
 * the old turns changed, the prefix cache gives back the blocks that still
 * match). Replies stream; Ctrl-C stops the reply, not the program. On a
 * terminal lines are edited with libedit (history kept for the session);
 * otherwise each line of standard input is one user turn and each reply one
 * block of standard output, so it can be scripted.
 *
 * In an MPI job (mpirun -np N kiln chat ... --tp N, or --pp) rank 0 is the
 * chat: mpirun hands standard input to it alone, and its context leads
 * (ke_ctx_lead: every step broadcast to the others before it runs); the
 * other processes load their shard and follow those steps (ke_ctx_follow)
 * until rank 0's context ends, as serve --tp's followers do. Templates,
 * sampling and images stay on rank 0. */
#include <editline/readline.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/file.h"
#include "base/json.h"
#include "chat/chat.h"
#include "cli/cli.h"
#include "engine/engine.h"
#include "engine/textio.h"
#include "gen/params.h"
#include "gen/session.h"
#include "grammar/grammar.h"
#include "runtime/dist.h"
#include "vision/vision.h"

static void usage(FILE *f) {
    fprintf(f, "usage: kiln chat [-m DIR] [options]\n"
               "  An interactive chat through the model's chat template; replies stream, the previous\n"
               "  turns' KV is reused. Without a terminal on standard input, each line is one user turn\n"
               "  and each reply is printed followed by a newline; it exits at the end of the input.\n"
               "  -m, --model DIR       checkpoint folder (default: the bundled demo model)\n"
               "  --system TEXT         a system message first\n"
               "  --image FILE          vision-language models: a PNG, JPEG, WebP or GIF image with the first message\n"
               "  -c, --ctx-size N      context size for the whole conversation (default: the model's, at most 4096)\n"
               "  -t, --threads N       threads (default: all CPUs; per process in an MPI job)\n"
               KILN_CACHE_TYPE_HELP
               "  mpirun -np N kiln chat ... --tp N (or --pp P): one model across processes; rank 0 reads\n"
               "  the turns from standard input and prints the replies (mpirun's Ctrl-C ends the job)\n"
               "commands in the conversation:\n"
               "  /system TEXT          set the system message (the conversation is kept)\n"
               "  /clear                forget the conversation (the system message stays)\n"
               "  /save FILE            write the conversation as JSON messages\n"
               "  /load FILE            read a conversation written by /save (or any messages list)\n"
               "  /image FILE           attach an image to the next message (vision-language models;\n"
               "                        up to 16 per conversation, each kept for its message)\n"
               "  /help, /exit          this list; leave (also Ctrl-D)\n"
               "  Ctrl-C                stop the reply being written\n"
               "sampling (as kiln generate and llama.cpp; -n limits each reply):\n");
    kgen_print_flags(f);
}

enum { CHAT_MAX_IMAGES = 16 };

typedef struct {
    const char *dir, *system, *image;
    int64_t n_ctx, threads;
    int cache_k, cache_v; /* kg_dtype of the KV cache (--cache-type-k/-v) */
    kgen_params gp;
} chat_opts;

static kiln_status parse(chat_opts *o, int argc, char **argv, bool *help) {
    KILN_TRY(kgen_params_init(&o->gp));
    for (int i = 1; i < argc;) {
        bool used;
        KILN_TRY(kgen_parse_flag(&o->gp, argc, argv, &i, &used));
        if (used) continue;
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            *help = true;
            return NULL;
        }
        static const char *const valued[] = {"-m", "--model", "--system", "--image", "-c", "--ctx-size", "-t", "--threads", KILN_CACHE_TYPE_OPTS, NULL};
        KILN_TRY(kiln_option("chat", a, v, valued, NULL));
        kiln_status cst = NULL;
        if (kiln_cache_type_opt(a, v, &o->cache_k, &o->cache_v, &cst)) KILN_TRY(cst);
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) o->dir = v;
        else if (!strcmp(a, "--system")) o->system = v;
        else if (!strcmp(a, "--image")) o->image = v;
        else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) KILN_TRY(kiln_parse_int(a, v, 0, 1 << 30, &o->n_ctx));
        else KILN_TRY(kiln_parse_int(a, v, 0, 1024, &o->threads));
        i += 2;
    }
    if (o->gp.n_probs > 0) return kiln_error(KILN_EINVAL, "--n-probs: kiln chat prints text only (kiln generate --json reports probabilities)");
    return kgen_params_validate(&o->gp);
}

/* Ctrl-C while a reply is written stops it; at the prompt it only says how
 * to leave. */
static volatile sig_atomic_t interrupted;
static void on_sigint(int sig) {
    (void)sig;
    interrupted = 1;
}

typedef struct {
    chat_opts *o;
    bool tty;
    ke_model *m;
    ke_ctx *c;
    ktok *tok;
    kchat_template *tmpl;
    ke_text_vocab tv;
    kgr_vocab *gv;
    int32_t eos[16];
    int n_eos;
    cJSON *msgs; /* the conversation (system message included) */
    /* what the open sequence holds */
    int seq;
    bool open;
    int32_t *held;
    int64_t n_held, cap_held;
    /* the conversation's images, in the order of the messages that hold
     * them: pixels and features (the tower runs once per image) */
    struct chat_image {
        kvis_pixels px;
        float *feat, *deep;
        int64_t n_feat;
    } images[CHAT_MAX_IMAGES];
    int n_images;
    float *rows, *deep_rows; /* the images' rows concatenated, which render's inputs point into */
    char *pending_image;
} chat;

static kiln_status hold(chat *ch, const int32_t *ids, int64_t n) {
    if (n <= 0) return NULL;
    if (ch->n_held + n > ch->cap_held) {
        int64_t nc = (ch->n_held + n) * 2;
        int32_t *p = realloc(ch->held, sizeof(int32_t) * (size_t)nc);
        if (!p) return kiln_error(KILN_ENOMEM, "out of memory");
        ch->held = p, ch->cap_held = nc;
    }
    memcpy(ch->held + ch->n_held, ids, sizeof(int32_t) * (size_t)n);
    ch->n_held += n;
    return NULL;
}

static void drop_seq(chat *ch) {
    if (ch->open) ke_seq_close(ch->c, ch->seq);
    ch->open = false;
    ch->n_held = 0;
}

/* Forgets the last image (keep = n_images - 1), or all of them (keep = 0). */
static void drop_images(chat *ch, int keep) {
    while (ch->n_images > keep) {
        struct chat_image *im = &ch->images[--ch->n_images];
        kvis_pixels_free(&im->px);
        free(im->feat), free(im->deep);
        memset(im, 0, sizeof *im);
    }
}

static cJSON *message(const char *role, const char *text, bool image) {
    cJSON *m = cJSON_CreateObject();
    if (!m) return NULL;
    cJSON_AddStringToObject(m, "role", role);
    if (!image) {
        cJSON_AddStringToObject(m, "content", text);
        return m;
    }
    /* content parts, as transformers passes an image message to templates */
    cJSON *parts = cJSON_AddArrayToObject(m, "content"), *p = cJSON_CreateObject(), *t = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "type", "image");
    cJSON_AddStringToObject(t, "type", "text");
    cJSON_AddStringToObject(t, "text", text);
    cJSON_AddItemToArray(parts, p);
    cJSON_AddItemToArray(parts, t);
    return m;
}

static kiln_status set_system(chat *ch, const char *text) {
    cJSON *first = cJSON_GetArrayItem(ch->msgs, 0);
    const cJSON *role = first ? cJSON_GetObjectItemCaseSensitive(first, "role") : NULL;
    cJSON *m = message("system", text, false);
    if (!m) return kiln_error(KILN_ENOMEM, "out of memory");
    if (cJSON_IsString(role) && !strcmp(role->valuestring, "system")) {
        cJSON_ReplaceItemInArray(ch->msgs, 0, m);
    } else {
        cJSON_InsertItemInArray(ch->msgs, 0, m);
    }
    return NULL;
}

/* The pending image (/image or --image) encoded for the next message. */
static kiln_status encode_image(chat *ch) {
    kvis_model *vm = ke_model_vision(ch->m);
    if (!vm) return kiln_error(KILN_EUNSUPPORTED, "%s is not a vision-language model (no vision_config): it takes no image", ch->o->dir);
    if (ch->n_images == CHAT_MAX_IMAGES)
        return kiln_error(KILN_ELIMIT, "kiln chat holds %d images per conversation: /clear first", CHAT_MAX_IMAGES);
    if (ch->n_images && kvis_cross(vm))
        return kiln_error(KILN_EUNSUPPORTED, "this model takes one image per conversation: /clear first");
    struct chat_image *im = &ch->images[ch->n_images++];
    kimg_image img;
    kiln_status st = kimg_load(ch->pending_image, &img);
    if (!st) st = kvis_pixels_from_image(vm, &img, &im->px);
    kimg_free(&img);
    if (!st) st = kvis_encode(vm, &im->px, (int)ch->o->threads, &im->feat, &im->deep, &im->n_feat);
    if (st) {
        drop_images(ch, ch->n_images - 1);
        return kiln_status_wrap(st, "%s", ch->pending_image);
    }
    return NULL;
}

/* The conversation as prompt ids (and, with an image, its per-token inputs). */
static kiln_status render(chat *ch, int32_t **ids, int *n, kvis_inputs *vx) {
    char *text = NULL;
    kchat_input in = {.messages = ch->msgs, .add_generation_prompt = true};
    KILN_TRY(kchat_render(ch->tmpl, &in, &text));
    size_t nn = 0;
    kiln_status st = ktok_encode(ch->tok, text, strlen(text), false, ids, &nn); /* the template writes the special tokens */
    free(text);
    if (st) return st;
    *n = (int)nn;
    if (ch->n_images == 0) return NULL;
    const kvis_model *vm = ke_model_vision(ch->m);
    /* the images' pixels and rows, concatenated in conversation order */
    int64_t E = ke_model_hparams(ch->m)->hidden, L = kvis_deepstack_layers(vm), rows = 0;
    for (int i = 0; i < ch->n_images; i++) rows += ch->images[i].n_feat;
    kvis_pixels px[CHAT_MAX_IMAGES];
    free(ch->rows), free(ch->deep_rows);
    float *feat = ch->rows = malloc(sizeof(float) * (size_t)(rows * E));
    float *deep = ch->deep_rows = ch->images[0].deep ? malloc(sizeof(float) * (size_t)(rows * L * E)) : NULL;
    if (!feat || (ch->images[0].deep && !deep)) st = kiln_error(KILN_ENOMEM, "out of memory");
    for (int i = 0, r = 0; !st && i < ch->n_images; r += (int)ch->images[i].n_feat, i++) {
        const struct chat_image *im = &ch->images[i];
        px[i] = im->px;
        memcpy(feat + r * E, im->feat, sizeof(float) * (size_t)(im->n_feat * E));
        if (deep) memcpy(deep + r * L * E, im->deep, sizeof(float) * (size_t)(im->n_feat * L * E));
    }
    int32_t *e = NULL;
    int ne = 0;
    if (!st) st = kvis_expand_images(vm, px, ch->n_images, *ids, *n, kc_bos_id(ke_model_checkpoint(ch->m)), &e, &ne);
    if (!st) st = kvis_inputs_build(vm, px, ch->n_images, feat, deep, rows, E, e, ne, vx);
    free(*ids);
    *ids = e, *n = e ? ne : 0;
    return st;
}

static kiln_status decode(chat *ch, const int32_t *ids, int n, const kvis_inputs *vx, int64_t at, const float **lg) {
    int *seqs = malloc(sizeof(int) * (size_t)n);
    if (!seqs) return kiln_error(KILN_ENOMEM, "out of memory");
    for (int i = 0; i < n; i++) seqs[i] = ch->seq;
    ke_inputs x = {0};
    if (vx && vx->embd)
        x = (ke_inputs){vx->embd + at, vx->span ? vx->span + 2 * at : NULL, vx->pos3 ? vx->pos3 + 3 * at : NULL,
                        vx->embd_add ? vx->embd_add + at : NULL, vx->cross ? vx->cross + at : NULL,
                        vx->cross_keys ? vx->cross_keys + at : NULL, vx->types ? vx->types + at : NULL};
    int nr;
    kiln_status st = ke_decode_ex(ch->c, &(ke_batch){n, ids, seqs, NULL}, vx && vx->embd ? &x : NULL, lg, &nr);
    free(seqs);
    if (!st) st = hold(ch, ids, n);
    /* blocks with image tokens are not published: another image has the same ids */
    if (!st && ch->n_images == 0) ke_seq_publish(ch->c, ch->seq, ch->held, ch->n_held);
    return st;
}

/* Brings the sequence to ids[0..n) and returns the last position's logits:
 * appends to what it holds when that is a prefix, else starts over from the
 * longest cached prefix. */
static kiln_status prefill(chat *ch, const int32_t *ids, int n, const kvis_inputs *vx, const float **lg, int64_t *reused) {
    bool prefix = ch->open && ch->n_held < n && !memcmp(ch->held, ids, sizeof(int32_t) * (size_t)ch->n_held);
    if (!prefix) {
        drop_seq(ch);
        KILN_TRY(ke_seq_open(ch->c, &ch->seq));
        ch->open = true;
        int64_t k = ch->n_images == 0 ? ke_seq_reuse_prefix(ch->c, ch->seq, ids, n) : 0;
        KILN_TRY(hold(ch, ids, k));
    }
    *reused = ch->n_held;
    int64_t at = ch->n_held;
    return decode(ch, ids + at, (int)(n - at), vx, at, lg);
}

/* One reply to the conversation as it stands; its text becomes the
 * assistant's message. */
static kiln_status reply(chat *ch) {
    int32_t *ids = NULL;
    int n = 0;
    kvis_inputs vx = {0};
    kgen_session *g = NULL;
    ke_text_detok td = {0};
    char *out = NULL;
    size_t n_out = 0, cap = 0;
    kiln_status st = render(ch, &ids, &n, &vx);
    int64_t n_ctx = ke_ctx_n_ctx(ch->c);
    if (!st && n >= n_ctx)
        st = kiln_error(KILN_ELIMIT, "the conversation has %d tokens, the context %lld: /clear to start over, or raise --ctx-size",
                        n, (long long)n_ctx);
    kgen_vocab v = ke_text_vocab_get(&ch->tv);
    v.grammar = ch->gv;
    if (!st) st = kgen_session_create(&ch->o->gp, &v, (int32_t)n_ctx, ch->eos, ch->n_eos, ids, n, &g);
    if (!st) st = ke_text_detok_init(&td, ch->tok, true);
    if (!st) {
        kgen_detok d = ke_text_detok_get(&td);
        kgen_session_set_detok(g, &d);
    }
    struct timespec t0, t1, t2;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    const float *lg = NULL;
    int64_t reused = 0;
    if (!st) st = prefill(ch, ids, n, &vx, &lg, &reused);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    kgen_finish f = st ? KGEN_CONTINUE : kgen_session_start(g);
    int64_t n_gen = 0;
    bool stopped = false; /* Ctrl-C since the line was read stops this reply */
    while (!st && f == KGEN_CONTINUE) {
        if (interrupted) {
            stopped = true;
            break;
        }
        kgen_step s;
        st = kgen_session_step(g, lg, &s);
        if (st) break;
        f = s.finish;
        if (s.text_len) {
            fwrite(s.text, 1, s.text_len, stdout);
            fflush(stdout);
            if (n_out + s.text_len + 1 > cap) {
                char *p = realloc(out, cap = (n_out + s.text_len + 1) * 2);
                if (!p) {
                    st = kiln_error(KILN_ENOMEM, "out of memory");
                    break;
                }
                out = p;
            }
            memcpy(out + n_out, s.text, s.text_len);
            n_out += s.text_len;
        }
        if (f != KGEN_CONTINUE) break;
        n_gen++;
        if (ke_seq_len(ch->c, ch->seq) >= n_ctx) {
            f = KGEN_FINISH_CONTEXT;
            break;
        }
        st = decode(ch, &s.token, 1, NULL, 0, &lg);
    }
    clock_gettime(CLOCK_MONOTONIC, &t2);
    if (lg) { /* a reply was started: it ends with a newline, also when it failed */
        fputc('\n', stdout);
        fflush(stdout);
    }
    if (!st) {
        double tp = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        double tg = (double)(t2.tv_sec - t1.tv_sec) + 1e-9 * (double)(t2.tv_nsec - t1.tv_nsec);
        char why[256];
        fprintf(stderr, "[%d prompt tokens, %lld reused, %.1f tok/s; %lld generated, %.1f tok/s; %s]\n", n, (long long)reused,
                tp > 0 ? (double)(n - reused) / tp : 0, (long long)kgen_session_generated(g), tg > 0 ? (double)n_gen / tg : 0,
                stopped ? "stopped (Ctrl-C)" : kgen_session_describe(g, f, why, sizeof why));
        cJSON *m = message("assistant", out ? (out[n_out] = 0, out) : "", false);
        if (!m) st = kiln_error(KILN_ENOMEM, "out of memory");
        else cJSON_AddItemToArray(ch->msgs, m);
    }
    free(out);
    free(ids);
    kvis_inputs_free(&vx);
    ke_text_detok_free(&td);
    kgen_session_destroy(g);
    return st;
}

/* A user turn: the message (with the pending image), then the reply; on an
 * error the message is taken back, so the conversation stays as it was. */
static kiln_status user_turn(chat *ch, const char *text) {
    bool image = ch->pending_image != NULL;
    if (image) {
        kiln_status st = encode_image(ch);
        free(ch->pending_image);
        ch->pending_image = NULL;
        if (st) return st;
    }
    cJSON *m = message("user", text, image);
    if (!m) return kiln_error(KILN_ENOMEM, "out of memory");
    cJSON_AddItemToArray(ch->msgs, m);
    int at = cJSON_GetArraySize(ch->msgs) - 1;
    kiln_status st = reply(ch);
    if (st) {
        cJSON_DeleteItemFromArray(ch->msgs, at);
        if (image) drop_images(ch, ch->n_images - 1);
    }
    return st;
}

static kiln_status save(chat *ch, const char *path) {
    char *s = cJSON_Print(ch->msgs);
    if (!s) return kiln_error(KILN_ENOMEM, "out of memory");
    FILE *f = fopen(path, "w");
    kiln_status st = f ? NULL : kiln_error(KILN_EIO, "%s: cannot write", path);
    if (f) {
        fputs(s, f);
        fputc('\n', f);
        if (fclose(f)) st = kiln_error(KILN_EIO, "%s: write failed", path);
    }
    free(s);
    return st;
}

static kiln_status load(chat *ch, const char *path) {
    cJSON *j;
    KILN_TRY(ku_json_load(path, &j));
    cJSON *msgs = cJSON_IsObject(j) ? cJSON_DetachItemFromObjectCaseSensitive(j, "messages") : j;
    if (msgs != j) cJSON_Delete(j);
    const cJSON *m;
    int i = 0;
    cJSON_ArrayForEach(m, msgs) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role"), *c = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!cJSON_IsString(role) || !cJSON_IsString(c)) {
            cJSON_Delete(msgs);
            return kiln_error(KILN_EINVAL, "%s: message %d: expected {\"role\": ..., \"content\": \"text\"} (images are not saved)", path, i);
        }
        i++;
    }
    if (!cJSON_IsArray(msgs)) {
        cJSON_Delete(msgs);
        return kiln_error(KILN_EINVAL, "%s: expected a list of messages (as /save writes)", path);
    }
    cJSON_Delete(ch->msgs);
    ch->msgs = msgs;
    drop_images(ch, 0);
    return NULL;
}

/* A line that starts with '/': a command. Returns false for /exit. */
static bool command(chat *ch, const char *line) {
    const char *arg = strchr(line, ' ');
    size_t len = arg ? (size_t)(arg - line) : strlen(line);
    while (arg && *arg == ' ') arg++;
    if (arg && !*arg) arg = NULL;
#define IS(name) (len == strlen(name) && !strncmp(line, name, len))
    kiln_status st = NULL;
    if (IS("/exit") || IS("/quit")) return false;
    if (IS("/help")) {
        usage(stdout);
    } else if (IS("/clear")) {
        cJSON *first = cJSON_GetArrayItem(ch->msgs, 0), *role = first ? cJSON_GetObjectItem(first, "role") : NULL;
        bool sys = cJSON_IsString(role) && !strcmp(role->valuestring, "system");
        while (cJSON_GetArraySize(ch->msgs) > (sys ? 1 : 0)) cJSON_DeleteItemFromArray(ch->msgs, sys ? 1 : 0);
        drop_images(ch, 0);
        drop_seq(ch);
    } else if (IS("/system")) {
        st = arg ? set_system(ch, arg) : kiln_error(KILN_EINVAL, "/system TEXT: give the system message");
    } else if (IS("/save")) {
        st = arg ? save(ch, arg) : kiln_error(KILN_EINVAL, "/save FILE: give a file");
    } else if (IS("/load")) {
        st = arg ? load(ch, arg) : kiln_error(KILN_EINVAL, "/load FILE: give a file");
    } else if (IS("/image")) {
        if (!arg) st = kiln_error(KILN_EINVAL, "/image FILE: give a PNG, JPEG, WebP or GIF file");
        else if (!ke_model_vision(ch->m)) st = kiln_error(KILN_EUNSUPPORTED, "%s is not a vision-language model: it takes no image", ch->o->dir);
        else if (!ku_file_exists(arg)) st = kiln_error(KILN_ENOTFOUND, "%s: no such file", arg);
        else {
            free(ch->pending_image);
            ch->pending_image = strdup(arg);
            if (ch->tty) fprintf(stderr, "[the image goes with your next message]\n");
        }
    } else {
        st = kiln_error(KILN_EINVAL, "unknown command %.*s (/help lists them)", (int)len, line);
    }
#undef IS
    if (st) {
        fprintf(stderr, "kiln: %s\n", kiln_status_msg(st));
        kiln_status_free(st);
    }
    return true;
}

/* The next line without its newline (malloc'ed), NULL at the end. */
static char *next_line(chat *ch) {
    interrupted = 0;
    if (ch->tty) {
        for (;;) {
            interrupted = 0;
            char *l = readline("> ");
            if (!l && interrupted) { /* Ctrl-C at the prompt */
                fprintf(stderr, "\n(/exit or Ctrl-D leaves)\n");
                continue;
            }
            if (l && *l) add_history(l);
            return l;
        }
    }
    char *l = NULL;
    size_t cap = 0;
    ssize_t n = getline(&l, &cap, stdin);
    if (n < 0) {
        free(l);
        return NULL;
    }
    while (n > 0 && (l[n - 1] == '\n' || l[n - 1] == '\r')) l[--n] = 0;
    return l;
}

/* The context every process of a job creates alike (follow). */
static ke_ctx_params ctx_params(const chat_opts *o) { return (ke_ctx_params){.n_ctx = o->n_ctx, .n_threads = (int)o->threads, .cache_type_k = o->cache_k, .cache_type_v = o->cache_v}; }

/* A process other than rank 0 of a --tp/--pp job: rank 0's steps on this
 * process's shard, until rank 0 leaves. */
static kiln_status follow(const chat_opts *o) {
    ke_model *m = NULL;
    ke_ctx *c = NULL;
    KILN_TRYF(ke_model_load(o->dir, &m), "loading %s", o->dir);
    ke_ctx_params cp = ctx_params(o);
    kiln_status st = ke_ctx_create(m, &cp, &c);
    if (!st) st = ke_ctx_follow(c);
    ke_ctx_free(c);
    ke_model_free(m);
    return st;
}

static kiln_status setup(chat *ch) {
    chat_opts *o = ch->o;
    KILN_TRY(ke_model_load(o->dir, &ch->m));
    KILN_TRYF(ktok_load(o->dir, &ch->tok), "kiln chat needs the model's tokenizer");
    KILN_TRYF(kchat_load(o->dir, &ch->tmpl), "kiln chat needs the model's chat template");
    ke_ctx_params cp = ctx_params(o);
    KILN_TRY(ke_ctx_create(ch->m, &cp, &ch->c));
    ke_ctx_lead(ch->c); /* one process: nothing */
    kiln_warn_ctx(ch->m, ke_ctx_n_ctx(ch->c));
    const km_hparams *hp = ke_model_hparams(ch->m);
    KILN_TRY(kc_eos_ids(ke_model_checkpoint(ch->m), ch->eos, 16, &ch->n_eos));
    ke_text_vocab_init(&ch->tv, ch->tok, (int32_t)hp->vocab);
    if (o->gp.grammar) KILN_TRY(kgr_vocab_create(ch->tok, (int32_t)hp->vocab, ch->eos, ch->n_eos, &ch->gv));
    if (!(ch->msgs = cJSON_CreateArray())) return kiln_error(KILN_ENOMEM, "out of memory");
    if (o->system) KILN_TRY(set_system(ch, o->system));
    if (o->image) {
        if (!ke_model_vision(ch->m)) return kiln_error(KILN_EUNSUPPORTED, "--image: %s is not a vision-language model", o->dir);
        if (!(ch->pending_image = strdup(o->image))) return kiln_error(KILN_ENOMEM, "out of memory");
    }
    return NULL;
}

int kiln_cmd_chat(int argc, char **argv) {
    chat_opts o = {0};
    bool help = false;
    kiln_status st = parse(&o, argc, argv, &help);
    if (help) {
        usage(stdout);
        kgen_params_free(&o.gp);
        return 0;
    }
    if (!o.dir) o.dir = kiln_default_model();
    if (kd_size() > 1) { /* --tp/--pp: rank 0 chats, the others follow its steps (no sampling of their own) */
        kd_set_lockstep(false);
        if (!st && kd_rank() > 0) st = follow(&o);
        if (st || kd_rank() > 0) {
            kgen_params_free(&o.gp);
            return st ? kiln_fail(st) : 0;
        }
    }
    chat ch = {.o = &o, .tty = isatty(STDIN_FILENO) && isatty(STDOUT_FILENO)};
    if (!st) st = setup(&ch);
    if (!st) {
        struct sigaction sa = {0}, old;
        sa.sa_handler = on_sigint; /* no SA_RESTART: the prompt's read returns */
        sigemptyset(&sa.sa_mask);
        sigaction(SIGINT, &sa, &old);
        if (ch.tty) {
            using_history();
            fprintf(stderr, "kiln chat with %s: /help lists the commands, /exit or Ctrl-D leaves, Ctrl-C stops a reply\n", o.dir);
        }
        for (char *line; (line = next_line(&ch));) {
            bool go = true;
            if (line[0] == '/') go = command(&ch, line);
            else if (line[0]) {
                kiln_status ts = user_turn(&ch, line);
                if (ts) {
                    fflush(stdout);
                    fprintf(stderr, "kiln: %s\n", kiln_status_msg(ts));
                    kiln_status_free(ts);
                }
            }
            free(line);
            if (!go) break;
        }
        if (ch.tty) fputc('\n', stderr);
        sigaction(SIGINT, &old, NULL);
    }
    drop_seq(&ch);
    drop_images(&ch, 0);
    free(ch.rows), free(ch.deep_rows);
    free(ch.pending_image);
    free(ch.held);
    cJSON_Delete(ch.msgs);
    kgr_vocab_free(ch.gv);
    ke_text_vocab_free(&ch.tv);
    kchat_free(ch.tmpl);
    ktok_free(ch.tok);
    ke_ctx_free(ch.c);
    ke_model_free(ch.m);
    kgen_params_free(&o.gp);
    return st ? kiln_fail(st) : 0;
}
