"""The judge: the worker's entry point, the phases and their session, checking, timing, the L2 reset."""
