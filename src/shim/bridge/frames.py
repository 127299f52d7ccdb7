# ---- the calling thread's Python stack, read by the hooks without the GIL ------------
#
# A hook may read its own thread's frame chain without the GIL: only that thread
# changes it, and it is inside the hook. What it needs is the layout of CPython's
# thread state and frames for this interpreter, found here once by looking at live
# objects whose addresses are known (id()), then checked on a deeper chain. The hook
# keeps (code object address, bytecode offset) per frame; _gg_resolve turns those
# into file:line later, while the code objects are alive.


def _gg_word(addr):
    import ctypes

    return ctypes.c_void_p.from_address(addr).value or 0


def _gg_find(base, span, want, step=8):
    for off in range(0, span, step):
        if _gg_word(base + off) == want:
            return off
    return None


def _gg_calibrate():
    """The frame layout as a dict for the hooks, or {"error": why}."""
    import ctypes

    ctypes.pythonapi.PyThreadState_Get.restype = ctypes.c_void_p
    tstate = ctypes.pythonapi.PyThreadState_Get()
    return _gg_calibrate_in(tstate, sys._getframe(0))


def _gg_calibrate_in(tstate, me):
    parent, grand = me.f_back, me.f_back.f_back
    if grand is None:
        return {"error": "calibration needs three Python frames"}
    if sys.version_info >= (3, 11):
        # PyFrameObject: head (16), f_back, f_frame (the interpreter frame).
        iframe = _gg_word(id(me) + 24)
        iparent = _gg_word(id(parent) + 24)
        igrand = _gg_word(id(grand) + 24)
        code_off = _gg_find(iframe, 96, id(me.f_code))
        prev_off = _gg_find(iframe, 96, iparent)
        if code_off is None or prev_off is None:
            return {"error": "interpreter frame layout not recognized"}
        # tstate -> current frame: directly (3.13) or through a _PyCFrame (3.11, 3.12).
        lay = _gg_scan_tstate(tstate)
        if lay is not None and not _gg_check_tstate(tstate, lay):
            return {"error": "thread state check failed"}
        if lay is None:
            return {"error": "thread state layout not recognized"}
        # The instruction pointer of a suspended frame (the parent, inside its call)
        # points into its own code object's bytecode.
        pcode = id(parent.f_code)
        pend = pcode + parent.f_code.__sizeof__()
        instr_off = None
        for off in range(0, 96, 8):
            w = _gg_word(iparent + off)
            if pcode < w < pend and off != code_off:
                instr_off = off
                break
        if instr_off is None:
            return {"error": "instruction pointer not found"}
        base = _gg_word(iparent + instr_off) - pcode - parent.f_lasti
        owner_off = _gg_owner(iframe, prev_off, code_off, me)
        if owner_off is None:
            return {"error": "entry frames not recognized"}
        lay.update(mode=1, code_off=code_off, prev_off=prev_off, instr_off=instr_off, base=base,
                   owner_off=owner_off)
        # Check: the grandparent read through the layout agrees with Python.
        if _gg_word(igrand + code_off) != id(grand.f_code):
            return {"error": "frame chain check failed"}
        if _gg_word(igrand + instr_off) - id(grand.f_code) - base != grand.f_lasti:
            return {"error": "bytecode offset check failed"}
        if _gg_word(iparent + prev_off) != igrand:
            return {"error": "frame link check failed"}
        return lay
    # 3.10: the thread state points at frame objects, which hold code, back, lasti;
    # the current one is this function's own while only C is called (a call of a
    # Python function would push its frame).
    import ctypes

    here = id(sys._getframe(0))
    ts_off = None
    for off in range(0, 512, 8):
        if ctypes.c_void_p.from_address(tstate + off).value == here:
            ts_off = off
            break
    code_off = _gg_find(id(me), 128, id(me.f_code))
    back_off = _gg_find(id(me), 128, id(parent))
    if None in (ts_off, code_off, back_off):
        return {"error": "frame object layout not recognized"}
    lasti_off = None
    for off in range(0, 160, 4):
        v = ctypes.c_int.from_address(id(parent) + off).value
        w = ctypes.c_int.from_address(id(grand) + off).value
        if v * 2 == parent.f_lasti and v > 0 and w * 2 == grand.f_lasti:
            lasti_off = off
            break
    if lasti_off is None:
        return {"error": "f_lasti not found"}
    return {"mode": 2, "ts_off": ts_off, "ts_deref": -1, "code_off": code_off, "prev_off": back_off,
            "instr_off": lasti_off, "base": 0}


def _gg_owner(iframe, prev_off, code_off, me):
    """Where an interpreter frame says who owns it (3.12+), -1 where the chain has
    only frames of code (3.11), None if neither holds. The chain from here runs
    through the interpreter's own entry frame of this pending call (owned by the C
    stack: 3) on its way to the program's frames; skipping the frames so marked must
    leave exactly the code of Python's own f_back chain."""
    import ctypes

    want = []
    f = me
    while f is not None and len(want) < 48:
        want.append(id(f.f_code))
        f = f.f_back
    chain = []
    p = iframe
    while p and len(chain) < 64:
        chain.append(p)
        p = _gg_word(p + prev_off)
    codes = [_gg_word(p + code_off) for p in chain]
    if sys.version_info < (3, 12):
        return -1 if codes[: len(want)] == want else None
    for off in range(64, 80):
        owners = [ctypes.c_ubyte.from_address(p + off).value for p in chain]
        if 3 not in owners or any(o > 3 for o in owners):
            continue
        kept = [c for c, o in zip(codes, owners) if o != 3]
        if kept[: len(want)] == want:
            return off
    return None


def _gg_scan_tstate(tstate):
    """Where the thread state keeps the current interpreter frame. The current frame
    is this function's own while it reads memory through ctypes (C calls push no
    Python frame), so nothing here may call a Python function."""
    import bisect
    import ctypes

    # Only addresses inside readable mappings are followed: a field that is not a
    # pointer must not crash the program.
    starts, ends = [], []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) > 1 and parts[1].startswith("r"):
                lo, hi = parts[0].split("-")
                starts.append(int(lo, 16))
                ends.append(int(hi, 16))
    V = ctypes.c_void_p
    find = bisect.bisect_right
    here = V.from_address(id(sys._getframe(0)) + 24).value
    for off in range(0, 512, 8):
        if V.from_address(tstate + off).value == here:
            return {"ts_off": off, "ts_deref": -1}
    for off in range(0, 512, 8):
        p = V.from_address(tstate + off).value
        if not p or p % 8:
            continue
        i = find(starts, p) - 1
        if i < 0 or p + 16 > ends[i]:
            continue
        for k in (0, 8):
            if V.from_address(p + k).value == here:
                return {"ts_off": off, "ts_deref": k}
    return None


def _gg_check_tstate(tstate, lay):
    """Reads the current frame through the layout from another depth; as above,
    only C calls here."""
    import ctypes

    V = ctypes.c_void_p
    here = V.from_address(id(sys._getframe(0)) + 24).value
    p = V.from_address(tstate + lay["ts_off"]).value or 0
    if lay["ts_deref"] >= 0 and p:
        p = V.from_address(p + lay["ts_deref"]).value or 0
    return p == here


def _gg_line(code, off):
    for start, end, line in code.co_lines():
        if start <= off < end:
            return line
    return code.co_firstlineno


def _gg_resolve(pairs):
    """[[code address, bytecode offset], ...] -> [[address, offset, text or None]]:
    code objects are found in every thread's frames, then among live functions."""
    want = {p[0] for p in pairs}
    codes = {}

    def add(c):
        if id(c) in want and id(c) not in codes:
            codes[id(c)] = c
        for k in c.co_consts:
            if type(k) is type(c):
                add(k)

    for f in sys._current_frames().values():
        while f is not None:
            add(f.f_code)
            f = f.f_back
    if len(codes) < len(want):
        import gc
        import types

        for o in gc.get_objects():
            if type(o) is types.FunctionType:
                add(o.__code__)
    out = []
    for addr, off in pairs:
        c = codes.get(addr)
        if c is None:
            out.append([addr, off, None])
        else:
            name = getattr(c, "co_qualname", c.co_name)
            out.append([addr, off, "%s:%d in %s" % (c.co_filename, _gg_line(c, off), name)])
    return out


def _gg_resolve_now(args):
    _gg_answer("resolved", _gg_resolve(args.get("pairs", [])))


