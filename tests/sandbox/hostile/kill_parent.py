# Killing the parent: the judge (its parent, which it may kill: the job then fails), the service by its pid,
# everything it may signal (kill -1). The service must live on (the test checks): in its pid namespace it sees none.
import signal

try:
    os.kill(os.getppid(), signal.SIGKILL)  # the judge: the verdict becomes a failure, never a pass
except OSError:
    pass
attempt("kill_service_pid", lambda: os.kill(__SERVICE_PID__, signal.SIGKILL) or "sent")
report()
try:
    os.kill(-1, signal.SIGKILL)  # every process it may signal: in its namespace, none but itself
except ProcessLookupError:
    pass
