/* Run the kiln command ($KILN_CLI) from a test and capture what it prints. */
#ifndef KILN_CLIRUN_H
#define KILN_CLIRUN_H

typedef struct kt_cli {
    int status; /* exit code, or -1 when it did not exit normally */
    char *out;  /* stdout, NUL-terminated, owned */
    char *err;  /* stderr, NUL-terminated, owned */
} kt_cli;

/* args is appended to the command line as is (shell words). */
kt_cli kt_cli_run(const char *args);
void kt_cli_free(kt_cli *r);

/* Read a whole file (NUL-terminated); NULL if it cannot be read. */
char *kt_read_file(const char *path, long *len);

#endif
