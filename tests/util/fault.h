/* The fault sweep (core/alloc.c's hook at work), shared by the test_fault
 * suites of each module.
 *
 * A scenario runs once to count its allocations and name their sites, then
 * once per allocation with that one allocation failing. Each such run
 * either fails with KILN_ERR_NOMEM and a message that says "out of
 * memory" (the CLI prints the message in place of kiln_strerror's), or
 * succeeds with the very result of the run that failed nothing (the
 * library absorbed the failure: a thread pool that starts fewer threads).
 * Under the sanitizers, a sweep also leaks nothing. Every site a scenario
 * reaches is failed at least once; past KT_SWEEP_BUDGET allocations, each
 * site's first and last allocation and an even spread of the rest are.
 * kt_sweep prints the count of allocations and sites swept;
 * KILN_FAULT_SITES=1 lists every site with the message its failure gave. */
#ifndef KILN_FAULT_H
#define KILN_FAULT_H

#include "gpuutil.h"
#include "kiln.h"

#include <stddef.h>
#include <stdint.h>

/* Failing runs of one scenario at most: keeps every sweep well under a
 * minute on two cores under the sanitizers. */
enum { KT_SWEEP_BUDGET = 700 };

/* What a scenario computed, hashed, to compare a run that absorbed a
 * failure with the run that failed nothing. */
typedef struct kt_digest {
    uint64_t h;
} kt_digest;
void kt_dig(kt_digest *d, const void *p, size_t n);
void kt_dig_str(kt_digest *d, const char *s); /* NULL allowed */
void kt_dig_int(kt_digest *d, int64_t v);

/* A scenario must be deterministic: every run makes the same allocations
 * in the same order, up to the one that fails. run returns its first
 * failing status, having released everything. */
typedef struct kt_scenario {
    const char *name;
    kiln_status (*run)(void *ctx, kt_digest *d);
    void (*reset)(void *ctx);                 /* before every run; may be NULL */
    void (*check)(void *ctx, kiln_status st); /* the state a run left; may be NULL */
    void *ctx;
} kt_scenario;

void kt_sweep(const kt_scenario *s);

/* The run under way ("cache, allocation 7 of 45 failing (cache/cache.c:128)"),
 * for a scenario's own assertions. */
const char *kt_sweep_now(void);

/* The same sweep over the kernel cache's LMDB calls (cache/mdb.c's hook):
 * a recording run lists the calls a scenario makes and their sites, then
 * each call is failed in turn with each code of kt_mdb_codes (a full map,
 * a full disk, an I/O error, a full reader table), from the state reset
 * gives. Each such run either fails with KILN_ERR_CACHE or KILN_ERR_IO and
 * a message that names a file of the test's folder (kt_in_tmp) and the
 * error (mdb_strerror), or succeeds with the very result of the run that
 * failed nothing (the cache absorbed the failure: a full map grows and the
 * write runs again). Past KT_SWEEP_BUDGET runs, each site's first and last
 * call and an even spread of the rest are failed. kt_mdb_sweep prints the
 * count of calls, sites and runs; KILN_FAULT_SITES=1 lists every site with
 * the message its first failure gave. */
extern const int kt_mdb_codes[4];
void kt_mdb_sweep(const kt_scenario *s);
/* Every site the LMDB sweeps of this process failed so far ("cache/cache.c:236"). */
int kt_mdb_n_swept(void);
const char *kt_mdb_swept(int i);

/* The hook by itself: count the allocations from now on, recording each
 * one's site when asked, and fail the fail_at-th (from 1; 0: none). */
void kt_hook_arm(long fail_at, int recording);
void kt_hook_disarm(void);
long kt_hook_count(void);
const char *kt_hook_site(long i); /* of the recording run, from 1 */
/* "graph/gguf.c:282": a site without the source tree's directory. */
const char *kt_site_name(const char *site);

/* A fresh temporary folder per test (.init / .fini of a Test), and a path
 * in it. */
void kt_tmp_setup(void);
void kt_tmp_teardown(void);
const char *kt_in_tmp(char *buf, size_t size, const char *name);

/* The stand-in driver with its device and the stand-in NVRTC
 * (tests/harness), a kernel cache in the test's folder, the weights packed
 * on the host (the stand-in runs no kernel), and fail as KT_FAKE_CUDA_FAIL
 * (NULL: none). */
void kt_fake_device(const char *fail);

void kt_write_file(const char *path, const void *p, size_t n);
void kt_copy_file(const char *from, const char *to);

/* A growing byte buffer for the files the readers read; src NULL puts
 * zeros. */
typedef struct kt_buf {
    uint8_t *p;
    size_t n, cap;
} kt_buf;
void kt_put(kt_buf *b, const void *src, size_t n);
void kt_put_le(kt_buf *b, uint64_t v, int n);
void kt_pad(kt_buf *b, size_t align);

/* The cache file at path (a shipped layer, or the writable one) verifies,
 * with no bad record and at least at_least records. */
void kt_cache_intact(const char *path, int shipped, size_t at_least);

/* The pairs an LMDB file holds, key and value bytes as LMDB stores them,
 * read with LMDB itself (no lock file): to say that a file still holds
 * what it held, byte for byte. The file must be closed by everyone else. */
typedef struct kt_records {
    size_t n;
    kt_buf *pair; /* the key's 16 bytes, then the value */
} kt_records;
void kt_records_read(const char *path, kt_records *out);
void kt_records_free(kt_records *r);
/* Every pair of want is in have, byte for byte ("what: record 3 of 5 is
 * gone" otherwise); exact: and nothing else is. */
void kt_records_within(const kt_records *want, const kt_records *have, int exact, const char *what);

/* The model the sweeps share, in the demo's shape: two FFN blocks, x +
 * down(silu(gate(rms(x))) * up(rms(x))), in Q4_K and block FP8, then a
 * norm and an NVFP4 head with a bias and a GELU; both the head and the
 * residual stream are outputs, in that order. */
enum { KT_D_MODEL = 256, KT_D_FFN = 512, KT_D_HEAD = 128, KT_LAYERS = 2 };
typedef struct kt_model {
    kt_weight w[KT_LAYERS * 3 + 1];
    float norm[KT_LAYERS + 1][KT_D_MODEL];
} kt_model;
void kt_model_make(kt_model *m);
void kt_model_free(kt_model *m);
/* The graph of m, its order computed, so that a later plan or executor
 * allocates the same on every run. Fails as the builder calls do. */
kiln_status kt_model_graph(const kt_model *m, kiln_graph **out);

#endif
