/*
 * gg_inline.c - an -O2 program whose allocating function is always inlined
 * (tests/symbols.rs builds it with -O2 -g). Its report must still name that
 * function, at its own line, before the function it was inlined into, at the line
 * of the call. Usage: gg_inline. Prints LEAK and OK (gg_common.h).
 */
#include "gg_common.h"

static inline __attribute__((always_inline)) CUdeviceptr open_table(size_t bytes)
{
    CUdeviceptr p = 0;
    MUST(cuMemAlloc_v2(&p, bytes)); /* GG-INLINED-ALLOC */
    return p;
}

/* A real function (not inlined, not cloned) that open_table is inlined into. */
__attribute__((noinline, noclone)) CUdeviceptr load_table(size_t bytes)
{
    CUdeviceptr p = open_table(bytes); /* GG-INLINED-CALL */
    __asm__ volatile("" ::: "memory"); /* keeps the call from becoming a jump */
    return p;
}

int main(void)
{
    gg_setup(0);
    CUdeviceptr p = load_table(3 * MiB);
    leak_line(p, 3 * MiB);
    puts("OK");
    return 0;
}
