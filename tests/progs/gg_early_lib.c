/*
 * gg_early_lib.c - libgg_early.so: a library whose constructor allocates device
 * memory, so a gpuguard hook runs before gpuguard's own constructor (the program's
 * libraries are initialized before a preloaded one).
 */
#include "gg_common.h"

unsigned long long gg_early_ptr;
int gg_early_rc = -1;

__attribute__((constructor)) static void gg_early_init(void)
{
    CUcontext c;
    if (cuInit(0) != 0 || cuDevicePrimaryCtxRetain(&c, 0) != 0 || cuCtxSetCurrent(c) != 0) return;
    CUdeviceptr p = 0;
    gg_early_rc = cuMemAlloc_v2(&p, 1 << 20);
    gg_early_ptr = p;
}
