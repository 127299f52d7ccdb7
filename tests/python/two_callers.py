"""gpuguard's memo test: one function allocates at one line, called through two
callers and from two lines of one caller, in turn, so every capture is made at the
same stack depth and innermost frame and instruction (one memo key); only the outer
frames tell the three apart.

  two_callers.py N   (N allocations of each kind, kept)
"""
import sys

from simrt import malloc

KEEP = []
MiB = 1 << 20


def leaf(n):
    return malloc(n)  # LEAF-LINE


def from_a(n):
    return leaf(n)  # A-LINE


def from_b(n):
    return leaf(n)  # B-LINE


for i in range(int(sys.argv[1])):
    KEEP.append(from_a(MiB))  # A1-CALL
    KEEP.append(from_b(2 * MiB))  # B-CALL
    KEEP.append(from_a(3 * MiB))  # A3-CALL
print("OK", flush=True)
