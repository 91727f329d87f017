/* The rows of a run: the table on the terminal and the JSON report. */
#include "bench/bench.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const status_names[] = {
    [KILN_BENCH_OK] = "ok",
    [KILN_BENCH_FAIL] = "FAIL",
    [KILN_BENCH_UNSUPPORTED] = "not supported",
    [KILN_BENCH_ERROR] = "error",
};
_Static_assert(KILN_ARRAY_LEN(status_names) == KILN_BENCH_STATUS_COUNT, "one name per status");

const char *kiln_bench_status_name(kiln_bench_status s)
{
    return (unsigned)s < KILN_BENCH_STATUS_COUNT ? status_names[s] : "?";
}

kiln_status kiln_bench_report_add(kiln_bench_report *r, const kiln_bench_row *row)
{
    if (r->n_rows == r->cap_rows) {
        int cap = r->cap_rows ? 2 * r->cap_rows : 64;
        kiln_bench_row *rows = realloc(r->rows, (size_t)cap * sizeof *rows);
        if (!rows)
            return kiln_fail(KILN_ERR_NOMEM, "report: %d rows", cap);
        r->rows = rows;
        r->cap_rows = cap;
    }
    r->rows[r->n_rows++] = *row;
    return KILN_OK;
}

void kiln_bench_report_free(kiln_bench_report *r)
{
    free(r->rows);
    r->rows = NULL;
    r->n_rows = r->cap_rows = 0;
}

/* ------------------------------------------------------------- table */

void kiln_bench_table_header(FILE *f, const kiln_bench_report *r)
{
    fprintf(f, "%-16s %7s %6s %5s  %-16s %-16s %9s %6s %8s %6s %6s %6s\n", "shape", "N", "K", "M",
            "format", "backend", "us", "TB/s", "TFLOP/s", "%copy", "xbf16",
            r->ffn ? "xkbf16" : "xfp8");
}

static void ratio(FILE *f, double v)
{
    if (v > 0)
        fprintf(f, " %6.2f", v);
    else
        fprintf(f, " %6s", "-");
}

void kiln_bench_table_row(FILE *f, const kiln_bench_report *r, const kiln_bench_row *row)
{
    const char *label = row->format;
    for (int p = 0; p < KILN_BENCH_PEER_COUNT; p++)
        if (!strcmp(row->kind, kiln_bench_peer_kind((kiln_bench_peer)p)))
            label = kiln_bench_peer_label((kiln_bench_peer)p);
    char backend[64] = "-";
    if (row->backend[0])
        snprintf(backend, sizeof backend, "%s/%s", row->backend, row->act);
    fprintf(f, "%-16s %7lld %6lld %5lld  %-16s %-16s", row->shape, (long long)row->n,
            (long long)row->k, (long long)row->m, label, backend);
    if (row->us > 0) {
        double tbps = kiln_bench_tbps(row->bytes, row->us);
        fprintf(f, " %9.2f %6.3f %8.2f", row->us, tbps, kiln_bench_tflops(row->flops, row->us));
        if (r->copy_tbps > 0)
            fprintf(f, " %6.1f", 100.0 * tbps / r->copy_tbps);
        else
            fprintf(f, " %6s", "-");
        ratio(f, row->speedup_bf16);
        ratio(f, r->ffn ? row->speedup_kiln_bf16 : row->speedup_fp8);
    }
    if (row->status != KILN_BENCH_OK)
        fprintf(f, "  %s%s%s", kiln_bench_status_name(row->status), row->error[0] ? ": " : "",
                row->error);
    fputc('\n', f);
}

/* -------------------------------------------------------------- JSON */

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p == '\n')
            fputs("\\n", f);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

/* JSON has no NaN or infinity; a measurement that is not there is null. */
static void json_num(FILE *f, double v)
{
    if (isfinite(v))
        fprintf(f, "%.9g", v);
    else
        fputs("null", f);
}

static void key(FILE *f, const char *k)
{
    fputs(",\n   ", f);
    json_str(f, k);
    fputs(": ", f);
}

static void json_row(FILE *f, const kiln_bench_report *r, const kiln_bench_row *row)
{
    fputs("  {\n   \"shape\": ", f);
    json_str(f, row->shape);
    key(f, "N");
    fprintf(f, "%lld", (long long)row->n);
    key(f, "K");
    fprintf(f, "%lld", (long long)row->k);
    key(f, "M");
    fprintf(f, "%lld", (long long)row->m);
    key(f, "kind");
    json_str(f, row->kind);
    if (row->format[0]) {
        key(f, "format");
        json_str(f, row->format);
    }
    if (row->backend[0]) {
        key(f, "backend");
        json_str(f, row->backend);
        key(f, "act");
        json_str(f, row->act);
    }
    key(f, "status");
    json_str(f, kiln_bench_status_name(row->status));
    if (row->error[0]) {
        key(f, "error");
        json_str(f, row->error);
    }
    key(f, "bytes");
    json_num(f, row->bytes);
    key(f, "flops");
    json_num(f, row->flops);
    key(f, "rotation");
    fprintf(f, "%d", row->rotation);
    key(f, "chain");
    fprintf(f, "%d", row->chain);
    key(f, "check_err");
    json_num(f, row->check_err >= 0 ? row->check_err : NAN);
    if (row->us > 0) {
        double tbps = kiln_bench_tbps(row->bytes, row->us);
        key(f, "us");
        json_num(f, row->us);
        key(f, "tflops");
        json_num(f, kiln_bench_tflops(row->flops, row->us));
        key(f, "TBps");
        json_num(f, tbps);
        key(f, "frac_bw");
        json_num(f, r->copy_tbps > 0 ? tbps / r->copy_tbps : NAN);
        key(f, "speedup_bf16");
        json_num(f, row->speedup_bf16 > 0 ? row->speedup_bf16 : NAN);
        key(f, "speedup_fp8");
        json_num(f, row->speedup_fp8 > 0 ? row->speedup_fp8 : NAN);
        key(f, "speedup_kiln_bf16");
        json_num(f, row->speedup_kiln_bf16 > 0 ? row->speedup_kiln_bf16 : NAN);
    }
    fputs("\n  }", f);
}

kiln_status kiln_bench_json_write(const kiln_bench_report *r, FILE *f)
{
    fputs("{\n \"tool\": \"kiln-bench gemm\",\n \"kiln\": ", f);
    json_str(f, kiln_version());
    fputs(",\n \"device\": ", f);
    json_str(f, r->device);
    fputs(",\n \"target\": ", f);
    json_str(f, r->target);
    fputs(",\n \"copy_TBps\": ", f);
    json_num(f, r->copy_tbps > 0 ? r->copy_tbps : NAN);
    fputs(",\n \"l2_bytes\": ", f);
    json_num(f, r->l2_bytes);
    fputs(",\n \"rotate_bytes\": ", f);
    json_num(f, r->rotate_bytes);
    fprintf(f, ",\n \"iters\": %d,\n \"reps\": %d", r->iters, r->reps);
    fputs(",\n \"peak_bf16_tflops\": ", f);
    json_num(f, r->peak_bf16 > 0 ? r->peak_bf16 : NAN);
    fputs(",\n \"peak_fp8_tflops\": ", f);
    json_num(f, r->peak_fp8 > 0 ? r->peak_fp8 : NAN);
    fputs(",\n \"rows\": [", f);
    for (int i = 0; i < r->n_rows; i++) {
        fputs(i ? ",\n" : "\n", f);
        json_row(f, r, &r->rows[i]);
    }
    fputs(r->n_rows ? "\n ]\n}\n" : "]\n}\n", f);
    if (fflush(f) != 0 || ferror(f))
        return kiln_fail(KILN_ERR_IO, "the JSON report could not be written");
    return KILN_OK;
}

int kiln_bench_json_save(const kiln_bench_report *r, const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "kiln-bench: %s: cannot write the report\n", path);
        return 1;
    }
    kiln_status st = kiln_bench_json_write(r, f);
    if (fclose(f) != 0 || st != KILN_OK) {
        fprintf(stderr, "kiln-bench: %s: the report could not be written\n", path);
        return 1;
    }
    fprintf(stderr, "kiln-bench: wrote %s (%d rows)\n", path, r->n_rows);
    return 0;
}

void kiln_bench_row_error(kiln_bench_row *row, kiln_bench_status status, const char *message)
{
    row->status = status;
    row->us = 0;
    snprintf(row->error, sizeof row->error, "%s", message);
}

int kiln_bench_row_emit(kiln_bench_report *r, const kiln_bench_row *row)
{
    int failed = row->status == KILN_BENCH_FAIL || row->status == KILN_BENCH_ERROR;
    kiln_bench_table_row(stdout, r, row);
    fflush(stdout);
    if (kiln_bench_report_add(r, row) != KILN_OK) {
        fprintf(stderr, "kiln-bench: %s\n", kiln_last_error());
        failed = 1;
    }
    return failed;
}
