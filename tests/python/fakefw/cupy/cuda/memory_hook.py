"""cupy.cuda.memory_hook stand-in, as CuPy 14 has it: each thread's hooks in an
OrderedDict made by get_memory_hooks(); a hook is entered with `with` (its name must be
new); _has_memory_hooks() stays true on a thread once get_memory_hooks() ran there."""
import collections
import threading

_local = threading.local()


def _has_memory_hooks():
    return getattr(_local, "hooks", None) is not None


def get_memory_hooks():
    hooks = getattr(_local, "hooks", None)
    if hooks is None:
        hooks = _local.hooks = collections.OrderedDict()
    return hooks


class MemoryHook:
    name = "MemoryHook"

    def __enter__(self):
        hooks = get_memory_hooks()
        if self.name in hooks:
            raise RuntimeError("Memory hook %s already exists" % self.name)
        hooks[self.name] = self
        return self

    def __exit__(self, *exc):
        del get_memory_hooks()[self.name]

    def alloc_preprocess(self, **kw):
        pass

    def alloc_postprocess(self, **kw):
        pass

    def malloc_preprocess(self, **kw):
        pass

    def malloc_postprocess(self, **kw):
        pass

    def free_preprocess(self, **kw):
        pass

    def free_postprocess(self, **kw):
        pass
