/* A stand-in for libnvrtc.so, loaded through KILN_NVRTC by the tests that
 * make NVRTC fail (tests/codegen/test_nvrtc_fault.c) or need compiles that
 * take no time (tests/cache/test_lmdb_fault.c). A program compiles at once
 * to a small cubin (an ELF header for the target and bytes that follow from
 * the source) unless KT_FAKE_NVRTC names a failure:
 *   create   nvrtcCreateProgram fails (NVRTC_ERROR_OUT_OF_MEMORY)
 *   compile  nvrtcCompileProgram fails (NVRTC_ERROR_COMPILATION) with a log
 *   cubin    nvrtcGetCUBIN fails (NVRTC_ERROR_INVALID_PROGRAM)
 *   hang     nvrtcCompileProgram returns after KT_FAKE_NVRTC_SLEEP seconds
 *            (default an hour)
 * and, when KT_FAKE_NVRTC_MATCH is set, only for a program whose source
 * holds that text; the others compile. */
#include "tests/cache/fake_cubin.h"

#include <nvrtc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FAKE_API __attribute__((visibility("default")))

enum { CUBIN_BYTES = KT_ELF_HEADER + 64 };

typedef struct fake_program {
    char *source;
    int failing;  /* the failure applies to this program */
    int compiled;
    uint8_t cubin[CUBIN_BYTES];
    const char *log;
} fake_program;

static const char *mode(const char *name)
{
    const char *m = getenv("KT_FAKE_NVRTC");
    return m && !strcmp(m, name) ? m : NULL;
}

FAKE_API nvrtcResult nvrtcVersion(int *major, int *minor)
{
    *major = 13;
    *minor = 0;
    return NVRTC_SUCCESS;
}

FAKE_API const char *nvrtcGetErrorString(nvrtcResult r)
{
    switch (r) {
    case NVRTC_SUCCESS: return "NVRTC_SUCCESS";
    case NVRTC_ERROR_OUT_OF_MEMORY: return "NVRTC_ERROR_OUT_OF_MEMORY";
    case NVRTC_ERROR_INVALID_INPUT: return "NVRTC_ERROR_INVALID_INPUT";
    case NVRTC_ERROR_INVALID_PROGRAM: return "NVRTC_ERROR_INVALID_PROGRAM";
    case NVRTC_ERROR_COMPILATION: return "NVRTC_ERROR_COMPILATION";
    default: return "NVRTC_ERROR (the fake NVRTC of the tests)";
    }
}

FAKE_API nvrtcResult nvrtcCreateProgram(nvrtcProgram *prog, const char *src, const char *name,
                                        int n_headers, const char *const *headers,
                                        const char *const *include_names)
{
    (void)name;
    (void)n_headers;
    (void)headers;
    (void)include_names;
    const char *match = getenv("KT_FAKE_NVRTC_MATCH");
    int failing = !match || strstr(src, match);
    if (failing && mode("create"))
        return NVRTC_ERROR_OUT_OF_MEMORY;
    fake_program *p = calloc(1, sizeof *p);
    if (!p || !(p->source = strdup(src))) {
        free(p);
        return NVRTC_ERROR_OUT_OF_MEMORY;
    }
    p->failing = failing;
    p->log = "";
    *prog = (nvrtcProgram)p;
    return NVRTC_SUCCESS;
}

FAKE_API nvrtcResult nvrtcDestroyProgram(nvrtcProgram *prog)
{
    fake_program *p = (fake_program *)*prog;
    if (p)
        free(p->source);
    free(p);
    *prog = NULL;
    return NVRTC_SUCCESS;
}

static void sleep_for(double s)
{
    struct timespec ts = { .tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9) };
    while (nanosleep(&ts, &ts))
        ;
}

FAKE_API nvrtcResult nvrtcCompileProgram(nvrtcProgram prog, int n_opts, const char *const *opts)
{
    fake_program *p = (fake_program *)prog;
    unsigned sm = 0;
    for (int i = 0; i < n_opts; i++)
        if (sscanf(opts[i], "--gpu-architecture=sm_%u", &sm) == 1)
            break;
    if (!sm) {
        p->log = "fake nvrtc: no --gpu-architecture=sm_NN option\n";
        return NVRTC_ERROR_INVALID_OPTION;
    }
    if (p->failing && mode("hang")) {
        const char *s = getenv("KT_FAKE_NVRTC_SLEEP");
        sleep_for(s ? atof(s) : 3600);
    }
    if (p->failing && mode("compile")) {
        p->log = "kernel.cu(1): error: the fake NVRTC refuses this source\n"
                 "1 error detected in the compilation of \"kernel.cu\".\n";
        return NVRTC_ERROR_COMPILATION;
    }
    /* FNV-1a of the source: another kernel, another cubin. */
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *c = p->source; *c; c++)
        h = (h ^ (uint8_t)*c) * 0x100000001b3ull;
    kt_elf_header(p->cubin, sm);
    for (int i = KT_ELF_HEADER; i < CUBIN_BYTES; i++)
        p->cubin[i] = (uint8_t)(h >> (8 * (i % 8)));
    p->compiled = 1;
    return NVRTC_SUCCESS;
}

FAKE_API nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram prog, size_t *size)
{
    *size = strlen(((fake_program *)prog)->log) + 1;
    return NVRTC_SUCCESS;
}

FAKE_API nvrtcResult nvrtcGetProgramLog(nvrtcProgram prog, char *log)
{
    strcpy(log, ((fake_program *)prog)->log);
    return NVRTC_SUCCESS;
}

FAKE_API nvrtcResult nvrtcGetCUBINSize(nvrtcProgram prog, size_t *size)
{
    fake_program *p = (fake_program *)prog;
    if (!p->compiled)
        return NVRTC_ERROR_INVALID_PROGRAM;
    *size = sizeof p->cubin;
    return NVRTC_SUCCESS;
}

FAKE_API nvrtcResult nvrtcGetCUBIN(nvrtcProgram prog, char *cubin)
{
    fake_program *p = (fake_program *)prog;
    if (!p->compiled || (p->failing && mode("cubin")))
        return NVRTC_ERROR_INVALID_PROGRAM;
    memcpy(cubin, p->cubin, sizeof p->cubin);
    return NVRTC_SUCCESS;
}

static const char fake_ptx[] = "// the fake NVRTC writes no PTX\n";

FAKE_API nvrtcResult nvrtcGetPTXSize(nvrtcProgram prog, size_t *size)
{
    (void)prog;
    *size = sizeof fake_ptx;
    return NVRTC_SUCCESS;
}

FAKE_API nvrtcResult nvrtcGetPTX(nvrtcProgram prog, char *ptx)
{
    (void)prog;
    memcpy(ptx, fake_ptx, sizeof fake_ptx);
    return NVRTC_SUCCESS;
}
