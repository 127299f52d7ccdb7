"""jax.profiler stand-in: device_memory_profile() as gzipped pprof, one sample per
live buffer (locations: its Python frames, innermost first; labels kind=buffer)."""
import gzip


def _varint(x):
    out = bytearray()
    while True:
        b = x & 0x7F
        x >>= 7
        out.append(b | (0x80 if x else 0))
        if not x:
            return bytes(out)


def _field(n, v):
    if isinstance(v, int):
        return _varint(n << 3) + _varint(v)
    return _varint((n << 3) | 2) + _varint(len(v)) + v


def device_memory_profile(backend=None):
    from . import _buffers

    strings = [""]

    def s(x):
        if x not in strings:
            strings.append(x)
        return strings.index(x)

    out = b""
    funcs, locs = {}, {}
    for nbytes, frames in _buffers.values():
        ids = []
        for file, line, name in frames:
            fkey = (file, name)
            if fkey not in funcs:
                funcs[fkey] = len(funcs) + 1
                out += _field(5, _field(1, funcs[fkey]) + _field(2, s(name)) + _field(4, s(file)))
            lkey = (fkey, line)
            if lkey not in locs:
                locs[lkey] = len(locs) + 1
                line_msg = _field(1, funcs[fkey]) + _field(2, line)
                out += _field(4, _field(1, locs[lkey]) + _field(4, line_msg))
            ids.append(locs[lkey])
        packed = b"".join(_varint(i) for i in ids)
        values = _varint(1) + _varint(nbytes)
        label = _field(1, s("kind")) + _field(2, s("buffer"))
        out += _field(2, _field(1, packed) + _field(2, values) + _field(3, label))
    for x in strings:
        out += _field(6, x.encode())
    return gzip.compress(out)
