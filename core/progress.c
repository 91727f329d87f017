/* Progress lines of long tasks (compiling kernels, loading weights). */
#include "core.h"

#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

void kiln_progress_start(kiln_progress *p, int quiet, double delay_s, double tty_every_s)
{
    double now = kiln_now();
    *p = (kiln_progress){ .mode = quiet ? 0 : isatty(STDERR_FILENO) ? 1 : 2,
                          .delay_s = delay_s,
                          .tty_every_s = tty_every_s,
                          .start = now,
                          .last_line = now };
}

void kiln_progress_show(kiln_progress *p, int last, const char *fmt, ...)
{
    double now = kiln_now();
    if (!p->mode || (!p->shown && (last ? p->delay_s > 0 : now - p->start < p->delay_s)))
        return;
    if (!last && p->mode == 1 && p->shown && now - p->last_line < p->tty_every_s)
        return;
    if (!last && p->mode == 2 && now - p->last_line < KILN_PROGRESS_EVERY_S)
        return;
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (p->mode == 1)
        fprintf(stderr, "\r%s   %s", line, last ? "\n" : "");
    else
        fprintf(stderr, "%s\n", line);
    fflush(stderr);
    p->shown = 1;
    p->last_line = now;
}
