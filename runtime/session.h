/* Session internals that tools inside the project use and the public API
 * does not offer. */
#ifndef KILN_SESSION_H
#define KILN_SESSION_H

#include "core.h"

/* Time the bucket that serves m tokens, device work only: `replays`
 * replays of the bucket's graph (launches of its program when the session is
 * eager) back to back on the session's stream, between two CUDA events, with
 * no host copies. Each replay reads whatever the activation arena holds,
 * which is the input of the last kiln_session_run of that bucket (zeros
 * before any). *us receives the mean microseconds of one replay.
 * KILN_ERR_INVALID_ARG for a NULL session or out-parameter or replays < 1;
 * KILN_ERR_SHAPE when m is outside the session's buckets; KILN_ERR_CUDA when
 * a launch or an event fails. */
kiln_status kiln_session_bench(kiln_session *s, int64_t m, int replays, float *us);

#endif
