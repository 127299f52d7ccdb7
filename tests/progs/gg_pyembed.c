/*
 * gg_pyembed.c - a framework's worker thread in the manner of PyTorch's autograd
 * engine: the thread has a Python thread state (made once, the GIL then released)
 * but runs no Python, and allocates from deep native code.
 * Usage: gg_pyembed LIBPYTHON. Prints LEAK <addr> <bytes> and OK (gg_common.h).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <dlfcn.h>

#include "cudart_sim.h"

static int (*gil_ensure)(void);
static void *(*save_thread)(void);

/* Native depth between the thread's entry and the allocation. */
__attribute__((noinline)) static void *deep(int n, size_t bytes)
{
    if (n == 0) {
        void *p = NULL;
        if (cudaMalloc(&p, bytes) != cudaSuccess)
            exit(3);
        return p;
    }
    void *r = deep(n - 1, bytes);
    __asm__ volatile("" ::: "memory"); /* no tail call: every level keeps its frame */
    return r;
}

__attribute__((noinline)) static void *engine_thread_main(void)
{
    void *p = deep(12, 1 << 20);
    __asm__ volatile("" ::: "memory");
    return p;
}

static void *worker(void *arg)
{
    (void)arg;
    gil_ensure();  /* this thread now has a Python thread state, kept */
    save_thread(); /* and releases the GIL, as a framework's worker does */
    void *p = engine_thread_main();
    printf("LEAK %p %d\n", p, 1 << 20);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: gg_pyembed LIBPYTHON\n");
        return 2;
    }
    void *py = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
    if (!py) {
        fprintf(stderr, "gg_pyembed: %s\n", dlerror());
        return 2;
    }
    void (*init)(int) = (void (*)(int))dlsym(py, "Py_InitializeEx");
    gil_ensure = (int (*)(void))dlsym(py, "PyGILState_Ensure");
    save_thread = (void *(*)(void))dlsym(py, "PyEval_SaveThread");
    if (!init || !gil_ensure || !save_thread)
        return 2;
    init(0);
    save_thread(); /* the main thread releases the GIL for the worker */
    pthread_t t;
    if (pthread_create(&t, NULL, worker, NULL) != 0)
        return 2;
    pthread_join(t, NULL);
    printf("OK\n");
    fflush(stdout);
    exit(0); /* no finalization: the worker's thread state is left as it is */
}
