/* `kiln inspect` on hostile model files: what the reader refuses is reported
 * by name with exit 1, never read past the bytes the file holds. */
#include <criterion/criterion.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
