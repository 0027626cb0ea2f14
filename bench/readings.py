"""What a bench reads of this machine while it measures: processes by name, their CPU
seconds and resident memory (sampled), and what a log file gained."""
import os
import sys
import threading


def pids(comm):
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if open(f"/proc/{pid}/comm").read().strip() == comm:
                    found.append(int(pid))
            except OSError:
                pass
    return found


def cpu_seconds(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class Usage:
    """Peak RSS (largest process) and CPU seconds (all together) of the processes named
    COMM (or of the PIDS given), from now until stop()."""

    def __init__(self, comm, given=None):
        self.pids = given if given is not None else pids(comm)
        if not self.pids:
            sys.exit(f"bench: no process named {comm} is running")
        self.cpu0 = {p: cpu_seconds(p) for p in self.pids}
        self.peak = 0.0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.sample, daemon=True)
        self.thread.start()

    def sample(self):
        while not self.done.is_set():
            self.peak = max([self.peak] + [rss_mib(p) for p in self.pids])
            self.done.wait(0.1)

    def stop(self):
        self.done.set()
        self.thread.join()
        return self.peak, sum(cpu_seconds(p) - c for p, c in self.cpu0.items())


class LogTail:
    """What a log file gained since it was opened."""

    def __init__(self, path):
        self.path = path
        self.start = os.path.getsize(path)

    def lines(self):
        if os.path.getsize(self.path) < self.start:
            sys.exit(f"bench: {self.path} was rotated during a measurement; run again")
        with open(self.path, "rb") as f:
            f.seek(self.start)
            return f.read().decode(errors="replace").splitlines()
