#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "core.h"

Test(status, every_status_has_a_text_starting_with_its_name)
{
    for (int s = 0; s < KILN_STATUS_COUNT; s++) {
        const char *t = kiln_strerror((kiln_status)s);
        cr_assert(!strncmp(t, "KILN_", 5), "status %d: %s", s, t);
        cr_assert(strchr(t, ':'), "status %d: %s", s, t);
    }
    cr_assert_str_eq(kiln_strerror(KILN_STATUS_COUNT), "unknown kiln_status");
    cr_assert_str_eq(kiln_strerror((kiln_status)-1), "unknown kiln_status");
}

Test(status, detail_message_is_set_and_cleared)
{
    kiln_clear_error();
    cr_assert_str_empty(kiln_last_error());
    cr_assert_eq(kiln_fail(KILN_ERR_SHAPE, "tensor %s: K = %d", "w", 7), KILN_ERR_SHAPE);
    cr_assert_str_eq(kiln_last_error(), "tensor w: K = 7");
    cr_assert_eq(kiln_fail_prefix(KILN_ERR_SHAPE, "model.gguf"), KILN_ERR_SHAPE);
    cr_assert_str_eq(kiln_last_error(), "model.gguf: tensor w: K = 7");
    kiln_clear_error();
    cr_assert_eq(kiln_fail_prefix(KILN_ERR_IO, "only %s", "prefix"), KILN_ERR_IO);
    cr_assert_str_eq(kiln_last_error(), "only prefix");
}

Test(status, long_messages_are_cut_not_overrun)
{
    char big[3000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    kiln_fail(KILN_ERR_IO, "%s", big);
    size_t n = strlen(kiln_last_error());
    cr_assert(n > 500 && n < sizeof big);
    kiln_fail_prefix(KILN_ERR_IO, "%s", big);
    cr_assert_eq(strlen(kiln_last_error()), n, "prefix + old message still fit the buffer");
    kiln_fail(KILN_ERR_IO, "tail");
    kiln_fail_prefix(KILN_ERR_IO, "%s", big);
    cr_assert_eq(strlen(kiln_last_error()), n);
}

static void *other_thread(void *arg)
{
    (void)arg;
    kiln_fail(KILN_ERR_NOMEM, "from the other thread");
    return NULL;
}

Test(status, detail_message_is_per_thread)
{
    kiln_fail(KILN_ERR_IO, "mine");
    pthread_t t;
    pthread_create(&t, NULL, other_thread, NULL);
    pthread_join(t, NULL);
    cr_assert_str_eq(kiln_last_error(), "mine");
}

Test(status, version_is_the_header_version)
{
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", KILN_VERSION_MAJOR, KILN_VERSION_MINOR,
             KILN_VERSION_PATCH);
    cr_assert_str_eq(kiln_version(), want);
}
