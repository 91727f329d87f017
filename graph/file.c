/* Opening the files of a model. A model path is anything a user or a
 * config names: a FIFO or a device must not hang or be read, and a dangling
 * symbolic link is named as one rather than as a missing file. */
#include "graph/model_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

kiln_status kiln_file_stat(const char *path, struct stat *sb)
{
    if (stat(path, sb) == 0)
        return KILN_OK;
    int e = errno;
    struct stat lsb;
    char target[PATH_MAX];
    ssize_t n;
    if (e == ENOENT && lstat(path, &lsb) == 0 && S_ISLNK(lsb.st_mode) &&
        (n = readlink(path, target, sizeof target - 1)) >= 0) {
        target[n] = '\0';
        return kiln_fail(KILN_ERR_IO, "%s: a symbolic link to %s, which does not exist", path,
                         target);
    }
    return kiln_fail(KILN_ERR_IO, "%s: cannot open: %s", path, strerror(e));
}

kiln_status kiln_file_open_regular(const char *path, int *fd_out, size_t *size_out)
{
    struct stat sb;
    kiln_status st = kiln_file_stat(path, &sb);
    if (st != KILN_OK)
        return st;
    if (!S_ISREG(sb.st_mode))
        return kiln_fail(KILN_ERR_IO, "%s: not a regular file", path);
    /* O_NONBLOCK: should the path become a FIFO after the stat, opening it
     * does not wait for a writer; the fstat below refuses it. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return kiln_fail(KILN_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        int e = errno;
        close(fd);
        return S_ISREG(sb.st_mode)
                   ? kiln_fail(KILN_ERR_IO, "%s: cannot stat: %s", path, strerror(e))
                   : kiln_fail(KILN_ERR_IO, "%s: not a regular file", path);
    }
    if ((uint64_t)sb.st_size > SIZE_MAX) {
        close(fd);
        return kiln_fail(KILN_ERR_IO, "%s: too large to map", path);
    }
    *fd_out = fd;
    *size_out = (size_t)sb.st_size;
    return KILN_OK;
}
