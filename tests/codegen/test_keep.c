/* Kept sources: source, log and PTX land under the entry's name in a
 * directory made on demand; what cannot be written is an error naming the
 * path; the option wins over $KILN_DUMP_SOURCE. */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codegen/emit.h"

static char *temp_dir(void)
{
    char tmpl[] = "/tmp/kiln-emit-XXXXXX";
    char *dir = mkdtemp(tmpl);
    cr_assert_not_null(dir);
    return strdup(dir);
}

static void expect_file(const char *dir, const char *name, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s is missing", path);
    char buf[4096] = { 0 };
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    cr_assert_eq(n, strlen(text));
    cr_assert_str_eq(buf, text);
    unlink(path);
}

Test(keep, keep_writes_source_log_and_ptx)
{
    char *dir = temp_dir();
    char sub[512];
    snprintf(sub, sizeof sub, "%s/a/b/", dir);
    const char *entry = "kiln_simt_158627c8c69de24f", *source = "// a kernel\n#include \"x\"\n";
    cr_assert_eq(kiln_emit_keep(sub, entry, source, "the log", ".version 9.0"), KILN_OK, "%s",
                 kiln_last_error());
    char name[128];
    snprintf(name, sizeof name, "%s.cu", entry);
    expect_file(sub, name, source);
    snprintf(name, sizeof name, "%s.log", entry);
    expect_file(sub, name, "the log");
    snprintf(name, sizeof name, "%s.ptx", entry);
    expect_file(sub, name, ".version 9.0");

    /* Without a log and PTX only the source is written. */
    cr_assert_eq(kiln_emit_keep(sub, "only", "src", NULL, NULL), KILN_OK);
    expect_file(sub, "only.cu", "src");
    char log_path[600];
    snprintf(log_path, sizeof log_path, "%s/only.log", sub);
    cr_assert_neq(access(log_path, F_OK), 0);

    snprintf(sub, sizeof sub, "%s/a/b", dir);
    cr_assert_eq(rmdir(sub), 0);
    snprintf(sub, sizeof sub, "%s/a", dir);
    cr_assert_eq(rmdir(sub), 0);
    cr_assert_eq(rmdir(dir), 0);
    free(dir);
}

Test(keep, keep_reports_what_it_cannot_write)
{
    char *dir = temp_dir();
    char file[512], below[600];
    snprintf(file, sizeof file, "%s/plain", dir);
    FILE *f = fopen(file, "w");
    cr_assert_not_null(f);
    fclose(f);
    cr_assert_eq(kiln_emit_keep(file, "k", "src", NULL, NULL), KILN_ERR_IO);
    cr_assert(strstr(kiln_last_error(), file), "%s", kiln_last_error());
    snprintf(below, sizeof below, "%s/sub", file);
    cr_assert_eq(kiln_emit_keep(below, "k", "src", NULL, NULL), KILN_ERR_IO);
    cr_assert(strstr(kiln_last_error(), "cannot create directory"), "%s", kiln_last_error());
    /* An entry that names a directory cannot be written as a file. */
    snprintf(below, sizeof below, "%s/k.cu", dir);
    cr_assert_eq(mkdir(below, 0777), 0);
    cr_assert_eq(kiln_emit_keep(dir, "k", "src", NULL, NULL), KILN_ERR_IO);
    cr_assert(strstr(kiln_last_error(), "cannot create"), "%s", kiln_last_error());
    cr_assert_eq(kiln_emit_keep(NULL, "k", "src", NULL, NULL), KILN_ERR_INVALID_ARG);
    cr_assert(strstr(kiln_last_error(), "dir, entry and source are required"), "%s",
              kiln_last_error());
    rmdir(below);
    unlink(file);
    rmdir(dir);
    free(dir);
}

/* Paths past PATH_MAX: a directory is refused before anything is made, a
 * file name that no longer fits after its directory before it is written.
 * The error text holds 1 KiB, so the message names the path by its
 * beginning and keeps the reason and the length. */
Test(keep, keep_names_a_path_too_long)
{
    char huge[5000];
    memset(huge, 'd', sizeof huge - 1);
    huge[sizeof huge - 1] = '\0';
    cr_assert_eq(kiln_emit_keep(huge, "k", "src", NULL, NULL), KILN_ERR_IO);
    cr_assert(!strncmp(kiln_last_error(), "dddddddd", 8), "%s", kiln_last_error());
    cr_assert(strstr(kiln_last_error(), ": path too long (4999 bytes"), "%s", kiln_last_error());

    char *dir = temp_dir(), deep[PATH_MAX], part[201];
    memset(part, 'p', sizeof part - 1);
    part[sizeof part - 1] = '\0';
    snprintf(deep, sizeof deep, "%s", dir);
    int levels = 0;
    for (; strlen(deep) + sizeof part < PATH_MAX - 100; levels++)
        snprintf(deep + strlen(deep), sizeof deep - strlen(deep), "/%s", part);
    /* deep/entry.cu is PATH_MAX bytes, one past the longest path. */
    char entry[PATH_MAX], want[64];
    size_t entry_len = PATH_MAX - strlen(deep) - strlen("/.cu");
    memset(entry, 'e', entry_len);
    entry[entry_len] = '\0';
    snprintf(want, sizeof want, ": path too long (%d bytes", PATH_MAX);
    kiln_status st = kiln_emit_keep(deep, entry, "src", NULL, NULL);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", kiln_last_error());
    /* Removed before the checks, so that a failure leaves nothing behind. */
    char written[PATH_MAX];
    if (snprintf(written, sizeof written, "%s/%s.cu", deep, entry) < (int)sizeof written)
        unlink(written);
    int removed = 0;
    for (; removed <= levels && rmdir(deep) == 0; removed++)
        *strrchr(deep, '/') = '\0';
    cr_assert_eq(st, KILN_ERR_IO, "%s", msg);
    cr_assert(!strncmp(msg, dir, strlen(dir)), "%s", msg);
    cr_assert(strstr(msg, want), "%s", msg);
    cr_assert_eq(removed, levels + 1, "only the directories were made: %s is not empty", deep);
    free(dir);
}

Test(keep, keep_dir_prefers_the_option_then_the_environment)
{
    unsetenv("KILN_DUMP_SOURCE");
    cr_assert_null(kiln_emit_keep_dir(NULL));
    cr_assert_str_eq(kiln_emit_keep_dir("opt"), "opt");
    setenv("KILN_DUMP_SOURCE", "", 1);
    cr_assert_null(kiln_emit_keep_dir(NULL));
    setenv("KILN_DUMP_SOURCE", "env", 1);
    cr_assert_str_eq(kiln_emit_keep_dir(NULL), "env");
    cr_assert_str_eq(kiln_emit_keep_dir("opt"), "opt");
}
