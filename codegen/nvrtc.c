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
#include <nvrtc.h>
#include <pthread.h>
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
 * checkers report them), and a later open finds it loaded. */
void kiln_nvrtc_close(kiln_nvrtc *nv)
{
    if (!nv)
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

typedef struct compile_pool {
    kiln_nvrtc *nv;
    kiln_compile_job *jobs;
    int n;
    const char *keep;
    pthread_mutex_t mu;
    int next, done;
    int progress; /* stderr is a terminal and the caller wants the line */
    double start;
} compile_pool;

/* "\rcompiling kernels: 12/40, ETA 9 s" — the ETA from the mean time per
 * finished job so far, over the jobs left. Called with mu held. */
static void progress_line(const compile_pool *p)
{
    double elapsed = kiln_now() - p->start;
    double eta = elapsed / p->done * (p->n - p->done);
    fprintf(stderr, "\rcompiling kernels: %d/%d, %.0f s, ETA %.0f s   ", p->done, p->n, elapsed,
            eta);
    if (p->done == p->n)
        fputc('\n', stderr);
    fflush(stderr);
}

static void *compile_worker(void *arg)
{
    compile_pool *p = arg;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        int i = p->next < p->n ? p->next++ : -1;
        pthread_mutex_unlock(&p->mu);
        if (i < 0)
            return NULL;
        kiln_nvrtc_compile(p->nv, &p->jobs[i], p->keep);
        pthread_mutex_lock(&p->mu);
        p->done++;
        if (p->progress)
            progress_line(p);
        pthread_mutex_unlock(&p->mu);
    }
}

kiln_status kiln_nvrtc_compile_all(kiln_nvrtc *nv, kiln_compile_job *jobs, int n,
                                   const kiln_nvrtc_pool *o)
{
    const kiln_nvrtc_pool defaults = { 0 };
    if (!o)
        o = &defaults;
    if (!nv || (n > 0 && !jobs) || n < 0)
        return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_nvrtc_compile_all: nvrtc and %d jobs", n);
    compile_pool p = {
        .nv = nv,
        .jobs = jobs,
        .n = n,
        .keep = o->keep_dir,
        .mu = PTHREAD_MUTEX_INITIALIZER,
        .progress = !o->quiet && n > 1 && isatty(STDERR_FILENO),
        .start = kiln_now(),
    };
    int threads = o->threads > 0 ? o->threads : kiln_cpu_count();
    if (threads > n)
        threads = n;
    /* The caller is one of the workers; a thread that cannot be started
     * only makes the pool smaller. */
    pthread_t *tids = threads > 1 ? kiln_malloc((size_t)(threads - 1) * sizeof *tids) : NULL;
    int started = 0;
    for (int i = 0; tids && i < threads - 1; i++)
        if (pthread_create(&tids[started], NULL, compile_worker, &p) == 0)
            started++;
    compile_worker(&p);
    for (int i = 0; i < started; i++)
        pthread_join(tids[i], NULL);
    free(tids);
    pthread_mutex_destroy(&p.mu);

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
