/* util.c: byte buffers, JSON string escaping, UTF-8 checks, clocks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/server_int.h"

double ksrv_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static bool reserve(ksrv_buf *b, size_t extra) {
    if (b->oom) return false;
    if (b->len + extra + 1 <= b->cap) return true;
    size_t nc = b->cap ? b->cap : 256;
    while (nc < b->len + extra + 1) nc *= 2;
    char *p = realloc(b->p, nc);
    if (!p) {
        b->oom = true;
        return false;
    }
    b->p = p;
    b->cap = nc;
    return true;
}

void ksrv_buf_add(ksrv_buf *b, const char *s, size_t n) {
    if (!reserve(b, n)) return;
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

void ksrv_buf_str(ksrv_buf *b, const char *s) { ksrv_buf_add(b, s, strlen(s)); }

void ksrv_buf_printf(ksrv_buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char small[256];
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof small) {
        ksrv_buf_add(b, small, (size_t)n);
        return;
    }
    if (!reserve(b, (size_t)n)) return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void ksrv_buf_free(ksrv_buf *b) {
    free(b->p);
    *b = (ksrv_buf){0};
}

/* Bytes of the UTF-8 character at s (n available), 0 if invalid. */
static size_t utf8_char(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t k;
    unsigned min;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) k = 2, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF) k = 3, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4) k = 4, min = 0x10000;
    else return 0;
    if (n < k) return 0;
    unsigned cp = c & (0xFF >> (k + 1));
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return k;
}

size_t ksrv_utf8_valid_prefix(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        size_t k = utf8_char((const unsigned char *)s + i, n - i);
        if (!k) break;
        i += k;
    }
    return i;
}

/* JSON string with control characters escaped and invalid UTF-8 replaced
 * by U+FFFD (a token may end in the middle of a character). */
void ksrv_buf_json_str(ksrv_buf *b, const char *s, size_t n) {
    ksrv_buf_add(b, "\"", 1);
    size_t i = 0, run = 0;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        size_t k = utf8_char((const unsigned char *)s + i, n - i);
        const char *esc = NULL;
        char tmp[8];
        if (!k) esc = "\xEF\xBF\xBD", k = 1;
        else if (c == '"') esc = "\\\"";
        else if (c == '\\') esc = "\\\\";
        else if (c == '\n') esc = "\\n";
        else if (c == '\r') esc = "\\r";
        else if (c == '\t') esc = "\\t";
        else if (c < 0x20 || c == 0x7F) {
            snprintf(tmp, sizeof tmp, "\\u%04x", c);
            esc = tmp;
        }
        if (esc) {
            ksrv_buf_add(b, s + i - run, run);
            run = 0;
            ksrv_buf_str(b, esc);
        } else {
            run += k;
        }
        i += k;
    }
    ksrv_buf_add(b, s + n - run, run);
    ksrv_buf_add(b, "\"", 1);
}

void ksrv_error_json(ksrv_buf *b, int status, const char *type, const char *code, const char *msg) {
    /* OpenAI names the offending parameter; kiln's messages start with it:
     * "\"max_tokens\": expected an integer" */
    char param[64] = "";
    if (msg[0] == '"') {
        const char *e = strchr(msg + 1, '"');
        if (e && (size_t)(e - msg - 1) < sizeof param) memcpy(param, msg + 1, (size_t)(e - msg - 1)), param[e - msg - 1] = 0;
    }
    ksrv_buf_str(b, "{\"error\": {\"message\": ");
    ksrv_buf_json_str(b, msg, strlen(msg));
    ksrv_buf_printf(b, ", \"type\": \"%s\", \"param\": ", type);
    if (param[0]) ksrv_buf_json_str(b, param, strlen(param));
    else ksrv_buf_str(b, "null");
    if (code) ksrv_buf_printf(b, ", \"code\": \"%s\"}}", code);
    else ksrv_buf_printf(b, ", \"code\": %d}}", status);
}

void ksrv_log_escape(const char *s, char *out, size_t cap) {
    size_t k = 0;
    for (; *s && k + 5 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c < 0x21 || c >= 0x7f || c == '\\') k += (size_t)snprintf(out + k, cap - k, "\\x%02x", c);
        else out[k++] = (char)c;
    }
    out[k] = 0;
}
