/*
 * hello_gpu.c - a small "training loop" for trying gpuguard out.
 *
 * Each step allocates a weight-gradient buffer and some activations, frees
 * the activations and the gradients, and, every few steps, forgets a small
 * cache buffer: the kind of slow leak gpuguard is meant to point at.
 * Usage: hello_gpu [steps] (default 10). Links only the CUDA runtime.
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "cudart_sim.h"

#define MiB (1024ULL * 1024ULL)

static void check(cudaError_t e, const char *what)
{
    if (e != cudaSuccess) {
        fprintf(stderr, "hello_gpu: %s failed: %s\n", what, cudaGetErrorString(e));
        exit(1);
    }
}

/* Forgets its buffer on purpose: gpuguard should name this function. */
__attribute__((noinline)) static void *remember_batch_stats(size_t bytes)
{
    void *cache = NULL;
    check(cudaMalloc(&cache, bytes), "cudaMalloc(cache)");
    return cache;
}

int main(int argc, char **argv)
{
    int steps = argc > 1 ? atoi(argv[1]) : 10;
    int ndev = 0;
    check(cudaGetDeviceCount(&ndev), "cudaGetDeviceCount");
    check(cudaSetDevice(0), "cudaSetDevice");
    size_t free_b, total_b;
    check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
    printf("hello_gpu: %d device(s), %llu MiB each; training for %d steps\n", ndev,
           (unsigned long long)(total_b / MiB), steps);

    void *weights = NULL;
    check(cudaMalloc(&weights, 256 * MiB), "cudaMalloc(weights)");
    int leaked = 0;
    for (int s = 1; s <= steps; s++) {
        void *grads = NULL, *acts[3] = {NULL, NULL, NULL};
        check(cudaMalloc(&grads, 256 * MiB), "cudaMalloc(grads)");
        for (int i = 0; i < 3; i++)
            check(cudaMalloc(&acts[i], (size_t)(64 + 32 * i) * MiB), "cudaMalloc(activations)");
        if (s % 3 == 0) { /* the bug: a per-step cache nobody frees */
            (void)remember_batch_stats(8 * MiB);
            leaked++;
        }
        for (int i = 0; i < 3; i++) check(cudaFree(acts[i]), "cudaFree(activations)");
        check(cudaFree(grads), "cudaFree(grads)");
        check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
        printf("step %2d/%d: %4llu MiB in use\n", s, steps,
               (unsigned long long)((total_b - free_b) / MiB));
        fflush(stdout);
        usleep(100 * 1000); /* the "compute" of a step */
    }
    check(cudaFree(weights), "cudaFree(weights)");
    printf("done: %d cache buffer(s) of 8 MiB were never freed\n", leaked);
    return 0;
}
