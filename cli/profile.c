/* kiln run --profile: each kernel of a bucket timed alone, so that a step's
 * time can be read against its parts. */
#include "cli.h"

#include <stdlib.h>

int cli_run_profile(const char *cmd, kiln_session *s, const int64_t *tokens, int n_tokens)
{
    enum { REPS = 10 };
    for (int t = 0; t < n_tokens; t++) {
        int n = 0;
        kiln_status st = kiln_session_profile(s, tokens[t], REPS, NULL, 0, &n);
        if (st != KILN_OK && st != KILN_ERR_INVALID_ARG)
            return cli_fail(st, cmd);
        kiln_step_time *steps = calloc((size_t)n + 1, sizeof *steps);
        if (!steps)
            return cli_fail(KILN_ERR_NOMEM, cmd);
        st = kiln_session_profile(s, tokens[t], REPS, steps, n, &n);
        if (st != KILN_OK) {
            free(steps);
            return cli_fail(st, cmd);
        }
        double sum = 0;
        for (int i = 0; i < n; i++)
            sum += steps[i].us;
        printf("profile %lld tokens: %d kernels, %.1f us one after another (mean of %d; a "
               "replay lets them overlap)\n",
               (long long)tokens[t], n, sum, REPS);
        printf("  %4s %10s %6s  %-24s %s\n", "step", "us", "%", "node", "kernel");
        for (int i = 0; i < n; i++)
            printf("  %4d %10.2f %6.1f  %-24s %s\n", i, steps[i].us,
                   sum > 0 ? 100.0 * steps[i].us / sum : 0.0, steps[i].node, steps[i].kernel);
        free(steps);
    }
    return CLI_OK;
}
