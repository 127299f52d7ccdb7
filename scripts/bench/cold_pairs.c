/*
 * cold_pairs.c - what gpuguard adds to a runtime pool alloc+free pair when the program
 * does real work between its allocations, as PyTorch's backend:cudaMallocAsync does
 * (~28 us of framework code a pair in a training step). The tight-loop microbenchmark
 * (microbench.c) keeps gpuguard's data in the CPU's L1; here, between calls, the
 * program touches WORK_KB of its own memory, so each hook finds its data where a real
 * program leaves it.
 *
 * Each iteration frees the oldest of LIVE blocks and allocates a new one
 * (cudaFreeAsync/cudaMallocAsync through the simulated runtime, which reaches the
 * driver through the cuGetProcAddress table as the real one does), with the work
 * before each call. Blocks of ITERS iterations alternate books on and paused
 * (gpuguard_bench_set_books) in ABBA order; the work alone is timed in the same
 * order, so each block's "calls" time is block - work. Prints the median over
 * ROUNDS of (on - paused) ns a pair, and its range.
 *
 *   cc -O2 -I tests/sim -o cold_pairs scripts/bench/cold_pairs.c -L<sim> -lcudart -ldl
 *   SIMCUDA_MEM=$((1<<40)) SIMCUDA_DEVICES=1 LD_LIBRARY_PATH=<sim> \
 *     LD_PRELOAD=target/release/libgpuguard.so ./cold_pairs
 *   env: WORK_KB (512), LIVE (256), ITERS (4000), ROUNDS (15)
 */
#define _GNU_SOURCE
#include "cudart_sim.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static size_t work_bytes;
static volatile uint64_t *work_buf;
static size_t work_pos;

/* Touches a window of the work buffer: a read and a write every cache line. */
static void work(void)
{
    size_t lines = work_bytes / 64;
    for (size_t i = 0; i < lines; i++) {
        size_t j = ((work_pos + i) % (4 * lines)) * 8;
        work_buf[j] += 1;
    }
    work_pos += lines / 3;
}

/* A build with the hook-timing feature: gpuguard's own time per hook phase. */
#define PHASES 15
#define HOOK_VALUES (2 * PHASES * 2 + 1)
static uint64_t hook_base[HOOK_VALUES];

static size_t read_hook_times(uint64_t *v)
{
    size_t (*times)(uint64_t *, size_t) =
        (size_t (*)(uint64_t *, size_t))dlsym(RTLD_DEFAULT, "gpuguard_bench_hook_times");
    if (!times || times(NULL, 0) != HOOK_VALUES) return 0;
    return times(v, HOOK_VALUES);
}

static void print_hook_times(void)
{
    static const char *names[PHASES] = {"rt_alloc_pre", "rt_alloc_post", "drv_alloc_pre", "drv_alloc_real",
                                        "drv_alloc_post", "rt_free_pre", "rt_free_post", "drv_free_pre",
                                        "drv_free_real", "drv_free_post", "rec_python", "rec_native",
                                        "rec_site", "rec_book", "rec_memo"};
    uint64_t v[HOOK_VALUES] = {0};
    if (read_hook_times(v) != HOOK_VALUES || v[HOOK_VALUES - 1] == 0) return;
    for (int i = 0; i < HOOK_VALUES - 1; i++) v[i] -= hook_base[i];
    double per_ns = (double)v[HOOK_VALUES - 1] / 1e6;
    for (int p = 0; p < 2; p++) {
        printf("HOOKTIMES books=%s", p ? "paused" : "on");
        for (int i = 0; i < PHASES; i++) {
            uint64_t c = v[(p * PHASES + i) * 2], n = v[(p * PHASES + i) * 2 + 1];
            printf(" %s=%.1f", names[i], n ? (double)c / per_ns / (double)n : 0.0);
        }
        printf("\n");
    }
}

static long env_or(const char *k, long d)
{
    const char *v = getenv(k);
    return v ? atol(v) : d;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(void)
{
    long work_kb = env_or("WORK_KB", 512), live = env_or("LIVE", 256);
    long iters = env_or("ITERS", 4000), rounds = env_or("ROUNDS", 15);
    work_bytes = (size_t)work_kb * 1024;
    /* The buffer is 4x the window, so consecutive windows differ (as a program's do). */
    work_buf = calloc(work_bytes ? work_bytes * 4 / 8 : 1, 8);
    int (*set_books)(int) = (int (*)(int))dlsym(RTLD_DEFAULT, "gpuguard_bench_set_books");
    void **blocks = calloc((size_t)live, sizeof(void *));
    size_t sizes[] = {4096, 65536, 512, 1 << 20, 2048, 16384};
    for (long i = 0; i < live; i++)
        if (cudaMallocAsync(&blocks[i], sizes[i % 6], 0) != cudaSuccess) return 1;
    long slot = 0, n = 0;
    double *on = calloc((size_t)rounds, sizeof(double)), *off = calloc((size_t)rounds, sizeof(double));
    double *delta = calloc((size_t)rounds, sizeof(double));
    for (long r = -1; r < rounds; r++) { /* round -1 warms up */
        for (int k = 0; k < 2; k++) {
            int books = (r & 1) ? k : 1 - k;
            if (set_books) set_books(books);
            uint64_t t0 = now_ns();
            for (long i = 0; i < iters; i++) {
                work();
                if (cudaFreeAsync(blocks[slot], 0) != cudaSuccess) return 2;
                work();
                if (cudaMallocAsync(&blocks[slot], sizes[n++ % 6], 0) != cudaSuccess) return 3;
                slot = (slot + 1) % live;
            }
            uint64_t t1 = now_ns();
            if (r >= 0) (books ? on : off)[r] = (double)(t1 - t0) / (double)iters;
        }
        if (r >= 0) delta[r] = on[r] - off[r];
        else read_hook_times(hook_base);
    }
    if (set_books) set_books(1);
    print_hook_times();
    qsort(delta, (size_t)rounds, sizeof(double), cmp_d);
    qsort(on, (size_t)rounds, sizeof(double), cmp_d);
    qsort(off, (size_t)rounds, sizeof(double), cmp_d);
    printf("cold_pairs work_kb=%ld live=%ld iters=%ld rounds=%ld shim=%s on=%.0f paused=%.0f "
           "added=%.0f ns/pair [%.0f..%.0f] q1=%.0f q3=%.0f\n",
           work_kb, live, iters, rounds, set_books ? "yes" : "no", on[rounds / 2], off[rounds / 2],
           delta[rounds / 2], delta[0], delta[rounds - 1], delta[rounds / 4], delta[3 * rounds / 4]);
    return 0;
}
