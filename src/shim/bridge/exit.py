# ---- at exit ---------------------------------------------------------------------


def _gg_at_exit():
    # Python's atexit runs while the interpreter is still whole: the exit report's
    # classification is taken here, before the C-level exit report is written. From
    # here on the timer thread and the queued main-thread calls do nothing: the
    # interpreter's teardown runs no window work of gpuguard's.
    _gg_state["exiting"] = True
    try:
        t0 = time.perf_counter()
        pairs = json.loads(_gg_pending_pairs())
        if pairs:
            _gg_submit("resolved\n" + json.dumps(_gg_resolve(pairs)))
        res = _gg_classify_now({"devices": json.loads(_gg_devices())}, at_exit=True)
        res["cost"] = _gg_cost(t0)
        _gg_answer("exit", res)
    except Exception:
        pass
