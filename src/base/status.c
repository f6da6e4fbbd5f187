#include "base/status.h"

struct kiln_err {
    kiln_code code;
    char msg[];
};

/* Returned when even the error cannot be allocated; never freed. */
static struct {
    kiln_code code;
    char msg[16];
} oom_status = {KILN_ENOMEM, "out of memory"};

static kiln_status make(kiln_code code, const char *fmt, va_list ap) KILN_PRINTF(2, 0);
static kiln_status make(kiln_code code, const char *fmt, va_list ap) {
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0) n = 0;
    struct kiln_err *e = malloc(sizeof *e + (size_t)n + 1);
    if (!e) return (kiln_status)&oom_status;
    e->code = code;
    vsnprintf(e->msg, (size_t)n + 1, fmt, ap);
    return e;
}

kiln_status kiln_error(kiln_code code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    kiln_status st = make(code, fmt, ap);
    va_end(ap);
    return st;
}

kiln_status kiln_status_wrap(kiln_status st, const char *fmt, ...) {
    if (!st) return NULL;
    char ctx[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx, sizeof ctx, fmt, ap);
    va_end(ap);
    kiln_status out = kiln_error(st->code, "%s: %s", ctx, st->msg);
    if (out == (kiln_status)&oom_status) return st; /* keep the original */
    kiln_status_free(st);
    return out;
}

kiln_code kiln_status_code(kiln_status st) { return st ? st->code : KILN_OK; }

const char *kiln_status_msg(kiln_status st) { return st ? st->msg : "ok"; }

void kiln_status_free(kiln_status st) {
    if (st && st != (kiln_status)&oom_status) free(st);
}
