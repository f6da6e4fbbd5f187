/* toolcall.h: tool calls and reasoning in model output (prefix ktc_).
 *
 * A model writes its tool calls and thinking blocks as text in a format of
 * its own (Hermes <tool_call>{json}</tool_call>, Llama 3 JSON, Mistral
 * [TOOL_CALLS], gpt-oss Harmony channels, DeepSeek's <｜tool▁calls▁begin｜>,
 * ...). The format is chosen from the chat template's text, not from the
 * model's name (ktc_detect), as the template is what taught the model the
 * format. ktc_parse splits a whole output, or the prefix generated so far,
 * into content, reasoning and calls; ktc_stream turns the growing output
 * into deltas (content, reasoning, a call's name, its argument fragments)
 * whose concatenation equals the final parse, whatever the split points.
 *
 * Partial parses are prefix-stable: content and reasoning of a prefix are
 * prefixes of those of the whole; a call appears once its name is complete,
 * and its arguments text only grows. Text that may still become markup (a
 * partial "<tool_" at the end) is held back, so markup never reaches content.
 * A thinking block the output never closes ends where a call starts (as
 * llama.cpp parses Qwen3.5, Ling and Kimi K2); while the output grows, the
 * text from such a start is held until the block closes or the output ends.
 *
 * Constrained calls: ktc_trigger() gives the text at which a format's call
 * starts and ktc_grammar() the GBNF of what follows it (each call's
 * arguments under its function's schema); generation switches the grammar
 * on where the trigger appears (lazily, as llama.cpp's lazy grammars), or
 * the prompt ends with the trigger (tool_choice required: ktc_syntax.prefix
 * tells the parser). */
#ifndef KILN_TOOLCALL_H
#define KILN_TOOLCALL_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"

typedef enum {
    KTC_NONE,         /* no known tool-call format */
    KTC_HERMES,       /* <tool_call>{"name": .., "arguments": {..}}</tool_call> (Qwen2.5/3, Hermes, ...) */
    KTC_QWEN3_CODER,  /* <tool_call><function=NAME><parameter=K>V</parameter></function></tool_call> */
    KTC_LLAMA3,       /* {"name": .., "parameters": {..}}, <|python_tag|>{..} (Llama 3.1-3.3) */
    KTC_MISTRAL,      /* [TOOL_CALLS][{"name": .., "arguments": {..}}, ..] (Mistral v3, Nemo) */
    KTC_MISTRAL_V11,  /* [TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{..} (Mistral Small 3.2, Devstral, Ministral 3) */
    KTC_HARMONY,      /* gpt-oss: <|channel|>commentary to=functions.NAME ... <|message|>{..}<|call|> */
    KTC_DEEPSEEK,     /* <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>...<｜tool▁sep｜>... (R1 and V3.1 layouts) */
    KTC_GLM45,        /* <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call> */
    KTC_KIMI_K2,      /* <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:I<|tool_call_argument_begin|>{..} */
    KTC_COMMAND_R,    /* <|START_ACTION|>[{"tool_call_id", "tool_name", "parameters"}]<|END_ACTION|> (Command R7B / A) */
    KTC_GRANITE,      /* <|tool_call|>[{"name": .., "arguments": {..}}, ..] (Granite 3.x) */
    KTC_SEED_OSS,     /* <seed:tool_call><function=NAME><parameter=K>V</parameter></function></seed:tool_call> */
    KTC_MINIMAX_M2,   /* <minimax:tool_call><invoke name="NAME"><parameter name="K">V</parameter></invoke>.. */
    KTC_PHI4,         /* <|tool_call|>[{"name", "arguments"}]<|/tool_call|> (Phi-4-mini; vLLM's functools[..] too) */
    KTC_COMMAND_R_PLUS, /* Action: ```json [{"tool_name": .., "parameters": {..}}] ``` (Command R+) */
    KTC_FIREFUNCTION, /* functools[{"name", "arguments"}, ..] (FireFunction v2) */
    KTC_DSML,         /* <｜DSML｜function_calls><｜DSML｜invoke name="NAME"><｜DSML｜parameter name="K" string="true|false">V.. (DeepSeek V3.2) */
    KTC_DSML_V4,      /* the same in <｜DSML｜tool_calls> (DeepSeek V4) */
    KTC_MINICPM5,     /* <function name="NAME"><param name="K">V or <![CDATA[V]]></param></function> (MiniCPM5) */
    KTC_HY3,          /* <tool_calls:opensource><tool_call:opensource>NAME<tool_sep:opensource><arg_key:opensource>K.. (Tencent Hy3) */
    KTC_APRIEL,       /* <tool_calls>[{"name", "arguments"}, ..]</tool_calls> (Apriel 1.5 / 1.6) */
    KTC_MINIMAX_M1,   /* <tool_calls>\n{"name", "arguments"}\n..</tool_calls> (MiniMax-M1) */
    KTC_NEMOTRON_V2,  /* <TOOLCALL>[{"name", "arguments"}, ..]</TOOLCALL> (Nemotron Nano v2) */
    KTC_GIGACHAT3,    /* function call<|role_sep|>\n{"name", "arguments"} (GigaChat 3) */
    KTC_GIGACHAT31,   /* <|function_call|>{"name", "arguments"} (GigaChat 3.1) */
    KTC_APERTUS,      /* <|tools_prefix|>[{"NAME": {..}}, ..]<|tools_suffix|> (Apertus) */
    KTC_SOLAR,        /* <|tool_calls|><|tool_call:begin|>ID<|tool_call:name|>NAME<|tool_call:args|>{..}<|tool_call:end|>..<|calls|> */
    KTC_FUNCTIONARY31, /* <function=NAME>{..}</function> (functionary v3.1) */
    KTC_FUNCTIONARY32, /* >>>NAME\n{..} (>>>all\n: content; functionary v3.2) */
    KTC_LFM2,         /* <|tool_call_start|>[NAME(k='v', n=1), ..]<|tool_call_end|> (LFM2 / LFM2.5, pythonic) */
    KTC_GEMMA4,       /* <|tool_call>call:NAME{k:<|"|>v<|"|>,n:1}<tool_call|> (Gemma 4) */
    KTC_MINIMAX_M3,   /* ]<]minimax[>[<tool_call> ]<]minimax[>[<invoke name="NAME">]<]minimax[>[<K>V]<]minimax[>[</K>.. */
    KTC_KIMI_K3,      /* <|open|>tools<|sep|><|open|>call tool="NAME" index="1"<|sep|><|open|>argument key="K" type="T"<|sep|>V.. */
    KTC_MUSE_GLIMMER, /* <|start|>assistant to=NAME<|message|><atem:function_calls><atem:invoke name="NAME">.. (to=self: reasoning) */
    KTC_PYTHONIC,     /* [NAME(k="v", n=1), ..] as the whole output (Llama 4 / Llama 3.2 pythonic; <|python_start|>..<|python_end|> optional) */
    KTC_N_FORMATS
} ktc_format;

typedef enum {
    KTC_THINK_NONE,    /* no thinking blocks: everything is content */
    KTC_THINK_TAGS,    /* <think>...</think> (Qwen3, DeepSeek-R1, GLM, Kimi, ...) */
    KTC_THINK_MISTRAL, /* [THINK]...[/THINK] */
    KTC_THINK_COHERE,  /* <|START_THINKING|>...<|END_THINKING|> */
    KTC_THINK_SEED,    /* <seed:think>...</seed:think> (Seed-OSS) */
    KTC_THINK_HY3,     /* <think:opensource>...</think:opensource> (Tencent Hy3) */
    KTC_THINK_GEMMA4,  /* <|channel>thought...<channel|> (Gemma 4) */
    KTC_THINK_MM,      /* <mm:think>...</mm:think> (MiniMax-M3) */
    KTC_THINK_KIMI_K3, /* <|open|>think<|sep|>...<|close|>think<|sep|> (Kimi K3) */
    KTC_THINK_APRIEL,  /* Here are my reasoning steps:...[BEGIN FINAL RESPONSE] (Apriel 1.6: the prompt opens it) */
    KTC_THINK_SOLAR,   /* <|think|>...<|end|> (Solar Open) */
    /* Harmony's analysis channel is reasoning whenever the format is KTC_HARMONY, Muse Glimmer's to=self messages
     * whenever it is KTC_MUSE_GLIMMER */
} ktc_reasoning;

const char *ktc_format_name(ktc_format f); /* "hermes", ...; "none" */
/* The format and thinking markers a chat template teaches. */
ktc_format ktc_detect(const char *template_source);
ktc_reasoning ktc_detect_reasoning(const char *template_source);
/* Whether the format's markers are special tokens (the detokenizer must
 * keep special tokens for the parser to see them). */
bool ktc_needs_special(ktc_format f);
/* Where a call starts: the grammar engine's trigger (see above). */
const char *ktc_trigger(ktc_format f);
/* Whether OpenAI tools (a list, may be NULL) hold a function of that name. */
bool ktc_has_tool(const cJSON *tools, const char *name);
/* Whether ktc_grammar knows the format (all but KTC_NONE). */
bool ktc_grammar_supported(ktc_format f);
/* The GBNF (malloc'ed) of the text after ktc_trigger(f): one call (Hermes,
 * Llama 3, Harmony: each call has its own trigger) or a list of calls (one
 * when not parallel) of the tools (OpenAI tools), or only of the function
 * named only (NULL: any). JSON formats end where the arguments end;
 * special-token formats (Harmony, DeepSeek, Kimi K2, Mistral v11) name
 * tok's special tokens as terminals (<[id]>: a marker that is not special
 * in tok, or tok NULL, is matched as text) and end with the closing marker;
 * XML formats (Qwen3-Coder, Seed-OSS, MiniMax-M2, GLM-4.5) end with the
 * call's closing tag. A strict tool's schema that the grammar engine cannot
 * honour is an error naming the tool; another tool's arguments are then any
 * JSON object (XML formats: any parameters as text). */
struct ktok;
kiln_status ktc_grammar(ktc_format f, const cJSON *tools, const char *only, bool parallel, const struct ktok *tok, char **gbnf);
/* A forced call when the prompt opened a thinking block (tool_choice
 * required or named): the GBNF (malloc'ed) of the text after the block's
 * close marker, which is then the lazy trigger: a few blanks, the format's
 * trigger (tok's special token when it is one), then gbnf's calls. */
kiln_status ktc_grammar_after_think(ktc_format f, const char *gbnf, const struct ktok *tok, char **out);

typedef struct {
    ktc_format format;       /* KTC_NONE: no tool calls parsed */
    ktc_reasoning reasoning; /* KTC_THINK_NONE: thinking stays in content */
    bool think_open;         /* the prompt already opened the thinking block */
    const cJSON *tools;      /* OpenAI tools (borrowed; NULL): argument types for XML formats */
    const char *prefix;      /* the output's start that the prompt already holds (borrowed; NULL: none),
                              * e.g. the trigger a forced call was prefilled with */
} ktc_syntax;

/* The thinking block's opening and closing text (Harmony: the analysis
 * channel's); NULL both for KTC_THINK_NONE outside Harmony. */
void ktc_think_markers(ktc_format f, ktc_reasoning r, const char **open, const char **close);

/* Whether a rendered prompt ends inside an opened thinking block ("<think>"
 * and whitespace at its end, as DeepSeek-R1's and Qwen3's templates write). */
bool ktc_prompt_opens_think(ktc_reasoning r, const char *prompt);

typedef struct {
    char *name;
    char *arguments; /* JSON text of an object (a prefix of it while partial) */
} ktc_call;

typedef struct {
    char *content, *reasoning; /* NUL-terminated, never NULL after a parse */
    size_t n_content, n_reasoning;
    ktc_call *calls;
    int n_calls;
} ktc_msg;

/* Parses out[0..n) (partial: a prefix of the output still growing).
 * Only out of memory fails. *m is overwritten (free it with ktc_msg_free). */
kiln_status ktc_parse(const ktc_syntax *s, const char *text, size_t n, bool partial, ktc_msg *m);
void ktc_msg_free(ktc_msg *m);

/* ---- streaming ---- */
typedef enum {
    KTC_D_CONTENT,   /* text: a content fragment */
    KTC_D_REASONING, /* text: a reasoning fragment */
    KTC_D_CALL,      /* a new call number index; text: its name */
    KTC_D_ARGS,      /* text: a fragment of call index's arguments */
} ktc_delta_kind;

typedef struct {
    ktc_delta_kind kind;
    int index;
    const char *text;
    size_t len;
} ktc_delta;

typedef kiln_status (*ktc_delta_fn)(void *ud, const ktc_delta *d);

typedef struct ktc_stream ktc_stream;
ktc_stream *ktc_stream_create(const ktc_syntax *s); /* NULL: out of memory; s copied */
void ktc_stream_destroy(ktc_stream *st);
/* Appends text; fn gets the deltas it makes visible. final: the output is
 * complete (held-back text is resolved). */
kiln_status ktc_stream_feed(ktc_stream *st, const char *text, size_t n, bool final, ktc_delta_fn fn, void *ud);
/* The parse of everything fed so far (borrowed). */
const ktc_msg *ktc_stream_msg(const ktc_stream *st);

#endif
