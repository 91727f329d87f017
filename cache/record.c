/* Cache records: encoding, and decoding that trusts nothing it reads (the
 * layout is in cache.h). */
#include "cache/cache.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

enum {
    REC_FIXED = 44, /* magic .. cubin hash */
    REC_STRING_PREFIX = 4,
    REC_HASH = 8,
};

/* The header's strings, in stored order. */
static const struct {
    const char *name;
    size_t offset;
} rec_strings[] = {
    { "compiler", offsetof(kiln_cache_record, compiler) },
    { "entry", offsetof(kiln_cache_record, entry) },
    { "target", offsetof(kiln_cache_record, target) },
    { "kind", offsetof(kiln_cache_record, kind) },
    { "signature", offsetof(kiln_cache_record, signature) },
};
enum { REC_N_STRINGS = KILN_ARRAY_LEN(rec_strings) };

static const char **rec_string(kiln_cache_record *r, int i)
{
    return (const char **)((char *)r + rec_strings[i].offset);
}

static const char *rec_string_const(const kiln_cache_record *r, int i)
{
    return *(const char *const *)((const char *)r + rec_strings[i].offset);
}

static void put_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

kiln_status kiln_cache_record_encode(const kiln_cache_record *r, uint8_t **out, size_t *size)
{
    size_t header = REC_FIXED + REC_HASH, len[REC_N_STRINGS];
    for (int i = 0; i < REC_N_STRINGS; i++) {
        const char *s = rec_string_const(r, i);
        if (!s)
            return kiln_fail(KILN_ERR_INVALID_ARG, "cache record: the %s is NULL",
                             rec_strings[i].name);
        len[i] = strlen(s);
        header += REC_STRING_PREFIX + len[i] + 1;
    }
    if (!*r->entry || !r->threads || !r->cubin || !r->cubin_size)
        return kiln_fail(KILN_ERR_INVALID_ARG,
                         "cache record \"%s\": needs an entry name, threads and a cubin",
                         r->signature);
    /* An LMDB node stores a value's size in 32 bits. */
    if (header > UINT32_MAX || r->cubin_size > UINT32_MAX - header)
        return kiln_fail(KILN_ERR_INVALID_ARG,
                         "cache record \"%s\": %llu cubin bytes exceed what a record can hold",
                         r->signature, (unsigned long long)r->cubin_size);
    size_t total = header + (size_t)r->cubin_size;
    uint8_t *p = malloc(total);
    if (!p)
        return kiln_fail(KILN_ERR_NOMEM, "cache record \"%s\": %zu bytes", r->signature, total);
    memcpy(p, "KLNR", 4);
    put_le(p + 4, KILN_CACHE_RECORD_VERSION, 4);
    put_le(p + 8, header, 4);
    put_le(p + 12, r->threads, 4);
    put_le(p + 16, r->smem, 4);
    put_le(p + 20, r->created, 8);
    put_le(p + 28, r->cubin_size, 8);
    put_le(p + 36, XXH3_64bits(r->cubin, (size_t)r->cubin_size), 8);
    size_t off = REC_FIXED;
    for (int i = 0; i < REC_N_STRINGS; i++) {
        put_le(p + off, len[i], 4);
        memcpy(p + off + REC_STRING_PREFIX, rec_string_const(r, i), len[i] + 1);
        off += REC_STRING_PREFIX + len[i] + 1;
    }
    put_le(p + off, XXH3_64bits(p, off), 8);
    memcpy(p + header, r->cubin, (size_t)r->cubin_size);
    *out = p;
    *size = total;
    return KILN_OK;
}

/* The signature for an error message, when what was read is printable. */
static const char *readable(const char *s)
{
    if (!s)
        return NULL;
    for (const char *c = s; *c; c++)
        if (!isprint((unsigned char)*c))
            return NULL;
    return s;
}

static kiln_status corrupt(const kiln_cache_record *r, const char *what)
{
    const char *sig = readable(r->signature);
    if (sig)
        return kiln_fail(KILN_ERR_CACHE, "corrupt record of \"%s\": %s", sig, what);
    return kiln_fail(KILN_ERR_CACHE, "corrupt record (signature unreadable): %s", what);
}

kiln_status kiln_cache_record_decode(const void *buf, size_t size, kiln_cache_record *out)
{
    const uint8_t *p = buf;
    kiln_cache_record r = {0};
    char why[160];
    if (size < REC_FIXED)
        return kiln_fail(KILN_ERR_CACHE, "corrupt record: %zu bytes, shorter than its header",
                         size);
    if (memcmp(p, "KLNR", 4))
        return kiln_fail(KILN_ERR_CACHE, "corrupt record: no KLNR magic");
    uint32_t version = (uint32_t)get_le(p + 4, 4);
    if (version != KILN_CACHE_RECORD_VERSION)
        return kiln_fail(KILN_ERR_CACHE, "record version %u, this kiln reads version %u",
                         version, KILN_CACHE_RECORD_VERSION);
    size_t header = (size_t)get_le(p + 8, 4);
    if (header < REC_FIXED + REC_HASH || header > size) {
        snprintf(why, sizeof why, "header size %zu outside the record's %zu bytes", header, size);
        return corrupt(&r, why);
    }
    /* Strings are parsed before the header checksum is checked so that a
     * message can name the signature; nothing is trusted until it passes. */
    size_t off = REC_FIXED, end = header - REC_HASH;
    for (int i = 0; i < REC_N_STRINGS; i++) {
        if (end - off < REC_STRING_PREFIX) {
            snprintf(why, sizeof why, "the %s runs past the header", rec_strings[i].name);
            return corrupt(&r, why);
        }
        uint64_t n = get_le(p + off, 4);
        off += REC_STRING_PREFIX;
        const char *s = (const char *)p + off;
        if (n >= end - off || s[n] != '\0') {
            snprintf(why, sizeof why, "the %s's length %llu does not fit the header",
                     rec_strings[i].name, (unsigned long long)n);
            return corrupt(&r, why);
        }
        if (memchr(s, '\0', (size_t)n)) {
            snprintf(why, sizeof why, "the %s holds a NUL byte", rec_strings[i].name);
            return corrupt(&r, why);
        }
        *rec_string(&r, i) = s;
        off += (size_t)n + 1;
    }
    if (off != end) {
        snprintf(why, sizeof why, "header size %zu, but its fields end at %zu", header,
                 off + REC_HASH);
        return corrupt(&r, why);
    }
    uint64_t stored = get_le(p + end, 8), actual = XXH3_64bits(p, end);
    if (stored != actual) {
        snprintf(why, sizeof why, "header checksum %016llx, the header hashes to %016llx",
                 (unsigned long long)stored, (unsigned long long)actual);
        return corrupt(&r, why);
    }
    r.threads = (uint32_t)get_le(p + 12, 4);
    r.smem = (uint32_t)get_le(p + 16, 4);
    r.created = get_le(p + 20, 8);
    r.cubin_size = get_le(p + 28, 8);
    r.cubin_hash = get_le(p + 36, 8);
    if (r.cubin_size != size - header) {
        snprintf(why, sizeof why, "cubin of %llu bytes, but %zu follow the header",
                 (unsigned long long)r.cubin_size, size - header);
        return corrupt(&r, why);
    }
    r.cubin = p + header;
    actual = XXH3_64bits(r.cubin, (size_t)r.cubin_size);
    if (actual != r.cubin_hash) {
        snprintf(why, sizeof why, "cubin checksum %016llx, the cubin hashes to %016llx",
                 (unsigned long long)r.cubin_hash, (unsigned long long)actual);
        return corrupt(&r, why);
    }
    if (!*r.entry || !r.threads || !r.cubin_size)
        return corrupt(&r, "no entry name, threads or cubin");
    *out = r;
    return KILN_OK;
}
