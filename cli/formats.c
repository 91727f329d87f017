#include "cli.h"

static void help(FILE *out)
{
    fprintf(out, "usage: kiln formats\n\n"
                 "Lists the weight formats kiln stores and computes with: block size along K,\n"
                 "bytes per block, bits per weight (scales included) and the scale layout.\n");
}

static int run(int argc, char **argv)
{
    (void)argv;
    if (argc > 1)
        return cli_usage(&cli_cmd_formats, "unexpected argument '%s'", argv[1]);
    printf("%-12s %6s %6s %7s %5s  %-50s %s\n", "format", "block", "bytes", "bits/w", "gguf",
           "scales", "description");
    for (int f = 0; f < KILN_FMT_COUNT; f++) {
        const kiln_format_info *fi = kiln_format_get((kiln_format)f);
        char gguf[16] = "-";
        if (fi->gguf_type >= 0)
            snprintf(gguf, sizeof gguf, "%d", fi->gguf_type);
        printf("%-12s %6d %6d %7.4g %5s  %-50s %s\n", fi->name, fi->block, fi->block_bytes,
               fi->bits_per_weight, gguf, fi->scale_desc, fi->desc);
    }
    return CLI_OK;
}

const cli_command cli_cmd_formats = {
    .name = "formats",
    .summary = "list the supported weight formats",
    .run = run,
    .help = help,
};
