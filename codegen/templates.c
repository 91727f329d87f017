/* The embedded templates' digest, which every generated source names in
 * its header: a template change changes every cache key. */
#include "codegen/emit.h"

#include "cache/cache.h"

#include <pthread.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack: hashing cannot fail */
#include <xxhash.h>

/* XXH3-128 over every embedded template, name and text, each a field as
 * the cache key's are. */
static char templates_digest[KILN_CACHE_KEY_HEX];
static pthread_once_t templates_once = PTHREAD_ONCE_INIT;

static void templates_digest_once(void)
{
    XXH3_state_t s;
    XXH3_INITSTATE(&s);
    XXH3_128bits_reset(&s);
    for (size_t i = 0; i < kiln_embedded_headers_count; i++) {
        const kiln_embedded_file *f = &kiln_embedded_headers[i];
        kiln_cache_key_field(&s, f->name, strlen(f->name));
        kiln_cache_key_field(&s, f->text, strlen(f->text));
    }
    XXH128_canonical_t canon;
    XXH128_canonicalFromHash(&canon, XXH3_128bits_digest(&s));
    uint8_t digest[KILN_CACHE_KEY_BYTES];
    memcpy(digest, canon.digest, sizeof digest);
    kiln_cache_key_hex(digest, templates_digest);
}

const char *kiln_emit_templates_digest(void)
{
    pthread_once(&templates_once, templates_digest_once);
    return templates_digest;
}
