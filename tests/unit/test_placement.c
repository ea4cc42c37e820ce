/* The CUDA backend's placement rule: which device a batch goes to, from what the backend knows
 * of its devices and their memory pools. A pure function, so no GPU is needed. */
#include <check.h>
#include <errno.h>
#include <stdlib.h>

#include "daemon/exec/exec_placement.h"

/* Three devices, ordinals 0..2, each serving with two free slots and nothing running. */
static void three_idle(placement_device_t devs[3])
{
    for (int d = 0; d < 3; d++)
        devs[d] = (placement_device_t){.device = d, .serves = true, .free_slots = 2, .load = 0};
}

static int pick(const placement_device_t devs[3], int pin, int preferred)
{
    placement_batch_t b = {.pin = pin, .preferred = preferred};
    return placement_pick(devs, 3, &b);
}

START_TEST(test_a_pinned_batch_runs_only_on_its_device)
{
    placement_device_t devs[3];
    three_idle(devs);
    devs[2].load = 5; /* the busiest: pinned work still goes there */
    ck_assert_int_eq(pick(devs, 2, -1), 2);
    /* Its device full, it waits rather than run elsewhere. */
    devs[2].free_slots = 0;
    ck_assert_int_eq(pick(devs, 2, -1), -EAGAIN);
    /* The pin wins over the device its resident inputs live on. */
    devs[2].free_slots = 1;
    ck_assert_int_eq(pick(devs, 2, 0), 2);
}
END_TEST

START_TEST(test_a_resident_input_holds_its_batch_to_its_device_while_it_serves)
{
    placement_device_t devs[3];
    three_idle(devs);
    devs[1].load = 3;
    ck_assert_int_eq(pick(devs, -1, 1), 1);
    /* Full, the batch waits for it instead of copying the input to another device. */
    devs[1].free_slots = 0;
    ck_assert_int_eq(pick(devs, -1, 1), -EAGAIN);
    /* Once the device does not serve, the batch runs anywhere: the least loaded. */
    devs[1].serves = false;
    devs[0].load = 2;
    ck_assert_int_eq(pick(devs, -1, 1), 2);
    /* A preference for a device the backend does not have is no preference. */
    three_idle(devs);
    devs[0].load = 1;
    ck_assert_int_eq(pick(devs, -1, 7), 1);
}
END_TEST

START_TEST(test_an_unpinned_batch_goes_to_the_least_loaded_device)
{
    placement_device_t devs[3];
    three_idle(devs);
    devs[0].load = 2;
    devs[1].load = 1;
    devs[2].load = 3;
    ck_assert_int_eq(pick(devs, -1, -1), 1);
    /* Among equals, the first. */
    devs[2].load = 1;
    ck_assert_int_eq(pick(devs, -1, -1), 1);
    /* A device with no free slot is passed over, however idle. */
    devs[1].free_slots = 0;
    devs[1].load = 0;
    ck_assert_int_eq(pick(devs, -1, -1), 2);
}
END_TEST

START_TEST(test_a_device_not_served_is_never_chosen)
{
    placement_device_t devs[3];
    three_idle(devs);
    devs[0].serves = false;
    devs[1].load = 1;
    devs[2].load = 1;
    ck_assert_int_eq(pick(devs, -1, -1), 1);
    ck_assert_int_eq(pick(devs, 0, -1), -EAGAIN);
    ck_assert_int_eq(pick(devs, -1, 0), 1);
}
END_TEST

START_TEST(test_nothing_fits_gives_no_device)
{
    placement_device_t devs[3];
    three_idle(devs);
    for (int d = 0; d < 3; d++)
        devs[d].free_slots = 0;
    ck_assert_int_eq(pick(devs, -1, -1), -EAGAIN);
    placement_batch_t b = {.pin = -1, .preferred = -1};
    ck_assert_int_eq(placement_pick(devs, 0, &b), -EAGAIN);
    /* Pinned to a device that is not there. */
    three_idle(devs);
    ck_assert_int_eq(pick(devs, 5, -1), -EAGAIN);
}
END_TEST

/* Three devices with pools of 100 bytes: a batch goes where it has room, waits (for memory,
 * not slots) when no device it may run on has room now, and never fits when it needs more than
 * every such pool holds, even an idle one; a resident input that makes it smaller on its own
 * device counts there. */
START_TEST(test_a_batch_goes_where_its_memory_fits_and_waits_or_never_fits_otherwise)
{
    placement_device_t devs[3];
    three_idle(devs);
    for (int d = 0; d < 3; d++)
        devs[d].cap = devs[d].room = 100, devs[d].need = 60;
    devs[0].room = 50; /* running batches hold half of device 0 */
    devs[1].load = 1;
    devs[2].load = 2;
    ck_assert_int_eq(pick(devs, -1, -1), 1);
    placement_batch_t any = {.pin = -1, .preferred = -1};
    devs[1].room = devs[2].room = 50;
    ck_assert_int_eq(pick(devs, -1, -1), -EAGAIN);
    ck_assert(placement_waits_for_memory(devs, 3, &any));
    /* With no free slot anywhere, it waits for a slot, not for memory. */
    for (int d = 0; d < 3; d++)
        devs[d].free_slots = 0;
    ck_assert_int_eq(pick(devs, -1, -1), -EAGAIN);
    ck_assert(!placement_waits_for_memory(devs, 3, &any));
    /* Past every pool's bound it never fits, busy or not. */
    for (int d = 0; d < 3; d++)
        devs[d].need = 101;
    ck_assert_int_eq(pick(devs, -1, -1), -E2BIG);
    /* Pinned, only its device's pool counts; a pool without a bound always has room. */
    three_idle(devs);
    for (int d = 0; d < 3; d++)
        devs[d].cap = devs[d].room = 100, devs[d].need = 150;
    devs[2].cap = devs[2].room = 0;
    ck_assert_int_eq(pick(devs, 2, -1), 2);
    ck_assert_int_eq(pick(devs, 1, -1), -E2BIG);
    /* Where its resident input lives it needs less. */
    devs[2].cap = devs[2].room = 100;
    devs[1].need = 40;
    ck_assert_int_eq(pick(devs, -1, 1), 1);
    ck_assert_int_eq(pick(devs, -1, -1), 1);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("placement");
    TCase *tc = tcase_create("pick");
    tcase_add_test(tc, test_a_pinned_batch_runs_only_on_its_device);
    tcase_add_test(tc, test_a_resident_input_holds_its_batch_to_its_device_while_it_serves);
    tcase_add_test(tc, test_an_unpinned_batch_goes_to_the_least_loaded_device);
    tcase_add_test(tc, test_a_device_not_served_is_never_chosen);
    tcase_add_test(tc, test_nothing_fits_gives_no_device);
    tcase_add_test(tc, test_a_batch_goes_where_its_memory_fits_and_waits_or_never_fits_otherwise);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
