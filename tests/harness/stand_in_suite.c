/* A stand-in GPU suite for tests/scripts/suite_exit.sh, which checks the
 * verdicts of the shared main (tests/util/main.c) on it: one test of each
 * outcome. */
#include <criterion/criterion.h>

Test(stand_in, passes)
{
    cr_assert_eq(1 + 1, 2);
}

Test(stand_in, skips)
{
    cr_skip_test("no GPU here (a stand-in)");
}

Test(stand_in, fails)
{
    cr_assert_fail("a stand-in failure");
}
