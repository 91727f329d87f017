/* kiln tune: the tile configuration of each linear kernel and token bucket
 * chosen by timing every variant its backend offers on this machine's GPU,
 * stored in the kernel cache's tuning table. */
#include "cli.h"

#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static void help(FILE *out)
{
    fprintf(out,
            "usage: kiln tune MODEL|demo [--cache PATH] [--reps N] [--device cuda:N]\n"
            "                 [--json] [planning options]\n"
            "\n"
            "Times, on this machine's GPU, every variant (tile configuration) the chosen\n"
            "backend offers for each linear kernel of the plan at each token bucket, and\n"
            "stores the fastest in the kernel cache's tuning table, beside the kernels.\n"
            "kiln compile, kiln run, kiln plan --cache and kiln cache export then plan\n"
            "with it, and a cache exported from it carries the entries its plan uses, so\n"
            "a deployment plans the same kernels. Kernels whose backend offers one\n"
            "variant (the decode kernels' M classes) are not timed alone.\n"
            "\n"
            "Each round builds a session in which every tuned kernel runs its next\n"
            "variant (compiling what the cache lacks), runs each bucket on the same\n"
            "inputs, checks its outputs against the heuristic's round, and times every\n"
            "kernel alone (kiln run --profile's timing, the median of --reps\n"
            "repetitions). A variant whose outputs differ by more than 2 %% of the\n"
            "largest output in some bucket is left out there, with a warning. A kernel\n"
            "shared by several layers is timed as their mean.\n"
            "\n"
            "Then the whole step of each bucket whose kernels may overlap (the decode\n"
            "buckets on sm_90), with the variants chosen: its graph replayed with the\n"
            "kernels overlapping where they allow (each may start while the one before\n"
            "it drains), then with every kernel starting after the one before it ends;\n"
            "the median of --reps runs of 10 replays each. Serial is\n"
            "stored for a bucket where it is faster by more than 0.5 %%, or where the\n"
            "outputs differ between the two (a warning). Not with KILN_SERIAL=1.\n"
            "\n"
            "Prints, per kernel and bucket, the heuristic's variant and time, the\n"
            "fastest and its time; per bucket both step times and the launch policy;\n"
            "--json the same as JSON (\"kernels\", \"steps\").\n"
            "\n"
            "  --cache PATH      the writable kernel cache the table is stored in\n"
            "                    [$KILN_CACHE or the default]\n"
            "  --reps N          timed repetitions of each kernel and step [20]\n"
            "  --device cuda:N   the GPU [cuda:0]\n"
            "  --json            print the results as JSON on stdout\n"
            CLI_PLAN_HELP
            "\n"
            "Needs a GPU, which the plan is for (--target is refused). Exit status: 0 when\n"
            "the table is stored, 1 when something failed (nothing is stored then), 2\n"
            "for bad arguments.\n");
}

enum { MAX_CANDIDATES = 16 };

/* A kernel and bucket to tune: its key, and the time and check of each
 * candidate. */
typedef struct site {
    char key[KILN_SIGNATURE_MAX];
    int64_t m;
    const char *names[MAX_CANDIDATES];
    int n;
    int heuristic;               /* index of the heuristic's variant */
    double us[MAX_CANDIDATES];   /* sum over the kernel's steps */
    int count[MAX_CANDIDATES];   /* steps summed */
    int failed[MAX_CANDIDATES];  /* outputs outside the check */
} site;

typedef struct tuner {
    site *sites;
    int n, cap, rounds;
    kiln_graph *g;
    kiln_session_options so;
    int reps;
    float **ref;  /* the heuristic round's outputs, per bucket and output */
} tuner;

static site *find_site(tuner *t, const char *key, int64_t m)
{
    for (int i = 0; i < t->n; i++)
        if (t->sites[i].m == m && !strcmp(t->sites[i].key, key))
            return &t->sites[i];
    return NULL;
}

/* Every (kernel, bucket) of p with more than one candidate. */
static kiln_status collect(tuner *t, const kiln_plan *p)
{
    for (int b = 0; b < kiln_plan_n_buckets(p); b++)
        for (int i = 0; i < kiln_plan_n_linears(p); i++) {
            site s = { .m = kiln_plan_bucket(p, b) };
            s.n = kiln_plan_candidates(p, i, b, s.names, MAX_CANDIDATES, s.key, sizeof s.key);
            if (s.n < 2 || find_site(t, s.key, s.m))
                continue;
            kiln_plan_linear l;
            kiln_status st = kiln_plan_linear_at(p, i, b, &l);
            if (st)
                return st;
            s.heuristic = -1;
            for (int c = 0; c < s.n; c++)
                if (!strcmp(s.names[c], l.variant))
                    s.heuristic = c;
            if (s.heuristic < 0)
                return cli_error(KILN_ERR_STATE, "the plan's variant %s of %s is none of its "
                                 "backend's candidates", l.variant, s.key);
            if (t->n == t->cap) {
                int cap = t->cap ? 2 * t->cap : 16;
                site *more = realloc(t->sites, (size_t)cap * sizeof *more);
                if (!more)
                    return cli_error(KILN_ERR_NOMEM, "the kernels to tune");
                t->sites = more;
                t->cap = cap;
            }
            t->sites[t->n++] = s;
            if (s.n > t->rounds)
                t->rounds = s.n;
        }
    return KILN_OK;
}

/* The key of a step's kernel: its signature with variant=*. */
static void key_of(const char *sig, char *key, size_t size)
{
    const char *v = strstr(sig, " variant=");
    const char *end = v ? strchr(v + 1, ' ') : NULL;
    if (!v || !end)
        snprintf(key, size, "%s", sig);
    else
        snprintf(key, size, "%.*s variant=*%s", (int)(v - sig), sig, end);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Bucket m of sess run on cli_fill_input's inputs (in[], allocated here)
 * into out[] (allocated here); the caller frees both, whatever it returns. */
static kiln_status run_bucket(kiln_graph *g, kiln_session *sess, int64_t m, float **in,
                              float **out)
{
    kiln_status st = KILN_OK;
    for (int i = 0; i < kiln_graph_n_inputs(g) && !st; i++) {
        int64_t w = kiln_tensor_ne(kiln_graph_input_at(g, i), 0);
        if (!(in[i] = malloc((size_t)(m * w) * sizeof(float))))
            st = cli_error(KILN_ERR_NOMEM, "inputs of %lld tokens", (long long)m);
        else
            cli_fill_input(i, m, w, in[i]);
    }
    for (int o = 0; o < kiln_graph_n_outputs(g) && !st; o++)
        if (!(out[o] = malloc((size_t)(m * kiln_tensor_ne(kiln_graph_output_at(g, o), 0)) *
                              sizeof(float))))
            st = cli_error(KILN_ERR_NOMEM, "outputs of %lld tokens", (long long)m);
    return st ? st : kiln_session_run(sess, m, (const float *const *)in, out);
}

/* Round r: candidate r of every site (-1: the heuristic everywhere), each
 * bucket run, checked and timed. */
static kiln_status round_run(tuner *t, int r, const kiln_plan *p)
{
    kiln_tuning *force;
    kiln_status st = kiln_tuning_create(&force);
    for (int i = 0; i < t->n && !st; i++) {
        site *s = &t->sites[i];
        if (r < 0 || r >= s->n)
            continue;
        kiln_tuning_entry e = { .signature = s->key, .bucket = s->m, .variant = s->names[r],
                                .heuristic = s->names[s->heuristic] };
        st = kiln_tuning_set(force, &e);
    }
    kiln_session *sess = NULL;
    kiln_session_options so = t->so;
    so.plan.tuning = force; /* an empty table in the heuristic's round: not the cache's */
    if (!st)
        st = kiln_session_create(t->g, &so, &sess);
    kiln_tuning_destroy(force);
    const int n_in = kiln_graph_n_inputs(t->g), n_out = kiln_graph_n_outputs(t->g);
    for (int b = 0; b < kiln_plan_n_buckets(p) && !st; b++) {
        const int64_t m = kiln_plan_bucket(p, b);
        int here = 0;
        for (int i = 0; i < t->n; i++)
            here |= t->sites[i].m == m && (r < 0 || r < t->sites[i].n);
        if (!here)
            continue;
        /* the same inputs every round; the outputs against the heuristic's */
        float *in[64] = { 0 }, *out[64] = { 0 };
        if (n_in > 64 || n_out > 64) {
            st = cli_error(KILN_ERR_UNSUPPORTED, "more than 64 inputs or outputs");
            break;
        }
        st = run_bucket(t->g, sess, m, in, out);
        double err = 0;
        for (int o = 0; o < n_out && !st; o++) {
            size_t n = (size_t)(m * kiln_tensor_ne(kiln_graph_output_at(t->g, o), 0));
            float **ref = &t->ref[(size_t)b * (size_t)n_out + (size_t)o];
            if (r < 0) {
                *ref = out[o];
                out[o] = NULL;
                continue;
            }
            double scale = 0, worst = 0;
            for (size_t i = 0; i < n; i++)
                scale = fmax(scale, fabs((*ref)[i]));
            for (size_t i = 0; i < n; i++)
                worst = fmax(worst, fabs((double)out[o][i] - (*ref)[i]));
            if (!(worst <= 0.02 * (scale > 0 ? scale : 1)))
                err = fmax(err, scale > 0 ? worst / scale : INFINITY);
        }
        for (int i = 0; i < 64; i++) {
            free(in[i]);
            free(out[i]);
        }
        if (err > 0)
            for (int i = 0; i < t->n; i++) {
                site *s = &t->sites[i];
                if (s->m == m && r < s->n && !s->failed[r]) {
                    s->failed[r] = 1;
                    fprintf(stderr, "kiln tune: warning: variant %s at %lld tokens: outputs "
                            "%.3g of the largest away from the heuristic's; left out (%s)\n",
                            s->names[r], (long long)m, err, s->key);
                }
            }
        /* each kernel alone, the median of the repetitions */
        int cap = 4096, n = 0;
        kiln_step_time *steps = malloc((size_t)cap * sizeof *steps);
        double *times = NULL;
        if (!steps)
            st = cli_error(KILN_ERR_NOMEM, "the profile");
        for (int rep = 0; rep < t->reps && !st; rep++) {
            if ((st = kiln_session_profile(sess, m, 1, steps, cap, &n)))
                break;
            if (!times && !(times = calloc((size_t)n * (size_t)t->reps + 1, sizeof *times))) {
                st = cli_error(KILN_ERR_NOMEM, "the profile");
                break;
            }
            for (int k = 0; k < n; k++)
                times[(size_t)k * (size_t)t->reps + (size_t)rep] = steps[k].us;
        }
        for (int k = 0; k < n && !st; k++) {
            char key[KILN_SIGNATURE_MAX];
            key_of(steps[k].kernel, key, sizeof key);
            site *s = find_site(t, key, m);
            int c = !s ? -1 : r < 0 ? s->heuristic : r < s->n ? r : -1;
            if (c < 0 || (r >= 0 && c == s->heuristic))
                continue; /* the heuristic's variant counts in its own round */
            double *x = &times[(size_t)k * (size_t)t->reps];
            qsort(x, (size_t)t->reps, sizeof *x, cmp_double);
            s->us[c] += x[t->reps / 2];
            s->count[c]++;
        }
        free(times);
        free(steps);
    }
    kiln_session_destroy(sess);
    return st;
}

/* The launch policy of each bucket's whole step. */
typedef struct step_site {
    int64_t m;
    char key[KILN_SIGNATURE_MAX];
    double us[2]; /* overlap, serial: the median replay */
    int differ;   /* serial outputs differ from the overlapped ones */
    int serial;   /* the policy chosen */
    int timed;    /* 0: no launch of the step may overlap, nothing to choose */
} step_site;

enum { STEP_REPLAYS = 10 };

/* Arm 0 (overlap) or 1 (serial) of the step rounds: a session with the
 * chosen variants (found) and, in arm 1, every bucket's step serial; each
 * bucket run on the same inputs (arm 1's outputs compared with arm 0's,
 * bit for bit: only launch timing differs), then its graph replayed
 * STEP_REPLAYS times back to back, --reps times, the median kept. */
static kiln_status step_arm(tuner *t, int arm, const kiln_tuning *found, step_site *sites, int nb,
                            float ***outs)
{
    kiln_tuning *table;
    kiln_status st = kiln_tuning_create(&table);
    for (int i = 0; i < kiln_tuning_n(found) && !st; i++) {
        kiln_tuning_entry e;
        if (!(st = kiln_tuning_at(found, i, &e)))
            st = kiln_tuning_set(table, &e);
    }
    for (int b = 0; b < nb && arm && !st; b++) {
        if (!sites[b].timed)
            continue;
        kiln_tuning_entry e = { .signature = sites[b].key, .bucket = sites[b].m,
                                .variant = "serial", .heuristic = "overlap" };
        st = kiln_tuning_set(table, &e);
    }
    kiln_session *sess = NULL;
    kiln_session_options so = t->so;
    so.plan.tuning = table;
    if (!st)
        st = kiln_session_create(t->g, &so, &sess);
    kiln_tuning_destroy(table);
    const kiln_plan *p = sess ? kiln_session_plan(sess) : NULL;
    const int n_in = kiln_graph_n_inputs(t->g), n_out = kiln_graph_n_outputs(t->g);
    if (!st && (n_in > 64 || n_out > 64))
        st = cli_error(KILN_ERR_UNSUPPORTED, "more than 64 inputs or outputs");
    double *x = st ? NULL : malloc((size_t)t->reps * sizeof *x);
    if (!st && !x)
        st = cli_error(KILN_ERR_NOMEM, "the step timings");
    for (int b = 0; b < nb && !st; b++) {
        step_site *s = &sites[b];
        const int64_t m = s->m;
        if (arm == 0) {
            if ((st = kiln_plan_step_key(p, b, s->key, sizeof s->key)))
                break;
            s->timed = kiln_plan_step_overlaps(p, b) > 0;
        }
        if (!s->timed)
            continue;
        if (arm == 1 && kiln_plan_step_policy(p, b) != 1) {
            st = cli_error(KILN_ERR_STATE, "the serial round's plan did not take the launch "
                           "policy of bucket %lld (%s)", (long long)m, s->key);
            break;
        }
        float *in[64] = { 0 }, *out[64] = { 0 };
        st = run_bucket(t->g, sess, m, in, out);
        for (int o = 0; o < n_out && !st; o++) {
            float **ref = &outs[b][o];
            size_t n = (size_t)(m * kiln_tensor_ne(kiln_graph_output_at(t->g, o), 0));
            if (arm == 0) {
                *ref = out[o];
                out[o] = NULL;
            } else if (memcmp(*ref, out[o], n * sizeof(float))) {
                s->differ = 1;
            }
        }
        for (int i = 0; i < 64; i++) {
            free(in[i]);
            free(out[i]);
        }
        for (int r = 0; r < t->reps && !st; r++) {
            float us = 0;
            st = kiln_session_bench(sess, m, STEP_REPLAYS, &us);
            x[r] = us;
        }
        if (!st) {
            qsort(x, (size_t)t->reps, sizeof *x, cmp_double);
            s->us[arm] = x[t->reps / 2];
        }
    }
    free(x);
    kiln_session_destroy(sess);
    return st;
}

/* The step rounds: the launch policy of each bucket whose step has a
 * launch that may overlap into found, serial where its replay is faster by
 * more than 0.5 % or where the overlapped outputs differ from the serial
 * ones (warned: a kernel's overlap is then unsafe). *timed counts those
 * buckets, *serial the serial ones. */
static kiln_status step_rounds(tuner *t, const kiln_plan *p, kiln_tuning *found, step_site *sites,
                               int *timed, int *serial)
{
    const int nb = kiln_plan_n_buckets(p), n_out = kiln_graph_n_outputs(t->g);
    float ***outs = calloc((size_t)nb, sizeof *outs);
    kiln_status st = outs ? KILN_OK : cli_error(KILN_ERR_NOMEM, "the step outputs");
    for (int b = 0; b < nb && !st; b++) {
        sites[b] = (step_site){ .m = kiln_plan_bucket(p, b) };
        if (!(outs[b] = calloc((size_t)n_out + 1, sizeof **outs)))
            st = cli_error(KILN_ERR_NOMEM, "the step outputs");
    }
    for (int arm = 0; arm < 2 && !st; arm++) {
        fprintf(stderr, "tune: the whole step of each bucket, %s\n",
                arm ? "every kernel after the one before it ends" : "kernels overlapping");
        st = step_arm(t, arm, found, sites, nb, outs);
    }
    *timed = *serial = 0;
    for (int b = 0; b < nb && !st; b++) {
        step_site *s = &sites[b];
        if (!s->timed)
            continue;
        const int pick = s->differ || s->us[1] < 0.995 * s->us[0];
        if (s->differ)
            fprintf(stderr, "kiln tune: warning: at %lld tokens the outputs of overlapped "
                    "launches differ from serial ones; serial chosen (%s)\n", (long long)s->m,
                    s->key);
        kiln_tuning_entry e = { .signature = s->key, .bucket = s->m,
                                .variant = pick ? "serial" : "overlap", .us = s->us[pick],
                                .heuristic = "overlap", .heuristic_us = s->us[0] };
        s->serial = pick;
        *serial += pick;
        ++*timed;
        st = kiln_tuning_set(found, &e);
    }
    for (int b = 0; outs && b < nb; b++) {
        for (int o = 0; outs[b] && o < n_out; o++)
            free(outs[b][o]);
        free(outs[b]);
    }
    free(outs);
    return st;
}

/* The short name of a key: backend, format, N x K, epilogue, act. */
static const char *short_name(const char *key, char *buf, size_t size)
{
    char backend[32] = "", format[32] = "", epi[48] = "", act[32] = "";
    long long n = 0, k = 0;
    const char *p;
    if ((p = strstr(key, "backend=")))
        sscanf(p, "backend=%31s", backend);
    if ((p = strstr(key, "format=")))
        sscanf(p, "format=%31s", format);
    if ((p = strstr(key, " n=")))
        sscanf(p, " n=%lld", &n);
    if ((p = strstr(key, " k=")))
        sscanf(p, " k=%lld", &k);
    if ((p = strstr(key, "epilogue=")))
        sscanf(p, "epilogue=%47s", epi);
    if ((p = strstr(key, " act=")))
        sscanf(p, " act=%31s", act);
    snprintf(buf, size, "%s %s %lldx%lld %s %s", backend, format, n, k, act, epi);
    return buf;
}

json_t *cli_tuning_json(const kiln_tuning *t, const char *prefix)
{
    json_t *rows = json_array();
    for (int i = 0; i < kiln_tuning_n(t); i++) {
        kiln_tuning_entry e;
        kiln_tuning_at(t, i, &e);
        if (prefix && strncmp(e.signature, prefix, strlen(prefix)))
            continue;
        json_array_append_new(rows, json_pack("{s:s, s:I, s:s, s:f, s:s, s:f}", "signature",
                                              e.signature, "tokens", (json_int_t)e.bucket,
                                              "variant", e.variant, "us", e.us, "heuristic",
                                              e.heuristic, "heuristic_us", e.heuristic_us));
    }
    return rows;
}

static int run(int argc, char **argv)
{
    static const struct option opts[] = {
        CLI_PLAN_LONG_OPTIONS,
        { "cache", required_argument, NULL, 'c' },
        { "reps", required_argument, NULL, 'r' },
        { "device", required_argument, NULL, 'd' },
        { "json", no_argument, NULL, 'J' },
        { 0 },
    };
    cli_plan_args a;
    tuner t = { .reps = 20, .so = { .quiet = 0 } };
    int json = 0, c, rc;
    long long v;
    cli_plan_args_init(&a);
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
        if (cli_plan_option(&cli_cmd_tune, c, optarg, &a, &rc)) {
            if (rc != CLI_OK)
                return rc;
            continue;
        }
        switch (c) {
        case 'c': t.so.cache.path = optarg; break;
        case 'J': json = 1; break;
        case 'r':
            if (cli_parse_int(optarg, 1, 10000, &v))
                return cli_usage(&cli_cmd_tune, "bad --reps '%s' (1 to 10000)", optarg);
            t.reps = (int)v;
            break;
        case 'd':
            if (strncmp(optarg, "cuda:", 5) || cli_parse_int(optarg + 5, 0, INT_MAX, &v))
                return cli_usage(&cli_cmd_tune, "bad --device '%s' (want cuda:N)", optarg);
            t.so.device = (int)v;
            break;
        case ':': return cli_usage(&cli_cmd_tune, "%s needs a value", argv[optind - 1]);
        default: return cli_usage(&cli_cmd_tune, "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind >= argc)
        return cli_usage(&cli_cmd_tune, "what to tune? give a MODEL file or directory, or demo");
    if (optind + 1 < argc)
        return cli_usage(&cli_cmd_tune, "unexpected argument '%s'", argv[optind + 1]);
    if (a.n_targets)
        return cli_usage(&cli_cmd_tune, "--target: kiln tune measures the GPU it runs on, "
                         "and plans for it");
    kiln_target target;
    kiln_status st = kiln_target_live(t.so.device, &target);
    if (st != KILN_OK) {
        char what[64];
        snprintf(what, sizeof what, "tune: device %d", t.so.device);
        return cli_fail(st, what);
    }
    kiln_target live = target;
    if ((rc = cli_plan_finish(&cli_cmd_tune, &a, &target)) != CLI_OK)
        return rc;
    target = live;
    t.so.target = &target;

    /* the heuristic's plan: what to tune */
    kiln_tuning *none = NULL;
    cli_source src;
    kiln_plan *p = NULL;
    if ((st = kiln_tuning_create(&none)))
        return cli_fail(st, "tune");
    a.po.tuning = none;
    if ((st = cli_plan_open(argv[optind], &a, &target, &src, &p)) != KILN_OK) {
        kiln_tuning_destroy(none);
        return cli_fail(st, "tune");
    }
    t.g = src.g;
    t.so.plan = a.po;
    st = collect(&t, p);
    const size_t n_ref = (size_t)kiln_plan_n_buckets(p) * (size_t)kiln_graph_n_outputs(t.g);
    if (!st && !(t.ref = calloc(n_ref + 1, sizeof *t.ref)))
        st = cli_error(KILN_ERR_NOMEM, "the reference outputs");
    double t0 = cli_now();
    for (int r = -1; r < t.rounds && t.n && !st; r++) {
        if (!json)
            fprintf(stderr, "tune: round %d of %d (%s)\n", r + 2, t.rounds + 1,
                    r < 0 ? "the heuristic's variants" : "the next variant of each kernel");
        st = round_run(&t, r, p);
    }
    /* the fastest that passed its check, per kernel and bucket */
    kiln_tuning *found = NULL;
    if (!st)
        st = kiln_tuning_create(&found);
    int changed = 0;
    for (int i = 0; i < t.n && !st; i++) {
        site *s = &t.sites[i];
        /* a tie keeps the heuristic's */
        int best = s->count[s->heuristic] && !s->failed[s->heuristic] ? s->heuristic : -1;
        for (int k = 0; k < s->n; k++)
            if (s->count[k] && !s->failed[k] &&
                (best < 0 || s->us[k] / s->count[k] < s->us[best] / s->count[best]))
                best = k;
        if (best < 0 || !s->count[s->heuristic]) {
            st = cli_error(KILN_ERR_STATE, "no timing of %s at %lld tokens (the profile named "
                           "no kernel of it)", s->key, (long long)s->m);
            break;
        }
        kiln_tuning_entry e = { .signature = s->key, .bucket = s->m, .variant = s->names[best],
                                .us = s->us[best] / s->count[best],
                                .heuristic = s->names[s->heuristic],
                                .heuristic_us = s->us[s->heuristic] / s->count[s->heuristic] };
        changed += best != s->heuristic;
        st = kiln_tuning_set(found, &e);
    }
    /* then each bucket's whole step, with the variants chosen */
    const int nb = kiln_plan_n_buckets(p);
    step_site *steps = calloc((size_t)nb, sizeof *steps);
    const char *no_overlap = getenv("KILN_SERIAL");
    int timed = 0, serial = 0, stepped = !st && !(no_overlap && !strcmp(no_overlap, "1"));
    if (!st && !steps)
        st = cli_error(KILN_ERR_NOMEM, "the step rounds");
    if (!st && !stepped)
        fprintf(stderr, "tune: KILN_SERIAL is set, so no launch overlaps: the launch policy "
                "of the steps is not timed\n");
    if (!st && stepped)
        st = step_rounds(&t, p, found, steps, &timed, &serial);
    kiln_cache *cache = NULL;
    if (!st && kiln_tuning_n(found) && !(st = kiln_cache_open(&t.so.cache, &cache)))
        st = kiln_cache_store_tuning(cache, found);
    const char *stored = cache && kiln_cache_writable_layer(cache) >= 0
                             ? kiln_cache_layer_path(cache, kiln_cache_writable_layer(cache))
                             : "";
    if (!st && json) {
        json_t *root = json_pack("{s:s, s:s, s:s}", "model", src.name, "target", target.name,
                                 "cache", stored);
        json_object_set_new(root, "kernels", cli_tuning_json(found, "linear "));
        json_t *rows = json_array();
        for (int b = 0; b < nb && stepped; b++)
            if (steps[b].timed)
                json_array_append_new(rows, json_pack("{s:s, s:I, s:f, s:f, s:s, s:b}", "key",
                                                  steps[b].key, "tokens", (json_int_t)steps[b].m,
                                                  "overlap_us", steps[b].us[0], "serial_us",
                                                  steps[b].us[1], "launches",
                                                  steps[b].serial ? "serial" : "overlap",
                                                  "outputs_differ", steps[b].differ));
        json_object_set_new(root, "steps", rows);
        json_dumpf(root, stdout, JSON_INDENT(1));
        putchar('\n');
        json_decref(root);
    } else if (!st) {
        printf("tune: %s on %s: %d kernels x buckets in %d rounds%s, %.1f s\n", src.name,
               target.name, t.n, t.n ? t.rounds + 1 : 0,
               stepped ? ", then each bucket's step overlapped and serial" : "",
               cli_now() - t0);
        if (t.n) {
            printf("\n%-52s %7s  %-15s %9s  %-15s %9s  %s\n", "kernel", "tokens", "heuristic",
                   "us", "fastest", "us", "speedup");
            for (int i = 0; i < kiln_tuning_n(found); i++) {
                kiln_tuning_entry e;
                char name[160];
                kiln_tuning_at(found, i, &e);
                if (strncmp(e.signature, "linear ", 7))
                    continue;
                printf("%-52s %7lld  %-15s %9.2f  %-15s %9.2f  %.2fx\n",
                       short_name(e.signature, name, sizeof name), (long long)e.bucket,
                       e.heuristic, e.heuristic_us, e.variant, e.us,
                       e.us > 0 ? e.heuristic_us / e.us : 1.0);
            }
            printf("\n%d of %d choices differ from the heuristic's\n", changed, t.n);
        } else {
            printf("every kernel of the plan has one variant\n");
        }
        if (stepped) {
            printf("\n%-7s %-8s %12s %12s  %s\n", "tokens", "kernels", "overlap us", "serial us",
                   "launches");
            for (int b = 0; b < nb; b++) {
                if (!steps[b].timed)
                    continue;
                const char *k = strstr(steps[b].key, " steps=");
                printf("%-7lld %-8d %12.2f %12.2f  %s%s\n", (long long)steps[b].m,
                       k ? atoi(k + 7) : 0, steps[b].us[0], steps[b].us[1],
                       steps[b].serial ? "serial" : "overlap",
                       steps[b].differ ? " (outputs differ when overlapped)" : "");
            }
            printf("\n%d of %d buckets run serial (%d with no launch that may overlap left "
                   "out)\n", serial, timed, nb - timed);
        }
        if (kiln_tuning_n(found))
            printf("stored in %s\n", stored);
    }
    kiln_cache_close(cache);
    kiln_tuning_destroy(found);
    for (size_t i = 0; t.ref && i < n_ref; i++)
        free(t.ref[i]);
    free(t.ref);
    free(t.sites);
    free(steps);
    kiln_plan_destroy(p);
    cli_source_close(&src);
    kiln_tuning_destroy(none);
    if (st != KILN_OK)
        return cli_fail(st, "tune");
    return CLI_OK;
}

const cli_command cli_cmd_tune = {
    .name = "tune",
    .summary = "time every tile configuration of the plan's kernels on this GPU; store the fastest",
    .run = run,
    .help = help,
};
