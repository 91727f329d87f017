/* Kept sources (--keep-source DIR, $KILN_DUMP_SOURCE): a kernel's source,
 * NVRTC log and PTX written beside each other under its entry name. */
#include "codegen/emit.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

const char *kiln_emit_keep_dir(const char *keep)
{
    if (keep)
        return keep;
    kiln_env env;
    kiln_env_read(&env);
    return env.dump_source;
}

/* A path past PATH_MAX does not fit the 1 KiB error text either: it is
 * named by its beginning, so that the reason survives. */
static kiln_status path_too_long(const char *path, size_t len)
{
    return kiln_fail(KILN_ERR_IO, "%.64s...: path too long (%zu bytes, at most %d)", path, len,
                     PATH_MAX - 1);
}

/* mkdir -p: every prefix of dir that ends at a '/', then dir itself. */
static kiln_status make_dirs(const char *dir)
{
    char path[PATH_MAX];
    size_t len = strlen(dir);
    if (len >= sizeof path)
        return path_too_long(dir, len);
    memcpy(path, dir, len + 1);
    for (size_t i = 1; i <= len; i++) {
        if (path[i] != '/' && path[i] != '\0')
            continue;
        char c = path[i];
        path[i] = '\0';
        if (mkdir(path, 0777) != 0 && errno != EEXIST)
            return kiln_fail(KILN_ERR_IO, "%s: cannot create directory: %s", path, strerror(errno));
        path[i] = c;
    }
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return kiln_fail(KILN_ERR_IO, "%s: not a directory", dir);
    return KILN_OK;
}

static kiln_status write_text(const char *dir, const char *entry, const char *ext, const char *text)
{
    char path[PATH_MAX];
    int n = snprintf(path, sizeof path, "%s/%s%s", dir, entry, ext);
    if (n >= (int)sizeof path)
        return path_too_long(path, (size_t)n);
    FILE *f = fopen(path, "wb");
    if (!f)
        return kiln_fail(KILN_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    size_t len = strlen(text);
    int bad = fwrite(text, 1, len, f) != len;
    bad |= fclose(f) != 0;
    if (bad)
        return kiln_fail(KILN_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    return KILN_OK;
}

kiln_status kiln_emit_keep(const char *dir, const char *entry, const char *source, const char *log,
                           const char *ptx)
{
    if (!dir || !entry || !source)
        return kiln_fail(KILN_ERR_INVALID_ARG,
                         "kiln_emit_keep: dir, entry and source are required");
    kiln_status st = make_dirs(dir);
    if (st == KILN_OK)
        st = write_text(dir, entry, ".cu", source);
    if (st == KILN_OK && log)
        st = write_text(dir, entry, ".log", log);
    if (st == KILN_OK && ptx)
        st = write_text(dir, entry, ".ptx", ptx);
    return st;
}
