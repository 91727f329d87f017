/* A kernel record with a fake cubin (fake_cubin.h) for the cache's tests;
 * everything follows from i. Record 3's cubin is larger than a page: LMDB
 * keeps it on overflow pages. */
#ifndef KILN_TEST_FAKE_RECORD_H
#define KILN_TEST_FAKE_RECORD_H

#include "cache/cache.h"
#include "tests/cache/fake_cubin.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

typedef struct kt_made {
    uint8_t key[KILN_CACHE_KEY_BYTES];
    char sig[128], entry[32];
    uint8_t cubin[6000];
    kiln_cache_record rec;
} kt_made;

static inline void kt_made_init(kt_made *m, int i)
{
    size_t size = i == 3 ? sizeof m->cubin : 512;
    snprintf(m->sig, sizeof m->sig, "linear backend=simt format=q8_0 n=%d k=4096 target=sm_90a", i);
    snprintf(m->entry, sizeof m->entry, "kiln_linear_%d", i);
    cr_assert_eq(kiln_cache_key("sm_90a", "", m->sig, strlen(m->sig), m->key), KILN_OK);
    for (size_t j = 0; j < size; j++)
        m->cubin[j] = (uint8_t)(j * 31 + (size_t)i);
    kt_elf_header(m->cubin, 90);
    m->rec = (kiln_cache_record){ .compiler = "nvrtc 13.0", .entry = m->entry, .target = "sm_90a",
                                  .kind = i % 2 ? "simt" : "gemv", .signature = m->sig, .threads = 128,
                                  .cubin = m->cubin, .cubin_size = size };
}

#endif
