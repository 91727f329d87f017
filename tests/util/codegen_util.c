/* What the codegen suites share (codegen_util.h). */
#include "codegen_util.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clirun.h"
#include "kernels/registry/backend.h"

char *kt_linear_sig(char *buf, size_t size, const char *backend, const char *variant,
                    kiln_format f, const char *act, int64_t n, int64_t k, unsigned epi,
                    const char *arch)
{
    char epi_text[64];
    snprintf(buf, size,
             "linear backend=%s variant=%s format=%s scales=x act=%s n=%lld k=%lld "
             "epilogue=%s out=bf16 target=%s",
             backend, variant, kiln_format_get(f)->name, act, (long long)n, (long long)k,
             kiln_epilogue_name(epi, epi_text, sizeof epi_text), arch);
    return buf;
}

long long kt_source_param(const char *text, const char *name)
{
    char key[64];
    snprintf(key, sizeof key, "/*%s*/ ", name);
    const char *at = strstr(text, key);
    cr_assert_not_null(at, "no %s in\n%s", name, text);
    return strtoll(at + strlen(key), NULL, 10);
}

void kt_batch_add(kt_batch *b, const char *signature)
{
    if (b->n == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 64;
        b->src = realloc(b->src, (size_t)b->cap * sizeof *b->src);
        b->jobs = realloc(b->jobs, (size_t)b->cap * sizeof *b->jobs);
        b->sig = realloc(b->sig, (size_t)b->cap * sizeof *b->sig);
        cr_assert(b->src && b->jobs && b->sig);
    }
    cr_assert_eq(kiln_emit_text(kiln_registry_default(), signature, &b->src[b->n]), KILN_OK,
                 "%s: %s", signature, kiln_last_error());
    cr_assert_not_null(b->sig[b->n] = strdup(signature));
    b->n++;
}

void kt_batch_compile(kt_batch *b, const char *what)
{
    kiln_nvrtc *nv = NULL;
    cr_assert_eq(kiln_nvrtc_open(&nv), KILN_OK,
                 "libnvrtc cannot be loaded, and these tests need it: %s", kiln_last_error());
    for (int i = 0; i < b->n; i++)
        b->jobs[i] = (kiln_compile_job){ .name = b->sig[i], .entry = b->src[i].desc.entry,
                                         .source = b->src[i].text,
                                         .target = &b->src[i].desc.target };
    const kiln_nvrtc_pool pool = { .threads = 2, .quiet = 1 };
    double start = kiln_now();
    cr_assert_eq(kiln_nvrtc_compile_all(nv, b->jobs, b->n, &pool), KILN_OK, "%s",
                 kiln_last_error());
    double wall = kiln_now() - start, sum = 0, max = 0;
    for (int i = 0; i < b->n; i++) {
        cr_assert_gt(b->jobs[i].cubin_size, 0);
        sum += b->jobs[i].seconds;
        max = b->jobs[i].seconds > max ? b->jobs[i].seconds : max;
    }
    fprintf(stderr, "%s: %d kernels in %.1f s wall, %.2f s mean, %.2f s max per kernel\n", what,
            b->n, wall, sum / b->n, max);
    for (int i = 0; i < b->n; i++) {
        kiln_kernel_source_free(&b->src[i]);
        kiln_compile_job_reset(&b->jobs[i]);
        free(b->sig[i]);
    }
    free(b->src);
    free(b->jobs);
    free(b->sig);
    *b = (kt_batch){ 0 };
    kiln_nvrtc_close(nv);
}

char *kt_dump_sass(const void *cubin, size_t size)
{
    /* The tools on PATH, or those scripts/setup unpacked into the build:
     * env is then the PATH its commands run with. */
    static const char probe[] = "cuobjdump --version >/dev/null 2>&1 && "
                                "nvdisasm --version >/dev/null 2>&1";
    char env[1024] = "", cmd[1600];
    if (system(probe)) {
        const char *bin = getenv("KILN_BINARY_DIR");
        if (bin && strlen(bin) < 900 && !strchr(bin, '\'')) {
            snprintf(env, sizeof env, "PATH='%s/sass-tools/bin':\"$PATH\" ", bin);
            snprintf(cmd, sizeof cmd, "%ssh -c '%s'", env, probe);
        }
        if (!env[0] || system(cmd)) {
            cr_assert_null(getenv("KILN_REQUIRE_SASS"),
                           "KILN_REQUIRE_SASS is set, and cuobjdump with nvdisasm is neither on "
                           "PATH nor in $KILN_BINARY_DIR/sass-tools/bin (scripts/setup puts "
                           "them there)");
            return NULL;
        }
    }
    char path[] = "/tmp/kiln-sass-XXXXXX", out[] = "/tmp/kiln-sass-out-XXXXXX";
    int fd = mkstemp(path), ofd = mkstemp(out);
    cr_assert(fd >= 0 && ofd >= 0);
    cr_assert_eq(write(fd, cubin, size), (ssize_t)size);
    close(fd);
    close(ofd);
    snprintf(cmd, sizeof cmd, "%scuobjdump --dump-sass %s > %s 2>&1", env, path, out);
    int rc = system(cmd);
    long len = 0;
    char *text = kt_read_file(out, &len);
    unlink(path);
    unlink(out);
    cr_assert_eq(rc, 0, "%s: %s", cmd, text ? text : "");
    return text;
}

int kt_count(const char *text, const char *what)
{
    int n = 0;
    for (const char *p = strstr(text, what); p; p = strstr(p + 1, what))
        n++;
    return n;
}

kiln_nvrtc *kt_open_nvrtc(void)
{
    kiln_nvrtc *nv = NULL;
    cr_assert_eq(kiln_nvrtc_open(&nv), KILN_OK,
                 "libnvrtc cannot be loaded, and these tests need it (the CUDA toolkit's NVRTC, "
                 "or $KILN_NVRTC naming it): %s",
                 kiln_last_error());
    return nv;
}
