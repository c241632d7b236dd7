#!/usr/bin/env python3
"""Run a command and write its resource use, measured with wait4(2) (getrusage of the child):

    rusage.py OUT_FILE TIMEOUT_SECS COMMAND [ARGS...]

OUT_FILE gets one line `wall_secs user_secs sys_secs max_rss_kb minor_faults`. CPU comes from wait4's
rusage (microseconds, unlike /usr/bin/time's 10 ms). The peak RSS comes from /usr/bin/time
(`%M`), which runs the command for us: a child's ru_maxrss includes the memory of the
process it was forked from until it execs, so measured from here it could never be below
this Python interpreter's ~14 MB; /usr/bin/time's floor is ~1 MB. /usr/bin/time's own CPU
(about a millisecond) is included. The command's exit status is passed on; after
TIMEOUT_SECS it is killed and this exits 124, like timeout(1).
"""
import os
import signal
import subprocess
import sys
import time


def main():
    out, limit, cmd = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
    timed_out = False

    def kill(_signum, _frame):
        nonlocal timed_out
        timed_out = True
        os.killpg(child.pid, signal.SIGKILL)

    start = time.monotonic()
    rss_file = out + ".rss"
    # Without /usr/bin/time (Debian's `time` package) the peak RSS falls back to wait4's
    # ru_maxrss below, with its ~14 MB floor.
    timer = ["/usr/bin/time", "-f", "%M", "-o", rss_file] if os.access("/usr/bin/time", os.X_OK) else []
    child = subprocess.Popen([*timer, *cmd], start_new_session=True)
    signal.signal(signal.SIGALRM, kill)
    signal.setitimer(signal.ITIMER_REAL, limit)
    # Blocks without polling (no CPU taken from the measured client); an interrupted
    # wait4 is retried after the handler.
    _pid, status, ru = os.wait4(child.pid, 0)
    signal.setitimer(signal.ITIMER_REAL, 0)
    wall = time.monotonic() - start
    try:
        with open(rss_file) as f:
            # The last line; /usr/bin/time writes "Command exited with non-zero status" first.
            rss = int(f.read().split()[-1])
        os.unlink(rss_file)
    except (OSError, ValueError, IndexError):
        rss = ru.ru_maxrss
    with open(out, "w") as f:
        f.write(f"{wall:.4f} {ru.ru_utime:.6f} {ru.ru_stime:.6f} {rss} {ru.ru_minflt}\n")
    if timed_out:
        sys.exit(124)
    sys.exit(os.waitstatus_to_exitcode(status) & 0xFF if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))


if __name__ == "__main__":
    main()
