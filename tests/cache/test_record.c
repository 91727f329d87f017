/* cache/record.c: a record decodes to what was encoded, under its own key
 * only, and no changed, cut or extended record ever decodes; records of
 * another version are told apart from damaged ones; a cubin must be an ELF
 * for the record's target. */
#include "cache/cache.h"
#include "tests/cache/fake_cubin.h"
#include "testutil.h"

#include <criterion/criterion.h>
#include <lmdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

enum { CUBIN = 96 };

static uint8_t cubin[CUBIN];
static const uint8_t key[KILN_CACHE_KEY_BYTES] = { 0x78, 0x1a, 0xae, 0x9e, 0xc8, 0x84, 0x29, 0xc8,
                                                   0x52, 0x50, 0x30, 0x1c, 0x01, 0xf8, 0xfc, 0x36 };

static kiln_cache_record sample(void)
{
    kt_rng r = kt_rng_new(7);
    for (int i = 0; i < CUBIN; i++)
        cubin[i] = (uint8_t)kt_next(&r);
    kt_elf_header(cubin, 90);
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
    kiln_status st = kiln_cache_record_encode(r, key, &buf, size);
    cr_assert_eq(st, KILN_OK, "%s", kiln_last_error());
    return buf;
}

static void expect_corrupt(const uint8_t *buf, size_t size, const char *what)
{
    kiln_cache_record out;
    cr_assert_eq(kiln_cache_record_decode(buf, size, key, &out), KILN_ERR_CACHE);
    cr_assert(strstr(kiln_last_error(), what), "wanted \"%s\" in: %s", what, kiln_last_error());
}

/* Offsets from the layout in cache.h. */
enum { OFF_VERSION = 4, OFF_HEADER = 8, OFF_THREADS = 12, OFF_CUBIN_HASH = 36, OFF_STRINGS = 44 };

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Recompute the checksums after a deliberate edit, so that the check
 * behind them is reached: the cubin's, then the header's over the key and
 * the header. */
static void reseal(uint8_t *buf, size_t size)
{
    size_t header = get_u32(buf + OFF_HEADER), end = header - 8;
    uint64_t h = XXH3_64bits(buf + header, size - header);
    for (int i = 0; i < 8; i++)
        buf[OFF_CUBIN_HASH + i] = (uint8_t)(h >> (8 * i));
    uint8_t *keyed = malloc(KILN_CACHE_KEY_BYTES + end);
    memcpy(keyed, key, KILN_CACHE_KEY_BYTES);
    memcpy(keyed + KILN_CACHE_KEY_BYTES, buf, end);
    h = XXH3_64bits(keyed, KILN_CACHE_KEY_BYTES + end);
    free(keyed);
    for (int i = 0; i < 8; i++)
        buf[end + i] = (uint8_t)(h >> (8 * i));
}

Test(record, round_trip)
{
    kiln_cache_record in = sample(), out;
    size_t size;
    uint8_t *buf = encode(&in, &size);
    cr_assert_eq(kiln_cache_record_decode(buf, size, key, &out), KILN_OK, "%s", kiln_last_error());
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
    cr_assert_eq(out.version, KILN_CACHE_RECORD_VERSION);
    cr_assert_str_eq(out.schema, KILN_CACHE_SCHEMA);
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
            kiln_status st = kiln_cache_record_decode(buf, size, key, &out);
            cr_assert_eq(st, KILN_ERR_CACHE, "flip of byte %zu bit %d decoded", i, bit);
            buf[i] ^= (uint8_t)(1u << bit);
        }
    cr_assert_eq(kiln_cache_record_decode(buf, size, key, &out), KILN_OK);
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
        cr_assert_eq(kiln_cache_record_decode(buf, size, key, &out), KILN_ERR_CACHE,
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
        cr_assert_eq(kiln_cache_record_decode(buf, n, key, &out), KILN_ERR_CACHE, "%zu bytes", n);
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
    put_u32(b + OFF_VERSION, 3);
    expect_corrupt(b, size, "version field 3, but the record is an intact version 2 record");

    memcpy(b, buf, size);
    put_u32(b + OFF_HEADER, (uint32_t)size + 1);
    expect_corrupt(b, size, "outside the record's");

    memcpy(b, buf, size);
    put_u32(b + OFF_HEADER, 60);
    expect_corrupt(b, size, "the schema's length 12 does not fit the header");

    memcpy(b, buf, size);
    put_u32(b + OFF_STRINGS, 1000);
    expect_corrupt(b, size, "the schema's length 1000 does not fit");

    /* A string that holds a NUL of its own. */
    memcpy(b, buf, size);
    b[OFF_STRINGS + 4 + 2] = '\0';
    expect_corrupt(b, size, "the schema holds a NUL byte");

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
    reseal(b, size);
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
    cr_assert_eq(kiln_cache_record_encode(&r, key, &buf, &size), KILN_ERR_INVALID_ARG);
    cr_assert(strstr(kiln_last_error(), "the kind is NULL"), "%s", kiln_last_error());
    r = sample();
    r.entry = "";
    cr_assert_eq(kiln_cache_record_encode(&r, key, &buf, &size), KILN_ERR_INVALID_ARG);
    r = sample();
    r.threads = 0;
    cr_assert_eq(kiln_cache_record_encode(&r, key, &buf, &size), KILN_ERR_INVALID_ARG);
    r = sample();
    r.cubin = NULL;
    cr_assert_eq(kiln_cache_record_encode(&r, key, &buf, &size), KILN_ERR_INVALID_ARG);
    r = sample();
    r.cubin_size = 0;
    cr_assert_eq(kiln_cache_record_encode(&r, key, &buf, &size), KILN_ERR_INVALID_ARG);
    cr_assert(strstr(kiln_last_error(), "needs an entry name, threads and a cubin"), "%s",
              kiln_last_error());
    /* Refused from the size alone: the cubin is never read. */
    r = sample();
    r.cubin_size = UINT32_MAX;
    cr_assert_eq(kiln_cache_record_encode(&r, key, &buf, &size), KILN_ERR_INVALID_ARG);
    cr_assert(strstr(kiln_last_error(), "exceed what a record can hold"), "%s", kiln_last_error());
}

/* The header checksum covers the key: a record read under any other key,
 * one bit off included, is corrupt. */
Test(record, a_record_is_bound_to_its_key)
{
    kiln_cache_record in = sample(), out;
    size_t size;
    uint8_t *buf = encode(&in, &size);
    uint8_t other[KILN_CACHE_KEY_BYTES];
    for (size_t i = 0; i < sizeof other; i++)
        for (int bit = 0; bit < 8; bit++) {
            memcpy(other, key, sizeof other);
            other[i] ^= (uint8_t)(1u << bit);
            cr_assert_eq(kiln_cache_record_decode(buf, size, other, &out), KILN_ERR_CACHE,
                         "decoded under a key with byte %zu bit %d flipped", i, bit);
            cr_assert(strstr(kiln_last_error(), "the header and its key hashes to"), "%s",
                      kiln_last_error());
        }
    free(buf);
}

/* Version 1's layout (cache.h): no schema string, the header checksum over
 * the header alone. */
static uint8_t *encode_v1(const kiln_cache_record *r, size_t *size)
{
    const char *strs[] = { r->compiler, r->entry, r->target, r->kind, r->signature };
    size_t header = 44 + 8;
    for (int i = 0; i < 5; i++)
        header += 4 + strlen(strs[i]) + 1;
    *size = header + r->cubin_size;
    uint8_t *p = calloc(1, *size);
    memcpy(p, "KLNR", 4);
    put_u32(p + 4, 1);
    put_u32(p + 8, (uint32_t)header);
    put_u32(p + 12, r->threads);
    put_u32(p + 16, r->smem);
    for (int i = 0; i < 8; i++) {
        p[20 + i] = (uint8_t)(r->created >> (8 * i));
        p[28 + i] = (uint8_t)(r->cubin_size >> (8 * i));
        p[36 + i] = (uint8_t)(XXH3_64bits(r->cubin, r->cubin_size) >> (8 * i));
    }
    size_t off = 44;
    for (int i = 0; i < 5; i++) {
        put_u32(p + off, (uint32_t)strlen(strs[i]));
        memcpy(p + off + 4, strs[i], strlen(strs[i]) + 1);
        off += 4 + strlen(strs[i]) + 1;
    }
    uint64_t h = XXH3_64bits(p, off);
    for (int i = 0; i < 8; i++)
        p[off + i] = (uint8_t)(h >> (8 * i));
    memcpy(p + header, r->cubin, r->cubin_size);
    return p;
}

/* Records of another version are left alone, not corrupt: a version 1
 * record is read for what it says; one of a version kiln does not know is
 * only named. Either, once damaged, is corrupt. */
Test(record, other_versions_are_not_corrupt)
{
    kiln_cache_record in = sample(), out;
    size_t size;
    uint8_t *v1 = encode_v1(&in, &size);
    cr_assert_eq(kiln_cache_record_decode(v1, size, key, &out), KILN_ERR_UNSUPPORTED, "%s",
                 kiln_last_error());
    cr_assert(strstr(kiln_last_error(), "a record of version 1, which this kiln (version 2) leaves "
                                        "alone"),
              "%s", kiln_last_error());
    cr_assert_eq(out.version, 1);
    cr_assert_str_eq(out.signature, in.signature);
    cr_assert_str_eq(out.compiler, in.compiler);
    cr_assert_eq(out.cubin_size, CUBIN);
    for (size_t i = 0; i < size; i += 7) {
        v1[i] ^= 0x10;
        cr_assert_eq(kiln_cache_record_decode(v1, size, key, &out), KILN_ERR_CACHE,
                     "a version 1 record with byte %zu changed", i);
        v1[i] ^= 0x10;
    }
    free(v1);

    uint8_t *buf = encode(&in, &size);
    put_u32(buf + OFF_VERSION, 9);
    buf[OFF_STRINGS + 4] = 'K'; /* "Kiln-cache-2": no longer this version's record */
    cr_assert_eq(kiln_cache_record_decode(buf, size, key, &out), KILN_ERR_UNSUPPORTED);
    cr_assert(strstr(kiln_last_error(), "a record of version 9"), "%s", kiln_last_error());
    cr_assert_eq(out.version, 9);
    free(buf);
}

Test(record, schema_and_cubin_are_checked)
{
    kiln_cache_record in = sample();
    size_t size;
    uint8_t *buf = encode(&in, &size), *b = malloc(size);
    size_t cubin_at = get_u32(buf + OFF_HEADER);

    memcpy(b, buf, size);
    b[OFF_STRINGS + 4 + 11] = '9'; /* "kiln-cache-9" */
    reseal(b, size);
    expect_corrupt(b, size, "schema \"kiln-cache-9\", this kiln's is \"kiln-cache-2\"");
    expect_corrupt(b, size, in.signature);

    static const struct {
        size_t at;
        uint8_t to;
        const char *why;
    } edits[] = {
        { 0, 0x7e, "not a 64-bit little-endian ELF" },
        { 4, 1, "not a 64-bit little-endian ELF" },
        { 5, 2, "not a 64-bit little-endian ELF" },
        { 18, 62, "an ELF for machine 62, not CUDA's 190" },
        { 8, 9, "CUDA ELF ABI is version 9; kiln reads 7 and 8" },
        { 49, 80, "the cubin is for sm_80, the record's target is sm_90a" },
        { 41, 1, "section table runs past its 96 bytes" },
        { 56, 2, "program header table runs past its 96 bytes" },
    };
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        memcpy(b, buf, size);
        b[cubin_at + edits[i].at] = edits[i].to;
        if (edits[i].at == 56)
            b[cubin_at + 54] = 56;
        reseal(b, size);
        expect_corrupt(b, size, edits[i].why);
    }
    free(b);
    free(buf);

    /* What is refused on the way out is refused on the way in. */
    uint8_t *out;
    kiln_cache_record r = sample();
    r.target = "sm_80";
    cr_assert_eq(kiln_cache_record_encode(&r, key, &out, &size), KILN_ERR_INVALID_ARG);
    cr_assert(strstr(kiln_last_error(), "the cubin is for sm_90, the record's target is sm_80"), "%s",
              kiln_last_error());
    r = sample();
    r.target = "hopper";
    cr_assert_eq(kiln_cache_record_encode(&r, key, &out, &size), KILN_ERR_INVALID_ARG);
    cr_assert(strstr(kiln_last_error(), "target \"hopper\" is not an sm_ name"), "%s",
              kiln_last_error());
}

/* The sm sits where each CUDA ELF ABI puts it: ABI 8 (NVRTC 13) in bits
 * 8..15 (nvcc 13.0 wrote 0x6005a04 for sm_90 and sm_90a, 0x6007802 for
 * sm_120), ABI 7 in the low byte. */
Test(record, the_sm_of_each_elf_abi)
{
    uint8_t c[KT_ELF_HEADER];
    kt_elf_header(c, 90);
    cr_assert_eq(kiln_cache_cubin_check(c, sizeof c, "sm_90a"), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(kiln_cache_cubin_check(c, sizeof c, "sm_90"), KILN_OK);
    cr_assert_eq(kiln_cache_cubin_check(c, sizeof c, "sm_89"), KILN_ERR_CACHE);
    put_u32(c + 48, 0x6007802);
    cr_assert_eq(kiln_cache_cubin_check(c, sizeof c, "sm_120"), KILN_OK, "%s", kiln_last_error());
    c[8] = 7;
    put_u32(c + 48, 0x5a055a);
    cr_assert_eq(kiln_cache_cubin_check(c, sizeof c, "sm_90a"), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(kiln_cache_cubin_check(c, sizeof c, "sm_80"), KILN_ERR_CACHE);
    cr_assert_eq(kiln_cache_cubin_check(c, sizeof c - 1, "sm_90a"), KILN_ERR_CACHE);
    cr_assert_eq(kiln_cache_cubin_check(c, sizeof c, "sm_90ab"), KILN_ERR_CACHE);
}

/* ------------------------------------------------- records in a cache */

static char *cache_dir(void)
{
    char *d = strdup("/tmp/kiln-record-XXXXXX");
    cr_assert_not_null(mkdtemp(d));
    return d;
}

static void cache_dir_remove(char *d)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
    cr_assert_eq(system(cmd), 0);
    free(d);
}

/* Put raw values into the cache file at path, as another program would. */
static void raw_put(const char *path, const uint8_t (*keys)[KILN_CACHE_KEY_BYTES], uint8_t **vals,
                    const size_t *sizes, int n)
{
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi dbi;
    cr_assert_eq(mdb_env_create(&env), 0);
    cr_assert_eq(mdb_env_open(env, path, MDB_NOSUBDIR, 0644), 0);
    cr_assert_eq(mdb_txn_begin(env, NULL, 0, &txn), 0);
    cr_assert_eq(mdb_dbi_open(txn, NULL, 0, &dbi), 0);
    for (int i = 0; i < n; i++) {
        MDB_val k = { KILN_CACHE_KEY_BYTES, (void *)keys[i] }, v = { sizes[i], vals[i] };
        cr_assert_eq(mdb_put(txn, dbi, &k, &v, 0), 0);
    }
    cr_assert_eq(mdb_txn_commit(txn), 0);
    mdb_env_close(env);
}

typedef struct seen_msgs {
    int n;
    char last[1024];
} seen_msgs;

static void note(void *ctx, const char *message)
{
    seen_msgs *s = ctx;
    s->n++;
    snprintf(s->last, sizeof s->last, "%s", message);
}

/* Two kiln versions share one cache: this one's records and another's
 * (version 1, and a version this kiln does not know) are counted apart,
 * never served, never called corrupt, kept by gc --corrupt, left out by
 * merge, never overwritten by a store, and removed by gc --version alone. */
Test(record, records_of_other_versions_are_left_alone_in_a_cache)
{
    char *d = cache_dir(), *path, *dst;
    cr_assert_gt(asprintf(&path, "%s/k.kiln", d), 0);
    cr_assert_gt(asprintf(&dst, "%s/dst.kiln", d), 0);
    kiln_cache_record in = sample();
    uint8_t keys[3][KILN_CACHE_KEY_BYTES];
    for (int i = 0; i < 3; i++) {
        memcpy(keys[i], key, sizeof key);
        keys[i][15] = (uint8_t)(0xa0 + i);
    }
    seen_msgs seen = { 0 };
    kiln_cache_options o = { .path = path, .on_corrupt = note, .ctx = &seen };
    kiln_cache *c;
    cr_assert_eq(kiln_cache_open(&o, &c), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(kiln_cache_store(c, keys[0], &in, NULL), KILN_OK, "%s", kiln_last_error());
    kiln_cache_close(c);
    uint8_t *vals[2];
    size_t sizes[2];
    vals[0] = encode_v1(&in, &sizes[0]);
    vals[1] = encode(&in, &sizes[1]);
    put_u32(vals[1] + OFF_VERSION, 7);
    vals[1][OFF_STRINGS + 4] = 'K'; /* no longer a version 2 record with its field changed */
    raw_put(path, (const uint8_t(*)[KILN_CACHE_KEY_BYTES])keys + 1, vals, sizes, 2);

    cr_assert_eq(kiln_cache_open(&o, &c), KILN_OK, "%s", kiln_last_error());
    size_t n, bad;
    cr_assert_eq(kiln_cache_verify(c, 0, NULL, NULL, &n, &bad), KILN_OK);
    cr_assert_eq(n, 3);
    cr_assert_eq(bad, 0);
    kiln_cache_stats st;
    cr_assert_eq(kiln_cache_stat(c, 0, &st), KILN_OK);
    cr_assert_eq(st.entries, 3);
    cr_assert_eq(st.bad, 0);
    cr_assert_eq(st.other_versions, 2);
    kiln_cache_stats_free(&st);
    kiln_cache_hit h;
    cr_assert_eq(kiln_cache_lookup(c, keys[1], "sm_90a", &h), KILN_ERR_NOT_FOUND);
    cr_assert(strstr(seen.last, "a record of version 1"), "%s", seen.last);
    cr_assert_eq(kiln_cache_corrupt_seen(c), 0);
    cr_assert_eq(kiln_cache_store(c, keys[2], &in, NULL), KILN_ERR_CACHE);
    cr_assert(strstr(kiln_last_error(), "holds a record of version 7"), "%s", kiln_last_error());
    kiln_cache_gc_options g = { .corrupt = 1 };
    size_t removed;
    cr_assert_eq(kiln_cache_gc(c, &g, &removed, NULL), KILN_OK);
    cr_assert_eq(removed, 0);

    kiln_cache_options od = { .path = dst };
    kiln_cache *t;
    kiln_cache_merge_result mr;
    cr_assert_eq(kiln_cache_open(&od, &t), KILN_OK, "%s", kiln_last_error());
    kiln_cache_close(c);
    cr_assert_eq(kiln_cache_merge(t, path, NULL, NULL, &mr), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(mr.added, 1);
    cr_assert_eq(mr.other, 2);
    cr_assert_eq(mr.bad, 0);
    kiln_cache_close(t);

    cr_assert_eq(kiln_cache_open(&o, &c), KILN_OK, "%s", kiln_last_error());
    g = (kiln_cache_gc_options){ .version = 1 };
    cr_assert_eq(kiln_cache_gc(c, &g, &removed, NULL), KILN_OK);
    cr_assert_eq(removed, 1);
    cr_assert_eq(kiln_cache_stat(c, 0, &st), KILN_OK);
    cr_assert_eq(st.entries, 2);
    cr_assert_eq(st.other_versions, 1);
    kiln_cache_stats_free(&st);
    kiln_cache_close(c);
    free(vals[0]);
    free(vals[1]);
    free(path);
    free(dst);
    cache_dir_remove(d);
}

/* A record of another target under a key asked for one: a miss, reported,
 * and replaced by the next store; an intact record of the same kernel
 * stays (another process won the race). */
Test(record, a_record_of_another_target_is_a_miss_and_is_replaced)
{
    char *d = cache_dir(), *path;
    cr_assert_gt(asprintf(&path, "%s/k.kiln", d), 0);
    seen_msgs seen = { 0 };
    kiln_cache_options o = { .path = path, .on_corrupt = note, .ctx = &seen };
    kiln_cache *c;
    cr_assert_eq(kiln_cache_open(&o, &c), KILN_OK, "%s", kiln_last_error());
    kiln_cache_record wrong = sample();
    static uint8_t cubin80[CUBIN];
    memcpy(cubin80, cubin, CUBIN);
    kt_elf_header(cubin80, 80);
    wrong.target = "sm_80";
    wrong.cubin = cubin80;
    kiln_cache_put put;
    cr_assert_eq(kiln_cache_store(c, key, &wrong, &put), KILN_OK, "%s", kiln_last_error());
    kiln_cache_hit h;
    cr_assert_eq(kiln_cache_lookup(c, key, "sm_90a", &h), KILN_ERR_NOT_FOUND);
    cr_assert(strstr(seen.last, "for sm_80, asked for sm_90a") && strstr(seen.last, path), "%s",
              seen.last);
    cr_assert_eq(kiln_cache_corrupt_seen(c), 1);
    kiln_cache_record right = sample();
    cr_assert_eq(kiln_cache_store(c, key, &right, &put), KILN_OK, "%s", kiln_last_error());
    cr_assert_eq(put, KILN_CACHE_REPLACED);
    cr_assert_eq(kiln_cache_lookup(c, key, "sm_90a", &h), KILN_OK, "%s", kiln_last_error());
    cr_assert_str_eq(h.rec.target, "sm_90a");
    kiln_cache_hit_release(&h);
    right.compiler = "nvrtc 13.1";
    cr_assert_eq(kiln_cache_store(c, key, &right, &put), KILN_OK);
    cr_assert_eq(put, KILN_CACHE_PRESENT);
    kiln_cache_close(c);
    free(path);
    cache_dir_remove(d);
}
