/* jinja_int.h: internals shared by the lexer, parser and interpreter. */
#ifndef KILN_JINJA_INT_H
#define KILN_JINJA_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/arena.h"
#include "base/status.h"
#include "chat/jinja.h"

/* ---- strings ---------------------------------------------------------- */

/* An immutable byte string (UTF-8); p is NUL-terminated when built by kiln. */
typedef struct kj_str {
    size_t len;
    const char *p;
} kj_str;

/* A growable malloc'ed byte buffer; failures set oom and drop the bytes. */
typedef struct {
    char *p;
    size_t n, cap;
    bool oom;
} kj_buf;
bool kj_buf_put(kj_buf *b, const void *p, size_t n);
static inline bool kj_buf_putc(kj_buf *b, char c) { return kj_buf_put(b, &c, 1); }
bool kj_buf_puts(kj_buf *b, const char *s);

/* ---- tokens ----------------------------------------------------------- */

typedef enum {
    KT_TEXT, KT_NUM, KT_STR, KT_IDENT, KT_EQUALS, KT_LPAREN, KT_RPAREN,
    KT_OPEN_STMT, KT_CLOSE_STMT, KT_OPEN_EXPR, KT_CLOSE_EXPR, KT_LBRACKET,
    KT_RBRACKET, KT_LBRACE, KT_RBRACE, KT_COMMA, KT_DOT, KT_COLON, KT_PIPE,
    KT_ADD, KT_MUL, KT_POW, KT_CMP, KT_UNARY, KT_COMMENT,
} kj_tok_type;

typedef struct {
    kj_tok_type type;
    kj_str val;   /* text, unescaped string, identifier, operator, number */
    uint32_t pos; /* byte offset in the original template */
} kj_tok;

typedef struct {
    kj_tok *v;
    size_t n;
    /* line starts of the original text, for "line L, column C" */
    const uint32_t *lines;
    size_t nlines;
} kj_toks;

/* Tokenizes src after @huggingface/jinja's preprocessing (trim_blocks,
 * lstrip_blocks, generation tags). Token strings live in a. */
kiln_status kj_lex(ku_arena *a, const char *src, size_t len, kj_toks *out);
/* 1-based line and column of a byte offset. */
void kj_linecol(const uint32_t *lines, size_t nlines, uint32_t pos, int *line, int *col);

/* ---- syntax tree ------------------------------------------------------ */

typedef enum {
    /* statements */
    KN_TEXT, KN_COMMENT, KN_IF, KN_FOR, KN_BREAK, KN_CONTINUE, KN_SET,
    KN_MACRO, KN_CALLSTMT, KN_FILTERSTMT,
    /* expressions */
    KN_INT, KN_FLOAT, KN_STR, KN_ARRAY, KN_TUPLE, KN_OBJECT, KN_IDENT,
    KN_MEMBER, KN_SLICE, KN_CALL, KN_UNARY, KN_BINARY, KN_FILTER, KN_TEST,
    KN_SELECT, KN_TERNARY, KN_KWARG, KN_SPREAD, KN_KWSPREAD,
} kj_kind;

typedef enum {
    KO_NONE, KO_AND, KO_OR, KO_NOT, KO_EQ, KO_NE, KO_LT, KO_GT, KO_LE, KO_GE,
    KO_IN, KO_NOTIN, KO_ADD, KO_SUB, KO_CONCAT, KO_MUL, KO_DIV, KO_FLOORDIV,
    KO_MOD, KO_POW,
} kj_op;

typedef struct kj_node kj_node;
typedef struct {
    kj_node **v;
    int n;
} kj_list;

/* One node shape for all kinds; which fields mean what:
 *   TEXT/STR/IDENT: str.  INT/FLOAT: num.  ARRAY/TUPLE: list.
 *   OBJECT: list = keys, list2 = values.
 *   IF: a = test, list = body, list2 = else.  FOR: a = loop var, b = iterable
 *   (a SELECT when filtered), list = body, list2 = else.
 *   SET: a = target, b = value or NULL, list = block body.
 *   MACRO: str = name, list2 = params, list = body, flags = kwargs/varargs use.
 *   CALLSTMT: a = CALL node, list2 = caller params (has_params), list = body.
 *   FILTERSTMT: a = filter (IDENT or CALL), list = body.
 *   MEMBER: a = object, b = property, computed.  SLICE: a, b, c (may be NULL).
 *   CALL: a = callee, list = args.  UNARY: op, a.  BINARY: op, a, b.
 *   FILTER: a = operand, b = filter (IDENT or CALL).  TEST: a, str, negate.
 *   SELECT: a = value, b = test.  TERNARY: a = cond, b = then, c = else.
 *   KWARG: str = name, a = value.  SPREAD/KWSPREAD: a. */
struct kj_node {
    kj_kind kind;
    kj_op op;
    bool computed, negate, has_params;
    uint8_t special; /* MACRO/CALLSTMT: 1 kwargs accessed, 2 varargs accessed */
    uint32_t pos;
    kj_str str;
    double num;
    kj_node *a, *b, *c;
    kj_list list, list2;
};

kiln_status kj_parse_tokens(ku_arena *a, const kj_toks *t, kj_list *out);

/* ---- UTF-8 and JavaScript string helpers --------------------------- */

/* Decodes one code point at s[i..len); returns its byte length (>= 1).
 * Invalid bytes decode as U+FFFD, one byte each. */
int kj_utf8_dec(const char *s, size_t len, size_t i, uint32_t *cp);
int kj_utf8_enc(uint32_t cp, char *out);
/* JavaScript's \s. */
bool kj_js_space(uint32_t cp);
/* Length in UTF-16 code units, as JavaScript's String.length. */
size_t kj_utf16_len(const char *s, size_t len);
/* JavaScript Number.prototype.toString(); buf >= 32 bytes. */
void kj_js_num(double d, char *buf);

#endif
