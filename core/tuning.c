/* Tile configurations chosen by measurement: a table from (kernel signature
 * with its variant left out, token bucket) to the variant that ran fastest
 * there, with the times that chose it; and from (a bucket's whole step,
 * token bucket) to its launch policy, serial or overlap. `kiln tune` fills
 * it on a device, the cache keeps it beside the kernels, and planning
 * prefers its choices to the heuristic's.
 *
 * As text (the cache's form), one entry a line, fields one space apart:
 *     BUCKET VARIANT US HEURISTIC HEURISTIC_US SIGNATURE
 * US and HEURISTIC_US in microseconds, SIGNATURE to the end of the line
 * (a linear signature with "variant=*", or a step key "step ... hash=H").
 * The text comes from a cache file: untrusted, parsed field by field with
 * every length bounded. */
#include "core/tuning.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct tuning_entry {
    char *signature;
    int64_t bucket;
    char variant[KILN_TUNING_NAME_MAX];
    char heuristic[KILN_TUNING_NAME_MAX];
    double us, heuristic_us;
} tuning_entry;

struct kiln_tuning {
    tuning_entry *entries;
    int n, cap;
};

kiln_status kiln_tuning_create(kiln_tuning **out)
{
    if (!out)
        return kiln_fail(KILN_ERR_INVALID_ARG, "tuning: out is required");
    if (!(*out = kiln_calloc(1, sizeof **out)))
        return kiln_fail(KILN_ERR_NOMEM, "tuning: out of memory");
    return KILN_OK;
}

void kiln_tuning_destroy(kiln_tuning *t)
{
    if (!t)
        return;
    for (int i = 0; i < t->n; i++)
        free(t->entries[i].signature);
    free(t->entries);
    free(t);
}

int kiln_tuning_n(const kiln_tuning *t) { return t ? t->n : 0; }

kiln_status kiln_tuning_at(const kiln_tuning *t, int i, kiln_tuning_entry *out)
{
    if (!t || !out || i < 0 || i >= t->n)
        return kiln_fail(KILN_ERR_INVALID_ARG, "tuning: entry %d of %d", i, kiln_tuning_n(t));
    const tuning_entry *e = &t->entries[i];
    *out = (kiln_tuning_entry){ .signature = e->signature, .bucket = e->bucket,
                                .variant = e->variant, .us = e->us,
                                .heuristic = e->heuristic, .heuristic_us = e->heuristic_us };
    return KILN_OK;
}

static int find(const kiln_tuning *t, const char *signature, int64_t bucket)
{
    for (int i = 0; t && i < t->n; i++)
        if (t->entries[i].bucket == bucket && !strcmp(t->entries[i].signature, signature))
            return i;
    return -1;
}

int kiln_tuning_index(const kiln_tuning *t, const char *signature, int64_t bucket)
{
    return signature ? find(t, signature, bucket) : -1;
}

/* A name field: printable, no space, shorter than KILN_TUNING_NAME_MAX. */
static int name_ok(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n >= KILN_TUNING_NAME_MAX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] <= ' ' || s[i] > '~')
            return 0;
    return 1;
}

/* A linear signature with variant=*, or a step key (kiln_plan_step_key). */
static int signature_ok(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n >= KILN_SIGNATURE_MAX)
        return 0;
    if (strncmp(s, "linear ", 7) ? strncmp(s, "step ", 5) || !strstr(s, " hash=")
                                 : !strstr(s, " variant=* "))
        return 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] < ' ' || s[i] > '~')
            return 0;
    return 1;
}

static int time_ok(double us) { return isfinite(us) && us >= 0 && us < 1e12; }

kiln_status kiln_tuning_set(kiln_tuning *t, const kiln_tuning_entry *e)
{
    if (!t || !e)
        return kiln_fail(KILN_ERR_INVALID_ARG, "tuning: table and entry are required");
    if (!signature_ok(e->signature))
        return kiln_fail(KILN_ERR_INVALID_ARG,
                         "tuning: \"%s\" is neither a linear signature with variant=* nor a "
                         "step key",
                         e->signature ? e->signature : "(null)");
    if (e->bucket < 1 || !name_ok(e->variant) || !name_ok(e->heuristic) || !time_ok(e->us) ||
        !time_ok(e->heuristic_us))
        return kiln_fail(KILN_ERR_INVALID_ARG,
                         "tuning: a bad entry for bucket %lld of \"%s\" (variants are names "
                         "without spaces, times finite and not negative)",
                         (long long)e->bucket, e->signature);
    int i = find(t, e->signature, e->bucket);
    if (i < 0) {
        if (t->n == t->cap) {
            int cap = t->cap ? 2 * t->cap : 16;
            tuning_entry *p = kiln_realloc(t->entries, (size_t)cap * sizeof *p);
            if (!p)
                return kiln_fail(KILN_ERR_NOMEM, "tuning: out of memory");
            t->entries = p;
            t->cap = cap;
        }
        char *sig = kiln_strdup(e->signature);
        if (!sig)
            return kiln_fail(KILN_ERR_NOMEM, "tuning: out of memory");
        i = t->n++;
        t->entries[i] = (tuning_entry){ .signature = sig, .bucket = e->bucket };
    }
    tuning_entry *d = &t->entries[i];
    snprintf(d->variant, sizeof d->variant, "%s", e->variant);
    snprintf(d->heuristic, sizeof d->heuristic, "%s", e->heuristic);
    d->us = e->us;
    d->heuristic_us = e->heuristic_us;
    return KILN_OK;
}

kiln_status kiln_tuning_merge(kiln_tuning *into, const kiln_tuning *from, int replace)
{
    for (int i = 0; from && i < from->n; i++) {
        const tuning_entry *e = &from->entries[i];
        if (!replace && find(into, e->signature, e->bucket) >= 0)
            continue;
        kiln_tuning_entry x;
        kiln_status st = kiln_tuning_at(from, i, &x);
        if (st || (st = kiln_tuning_set(into, &x)))
            return st;
    }
    return KILN_OK;
}

kiln_status kiln_tuning_text(const kiln_tuning *t, char **out, size_t *size)
{
    size_t cap = 1, used = 0;
    for (int i = 0; t && i < t->n; i++)
        cap += strlen(t->entries[i].signature) + 2 * KILN_TUNING_NAME_MAX + 96;
    char *buf = kiln_malloc(cap);
    if (!buf)
        return kiln_fail(KILN_ERR_NOMEM, "tuning: out of memory for its text");
    buf[0] = '\0';
    for (int i = 0; t && i < t->n; i++) {
        const tuning_entry *e = &t->entries[i];
        used += (size_t)snprintf(buf + used, cap - used, "%lld %s %.3f %s %.3f %s\n",
                                 (long long)e->bucket, e->variant, e->us, e->heuristic,
                                 e->heuristic_us, e->signature);
    }
    *out = buf;
    *size = used;
    return KILN_OK;
}

/* The next space-delimited field of line [*p, end) into buf. */
static int field(const char **p, const char *end, char *buf, size_t size)
{
    const char *s = *p, *e = memchr(s, ' ', (size_t)(end - s));
    if (!e || e == s || (size_t)(e - s) >= size)
        return 0;
    memcpy(buf, s, (size_t)(e - s));
    buf[e - s] = '\0';
    *p = e + 1;
    return 1;
}

/* A bucket: decimal digits, 1 to 2^53. */
static int bucket(const char *s, int64_t *out)
{
    int64_t v = 0;
    if (!*s)
        return 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || v > ((int64_t)1 << 53) / 10)
            return 0;
        v = v * 10 + (*s - '0');
    }
    *out = v;
    return v >= 1;
}

static int number(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || end == s)
        return 0;
    *out = v;
    return 1;
}

kiln_status kiln_tuning_parse(kiln_tuning *t, const char *text, size_t size, const char *origin)
{
    const char *p = text, *end = text + size;
    int line = 0;
    while (p < end) {
        line++;
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol)
            return kiln_fail(KILN_ERR_MALFORMED, "%s: tuning line %d is not ended", origin, line);
        char b[24], us[32], hus[32], sig[KILN_SIGNATURE_MAX];
        kiln_tuning_entry e = { 0 };
        char variant[KILN_TUNING_NAME_MAX], heuristic[KILN_TUNING_NAME_MAX];
        size_t sig_n = 0;
        int ok = field(&p, eol, b, sizeof b) && field(&p, eol, variant, sizeof variant) &&
                 field(&p, eol, us, sizeof us) && field(&p, eol, heuristic, sizeof heuristic) &&
                 field(&p, eol, hus, sizeof hus) && (sig_n = (size_t)(eol - p)) < sizeof sig &&
                 bucket(b, &e.bucket) && number(us, &e.us) && number(hus, &e.heuristic_us);
        if (ok) {
            memcpy(sig, p, sig_n);
            sig[sig_n] = '\0';
            e.signature = sig;
            e.variant = variant;
            e.heuristic = heuristic;
        }
        kiln_status st = ok ? kiln_tuning_set(t, &e) : KILN_ERR_MALFORMED;
        if (st == KILN_ERR_NOMEM)
            return st;
        if (st)
            return kiln_fail(KILN_ERR_MALFORMED, "%s: tuning line %d is malformed", origin, line);
        p = eol + 1;
    }
    return KILN_OK;
}
