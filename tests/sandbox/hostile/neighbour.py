# Two jobs side by side: one leaves marks where a process can leave them (a file in /tmp and in /dev/shm, a SysV
# shared memory segment, an abstract unix socket and a loopback listener, a file in its job folder, itself as a
# process), then waits; the other, started while it waits, looks for each mark. __ROLE__ is `plant` or `seek`.
# The planting job looks for its own marks with the same probes first: a probe that cannot find a mark where it is
# proves nothing of the sandbox that hides it from the neighbour.
import ctypes
import socket
import threading
import time

TOKEN = "__TOKEN__"
SHM_KEY = __SHM_KEY__
IPC_CREAT = 0o1000
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p


def os_error():
    code = ctypes.get_errno()
    return OSError(code, os.strerror(code))


def read(path):
    with open(path) as handle:
        return handle.read()


def shared_memory():
    segment = libc.shmget(SHM_KEY, 0, 0)
    if segment < 0:
        raise os_error()
    address = libc.shmat(segment, None, 0o10000)  # SHM_RDONLY
    if address in (None, ctypes.c_void_p(-1).value):
        raise os_error()
    return ctypes.string_at(address, len(TOKEN)).decode()


def connect(address, family):
    with socket.socket(family, socket.SOCK_STREAM) as client:
        client.settimeout(5)
        client.connect(address)
        return client.recv(64).decode()


def process_in(folder):
    """A process whose working folder is `folder`, among the processes this job's /proc lists."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/cwd") == folder:
                return f"pid {pid}"
        except OSError:
            continue
    raise Refused(f"no process of the {len(list(filter(str.isdigit, os.listdir('/proc'))))} listed works there")


def probe(folder, port):
    """Each of the marks a job planted with its folder `folder`, looked for from here."""
    attempt("tmp_file", lambda: read(f"/tmp/kl-neighbour-{TOKEN}"))
    attempt("shm_file", lambda: read(f"/dev/shm/kl-neighbour-{TOKEN}"))
    attempt("sysv_shared_memory", shared_memory)
    attempt("abstract_socket", lambda: connect(f"\0kl-neighbour-{TOKEN}", socket.AF_UNIX))
    attempt("loopback_listener", lambda: connect(("127.0.0.1", port), socket.AF_INET))
    attempt("job_folder_file", lambda: read(f"{folder}/kl-neighbour-{TOKEN}"))
    attempt("job_folder_listing", lambda: sorted(os.listdir(folder)))
    attempt("process", lambda: process_in(folder))


def answer(server):
    while True:
        peer, _ = server.accept()
        peer.sendall(TOKEN.encode())
        peer.close()


def plant():
    here = os.getcwd()
    for path in (f"/tmp/kl-neighbour-{TOKEN}", f"/dev/shm/kl-neighbour-{TOKEN}", f"{here}/kl-neighbour-{TOKEN}"):
        with open(path, "w") as handle:
            handle.write(TOKEN)
    segment = libc.shmget(SHM_KEY, 4096, IPC_CREAT | 0o666)
    if segment < 0:
        raise os_error()
    ctypes.memmove(libc.shmat(segment, None, 0), TOKEN.encode(), len(TOKEN))
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    abstract.bind(f"\0kl-neighbour-{TOKEN}")
    loopback = socket.create_server(("127.0.0.1", 0))
    for server in (abstract, loopback):
        server.listen()
        threading.Thread(target=answer, args=(server,), daemon=True).start()
    port = loopback.getsockname()[1]
    probe(here, port)  # the control: every mark found from where it was planted
    report()
    reached(f"planted, port {port}")
    # the sign the host waits for: the neighbour starts once it is there
    with open(f"{here}/kl-neighbour-{TOKEN}.ready", "w") as handle:
        handle.write(f"{port}\n")
    deadline = time.monotonic() + 600
    while not os.path.exists(f"{here}/kl-neighbour-done") and time.monotonic() < deadline:
        time.sleep(0.1)
    reached("told the neighbour is done" if time.monotonic() < deadline else "waited in vain")


if "__ROLE__" == "plant":
    plant()
else:
    reached(f"looking from {os.getcwd()} for the marks of a job in __FOLDER__")
    probe("__FOLDER__", __PORT__)
    report()
