"""Builds: the toolchain, the build cache, the object and header caches, the nvcc driver, diagnostics."""
