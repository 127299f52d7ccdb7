"""torch.cuda.memory stand-in: the recorder and the snapshot, in PyTorch's shapes.

_record_memory_history(enabled=None) stops recording; blocks allocated while it
recorded keep their stacks ("frames") until freed, as PyTorch's blocks keep their
context_when_allocated. _snapshot() lists segments with their blocks; a small-pool
segment's unused tail is one inactive block.

Like PyTorch's (torch/csrc/cuda/memory_snapshot.cpp), turning the recorder on adds a
RecordFunction callback for user annotations, by default to the calling thread's own
callbacks (global_record_annotations=False), and turning it off removes it from the
calling thread's: from another thread PyTorch does not find it and prints its warning
("Requested callback is not found", record_function.cpp) on stderr."""
import sys
import threading

_recording = False
_context = None
# The thread whose callbacks hold the annotation callback (0: global; None: none).
_annotations = None


def _record_memory_history(
    enabled="all", context="all", stacks="all", max_entries=None, global_record_annotations=False, **kw
):
    global _recording, _context, _annotations
    if enabled is not None:
        if _annotations is None:
            _annotations = 0 if global_record_annotations else threading.get_ident()
    elif _annotations is not None:
        if _annotations not in (0, threading.get_ident()):
            sys.stderr.write(
                "[W1205 00:00:00.000000000 record_function.cpp:255] Warning: Requested callback is not found\n"
            )
        _annotations = None
    _recording = enabled is not None and context is not None
    _context = context if _recording else None


def _snapshot():
    from . import SEGMENT, _blocks, _segments

    segs = []
    by_seg = {}
    for ptr, b in sorted(_blocks.items()):
        if b[3] is not None:
            by_seg.setdefault(b[3], []).append((ptr, b))
    for base, (used, _unused) in sorted(_segments.items()):
        blocks = []
        for ptr, (size, in_use, frames, _seg) in by_seg.get(base, []):
            blocks.append(
                {
                    "address": ptr,
                    "size": size,
                    "state": "active_allocated" if in_use else "inactive",
                    "frames": frames,
                }
            )
        if used < SEGMENT:
            blocks.append({"address": base + used, "size": SEGMENT - used, "state": "inactive", "frames": []})
        segs.append({"device": 0, "address": base, "total_size": SEGMENT, "blocks": blocks})
    for ptr, (size, in_use, frames, seg) in sorted(_blocks.items()):
        if seg is not None:
            continue
        segs.append(
            {
                "device": 0,
                "address": ptr,
                "total_size": size,
                "blocks": [
                    {
                        "address": ptr,
                        "size": size,
                        "state": "active_allocated" if in_use else "inactive",
                        "frames": frames,
                    }
                ],
            }
        )
    segs.sort(key=lambda s: s["address"])
    return {"segments": segs}
