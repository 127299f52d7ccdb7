/*
 * gg_burst.h - allocations as fast as a loop can for a while, for the programs that
 * test GPUGUARD_STACK_RATE (gg.c, gg_obs.c; both link the driver).
 */
#ifndef GG_BURST_H
#define GG_BURST_H

#include "gg_common.h"

/* CLOCK_MONOTONIC in milliseconds. */
static inline long long mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Allocations of 4 KiB, kept, as fast as a loop can for at least `ms` milliseconds
 * and until the loop has run densely for 300 ms in a row: every 10 ms of it held at
 * least 10 allocations, so each of GPUGUARD_STACK_RATE's 100 ms windows there held
 * 100 or more, four times the default rate's 25, whatever the scheduler did before.
 * A loaded machine can leave the loop off the CPU for a window at a time, and a
 * window after an empty one is captured whole; this waits for a stretch the
 * sampler must thin. At most 30 s. Returns how many. */
__attribute__((noinline, noclone)) static int burst_for(long ms)
{
    long long start = mono_ms(), end = start + ms, give_up = start + 30000;
    long long slot = start / 10, dense_since = start;
    int n = 0, in_slot = 0;
    for (;;) {
        for (int i = 0; i < 8; i++, n++, in_slot++) {
            CUdeviceptr p;
            if (cuMemAlloc_v2(&p, 4096) != CUDA_SUCCESS) return -n - 1;
        }
        long long now = mono_ms();
        if (now / 10 != slot) {
            /* A slot that closed thin, or slots skipped while off the CPU, restart
             * the stretch. */
            if (in_slot < 10 || now / 10 > slot + 1) dense_since = now;
            slot = now / 10;
            in_slot = 0;
        }
        if ((now >= end && now - dense_since >= 300) || now >= give_up) break;
    }
    __asm__ volatile("" ::: "memory");
    return n;
}

#endif
