/* cache/key.c: the key is stable across releases, moves with every field
 * and cannot be fooled by moving bytes between fields. */
#include "cache/cache.h"
#include "testutil.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <xxhash.h>

static const char src[] = "#include \"linear_simt.cuh\"\n"
                          "template __global__ void kiln_linear<128, 64, 32>(const void *);\n";

static void key_of(const char *target, const char *options, const char *source, size_t n,
                   uint8_t key[KILN_CACHE_KEY_BYTES])
{
    kiln_status st = kiln_cache_key(target, options, source, n, key);
    cr_assert_eq(st, KILN_OK, "%s", kiln_last_error());
}

static void hex_of(const uint8_t key[KILN_CACHE_KEY_BYTES], char hex[KILN_CACHE_KEY_HEX])
{
    kiln_cache_key_hex(key, hex);
}

/* A changed value here invalidates every cache ever shipped: it must only
 * change together with KILN_CACHE_SCHEMA. */
Test(key, golden)
{
    uint8_t key[KILN_CACHE_KEY_BYTES];
    char hex[KILN_CACHE_KEY_HEX];
    key_of("sm_90a", "-arch=sm_90a -std=c++17", src, strlen(src), key);
    hex_of(key, hex);
    cr_assert_str_eq(hex, "040713ad7cf219362692ca69b05d064e");
}

/* The documented layout, hashed in one piece: u64 little-endian length and
 * bytes of each field, XXH3-128, big-endian. */
Test(key, is_the_documented_hash)
{
    const char *fields[] = { KILN_CACHE_SCHEMA, "sm_90a", "-arch=sm_90a -std=c++17", src };
    uint8_t buf[512];
    size_t n = 0;
    for (size_t f = 0; f < 4; f++) {
        uint64_t len = strlen(fields[f]);
        for (int i = 0; i < 8; i++)
            buf[n++] = (uint8_t)(len >> (8 * i));
        memcpy(buf + n, fields[f], len);
        n += len;
    }
    XXH128_hash_t h = XXH3_128bits(buf, n);
    uint8_t want[KILN_CACHE_KEY_BYTES], key[KILN_CACHE_KEY_BYTES];
    for (int i = 0; i < 8; i++) {
        want[i] = (uint8_t)(h.high64 >> (56 - 8 * i));
        want[8 + i] = (uint8_t)(h.low64 >> (56 - 8 * i));
    }
    key_of("sm_90a", "-arch=sm_90a -std=c++17", src, strlen(src), key);
    cr_assert_arr_eq(key, want, sizeof key);
}

/* The field helper the templates' digest shares: the key is its four
 * fields hashed through it. */
Test(key, is_its_fields_through_the_shared_helper)
{
    const char *fields[] = { KILN_CACHE_SCHEMA, "sm_90a", "-arch=sm_90a -std=c++17", src };
    XXH3_state_t *s = XXH3_createState();
    cr_assert_not_null(s);
    XXH3_128bits_reset(s);
    for (size_t f = 0; f < 4; f++)
        kiln_cache_key_field(s, fields[f], strlen(fields[f]));
    XXH128_canonical_t want;
    XXH128_canonicalFromHash(&want, XXH3_128bits_digest(s));
    XXH3_freeState(s);
    uint8_t key[KILN_CACHE_KEY_BYTES];
    key_of("sm_90a", "-arch=sm_90a -std=c++17", src, strlen(src), key);
    cr_assert_arr_eq(key, want.digest, sizeof key);
}

Test(key, same_inputs_same_key)
{
    uint8_t a[KILN_CACHE_KEY_BYTES], b[KILN_CACHE_KEY_BYTES];
    key_of("sm_90a", "-O3", src, strlen(src), a);
    key_of("sm_90a", "-O3", src, strlen(src), b);
    cr_assert_arr_eq(a, b, sizeof a);
}

Test(key, field_boundaries_do_not_collide)
{
    static const struct {
        const char *t1, *o1, *s1, *t2, *o2, *s2;
    } pairs[] = {
        { "ab", "c", "src", "a", "bc", "src" },
        { "sm_90a", "xy", "z", "sm_90a", "x", "yz" },
        { "sm_90a", "", "xsrc", "sm_90a", "x", "src" },
        { "sm_90", "a-O3", "src", "sm_90a", "-O3", "src" },
    };
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        uint8_t a[KILN_CACHE_KEY_BYTES], b[KILN_CACHE_KEY_BYTES];
        key_of(pairs[i].t1, pairs[i].o1, pairs[i].s1, strlen(pairs[i].s1), a);
        key_of(pairs[i].t2, pairs[i].o2, pairs[i].s2, strlen(pairs[i].s2), b);
        cr_assert_neq(memcmp(a, b, sizeof a), 0, "pair %zu collides", i);
    }
}

/* Random strings cut at random places: the same bytes in different fields
 * never give the same key. */
Test(key, random_splits_do_not_collide)
{
    kt_rng r = kt_rng_new(1);
    for (int iter = 0; iter < 200; iter++) {
        char all[48];
        size_t n = 3 + kt_next(&r) % 40;
        for (size_t i = 0; i < n; i++)
            all[i] = (char)('a' + kt_next(&r) % 26);
        all[n] = '\0';
        /* target | options | source cut at (i, j) and at (i2, j2). */
        size_t i = 1 + kt_next(&r) % (n - 2), j = i + kt_next(&r) % (n - 1 - i);
        size_t i2 = 1 + kt_next(&r) % (n - 2), j2 = i2 + kt_next(&r) % (n - 1 - i2);
        if (i == i2 && j == j2)
            continue;
        char t[48], o[48], t2[48], o2[48];
        snprintf(t, sizeof t, "%.*s", (int)i, all);
        snprintf(o, sizeof o, "%.*s", (int)(j - i), all + i);
        snprintf(t2, sizeof t2, "%.*s", (int)i2, all);
        snprintf(o2, sizeof o2, "%.*s", (int)(j2 - i2), all + i2);
        uint8_t a[KILN_CACHE_KEY_BYTES], b[KILN_CACHE_KEY_BYTES];
        key_of(t, o, all + j, n - j, a);
        key_of(t2, o2, all + j2, n - j2, b);
        cr_assert_neq(memcmp(a, b, sizeof a), 0, "\"%s\" cut at %zu,%zu and %zu,%zu", all, i, j,
                      i2, j2);
    }
}

Test(key, every_field_changes_the_key)
{
    uint8_t base[KILN_CACHE_KEY_BYTES], k[KILN_CACHE_KEY_BYTES];
    char edited[sizeof src];
    key_of("sm_90a", "-O3", src, strlen(src), base);
    key_of("sm_89", "-O3", src, strlen(src), k);
    cr_assert_neq(memcmp(base, k, sizeof k), 0, "target");
    key_of("sm_90a", "-O2", src, strlen(src), k);
    cr_assert_neq(memcmp(base, k, sizeof k), 0, "options");
    /* Any one byte of the source, templates included. */
    kt_rng r = kt_rng_new(2);
    for (int i = 0; i < 32; i++) {
        memcpy(edited, src, sizeof src);
        size_t at = kt_next(&r) % strlen(src);
        edited[at] ^= (char)(1 + kt_next(&r) % 127);
        key_of("sm_90a", "-O3", edited, strlen(src), k);
        cr_assert_neq(memcmp(base, k, sizeof k), 0, "source byte %zu", at);
    }
    /* The length is the given one, not strlen: NULs count. */
    static const char with_nul[] = "ab\0cd";
    uint8_t a[KILN_CACHE_KEY_BYTES], b[KILN_CACHE_KEY_BYTES];
    key_of("sm_90a", "", with_nul, 5, a);
    key_of("sm_90a", "", with_nul, 2, b);
    cr_assert_neq(memcmp(a, b, sizeof a), 0);
}

Test(key, bad_arguments)
{
    uint8_t k[KILN_CACHE_KEY_BYTES];
    cr_assert_eq(kiln_cache_key(NULL, "", src, 3, k), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_cache_key("", "", src, 3, k), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_cache_key("sm_90a", NULL, src, 3, k), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_cache_key("sm_90a", "", NULL, 3, k), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_cache_key("sm_90a", "", src, 0, k), KILN_ERR_INVALID_ARG);
    cr_assert(strstr(kiln_last_error(), "non-empty source"), "%s", kiln_last_error());
}

Test(key, hex_and_parse)
{
    uint8_t key[KILN_CACHE_KEY_BYTES], back[KILN_CACHE_KEY_BYTES];
    char hex[KILN_CACHE_KEY_HEX];
    for (int i = 0; i < KILN_CACHE_KEY_BYTES; i++)
        key[i] = (uint8_t)(i * 17 + 1);
    hex_of(key, hex);
    cr_assert_str_eq(hex, "0112233445566778899aabbccddeef00");
    int n;
    cr_assert_eq(kiln_cache_key_parse(hex, back, &n), KILN_OK);
    cr_assert_eq(n, 32);
    cr_assert_arr_eq(key, back, sizeof key);
    /* Upper case too; an odd prefix fills the high nibble only. */
    cr_assert_eq(kiln_cache_key_parse("0112233445566778899AABBCCDDEEF00", back, &n), KILN_OK);
    cr_assert_arr_eq(key, back, sizeof key);
    cr_assert_eq(kiln_cache_key_parse("abc", back, &n), KILN_OK);
    cr_assert_eq(n, 3);
    cr_assert_eq(back[0], 0xab);
    cr_assert_eq(back[1], 0xc0);
    cr_assert_eq(back[2], 0);
}

Test(key, parse_errors)
{
    uint8_t k[KILN_CACHE_KEY_BYTES];
    int n;
    cr_assert_eq(kiln_cache_key_parse("", k, &n), KILN_ERR_INVALID_ARG);
    cr_assert(strstr(kiln_last_error(), "cache key \"\": give 1 to 32 hex digits"), "%s",
              kiln_last_error());
    cr_assert_eq(kiln_cache_key_parse(NULL, k, &n), KILN_ERR_INVALID_ARG);
    cr_assert_eq(kiln_cache_key_parse("0112233445566778899aabbccddeeff00", k, &n),
                 KILN_ERR_INVALID_ARG);
    cr_assert(strstr(kiln_last_error(),
                     "cache key \"0112233445566778899aabbccddeeff00\": give 1 to 32 hex digits"),
              "%s", kiln_last_error());
    cr_assert_eq(kiln_cache_key_parse("12g4", k, &n), KILN_ERR_INVALID_ARG);
    cr_assert(strstr(kiln_last_error(), "'g' is not a hex digit"), "%s", kiln_last_error());
}
