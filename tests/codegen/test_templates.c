/* The embedded templates: the files of kernels/, and their digest, which
 * every source names so that the cache key covers them. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "cache/cache.h"
#include "codegen/emit.h"

/* The embedded headers are the files of kernels/ as they are now (the
 * build regenerates them), one per file, named kiln/<file>. */
Test(templates, embedded_headers_are_the_template_files)
{
    static const char *const files[] = {
        "kernels/common/kiln_args.h", "kernels/common/kiln_types.cuh",
        "kernels/common/dequant.cuh", "kernels/common/elementwise.cuh", "kernels/simt/simt.cuh",
    };
    const char *root = getenv("KILN_SOURCE_DIR");
    cr_assert_not_null(root, "ctest sets KILN_SOURCE_DIR");
    for (size_t i = 0; i < KILN_ARRAY_LEN(files); i++) {
        const char *base = strrchr(files[i], '/') + 1;
        char name[128], path[1024];
        snprintf(name, sizeof name, "kiln/%s", base);
        snprintf(path, sizeof path, "%s/%s", root, files[i]);
        const kiln_embedded_file *e = NULL;
        for (size_t j = 0; j < kiln_embedded_headers_count; j++)
            if (!strcmp(kiln_embedded_headers[j].name, name))
                e = &kiln_embedded_headers[j];
        cr_assert_not_null(e, "%s is not embedded", name);
        FILE *f = fopen(path, "rb");
        cr_assert_not_null(f, "%s", path);
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        fseek(f, 0, SEEK_SET);
        char *text = malloc((size_t)n + 1);
        cr_assert_eq(fread(text, 1, (size_t)n, f), (size_t)n);
        fclose(f);
        text[n] = '\0';
        cr_assert_eq(e->length, (size_t)n, "%s", name);
        cr_assert_eq(strlen(e->text), e->length, "%s is NUL-terminated text", name);
        cr_assert_str_eq(e->text, text, "%s", name);
        free(text);
    }
    for (size_t j = 1; j < kiln_embedded_headers_count; j++)
        cr_assert_lt(strcmp(kiln_embedded_headers[j - 1].name, kiln_embedded_headers[j].name), 0,
                     "sorted, no duplicates");
    /* the host-only registry is no template */
    for (size_t j = 0; j < kiln_embedded_headers_count; j++)
        cr_assert_str_neq(kiln_embedded_headers[j].name, "kiln/backend.h");
}

/* The digest is the documented hash: XXH3-128 over every embedded file's
 * name and text, each a u64 little-endian length and its bytes (the cache
 * key's fields), in hex of the canonical (big-endian) form; computed once. */
Test(templates, digest_is_the_documented_hash)
{
    size_t size = 0;
    for (size_t i = 0; i < kiln_embedded_headers_count; i++)
        size += 16 + strlen(kiln_embedded_headers[i].name) + kiln_embedded_headers[i].length;
    unsigned char *buf = malloc(size), *at = buf;
    cr_assert_not_null(buf);
    for (size_t i = 0; i < kiln_embedded_headers_count; i++) {
        const char *fields[2] = { kiln_embedded_headers[i].name, kiln_embedded_headers[i].text };
        for (int f = 0; f < 2; f++) {
            const uint64_t len = strlen(fields[f]);
            for (int b = 0; b < 8; b++)
                *at++ = (unsigned char)(len >> (8 * b));
            memcpy(at, fields[f], len);
            at += len;
        }
    }
    XXH128_hash_t h = XXH3_128bits(buf, size);
    free(buf);
    char want[KILN_CACHE_KEY_HEX];
    snprintf(want, sizeof want, "%016llx%016llx", (unsigned long long)h.high64,
             (unsigned long long)h.low64);
    const char *d = kiln_emit_templates_digest();
    cr_assert_str_eq(d, want);
    cr_assert_eq(d, kiln_emit_templates_digest(), "computed once");
}
