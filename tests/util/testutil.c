#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

uint64_t kt_seed(void)
{
    static uint64_t seed;
    static int have;
    if (!have) {
        const char *env = getenv("KILN_TEST_SEED");
        seed = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
        have = 1;
        fprintf(stderr, "test seed: KILN_TEST_SEED=%llu\n", (unsigned long long)seed);
    }
    return seed;
}

kt_rng kt_rng_new(uint64_t salt) { return (kt_rng){ kt_seed() ^ (salt * 0x9E3779B97F4A7C15ull) }; }

uint64_t kt_next(kt_rng *r)
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

float kt_uniform(kt_rng *r, float lo, float hi)
{
    return lo + (hi - lo) * (float)((kt_next(r) >> 40) * (1.0 / 16777216.0));
}

float kt_normal(kt_rng *r)
{
    double u1 = ((kt_next(r) >> 11) + 1.0) * (1.0 / 9007199254740993.0);
    double u2 = (kt_next(r) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

void kt_fill_normal(kt_rng *r, float *x, size_t n, float sigma)
{
    for (size_t i = 0; i < n; i++)
        x[i] = sigma * kt_normal(r);
    if (n)
        x[0] = sigma; /* never all zeros */
}
