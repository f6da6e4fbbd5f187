/* pyjson.c: JSON text as Python's json.dump(obj, f, indent=4) writes it, so
 * that the config.json and index kiln quantize writes read like mlx-lm's:
 * 4-space indentation, ", " -> ",\n", ": " between key and value, non-ASCII
 * escaped as \uXXXX (ensure_ascii), empty containers as {} and [].
 *
 * One loss: cJSON keeps numbers as doubles, so a float that holds an integer
 * (rope_theta 10000.0) prints as 10000. Other numbers print in the shortest
 * form that reads back to the same double, as Python's repr. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/quant_int.h"

typedef struct {
    char *s;
    size_t n, cap;
    bool oom;
} buf;

static void put(buf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->s, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->s = p, b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

static void puts_(buf *b, const char *s) { put(b, s, strlen(s)); }

static void indent(buf *b, int level) {
    put(b, "\n", 1);
    for (int i = 0; i < level; i++) put(b, "    ", 4);
}

static void number(buf *b, double v) {
    char t[64];
    if (isnan(v)) snprintf(t, sizeof t, "NaN");
    else if (isinf(v)) snprintf(t, sizeof t, v > 0 ? "Infinity" : "-Infinity");
    else if (v == floor(v) && fabs(v) < 9007199254740992.0) snprintf(t, sizeof t, "%.0f", v);
    else {
        for (int p = 1; p <= 17; p++) {
            snprintf(t, sizeof t, "%.*g", p, v);
            if (strtod(t, NULL) == v) break;
        }
        /* Python writes 1e-06 and 1.5e+20, as %g does; it adds ".0" nowhere here
         * since the value is not integral or is printed with an exponent. */
    }
    puts_(b, t);
}

/* Decodes one UTF-8 sequence at s (n bytes left); returns its length, *cp the
 * code point (U+FFFD for a malformed byte, consuming one). */
static int utf8_next(const unsigned char *s, size_t n, unsigned *cp) {
    unsigned c = s[0];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!len || (size_t)len > n) {
        *cp = 0xfffd;
        return 1;
    }
    unsigned v = len == 1 ? c : len == 2 ? (c & 0x1f) : len == 3 ? (c & 0x0f) : (c & 0x07);
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) {
            *cp = 0xfffd;
            return 1;
        }
        v = (v << 6) | (s[i] & 0x3f);
    }
    *cp = v;
    return len;
}

static void string(buf *b, const char *s) {
    put(b, "\"", 1);
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        unsigned cp;
        int len = utf8_next((const unsigned char *)s + i, n - i, &cp);
        i += (size_t)len;
        char t[16];
        switch (cp) {
        case '"': puts_(b, "\\\""); continue;
        case '\\': puts_(b, "\\\\"); continue;
        case '\n': puts_(b, "\\n"); continue;
        case '\r': puts_(b, "\\r"); continue;
        case '\t': puts_(b, "\\t"); continue;
        case '\b': puts_(b, "\\b"); continue;
        case '\f': puts_(b, "\\f"); continue;
        default: break;
        }
        if (cp < 0x20 || (cp >= 0x80 && cp < 0x10000)) {
            snprintf(t, sizeof t, "\\u%04x", cp);
            puts_(b, t);
        } else if (cp >= 0x10000) {
            unsigned v = cp - 0x10000;
            snprintf(t, sizeof t, "\\u%04x\\u%04x", 0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
            puts_(b, t);
        } else {
            char ch = (char)cp;
            put(b, &ch, 1);
        }
    }
    put(b, "\"", 1);
}

static int cmp_key(const void *a, const void *b) {
    return strcmp((*(const cJSON *const *)a)->string, (*(const cJSON *const *)b)->string);
}

static void value(buf *b, const cJSON *j, int level, bool sort) {
    if (cJSON_IsNull(j)) puts_(b, "null");
    else if (cJSON_IsTrue(j)) puts_(b, "true");
    else if (cJSON_IsFalse(j)) puts_(b, "false");
    else if (cJSON_IsNumber(j)) number(b, j->valuedouble);
    else if (cJSON_IsString(j)) string(b, j->valuestring ? j->valuestring : "");
    else if (cJSON_IsArray(j) || cJSON_IsObject(j)) {
        bool obj = cJSON_IsObject(j);
        int n = cJSON_GetArraySize(j);
        if (n == 0) {
            puts_(b, obj ? "{}" : "[]");
            return;
        }
        const cJSON **items = malloc(sizeof *items * (size_t)n);
        if (!items) {
            b->oom = true;
            return;
        }
        int k = 0;
        for (const cJSON *e = j->child; e && k < n; e = e->next) items[k++] = e;
        if (obj && sort) qsort(items, (size_t)k, sizeof *items, cmp_key);
        put(b, obj ? "{" : "[", 1);
        for (int i = 0; i < k; i++) {
            indent(b, level + 1);
            if (obj) {
                string(b, items[i]->string ? items[i]->string : "");
                puts_(b, ": ");
            }
            value(b, items[i], level + 1, false);
            if (i + 1 < k) put(b, ",", 1);
        }
        indent(b, level);
        put(b, obj ? "}" : "]", 1);
        free(items);
    } else puts_(b, "null");
}

char *kq_json_dump_py(const cJSON *j, bool sort_top) {
    buf b = {0};
    value(&b, j, 0, sort_top);
    if (b.oom) {
        free(b.s);
        return NULL;
    }
    return b.s;
}
