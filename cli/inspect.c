#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void help(FILE *out)
{
    fprintf(out,
            "usage: kiln inspect FILE|DIR [--metadata] [--json] [--tensor NAME --dequant OUT]\n"
            "                    [--allow-nonfinite]\n"
            "\n"
            "Describes a model: a GGUF file, a .safetensors file, or a directory with\n"
            "model.safetensors (or a sharded set with model.safetensors.index.json) and\n"
            "config.json. Prints the container, the architecture and hyper-parameters, then\n"
            "a table of tensors (name, format or stored type, shape, size in binary units).\n"
            "\n"
            "  --metadata        also print every GGUF metadata key and its value\n"
            "  --json            print it all as JSON on stdout, sizes in bytes\n"
            "  --tensor NAME     the tensor to write with --dequant\n"
            "  --allow-nonfinite open a model whose scales, norm weights or rms_norm_eps\n"
            "                    hold NaN or infinity (never a static input_scale)\n"
            "  --dequant OUT     write NAME dequantized to OUT as little-endian f32,\n"
            "                    row-major [N, K], the raw bytes with no header\n");
}

static void shape_text(const kiln_model_tensor_info *t, char *buf, size_t size)
{
    size_t used = 0;
    buf[0] = '\0';
    /* outermost first, as PyTorch prints it: [N, K] */
    for (int d = t->n_dims - 1; d >= 0; d--)
        used += (size_t)snprintf(buf + used, used < size ? size - used : 0, "%s%lld",
                                 d == t->n_dims - 1 ? "[" : ", ", (long long)t->ne[d]);
    if (used < size)
        snprintf(buf + used, size - used, "%s", t->n_dims ? "]" : "[]");
}

static int dequant(kiln_model *m, const char *path, const char *name, const char *out)
{
    kiln_qtensor q;
    kiln_status st = kiln_model_weight(m, name, &q);
    if (st != KILN_OK)
        return cli_fail(st, "--tensor");
    size_t elems;
    if (__builtin_mul_overflow((size_t)q.n, (size_t)q.k, &elems) ||
        elems > SIZE_MAX / sizeof(float))
        return cli_fail(cli_error(KILN_ERR_SHAPE, "%s: tensor %s is too large", path, name),
                        "--dequant");
    float *buf = malloc(elems * sizeof *buf);
    if (!buf)
        return cli_fail(cli_error(KILN_ERR_NOMEM, "%s: tensor %s: %zu floats", path, name, elems),
                        "--dequant");
    st = kiln_dequantize(&q, buf);
    if (st != KILN_OK) {
        free(buf);
        return cli_fail(cli_error(st, "%s: tensor %s: %s", path, name, kiln_last_error()),
                        "--dequant");
    }
    /* Written beside the target under a new name (mkstemp: never a file or
     * link already there) and renamed, so a failure never leaves a
     * truncated file under the name asked for; only a regular file is
     * replaced. */
    struct stat sb;
    if (!lstat(out, &sb) && !S_ISREG(sb.st_mode)) {
        free(buf);
        return cli_fail(cli_error(KILN_ERR_IO, "%s: not a regular file; --dequant replaces only "
                                  "a regular file", out), "--dequant");
    }
    size_t len = strlen(out) + sizeof ".XXXXXX";
    char *tmp = malloc(len);
    if (!tmp) {
        free(buf);
        return cli_fail(cli_error(KILN_ERR_NOMEM, "%s", out), "--dequant");
    }
    snprintf(tmp, len, "%s.XXXXXX", out);
    int fd = mkstemp(tmp);
    if (fd >= 0)
        (void)fchmod(fd, 0644); /* mkstemp's 0600, as a plain new file would be read */
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (fd >= 0 && !f)
        close(fd);
    int ok = f && fwrite(buf, sizeof *buf, elems, f) == elems;
    ok = f && fclose(f) == 0 && ok;
    ok = ok && rename(tmp, out) == 0;
    int err = errno;
    free(buf);
    if (!ok) {
        if (fd >= 0)
            remove(tmp);
        free(tmp);
        return cli_fail(cli_error(KILN_ERR_IO, "%s: %s", out, strerror(err)), "--dequant");
    }
    free(tmp);
    fprintf(stderr, "kiln inspect: wrote %s [%lld, %lld] as f32 to %s (%zu bytes)\n", name,
            (long long)q.n, (long long)q.k, out, elems * sizeof(float));
    return CLI_OK;
}

static void print_metadata(kiln_model *m)
{
    int n = kiln_model_n_metadata(m);
    if (!n)
        return;
    printf("\nmetadata (%d keys):\n", n);
    for (int i = 0; i < n; i++) {
        const char *key;
        char buf[512], k[512], v[2048];
        if (kiln_model_metadata_at(m, i, 8, &key, buf, sizeof buf) == KILN_OK)
            printf("  %-44s %s\n", cli_printable(key, k, sizeof k),
                   cli_printable(buf, v, sizeof v));
    }
}

static int print_text(kiln_model *m, const char *path, int metadata)
{
    kiln_model_info hp;
    kiln_model_get_info(m, &hp);
    char safe[1024];
    printf("file:          %s (%s)\n", path, kiln_model_container(m));
    printf("architecture:  %s\n",
           kiln_model_arch(m)[0] ? cli_printable(kiln_model_arch(m), safe, sizeof safe)
                                 : "(not given)");
    printf("layers %lld, width %lld, ffn %lld, heads %lld, kv heads %lld, vocab %lld, "
           "context %lld, rms eps %g\n",
           (long long)hp.n_layers, (long long)hp.d_model, (long long)hp.d_ffn,
           (long long)hp.n_heads, (long long)hp.n_kv_heads, (long long)hp.vocab,
           (long long)hp.ctx, (double)hp.rms_eps);
    if (metadata)
        print_metadata(m);
    int n = kiln_model_n_tensors(m);
    size_t total = 0;
    kiln_status st = KILN_OK;
    printf("\n%-52s %-12s %-22s %10s\n", "tensor", "format", "shape", "size");
    for (int i = 0; i < n; i++) {
        kiln_model_tensor_info t;
        if ((st = kiln_model_tensor_at(m, i, &t)))
            break;
        char shape[96], fmt[40], size[32];
        shape_text(&t, shape, sizeof shape);
        /* A grouped format with its group: int4_group/g128, or /row. */
        int grouped = t.supported && kiln_format_get(t.format)->grouped;
        if (grouped && t.group)
            snprintf(fmt, sizeof fmt, "%s/g%lld", kiln_format_get(t.format)->name,
                     (long long)t.group);
        else if (grouped)
            snprintf(fmt, sizeof fmt, "%s/row", kiln_format_get(t.format)->name);
        else if (t.supported)
            snprintf(fmt, sizeof fmt, "%s", kiln_format_get(t.format)->name);
        else
            snprintf(fmt, sizeof fmt, "%s (unsupported)",
                     cli_printable(t.type_name, safe, sizeof safe));
        char scale[48] = "";
        if (t.input_scale > 0)
            snprintf(scale, sizeof scale, "  static input_scale %g", (double)t.input_scale);
        printf("%-52s %-12s %-22s %10s%s\n", cli_printable(t.name, safe, sizeof safe), fmt,
               shape, cli_bytes(t.bytes, size, sizeof size), scale);
        total += t.bytes;
    }
    char size[32];
    printf("%d tensors, %s\n", n, cli_bytes(total, size, sizeof size));
    return st == KILN_OK ? CLI_OK : cli_fail(st, "inspect");
}

/* Strings from the file go into JSON as they are: jansson escapes control
 * characters, and refuses text that is not UTF-8 (then null). */
static int print_json(kiln_model *m, const char *path, int metadata)
{
    kiln_model_info hp;
    kiln_model_get_info(m, &hp);
    json_t *tensors = json_array(), *meta = json_array();
    size_t total = 0;
    kiln_status st = KILN_OK;
    for (int i = 0; i < kiln_model_n_tensors(m); i++) {
        kiln_model_tensor_info t;
        if ((st = kiln_model_tensor_at(m, i, &t)))
            break;
        json_t *shape = json_array();
        for (int d = t.n_dims - 1; d >= 0; d--)
            json_array_append_new(shape, json_integer(t.ne[d]));
        json_t *e = json_pack("{s:s?, s:s?, s:s?, s:b, s:o, s:I}", "name", t.name, "type",
                              t.type_name, "format",
                              t.supported ? kiln_format_get(t.format)->name : NULL,
                              "supported", t.supported, "shape", shape, "bytes",
                              (json_int_t)t.bytes);
        if (e && t.supported && kiln_format_get(t.format)->grouped)
            json_object_set_new(e, "group", json_integer(t.group));
        if (e && t.input_scale > 0)
            json_object_set_new(e, "input_scale", json_real(t.input_scale));
        json_array_append_new(tensors, e);
        total += t.bytes;
    }
    for (int i = 0; metadata && i < kiln_model_n_metadata(m); i++) {
        const char *key;
        char buf[2048];
        if (kiln_model_metadata_at(m, i, 8, &key, buf, sizeof buf) == KILN_OK)
            json_array_append_new(meta, json_pack("{s:s?, s:s?}", "key", key, "value", buf));
    }
    json_t *root = json_pack(
        "{s:s, s:s, s:s, s:{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f}, s:o, s:I}", "file", path,
        "container", kiln_model_container(m), "arch", kiln_model_arch(m), "info", "layers",
        (json_int_t)hp.n_layers, "width", (json_int_t)hp.d_model, "ffn", (json_int_t)hp.d_ffn,
        "heads", (json_int_t)hp.n_heads, "kv_heads", (json_int_t)hp.n_kv_heads, "vocab",
        (json_int_t)hp.vocab, "context", (json_int_t)hp.ctx, "rms_eps", (double)hp.rms_eps,
        "tensors", tensors, "bytes", (json_int_t)total);
    if (root && metadata)
        json_object_set(root, "metadata", meta);
    json_decref(meta);
    if (!root || st != KILN_OK) {
        json_decref(root);
        return cli_fail(st != KILN_OK ? st : cli_error(KILN_ERR_NOMEM, "%s: JSON", path),
                        "inspect");
    }
    int rc = json_dumpf(root, stdout, JSON_INDENT(1)) == 0 ? CLI_OK : CLI_FAIL;
    putchar('\n');
    json_decref(root);
    return rc;
}

static int run(int argc, char **argv)
{
    static const struct option opts[] = {
        { "metadata", no_argument, NULL, 'm' },
        { "tensor", required_argument, NULL, 't' },
        { "dequant", required_argument, NULL, 'd' },
        { "allow-nonfinite", no_argument, NULL, 'n' },
        { "json", no_argument, NULL, 'j' },
        { 0 },
    };
    const char *tensor = NULL, *out = NULL;
    int metadata = 0, json = 0, c;
    kiln_model_options mo = { 0 };
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
        switch (c) {
        case 'm': metadata = 1; break;
        case 'j': json = 1; break;
        case 't': tensor = optarg; break;
        case 'd': out = optarg; break;
        case 'n': mo.allow_nonfinite = 1; break;
        case ':': return cli_usage(&cli_cmd_inspect, "%s needs a value", argv[optind - 1]);
        default: return cli_usage(&cli_cmd_inspect, "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind >= argc)
        return cli_usage(&cli_cmd_inspect, "which model? give a FILE or DIR");
    if (optind + 1 < argc)
        return cli_usage(&cli_cmd_inspect, "unexpected argument '%s'", argv[optind + 1]);
    if (!tensor != !out)
        return cli_usage(&cli_cmd_inspect, "--tensor and --dequant go together");
    const char *path = argv[optind];

    kiln_model *m;
    kiln_status st = kiln_model_open_with(path, &mo, &m);
    if (st != KILN_OK)
        return cli_fail(st, "inspect");
    if (tensor) {
        int rc = dequant(m, path, tensor, out);
        kiln_model_close(m);
        return rc;
    }
    int rc = json ? print_json(m, path, metadata) : print_text(m, path, metadata);
    kiln_model_close(m);
    return rc;
}

const cli_command cli_cmd_inspect = {
    .name = "inspect",
    .summary = "describe a GGUF or safetensors model and its tensors",
    .run = run,
    .help = help,
};
