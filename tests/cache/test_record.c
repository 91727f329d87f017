/* cache/record.c: a record decodes to what was encoded, and no changed,
 * cut or extended record ever decodes. */
#include "cache/cache.h"
#include "testutil.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

enum { CUBIN = 96 };

static uint8_t cubin[CUBIN];

static kiln_cache_record sample(void)
{
    kt_rng r = kt_rng_new(7);
    for (int i = 0; i < CUBIN; i++)
        cubin[i] = (uint8_t)kt_next(&r);
    return (kiln_cache_record){
        .compiler = "nvrtc 13.0",
        .entry = "kiln_linear_simt",
        .target = "sm_90a",
        .kind = "simt",
        .signature = "linear backend=simt variant=default format=q8_0 n=256 k=512 target=sm_90a",
        .threads = 128,
        .smem = 4096,
        .created = 1700000000,
        .cubin = cubin,
        .cubin_size = CUBIN,
    };
}

static uint8_t *encode(const kiln_cache_record *r, size_t *size)
{
    uint8_t *buf;
    kiln_status st = kiln_cache_record_encode(r, &buf, size);
    cr_assert_eq(st, KILN_OK, "%s", kiln_last_error());
    return buf;
}

static void expect_corrupt(const uint8_t *buf, size_t size, const char *what)
{
    kiln_cache_record out;
    cr_assert_eq(kiln_cache_record_decode(buf, size, &out), KILN_ERR_CACHE);
    cr_assert(strstr(kiln_last_error(), what), "wanted \"%s\" in: %s", what, kiln_last_error());
}

/* Offsets from the layout in cache.h. */
enum { OFF_VERSION = 4, OFF_HEADER = 8, OFF_THREADS = 12, OFF_STRINGS = 44 };

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Recompute the header checksum after a deliberate edit, so that the
 * check behind it is reached. */
static void reseal(uint8_t *buf)
{
    size_t end = get_u32(buf + OFF_HEADER) - 8;
    uint64_t h = XXH3_64bits(buf, end);
    for (int i = 0; i < 8; i++)
        buf[end + i] = (uint8_t)(h >> (8 * i));
}

Test(record, round_trip)
{
    kiln_cache_record in = sample(), out;
    size_t size;
    uint8_t *buf = encode(&in, &size);
    cr_assert_eq(kiln_cache_record_decode(buf, size, &out), KILN_OK, "%s", kiln_last_error());
    cr_assert_str_eq(out.compiler, in.compiler);
    cr_assert_str_eq(out.entry, in.entry);
    cr_assert_str_eq(out.target, in.target);
    cr_assert_str_eq(out.kind, in.kind);
    cr_assert_str_eq(out.signature, in.signature);
    cr_assert_eq(out.threads, 128);
    cr_assert_eq(out.smem, 4096);
    cr_assert_eq(out.created, 1700000000u);
    cr_assert_eq(out.cubin_size, CUBIN);
    cr_assert_arr_eq(out.cubin, cubin, CUBIN);
    cr_assert_eq(out.cubin_hash, XXH3_64bits(cubin, CUBIN));
    cr_assert_eq(get_u32(buf + OFF_HEADER) + CUBIN, size);
    free(buf);
}

/* Both checksums together cover every byte: each single-bit change, in the
 * header, a length, a string or the cubin, is refused. */
Test(record, every_bit_flip_is_caught)
{
    kiln_cache_record in = sample(), out;
    size_t size;
    uint8_t *buf = encode(&in, &size);
    for (size_t i = 0; i < size; i++)
        for (int bit = 0; bit < 8; bit++) {
            buf[i] ^= (uint8_t)(1u << bit);
            kiln_status st = kiln_cache_record_decode(buf, size, &out);
            cr_assert_eq(st, KILN_ERR_CACHE, "flip of byte %zu bit %d decoded", i, bit);
            buf[i] ^= (uint8_t)(1u << bit);
        }
    cr_assert_eq(kiln_cache_record_decode(buf, size, &out), KILN_OK);
    free(buf);
}

Test(record, random_byte_changes_are_caught)
{
    kiln_cache_record in = sample(), out;
    size_t size;
    uint8_t *buf = encode(&in, &size);
    kt_rng r = kt_rng_new(3);
    for (int iter = 0; iter < 2000; iter++) {
        size_t at = kt_next(&r) % size;
        uint8_t was = buf[at], now = (uint8_t)(was ^ (1 + kt_next(&r) % 255));
        buf[at] = now;
        cr_assert_eq(kiln_cache_record_decode(buf, size, &out), KILN_ERR_CACHE,
                     "byte %zu %02x -> %02x decoded", at, was, now);
        buf[at] = was;
    }
    free(buf);
}

Test(record, cut_or_extended_records_are_caught)
{
    kiln_cache_record in = sample(), out;
    size_t size;
    uint8_t *buf = encode(&in, &size);
    for (size_t n = 0; n < size; n++)
        cr_assert_eq(kiln_cache_record_decode(buf, n, &out), KILN_ERR_CACHE, "%zu bytes", n);
    uint8_t *longer = malloc(size + 1);
    memcpy(longer, buf, size);
    longer[size] = 0;
    expect_corrupt(longer, size + 1, "but 97 follow the header");
    free(longer);
    free(buf);
}

Test(record, messages_say_what_is_wrong)
{
    kiln_cache_record in = sample();
    size_t size;
    uint8_t *buf = encode(&in, &size);
    uint8_t *b = malloc(size);

    expect_corrupt(buf, 10, "10 bytes, shorter than its header");

    memcpy(b, buf, size);
    b[0] = 'X';
    expect_corrupt(b, size, "no KLNR magic");

    memcpy(b, buf, size);
    put_u32(b + OFF_VERSION, 2);
    expect_corrupt(b, size, "record version 2, this kiln reads version 1");

    memcpy(b, buf, size);
    put_u32(b + OFF_HEADER, (uint32_t)size + 1);
    expect_corrupt(b, size, "outside the record's");

    memcpy(b, buf, size);
    put_u32(b + OFF_HEADER, 60);
    expect_corrupt(b, size, "the compiler's length 10 does not fit the header");

    memcpy(b, buf, size);
    put_u32(b + OFF_STRINGS, 1000);
    expect_corrupt(b, size, "the compiler's length 1000 does not fit");

    /* A string that holds a NUL of its own. */
    memcpy(b, buf, size);
    b[OFF_STRINGS + 4 + 2] = '\0';
    expect_corrupt(b, size, "the compiler holds a NUL byte");

    /* Header size past the strings. */
    memcpy(b, buf, size);
    put_u32(b + OFF_HEADER, get_u32(buf + OFF_HEADER) + 8);
    expect_corrupt(b, size, "but its fields end at");

    memcpy(b, buf, size);
    b[OFF_THREADS] ^= 1;
    expect_corrupt(b, size, "header checksum");
    expect_corrupt(b, size, in.signature);

    memcpy(b, buf, size);
    b[size - 1] ^= 0x80;
    expect_corrupt(b, size, "cubin checksum");
    expect_corrupt(b, size, in.signature);

    /* A signature that is not text is left out of the message. */
    memcpy(b, buf, size);
    char *sig = memmem(b, size, "linear backend", 14);
    sig[3] = '\x01';
    expect_corrupt(b, size, "signature unreadable");

    /* Intact checksums over fields no encoder writes. */
    memcpy(b, buf, size);
    put_u32(b + OFF_THREADS, 0);
    reseal(b);
    expect_corrupt(b, size, "no entry name, threads or cubin");

    free(b);
    free(buf);
}

Test(record, encode_refuses_incomplete_records)
{
    uint8_t *buf;
    size_t size;
    kiln_cache_record r = sample();
    r.kind = NULL;
    cr_assert_eq(kiln_cache_record_encode(&r, &buf, &size), KILN_ERR_INVALID_ARG);
    cr_assert(strstr(kiln_last_error(), "the kind is NULL"), "%s", kiln_last_error());
    r = sample();
    r.entry = "";
    cr_assert_eq(kiln_cache_record_encode(&r, &buf, &size), KILN_ERR_INVALID_ARG);
    r = sample();
    r.threads = 0;
    cr_assert_eq(kiln_cache_record_encode(&r, &buf, &size), KILN_ERR_INVALID_ARG);
    r = sample();
    r.cubin = NULL;
    cr_assert_eq(kiln_cache_record_encode(&r, &buf, &size), KILN_ERR_INVALID_ARG);
    r = sample();
    r.cubin_size = 0;
    cr_assert_eq(kiln_cache_record_encode(&r, &buf, &size), KILN_ERR_INVALID_ARG);
    cr_assert(strstr(kiln_last_error(), "needs an entry name, threads and a cubin"), "%s",
              kiln_last_error());
    /* Refused from the size alone: the cubin is never read. */
    r = sample();
    r.cubin_size = UINT32_MAX;
    cr_assert_eq(kiln_cache_record_encode(&r, &buf, &size), KILN_ERR_INVALID_ARG);
    cr_assert(strstr(kiln_last_error(), "exceed what a record can hold"), "%s", kiln_last_error());
}
