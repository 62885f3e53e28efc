# Killing the parent: the judge (its parent, which has no number in the runner's pid namespace), the
# service by its pid (in its pid namespace it sees none), everything it may signal (kill -1).
import signal

judge = the_judge()
reached(f"found the judge, pid {judge}")
attempt("kill_judge", lambda: os.kill(judge, signal.SIGKILL) or "sent")
attempt("kill_service_pid", lambda: os.kill(__SERVICE_PID__, signal.SIGKILL) or "sent")
attempt("kill_everything", lambda: os.kill(-1, signal.SIGKILL) or "sent")
report()
