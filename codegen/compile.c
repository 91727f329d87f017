#include "codegen/compile.h"
#include "core/tuning.h"

#include "codegen/nvrtc.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void kiln_build_free(kiln_build *b)
{
    if (!b)
        return;
    for (int i = 0; b->kernels && i < b->n; i++)
        free(b->kernels[i].cubin);
    free(b->kernels);
    memset(b, 0, sizeof *b);
}

/* The kind a record is filed under: the backend, or the aux kernel's family. */
static const char *kernel_kind(const kiln_kernel_desc *d)
{
    switch (d->kind) {
    case KILN_STEP_LINEAR: return d->backend->name;
    case KILN_STEP_QUANT: return "quant";
    case KILN_STEP_PACK: return "pack";
    default: return "op";
    }
}

/* k's functions, threads and dynamic shared memory, from its launches for
 * one token as the target fixes them: what its cache record holds. */
static kiln_status kernel_entries(const kiln_kernel_desc *d, kiln_kernel *k, uint32_t *smem)
{
    kiln_kernel_launch l[KILN_MAX_LAUNCHES];
    int n = 0;
    kiln_status st = kiln_kernel_launches(d, 1, l, &n);
    if (st != KILN_OK)
        return st;
    for (int f = 0; f < n; f++)
        memcpy(k->entry[f], l[f].entry, KILN_ENTRY_MAX);
    k->n_entries = n;
    k->threads = l[0].cfg.block[0] * l[0].cfg.block[1] * l[0].cfg.block[2];
    *smem = l[0].cfg.smem;
    return KILN_OK;
}

static kiln_status store(kiln_cache *c, const kiln_kernel_desc *d, const kiln_kernel *k,
                         uint32_t smem, const char *compiler)
{
    kiln_cache_record rec = {
        .compiler = compiler,
        .entry = d->entry,
        .target = d->target.name,
        .kind = kernel_kind(d),
        .signature = k->signature,
        .threads = k->threads,
        .smem = smem,
        .cubin = k->cubin,
        .cubin_size = k->cubin_size,
    };
    kiln_cache_put put;
    return kiln_cache_store(c, k->key, &rec, &put);
}

/* A record found under k's key describes the kernel the plan launches:
 * the key covers the source, so anything else is a damaged cache or a
 * kiln that launches its kernels otherwise than it recorded them. */
static kiln_status record_fits(const kiln_cache_record *r, const kiln_kernel *k, uint32_t smem)
{
    if (r->threads == k->threads && r->smem == smem)
        return KILN_OK;
    return kiln_fail(KILN_ERR_CACHE,
                     "kernel %s: its cache record says %u threads and %u bytes of shared "
                     "memory a block, the plan launches %u and %u",
                     k->signature, r->threads, r->smem, k->threads, smem);
}

/* What store_compiled needs of the build in progress. */
typedef struct build_store {
    const kiln_plan *p;
    kiln_cache *c;
    kiln_build *b;
    const int *job_of;
    const uint32_t *smem;
    kiln_status st;    /* the first failed store; no store is tried after it */
    char message[1024]; /* its message */
} build_store;

/* Each kernel is stored as soon as it compiles, in a transaction of its
 * own: a compile interrupted or failed later keeps every kernel that was
 * done, and the next build finds them. */
static void store_compiled(void *ctx, int j, kiln_compile_job *job)
{
    build_store *bs = ctx;
    kiln_kernel *k = &bs->b->kernels[bs->job_of[j]];
    if (job->status != KILN_OK)
        return;
    k->cubin = job->cubin;
    k->cubin_size = job->cubin_size;
    k->seconds = job->seconds;
    job->cubin = NULL;
    bs->b->compiled++;
    if (kiln_cache_writable_layer(bs->c) < 0 || bs->st != KILN_OK)
        return;
    bs->st = store(bs->c, &bs->p->signatures[bs->job_of[j]].desc, k, bs->smem[bs->job_of[j]],
                   bs->b->compiler);
    if (bs->st != KILN_OK)
        snprintf(bs->message, sizeof bs->message, "%s", kiln_last_error());
}

static bool jobs_failed(const kiln_compile_job *jobs, int n)
{
    for (int i = 0; i < n; i++)
        if (jobs[i].status != KILN_OK)
            return true;
    return false;
}

kiln_status kiln_build_plan(const kiln_plan *p, kiln_cache *c, const kiln_build_options *opts,
                            kiln_build *out)
{
    const kiln_build_options defaults = { 0 };
    const kiln_build_options *o = opts ? opts : &defaults;
    double t0 = kiln_now();
    kiln_build b = { .target = p->target, .programs = p->programs, .n_programs = p->n_buckets,
                     .n = kiln_plan_n_signatures(p) };
    kiln_compile_job *jobs = NULL;
    kiln_kernel_source *srcs = NULL;
    int *job_of = NULL, n_jobs = 0;
    uint32_t *smem = NULL; /* each kernel's dynamic shared memory, as its record holds it */
    kiln_nvrtc *nv = NULL;
    char options[256];
    kiln_status st = KILN_OK;
    kiln_nvrtc_options(&p->target, options, sizeof options);

    b.kernels = kiln_calloc((size_t)b.n + 1, sizeof *b.kernels);
    srcs = kiln_calloc((size_t)b.n + 1, sizeof *srcs);
    jobs = kiln_calloc((size_t)b.n + 1, sizeof *jobs);
    job_of = kiln_calloc((size_t)b.n + 1, sizeof *job_of);
    smem = kiln_calloc((size_t)b.n + 1, sizeof *smem);
    if (!b.kernels || !srcs || !jobs || !job_of || !smem) {
        st = kiln_fail(KILN_ERR_NOMEM, "build: out of memory for %d kernels", b.n);
        goto done;
    }
    /* Key every signature over its source with the key line still a
     * placeholder, then write the key in: the key covers the code, and the
     * compiled source names the key it is filed under. */
    for (int i = 0; i < b.n && st == KILN_OK; i++) {
        kiln_kernel *k = &b.kernels[i];
        const kiln_kernel_desc *d = &p->signatures[i].desc;
        k->signature = p->signatures[i].text;
        snprintf(k->target, sizeof k->target, "%s", d->target.name);
        if ((st = kiln_emit(d, k->signature, &srcs[i])))
            break;
        if ((st = kernel_entries(d, k, &smem[i])))
            break;
        if ((st = kiln_cache_key(p->target.name, options, srcs[i].text, srcs[i].length, k->key)))
            break;
        char hex[KILN_CACHE_KEY_HEX];
        kiln_cache_key_hex(k->key, hex);
        if ((st = kiln_emit_set_key(srcs[i].text, hex)))
            break;
        kiln_cache_hit hit;
        st = kiln_cache_lookup(c, k->key, p->target.name, &hit);
        if (st == KILN_OK) {
            int fits = !strcmp(hit.rec.entry, d->entry) &&
                       !strcmp(hit.rec.target, p->target.name);
            if (fits && (st = record_fits(&hit.rec, k, smem[i])) != KILN_OK) {
                kiln_cache_hit_release(&hit);
                break;
            }
            if (fits) {
                k->cached = 1;
                k->layer = hit.layer;
                b.cached++;
                if (!o->no_cubins && (k->cubin = kiln_malloc(hit.rec.cubin_size ? hit.rec.cubin_size
                                                                           : 1)))
                    memcpy(k->cubin, hit.rec.cubin, hit.rec.cubin_size);
                k->cubin_size = hit.rec.cubin_size;
                kiln_cache_hit_release(&hit);
                if (!o->no_cubins && !k->cubin)
                    st = kiln_fail(KILN_ERR_NOMEM, "build: out of memory for the cubin of %s",
                                   d->entry);
                continue;
            }
            /* Same key, other kernel: only a hash collision does this; the
             * record is not this kernel's, so compile it. */
            kiln_cache_hit_release(&hit);
        } else if (st != KILN_ERR_NOT_FOUND) {
            break;
        }
        st = KILN_OK;
        if (o->offline) {
            st = kiln_cache_offline_miss(c, k->signature, k->key);
            if (st == KILN_ERR_OFFLINE_MISS && o->misses_ok) {
                kiln_clear_error();
                st = KILN_OK;
                continue;
            }
            break;
        }
        job_of[n_jobs] = i;
        jobs[n_jobs++] = (kiln_compile_job){ .name = k->signature, .entry = d->entry,
                                             .source = srcs[i].text, .target = &p->target };
    }
    if (st == KILN_OK && n_jobs) {
        if ((st = kiln_nvrtc_open(&nv))) {
            kiln_fail_prefix(st, "%d kernel%s to compile, the first \"%s\"", n_jobs,
                             n_jobs > 1 ? "s" : "", jobs[0].name);
            goto done;
        }
        snprintf(b.compiler, sizeof b.compiler, "%s", kiln_nvrtc_version(nv));
        kiln_env env;
        kiln_env_read(&env);
        if (o->timeout_s <= 0 && env.compile_timeout_s < 0) {
            st = kiln_fail(KILN_ERR_INVALID_ARG,
                           "KILN_COMPILE_TIMEOUT=%s: not a positive number of seconds",
                           env.compile_timeout);
            goto done;
        }
        build_store bs = { .p = p, .c = c, .b = &b, .job_of = job_of, .smem = smem };
        kiln_nvrtc_pool co = { .threads = o->jobs,
                               .keep_dir = kiln_emit_keep_dir(o->keep_source),
                               .quiet = o->quiet,
                               .timeout_s = o->timeout_s > 0           ? o->timeout_s
                                            : env.compile_timeout_s > 0 ? env.compile_timeout_s
                                                                        : KILN_COMPILE_TIMEOUT_S,
                               .on_done = store_compiled, .ctx = &bs, .stop = o->stop };
        double c0 = kiln_now();
        kiln_status cst = kiln_nvrtc_compile_all(nv, jobs, n_jobs, &co);
        b.compile_seconds = kiln_now() - c0;
        if (cst != KILN_OK && !jobs_failed(jobs, n_jobs)) {
            st = cst; /* the pool failed before it compiled anything */
            goto done;
        }
        /* A store may have failed, and a store since a failed compile may
         * have replaced its message: the first failed compile is the error,
         * else the first failed store. */
        st = cst != KILN_OK ? kiln_compile_jobs_status(jobs, n_jobs) : bs.st;
        if (cst == KILN_OK && bs.st != KILN_OK)
            kiln_fail(bs.st, "%s", bs.message);
        if (o->stop && *o->stop && b.compiled < n_jobs)
            st = kiln_fail(KILN_ERR_STATE,
                           "interrupted: %d of %d kernels to compile were compiled%s, %d were "
                           "not; the next compile starts from there",
                           b.compiled, n_jobs,
                           kiln_cache_writable_layer(c) >= 0 && bs.st == KILN_OK ? " and stored"
                                                                                : "",
                           n_jobs - b.compiled);
    }
done:
    for (int j = 0; jobs && j < n_jobs; j++)
        kiln_compile_job_reset(&jobs[j]);
    for (int i = 0; srcs && i < b.n; i++)
        kiln_kernel_source_free(&srcs[i]);
    free(srcs);
    free(jobs);
    free(job_of);
    free(smem);
    kiln_nvrtc_close(nv);
    b.seconds = kiln_now() - t0;
    if (st != KILN_OK) {
        kiln_build_free(&b);
        return st;
    }
    *out = b;
    return KILN_OK;
}

/* Build p's kernels in c (open) as o says. */
static kiln_status compile_in(const kiln_plan *p, const kiln_compile_options *o, kiln_cache *c,
                              kiln_compile_result *out)
{
    kiln_env env;
    kiln_env_read(&env);
    kiln_build_options bo = { .jobs = o->jobs, .offline = o->cache.offline || env.offline,
                              .keep_source = o->keep_source, .quiet = o->quiet, .no_cubins = 1,
                              .timeout_s = o->compile_timeout_s, .stop = o->stop };
    kiln_build b;
    kiln_status st = kiln_build_plan(p, c, &bo, &b);
    if (st == KILN_OK) {
        *out = (kiln_compile_result){ .signatures = b.n, .cached = b.cached,
                                      .compiled = b.compiled, .seconds = b.seconds,
                                      .writable = kiln_cache_writable_layer(c) >= 0 };
        kiln_build_free(&b);
    }
    return st;
}

kiln_status kiln_compile_plan(const kiln_plan *p, const kiln_compile_options *opts,
                              kiln_compile_result *out)
{
    if (!p || !out)
        return kiln_fail(KILN_ERR_INVALID_ARG, "compile: plan and out are required");
    const kiln_compile_options defaults = { 0 };
    const kiln_compile_options *o = opts ? opts : &defaults;
    kiln_cache *c = NULL;
    kiln_status st = kiln_cache_open(&o->cache, &c);
    if (st == KILN_OK)
        st = compile_in(p, o, c, out);
    kiln_cache_close(c);
    return st;
}

kiln_status kiln_plan_create_cached(kiln_graph *g, const kiln_target *t,
                                    const kiln_plan_options *opts, kiln_cache *c, kiln_plan **out)
{
    kiln_plan_options o = opts ? *opts : (kiln_plan_options){ 0 };
    kiln_tuning *tuning = NULL;
    kiln_status st = KILN_OK;
    if (!o.tuning && c && !(st = kiln_tuning_create(&tuning)) &&
        !(st = kiln_cache_tuning(c, tuning)))
        o.tuning = tuning;
    if (!st)
        st = kiln_plan_create(g, t, &o, out);
    kiln_tuning_destroy(tuning);
    return st;
}

kiln_status kiln_compile(kiln_graph *g, const kiln_target *t, const kiln_compile_options *opts,
                         kiln_compile_result *out)
{
    if (!g || !t || !out)
        return kiln_fail(KILN_ERR_INVALID_ARG, "compile: graph, target and out are required");
    const kiln_compile_options defaults = { 0 };
    const kiln_compile_options *o = opts ? opts : &defaults;
    kiln_cache *c = NULL;
    kiln_plan *p = NULL;
    kiln_status st = kiln_cache_open(&o->cache, &c);
    if (st == KILN_OK && (st = kiln_plan_create_cached(g, t, &o->plan, c, &p)) == KILN_OK)
        st = compile_in(p, o, c, out);
    kiln_plan_destroy(p);
    kiln_cache_close(c);
    return st;
}

/* The manifest of an export: the caller's object, then what kiln knows of
 * the plans, whose fields win: kiln's version, the cache schema, the
 * targets, the token buckets (the capture sizes and the largest count as
 * planned), the keys. */
static kiln_status manifest_text(const kiln_plan *const *plans, int n_plans,
                                 const uint8_t (*keys)[KILN_CACHE_KEY_BYTES], size_t n_keys,
                                 const char *caller, const char *path, char **out)
{
    json_error_t err;
    json_t *m = caller ? json_loads(caller, JSON_REJECT_DUPLICATES, &err) : json_object();
    if (!json_is_object(m)) {
        json_decref(m);
        return kiln_fail(KILN_ERR_INVALID_ARG,
                         "export to %s: the manifest is not a JSON object%s%s", path,
                         caller ? ": " : "", caller ? err.text : "");
    }
    json_t *targets = json_array(), *buckets = json_array(), *hex = json_array();
    for (int i = 0; i < n_plans; i++)
        json_array_append_new(targets, json_string(plans[i]->target.name));
    for (int b = 0; b < kiln_plan_n_buckets(plans[0]); b++)
        json_array_append_new(buckets, json_integer(kiln_plan_bucket(plans[0], b)));
    for (size_t i = 0; i < n_keys; i++) {
        char h[KILN_CACHE_KEY_HEX];
        kiln_cache_key_hex(keys[i], h);
        json_array_append_new(hex, json_string(h));
    }
    json_object_set_new(m, "kiln", json_string(kiln_version()));
    json_object_set_new(m, "schema", json_string(KILN_CACHE_SCHEMA));
    json_object_set_new(m, "created", json_integer((json_int_t)time(NULL)));
    json_object_set_new(m, "targets", targets);
    json_object_set_new(m, "buckets", buckets);
    json_object_set_new(m, "kernels", json_integer((json_int_t)n_keys));
    json_object_set_new(m, "keys", hex);
    *out = json_dumps(m, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(m);
    return *out ? KILN_OK
                : kiln_fail(KILN_ERR_NOMEM, "export to %s: out of memory for the manifest", path);
}

/* The plans' keys come from building them offline: every kernel is keyed
 * and found, nothing is compiled and no cubin is kept. */
kiln_status kiln_cache_export_plans(kiln_cache *c, const kiln_plan *const *plans, int n_plans,
                                    const char *path, const kiln_cache_export_options *o)
{
    if (!c || !plans || n_plans < 1 || !path)
        return kiln_fail(KILN_ERR_INVALID_ARG, "export: the cache, the plans and the path are "
                         "required");
    const kiln_cache_export_options defaults = { 0 };
    if (!o)
        o = &defaults;
    kiln_build_options bo = { .offline = 1, .no_cubins = 1, .quiet = 1 };
    uint8_t(*keys)[KILN_CACHE_KEY_BYTES] = NULL;
    size_t n_keys = 0;
    char *manifest = NULL;
    kiln_status st = KILN_OK;
    for (int i = 0; i < n_plans && st == KILN_OK; i++) {
        kiln_build b;
        if (!plans[i]) {
            st = kiln_fail(KILN_ERR_INVALID_ARG, "export to %s: plan %d is NULL", path, i);
            break;
        }
        if ((st = kiln_build_plan(plans[i], c, &bo, &b)) != KILN_OK)
            break;
        void *more = kiln_realloc(keys, (n_keys + (size_t)b.n + 1) * sizeof *keys);
        if (!more) {
            st = kiln_fail(KILN_ERR_NOMEM, "export to %s: out of memory for %zu keys", path,
                           n_keys + (size_t)b.n);
        } else {
            keys = more;
            for (int k = 0; k < b.n; k++)
                memcpy(keys[n_keys++], b.kernels[k].key, KILN_CACHE_KEY_BYTES);
        }
        kiln_build_free(&b);
    }
    if (st == KILN_OK)
        st = manifest_text(plans, n_plans, (const uint8_t(*)[KILN_CACHE_KEY_BYTES])keys, n_keys,
                           o->manifest, path, &manifest);
    /* the tuning entries the plans used, so that the deployment plans as
     * the build box did */
    kiln_tuning *tuned = NULL;
    if (st == KILN_OK && !(st = kiln_tuning_create(&tuned)))
        for (int i = 0; i < n_plans && st == KILN_OK; i++)
            st = kiln_tuning_merge(tuned, kiln_plan_tuning(plans[i]), 0);
    if (st == KILN_OK)
        st = kiln_cache_export_keys(c, (const uint8_t(*)[KILN_CACHE_KEY_BYTES])keys, n_keys, path,
                                    o->overwrite, manifest, tuned);
    kiln_tuning_destroy(tuned);
    free(manifest);
    free(keys);
    return st;
}

kiln_status kiln_cache_export(kiln_cache *c, const kiln_plan *p, const char *path, int overwrite)
{
    return kiln_cache_export_plans(c, &p, 1, path,
                                   &(kiln_cache_export_options){ .overwrite = overwrite });
}

kiln_status kiln_cache_check_plan(kiln_cache *c, const kiln_plan *p,
                                  kiln_cache_missing_fn on_missing, void *ctx, int *n_missing)
{
    if (!c || !p)
        return kiln_fail(KILN_ERR_INVALID_ARG, "cache check: the cache and the plan are required");
    kiln_build_options bo = { .offline = 1, .misses_ok = 1, .no_cubins = 1, .quiet = 1 };
    kiln_build b;
    kiln_status st = kiln_build_plan(p, c, &bo, &b);
    if (st != KILN_OK)
        return st;
    int missing = 0;
    for (int i = 0; i < b.n; i++) {
        if (b.kernels[i].cached)
            continue;
        missing++;
        if (on_missing) {
            char hex[KILN_CACHE_KEY_HEX];
            kiln_cache_key_hex(b.kernels[i].key, hex);
            on_missing(ctx, b.kernels[i].signature, hex);
        }
    }
    kiln_build_free(&b);
    if (n_missing)
        *n_missing = missing;
    return KILN_OK;
}
