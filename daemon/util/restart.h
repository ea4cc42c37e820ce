/* Restarting the process in place to get back a GPU whose CUDA context was lost.
 *
 * After a sticky error (a kernel's illegal address, say) no CUDA call of this process can use
 * that GPU again: cudaDeviceReset returns success, but every later call fails with
 * cudaErrorDevicesUnavailable (so it goes on the H200 with driver 580 and CUDA 13), as NVIDIA
 * documents for cudaErrorIllegalAddress ("the process must be terminated and relaunched").
 * So the device worker hands its batches back, the daemon drains like on SIGTERM, keeping its
 * listening sockets open, and executes itself again with the same arguments: same PID, same
 * sockets, the jobs in the store. What must outlive the exec (each device's reset count, the
 * listening sockets' numbers) goes through the environment. */
#pragma once

#include <stdbool.h>

/* Reads, then clears, what the previous process left in the environment. Call once at start,
 * before any thread exists. */
void restart_init(void);
/* The listening sockets the previous process handed over (checked to be listening sockets),
 * -1 for none. */
void restart_listeners(int *ret_tcp, int *ret_local);
/* Times device `device` (a CUDA ordinal) was reset since the daemon was first started. */
int restart_device_resets(int device);
/* From any thread: counts a reset of `device` and asks the main thread for a restart
 * (SIGUSR1, which it waits for with sigwait), once per process. */
void restart_request(int device);
/* Executes this program again with argv, handing over the listening sockets tcp and local
 * (-1 for none) and what restart_init reads. Call once every other thread has ended: it
 * changes the environment. Returns only on failure, with a negative errno. */
int restart_exec(char *const argv[], int tcp, int local);
