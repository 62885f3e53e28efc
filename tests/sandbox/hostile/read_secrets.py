# Reading secrets: the service's environment, other processes, the database, shadow, the canary file.
import glob


def other_environs():
    found = []
    for path in glob.glob("/proc/[0-9]*/environ"):
        try:
            data = open(path, "rb").read()
        except OSError:
            continue
        if b"__SECRET__" in data:
            found.append(path)
    if found:
        return found
    raise PermissionError("no process environment shows the secret")


def read(path):
    return open(path).read()[:80]


def own_environment():
    names = [name for name, value in os.environ.items() if "__SECRET__" in value]
    if names:
        return names
    raise LookupError("not in the environment")


def host_tmp():
    if os.path.exists("__TMP_MARKER__"):
        return "the host's /tmp"
    raise LookupError("a /tmp of its own")


attempt("own_environment", own_environment)
attempt("other_processes", other_environs)
attempt("database", lambda: read("__DATABASE__"))
attempt("canary_file", lambda: read("__CANARY__"))
attempt("shadow", lambda: read("/etc/shadow"))
attempt("dotenv", lambda: read("__DOTENV__"))
attempt("host_tmp_listing", host_tmp)
report()
