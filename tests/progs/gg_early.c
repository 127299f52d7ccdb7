/*
 * gg_early.c - linked with libgg_early.so, whose constructor allocated 1 MiB before
 * gpuguard's constructor ran. Then: 64 MiB, which GPUGUARD_CAP may refuse.
 */
#include "gg_common.h"

extern unsigned long long gg_early_ptr;
extern int gg_early_rc;

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    rc_line("early", gg_early_rc);
    alloc_line(gg_early_ptr, 1 << 20, 0, "device");
    leak_line(gg_early_ptr, 1 << 20);
    CUdeviceptr p = 0;
    int rc = cuMemAlloc_v2(&p, 64 << 20);
    rc_line("big", rc);
    if (rc == 0) cuMemFree_v2(p);
    puts("OK");
    return 0;
}
