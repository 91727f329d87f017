/* core/alloc.c: every wrapper passes its call site to the hook, fails as
 * the C function does when the hook says so, and allocates as it does
 * otherwise. The test_fault suites of the other modules put the hook to
 * work (tests/util/fault.c). */
#include "core.h"
#include "fault.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

Test(alloc, the_hook_sees_every_wrapper_with_its_site)
{
    kt_hook_arm(0, 1);
    void *a = kiln_malloc(8);
    void *b = kiln_calloc(2, 8);
    void *c = kiln_aligned_alloc(64, 64);
    char *d = kiln_strdup("kiln");
    char *e = kiln_strndup("kiln", 2);
    b = kiln_realloc(b, 64);
    kt_hook_disarm();
    cr_assert(a && b && c && d && e);
    cr_assert_str_eq(d, "kiln");
    cr_assert_str_eq(e, "ki");
    cr_assert_eq((uintptr_t)c % 64, 0);
    cr_assert_eq(kt_hook_count(), 6);
    for (long i = 1; i <= 6; i++)
        cr_assert(strstr(kt_site_name(kt_hook_site(i)), "tests/core/test_alloc.c:"), "%s",
                  kt_hook_site(i));
    for (long i = 2; i <= 6; i++)
        cr_assert_str_neq(kt_hook_site(i - 1), kt_hook_site(i), "each call site has its own name");
    free(a);
    free(b);
    free(c);
    free(d);
    free(e);
}

Test(alloc, the_hook_fails_the_allocation_it_chooses_as_the_c_function_would)
{
    void *kept = kiln_malloc(8);
    cr_assert_not_null(kept, "no hook, no failure");
    for (long i = 1; i <= 6; i++) {
        void *p[6];
        int err[6];
        kt_hook_arm(i, 0);
        errno = 0;
        p[0] = kiln_malloc(8);
        err[0] = errno;
        p[1] = kiln_calloc(2, 8);
        err[1] = errno;
        p[2] = kiln_aligned_alloc(64, 64);
        err[2] = errno;
        p[3] = kiln_strdup("kiln");
        err[3] = errno;
        p[4] = kiln_strndup("kiln", 2);
        err[4] = errno;
        p[5] = kiln_realloc(kept, 128);
        err[5] = errno;
        kt_hook_disarm();
        for (int j = 0; j < 6; j++)
            cr_assert_eq(!p[j], j == i - 1, "allocation %d of 6, failing %ld", j + 1, i);
        cr_assert_eq(err[i - 1], ENOMEM);
        for (int j = 0; j < 5; j++)
            free(p[j]);
        /* A failed realloc leaves the block as it was. */
        if (p[5])
            kept = p[5];
    }
    free(kept);
}
