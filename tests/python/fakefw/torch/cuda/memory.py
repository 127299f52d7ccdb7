"""torch.cuda.memory stand-in: the recorder and the snapshot, in PyTorch's shapes."""
_recording = False


def _record_memory_history(enabled="all", context="all", stacks="all", **kw):
    global _recording
    _recording = enabled is not None


def _snapshot():
    from . import _blocks

    segs = []
    for ptr, (size, in_use, frames) in sorted(_blocks.items()):
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
    return {"segments": segs}
