/* `kiln inspect` on hostile model files: what the reader refuses is reported
 * by name with exit 1, never read past the bytes the file holds. */
#include <criterion/criterion.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "clirun.h"

static char dir[64];

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/kiln-inspect-XXXXXX");
    cr_assert(mkdtemp(dir));
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void teardown(void) { nftw(dir, rm_one, 8, FTW_DEPTH | FTW_PHYS); }

TestSuite(inspect, .init = setup, .fini = teardown);

/* A safetensors file of header JSON and no data section. */
static void write_header_only(const char *path, const char *json)
{
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    uint64_t n = strlen(json);
    uint8_t len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (uint8_t)(n >> (8 * i));
    cr_assert_eq(fwrite(len, 1, 8, f), 8);
    cr_assert_eq(fwrite(json, 1, n, f), n);
    cr_assert_eq(fclose(f), 0);
}

/* A gpt-oss MXFP4 pair with a leading dimension of 0 once became an N x K
 * weight with no bytes behind it: --dequant read past the mapping. */
Test(inspect, a_gpt_oss_pair_of_zero_experts_is_refused_by_name)
{
    char model[128], out[128], args[512];
    snprintf(model, sizeof model, "%s/model.safetensors", dir);
    snprintf(out, sizeof out, "%s/w.f32", dir);
    write_header_only(model, "{\"e.down_proj_blocks\":{\"dtype\":\"U8\",\"shape\":[0,256,90,16],"
                             "\"data_offsets\":[0,0]},"
                             "\"e.down_proj_scales\":{\"dtype\":\"U8\",\"shape\":[0,256,90],"
                             "\"data_offsets\":[0,0]}}");
    snprintf(args, sizeof args, "inspect %s", dir);
    kt_cli r = kt_cli_run(args);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(strstr(r.out, "e.down_proj "), "%s", r.out);
    kt_cli_free(&r);

    snprintf(args, sizeof args, "inspect %s --tensor e.down_proj --dequant %s", dir, out);
    r = kt_cli_run(args);
    cr_assert_eq(r.status, 1, "exit %d: %s", r.status, r.err);
    cr_assert(strstr(r.err, "tensor e.down_proj") && strstr(r.err, "0 experts"), "%s", r.err);
    cr_assert(strstr(r.err, dir), "names the file: %s", r.err);
    cr_assert_neq(access(out, F_OK), 0, "nothing written");
    kt_cli_free(&r);
}

/* --dequant writes under a name of its own making (never through a link
 * planted beside OUT), and replaces OUT only when it is a regular file. */
Test(inspect, dequant_follows_no_planted_link_and_replaces_only_a_file)
{
    char model[128], out[128], planted[128], victim[128], args[512];
    snprintf(model, sizeof model, "%s/model.safetensors", dir);
    snprintf(out, sizeof out, "%s/w.f32", dir);
    snprintf(planted, sizeof planted, "%s/w.f32.tmp", dir);
    snprintf(victim, sizeof victim, "%s/victim", dir);
    FILE *f = fopen(model, "wb");
    cr_assert(f);
    static const char json[] = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}";
    uint8_t len[8] = { (uint8_t)(sizeof json - 1) };
    static const float w[4] = { 1, 2, 3, 4 };
    cr_assert_eq(fwrite(len, 1, 8, f), 8);
    cr_assert_eq(fwrite(json, 1, sizeof json - 1, f), sizeof json - 1);
    cr_assert_eq(fwrite(w, sizeof w[0], 4, f), 4);
    cr_assert_eq(fclose(f), 0);
    f = fopen(victim, "wb");
    cr_assert(f && fputs("keep", f) >= 0 && fclose(f) == 0);
    cr_assert_eq(symlink(victim, planted), 0);

    snprintf(args, sizeof args, "inspect %s --tensor w --dequant %s", model, out);
    kt_cli r = kt_cli_run(args);
    cr_assert_eq(r.status, 0, "%s", r.err);
    kt_cli_free(&r);
    float got[4];
    f = fopen(out, "rb");
    cr_assert(f && fread(got, sizeof got[0], 4, f) == 4 && fclose(f) == 0);
    cr_assert_arr_eq(got, w, sizeof w);
    char keep[8] = { 0 };
    f = fopen(victim, "rb");
    cr_assert(f && fread(keep, 1, sizeof keep - 1, f) == 4 && fclose(f) == 0);
    cr_assert_str_eq(keep, "keep", "the link's target is untouched");

    unlink(out);
    cr_assert_eq(mkfifo(out, 0600), 0);
    r = kt_cli_run(args);
    cr_assert_eq(r.status, 1, "%s", r.err);
    cr_assert(strstr(r.err, "not a regular file"), "%s", r.err);
    struct stat sb;
    cr_assert(!lstat(out, &sb) && S_ISFIFO(sb.st_mode), "the FIFO is still there");
    kt_cli_free(&r);
}

/* Names and types from a file are printed with their control characters
 * escaped: a file cannot drive the terminal. */
Test(inspect, control_characters_from_a_file_are_escaped)
{
    char model[128], args[256];
    snprintf(model, sizeof model, "%s/model.safetensors", dir);
    write_header_only(model, "{\"evil\\u001b[2Jname\":{\"dtype\":\"U8\",\"shape\":[0],"
                             "\"data_offsets\":[0,0]}}");
    snprintf(args, sizeof args, "inspect %s", model);
    kt_cli r = kt_cli_run(args);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(strstr(r.out, "evil\\x1b[2Jname"), "%s", r.out);
    cr_assert_null(strchr(r.out, '\x1b'), "no escape byte printed");
    kt_cli_free(&r);
}

/* Sizes for a reader in the table, to the byte in --json. */
Test(inspect, sizes_are_read_and_exact_in_json)
{
    char model[128], args[256];
    snprintf(model, sizeof model, "%s/model.safetensors", dir);
    write_header_only(model, "{\"w\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]},"
                             "\"e\\u001b\":{\"dtype\":\"U8\",\"shape\":[0],"
                             "\"data_offsets\":[0,0]}}");
    snprintf(args, sizeof args, "inspect %s", model);
    kt_cli r = kt_cli_run(args);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(strstr(r.out, "2 tensors, 0 B\n"), "%s", r.out);
    kt_cli_free(&r);
    snprintf(args, sizeof args, "inspect %s --json", model);
    r = kt_cli_run(args);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(strstr(r.out, "\"container\": \"safetensors\""), "%s", r.out);
    cr_assert(strstr(r.out, "\"name\": \"w\""), "%s", r.out);
    cr_assert(strstr(r.out, "\"name\": \"e\\u001B\""), "%s", r.out);
    cr_assert(strstr(r.out, "\"shape\": [\n    0\n   ]"), "%s", r.out);
    cr_assert(strstr(r.out, "\"bytes\": 0\n}"), "%s", r.out);
    cr_assert_null(strchr(r.out, '\x1b'), "no escape byte printed");
    kt_cli_free(&r);
}
