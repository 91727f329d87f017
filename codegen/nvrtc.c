/* NVRTC through dlopen: kiln links no CUDA library, so a binary that only
 * replays a shipped cache starts on a machine without the toolkit. nvrtc.h
 * is used for its types alone.
 *
 * Options, and why:
 *   --gpu-architecture=<target>  a real architecture, so the output is a
 *                        CUBIN and no driver JIT runs at load time;
 *                        sm_90a keeps its suffix (the arch-specific
 *                        instructions wgmma needs)
 *   -default-device      template helpers need no __device__ marking
 *   -std=c++17           `if constexpr` in the templates
 *   -lineinfo            profilers map SASS to template lines; no effect
 *                        on the code
 * No --use_fast_math: kernels are checked against the CPU reference, and
 * the few transcendental calls (silu, gelu, rms_norm) are off the hot
 * path, so IEEE division, sqrt and denormals stay. No -I: every include
 * is an embedded header, which keeps paths out of cache keys. */
#include "codegen/nvrtc.h"

#include "codegen/emit.h"

#include <dlfcn.h>
#include <errno.h>
#include <nvrtc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef nvrtcResult (*nvrtc_version_fn)(int *, int *);
typedef const char *(*nvrtc_error_string_fn)(nvrtcResult);
typedef nvrtcResult (*nvrtc_create_fn)(nvrtcProgram *, const char *, const char *, int,
                                       const char *const *, const char *const *);
typedef nvrtcResult (*nvrtc_destroy_fn)(nvrtcProgram *);
typedef nvrtcResult (*nvrtc_compile_fn)(nvrtcProgram, int, const char *const *);
typedef nvrtcResult (*nvrtc_size_fn)(nvrtcProgram, size_t *);
typedef nvrtcResult (*nvrtc_get_fn)(nvrtcProgram, char *);

struct kiln_nvrtc {
    atomic_int refs; /* the opener's, and one per compile pool still running */
    void *lib;
    char library[256];
    char version_text[32];
    const char **header_text, **header_name;
    int n_headers;
    nvrtc_version_fn version;
    nvrtc_error_string_fn error_string;
    nvrtc_create_fn create;
    nvrtc_destroy_fn destroy;
    nvrtc_compile_fn compile;
    nvrtc_size_fn log_size;
    nvrtc_get_fn log;
    nvrtc_size_fn cubin_size;
    nvrtc_get_fn cubin;
    nvrtc_size_fn ptx_size;
    nvrtc_get_fn ptx;
};

/* The functions kiln calls; all exist since NVRTC 11.1 (nvrtcGetCUBIN). */
static const struct {
    const char *name;
    size_t offset;
} nvrtc_symbols[] = {
    { "nvrtcVersion", offsetof(kiln_nvrtc, version) },
    { "nvrtcGetErrorString", offsetof(kiln_nvrtc, error_string) },
    { "nvrtcCreateProgram", offsetof(kiln_nvrtc, create) },
    { "nvrtcDestroyProgram", offsetof(kiln_nvrtc, destroy) },
    { "nvrtcCompileProgram", offsetof(kiln_nvrtc, compile) },
    { "nvrtcGetProgramLogSize", offsetof(kiln_nvrtc, log_size) },
    { "nvrtcGetProgramLog", offsetof(kiln_nvrtc, log) },
    { "nvrtcGetCUBINSize", offsetof(kiln_nvrtc, cubin_size) },
    { "nvrtcGetCUBIN", offsetof(kiln_nvrtc, cubin) },
    { "nvrtcGetPTXSize", offsetof(kiln_nvrtc, ptx_size) },
    { "nvrtcGetPTX", offsetof(kiln_nvrtc, ptx) },
};

static const char *const nvrtc_libraries[] = { "libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so" };

static void *load_library(const char *env, char *name, size_t size)
{
    if (env) {
        snprintf(name, size, "%s", env);
        return dlopen(env, RTLD_NOW | RTLD_LOCAL);
    }
    for (size_t i = 0; i < KILN_ARRAY_LEN(nvrtc_libraries); i++) {
        void *lib = dlopen(nvrtc_libraries[i], RTLD_NOW | RTLD_LOCAL);
        if (lib) {
            snprintf(name, size, "%s", nvrtc_libraries[i]);
            return lib;
        }
    }
    return NULL;
}

kiln_status kiln_nvrtc_open(kiln_nvrtc **out)
{
    if (!out)
        return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_nvrtc_open: out is required");
    kiln_nvrtc *nv = kiln_calloc(1, sizeof *nv);
    if (!nv)
        return kiln_fail(KILN_ERR_NOMEM, "kiln_nvrtc_open: out of memory");
    atomic_init(&nv->refs, 1);
    kiln_env e;
    kiln_env_read(&e);
    const char *env = e.nvrtc;
    if (!(nv->lib = load_library(env, nv->library, sizeof nv->library))) {
        const char *err = dlerror();
        kiln_nvrtc_close(nv);
        if (env)
            return kiln_fail(KILN_ERR_NOT_FOUND, "NVRTC: $KILN_NVRTC=%s cannot be loaded: %s", env,
                             err ? err : "unknown error");
        return kiln_fail(KILN_ERR_NOT_FOUND,
                         "NVRTC: none of libnvrtc.so.13, libnvrtc.so.12, libnvrtc.so can be loaded "
                         "(%s); install the CUDA toolkit's NVRTC or set $KILN_NVRTC to the library",
                         err ? err : "unknown error");
    }
    for (size_t i = 0; i < KILN_ARRAY_LEN(nvrtc_symbols); i++) {
        void *sym = dlsym(nv->lib, nvrtc_symbols[i].name);
        if (!sym) {
            kiln_status st = kiln_fail(KILN_ERR_UNSUPPORTED,
                                       "NVRTC: %s has no %s (NVRTC 11.1 or newer is needed)",
                                       nv->library, nvrtc_symbols[i].name);
            dlclose(nv->lib); /* not NVRTC: nothing of it stays in use */
            nv->lib = NULL;
            kiln_nvrtc_close(nv);
            return st;
        }
        memcpy((char *)nv + nvrtc_symbols[i].offset, &sym, sizeof sym);
    }
    int major = 0, minor = 0;
    nv->version(&major, &minor);
    snprintf(nv->version_text, sizeof nv->version_text, "nvrtc %d.%d", major, minor);
    nv->n_headers = (int)kiln_embedded_headers_count;
    nv->header_text = kiln_calloc(kiln_embedded_headers_count, sizeof *nv->header_text);
    nv->header_name = kiln_calloc(kiln_embedded_headers_count, sizeof *nv->header_name);
    if (!nv->header_text || !nv->header_name) {
        kiln_nvrtc_close(nv);
        return kiln_fail(KILN_ERR_NOMEM, "kiln_nvrtc_open: out of memory");
    }
    for (size_t i = 0; i < kiln_embedded_headers_count; i++) {
        nv->header_text[i] = kiln_embedded_headers[i].text;
        nv->header_name[i] = kiln_embedded_headers[i].name;
    }
    *out = nv;
    return KILN_OK;
}

/* libnvrtc stays mapped once loaded: it carries its own C++ runtime, whose
 * process-lifetime allocations would be orphaned by an unload (and leak
 * checkers report them), and a later open finds it loaded. A compile
 * abandoned past its time limit holds a reference until it returns. */
void kiln_nvrtc_close(kiln_nvrtc *nv)
{
    if (!nv || atomic_fetch_sub(&nv->refs, 1) > 1)
        return;
    free(nv->header_text);
    free(nv->header_name);
    free(nv);
}

const char *kiln_nvrtc_version(const kiln_nvrtc *nv) { return nv->version_text; }

const char *kiln_nvrtc_library(const kiln_nvrtc *nv) { return nv->library; }

/* ------------------------------------------------------------ compiling */

enum { NVRTC_MAX_OPTIONS = 8, NVRTC_OPTIONS_TEXT = 256 };

void kiln_nvrtc_options(const kiln_target *t, char *buf, size_t size)
{
    snprintf(buf, size, "--gpu-architecture=%s -default-device -std=c++17 -lineinfo", t->name);
}

void kiln_compile_job_reset(kiln_compile_job *job)
{
    if (!job)
        return;
    free(job->message);
    free(job->log);
    free(job->ptx);
    free(job->cubin);
    job->message = job->log = job->ptx = NULL;
    job->cubin = NULL;
    job->cubin_size = 0;
    job->status = KILN_OK;
    job->seconds = 0.0;
}

/* Copy one of the program's outputs (log, PTX, CUBIN) into malloc'ed
 * memory; text outputs come NUL-terminated from NVRTC. */
static kiln_status program_output(kiln_nvrtc *nv, nvrtcProgram prog, nvrtc_size_fn size_fn,
                                  nvrtc_get_fn get_fn, const kiln_compile_job *job,
                                  const char *what, char **out, size_t *size)
{
    size_t n = 0;
    nvrtcResult r = size_fn(prog, &n);
    char *buf = r == NVRTC_SUCCESS ? kiln_malloc(n ? n : 1) : NULL;
    if (r == NVRTC_SUCCESS && !buf)
        return kiln_fail(KILN_ERR_NOMEM, "NVRTC: out of memory for the %s of %s", what, job->name);
    if (r == NVRTC_SUCCESS && n)
        r = get_fn(prog, buf);
    if (r != NVRTC_SUCCESS) {
        free(buf);
        return kiln_fail(KILN_ERR_COMPILE, "NVRTC: %s of %s for %s: %s", what, job->name,
                         job->target->name, nv->error_string(r));
    }
    if (!n)
        buf[0] = '\0';
    *out = buf;
    if (size)
        *size = n;
    return KILN_OK;
}

/* The options text split at spaces into argv form, in buf. */
static int split_options(char *buf, const char *opts[NVRTC_MAX_OPTIONS])
{
    int n = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, " ", &save); tok && n < NVRTC_MAX_OPTIONS;
         tok = strtok_r(NULL, " ", &save))
        opts[n++] = tok;
    return n;
}

static kiln_status compile_program(kiln_nvrtc *nv, kiln_compile_job *job, nvrtcProgram prog,
                                   int keep)
{
    char text[NVRTC_OPTIONS_TEXT];
    const char *opts[NVRTC_MAX_OPTIONS];
    kiln_nvrtc_options(job->target, text, sizeof text);
    int n_opts = split_options(text, opts);
    nvrtcResult r = nv->compile(prog, n_opts, opts);
    kiln_status st = program_output(nv, prog, nv->log_size, nv->log, job, "log", &job->log, NULL);
    if (st != KILN_OK)
        return st;
    if (r != NVRTC_SUCCESS)
        return kiln_fail(KILN_ERR_COMPILE, "NVRTC: %s for %s: %s\n%s", job->name,
                         job->target->name, nv->error_string(r), job->log);
    if (keep && (st = program_output(nv, prog, nv->ptx_size, nv->ptx, job, "PTX", &job->ptx,
                                     NULL)))
        return st;
    char *cubin = NULL;
    st = program_output(nv, prog, nv->cubin_size, nv->cubin, job, "CUBIN", &cubin,
                        &job->cubin_size);
    job->cubin = cubin;
    return st;
}

kiln_status kiln_nvrtc_compile(kiln_nvrtc *nv, kiln_compile_job *job, const char *keep_dir)
{
    if (!nv || !job || !job->name || !job->entry || !job->source || !job->target)
        return kiln_fail(KILN_ERR_INVALID_ARG,
                         "kiln_nvrtc_compile: a job needs name, entry, source and target");
    kiln_compile_job_reset(job);
    double start = kiln_now();
    const char *keep = kiln_emit_keep_dir(keep_dir);
    char program_name[KILN_ENTRY_MAX + 4];
    snprintf(program_name, sizeof program_name, "%s.cu", job->entry);
    nvrtcProgram prog = NULL;
    nvrtcResult r = nv->create(&prog, job->source, program_name, nv->n_headers, nv->header_text,
                               nv->header_name);
    kiln_status st;
    if (r != NVRTC_SUCCESS) {
        st = kiln_fail(KILN_ERR_COMPILE, "NVRTC: creating the program of %s: %s", job->name,
                       nv->error_string(r));
    } else {
        st = compile_program(nv, job, prog, keep != NULL);
        nv->destroy(&prog);
    }
    if (keep) {
        char saved[1024];
        snprintf(saved, sizeof saved, "%s", kiln_last_error());
        kiln_status kst = kiln_emit_keep(keep, job->entry, job->source, job->log, job->ptx);
        if (st == KILN_OK)
            st = kst;
        else
            kiln_fail(st, "%s", saved);
    }
    job->seconds = kiln_now() - start;
    job->status = st;
    if (st != KILN_OK) {
        free(job->cubin);
        job->cubin = NULL;
        job->cubin_size = 0;
        job->message = kiln_strdup(kiln_last_error());
    }
    return st;
}

/* ------------------------------------------------------------ the pool */

/* The caller watches the clock while threads compile. A compile past its
 * time limit cannot be stopped (NVRTC has no cancel, and killing a thread
 * inside it would leave its locks held), so it is abandoned: its job fails,
 * a new thread takes its place, and the thread is left to finish on its
 * own. So that such a thread touches nothing of the caller's once the call
 * returns, the pool holds its own copy of every job's inputs and outputs,
 * and a reference to the NVRTC handle; the last of the caller and its
 * threads to leave frees it. */
typedef enum pool_state {
    JOB_WAITING = 0,
    JOB_RUNNING,
    JOB_DONE,
    JOB_ABANDONED,
    JOB_SKIPPED, /* never started: the caller asked the pool to stop */
} pool_state;

typedef struct pool_worker {
    struct compile_pool *pool;
    pthread_t tid;
    int abandoned; /* its job was: it leaves once the compile returns */
} pool_worker;

typedef struct pool_job {
    kiln_compile_job job; /* inputs copied into text */
    kiln_target target;
    pool_state state;
    double started;
    pool_worker *worker;  /* running it; NULL: the caller */
    char *text;
    int delivered;        /* its result has gone to the caller's job */
} pool_job;

typedef struct compile_pool {
    pthread_mutex_t mu;
    pthread_cond_t changed; /* a job finished or a thread left */
    int refs;               /* the caller and every thread still running */
    kiln_nvrtc *nv;
    pool_job *jobs;
    int n, next, finished;  /* finished: done or abandoned */
    pool_worker *workers;   /* one per thread ever started, room for n more */
    int n_workers, cap_workers;
    int live;               /* threads taking jobs (not abandoned, not left) */
    char *keep;
    kiln_progress progress; /* mode 0 when the caller wants none */
    const volatile sig_atomic_t *stop; /* set: take no more jobs */
} compile_pool;

static void pool_free(compile_pool *p)
{
    for (int i = 0; p->jobs && i < p->n; i++) {
        kiln_compile_job_reset(&p->jobs[i].job);
        free(p->jobs[i].text);
    }
    kiln_nvrtc_close(p->nv);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->changed);
    free(p->jobs);
    free(p->workers);
    free(p->keep);
    free(p);
}

/* Drop one reference; called with mu held, returns with it released. */
static void pool_leave(compile_pool *p)
{
    bool last = --p->refs == 0;
    pthread_mutex_unlock(&p->mu);
    if (last)
        pool_free(p);
}

static char *copy_text(char **at, const char *s)
{
    size_t n = strlen(s) + 1;
    char *out = memcpy(*at, s, n);
    *at += n;
    return out;
}

static kiln_status pool_create(kiln_nvrtc *nv, const kiln_compile_job *jobs, int n, int threads,
                               const char *keep, compile_pool **out)
{
    compile_pool *p = kiln_calloc(1, sizeof *p);
    pthread_condattr_t ca;
    int cond = p && !pthread_condattr_init(&ca);
    if (cond) {
        cond = !pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) && !pthread_cond_init(&p->changed, &ca);
        pthread_condattr_destroy(&ca);
    }
    if (!cond) {
        free(p);
        return kiln_fail(KILN_ERR_NOMEM, "NVRTC: out of memory for the compile pool of %d kernels", n);
    }
    pthread_mutex_init(&p->mu, NULL);
    p->refs = 1;
    p->n = n;
    p->cap_workers = threads + n;
    p->jobs = kiln_calloc((size_t)n, sizeof *p->jobs);
    p->workers = kiln_calloc((size_t)p->cap_workers, sizeof *p->workers);
    p->keep = keep ? kiln_strdup(keep) : NULL;
    kiln_status st = p->jobs && p->workers && (!keep || p->keep) ? KILN_OK : KILN_ERR_NOMEM;
    for (int i = 0; i < n && !st; i++) {
        const kiln_compile_job *j = &jobs[i];
        pool_job *pj = &p->jobs[i];
        char *at = pj->text = kiln_malloc(strlen(j->name) + strlen(j->entry) + strlen(j->source) + 3);
        if (!at) {
            st = KILN_ERR_NOMEM;
            break;
        }
        pj->target = *j->target;
        pj->job = (kiln_compile_job){ .name = copy_text(&at, j->name),
                                      .entry = copy_text(&at, j->entry),
                                      .source = copy_text(&at, j->source),
                                      .target = &pj->target };
    }
    if (st) {
        pool_free(p);
        return kiln_fail(st, "NVRTC: out of memory for the compile pool of %d kernels", n);
    }
    atomic_fetch_add(&nv->refs, 1);
    p->nv = nv;
    *out = p;
    return KILN_OK;
}

/* "compiling kernels: 12/40, 4 s, ETA 9 s" — the ETA from the mean time per
 * finished job so far, over the jobs left. On a terminal the line is
 * rewritten in place after each job; elsewhere a new line comes every
 * KILN_PROGRESS_EVERY_S and at the end. Called with mu held. */
static void progress_line(compile_pool *p)
{
    double elapsed = kiln_now() - p->progress.start;
    double eta = elapsed / p->finished * (p->n - p->finished);
    kiln_progress_show(&p->progress, p->finished == p->n,
                       "compiling kernels: %d/%d, %.0f s, ETA %.0f s", p->finished, p->n, elapsed,
                       eta);
}

/* Compile jobs until none is waiting, or until the caller abandons w's
 * job; w NULL: the caller itself. Called and returns with mu held. */
static void pool_run(compile_pool *p, pool_worker *w)
{
    while (p->next < p->n && !(p->stop && *p->stop)) {
        pool_job *j = &p->jobs[p->next++];
        j->state = JOB_RUNNING;
        j->started = kiln_now();
        j->worker = w;
        pthread_cond_signal(&p->changed); /* the caller sets its clock by it */
        pthread_mutex_unlock(&p->mu);
        kiln_nvrtc_compile(p->nv, &j->job, p->keep);
        pthread_mutex_lock(&p->mu);
        if (j->state == JOB_ABANDONED)
            return;
        j->state = JOB_DONE;
        p->finished++;
        progress_line(p);
        pthread_cond_signal(&p->changed);
    }
}

static void *compile_worker(void *arg)
{
    pool_worker *w = arg;
    compile_pool *p = w->pool;
    pthread_mutex_lock(&p->mu);
    pool_run(p, w);
    if (!w->abandoned)
        p->live--;
    pthread_cond_signal(&p->changed);
    pool_leave(p);
    return NULL;
}

/* Start a thread that takes jobs; called with mu held. A thread that
 * cannot be started only makes the pool smaller. */
static void pool_start(compile_pool *p)
{
    if (p->n_workers == p->cap_workers)
        return;
    pool_worker *w = &p->workers[p->n_workers];
    *w = (pool_worker){ .pool = p };
    p->refs++;
    if (pthread_create(&w->tid, NULL, compile_worker, w)) {
        p->refs--;
        return;
    }
    p->n_workers++;
    p->live++;
}

/* Abandon every job past the limit, and start a thread in place of each
 * one's while jobs wait; the time of the next check, 0 for none. Called
 * with mu held. */
static double pool_watch(compile_pool *p, double limit)
{
    double now = kiln_now(), next = 0;
    for (int i = 0; i < p->n; i++) {
        pool_job *j = &p->jobs[i];
        if (j->state != JOB_RUNNING || !j->worker || limit <= 0)
            continue;
        if (now - j->started < limit) {
            if (!next || j->started + limit < next)
                next = j->started + limit;
            continue;
        }
        j->state = JOB_ABANDONED;
        j->worker->abandoned = 1;
        p->finished++;
        p->live--;
        if (p->next < p->n)
            pool_start(p);
    }
    return next;
}

static void pool_wait(compile_pool *p, double until)
{
    if (!until) {
        pthread_cond_wait(&p->changed, &p->mu);
        return;
    }
    struct timespec ts = { .tv_sec = (time_t)until };
    ts.tv_nsec = (long)((until - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec >= 1000000000L)
        ts = (struct timespec){ .tv_sec = ts.tv_sec + 1 };
    pthread_cond_timedwait(&p->changed, &p->mu, &ts);
}

/* Move a finished job's outputs to the caller's job; an abandoned one fails. */
static void pool_result(const compile_pool *p, pool_job *j, kiln_compile_job *out, double limit)
{
    kiln_compile_job_reset(out);
    if (j->state == JOB_SKIPPED) {
        out->status = kiln_fail(KILN_ERR_STATE, "%s for %s: interrupted before it compiled",
                                out->name, out->target->name);
        out->message = kiln_strdup(kiln_last_error());
        return;
    }
    if (j->state == JOB_DONE) {
        out->status = j->job.status;
        out->message = j->job.message;
        out->log = j->job.log;
        out->ptx = j->job.ptx;
        out->cubin = j->job.cubin;
        out->cubin_size = j->job.cubin_size;
        out->seconds = j->job.seconds;
        j->job.message = j->job.log = j->job.ptx = NULL;
        j->job.cubin = NULL;
        return;
    }
    out->status = kiln_fail(KILN_ERR_COMPILE,
                            "NVRTC: %s for %s: no result after %g s, the time limit of one "
                            "compile (%s; a longer limit: KILN_COMPILE_TIMEOUT)",
                            out->name, out->target->name, limit, kiln_nvrtc_library(p->nv));
    out->message = kiln_strdup(kiln_last_error());
    out->seconds = limit;
}

/* How often a pool that can be stopped looks at its flag. */
#define STOP_POLL_S 0.2

/* Stop: every job not started yet is skipped. Called with mu held. */
static void pool_skip(compile_pool *p)
{
    for (; p->next < p->n; p->next++) {
        p->jobs[p->next].state = JOB_SKIPPED;
        p->finished++;
    }
}

/* Move every finished or abandoned job's result to the caller's job and
 * hand it to on_done, without mu: on_done may take its time (storing the
 * kernel) while the threads compile on. Called and returns with mu held;
 * returns how many it delivered. */
static int pool_deliver(compile_pool *p, kiln_compile_job *jobs, const kiln_nvrtc_pool *o)
{
    int delivered = 0;
    for (int i = 0; i < p->n; i++) {
        pool_job *j = &p->jobs[i];
        if (j->delivered || j->state == JOB_WAITING || j->state == JOB_RUNNING)
            continue;
        pool_result(p, j, &jobs[i], o->timeout_s);
        j->delivered = 1;
        delivered++;
        if (o->on_done) {
            pthread_mutex_unlock(&p->mu);
            o->on_done(o->ctx, i, &jobs[i]);
            pthread_mutex_lock(&p->mu);
        }
    }
    return delivered;
}

kiln_status kiln_nvrtc_compile_all(kiln_nvrtc *nv, kiln_compile_job *jobs, int n,
                                   const kiln_nvrtc_pool *o)
{
    const kiln_nvrtc_pool defaults = { 0 };
    if (!o)
        o = &defaults;
    if (!nv || (n > 0 && !jobs) || n < 0)
        return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_nvrtc_compile_all: nvrtc and %d jobs", n);
    for (int i = 0; i < n; i++)
        if (!jobs[i].name || !jobs[i].entry || !jobs[i].source || !jobs[i].target)
            return kiln_fail(KILN_ERR_INVALID_ARG,
                             "kiln_nvrtc_compile_all: job %d needs name, entry, source and target", i);
    if (n == 0)
        return KILN_OK;
    int threads = o->threads > 0 ? o->threads : kiln_cpu_count();
    if (threads > n)
        threads = n;
    compile_pool *p = NULL;
    kiln_status st = pool_create(nv, jobs, n, threads, o->keep_dir, &p);
    if (st)
        return st;
    kiln_progress_start(&p->progress, o->quiet || n < 2, 0, 0);
    p->stop = o->stop;

    /* With no thread to compile, the caller compiles, and nothing watches
     * the clock. */
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < threads; i++)
        pool_start(p);
    while (p->finished < n) {
        if (o->stop && *o->stop)
            pool_skip(p);
        if (!p->live && p->next < n) {
            pool_run(p, NULL);
            pool_deliver(p, jobs, o);
            continue;
        }
        double next = pool_watch(p, o->timeout_s);
        if (pool_deliver(p, jobs, o))
            continue; /* a job may have finished while the caller had it */
        /* A signal does not wake the wait: look at *stop now and then. */
        if (o->stop && (!next || next > kiln_now() + STOP_POLL_S))
            next = kiln_now() + STOP_POLL_S;
        if (p->finished < n)
            pool_wait(p, next);
    }
    p->next = n;
    pool_deliver(p, jobs, o);
    pthread_mutex_unlock(&p->mu);
    /* Threads whose job was abandoned are left running, detached; the
     * others have taken their last job and leave. */
    for (int i = 0; i < p->n_workers; i++) {
        if (p->workers[i].abandoned)
            pthread_detach(p->workers[i].tid);
        else
            pthread_join(p->workers[i].tid, NULL);
    }
    pthread_mutex_lock(&p->mu);
    pool_leave(p);
    return kiln_compile_jobs_status(jobs, n);
}

kiln_status kiln_compile_jobs_status(const kiln_compile_job *jobs, int n)
{
    int failed = 0, first = -1;
    for (int i = 0; i < n; i++)
        if (jobs[i].status != KILN_OK) {
            failed++;
            if (first < 0)
                first = i;
        }
    if (!failed)
        return KILN_OK;
    const char *msg = jobs[first].message ? jobs[first].message : "out of memory";
    if (failed == 1)
        return kiln_fail(jobs[first].status, "%s", msg);
    return kiln_fail(jobs[first].status, "%d of %d kernels failed; the first: %s", failed, n, msg);
}
