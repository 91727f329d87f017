/* The NVRTC driver: libnvrtc loaded at run time (a process that only reads
 * a shipped cache never needs it), generated sources compiled to CUBIN for
 * a named architecture with the embedded templates as in-memory headers,
 * one at a time or by a pool of threads. NVRTC needs no GPU. */
#ifndef KILN_NVRTC_H
#define KILN_NVRTC_H

#include "core.h"

#include <signal.h>

typedef struct kiln_nvrtc kiln_nvrtc;

/* Load libnvrtc: the file $KILN_NVRTC names when set, else the first of
 * libnvrtc.so.13, libnvrtc.so.12, libnvrtc.so the dynamic linker finds.
 * KILN_ERR_NOT_FOUND when none loads (the message lists what was tried);
 * KILN_ERR_UNSUPPORTED when the library lacks a function kiln calls. */
kiln_status kiln_nvrtc_open(kiln_nvrtc **out);
void kiln_nvrtc_close(kiln_nvrtc *nv);

/* "nvrtc 13.0": recorded in cache records, never part of a key. */
const char *kiln_nvrtc_version(const kiln_nvrtc *nv);
/* The library as it was asked for ("libnvrtc.so.13" or $KILN_NVRTC). */
const char *kiln_nvrtc_library(const kiln_nvrtc *nv);

/* The compile options for t, space-separated, in the order NVRTC gets
 * them; part of the cache key. */
void kiln_nvrtc_options(const kiln_target *t, char *buf, size_t size);

/* One compilation. The caller fills the inputs and zeroes the rest; the
 * outputs are malloc'ed and released by kiln_compile_job_reset. */
typedef struct kiln_compile_job {
    const char *name;         /* the signature, named by messages */
    const char *entry;        /* kept files are named after it */
    const char *source;
    const kiln_target *target;
    kiln_status status;       /* KILN_OK or why it failed */
    char *message;            /* on failure: the detail message */
    char *log;                /* NVRTC's whole log ("" when it had nothing to say) */
    char *ptx;                /* the PTX, only while sources are kept */
    void *cubin;
    size_t cubin_size;
    double seconds;           /* wall time of this job */
} kiln_compile_job;

void kiln_compile_job_reset(kiln_compile_job *job);

/* Compile job->source for job->target into job->cubin. With keep_dir (or
 * kiln_emit_keep_dir's $KILN_DUMP_SOURCE), the source, the log and the
 * PTX are written there, a failed compile's too. KILN_ERR_COMPILE when
 * NVRTC refuses: the message names the signature and the target and
 * carries the log as far as the detail message holds; job->log has all
 * of it. KILN_ERR_IO when keeping fails. */
kiln_status kiln_nvrtc_compile(kiln_nvrtc *nv, kiln_compile_job *job, const char *keep_dir);

typedef struct kiln_nvrtc_pool {
    int threads;          /* compiles at once; 0: one per online core */
    const char *keep_dir; /* as kiln_nvrtc_compile's */
    int quiet;            /* no progress lines */
    double timeout_s;     /* the time one compile may take; 0: no limit */
    /* Called on the caller's thread with each job (index i) as soon as its
     * result is in jobs[i], failed and abandoned jobs included, in the
     * order they finish, while the other jobs compile on; it may take the
     * job's outputs. NULL: none. */
    void (*on_done)(void *ctx, int i, kiln_compile_job *job);
    void *ctx;
    /* Once *stop is nonzero (a signal handler may set it) no job starts:
     * the ones compiling finish, the others fail with KILN_ERR_STATE
     * ("interrupted"). NULL: none. */
    const volatile sig_atomic_t *stop;
} kiln_nvrtc_pool;

/* Compile every job, `threads` at a time on threads of the pool's own
 * while the caller watches the clock; every job runs even when some fail.
 * A compile past timeout_s fails its job with KILN_ERR_COMPILE naming the
 * signature and the limit; its thread, which nothing can stop inside
 * NVRTC, is left to finish on its own, its result dropped, and another
 * takes its place. When no thread can be started the caller compiles, with
 * no limit. Unless quiet, stderr shows "done/total" and an ETA: on a
 * terminal one line rewritten as jobs finish, elsewhere a line every few
 * seconds and one at the end. Returns the first failed job's status
 * (lowest index) with its message, prefixed with the failure count when
 * more than one failed; KILN_ERR_INVALID_ARG, and
 * nothing compiled, when a job lacks an input; KILN_ERR_NOMEM. o may be
 * NULL. */
kiln_status kiln_nvrtc_compile_all(kiln_nvrtc *nv, kiln_compile_job *jobs, int n,
                                   const kiln_nvrtc_pool *o);

/* What kiln_nvrtc_compile_all returns for jobs it ran, again: KILN_OK, or
 * the first failure's status and message, with the count when more than
 * one failed. */
kiln_status kiln_compile_jobs_status(const kiln_compile_job *jobs, int n);

#endif
