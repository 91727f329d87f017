/* Writes the seed corpus of fuzz_cache into a directory: cache files made
 * through the cache API. empty.kiln holds no record; small.kiln records
 * that live in their leaf page; mixed.kiln more of them with two in
 * overflow runs, and one removed, so its free list holds pages;
 * exported.kiln small.kiln's records exported with a manifest of two
 * pages (on overflow pages).
 * Usage: fuzz_cache_seeds DIR (fuzz/corpus/cache). */
#include "cache/cache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Writes dir/name; with export_as, also exports its records with a
 * manifest into dir/export_as. */
static void seed(const char *dir, const char *name, int small, int large, int removed,
                 const char *export_as)
{
    uint8_t keys[16][KILN_CACHE_KEY_BYTES];
    char path[4096], lock[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(lock, sizeof lock, "%s-lock", path);
    unlink(path);
    kiln_cache_options o = { .path = path, .strict = 1 };
    kiln_cache *c;
    if (kiln_cache_open(&o, &c)) {
        fprintf(stderr, "%s\n", kiln_last_error());
        exit(1);
    }
    for (int i = 0; i < small + large; i++) {
        size_t size = i < small ? 200 + 50 * (size_t)i : 5000 + 3000 * (size_t)i;
        uint8_t *cubin = calloc(1, size), key[KILN_CACHE_KEY_BYTES];
        char sig[96], entry[32], src[32];
        memcpy(cubin, "\x7f" "ELF\x02\x01\x01\x41\x08", 9);
        cubin[18] = 190;
        cubin[49] = 90;
        for (size_t j = 64; j < size; j++)
            cubin[j] = (uint8_t)(j * 131 + (size_t)i);
        snprintf(sig, sizeof sig, "linear backend=simt format=q8_0 n=%d k=4096 target=sm_90a", i);
        snprintf(entry, sizeof entry, "kiln_linear_%d", i);
        snprintf(src, sizeof src, "seed %d", i);
        kiln_cache_record r = { .compiler = "nvrtc 13.0", .entry = entry, .target = "sm_90a",
                                .kind = "simt", .signature = sig, .threads = 128,
                                .created = 1700000000, .cubin = cubin, .cubin_size = size };
        if (kiln_cache_key("sm_90a", "", src, strlen(src), key) ||
            kiln_cache_store(c, key, &r, NULL)) {
            fprintf(stderr, "%s\n", kiln_last_error());
            exit(1);
        }
        if (i < 16)
            memcpy(keys[i], key, KILN_CACHE_KEY_BYTES);
        if (i < removed) {
            char hex[KILN_CACHE_KEY_HEX];
            kiln_cache_key_hex(key, hex);
            kiln_cache_rm(c, hex, NULL);
        }
        free(cubin);
    }
    if (export_as) {
        char out[4096], manifest[8192];
        snprintf(out, sizeof out, "%s/%s", dir, export_as);
        unlink(out);
        int n = snprintf(manifest, sizeof manifest, "{\"kiln\":\"seed\",\"model\":\"");
        memset(manifest + n, 'm', sizeof manifest - (size_t)n - 3);
        memcpy(manifest + sizeof manifest - 3, "\"}", 3);
        /* with a tuning table of a few entries */
        kiln_tuning *t = NULL;
        kiln_status st = kiln_tuning_create(&t);
        for (int b = 1; b <= 512 && !st; b *= 8) {
            kiln_tuning_entry e = { .signature = "linear backend=wgmma_tc variant=* format=nvfp4 "
                                                 "n=4096 k=4096 target=sm_90a",
                                    .bucket = b, .variant = "bt128", .us = 10.5 * b,
                                    .heuristic = "bt256", .heuristic_us = 11.0 * b };
            st = kiln_tuning_set(t, &e);
        }
        if (st || kiln_cache_export_keys(c, (const uint8_t(*)[KILN_CACHE_KEY_BYTES])keys,
                                         (size_t)(small + large < 16 ? small + large : 16), out, 1,
                                         manifest, t)) {
            fprintf(stderr, "%s\n", kiln_last_error());
            exit(1);
        }
        kiln_tuning_destroy(t);
    }
    kiln_cache_close(c);
    unlink(lock);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: fuzz_cache_seeds DIR\n");
        return 2;
    }
    seed(argv[1], "empty.kiln", 0, 0, 0, NULL);
    seed(argv[1], "small.kiln", 3, 0, 0, "exported.kiln");
    seed(argv[1], "mixed.kiln", 6, 2, 1, NULL);
    return 0;
}
