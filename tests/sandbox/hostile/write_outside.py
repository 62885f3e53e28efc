# Writing outside the job: host /tmp, the project, the virtualenv (.pth), the build cache, a shipped problem, a
# folder the sandbox shows read-only, the host's /dev/shm.
import site


def write(path):
    with open(path, "w") as handle:
        handle.write("planted by a submission\n")
    return path


attempt("canary_folder", lambda: write("__CANARY_DIR__/planted.txt"))
attempt("project", lambda: write("__PROJECT__/planted.py"))
attempt("virtualenv_pth", lambda: write(os.path.join(site.getsitepackages()[0], "planted.pth")))
attempt("build_cache", lambda: write("__CACHE_DIR__/planted"))
attempt("shipped_problem", lambda: write("__SHIPPED_PROBLEM__"))
attempt("read_only_folder", lambda: write("__READ_ONLY__/planted.txt"))
write("/dev/shm/__SHM_NAME__")  # allowed, in the sandbox's own /dev/shm: the test checks the host's has no such file
reached("wrote a file in its own /dev/shm")
report()
