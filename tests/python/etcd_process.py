"""A real etcd (Debian's etcd-server) on free loopback ports, for the
cluster test and benchmark: started in its own directory, restartable on
the same ports and data, killed with the test process."""

import os
import shutil
import socket
import subprocess
import tempfile
import time

import server_process


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Etcd:
    """Debian's etcd on two free loopback ports, in its own directory."""

    def __init__(self, tls=None):
        """tls: {"cert", "key", "ca"} (PEM paths) to serve clients over
        TLS, requiring client certificates signed by "ca"."""
        self.tls = tls
        self.dir = tempfile.mkdtemp(prefix="modelstate-etcd-")
        self.client_port, self.peer_port = free_port(), free_port()
        self.endpoint = "127.0.0.1:%d" % self.client_port
        self.log = open(os.path.join(self.dir, "etcd.log"), "w")
        self.start()

    def start(self):
        scheme = "https" if self.tls else "http"
        client = "%s://127.0.0.1:%d" % (scheme, self.client_port)
        peer = "http://127.0.0.1:%d" % self.peer_port
        tls = []
        if self.tls:
            tls = ["--cert-file", self.tls["cert"], "--key-file",
                   self.tls["key"], "--trusted-ca-file", self.tls["ca"],
                   "--client-cert-auth"]
        self.process = subprocess.Popen(
            ["etcd", "--name", "t", "--data-dir",
             os.path.join(self.dir, "data"),
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", "t=" + peer] + tls,
            stdout=self.log, stderr=subprocess.STDOUT,
            preexec_fn=server_process._die_with_parent)
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.client_port),
                                              timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("etcd did not start")

    def stop(self):
        self.process.kill()
        self.process.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
