/* Cache records: encoding, and decoding that trusts nothing it reads (the
 * layout is in cache.h), of this version and the ones before it; and the
 * check that a cubin is an ELF for its target. */
#include "cache/cache.h"

#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

enum {
    REC_FIXED = 44, /* magic .. cubin hash */
    REC_STRING_PREFIX = 4,
    REC_HASH = 8,
    REC_MAX_STRINGS = 6,
};

/* A record version's layout: its header strings in stored order, and
 * whether its header checksum starts with the key. Both versions share the
 * fixed fields before the strings. */
typedef struct rec_string {
    const char *name;
    size_t offset;
} rec_string;

#define REC_STRING(field) { #field, offsetof(kiln_cache_record, field) }

static const struct rec_layout {
    uint32_t version;
    int n_strings;
    rec_string strings[REC_MAX_STRINGS];
    bool binds_key;
} rec_layouts[] = {
    { 1, 5,
      { REC_STRING(compiler), REC_STRING(entry), REC_STRING(target), REC_STRING(kind),
        REC_STRING(signature) },
      false },
    { 2, 6,
      { REC_STRING(schema), REC_STRING(compiler), REC_STRING(entry), REC_STRING(target),
        REC_STRING(kind), REC_STRING(signature) },
      true },
};
typedef struct rec_layout rec_layout;

static const rec_layout *rec_current = &rec_layouts[KILN_ARRAY_LEN(rec_layouts) - 1];
_Static_assert(KILN_CACHE_RECORD_VERSION == 2, "the last layout is the one kiln writes");

static const char **rec_field(kiln_cache_record *r, const rec_string *s)
{
    return (const char **)((char *)r + s->offset);
}

static const char *rec_field_const(const kiln_cache_record *r, const rec_string *s)
{
    return *(const char *const *)((const char *)r + s->offset);
}


/* The header checksum of layout L over p[0, end), with the version field
 * read as version: the key first when the layout binds it. */
static uint64_t header_hash(const rec_layout *L, const uint8_t *p, size_t end, const uint8_t *key,
                            uint32_t version)
{
    XXH3_state_t st;
    uint8_t v[4];
    kiln_cache_put_le(v, version, 4);
    XXH3_64bits_reset(&st);
    if (L->binds_key)
        XXH3_64bits_update(&st, key, KILN_CACHE_KEY_BYTES);
    XXH3_64bits_update(&st, p, 4);
    XXH3_64bits_update(&st, v, 4);
    XXH3_64bits_update(&st, p + 8, end - 8);
    return XXH3_64bits_digest(&st);
}

/* ------------------------------------------------------------ cubins */

/* ELF64: the identification bytes, then the fields read here. */
enum {
    ELF_CLASS = 4,      /* 2: 64-bit */
    ELF_DATA = 5,       /* 1: little-endian */
    ELF_ABIVERSION = 8, /* the CUDA ELF ABI: 7, or 8 from CUDA 12.8 */
    ELF_MACHINE = 18,   /* u16 */
    ELF_PHOFF = 32,
    ELF_SHOFF = 40,
    ELF_FLAGS = 48,     /* u32 */
    ELF_PHENTSIZE = 54,
    ELF_PHNUM = 56,
    ELF_SHENTSIZE = 58,
    ELF_SHNUM = 60,
    ELF_HEADER = 64,
    EM_CUDA = 190,
};

/* Where each CUDA ELF ABI keeps the sm in e_flags (NVRTC 13.0 writes ABI 8:
 * sm_90 is 0x5a00 there; ABI 7 had it in the low byte). */
static const struct {
    unsigned abi, shift;
} elf_sm_field[] = { { 7, 0 }, { 8, 8 } };

static int target_sm(const char *target)
{
    if (strncmp(target, "sm_", 3) || !isdigit((unsigned char)target[3]))
        return -1;
    int sm = 0;
    const char *c = target + 3;
    for (; isdigit((unsigned char)*c) && sm < 10000; c++)
        sm = sm * 10 + (*c - '0');
    return *c && !(islower((unsigned char)*c) && !c[1]) ? -1 : sm;
}

kiln_status kiln_cache_cubin_check(const uint8_t *cubin, uint64_t size, const char *target)
{
    int sm = target_sm(target);
    if (sm < 0)
        return kiln_fail(KILN_ERR_CACHE, "target \"%s\" is not an sm_ name", target);
    if (size < ELF_HEADER || memcmp(cubin, "\x7f" "ELF", 4) || cubin[ELF_CLASS] != 2 ||
        cubin[ELF_DATA] != 1)
        return kiln_fail(KILN_ERR_CACHE, "the cubin is not a 64-bit little-endian ELF");
    unsigned machine = (unsigned)kiln_cache_get_le(cubin + ELF_MACHINE, 2);
    if (machine != EM_CUDA)
        return kiln_fail(KILN_ERR_CACHE, "the cubin is an ELF for machine %u, not CUDA's %u", machine,
                         EM_CUDA);
    uint64_t tables[][3] = {
        { kiln_cache_get_le(cubin + ELF_PHOFF, 8), kiln_cache_get_le(cubin + ELF_PHENTSIZE, 2),
          kiln_cache_get_le(cubin + ELF_PHNUM, 2) },
        { kiln_cache_get_le(cubin + ELF_SHOFF, 8), kiln_cache_get_le(cubin + ELF_SHENTSIZE, 2),
          kiln_cache_get_le(cubin + ELF_SHNUM, 2) },
    };
    for (size_t i = 0; i < KILN_ARRAY_LEN(tables); i++)
        if (tables[i][0] > size || tables[i][1] * tables[i][2] > size - tables[i][0])
            return kiln_fail(KILN_ERR_CACHE, "the cubin's %s table runs past its %llu bytes",
                             i ? "section" : "program header", (unsigned long long)size);
    unsigned flags = (unsigned)kiln_cache_get_le(cubin + ELF_FLAGS, 4), abi = cubin[ELF_ABIVERSION];
    for (size_t i = 0; i < KILN_ARRAY_LEN(elf_sm_field); i++) {
        if (elf_sm_field[i].abi != abi)
            continue;
        unsigned got = flags >> elf_sm_field[i].shift & 0xff;
        if (got != (unsigned)sm)
            return kiln_fail(KILN_ERR_CACHE, "the cubin is for sm_%u, the record's target is %s", got,
                             target);
        return KILN_OK;
    }
    return kiln_fail(KILN_ERR_CACHE, "the cubin's CUDA ELF ABI is version %u; kiln reads 7 and 8",
                     abi);
}

/* ------------------------------------------------------------ records */

kiln_status kiln_cache_record_encode(const kiln_cache_record *r,
                                     const uint8_t key[KILN_CACHE_KEY_BYTES], uint8_t **out,
                                     size_t *size)
{
    const rec_layout *L = rec_current;
    kiln_cache_record w = *r;
    w.schema = KILN_CACHE_SCHEMA;
    size_t header = REC_FIXED + REC_HASH, len[REC_MAX_STRINGS];
    for (int i = 0; i < L->n_strings; i++) {
        const char *s = rec_field_const(&w, &L->strings[i]);
        if (!s)
            return kiln_fail(KILN_ERR_INVALID_ARG, "cache record: the %s is NULL",
                             L->strings[i].name);
        len[i] = strlen(s);
        header += REC_STRING_PREFIX + len[i] + 1;
    }
    if (!key)
        return kiln_fail(KILN_ERR_INVALID_ARG, "cache record \"%s\": no key", r->signature);
    if (!*r->entry || !r->threads || !r->cubin || !r->cubin_size)
        return kiln_fail(KILN_ERR_INVALID_ARG,
                         "cache record \"%s\": needs an entry name, threads and a cubin",
                         r->signature);
    /* An LMDB node stores a value's size in 32 bits. */
    if (header > UINT32_MAX || r->cubin_size > UINT32_MAX - header)
        return kiln_fail(KILN_ERR_INVALID_ARG,
                         "cache record \"%s\": %llu cubin bytes exceed what a record can hold",
                         r->signature, (unsigned long long)r->cubin_size);
    if (kiln_cache_cubin_check(r->cubin, r->cubin_size, r->target))
        return kiln_fail_prefix(KILN_ERR_INVALID_ARG, "cache record \"%s\"", r->signature);
    size_t total = header + (size_t)r->cubin_size;
    uint8_t *p = kiln_malloc(total);
    if (!p)
        return kiln_fail(KILN_ERR_NOMEM, "cache record \"%s\": out of memory for %zu bytes",
                         r->signature, total);
    memcpy(p, "KLNR", 4);
    kiln_cache_put_le(p + 4, L->version, 4);
    kiln_cache_put_le(p + 8, header, 4);
    kiln_cache_put_le(p + 12, r->threads, 4);
    kiln_cache_put_le(p + 16, r->smem, 4);
    kiln_cache_put_le(p + 20, r->created, 8);
    kiln_cache_put_le(p + 28, r->cubin_size, 8);
    kiln_cache_put_le(p + 36, XXH3_64bits(r->cubin, (size_t)r->cubin_size), 8);
    size_t off = REC_FIXED;
    for (int i = 0; i < L->n_strings; i++) {
        kiln_cache_put_le(p + off, len[i], 4);
        memcpy(p + off + REC_STRING_PREFIX, rec_field_const(&w, &L->strings[i]), len[i] + 1);
        off += REC_STRING_PREFIX + len[i] + 1;
    }
    kiln_cache_put_le(p + off, header_hash(L, p, off, key, L->version), 8);
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

/* Decode p as a record of layout L whose version field reads as version.
 * KILN_OK when every check of the layout passes. */
static kiln_status decode_as(const rec_layout *L, const uint8_t *p, size_t size, const uint8_t *key,
                             uint32_t version, kiln_cache_record *out)
{
    kiln_cache_record r = { .version = version };
    char why[160];
    size_t header = (size_t)kiln_cache_get_le(p + 8, 4);
    if (header < REC_FIXED + REC_HASH || header > size) {
        snprintf(why, sizeof why, "header size %zu outside the record's %zu bytes", header, size);
        return corrupt(&r, why);
    }
    /* Strings are parsed before the header checksum is checked so that a
     * message can name the signature; nothing is trusted until it passes. */
    size_t off = REC_FIXED, end = header - REC_HASH;
    for (int i = 0; i < L->n_strings; i++) {
        const char *name = L->strings[i].name;
        if (end - off < REC_STRING_PREFIX) {
            snprintf(why, sizeof why, "the %s runs past the header", name);
            return corrupt(&r, why);
        }
        uint64_t n = kiln_cache_get_le(p + off, 4);
        off += REC_STRING_PREFIX;
        const char *s = (const char *)p + off;
        if (n >= end - off || s[n] != '\0') {
            snprintf(why, sizeof why, "the %s's length %llu does not fit the header", name,
                     (unsigned long long)n);
            return corrupt(&r, why);
        }
        if (memchr(s, '\0', (size_t)n)) {
            snprintf(why, sizeof why, "the %s holds a NUL byte", name);
            return corrupt(&r, why);
        }
        *rec_field(&r, &L->strings[i]) = s;
        off += (size_t)n + 1;
    }
    if (off != end) {
        snprintf(why, sizeof why, "header size %zu, but its fields end at %zu", header,
                 off + REC_HASH);
        return corrupt(&r, why);
    }
    uint64_t stored = kiln_cache_get_le(p + end, 8), actual = header_hash(L, p, end, key, version);
    if (stored != actual) {
        snprintf(why, sizeof why, "header checksum %016llx, the header%s hashes to %016llx",
                 (unsigned long long)stored, L->binds_key ? " and its key" : "",
                 (unsigned long long)actual);
        return corrupt(&r, why);
    }
    r.threads = (uint32_t)kiln_cache_get_le(p + 12, 4);
    r.smem = (uint32_t)kiln_cache_get_le(p + 16, 4);
    r.created = kiln_cache_get_le(p + 20, 8);
    r.cubin_size = kiln_cache_get_le(p + 28, 8);
    r.cubin_hash = kiln_cache_get_le(p + 36, 8);
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

kiln_status kiln_cache_record_decode(const void *buf, size_t size,
                                     const uint8_t key[KILN_CACHE_KEY_BYTES],
                                     kiln_cache_record *out)
{
    const uint8_t *p = buf;
    kiln_cache_record r;
    char why[200];
    if (size < REC_FIXED)
        return kiln_fail(KILN_ERR_CACHE, "corrupt record: %zu bytes, shorter than its header",
                         size);
    if (memcmp(p, "KLNR", 4))
        return kiln_fail(KILN_ERR_CACHE, "corrupt record: no KLNR magic");
    uint32_t version = (uint32_t)kiln_cache_get_le(p + 4, 4);
    const rec_layout *L = NULL;
    for (size_t i = 0; i < KILN_ARRAY_LEN(rec_layouts); i++)
        if (rec_layouts[i].version == version)
            L = &rec_layouts[i];
    if (!L) {
        /* A version of no layout kiln knows: another kiln's record, unless
         * it is one of kiln's with its version field damaged. */
        for (size_t i = 0; i < KILN_ARRAY_LEN(rec_layouts); i++)
            if (decode_as(&rec_layouts[i], p, size, key, rec_layouts[i].version, &r) == KILN_OK) {
                snprintf(why, sizeof why, "version field %u, but the record is an intact "
                         "version %u record", version, rec_layouts[i].version);
                return corrupt(&r, why);
            }
        *out = (kiln_cache_record){ .version = version };
        return kiln_fail(KILN_ERR_UNSUPPORTED, "a record of version %u, which this kiln (version %u) "
                         "leaves alone", version, KILN_CACHE_RECORD_VERSION);
    }
    kiln_status st = decode_as(L, p, size, key, version, &r);
    if (st)
        return st;
    if (L != rec_current) {
        *out = r;
        return kiln_fail(KILN_ERR_UNSUPPORTED, "a record of version %u, which this kiln (version %u) "
                         "leaves alone", version, KILN_CACHE_RECORD_VERSION);
    }
    if (strcmp(r.schema, KILN_CACHE_SCHEMA)) {
        snprintf(why, sizeof why, "schema \"%.64s\", this kiln's is \"%s\"", r.schema,
                 KILN_CACHE_SCHEMA);
        return corrupt(&r, why);
    }
    if (kiln_cache_cubin_check(r.cubin, r.cubin_size, r.target)) {
        snprintf(why, sizeof why, "%s", kiln_last_error());
        return corrupt(&r, why);
    }
    *out = r;
    return KILN_OK;
}
