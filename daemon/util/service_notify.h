/* systemd's service notifications (sd_notify(3)) without libsystemd: a datagram to the
 * socket named by $NOTIFY_SOCKET. Under Type=notify the daemon says READY=1 once it serves and
 * STOPPING=1 when it drains; with WatchdogSec= the scheduler's loop says WATCHDOG=1, so that a
 * loop that stops turning gets the service restarted. Outside systemd nothing is sent. */
#pragma once

#include <stdint.h>

/* Sends state ("READY=1", "STOPPING=1\nSTATUS=draining", ...); errors are ignored, as
 * sd_notify's callers do. */
void service_notify(const char *state);
/* The watchdog interval systemd asks of this process ($WATCHDOG_USEC, when $WATCHDOG_PID is
 * unset or ours), in µs; 0 for none. */
uint64_t service_watchdog_usec(void);
