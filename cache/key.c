/* Cache keys: XXH3-128 over length-prefixed fields, and their hex form. */
#include "cache/cache.h"

#include <string.h>
#include <xxhash.h>

/* Without the length, moving bytes from one field to the next would keep
 * the key. (XXH3's update fails only on a NULL state.) */
void kiln_cache_key_field(XXH3_state_t *s, const void *p, size_t n)
{
    uint8_t len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (uint8_t)((uint64_t)n >> (8 * i));
    XXH3_128bits_update(s, len, sizeof len);
    XXH3_128bits_update(s, p, n);
}

kiln_status kiln_cache_key(const char *target, const char *options, const char *source,
                           size_t source_len, uint8_t key[KILN_CACHE_KEY_BYTES])
{
    if (!target || !*target || !options || !source || !source_len || !key)
        return kiln_fail(KILN_ERR_INVALID_ARG,
                         "cache key: needs a target, options (may be \"\") and a non-empty source");
    XXH3_state_t *s = XXH3_createState();
    if (!s)
        return kiln_fail(KILN_ERR_NOMEM, "cache key: out of memory for the hash state");
    XXH3_128bits_reset(s);
    kiln_cache_key_field(s, KILN_CACHE_SCHEMA, strlen(KILN_CACHE_SCHEMA));
    kiln_cache_key_field(s, target, strlen(target));
    kiln_cache_key_field(s, options, strlen(options));
    kiln_cache_key_field(s, source, source_len);
    XXH128_canonical_t canon;
    XXH128_canonicalFromHash(&canon, XXH3_128bits_digest(s));
    XXH3_freeState(s);
    memcpy(key, canon.digest, KILN_CACHE_KEY_BYTES);
    return KILN_OK;
}

void kiln_cache_key_hex(const uint8_t key[KILN_CACHE_KEY_BYTES], char out[KILN_CACHE_KEY_HEX])
{
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < KILN_CACHE_KEY_BYTES; i++) {
        out[2 * i] = digits[key[i] >> 4];
        out[2 * i + 1] = digits[key[i] & 15];
    }
    out[2 * KILN_CACHE_KEY_BYTES] = '\0';
}

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

kiln_status kiln_cache_key_parse(const char *hex, uint8_t key[KILN_CACHE_KEY_BYTES],
                                 int *n_nibbles)
{
    size_t n = hex ? strlen(hex) : 0;
    if (n == 0 || n > 2 * KILN_CACHE_KEY_BYTES)
        return kiln_fail(KILN_ERR_INVALID_ARG, "cache key \"%s\": give 1 to %d hex digits",
                         hex ? hex : "(null)", 2 * KILN_CACHE_KEY_BYTES);
    uint8_t k[KILN_CACHE_KEY_BYTES] = {0};
    for (size_t i = 0; i < n; i++) {
        int d = hex_digit(hex[i]);
        if (d < 0)
            return kiln_fail(KILN_ERR_INVALID_ARG, "cache key \"%s\": '%c' is not a hex digit",
                             hex, hex[i]);
        k[i / 2] |= (uint8_t)(i % 2 ? d : d << 4);
    }
    memcpy(key, k, sizeof k);
    *n_nibbles = (int)n;
    return KILN_OK;
}
