"""The real modelstate-server on a free loopback port, for the Python
tests: started with its own data directory, restarted on the same address,
killed and cleaned up."""

import ctypes
import os
import shutil
import signal
import subprocess
import tempfile
import time


def _die_with_parent():
    """Runs in the child before exec: SIGKILL when the test process dies,
    so a test that fails before its cleanup leaves no server behind."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class Server:
    """modelstate-server (the binary at `binary`) on 127.0.0.1."""

    def __init__(self, binary, *flags, root=None):
        """`root`: the directory its own (data, log) goes under; the
        system's temporary directory by default."""
        self.binary = binary
        self.flags = list(flags)
        self.dir = tempfile.mkdtemp(prefix="modelstate-py-", dir=root)
        self.log = open(os.path.join(self.dir, "server.log"), "w")
        self.address = None
        self.start()

    def start(self):
        """Starts the server; a restart keeps its address and data."""
        ready = os.path.join(self.dir, "ready")
        if os.path.exists(ready):
            os.remove(ready)
        self.process = subprocess.Popen(
            [self.binary, "--listen=" + (self.address or "127.0.0.1:0"),
             "--ready_file=" + ready,
             "--data_dir=" + os.path.join(self.dir, "data")] + self.flags,
            stderr=self.log, preexec_fn=_die_with_parent)
        deadline = time.time() + 60
        while not os.path.exists(ready) or os.path.getsize(ready) == 0:
            if self.process.poll() is not None or time.time() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.02)
        with open(ready) as f:
            self.address = f.read().strip()

    def kill(self):
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self):
        self.kill()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
