/* jinja_util.c: byte buffers, UTF-8, and the few JavaScript conventions
 * (whitespace, string length, number printing) that @huggingface/jinja's
 * output depends on. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat/jinja_int.h"

bool kj_buf_put(kj_buf *b, const void *p, size_t n) {
    if (b->oom) return false;
    if (b->cap - b->n <= n) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap - b->n <= n) {
            if (cap > SIZE_MAX / 2) {
                b->oom = true;
                return false;
            }
            cap *= 2;
        }
        char *np = realloc(b->p, cap);
        if (!np) {
            b->oom = true;
            return false;
        }
        b->p = np;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = 0;
    return true;
}

bool kj_buf_puts(kj_buf *b, const char *s) { return kj_buf_put(b, s, strlen(s)); }

int kj_utf8_dec(const char *s, size_t len, size_t i, uint32_t *cp) {
    const unsigned char *u = (const unsigned char *)s;
    unsigned c = u[i];
    *cp = 0xFFFD;
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    int n;
    uint32_t v, min;
    if ((c & 0xE0) == 0xC0) n = 2, v = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0) n = 3, v = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0) n = 4, v = c & 0x07, min = 0x10000;
    else return 1;
    if (i + (size_t)n > len) return 1;
    for (int k = 1; k < n; k++) {
        if ((u[i + k] & 0xC0) != 0x80) return 1;
        v = (v << 6) | (u[i + k] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 1;
    *cp = v;
    return n;
}

int kj_utf8_enc(uint32_t cp, char *out) {
    unsigned char *o = (unsigned char *)out;
    if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD; /* node prints lone surrogates so */
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    if (cp > 0x10FFFF) cp = 0xFFFD;
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

bool kj_js_space(uint32_t c) {
    return (c >= 9 && c <= 13) || c == ' ' || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000 || c == 0xFEFF;
}

size_t kj_utf16_len(const char *s, size_t len) {
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        i += (size_t)kj_utf8_dec(s, len, i, &cp);
        n += cp >= 0x10000 ? 2 : 1;
    }
    return n;
}

/* ECMAScript Number::toString(10): the shortest digits that round-trip,
 * laid out in plain notation for exponents in [-7, 21), else as d.ddde+X. */
void kj_js_num(double d, char *buf) {
    if (isnan(d)) {
        strcpy(buf, "NaN");
        return;
    }
    if (isinf(d)) {
        strcpy(buf, d > 0 ? "Infinity" : "-Infinity");
        return;
    }
    if (d == 0) {
        strcpy(buf, "0");
        return;
    }
    char *o = buf;
    if (d < 0) {
        *o++ = '-';
        d = -d;
    }
    char tmp[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, d);
        if (strtod(tmp, NULL) == d) break;
    }
    if (prec > 17) prec = 17;
    /* tmp = D[.DDD]e[+-]XX */
    char digits[24];
    int k = 0;
    const char *p = tmp;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9') digits[k++] = *p;
    while (k > 1 && digits[k - 1] == '0') k--;
    digits[k] = 0;
    int e = atoi(p + 1);
    int n = e + 1;
    if (k <= n && n <= 21) {
        memcpy(o, digits, (size_t)k);
        o += k;
        for (int i = 0; i < n - k; i++) *o++ = '0';
        *o = 0;
    } else if (0 < n && n <= 21) {
        memcpy(o, digits, (size_t)n);
        o += n;
        *o++ = '.';
        memcpy(o, digits + n, (size_t)(k - n));
        o += k - n;
        *o = 0;
    } else if (-6 < n && n <= 0) {
        *o++ = '0';
        *o++ = '.';
        for (int i = 0; i < -n; i++) *o++ = '0';
        memcpy(o, digits, (size_t)k);
        o += k;
        *o = 0;
    } else {
        *o++ = digits[0];
        if (k > 1) {
            *o++ = '.';
            memcpy(o, digits + 1, (size_t)(k - 1));
            o += k - 1;
        }
        sprintf(o, "e%c%d", n - 1 >= 0 ? '+' : '-', abs(n - 1));
    }
}
