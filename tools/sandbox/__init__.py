"""The sandbox: the bubblewrap view, seccomp, limits, cgroups, and the worker round trip."""
