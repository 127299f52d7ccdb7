from . import memory_hook  # noqa: F401


class Device:
    def __init__(self, device=0):
        self.id = device

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
