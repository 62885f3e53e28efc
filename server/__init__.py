"""The kernelloop service: the tools, the job queue and the history behind a FastAPI app."""
