/* toolcall.c: format detection, the parsers of each tool-call format, the
 * thinking-block split, and the streaming differ (see toolcall.h).
 *
 * Every parser walks the text once, left to right, and works the same on a
 * prefix (partial) as on the whole: what could still turn into markup is
 * held back, a call is reported once its name is complete, and arguments
 * written as JSON are reported as the model's own text (its raw slice), so
 * the streamed fragments add up to the final string. Formats that write
 * arguments as tags or literals (the XML formats, LFM2, Gemma 4, MiniMax-M3,
 * Kimi K3) write the JSON text pair by pair as the parameters come (jargs),
 * a string value as it is written, typed by the tool's schema as their
 * reference parsers do (vLLM's qwen3coder / glm4_moe tool parsers). */
#include "tools/toolcall.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NPOS ((size_t)-1)

/* ---------------------------------------------------------------- names */

static const char *const k_names[KTC_N_FORMATS] = {
    "none", "hermes", "qwen3_coder", "llama3", "mistral", "mistral_v11", "harmony", "deepseek", "glm45", "kimi_k2", "command_r", "granite",
    "seed_oss", "minimax_m2", "phi4", "command_r_plus", "firefunction", "dsml", "dsml_v4", "minicpm5", "hy3",
    "apriel", "minimax_m1", "nemotron_v2", "gigachat3", "gigachat31", "apertus", "solar", "functionary31", "functionary32", "lfm2",
    "gemma4", "minimax_m3", "kimi_k3", "muse_glimmer", "pythonic",
};

const char *ktc_format_name(ktc_format f) { return f >= 0 && f < KTC_N_FORMATS ? k_names[f] : "none"; }

ktc_format ktc_detect(const char *s) {
    if (!s) return KTC_NONE;
    /* the specific markers first: several formats also write <tool_call> */
    if (strstr(s, "<|channel|>") && strstr(s, "functions.")) return KTC_HARMONY;
    /* (llama.cpp's detections, common/chat.cpp) */
    if (strstr(s, "<atem:function_calls>") && strstr(s, "<|eom|>")) return KTC_MUSE_GLIMMER;
    if (strstr(s, "]<]minimax[>[") && strstr(s, "<invoke name=")) return KTC_MINIMAX_M3;
    if (strstr(s, "<|open|>") && strstr(s, "<|close|>") && strstr(s, "<|end_of_msg|>")) return KTC_KIMI_K3;
    if (strstr(s, "'<|tool_call>call:'")) return KTC_GEMMA4;
    if ((strstr(s, "<|tool_list_start|>") && strstr(s, "<|tool_list_end|>")) || strstr(s, "List of tools: [")) return KTC_LFM2;
    if (strstr(s, "<|tools_prefix|>")) return KTC_APERTUS;
    if (strstr(s, "<|tool_call:begin|>")) return KTC_SOLAR;
    if (strstr(s, "<|role_sep|>") && strstr(s, "<|message_sep|>")) return strstr(s, "<|function_call|>") ? KTC_GIGACHAT31 : KTC_GIGACHAT3;
    if (strstr(s, ">>>all")) return KTC_FUNCTIONARY32;
    if (strstr(s, "<TOOLCALL>")) return KTC_NEMOTRON_V2;
    if (strstr(s, "<tool_calls>") && strstr(s, "<beginning_of_sentence>")) return KTC_MINIMAX_M1;
    if (strstr(s, "<tool_calls>[")) return KTC_APRIEL;
    if (strstr(s, "｜DSML｜")) return strstr(s, "tool_calls>") ? KTC_DSML_V4 : KTC_DSML; /* the templates build the tags */
    if (strstr(s, "<｜tool▁calls▁begin｜>")) return KTC_DEEPSEEK;
    if (strstr(s, "<|tool_calls_section_begin|>")) return KTC_KIMI_K2;
    if (strstr(s, "<|START_ACTION|>")) return KTC_COMMAND_R;
    if (strstr(s, "<|tool_call|>")) return KTC_GRANITE;
    if (strstr(s, "<seed:tool_call>")) return KTC_SEED_OSS;
    if (strstr(s, "<minimax:tool_call>")) return KTC_MINIMAX_M2;
    if (strstr(s, "<|tool|>") && strstr(s, "<|/tool|>")) return KTC_PHI4;
    if (strstr(s, "functools[")) return KTC_FIREFUNCTION;
    if (strstr(s, "Action:") && strstr(s, "\"tool_name\"") && strstr(s, "<|CHATBOT_TOKEN|>")) return KTC_COMMAND_R_PLUS;
    /* Hy3's template builds its markers: '<tool_calls{}>'.format(':opensource') */
    if (strstr(s, "<tool_sep") && strstr(s, "opensource")) return KTC_HY3;
    if (strstr(s, "<arg_key>")) return KTC_GLM45;
    if (strstr(s, "<function name=\"") && strstr(s, "<param name=\"")) return KTC_MINICPM5;
    if (strstr(s, "<function=") && strstr(s, "<parameter=")) return KTC_QWEN3_CODER;
    if (strstr(s, "<function=") && strstr(s, "</function>")) return KTC_FUNCTIONARY31;
    if (strstr(s, "[TOOL_CALLS]")) return strstr(s, "[ARGS]") ? KTC_MISTRAL_V11 : KTC_MISTRAL;
    if (strstr(s, "<tool_call>")) return KTC_HERMES;
    /* the instruction of the pythonic templates (vLLM's Llama 3.2 / Llama 4 pythonic ones, Meta's prompt format) */
    if (strstr(s, "[func_name1(")) return KTC_PYTHONIC;
    /* Llama 3.1-3.3, and Llama 4's own template (<|header_start|>, the same JSON calls) */
    if (strstr(s, "<|python_tag|>") || ((strstr(s, "<|start_header_id|>") || strstr(s, "<|header_start|>")) && strstr(s, "\"parameters\": ")))
        return KTC_LLAMA3;
    return KTC_NONE;
}

ktc_reasoning ktc_detect_reasoning(const char *s) {
    if (!s) return KTC_THINK_NONE;
    if (strstr(s, "<seed:think>")) return KTC_THINK_SEED;
    if (strstr(s, "<|channel>thought") || strstr(s, "<|channel>' + ")) return KTC_THINK_GEMMA4;
    if (strstr(s, "<mm:think>")) return KTC_THINK_MM;
    if (strstr(s, "open_tag('think'")) return KTC_THINK_KIMI_K3;
    if (strstr(s, "[BEGIN FINAL RESPONSE]")) return KTC_THINK_APRIEL;
    if (strstr(s, "<|think|>")) return KTC_THINK_SOLAR;
    if (strstr(s, "<think") && strstr(s, ":opensource")) return KTC_THINK_HY3; /* built as Hy3's tool markers */
    if (strstr(s, "<think>") || strstr(s, "</think>")) return KTC_THINK_TAGS;
    if (strstr(s, "[THINK]")) return KTC_THINK_MISTRAL;
    if (strstr(s, "<|START_THINKING|>")) return KTC_THINK_COHERE;
    return KTC_THINK_NONE;
}

bool ktc_needs_special(ktc_format f) {
    return f == KTC_LLAMA3 || f == KTC_MISTRAL || f == KTC_MISTRAL_V11 || f == KTC_HARMONY || f == KTC_DEEPSEEK ||
           f == KTC_KIMI_K2 || f == KTC_COMMAND_R || f == KTC_GRANITE || f == KTC_SEED_OSS || f == KTC_MINIMAX_M2 ||
           f == KTC_PHI4 || f == KTC_DSML || f == KTC_DSML_V4 || f == KTC_HY3 || f == KTC_NEMOTRON_V2 || f == KTC_GIGACHAT3 ||
           f == KTC_GIGACHAT31 || f == KTC_APERTUS || f == KTC_SOLAR || f == KTC_FUNCTIONARY31 || f == KTC_LFM2 || f == KTC_GEMMA4 ||
           f == KTC_MINIMAX_M3 || f == KTC_KIMI_K3 || f == KTC_MUSE_GLIMMER || f == KTC_PYTHONIC;
}

const char *ktc_trigger(ktc_format f) {
    switch (f) {
    case KTC_HERMES: case KTC_QWEN3_CODER: case KTC_GLM45: return "<tool_call>";
    case KTC_LLAMA3: return "{\"name\"";
    case KTC_MISTRAL: case KTC_MISTRAL_V11: return "[TOOL_CALLS]";
    case KTC_HARMONY: return " to=functions.";
    case KTC_DEEPSEEK: return "<｜tool▁calls▁begin｜>";
    case KTC_KIMI_K2: return "<|tool_calls_section_begin|>";
    case KTC_COMMAND_R: return "<|START_ACTION|>";
    case KTC_GRANITE: case KTC_PHI4: return "<|tool_call|>";
    case KTC_SEED_OSS: return "<seed:tool_call>";
    case KTC_MINIMAX_M2: return "<minimax:tool_call>";
    case KTC_COMMAND_R_PLUS: return "Action:";
    case KTC_FIREFUNCTION: return "functools";
    case KTC_DSML: return "<｜DSML｜function_calls>";
    case KTC_DSML_V4: return "<｜DSML｜tool_calls>";
    case KTC_MINICPM5: return "<function name=\"";
    case KTC_HY3: return "<tool_calls:opensource>";
    case KTC_APRIEL: case KTC_MINIMAX_M1: return "<tool_calls>";
    case KTC_NEMOTRON_V2: return "<TOOLCALL>";
    case KTC_GIGACHAT3: return "function call<|role_sep|>";
    case KTC_GIGACHAT31: return "<|function_call|>";
    case KTC_APERTUS: return "<|tools_prefix|>";
    case KTC_SOLAR: return "<|tool_calls|>";
    case KTC_FUNCTIONARY31: return "<function=";
    case KTC_FUNCTIONARY32: return ">>>";
    case KTC_LFM2: return "<|tool_call_start|>";
    case KTC_GEMMA4: return "<|tool_call>";
    case KTC_MINIMAX_M3: return "]<]minimax[>[<tool_call>";
    case KTC_KIMI_K3: return "<|open|>tools<|sep|>";
    case KTC_MUSE_GLIMMER: return "<atem:function_calls>";
    case KTC_PYTHONIC: return "["; /* (at the output's start only: a forced call's prefix, no lazy trigger) */
    default: return NULL;
    }
}

static const char *think_open(ktc_reasoning r) {
    return r == KTC_THINK_GEMMA4    ? "<|channel>thought"
           : r == KTC_THINK_MM      ? "<mm:think>"
           : r == KTC_THINK_KIMI_K3 ? "<|open|>think<|sep|>"
           : r == KTC_THINK_APRIEL  ? "Here are my reasoning steps:"
           : r == KTC_THINK_SOLAR   ? "<|think|>"
           : r == KTC_THINK_MISTRAL  ? "[THINK]"
           : r == KTC_THINK_COHERE ? "<|START_THINKING|>"
           : r == KTC_THINK_SEED   ? "<seed:think>"
           : r == KTC_THINK_HY3    ? "<think:opensource>"
                                   : "<think>";
}
static const char *think_close(ktc_reasoning r) {
    return r == KTC_THINK_GEMMA4    ? "<channel|>"
           : r == KTC_THINK_MM      ? "</mm:think>"
           : r == KTC_THINK_KIMI_K3 ? "<|close|>think<|sep|>"
           : r == KTC_THINK_APRIEL  ? "[BEGIN FINAL RESPONSE]"
           : r == KTC_THINK_SOLAR   ? "<|end|>"
           : r == KTC_THINK_MISTRAL  ? "[/THINK]"
           : r == KTC_THINK_COHERE ? "<|END_THINKING|>"
           : r == KTC_THINK_SEED   ? "</seed:think>"
           : r == KTC_THINK_HY3    ? "</think:opensource>"
                                   : "</think>";
}

void ktc_think_markers(ktc_format f, ktc_reasoning r, const char **open, const char **close) {
    *open = *close = NULL;
    if (f == KTC_HARMONY) *open = "<|channel|>analysis<|message|>", *close = "<|end|>";
    else if (f == KTC_MUSE_GLIMMER) *open = " to=self<|message|>", *close = "<|eom|>";
    else if (r != KTC_THINK_NONE) *open = think_open(r), *close = think_close(r);
}

static bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

bool ktc_prompt_opens_think(ktc_reasoning r, const char *prompt) {
    if (r == KTC_THINK_NONE || !prompt) return false;
    size_t n = strlen(prompt);
    while (n && is_ws(prompt[n - 1])) n--;
    const char *o = think_open(r);
    size_t k = strlen(o);
    return n >= k && !memcmp(prompt + n - k, o, k);
}

/* ---------------------------------------------------------------- the parse state */

typedef struct {
    char *p;
    size_t n, cap;
} buf;

typedef struct {
    const ktc_syntax *syn;
    const char *t;
    size_t n;
    bool partial;
    buf content, reasoning;
    ktc_call *calls;
    int n_calls, cap_calls;
    bool oom;
} P;

/* false: out of memory */
static bool buf_grow_add(buf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) return false;
        b->p = q;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return true;
}

static void buf_add(P *p, buf *b, const char *s, size_t n) {
    if (!p->oom && n && !buf_grow_add(b, s, n)) p->oom = true;
}

static void plain(P *p, size_t from, size_t to) {
    if (to > from) buf_add(p, &p->content, p->t + from, to - from);
}

static char *dup_n(P *p, const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (!d) {
        p->oom = true;
        return NULL;
    }
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

/* Takes name and args (malloc'ed). */
static void add_call(P *p, char *name, char *args) {
    if (p->oom || !name || !args) {
        free(name), free(args);
        p->oom = true;
        return;
    }
    if (p->n_calls == p->cap_calls) {
        int cap = p->cap_calls ? p->cap_calls * 2 : 4;
        ktc_call *c = realloc(p->calls, sizeof *c * (size_t)cap);
        if (!c) {
            free(name), free(args);
            p->oom = true;
            return;
        }
        p->calls = c;
        p->cap_calls = cap;
    }
    p->calls[p->n_calls++] = (ktc_call){name, args};
}

/* Name and arguments as slices of the text (arguments right-trimmed: a
 * partial value's trailing whitespace is held back). */
static void add_call_slices(P *p, const char *name, size_t nn, size_t a0, size_t a1) {
    while (nn && is_ws(name[nn - 1])) nn--;
    while (nn && is_ws(*name)) name++, nn--;
    while (a1 > a0 && is_ws(p->t[a1 - 1])) a1--;
    add_call(p, dup_n(p, name, nn), dup_n(p, p->t + a0, a1 - a0));
}

static size_t find(const P *p, size_t from, const char *m) {
    if (from >= p->n) return NPOS;
    const char *r = memmem(p->t + from, p->n - from, m, strlen(m));
    return r ? (size_t)(r - p->t) : NPOS;
}

static bool at(const P *p, size_t i, const char *m) {
    size_t k = strlen(m);
    return i + k <= p->n && !memcmp(p->t + i, m, k);
}

/* partial, and t[i..n) is a proper prefix of m (it may still become m) */
static bool may_become(const P *p, size_t i, const char *m) {
    size_t k = strlen(m), r = p->n - i;
    return p->partial && r < k && !memcmp(p->t + i, m, r);
}

/* The length of the longest end of t[from..n) that begins m: held back
 * while the output grows (partial); at the output's end (cut by max_tokens
 * inside a marker, "<|tool_call_be") trimmed as well when it is 2
 * characters or more (a lone "<" or "[" is more likely text), so the whole
 * parse and the streamed deltas drop it alike. */
static size_t cut_in_char(const P *p, size_t from, const char *m);

static size_t held(const P *p, size_t from, const char *m) {
    size_t c = cut_in_char(p, from, m);
    if (c) return c;
    size_t k = strlen(m);
    for (size_t l = k - 1; l > 0; l--)
        if (l <= p->n - from && !memcmp(p->t + p->n - l, m, l)) return p->partial || l >= 2 ? l : 0;
    return 0;
}

/* The whole output ends with m's first l bytes (2 or more) and U+FFFD, the
 * detokenizer's flush of m's next character cut inside its bytes (a
 * marker spelled byte by byte, "<｜tool▁calls▁end" and half of "｜"): l + 3,
 * the length to trim; else 0. */
static size_t cut_in_char(const P *p, size_t from, const char *m) {
    if (p->partial || p->n < from + 5 || memcmp(p->t + p->n - 3, "\xEF\xBF\xBD", 3)) return 0;
    size_t r = p->n - 3 - from;
    for (size_t l = strlen(m) - 1; l >= 2; l--)
        if (l <= r && (unsigned char)m[l] >= 0xC0 && !memcmp(p->t + p->n - 3 - l, m, l)) return l + 3;
    return 0;
}

/* The whole output (max_tokens) ends at j inside marker m: t[j..n) is m's
 * start, 2 characters or more, or that and a character cut in its bytes
 * (cut_in_char). Such an end is trimmed, as a marker's start is (held). */
static bool cut_inside(const P *p, size_t j, const char *m) {
    if (p->partial || j >= p->n) return false;
    size_t r = p->n - j;
    return (r >= 2 && r < strlen(m) && !memcmp(p->t + j, m, r)) || cut_in_char(p, j, m) == r;
}

static size_t skip_ws(const P *p, size_t i) {
    while (i < p->n && is_ws(p->t[i])) i++;
    return i;
}

/* The earliest of markers m[0..k) at or after from: its index (*which), or NPOS. */
static size_t find_first(const P *p, size_t from, const char *const *m, int k, int *which) {
    size_t best = NPOS;
    for (int i = 0; i < k; i++) {
        size_t f = find(p, from, m[i]);
        if (f < best) best = f, *which = i;
    }
    return best;
}

/* Content from `from` to the end, holding back a partial marker. */
static void plain_rest(P *p, size_t from, const char *const *m, int k) {
    size_t h = 0;
    for (int i = 0; i < k; i++) {
        size_t x = held(p, from, m[i]);
        if (x > h) h = x;
    }
    plain(p, from, p->n - h);
}

/* j past the closing marker m there; j when there is none; NPOS (stop) when
 * the text may still become it; the output's end when max_tokens cut it
 * inside m (cut_inside: "</tool_", trimmed). */
static size_t past(const P *p, size_t j, const char *m) {
    return at(p, j, m) ? j + strlen(m) : may_become(p, j, m) ? NPOS : cut_inside(p, j, m) ? p->n : j;
}

/* What follows a marker is not a call (the marker formats' steps). */
#define NOT_CALL (NPOS - 1)

/* A marker format's step at marker m[w] found at `at` (the content before it
 * added): where to go on (past its calls), NPOS (stop: the rest is partial
 * or reported), or NOT_CALL (the text from the marker to *resume stays
 * content, and the search goes on there). */
typedef size_t (*marker_step)(P *p, size_t at, int w, const void *ud, size_t *resume);

/* The loop of the formats whose calls follow start markers: content up to
 * the first of m[0..k) (a partial marker at the end held back), the calls
 * after it (step), and again from where they end. */
static void each_marker(P *p, size_t i, const char *const *m, int k, marker_step step, const void *ud) {
    for (;;) {
        int w = 0;
        size_t at_m = find_first(p, i, m, k, &w);
        if (at_m == NPOS) return plain_rest(p, i, m, k);
        plain(p, i, at_m);
        size_t resume = at_m, e = step(p, at_m, w, ud, &resume);
        if (e == NPOS) return;
        if (e != NOT_CALL && e <= at_m) e = NOT_CALL; /* nothing taken (functionary v3.1's "<function=" then no call) */
        if (e == NOT_CALL) { /* the marker at least stays text, so the search moves on */
            if (resume <= at_m) resume = at_m + strlen(m[w]);
            plain(p, at_m, resume);
            e = resume;
        }
        i = e;
    }
}

/* ---------------------------------------------------------------- JSON extents */

/* The extent of the JSON value at i (after whitespace): [*s, *e). Returns
 * 1 complete, 0 the text ends inside it, -1 not a JSON value. Validation is
 * cJSON's, later; this only finds where the value ends. */
static int json_value(const P *p, size_t i, size_t *s, size_t *e) {
    i = skip_ws(p, i);
    *s = *e = i;
    if (i >= p->n) return 0;
    const char *t = p->t;
    char c = t[i];
    if (c == '{' || c == '[' || c == '"') {
        int depth = 0;
        bool str = false, esc = false;
        for (size_t j = i; j < p->n; j++) {
            char d = t[j];
            if (str) {
                if (esc) esc = false;
                else if (d == '\\') esc = true;
                else if (d == '"') {
                    str = false;
                    if (depth == 0) {
                        *e = j + 1;
                        return 1;
                    }
                }
                continue;
            }
            if (d == '"') str = true;
            else if (d == '{' || d == '[') depth++;
            else if (d == '}' || d == ']') {
                if (--depth == 0) {
                    *e = j + 1;
                    return 1;
                }
            }
        }
        *e = p->n;
        return 0;
    }
    if (c == '-' || (c >= '0' && c <= '9') || c == 't' || c == 'f' || c == 'n') {
        size_t j = i;
        while (j < p->n && (strchr("+-.eE", t[j]) || (t[j] >= '0' && t[j] <= '9') || (t[j] >= 'a' && t[j] <= 'z'))) j++;
        *e = j;
        return j < p->n || !p->partial ? 1 : 0;
    }
    return -1;
}

/* A complete JSON slice: parsed (NULL: invalid). */
static cJSON *json_parse(const P *p, size_t s, size_t e) { return cJSON_ParseWithLength(p->t + s, e - s); }

typedef struct {
    bool has_name;
    char *name;       /* decoded (malloc'ed) */
    int args;         /* -1 none yet, 0 partial, 1 complete */
    size_t a0, a1;    /* the arguments' slice */
    size_t end;       /* after the object's '}' */
} jcall;

static bool key_is(const P *p, size_t s, size_t e, const char *k) {
    size_t n = strlen(k);
    return e - s == n + 2 && !memcmp(p->t + s + 1, k, n);
}

/* A {"name": "..", "arguments"|"parameters": {..}} object at i (other keys,
 * e.g. "id" or "type", ignored). Returns 1 complete, 0 incomplete, -1 not a
 * call object (its first key is none of the call's). */
static int json_call(P *p, size_t i, jcall *c) {
    *c = (jcall){.args = -1};
    i = skip_ws(p, i);
    if (i >= p->n) return 0;
    if (p->t[i] != '{') return -1;
    i++;
    bool first = true;
    for (;;) {
        i = skip_ws(p, i);
        if (i >= p->n) return 0;
        if (p->t[i] == '}') {
            c->end = i + 1;
            return 1;
        }
        if (p->t[i] == ',') {
            i++;
            continue;
        }
        size_t ks, ke, vs, ve;
        int r = json_value(p, i, &ks, &ke);
        if (r < 0 || p->t[ks] != '"') goto bad;
        if (r == 0) return 0; /* the key is being written */
        bool is_name = key_is(p, ks, ke, "name") || key_is(p, ks, ke, "tool_name"),
             is_args = key_is(p, ks, ke, "arguments") || key_is(p, ks, ke, "parameters");
        if (first && !is_name && !is_args && !key_is(p, ks, ke, "type") && !key_is(p, ks, ke, "id") &&
            !key_is(p, ks, ke, "tool_call_id"))
            goto bad;
        first = false;
        i = skip_ws(p, ke);
        if (i >= p->n) return 0;
        if (p->t[i] != ':') goto bad;
        r = json_value(p, i + 1, &vs, &ve);
        if (r < 0) goto bad;
        if (is_args) {
            c->args = r;
            c->a0 = vs, c->a1 = ve;
        }
        if (r == 0) return 0;
        if (is_name && p->t[vs] == '"' && !c->has_name) {
            cJSON *v = json_parse(p, vs, ve);
            if (!cJSON_IsString(v)) {
                cJSON_Delete(v);
                goto bad;
            }
            c->name = strdup(v->valuestring);
            cJSON_Delete(v);
            if (!c->name) p->oom = true;
            c->has_name = true;
        }
        i = ve;
    }
bad:
    free(c->name);
    c->name = NULL;
    c->has_name = false;
    return -1;
}

/* Reports a call of a walked object: complete ones with checked arguments
 * (a string holding JSON is taken as that JSON), incomplete ones once the
 * name is known. Returns false (nothing added) when a complete object is
 * not a valid call. Consumes c->name. */
static bool report_jcall(P *p, jcall *c, bool complete) {
    if (!c->has_name) {
        free(c->name);
        return !complete;
    }
    if (!complete) {
        if (c->args < 0) add_call(p, c->name, dup_n(p, "", 0));
        else add_call_slices(p, c->name, strlen(c->name), c->a0, c->a1), free(c->name);
        return true;
    }
    if (c->args < 0) {
        add_call(p, c->name, dup_n(p, "{}", 2));
        return true;
    }
    cJSON *v = json_parse(p, c->a0, c->a1);
    if (cJSON_IsString(v)) { /* arguments as a JSON string */
        cJSON *in = cJSON_Parse(v->valuestring);
        bool ok = cJSON_IsObject(in);
        cJSON_Delete(in);
        if (ok) add_call(p, c->name, dup_n(p, v->valuestring, strlen(v->valuestring)));
        else free(c->name);
        cJSON_Delete(v);
        return ok;
    }
    bool ok = cJSON_IsObject(v);
    cJSON_Delete(v);
    if (ok) add_call_slices(p, c->name, strlen(c->name), c->a0, c->a1);
    free(c->name);
    return ok;
}

/* ---------------------------------------------------------------- formats */

/* Hermes: <tool_call>{json}</tool_call>, repeated. */
static size_t hermes_step(P *p, size_t k, int w, const void *ud, size_t *resume) {
    (void)w, (void)ud;
    size_t j = k + strlen("<tool_call>");
    jcall c;
    int r = json_call(p, j, &c);
    if (r == 0) {
        report_jcall(p, &c, false);
        return NPOS;
    }
    if (r < 0 || !report_jcall(p, &c, true)) { /* not a call: the text stays */
        *resume = j;
        return NOT_CALL;
    }
    size_t i = skip_ws(p, c.end);
    return past(p, i, "</tool_call>");
}

static void fmt_hermes(P *p, size_t i) {
    static const char *const m[] = {"<tool_call>"};
    each_marker(p, i, m, 1, hermes_step, NULL);
}

/* Llama 3.x: a {"name": .., "parameters": ..} object opening the output
 * (more after ';' or whitespace), or after <|python_tag|>. */
static void fmt_llama3(P *p, size_t i) {
    static const char *const m[] = {"<|python_tag|>"};
    bool expect = true; /* where a bare JSON call may start */
    for (;;) {
        size_t j = skip_ws(p, i);
        if (at(p, j, m[0])) j = skip_ws(p, j + strlen(m[0])), expect = true;
        else if (may_become(p, j, m[0])) return;
        if (expect && j < p->n && p->t[j] == '{') {
            jcall c;
            int r = json_call(p, j, &c);
            if (r == 0 && p->partial) {
                report_jcall(p, &c, false);
                return;
            }
            if (r == 0 && c.has_name) {
                report_jcall(p, &c, false);
                return;
            }
            if (r > 0 && report_jcall(p, &c, true)) {
                i = skip_ws(p, c.end);
                if (i < p->n && p->t[i] == ';') i++;
                continue;
            }
        } else if (expect && j == p->n && p->partial) {
            return;
        }
        expect = false;
        size_t k = find(p, j, m[0]);
        if (k == NPOS) return plain_rest(p, i, m, 1);
        plain(p, i, k);
        i = k;
    }
}

/* A JSON list (or a lone object) of call objects at j, reported: the index
 * after it, or NPOS (stop: a call still being written). */
static size_t json_call_list(P *p, size_t j) {
    bool list = p->t[j] == '[';
    if (list) j++;
    for (;;) {
        jcall c;
        int r = json_call(p, j, &c);
        if (r == 0) {
            report_jcall(p, &c, false);
            return NPOS;
        }
        if (r < 0 || !report_jcall(p, &c, true)) break;
        j = skip_ws(p, c.end);
        if (!list) break;
        if (j < p->n && p->t[j] == ',') {
            j++;
            continue;
        }
        if (j < p->n && p->t[j] == ']') j++;
        break;
    }
    return j;
}

/* Command R7B / A: <|START_ACTION|>[{"tool_call_id": .., "tool_name": ..,
 * "parameters": {..}}, ..]<|END_ACTION|>; the answer between
 * <|START_RESPONSE|> and <|END_RESPONSE|> (Cohere2 MoE: <|START_TEXT|> and
 * <|END_TEXT|>; markers dropped). */
static const char *const k_command_r[] = {"<|START_ACTION|>", "<|START_RESPONSE|>", "<|END_RESPONSE|>", "<|START_TEXT|>",
                                          "<|END_TEXT|>"};

static size_t command_r_step(P *p, size_t k, int w, const void *ud, size_t *resume) {
    (void)ud, (void)resume;
    size_t i = k + strlen(k_command_r[w]);
    if (w) return i; /* the answer's markers: dropped */
    size_t j = skip_ws(p, i);
    if (j >= p->n) return NPOS;
    if ((i = json_call_list(p, j)) == NPOS) return NPOS;
    i = skip_ws(p, i);
    return past(p, i, "<|END_ACTION|>");
}

static void fmt_command_r(P *p, size_t i) { each_marker(p, i, k_command_r, 5, command_r_step, NULL); }

/* Mistral: [TOOL_CALLS] then a JSON list (or object) of calls (v3), or
 * NAME[CALL_ID]ID[ARGS]{json} (v11), repeated. Granite 3.x: <|tool_call|>
 * then a JSON list (named false: no v11 form). */
typedef struct {
    const char *marker;
    bool named;
} marker_list_fmt;

static size_t marker_list_step(P *p, size_t k, int w0, const void *ud, size_t *resume) {
    (void)w0;
    const marker_list_fmt *f = ud;
    size_t j = skip_ws(p, k + strlen(f->marker));
    if (j >= p->n) return NPOS;
    if (p->t[j] == '[' || p->t[j] == '{') return json_call_list(p, j); /* v3: a list of objects */
    if (!f->named) { /* not a call: the text stays */
        *resume = j;
        return NOT_CALL;
    }
    /* v11: the name runs to [CALL_ID] or [ARGS] */
    static const char *const sep[] = {"[ARGS]", "[CALL_ID]"};
    int w = 0;
    size_t e = find_first(p, j, sep, 2, &w);
    if (e == NPOS) return NPOS; /* the name is not complete */
    size_t a = e + strlen(sep[w]);
    if (w == 1) {
        size_t e2 = find(p, a, "[ARGS]");
        if (e2 == NPOS) {
            if (p->partial) return NPOS;
            e2 = p->n;
        }
        a = e2 + strlen("[ARGS]");
    }
    size_t vs, ve;
    int r = json_value(p, a, &vs, &ve);
    if (r <= 0) {
        if (r == 0) add_call_slices(p, p->t + j, e - j, vs, ve);
        return NPOS;
    }
    add_call_slices(p, p->t + j, e - j, vs, ve);
    return ve;
}

static void fmt_marker_list(P *p, size_t i, const char *marker, bool named) {
    const char *const m[] = {marker};
    marker_list_fmt f = {marker, named};
    each_marker(p, i, m, 1, marker_list_step, &f);
}

/* Phi-4-mini: <|tool_call|> then a JSON list (or object) of calls, closed
 * by <|/tool_call|>; or vLLM's functools[...] form (FireFunction v2's
 * own). Command R+: "Action:"
 * then a JSON list of {"tool_name", "parameters"} in a ```json fence; its
 * "directly-answer" pseudo-tool (the prompt's way to answer without tools)
 * is no call unless the request has such a tool. */
typedef struct {
    const char *const *m;
    int k;
    const char *close, *fence;
} json_after_fmt;

static size_t json_after_step(P *p, size_t at_m, int w, const void *ud, size_t *resume) {
    const json_after_fmt *f = ud;
    const char *close = f->close, *fence = f->fence;
    if (w >= f->k) return at_m + strlen(f->m[w]); /* m[k..k + n_drop): markers dropped */
    size_t j = skip_ws(p, at_m + strlen(f->m[w]));
    if (fence && at(p, j, fence)) j = skip_ws(p, j + strlen(fence));
    else if (fence && may_become(p, j, fence)) return NPOS;
    if (j >= p->n) return NPOS;
    if (p->t[j] != '[' && p->t[j] != '{') { /* not a call: the text stays */
        *resume = j;
        return NOT_CALL;
    }
    size_t i = json_call_list(p, j);
    if (i == NPOS) return NPOS;
    i = skip_ws(p, i);
    /* MiniMax-M1: one object a line up to the close */
    while (close && i < p->n && p->t[i] == '{') {
        size_t e = json_call_list(p, i);
        if (e == NPOS) return NPOS;
        if (e == i) break;
        i = skip_ws(p, e);
    }
    if (fence && at(p, i, "```")) i = skip_ws(p, i + 3);
    else if (fence && may_become(p, i, "```")) return NPOS;
    return close ? past(p, i, close) : i;
}

static void fmt_json_after(P *p, size_t i, const char *const *m, int k, int n_drop, const char *close, const char *fence) {
    json_after_fmt f = {m, k, close, fence};
    each_marker(p, i, m, k + n_drop, json_after_step, &f);
}

bool ktc_has_tool(const cJSON *tools, const char *name) {
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(t, "function"), "name");
        if (cJSON_IsString(n) && !strcmp(n->valuestring, name)) return true;
    }
    return false;
}

static void fmt_command_r_plus(P *p, size_t i) {
    static const char *const m[] = {"Action:", "<|CHATBOT_TOKEN|>", "<|END_OF_TURN_TOKEN|>"};
    fmt_json_after(p, i, m, 1, 2, NULL, "```json");
    int k = 0;
    for (int c = 0; c < p->n_calls; c++) {
        if (!strcmp(p->calls[c].name, "directly-answer") && !ktc_has_tool(p->syn->tools, "directly-answer")) {
            free(p->calls[c].name), free(p->calls[c].arguments);
            continue;
        }
        p->calls[k++] = p->calls[c];
    }
    p->n_calls = k;
}

/* Formats that wrap calls in a section: BEGIN (CALL_BEGIN call)* END, each
 * call parsed by .call from after CALL_BEGIN: the index after it (its end
 * marker too), NPOS (stop: partial or reported incomplete), or NOT_CALL. */

typedef struct {
    const char *begin, *call_begin, *end; /* begin and end NULL: calls one after another (functionary v3.1) */
    size_t (*call)(P *p, size_t j);
    const char *drop[4]; /* markers dropped from content (Kimi K3's response tags), NULL-ended */
} section_fmt;

static size_t section_step(P *p, size_t at_m, int w, const void *ud, size_t *resume) {
    (void)resume;
    const section_fmt *f = ud;
    if (w >= 2) return at_m + strlen(f->drop[w - 2]);
    size_t j = w == 0 && f->begin ? at_m + strlen(f->begin) : at_m;
    for (;;) {
        j = skip_ws(p, j);
        if (f->end && at(p, j, f->end)) {
            j += strlen(f->end);
            break;
        }
        if (j >= p->n || (f->end && may_become(p, j, f->end)) || may_become(p, j, f->call_begin)) return NPOS;
        /* the whole output cut inside the section's end (max_tokens: "<｜tool▁calls▁end"): trimmed, as a marker's start is */
        if (f->end && cut_inside(p, j, f->end)) return p->n;
        if (!at(p, j, f->call_begin)) break; /* stray text: content again */
        size_t e = f->call(p, j + strlen(f->call_begin));
        if (e == NPOS) return NPOS;
        if (e == NOT_CALL) break;
        j = e;
    }
    return j;
}

static void fmt_section(P *p, size_t i, const section_fmt *f) {
    const char *m[6] = {f->begin ? f->begin : f->call_begin, f->call_begin}; /* (models also drop the section markers) */
    int k = 2;
    for (int d = 0; d < 4 && f->drop[d]; d++) m[k++] = f->drop[d];
    each_marker(p, i, m, k, section_step, f);
}

/* A call's JSON arguments at a, then its end marker (after an optional
 * closing fence). */
static size_t json_args_then(P *p, const char *name, size_t nn, size_t a, const char *fence, const char *end) {
    size_t vs, ve;
    int r = json_value(p, a, &vs, &ve);
    if (r < 0) return NOT_CALL;
    add_call_slices(p, name, nn, vs, ve);
    if (r == 0) return NPOS;
    size_t j = skip_ws(p, ve);
    if (fence && at(p, j, fence)) j = skip_ws(p, j + strlen(fence));
    if (at(p, j, end)) return j + strlen(end);
    if (may_become(p, j, end) || (fence && may_become(p, j, fence))) return NPOS;
    return j;
}

/* DeepSeek: <｜tool▁calls▁begin｜> (<｜tool▁call▁begin｜>X<｜tool▁sep｜>Y<｜tool▁call▁end｜>)*
 * <｜tool▁calls▁end｜>: V3.1 writes NAME<sep>{json}; R1 writes
 * function<sep>NAME\n```json\n{json}\n```. */
static size_t deepseek_call(P *p, size_t j) {
    const char *sep = "<｜tool▁sep｜>";
    size_t s = find(p, j, sep);
    if (s == NPOS) return NPOS;
    size_t y = skip_ws(p, s + strlen(sep));
    if (y >= p->n) return NPOS;
    const char *name = p->t + j;
    size_t nn = s - j, a = y;
    if (p->t[y] != '{') { /* R1: the name on its own line, then a ```json block */
        size_t nl = find(p, y, "\n");
        if (nl == NPOS) return NPOS;
        name = p->t + y, nn = nl - y;
        a = skip_ws(p, nl);
        if (at(p, a, "```json")) a += 7;
        else if (may_become(p, a, "```json")) return NPOS;
    }
    return json_args_then(p, name, nn, a, "```", "<｜tool▁call▁end｜>");
}

static const section_fmt k_deepseek = {"<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁calls▁end｜>", deepseek_call, {NULL}};

/* Kimi K2: <|tool_calls_section_begin|> (<|tool_call_begin|>functions.NAME:I
 * <|tool_call_argument_begin|>{json}<|tool_call_end|>)* <|tool_calls_section_end|>. */
static size_t kimi_call(P *p, size_t j) {
    const char *ab = "<|tool_call_argument_begin|>";
    size_t s = find(p, j, ab);
    if (s == NPOS) return NPOS;
    /* the id: functions.NAME:INDEX */
    size_t n0 = skip_ws(p, j), n1 = s;
    while (n1 > n0 && is_ws(p->t[n1 - 1])) n1--;
    if (n1 - n0 > 10 && !memcmp(p->t + n0, "functions.", 10)) n0 += 10;
    for (size_t q = n1; q > n0; q--)
        if (p->t[q - 1] == ':') {
            n1 = q - 1;
            break;
        }
    return json_args_then(p, p->t + n0, n1 - n0, s + strlen(ab), NULL, "<|tool_call_end|>");
}

static const section_fmt k_kimi = {"<|tool_calls_section_begin|>", "<|tool_call_begin|>", "<|tool_calls_section_end|>", kimi_call, {NULL}};

/* The type a tool's schema gives parameter key of function name ("string",
 * "integer", ...; NULL when unknown). */
static const char *param_type(const cJSON *tools, const char *name, const char *key) {
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
        if (!f) f = t;
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(f, "name");
        if (!cJSON_IsString(n) || strcmp(n->valuestring, name)) continue;
        const cJSON *props = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(f, "parameters"), "properties");
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(props, key), "type");
        return cJSON_IsString(ty) ? ty->valuestring : NULL;
    }
    return NULL;
}

/* One parameter value written as text: a string when the schema says so
 * (or the text is not JSON), else the JSON value it spells. */
static cJSON *param_value(const P *p, const char *fn, const char *key, const char *v, size_t n) {
    const char *ty = param_type(p->syn->tools, fn, key);
    char *s = strndup(v, n);
    if (!s) return NULL;
    cJSON *r = NULL;
    if (!ty || strcmp(ty, "string")) r = cJSON_ParseWithOpts(s, NULL, true); /* the whole text ("2 dollars" is a string) */
    if (!r) r = cJSON_CreateString(s);
    free(s);
    return r;
}

/* A value whose writer says it is JSON: that, or the text when it is not JSON. */
static cJSON *json_or_string(const char *v, size_t n) {
    char *s = strndup(v, n);
    if (!s) return NULL;
    cJSON *r = cJSON_ParseWithOpts(s, NULL, true);
    if (!r) r = cJSON_CreateString(s);
    free(s);
    return r;
}

static cJSON *string_n(const char *v, size_t n) {
    char *s = strndup(v, n);
    cJSON *r = s ? cJSON_CreateString(s) : NULL;
    free(s);
    return r;
}

/* ---------------------------------------------------------------- arguments written as they come */

/* The JSON arguments of the formats that write parameters as tags or
 * literals (the XML formats, Kimi K3, LFM2, Gemma 4, MiniMax-M3), as text
 * that grows with the call: "{", then each "KEY":VALUE (cJSON's
 * unformatted print of each, so the whole is the print of the object the
 * pairs make), and "}" when the call closes. A key shows once it is
 * complete; its value while it is being written only when it is a string
 * (as the schema or the markup says; vLLM's and llama.cpp's streaming
 * parsers decide it so too): the text so far, escaped, the closing quote
 * missing. A value whose JSON depends on text not yet seen (a number, an
 * object, a type the text decides) is held until it closes. So a partial
 * call's arguments are a prefix of its final ones, and the stream sends
 * them as they are written, as OpenAI's API does. */
typedef struct {
    buf t;
    int n;       /* keys written */
    bool frozen; /* the text is final (Kimi K3's json block): later pairs are not added */
} jargs;

/* Appends v's print (consumes v; NULL: out of memory). */
static void ja_json(P *p, jargs *a, cJSON *v) {
    char *s = v ? cJSON_PrintUnformatted(v) : NULL;
    cJSON_Delete(v);
    if (!s) p->oom = true;
    else if (!a->frozen) buf_add(p, &a->t, s, strlen(s));
    free(s);
}

static void ja_key(P *p, jargs *a, const char *k, size_t n) {
    if (a->frozen) return;
    buf_add(p, &a->t, a->n++ ? "," : "{", 1);
    ja_json(p, a, string_n(k, n));
    buf_add(p, &a->t, ":", 1);
}

/* A string value being written: its text so far, escaped (cJSON escapes
 * byte by byte: the print of a prefix is a prefix of the print). */
static void ja_open_string(P *p, jargs *a, const char *s, size_t n) {
    if (a->frozen) return;
    cJSON *v = string_n(s, n);
    char *q = v ? cJSON_PrintUnformatted(v) : NULL;
    cJSON_Delete(v);
    if (!q) p->oom = true;
    else buf_add(p, &a->t, q, strlen(q) - 1);
    free(q);
}

/* A tagged text value [s, e) being written (e: where the text ends so far,
 * its end marker's start held back): the part the final value will begin
 * with (trim_nl: the final loses one newline at each end, so a trailing one
 * waits). */
static void ja_open_text(P *p, jargs *a, size_t s, size_t e, bool trim_nl) {
    if (trim_nl && e > s && p->t[s] == '\n') s++;
    if (trim_nl && e > s && p->t[e - 1] == '\n') e--;
    ja_open_string(p, a, p->t + s, e - s);
}

/* The arguments (malloc'ed; a->t taken): closed with "}" when the call is. */
static char *ja_take(P *p, jargs *a, bool closed) {
    if (closed && !a->frozen) buf_add(p, &a->t, a->n ? "}" : "{}", a->n ? 1 : 2);
    char *r = a->t.p ? a->t.p : dup_n(p, "", 0);
    a->t = (buf){0};
    return r;
}

/* Qwen3-Coder and GLM-4.5: parameters as tagged text, the object built when
 * the call closes. */
typedef struct {
    const char *call_open, *call_close; /* <tool_call> ... </tool_call> */
    const char *name_open, *name_close; /* Qwen3-Coder: <function= ... >; GLM: the text up to a newline or <arg_key> */
    const char *key_open, *key_close;   /* <parameter= ... >, <arg_key> ... </arg_key> */
    const char *val_open, *val_close;   /* "" ... </parameter>, <arg_value> ... </arg_value> */
    const char *fn_close;               /* </function>, or NULL */
    bool verbatim;                      /* values as written (Seed-OSS's template puts no newline round them) */
    bool string_attr;                   /* DSML: the key then ` string="true|false">`: a raw string or JSON */
    bool cdata;                         /* MiniCPM5: a value may be <![CDATA[..]]> (then it may hold val_close) */
} xml_fmt;

static const xml_fmt k_qwen3_coder = {"<tool_call>", "</tool_call>", "<function=", ">", "<parameter=", ">", "", "</parameter>",
                                      "</function>", false, false, false};
static const xml_fmt k_seed_oss = {"<seed:tool_call>", "</seed:tool_call>", "<function=", ">", "<parameter=", ">", "",
                                   "</parameter>", "</function>", true, false, false};
static const xml_fmt k_minimax_m2 = {"<minimax:tool_call>", "</minimax:tool_call>", "<invoke name=\"", "\">", "<parameter name=\"",
                                     "\">", "", "</parameter>", "</invoke>", false, false, false};
static const xml_fmt k_atem = {"<atem:function_calls>", "</atem:function_calls>", "<atem:invoke name=\"", "\">",
                               "<atem:parameter name=\"", "\">", "", "</atem:parameter>", "</atem:invoke>", false, false, false};
static const xml_fmt k_glm45 = {"<tool_call>", "</tool_call>", "", NULL, "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", NULL, false, false, false};
static const xml_fmt k_dsml = {"<｜DSML｜function_calls>", "</｜DSML｜function_calls>", "<｜DSML｜invoke name=\"", "\">",
                               "<｜DSML｜parameter name=\"", "\"", "", "</｜DSML｜parameter>", "</｜DSML｜invoke>", true, true, false};
static const xml_fmt k_dsml_v4 = {"<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>", "<｜DSML｜invoke name=\"", "\">",
                                  "<｜DSML｜parameter name=\"", "\"", "", "</｜DSML｜parameter>", "</｜DSML｜invoke>", true, true, false};
/* (no block round the calls: call_open is the call's own start, call_close empty) */
static const xml_fmt k_minicpm5 = {"<function name=\"", "", "<function name=\"", "\">", "<param name=\"", "\">", "", "</param>",
                                   "</function>", true, false, true};
/* Hy3: a block of calls, each NAME<tool_sep> then key/value pairs, the
 * values as the template writes them (no newline round them) */
static const xml_fmt k_hy3 = {"<tool_calls:opensource>", "</tool_calls:opensource>", "<tool_call:opensource>", "<tool_sep:opensource>",
                              "<arg_key:opensource>", "</arg_key:opensource>", "<arg_value:opensource>", "</arg_value:opensource>",
                              "</tool_call:opensource>", true, false, false};

static void strip_nl(const char **s, size_t *n) {
    if (*n && **s == '\n') (*s)++, (*n)--;
    if (*n && (*s)[*n - 1] == '\n') (*n)--;
}

/* Whether the schema makes parameter key of function fn a string (its value's text is then the string, whatever it spells). */
static bool param_is_string(const P *p, const char *fn, const char *key) {
    const char *ty = param_type(p->syn->tools, fn, key);
    return ty && !strcmp(ty, "string");
}

/* Returns the index after the call, NPOS (stop: partial, or reported), or
 * NOT_CALL. The arguments grow as the parameters are written (jargs). */
static size_t xml_call(P *p, const xml_fmt *f, size_t j) {
    j = skip_ws(p, j);
    size_t n0, n1;
    if (f->name_close) { /* <function=NAME> */
        if (!at(p, j, f->name_open)) return may_become(p, j, f->name_open) || j >= p->n ? NPOS : NOT_CALL;
        n0 = j + strlen(f->name_open);
        n1 = find(p, n0, f->name_close);
        if (n1 == NPOS) return NPOS;
        j = n1 + strlen(f->name_close);
    } else { /* GLM: NAME up to a newline, <arg_key> or the close */
        static const char *const ends[] = {"\n", "<arg_key>", "</tool_call>"};
        int w;
        n0 = j;
        n1 = find_first(p, j, ends, 3, &w);
        if (n1 == NPOS) return NPOS;
        j = n1;
    }
    while (n1 > n0 && is_ws(p->t[n1 - 1])) n1--;
    char *name = dup_n(p, p->t + n0, n1 - n0);
    if (!name) return NPOS;
    jargs a = {0};
    const char *close = f->fn_close ? f->fn_close : f->call_close;
    for (;;) {
        j = skip_ws(p, j);
        if (at(p, j, close) || (!p->partial && j >= p->n)) { /* the call is complete */
            if (at(p, j, close)) j += strlen(close);
            if (f->fn_close) {
                j = skip_ws(p, j);
                size_t q = past(p, j, f->call_close); /* (the rest held while it may become the block's close) */
                j = q == NPOS ? p->n : q;
            }
            add_call(p, name, ja_take(p, &a, true));
            return j;
        }
        if (!at(p, j, f->key_open)) break; /* incomplete (or malformed) */
        size_t k0 = j + strlen(f->key_open), k1 = find(p, k0, f->key_close);
        if (k1 == NPOS) break;
        char *key = dup_n(p, p->t + k0, k1 - k0);
        if (!key) break;
        ja_key(p, &a, key, strlen(key));
        size_t v0 = k1 + strlen(f->key_close);
        int as = -1; /* DSML: 1 string="true" (raw text), 0 string="false" (JSON) */
        if (f->string_attr) {
            static const char *const attr[] = {" string=\"true\">", " string=\"false\">"};
            if (at(p, v0, attr[0])) as = 1, v0 += strlen(attr[0]);
            else if (at(p, v0, attr[1])) as = 0, v0 += strlen(attr[1]);
            else { /* incomplete (or malformed) */
                free(key);
                break;
            }
        }
        bool str = as == 1 || (as < 0 && param_is_string(p, name, key)); /* its text is the string */
        v0 = *f->val_open ? skip_ws(p, v0) : v0;
        if (*f->val_open && !at(p, v0, f->val_open)) {
            free(key);
            break;
        }
        v0 += strlen(f->val_open);
        size_t vs = v0, ve = NPOS; /* the value's text (CDATA: inside the wrapper) */
        bool cd = f->cdata && at(p, v0, "<![CDATA["), undecided = !cd && f->cdata && may_become(p, v0, "<![CDATA[");
        if (cd) vs = v0 + 9, ve = find(p, vs, "]]>");
        size_t v1 = (cd && ve == NPOS) || undecided ? NPOS : find(p, cd ? ve + 3 : v0, f->val_close);
        if (v1 == NPOS) { /* the value being written */
            if (str && !undecided)
                ja_open_text(p, &a, vs, ve != NPOS ? ve : p->n - held(p, vs, cd ? "]]>" : f->val_close), !f->verbatim);
            free(key);
            break;
        }
        const char *v = p->t + vs;
        size_t vn = (ve != NPOS ? ve : v1) - vs;
        if (!f->verbatim) strip_nl(&v, &vn);
        ja_json(p, &a, as == 1 || str ? string_n(v, vn) : as == 0 ? json_or_string(v, vn) : param_value(p, name, key, v, vn));
        free(key);
        j = v1 + strlen(f->val_close);
    }
    add_call(p, name, ja_take(p, &a, false)); /* still being written */
    return NPOS;
}

static size_t xml_step(P *p, size_t k, int w, const void *ud, size_t *resume) {
    const xml_fmt *f = ud;
    bool bare = !strcmp(f->call_open, f->name_open); /* MiniCPM5: no block round the calls */
    size_t j = w == 0 && !bare ? k + strlen(f->call_open) : k; /* a bare <function=...> too */
    size_t e = xml_call(p, f, j);
    if (e == NOT_CALL) *resume = j;
    return e;
}

static void fmt_xml(P *p, size_t i, const xml_fmt *f) {
    const char *const m[] = {f->call_open, f->name_close ? f->name_open : f->call_open};
    each_marker(p, i, m, 2, xml_step, f);
}

/* gpt-oss Harmony: messages [<|start|>ROLE]HEADER<|message|>BODY<|end|>;
 * the header names the channel (<|channel|>analysis|commentary|final) and
 * a call's recipient (to=functions.NAME). <|call|> and <|return|> end the
 * generation (EOS: not in the text). */
static void fmt_harmony(P *p, size_t i) {
    static const char *const ends[] = {"<|end|>", "<|call|>", "<|return|>", "<|start|>"};
    while (i < p->n) {
        size_t h = i;
        if (at(p, h, "<|start|>")) h += strlen("<|start|>");
        else if (may_become(p, h, "<|start|>")) return;
        size_t mm = find(p, h, "<|message|>");
        bool header = mm != NPOS && mm - h < 512;
        if (header) {
            const char *ht = p->t + h;
            size_t hn = mm - h;
            header = memmem(ht, hn, "<|channel|>", 11) || memmem(ht, hn, "to=", 3);
        }
        if (!header) {
            static const char *const starts[] = {"<|channel|>", " to=", "to=", "assistant"};
            bool begun = p->partial && h == p->n;
            for (int q = 0; q < 4; q++) begun = begun || at(p, h, starts[q]) || may_become(p, h, starts[q]);
            if (mm == NPOS && p->partial && begun) return; /* a header being written */
            /* plain text (no channel): content up to the next message */
            size_t s = find(p, h, "<|start|>");
            if (s == NPOS) return plain_rest(p, h, ends + 3, 1);
            plain(p, h, s);
            i = s;
            continue;
        }
        const char *ht = p->t + h;
        size_t hn = mm - h;
        const char *to = memmem(ht, hn, "to=", 3);
        const char *ch = NULL; /* the last channel named ("commentary to=assistant<|channel|>analysis") */
        for (const char *q = ht; (q = memmem(q, (size_t)(ht + hn - q), "<|channel|>", 11)); q += 11) ch = q;
        /* a recipient that is not a function nor the conversation: a builtin
         * tool's call (container.exec, python, browser.*), no answer */
        bool builtin = false;
        if (to && !((size_t)(ht + hn - to) > 3 + 10 && !memcmp(to + 3, "functions.", 10))) {
            size_t rn = 0;
            while (to + 3 + rn < ht + hn && !is_ws(to[3 + rn]) && to[3 + rn] != '<') rn++;
            builtin = !((rn == 9 && !memcmp(to + 3, "assistant", 9)) || (rn == 4 && !memcmp(to + 3, "user", 4)));
        }
        size_t b0 = mm + strlen("<|message|>");
        int w = 0;
        size_t b1 = find_first(p, b0, ends, 4, &w);
        bool closed = b1 != NPOS;
        if (!closed) {
            b1 = p->n;
            for (int q = 0; q < 4; q++) {
                size_t x = held(p, b0, ends[q]);
                if (p->n - x < b1) b1 = p->n - x;
            }
        }
        if (to && (size_t)(ht + hn - to) > 3 + 10 && !memcmp(to + 3, "functions.", 10)) {
            const char *n0 = to + 13, *n1 = n0;
            while (n1 < ht + hn && !is_ws(*n1) && *n1 != '<') n1++;
            add_call_slices(p, n0, (size_t)(n1 - n0), b0, b1);
        } else if (builtin) {
            /* dropped */
        } else if (ch && (size_t)(ht + hn - ch) >= 11 + 8 && !memcmp(ch + 11, "analysis", 8)) {
            if (b1 > b0) buf_add(p, &p->reasoning, p->t + b0, b1 - b0);
        } else {
            plain(p, b0, b1);
        }
        if (!closed) return;
        i = b1 + (w == 3 ? 0 : strlen(ends[w]));
    }
}

/* ---------------------------------------------------------------- more formats (llama.cpp's common/parsers) */

/* Solar Open: <|tool_call:begin|>ID<|tool_call:name|>NAME<|tool_call:args|>{json}<|tool_call:end|> */
static size_t solar_call(P *p, size_t j) {
    size_t nm = find(p, j, "<|tool_call:name|>");
    if (nm == NPOS) return NPOS;
    size_t n0 = nm + strlen("<|tool_call:name|>"), a = find(p, n0, "<|tool_call:args|>");
    if (a == NPOS) return NPOS;
    return json_args_then(p, p->t + n0, a - n0, a + strlen("<|tool_call:args|>"), NULL, "<|tool_call:end|>");
}

static const section_fmt k_solar = {"<|tool_calls|>", "<|tool_call:begin|>", "<|calls|>", solar_call, {"<|begin|>assistant", "<|content|>"}};

/* functionary v3.1: <function=NAME>{json}</function>, one after another */
static size_t functionary31_call(P *p, size_t j) {
    size_t e = find(p, j, ">");
    if (e == NPOS) return p->partial && p->n - j < 128 ? NPOS : NOT_CALL;
    if (e - j > 128 || memchr(p->t + j, '\n', e - j)) return NOT_CALL;
    return json_args_then(p, p->t + j, e - j, e + 1, NULL, "</function>");
}

static const section_fmt k_functionary31 = {NULL, "<function=", NULL, functionary31_call, {"<|eom_id|>"}};

/* Kimi K3: <|open|>call tool="NAME" index="I"<|sep|> then <|open|>argument key="K" type="T"<|sep|>V<|close|>argument<|sep|>
 * (a "string" value as written, another as the JSON it spells) or <|open|>json type="object"<|sep|>{..}<|close|>json<|sep|>
 * (the arguments as written: the template writes one or the other; a block after arguments, or a second one, is not
 * taken), then <|close|>call<|sep|>. */
static size_t kimi_k3_call(P *p, size_t j) {
    static const char *const arg = "<|open|>argument key=\"", *const arg_end = "<|close|>argument<|sep|>",
                             *const blk = "<|open|>json type=\"object\"<|sep|>", *const blk_end = "<|close|>json<|sep|>";
    size_t q = find(p, j, "\"");
    if (q == NPOS) return NPOS;
    size_t sep = find(p, q, "<|sep|>");
    if (sep == NPOS) return NPOS;
    char *name = dup_n(p, p->t + j, q - j);
    if (!name) return NPOS;
    jargs a = {0};
    j = sep + strlen("<|sep|>");
    for (;;) {
        if (at(p, j, "<|close|>call<|sep|>")) {
            add_call(p, name, ja_take(p, &a, true));
            return j + strlen("<|close|>call<|sep|>");
        }
        if (at(p, j, blk)) {
            size_t b0 = j + strlen(blk), b1 = find(p, b0, blk_end);
            bool take = !a.n && !a.frozen;
            if (take) buf_add(p, &a.t, p->t + b0, (b1 != NPOS ? b1 : p->n - held(p, b0, blk_end)) - b0);
            a.frozen |= take;
            if (b1 == NPOS) break;
            j = b1 + strlen(blk_end);
            continue;
        }
        if (!at(p, j, arg)) break; /* incomplete (or malformed) */
        size_t k0 = j + strlen(arg), k1 = find(p, k0, "\"");
        if (k1 == NPOS || !at(p, k1, "\" type=\"")) break;
        size_t t0 = k1 + strlen("\" type=\""), t1 = find(p, t0, "\"<|sep|>");
        if (t1 == NPOS) break;
        bool str = t1 - t0 == 6 && !memcmp(p->t + t0, "string", 6);
        ja_key(p, &a, p->t + k0, k1 - k0);
        size_t v0 = t1 + strlen("\"<|sep|>"), v1 = find(p, v0, arg_end);
        if (v1 == NPOS) {
            if (str) ja_open_text(p, &a, v0, p->n - held(p, v0, arg_end), false);
            break;
        }
        ja_json(p, &a, str ? string_n(p->t + v0, v1 - v0) : json_or_string(p->t + v0, v1 - v0));
        j = v1 + strlen(arg_end);
    }
    add_call(p, name, ja_take(p, &a, false)); /* still being written */
    return NPOS;
}

static const section_fmt k_kimi_k3 = {"<|open|>tools<|sep|>", "<|open|>call tool=\"", "<|close|>tools<|sep|>", kimi_k3_call,
                                      {"<|open|>response<|sep|>", "<|close|>response<|sep|>", "<|close|>message<|sep|>", "<|end_of_msg|>"}};

/* Apertus: <|tools_prefix|>[{"NAME": {args}}, ..]<|tools_suffix|>: each call an object of one key, the name. */
static size_t apertus_step(P *p, size_t k, int w, const void *ud, size_t *resume) {
    (void)w, (void)ud;
    size_t j = skip_ws(p, k + strlen("<|tools_prefix|>"));
    if (j >= p->n) return NPOS;
    if (p->t[j] != '[') { /* not a call: the text stays */
        *resume = j;
        return NOT_CALL;
    }
    for (j++;;) {
        j = skip_ws(p, j);
        if (j >= p->n) return NPOS;
        if (p->t[j] == ',') {
            j++;
            continue;
        }
        if (p->t[j] == ']') {
            j = skip_ws(p, j + 1);
            break;
        }
        if (p->t[j] != '{') break;
        size_t ks, ke, vs, ve;
        int r = json_value(p, j + 1, &ks, &ke);
        if (r <= 0 || p->t[ks] != '"') {
            if (r == 0) return NPOS;
            break;
        }
        size_t c = skip_ws(p, ke);
        if (c >= p->n) return NPOS;
        if (p->t[c] != ':') break;
        cJSON *nm = json_parse(p, ks, ke);
        if (!cJSON_IsString(nm)) {
            cJSON_Delete(nm);
            break;
        }
        r = json_value(p, c + 1, &vs, &ve);
        if (r >= 0) add_call_slices(p, nm->valuestring, strlen(nm->valuestring), vs, ve);
        cJSON_Delete(nm);
        if (r <= 0) return NPOS;
        j = skip_ws(p, ve);
        if (j >= p->n) return NPOS;
        if (p->t[j] == '}') j++;
    }
    return past(p, j, "<|tools_suffix|>");
}

static void fmt_apertus(P *p, size_t i) {
    static const char *const m[] = {"<|tools_prefix|>"};
    each_marker(p, i, m, 1, apertus_step, NULL);
}

/* Literal values of the pythonic formats: LFM2's Python ('s', 1, True,
 * None, [..], {'k': v}) and Gemma 4's (<|"|>s<|"|>, 1, true, [..],
 * {k:v}). *i moves past the value. Returns 1 complete, 0 the text ends
 * inside it, -1 not a value. */
static int lit_value(P *p, size_t *i, bool gemma, cJSON **out);

/* gq: Gemma 4's <|"|> quotes, else Python's (or JSON's). part (NULL: not
 * wanted): the text so far of a string the text ends inside (returning 0),
 * decoded up to an escape not complete yet. */
static int lit_string(P *p, size_t *i, bool gq, cJSON **out, buf *part) {
    size_t j = *i;
    if (gq) {
        size_t e = find(p, j + 5, "<|\"|>");
        if (e == NPOS) {
            if (part) buf_add(p, part, p->t + j + 5, p->n - held(p, j + 5, "<|\"|>") - (j + 5));
            return 0;
        }
        *out = string_n(p->t + j + 5, e - j - 5);
        *i = e + 5;
        return *out ? 1 : -1;
    }
    char q = p->t[j];
    buf b = {0};
    for (j++; j < p->n && p->t[j] != q; j++) {
        char c = p->t[j];
        if (c == '\\') {
            if (++j >= p->n) break;
            c = p->t[j];
            if (c == 'u' && j + 4 >= p->n && p->partial) { /* its digits being written */
                j = p->n;
                break;
            }
            if (c == 'u' && j + 4 < p->n) { /* \uXXXX (JSON's; the BMP) as UTF-8 */
                char hex[5] = {0}, u8[3];
                memcpy(hex, p->t + j + 1, 4);
                char *end;
                unsigned long cp = strtoul(hex, &end, 16);
                if (end == hex + 4) {
                    size_t k = cp < 0x80 ? 1 : cp < 0x800 ? 2 : 3;
                    if (k == 1) u8[0] = (char)cp;
                    else if (k == 2) u8[0] = (char)(0xC0 | cp >> 6), u8[1] = (char)(0x80 | (cp & 0x3F));
                    else u8[0] = (char)(0xE0 | cp >> 12), u8[1] = (char)(0x80 | ((cp >> 6) & 0x3F)), u8[2] = (char)(0x80 | (cp & 0x3F));
                    buf_add(p, &b, u8, k);
                    j += 4;
                    continue;
                }
            }
            c = c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : c == 'b' ? '\b' : c == 'f' ? '\f' : c;
        }
        buf_add(p, &b, &c, 1);
    }
    if (j >= p->n) {
        if (part && b.n) buf_add(p, part, b.p, b.n);
        free(b.p);
        return 0;
    }
    *out = cJSON_CreateString(b.p ? b.p : "");
    free(b.p);
    *i = j + 1;
    return *out ? 1 : -1;
}

static int lit_value(P *p, size_t *i, bool gemma, cJSON **out) {
    *out = NULL;
    size_t j = skip_ws(p, *i);
    if (j >= p->n) return 0;
    char c = p->t[j];
    if (gemma ? at(p, j, "<|\"|>") || c == '"' : c == '\'' || c == '"') { /* (Gemma 4: a JSON string too) */
        *i = j;
        return lit_string(p, i, gemma && c == '<', out, NULL);
    }
    if (gemma && may_become(p, j, "<|\"|>")) return 0;
    if (c == '[' || c == '{') {
        bool obj = c == '{';
        cJSON *v = obj ? cJSON_CreateObject() : cJSON_CreateArray();
        for (j++;;) {
            j = skip_ws(p, j);
            if (j >= p->n) break;
            if (p->t[j] == ',') {
                j++;
                continue;
            }
            if (p->t[j] == (obj ? '}' : ']')) {
                *out = v;
                *i = j + 1;
                return 1;
            }
            char *key = NULL;
            if (obj) { /* 'k': (LFM2), k: or <|"|>k<|"|>: (Gemma 4) */
                cJSON *ks = NULL;
                if (gemma && !at(p, j, "<|\"|>") && p->t[j] != '"') {
                    size_t e = find(p, j, ":");
                    if (e == NPOS) break;
                    key = dup_n(p, p->t + j, e - j);
                    j = e;
                } else {
                    size_t k = j;
                    int r = (gemma || p->t[j] == '\'' || p->t[j] == '"') ? lit_string(p, &k, gemma && p->t[j] == '<', &ks, NULL) : -1;
                    if (r <= 0) {
                        cJSON_Delete(v);
                        return r;
                    }
                    key = strdup(ks->valuestring);
                    cJSON_Delete(ks);
                    j = skip_ws(p, k);
                }
                if (!key || j >= p->n || p->t[j] != ':') {
                    free(key);
                    if (j >= p->n) break;
                    cJSON_Delete(v);
                    return -1;
                }
                j++;
            }
            cJSON *e = NULL;
            int r = lit_value(p, &j, gemma, &e);
            if (r > 0 && obj) cJSON_AddItemToObject(v, key, e);
            else if (r > 0) cJSON_AddItemToArray(v, e);
            free(key);
            if (r <= 0) {
                cJSON_Delete(v);
                return r;
            }
        }
        cJSON_Delete(v);
        return 0;
    }
    /* a number or a word: True/False/None (Python), true/false/null */
    size_t e = j;
    while (e < p->n && (strchr("+-.eE_", p->t[e]) || (p->t[e] >= '0' && p->t[e] <= '9') || (p->t[e] >= 'a' && p->t[e] <= 'z') ||
                        (p->t[e] >= 'A' && p->t[e] <= 'Z')))
        e++;
    if (e == j) return -1;
    if (e == p->n && p->partial) return 0;
    size_t n = e - j;
    const char *w = p->t + j;
    if ((n == 4 && (!memcmp(w, "True", 4) || !memcmp(w, "true", 4)))) *out = cJSON_CreateTrue();
    else if (n == 5 && (!memcmp(w, "False", 5) || !memcmp(w, "false", 5))) *out = cJSON_CreateFalse();
    else if ((n == 4 && (!memcmp(w, "None", 4) || !memcmp(w, "null", 4)))) *out = cJSON_CreateNull();
    else {
        cJSON *num = json_or_string(w, n);
        if (!cJSON_IsNumber(num)) {
            cJSON_Delete(num);
            return -1;
        }
        *out = num;
    }
    *i = e;
    return *out ? 1 : -1;
}

/* One pythonic call at j: NAME(k=v, ..) (LFM2) or call:NAME{k:v,..} (Gemma 4, after "call:"), reported (its
 * arguments once it closes). Returns the index after it, NPOS (stop: partial, reported), or NOT_CALL. */
static size_t lit_call(P *p, size_t j, bool gemma) {
    size_t n0 = j, e = j;
    while (e < p->n && (p->t[e] == '_' || p->t[e] == '.' || p->t[e] == '-' || p->t[e] == ':' || (p->t[e] >= '0' && p->t[e] <= '9') ||
                        ((p->t[e] | 0x20) >= 'a' && (p->t[e] | 0x20) <= 'z')))
        e++;
    if (e == p->n) return p->partial ? NPOS : NOT_CALL;
    if (e == n0 || p->t[e] != (gemma ? '{' : '(')) return NOT_CALL;
    char *name = dup_n(p, p->t + n0, e - n0);
    if (!name) return NPOS;
    jargs a = {0};
    size_t i = e + 1;
    for (;;) {
        i = skip_ws(p, i);
        if (i >= p->n) break;
        if (p->t[i] == ',') {
            i++;
            continue;
        }
        if (p->t[i] == (gemma ? '}' : ')')) {
            add_call(p, name, ja_take(p, &a, true));
            return i + 1;
        }
        size_t k0 = i;
        while (i < p->n && p->t[i] != (gemma ? ':' : '=') && p->t[i] != ',' && p->t[i] != (gemma ? '}' : ')')) i++;
        if (i >= p->n) break;
        if (p->t[i] != (gemma ? ':' : '=')) {
            free(a.t.p), free(name);
            return NOT_CALL;
        }
        size_t k1 = i;
        while (k1 > k0 && is_ws(p->t[k1 - 1])) k1--;
        char *key = dup_n(p, p->t + k0, k1 - k0);
        if (!key) break;
        ja_key(p, &a, key, strlen(key));
        i = skip_ws(p, i + 1);
        cJSON *v = NULL;
        int r;
        char c = i < p->n ? p->t[i] : 0;
        if (gemma ? at(p, i, "<|\"|>") || c == '"' : c == '\'' || c == '"') { /* a string: streamed as it is written */
            buf part = {0};
            r = lit_string(p, &i, gemma && c == '<', &v, &part);
            if (r == 0) ja_open_string(p, &a, part.p ? part.p : "", part.n);
            free(part.p);
        } else {
            r = lit_value(p, &i, gemma, &v);
        }
        /* a "string" parameter written as a number stays a string (as the schema says) */
        if (r > 0 && param_is_string(p, name, key) && !cJSON_IsString(v) && !cJSON_IsNull(v)) {
            char *txt = cJSON_PrintUnformatted(v);
            cJSON_Delete(v);
            v = txt ? cJSON_CreateString(txt) : NULL;
            free(txt);
        }
        free(key);
        if (r > 0) ja_json(p, &a, v);
        else cJSON_Delete(v);
        if (r < 0) {
            free(a.t.p), free(name);
            return NOT_CALL;
        }
        if (r == 0) break;
    }
    add_call(p, name, ja_take(p, &a, false)); /* still being written */
    return NPOS;
}

/* A pythonic list of calls [NAME(k=v), ..] at j (its "["), reported: the
 * index after its "]", NPOS (stop: a call still being written), or
 * NOT_CALL (*at: where the text that is no call starts). */
static size_t lit_list(P *p, size_t j, size_t *at) {
    for (j++;;) {
        j = skip_ws(p, j);
        if (j >= p->n) return NPOS;
        if (p->t[j] == ',') {
            j++;
            continue;
        }
        if (p->t[j] == ']') return j + 1;
        size_t e = lit_call(p, j, false);
        if (e == NPOS || e == NOT_CALL) {
            *at = j;
            return e;
        }
        j = e;
    }
}

/* LFM2: <|tool_call_start|>[NAME(k=v), ..]<|tool_call_end|> (or one call without the list) */
static size_t lfm2_step(P *p, size_t k, int w, const void *ud, size_t *resume) {
    (void)w, (void)ud;
    size_t j = skip_ws(p, k + strlen("<|tool_call_start|>"));
    if (j >= p->n) return NPOS;
    size_t e = p->t[j] == '[' ? lit_list(p, j, resume) : lit_call(p, j, false);
    if (e == NOT_CALL && p->t[j] != '[') *resume = j; /* not a call: the text stays */
    if (e == NPOS || e == NOT_CALL) return e;
    return past(p, skip_ws(p, e), "<|tool_call_end|>");
}

static void fmt_lfm2(P *p, size_t i) {
    static const char *const m[] = {"<|tool_call_start|>"};
    each_marker(p, i, m, 1, lfm2_step, NULL);
}

/* Pythonic (Llama 4, Llama 3.2): the output, when it is a list of calls
 * [NAME(k=v), ..] from its start (after <|python_start|>, optional; then
 * <|python_end|>, optional), as vLLM's pythonic / llama4_pythonic parsers
 * take it; text that does not start so, or a list that is not of calls
 * ([1, 2], a Markdown link), is content (after a call taken, the rest:
 * a call once reported stays). */
static void fmt_pythonic(P *p, size_t i) {
    static const char *const m[] = {"<|python_start|>", "<|python_end|>"};
    size_t j = skip_ws(p, i);
    if (at(p, j, m[0])) j = skip_ws(p, j + strlen(m[0]));
    else if (may_become(p, j, m[0])) return;
    if (j >= p->n) {
        if (!p->partial) plain(p, i, p->n);
        return;
    }
    if (p->t[j] != '[') return plain(p, i, p->n);
    int c0 = p->n_calls;
    size_t bad = j, e = lit_list(p, j, &bad);
    if (e == NPOS) return;
    if (e == NOT_CALL || p->n_calls == c0) /* not calls: text (from the list's start, or after the calls taken, which stay) */
        return plain(p, p->n_calls > c0 ? bad : i, p->n);
    e = past(p, skip_ws(p, e), m[1]);
    if (e != NPOS) plain(p, e, p->n);
}

/* Gemma 4: <|tool_call>call:NAME{k:v,..}<tool_call|>, repeated */
static size_t gemma4_call(P *p, size_t j) {
    if (!at(p, j, "call:")) return may_become(p, j, "call:") || j >= p->n ? NPOS : NOT_CALL;
    size_t e = lit_call(p, j + 5, true);
    if (e == NPOS || e == NOT_CALL) return e;
    e = skip_ws(p, e);
    return past(p, e, "<tool_call|>");
}

static const section_fmt k_gemma4 = {NULL, "<|tool_call>", NULL, gemma4_call, {"<turn|>", "<|tool_response>"}};

/* MiniMax-M3: every tag after the namespace token NS = ]<]minimax[>[:
 * NS<tool_call> (NS<invoke name="NAME"> (NS<K>V NS</K>)* NS</invoke>)* NS</tool_call>;
 * a value of tags is an object, or a list when its tags are <item>; a
 * top-level text value is typed by the schema, a nested one is the JSON it
 * spells or a string. */
#define MM_NS "]<]minimax[>["

/* The value at *j up to NS</KEY> (not consumed): 1 complete, 0 partial, -1 malformed. */
static int mm3_value(P *p, size_t *j, int depth, const char *fn, const char *key, cJSON **out) {
    *out = NULL;
    size_t i = *j;
    if (at(p, i, MM_NS "<") && !at(p, i, MM_NS "</")) { /* tags: an object or a list */
        if (depth > 32) return -1;
        cJSON *v = NULL;
        while (at(p, i, MM_NS "<") && !at(p, i, MM_NS "</")) {
            size_t k0 = i + strlen(MM_NS "<"), k1 = find(p, k0, ">");
            if (k1 == NPOS) break;
            bool item = k1 - k0 == 4 && !memcmp(p->t + k0, "item", 4);
            if (!v) v = item ? cJSON_CreateArray() : cJSON_CreateObject();
            char *k = dup_n(p, p->t + k0, k1 - k0);
            size_t c = k1 + 1;
            cJSON *e = NULL;
            int r = k ? mm3_value(p, &c, depth + 1, NULL, NULL, &e) : -1;
            if (r > 0) {
                /* NS</k> */
                char close[160];
                snprintf(close, sizeof close, MM_NS "</%s>", k);
                if (!at(p, c, close)) r = may_become(p, c, close) || c >= p->n ? 0 : -1;
                else c += strlen(close);
            }
            if (r > 0 && cJSON_IsArray(v)) cJSON_AddItemToArray(v, e);
            else if (r > 0) cJSON_AddItemToObject(v, k, e);
            else cJSON_Delete(e);
            free(k);
            if (r <= 0) {
                cJSON_Delete(v);
                return r;
            }
            i = c;
        }
        if (!at(p, i, MM_NS "</")) {
            cJSON_Delete(v);
            return i >= p->n || may_become(p, i, MM_NS "</") ? 0 : -1;
        }
        *out = v;
        *j = i;
        return 1;
    }
    size_t e = find(p, i, MM_NS);
    if (e == NPOS) return 0;
    const char *t = p->t + i;
    size_t n = e - i;
    strip_nl(&t, &n);
    *out = fn ? param_value(p, fn, key, t, n) : json_or_string(t, n);
    *j = e;
    return *out ? 1 : -1;
}

static size_t mm3_call(P *p, size_t j) {
    size_t q = find(p, j, "\">");
    if (q == NPOS) return NPOS;
    char *name = dup_n(p, p->t + j, q - j);
    if (!name) return NPOS;
    jargs a = {0};
    j = q + 2;
    for (;;) {
        j = skip_ws(p, j);
        if (at(p, j, MM_NS "</invoke>")) {
            add_call(p, name, ja_take(p, &a, true));
            return j + strlen(MM_NS "</invoke>");
        }
        if (!at(p, j, MM_NS "<") || at(p, j, MM_NS "</")) break;
        size_t k0 = j + strlen(MM_NS "<"), k1 = find(p, k0, ">");
        if (k1 == NPOS) break;
        char *key = dup_n(p, p->t + k0, k1 - k0);
        if (!key) break;
        ja_key(p, &a, key, strlen(key));
        size_t c = k1 + 1;
        cJSON *v = NULL;
        int r = mm3_value(p, &c, 0, name, key, &v);
        char close[160];
        snprintf(close, sizeof close, MM_NS "</%s>", key);
        if (r > 0 && at(p, c, close)) {
            ja_json(p, &a, v);
            j = c + strlen(close);
        } else { /* being written (or malformed): a string's text so far, once it is text (not tags) */
            cJSON_Delete(v);
            if (k1 + 1 < p->n && !at(p, k1 + 1, MM_NS) && !may_become(p, k1 + 1, MM_NS) && param_is_string(p, name, key)) {
                size_t e = find(p, k1 + 1, MM_NS);
                ja_open_text(p, &a, k1 + 1, e != NPOS ? e : p->n - held(p, k1 + 1, MM_NS), true);
            }
            r = 0;
        }
        free(key);
        if (r <= 0) break;
    }
    add_call(p, name, ja_take(p, &a, false)); /* still being written (or malformed) */
    return NPOS;
}

static const section_fmt k_minimax_m3 = {MM_NS "<tool_call>", MM_NS "<invoke name=\"", MM_NS "</tool_call>", mm3_call, {NULL}};

/* functionary v3.2: >>>NAME\n{json} per call, >>>all\n before content;
 * the prompt ends with the first >>> (the output starts at a recipient) */
static void fmt_functionary32(P *p, size_t i) {
    static const char *const m[] = {">>>"};
    if (at(p, skip_ws(p, i), m[0])) i = skip_ws(p, i) + 3; /* the prompt's >>> given as the prefix */
    for (bool first = true;; first = false) {
        size_t k = first ? i : find(p, i, m[0]);
        if (k == NPOS) return plain_rest(p, i, m, 1);
        plain(p, i, k);
        size_t j = first ? k : k + 3, nl = find(p, j, "\n");
        if (nl == NPOS) {
            if (!p->partial) plain(p, k, p->n);
            return;
        }
        if (nl - j == 3 && !memcmp(p->t + j, "all", 3)) { /* content up to the next >>> */
            i = nl + 1;
            continue;
        }
        size_t vs, ve;
        int r = nl - j > 128 ? -1 : json_value(p, nl + 1, &vs, &ve);
        if (r < 0 || (r > 0 && p->t[vs] != '{')) { /* not a call: the text stays */
            plain(p, k, nl + 1);
            i = nl + 1;
            continue;
        }
        add_call_slices(p, p->t + j, nl - j, vs, ve);
        if (r == 0) return;
        i = ve;
    }
}

/* Muse Glimmer: messages [<|start|>assistant] to=RECIPIENT<|message|>BODY<|eom|> (more follow) or <|eot|> (the
 * prompt ends with <|start|>assistant): to=self is reasoning, to=user (or no recipient) content, another recipient a
 * tool, its body an <atem:function_calls> block (a block with no header too, as a forced call writes it). */
static void fmt_muse(P *p, size_t i) {
    static const char *const ends[] = {"<|eom|>", "<|eot|>"};
    while (i < p->n) {
        if (at(p, i, "<|start|>assistant")) i += strlen("<|start|>assistant");
        else if (may_become(p, i, "<|start|>assistant")) return;
        size_t b0 = i, rn = 0;
        const char *rcpt = NULL;
        if (at(p, i, " to=")) {
            size_t mm = find(p, i, "<|message|>");
            if (mm == NPOS) return; /* a header being written (or cut: dropped) */
            rcpt = p->t + i + 4, rn = mm - i - 4;
            b0 = mm + strlen("<|message|>");
        } else if (at(p, i, "<|message|>")) {
            b0 = i + strlen("<|message|>");
        } else if (may_become(p, i, " to=") || may_become(p, i, "<|message|>")) {
            return;
        }
        bool self = rn == 4 && !memcmp(rcpt, "self", 4), user = !rcpt || (rn == 4 && !memcmp(rcpt, "user", 4));
        size_t j = skip_ws(p, b0);
        if (!self && (at(p, j, k_atem.call_open) || ((!user || !rcpt) && may_become(p, j, k_atem.call_open)))) {
            if (!at(p, j, k_atem.call_open)) return; /* the block's start being written */
            size_t e = xml_call(p, &k_atem, j + strlen(k_atem.call_open));
            if (e == NPOS || e == NOT_CALL) return;
            i = skip_ws(p, e);
        } else {
            int w = 0;
            size_t b1 = find_first(p, b0, ends, 2, &w);
            size_t e = b1;
            if (b1 == NPOS) { /* the message still being written */
                b1 = p->n;
                for (int q = 0; q < 2; q++) {
                    size_t x = held(p, b0, ends[q]);
                    if (p->n - x < b1) b1 = p->n - x;
                }
                size_t x = held(p, b0, "<|start|>assistant");
                if (p->n - x < b1) b1 = p->n - x;
            }
            if (self) {
                if (b1 > b0) buf_add(p, &p->reasoning, p->t + b0, b1 - b0);
            } else if (user) {
                plain(p, b0, b1);
            } /* (a builtin recipient's message: dropped) */
            if (e == NPOS) return;
            i = e;
        }
        if (at(p, i, "<|eom|>") || at(p, i, "<|eot|>")) i += 7;
    }
}

/* ---------------------------------------------------------------- the parse */

static void trim(buf *b) {
    size_t s = 0;
    while (s < b->n && is_ws(b->p[s])) s++;
    size_t e = b->n;
    while (e > s && is_ws(b->p[e - 1])) e--;
    if (b->p) {
        memmove(b->p, b->p + s, e - s);
        b->p[e - s] = 0;
    }
    b->n = e - s;
}

/* Where a call starts, for ending a thinking block left open: the
 * format's trigger (and the bare call a model may write without it); none
 * for the formats without thinking. */
static int think_call_starts(ktc_format f, const char *out[2]) {
    if (f == KTC_LLAMA3 || f == KTC_COMMAND_R_PLUS || f == KTC_HARMONY || f == KTC_PYTHONIC || !ktc_trigger(f)) return 0;
    out[0] = ktc_trigger(f);
    if (f == KTC_KIMI_K2) return out[1] = "<|tool_call_begin|>", 2;
    if (f == KTC_QWEN3_CODER) return out[1] = "<function=", 2;
    return 1;
}

kiln_status ktc_parse(const ktc_syntax *s, const char *text, size_t n, bool partial, ktc_msg *m) {
    memset(m, 0, sizeof *m);
    if (s->prefix && *s->prefix) { /* the output as the prefix and the text */
        size_t np = strlen(s->prefix);
        char *t = malloc(np + n + 1);
        if (!t) return kiln_error(KILN_ENOMEM, "out of memory");
        memcpy(t, s->prefix, np);
        if (n) memcpy(t + np, text, n);
        t[np + n] = 0;
        ktc_syntax s2 = *s;
        s2.prefix = NULL;
        kiln_status st = ktc_parse(&s2, t, np + n, partial, m);
        free(t);
        return st;
    }
    P p = {.syn = s, .t = text, .n = n, .partial = partial};
    size_t i = 0;
    bool go = true;
    /* the thinking block first (Harmony's analysis channel is the format's) */
    if (s->reasoning != KTC_THINK_NONE && s->format != KTC_HARMONY && s->format != KTC_MUSE_GLIMMER) {
        const char *o = think_open(s->reasoning), *c = think_close(s->reasoning);
        bool in = s->think_open;
        size_t j = skip_ws(&p, 0);
        if (!in && at(&p, j, o)) in = true, i = j + strlen(o);
        else if (!in && (may_become(&p, j, o) || (partial && j == n))) go = false;
        /* A block left open (no close marker in the output) ends where a
         * call starts, as llama.cpp's parsers take it (Qwen3.5 and Ling
         * going straight to a call from the prompt's <think>, Kimi K2
         * calling inside its thinking): the lazy grammar switches on at
         * the trigger, thinking or not. With a close marker, a call's
         * markup before it is reasoning. While the output grows the text
         * from such a start is held back (a close may still come). */
        const char *starts[2];
        int ns = think_call_starts(s->format, starts);
        if (in && go) {
            size_t e = find(&p, i, c);
            int w;
            size_t k = e == NPOS && ns ? find_first(&p, i, starts, ns, &w) : NPOS;
            if (k != NPOS) {
                buf_add(&p, &p.reasoning, text + i, k - i);
                if (partial) go = false;
                else i = k;
            } else if (e == NPOS) {
                size_t h = held(&p, i, c);
                for (int t = 0; t < ns; t++)
                    if (held(&p, i, starts[t]) > h) h = held(&p, i, starts[t]);
                buf_add(&p, &p.reasoning, text + i, n - i - h);
                go = false;
            } else {
                buf_add(&p, &p.reasoning, text + i, e - i);
                i = e + strlen(c);
            }
        }
    }
    if (go) {
        switch (s->format) {
        case KTC_HERMES: fmt_hermes(&p, i); break;
        case KTC_LLAMA3: fmt_llama3(&p, i); break;
        case KTC_MISTRAL: case KTC_MISTRAL_V11: fmt_marker_list(&p, i, "[TOOL_CALLS]", true); break;
        case KTC_DEEPSEEK: fmt_section(&p, i, &k_deepseek); break;
        case KTC_KIMI_K2: fmt_section(&p, i, &k_kimi); break;
        case KTC_QWEN3_CODER: fmt_xml(&p, i, &k_qwen3_coder); break;
        case KTC_GLM45: fmt_xml(&p, i, &k_glm45); break;
        case KTC_HARMONY: fmt_harmony(&p, i); break;
        case KTC_COMMAND_R: fmt_command_r(&p, i); break;
        case KTC_GRANITE: fmt_marker_list(&p, i, "<|tool_call|>", false); break;
        case KTC_SEED_OSS: fmt_xml(&p, i, &k_seed_oss); break;
        case KTC_MINIMAX_M2: fmt_xml(&p, i, &k_minimax_m2); break;
        case KTC_DSML: fmt_xml(&p, i, &k_dsml); break;
        case KTC_DSML_V4: fmt_xml(&p, i, &k_dsml_v4); break;
        case KTC_MINICPM5: fmt_xml(&p, i, &k_minicpm5); break;
        case KTC_HY3: fmt_xml(&p, i, &k_hy3); break;
        case KTC_PHI4: {
            static const char *const phi[] = {"<|tool_call|>", "functools"};
            fmt_json_after(&p, i, phi, 2, 0, "<|/tool_call|>", NULL);
            break;
        }
        case KTC_FIREFUNCTION: {
            static const char *const ff[] = {"functools"};
            fmt_json_after(&p, i, ff, 1, 0, NULL, NULL);
            break;
        }
        case KTC_COMMAND_R_PLUS: fmt_command_r_plus(&p, i); break;
        case KTC_APRIEL: case KTC_MINIMAX_M1: {
            static const char *const ap[] = {"<tool_calls>", "[END FINAL RESPONSE]", "<end_of_sentence>"};
            fmt_json_after(&p, i, ap, 1, 2, "</tool_calls>", NULL);
            break;
        }
        case KTC_NEMOTRON_V2: {
            static const char *const nm[] = {"<TOOLCALL>"};
            fmt_json_after(&p, i, nm, 1, 0, "</TOOLCALL>", NULL);
            break;
        }
        case KTC_GIGACHAT3: case KTC_GIGACHAT31: {
            static const char *const g3[] = {"function call<|role_sep|>", "<|message_sep|>"}, *const g31[] = {"<|function_call|>", "<|message_sep|>"};
            fmt_json_after(&p, i, s->format == KTC_GIGACHAT3 ? g3 : g31, 1, 1, NULL, NULL);
            break;
        }
        case KTC_APERTUS: fmt_apertus(&p, i); break;
        case KTC_SOLAR: fmt_section(&p, i, &k_solar); break;
        case KTC_FUNCTIONARY31: fmt_section(&p, i, &k_functionary31); break;
        case KTC_FUNCTIONARY32: fmt_functionary32(&p, i); break;
        case KTC_LFM2: fmt_lfm2(&p, i); break;
        case KTC_GEMMA4: fmt_section(&p, i, &k_gemma4); break;
        case KTC_MINIMAX_M3: fmt_section(&p, i, &k_minimax_m3); break;
        case KTC_KIMI_K3: fmt_section(&p, i, &k_kimi_k3); break;
        case KTC_MUSE_GLIMMER: fmt_muse(&p, i); break;
        case KTC_PYTHONIC: fmt_pythonic(&p, i); break;
        default: plain(&p, i, n); break;
        }
    }
    trim(&p.content);
    trim(&p.reasoning);
    m->content = p.content.p ? p.content.p : calloc(1, 1);
    m->reasoning = p.reasoning.p ? p.reasoning.p : calloc(1, 1);
    m->n_content = p.content.n;
    m->n_reasoning = p.reasoning.n;
    m->calls = p.calls;
    m->n_calls = p.n_calls;
    if (p.oom || !m->content || !m->reasoning) {
        ktc_msg_free(m);
        return kiln_error(KILN_ENOMEM, "out of memory");
    }
    return NULL;
}

void ktc_msg_free(ktc_msg *m) {
    if (!m) return;
    free(m->content);
    free(m->reasoning);
    for (int i = 0; i < m->n_calls; i++) free(m->calls[i].name), free(m->calls[i].arguments);
    free(m->calls);
    memset(m, 0, sizeof *m);
}

/* ---------------------------------------------------------------- streaming */

struct ktc_stream {
    ktc_syntax syn;
    buf text;    /* everything fed */
    ktc_msg msg; /* the last parse */
};

ktc_stream *ktc_stream_create(const ktc_syntax *s) {
    ktc_stream *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    st->syn = *s;
    st->syn.prefix = NULL; /* fed first instead */
    if (s->prefix && !buf_grow_add(&st->text, s->prefix, strlen(s->prefix))) {
        free(st);
        return NULL;
    }
    return st;
}

void ktc_stream_destroy(ktc_stream *st) {
    if (!st) return;
    free(st->text.p);
    ktc_msg_free(&st->msg);
    free(st);
}

const ktc_msg *ktc_stream_msg(const ktc_stream *st) { return &st->msg; }

static kiln_status emit(ktc_delta_fn fn, void *ud, ktc_delta_kind k, int index, const char *t, size_t n) {
    if (n == 0 && k != KTC_D_CALL) return NULL;
    ktc_delta d = {k, index, t, n};
    return fn(ud, &d);
}

kiln_status ktc_stream_feed(ktc_stream *st, const char *text, size_t n, bool final, ktc_delta_fn fn, void *ud) {
    if (!buf_grow_add(&st->text, text, n)) return kiln_error(KILN_ENOMEM, "out of memory");
    ktc_msg m;
    KILN_TRY(ktc_parse(&st->syn, st->text.p, st->text.n, !final, &m));
    ktc_msg *o = &st->msg;
    kiln_status err = NULL;
    /* what grew since the last parse (a parse never takes back what it showed) */
    if (m.n_reasoning > o->n_reasoning)
        err = emit(fn, ud, KTC_D_REASONING, 0, m.reasoning + o->n_reasoning, m.n_reasoning - o->n_reasoning);
    if (!err && m.n_content > o->n_content)
        err = emit(fn, ud, KTC_D_CONTENT, 0, m.content + o->n_content, m.n_content - o->n_content);
    for (int i = 0; !err && i < m.n_calls; i++) {
        size_t had = 0;
        if (i < o->n_calls) had = strlen(o->calls[i].arguments);
        else err = emit(fn, ud, KTC_D_CALL, i, m.calls[i].name, strlen(m.calls[i].name));
        size_t now = strlen(m.calls[i].arguments);
        if (!err && now > had) err = emit(fn, ud, KTC_D_ARGS, i, m.calls[i].arguments + had, now - had);
    }
    ktc_msg_free(o);
    *o = m;
    return err;
}
