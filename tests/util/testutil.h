/* Shared by the test suites: seeded random inputs (never zeros) and checks. */
#ifndef KILN_TESTUTIL_H
#define KILN_TESTUTIL_H

#include <stdint.h>
#include <stddef.h>

/* The suite's seed: $KILN_TEST_SEED, else taken from the clock; printed once
 * so a failure can be replayed. */
uint64_t kt_seed(void);

/* A small, fast generator (splitmix64) owned by the caller. */
typedef struct kt_rng { uint64_t s; } kt_rng;
kt_rng kt_rng_new(uint64_t salt);
uint64_t kt_next(kt_rng *r);
/* Uniform in [lo, hi). */
float kt_uniform(kt_rng *r, float lo, float hi);
/* Standard normal (Box–Muller). */
float kt_normal(kt_rng *r);
/* Fill with N(0, sigma) values; never all zeros. */
void kt_fill_normal(kt_rng *r, float *x, size_t n, float sigma);

#endif
