#include "cli/progress.h"

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

void kiln_progress_start(kiln_progress *p, const char *what) {
    memset(p, 0, sizeof *p);
    p->tty = isatty(STDERR_FILENO);
    p->what = what;
    p->t0 = now();
}

double kiln_progress_elapsed(const kiln_progress *p) { return now() - p->t0; }

void kiln_progress_update(kiln_progress *p, double frac, const char *note, bool force) {
    if (!p->tty) return;
    double t = now();
    if (!force && t - p->last < 0.1) return;
    p->last = t;
    if (frac < 0) frac = 0;
    if (frac > 1) frac = 1;
    enum { BAR = 30 };
    char bar[BAR + 1];
    int fill = (int)(frac * BAR + 0.5);
    for (int i = 0; i < BAR; i++) bar[i] = i < fill ? '#' : '.';
    bar[BAR] = 0;
    char eta[32] = "";
    double el = t - p->t0;
    if (frac > 0.01 && frac < 1) snprintf(eta, sizeof eta, " ETA %.0fs", el / frac - el);
    char line[256];
    int n = snprintf(line, sizeof line, "%s [%s] %3.0f%%%s  %.60s", p->what, bar, frac * 100, eta, note ? note : "");
    if (n < 0) return;
    if (n >= (int)sizeof line) n = (int)sizeof line - 1;
    fprintf(stderr, "\r%s%*s", line, p->width > n ? p->width - n : 0, "");
    fflush(stderr);
    p->width = n;
}

void kiln_progress_end(kiln_progress *p) {
    if (!p->tty || !p->width) return;
    fprintf(stderr, "\r%*s\r", p->width, "");
    fflush(stderr);
    p->width = 0;
}
