"""torch.cuda.memory stand-in: the recorder and the snapshot, in PyTorch's shapes.

_record_memory_history(enabled=None) stops recording; blocks allocated while it
recorded keep their stacks ("frames") until freed, as PyTorch's blocks keep their
context_when_allocated. _snapshot() lists segments with their blocks; a small-pool
segment's unused tail is one inactive block."""
_recording = False
_context = None


def _record_memory_history(enabled="all", context="all", stacks="all", max_entries=None, **kw):
    global _recording, _context
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
