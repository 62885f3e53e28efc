# Reading secrets: the service's environment, other processes, the database, shadow, the canary file, a .env
# in a folder the sandbox shows (the project's), the host's /tmp.
import glob


def other_environs():
    paths = glob.glob("/proc/[0-9]*/environ")
    readable = 0
    found = []
    for path in paths:
        try:
            data = open(path, "rb").read()
        except OSError:
            continue
        readable += 1
        if b"__SECRET__" in data:
            found.append(path)
    reached(f"read {readable} of {len(paths)} process environments")
    if found:
        return found
    raise Refused(f"none of the {readable} environments it could read holds the secret")


def read(path):
    return open(path).read()[:80]


def read_for_secret(path):
    if os.path.exists(path):
        reached(f"found {path}")
    text = open(path).read()
    if "__SECRET__" in text:
        return text[:80]
    raise Refused(f"{path} reads as {len(text)} bytes without the secret")


def own_environment():
    reached(f"looked through {len(os.environ)} variables of its own")
    names = [name for name, value in os.environ.items() if "__SECRET__" in value]
    if names:
        return names
    raise Refused("not in its environment")


def host_tmp():
    reached(f"listed a /tmp of {len(os.listdir('/tmp'))} entries")
    if os.path.exists("__TMP_MARKER__"):
        return "the host's /tmp"
    raise Refused("a /tmp of its own")


attempt("own_environment", own_environment)
attempt("other_processes", other_environs)
attempt("database", lambda: read("__DATABASE__"))
attempt("canary_file", lambda: read("__CANARY__"))
attempt("shadow", lambda: read("/etc/shadow"))
attempt("dotenv", lambda: read_for_secret("__DOTENV__"))
attempt("host_tmp_listing", host_tmp)
report()
