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

/* Allocations of 4 KiB, kept, as fast as a loop can for `ms` milliseconds (past
 * GPUGUARD_STACK_RATE's first window of 100 ms, most are sampled out); how many. */
__attribute__((noinline, noclone)) static int burst_for(long ms)
{
    long long end = mono_ms() + ms;
    int n = 0;
    while (mono_ms() < end) {
        for (int i = 0; i < 64; i++, n++) {
            CUdeviceptr p;
            if (cuMemAlloc_v2(&p, 4096) != CUDA_SUCCESS) return -n - 1;
        }
    }
    __asm__ volatile("" ::: "memory");
    return n;
}

#endif
