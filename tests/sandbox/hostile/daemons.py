# Leaving something behind: a double-forked daemon in its own session, and a child in its own process group
# (as ninja starts each compiler), both meant to outlive the job. The test looks for them afterwards.
import subprocess
import time

if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execvp("sleep", ["sleep", "__MARK__"])
    os._exit(0)
subprocess.Popen(["sleep", "__MARK__"], start_new_session=True)
subprocess.Popen(["sleep", "__MARK__"], process_group=0)
time.sleep(1)
report()
