/* bench_pause.h - MICROBENCH_PAUSE=1 for scripts/bench/microbench.c and
 * gpu_microbench.c: gpuguard's books paused (gpuguard_bench_set_books(0), a benchmark
 * aid), so hooked - raw is what a paused hook still costs, the part of gpuguard the
 * in-process A/B training measurement cannot see (docs/performance.md). Needs
 * <dlfcn.h>, <stdlib.h>, <string.h> included first. */
#ifndef BENCH_PAUSE_H
#define BENCH_PAUSE_H

/* 1 paused, 0 not asked, -1 asked but the loaded gpuguard has no switch (or none). */
static int pause_books(void)
{
    const char *e = getenv("MICROBENCH_PAUSE");
    if (e == NULL || strcmp(e, "1") != 0) return 0;
    int (*set)(int) = (int (*)(int))dlsym(RTLD_DEFAULT, "gpuguard_bench_set_books");
    if (set == NULL) return -1;
    set(0);
    return 1;
}

#endif
