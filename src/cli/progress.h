/* progress.h: a one-line progress bar on stderr for long commands (quantize,
 * perplexity). Drawn only when stderr is a terminal, redrawn at most ten
 * times a second; elsewhere it prints nothing, so logs stay clean. */
#ifndef KILN_CLI_PROGRESS_H
#define KILN_CLI_PROGRESS_H

#include <stdbool.h>

#include "base/status.h"

typedef struct {
    bool tty;
    const char *what;  /* label before the bar */
    double t0, last;   /* start and last redraw, seconds */
    int width;         /* characters drawn last time, to clear them */
} kiln_progress;

void kiln_progress_start(kiln_progress *p, const char *what);
/* frac in [0, 1]; note is printed after the bar (may be NULL). */
void kiln_progress_update(kiln_progress *p, double frac, const char *note, bool force);
/* Clears the line. */
void kiln_progress_end(kiln_progress *p);
double kiln_progress_elapsed(const kiln_progress *p);

#endif
