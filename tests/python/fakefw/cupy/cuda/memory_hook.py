"""cupy.cuda.memory_hook stand-in: hooks are per thread, entered with `with`."""
import threading

_local = threading.local()


def _hooks():
    return list(getattr(_local, "hooks", {}).values())


class MemoryHook:
    name = "MemoryHook"

    def __enter__(self):
        hooks = getattr(_local, "hooks", None)
        if hooks is None:
            hooks = _local.hooks = {}
        if self.name in hooks:
            raise RuntimeError("hook %s already exists" % self.name)
        hooks[self.name] = self
        return self

    def __exit__(self, *exc):
        del _local.hooks[self.name]
