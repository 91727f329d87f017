/* Progress lines (core/progress.c) off a terminal, as a CI log gets them:
 * nothing for a task shorter than its delay, the closing line of one that
 * showed progress, and nothing at all when quiet. */
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <stdio.h>
#include <string.h>

#include "core.h"

static void redirect(void)
{
    cr_redirect_stderr();
}

static char *captured(char *buf, size_t size)
{
    fflush(stderr);
    size_t n = fread(buf, 1, size - 1, cr_get_redirected_stderr());
    buf[n] = '\0';
    return buf;
}

Test(progress, lines_in_a_log, .init = redirect)
{
    kiln_progress p;
    /* no delay: the closing line always comes, the ones before only every
     * KILN_PROGRESS_EVERY_S */
    kiln_progress_start(&p, 0, 0, 0);
    cr_assert_eq(p.mode, 2, "stderr is a file here");
    kiln_progress_show(&p, 0, "task: %d/%d", 1, 3);
    kiln_progress_show(&p, 1, "task: %d/%d", 3, 3);
    /* a delay: a task done before it says nothing */
    kiln_progress_start(&p, 0, 60, 0);
    kiln_progress_show(&p, 0, "slow: 1/2");
    kiln_progress_show(&p, 1, "slow: 2/2");
    /* a task past its delay gets a line and its closing line */
    kiln_progress_start(&p, 0, 1, 0);
    p.start -= 10, p.last_line -= 10;
    kiln_progress_show(&p, 0, "long: 1/2");
    kiln_progress_show(&p, 1, "long: 2/2");
    /* quiet */
    kiln_progress_start(&p, 1, 0, 0);
    kiln_progress_show(&p, 1, "quiet: 1/1");
    char text[512];
    cr_assert_str_eq(captured(text, sizeof text), "task: 3/3\nlong: 1/2\nlong: 2/2\n");
}
