"""A stand-in for JAX in gpuguard's tests: only its presence in sys.modules matters."""
