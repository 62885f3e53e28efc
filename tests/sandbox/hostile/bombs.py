# Resource bombs: a fork bomb, a memory bomb, file descriptors until none are left. Each must stop at a
# limit (an error in the attack) without taking the host with it.
import resource
import time

children = []


def fork_bomb():
    while len(children) < 100000:
        pid = os.fork()
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        children.append(pid)
        if len(children) == 1:
            reached("forked its first child")
    return f"{len(children)} processes"


def memory_bomb():
    reached("asking for 30 GiB")
    block = bytearray(30 << 30)
    return f"{len(block)} bytes"


def fd_bomb():
    handles = [open("/dev/null")]
    reached("opened its first file")
    while len(handles) < 1000000:
        handles.append(open("/dev/null"))
    return f"{len(handles)} files"


attempt("fork_bomb", fork_bomb)
for pid in children:
    os.kill(pid, 9)
for pid in children:
    os.waitpid(pid, 0)
attempt("memory_bomb", memory_bomb)
attempt("fd_bomb", fd_bomb)
report()
