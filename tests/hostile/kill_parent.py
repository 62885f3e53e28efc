# Killing the parent: the worker's parent, the service by its pid, everything it may signal (kill -1).
# The service must live on (the test checks): in its own pid namespace the worker sees none of them.
import signal

try:
    os.kill(os.getppid(), signal.SIGKILL)  # inside the namespace the parent is its init, deaf to this
except OSError:
    pass
attempt("kill_service_pid", lambda: os.kill(__SERVICE_PID__, signal.SIGKILL) or "sent")
report()
try:
    os.kill(-1, signal.SIGKILL)  # every process it may signal: in its namespace, none but itself
except ProcessLookupError:
    pass
