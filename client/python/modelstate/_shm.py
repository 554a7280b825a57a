"""State_dict bytes through a shared-memory ring, for a client on the
server's host.

Each Client makes, on its first transfer, one memfd of 4096 + SLOTS *
SLOT_BYTES bytes (sealed against growing and shrinking, not against
writes), maps it, and registers it once on the server's Unix-domain socket
(SCM_RIGHTS); the server answers a token. A GetStateDict or LoadStateDict
that names the token moves its bytes through the ring's slots, each chunk
announced by a `ring_bytes` message, instead of as data messages: the
pages are made once and reused by every transfer, and each byte is copied
once by each side. The first 8 bytes of the memfd count the chunks the
consumer has finished. The wire format is that of
proto/modelstate/v1/model_state_service.proto (SharedMemoryRing).

A GetStateDict may skip the ring's copy: the client lists in the ring
where each entry's bytes go in its own memory (a direct table: bytes 8 to
15 hold its answer), and the server writes them there itself, announcing
each stretch with a `direct_bytes` message; it uses the slots instead where
the kernel does not let it write this process's memory.
"""

import ctypes
import fcntl
import mmap
import os
import platform
import socket
import struct
import threading
import time
import weakref

import grpc

from .v1 import model_state_service_pb2 as pb

_BOOT_ID = "/proc/sys/kernel/random/boot_id"
# The ring: 4 slots of 8 MiB after a 4 KiB page that holds `consumed`.
SLOTS = 4
SLOT_BYTES = 8 << 20
HEADER_BYTES = 4096
_SEALS = fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK
# How long a producer waits for its consumer to free a slot.
WAIT_S = 10.0
# The direct table's answer meaning "through the slots instead".
DIRECT_DECLINED = (1 << 64) - 1
# Python has no memory barrier, and two of the client's stores must not
# become visible before the accesses that precede them: a direct table's
# count after its entries, and a received slot's `consumed` after the loads
# that copied it out (or the server would refill the slot under them).
# x86-64 never reorders a store with earlier loads or stores; elsewhere
# (aarch64 may do both) GetStateDict uses data messages. LoadStateDict's
# producer side needs no barrier: it writes a slot only after it read the
# `consumed` that frees it, a dependency every CPU keeps in order.
STORES_IN_ORDER = platform.machine() in ("x86_64", "AMD64")

# What this process moved through rings: the tests read these to tell that
# a transfer took the shared-memory path.
registrations = 0  # rings registered (again, after a server forgot one)
calls = 0          # calls that named a ring
chunks_in = 0      # ring chunks received (GetStateDict)
chunks_out = 0     # ring chunks handed to gRPC (LoadStateDict)
direct_in = 0      # bytes the server wrote straight into this process
direct_stretches = 0  # the direct_bytes messages announcing them
# Buffers a server kept writing into after their call ended (it did not
# stop when asked): kept for the life of the process.
abandoned = []


class Unreachable(OSError):
    """The server's socket could not be reached or broke off: the bytes go
    over gRPC instead."""


class Refused(Exception):
    """The server's socket answered without the token asked for; str() is
    the server's error text (or what was wrong with the answer)."""


class Stalled(Exception):
    """The other side of a ring left a slot unread for WAIT_S seconds."""


def wanted(shared_memory):
    """Whether a Client created with `shared_memory` may use it: not when
    the environment says MODELSTATE_SHARED_MEMORY=0, nor where Python cannot
    pass file descriptors."""
    off = os.environ.get("MODELSTATE_SHARED_MEMORY", "").strip().lower() \
        in ("0", "false", "no", "off")
    return bool(shared_memory) and not off and hasattr(socket, "send_fds") \
        and hasattr(os, "memfd_create")


def names_ring(error, code):
    """Whether the grpc.RpcError `error` is `code` about the ring (the
    server forgot its token, or another call holds it)."""
    return error.code() == code and \
        "shared_memory_ring" in (error.details() or "")


# ---------------------------------------------------------- discovery ----
def socket_path(client):
    """The server's shared-memory socket when `client` may use it, else "".
    Asked once per Client: the server's answer does not change while it
    runs, and a server without the call (UNIMPLEMENTED) or any failure
    means data messages."""
    if client._shm_path is None:
        client._shm_path = _discover(client) if client._shared_memory else ""
    return client._shm_path


def give_up(client):
    """Data messages from now on for `client`: its ring could not be made
    or registered (another container, another user, a server that says
    no)."""
    client._shm_path = ""


def _discover(client):
    try:
        info = client._stub.GetSharedMemoryInfo(
            pb.GetSharedMemoryInfoRequest(), timeout=client._timeout,
            metadata=client._metadata)
    except grpc.RpcError:
        return ""
    # Same boot id: the same kernel, so a memfd passed over the socket is
    # memory both sides share; the path must also be visible here (not in
    # another mount namespace).
    if info.socket_path and info.boot_id == _boot_id() and \
            os.path.exists(info.socket_path):
        return info.socket_path
    return ""


def _boot_id():
    try:
        with open(_BOOT_ID) as f:
            return f.read().strip()
    except OSError:
        return None


# --------------------------------------------------------------- ring ----
class Ring:
    """A mapped, sealed memfd of `slots` slots of `slot_bytes` bytes after
    the page holding `consumed`; one transfer at a time holds `lock`."""

    def __init__(self, slots=SLOTS, slot_bytes=SLOT_BYTES):
        self.slots = slots
        self.slot_bytes = slot_bytes
        self.token = None
        self._registration = None  # the socket whose closing unregisters
        self.lock = threading.Lock()
        self.closing = False  # close() once the transfer holding it ends
        self.pid = os.getpid()  # a forked child makes a ring of its own
        self._fd = os.memfd_create("modelstate-ring",
                                   os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        # A ring whose Client was dropped without close(): its memfd (and
        # the up to 32 MiB it holds) goes when the ring is collected, not
        # when the process ends.
        self._close_fd = weakref.finalize(self, os.close, self._fd)
        try:
            size = HEADER_BYTES + slots * slot_bytes
            os.ftruncate(self._fd, size)
            fcntl.fcntl(self._fd, fcntl.F_ADD_SEALS, _SEALS)
            self._map = mmap.mmap(self._fd, size, mmap.MAP_SHARED,
                                  mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            self._close_fd()
            raise
        self._view = memoryview(self._map)
        # One aligned 8-byte load or store (struct would go byte by byte):
        # the other side never sees half a count.
        self._consumed = ctypes.c_uint64.__ctype_le__.from_buffer(self._map)
        # The direct table's words: its answer, the server's "writing" flag,
        # the last call this client stopped, and its current call.
        self._direct = ctypes.c_uint64.__ctype_le__.from_buffer(self._map, 8)
        self._writing = ctypes.c_uint64.__ctype_le__.from_buffer(self._map,
                                                                 16)
        self._stopped = ctypes.c_uint64.__ctype_le__.from_buffer(self._map,
                                                                 24)
        self._call = ctypes.c_uint64.__ctype_le__.from_buffer(self._map, 32)
        self.direct_call = 0

    def register(self, path, timeout):
        """Hands the memfd to the server's socket at `path`; keeps the
        token. Raises Unreachable or Refused as _answer."""
        global registrations
        message = b"R" + self.slots.to_bytes(4, "little") + \
            self.slot_bytes.to_bytes(4, "little")
        self.token = None
        self._drop_registration()
        sock = _connected(path, timeout)
        try:
            _exchange(socket.send_fds, sock, [message], [self._fd])
            token, fds = _answer(sock, 16)
        except BaseException:
            sock.close()
            raise
        for extra in fds:
            os.close(extra)
        # The server keeps the ring while this connection stays open.
        self._registration = sock
        self.token = token
        registrations += 1
        return token

    def _drop_registration(self):
        if self._registration is not None:
            self._registration.close()
            self._registration = None

    def slot(self, i):
        """The memoryview of the slot of chunk `i`."""
        start = HEADER_BYTES + (i % self.slots) * self.slot_bytes
        return self._view[start:start + self.slot_bytes]

    @property
    def consumed(self):
        return self._consumed.value

    @consumed.setter
    def consumed(self, n):
        self._consumed.value = n

    def begin_direct_call(self):
        """Before a call that may offer a direct table: no answer yet, and
        the call's number (one more than the last), kept in direct_call."""
        self._direct.value = 0
        self.direct_call = self._call.value + 1
        self._call.value = self.direct_call
        return self.direct_call

    def stop_direct(self, call):
        """For a call that ends before the server said it wrote
        everything: tells the server to write nothing more for `call`, then
        waits until no write is in progress (only then may the memory the
        table named be freed). False when the server still wrote after
        WAIT_S: that memory must be kept for good."""
        self._stopped.value = call
        # The store must be seen before `writing` is read (the server
        # stores `writing`, then reads this word). Python has no fence; a
        # sleep is a trip through the kernel's scheduler, which is one.
        time.sleep(0.001)
        deadline = time.monotonic() + WAIT_S
        while self._writing.value != 0:
            if time.monotonic() > deadline:
                return False
            time.sleep(20e-6)
        return True

    def offer_direct(self, targets):
        """Writes the direct table, (address, length) per header entry, and
        answers with its size; or declines (False) when it is empty or does
        not fit in the slots."""
        if not targets or len(targets) > self.slots * self.slot_bytes // 16:
            self._direct.value = DIRECT_DECLINED
            return False
        flat = [n for target in targets for n in target]
        struct.pack_into(f"<{len(flat)}Q", self._map, HEADER_BYTES, *flat)
        self._direct.value = len(targets)
        return True

    def decline_direct(self):
        self._direct.value = DIRECT_DECLINED

    def wait_free(self, i, stopped):
        """Waits until chunk `i` may be written (consumed >= i + 1 - slots).
        False when `stopped()` turns true first; Stalled after WAIT_S."""
        need = i + 1 - self.slots
        if self._consumed.value >= need:
            return True
        deadline = None
        spins = 0
        while self._consumed.value < need:
            if stopped():
                return False
            if spins < 100:  # the consumer is usually a copy away
                spins += 1
                time.sleep(0)
                continue
            now = time.monotonic()
            if deadline is None:
                deadline = now + WAIT_S
            elif now > deadline:
                raise Stalled(f"the server left ring slot {i % self.slots} "
                              f"unread for {WAIT_S:g} seconds")
            time.sleep(50e-6)
        return True

    def close(self):
        """Unregisters (the server forgets the ring when the registration's
        connection closes), unmaps and closes the memfd. Idempotent."""
        self._drop_registration()
        if self._fd < 0:
            return
        self._consumed = None
        self._direct = self._writing = self._stopped = self._call = None
        self._view.release()
        try:
            self._map.close()
        except BufferError:  # a slot view still alive: unmapped when freed
            pass
        self._close_fd()
        self._fd = -1


def take(client):
    """The client's ring, registered and held (release() it), or None:
    no shared memory here, another thread's transfer holds the ring (this
    call then goes over gRPC), or no ring can be made or registered (and
    none will be tried again for this client)."""
    path = socket_path(client)
    if not path:
        return None
    with client._shm_setup:
        ring = client._shm_ring
        if ring is not None and ring.pid != os.getpid():
            ring = None  # the parent's, after a fork: not ours to touch
        if ring is None:
            try:
                ring = client._shm_ring = Ring()
            except OSError:
                give_up(client)
                return None
    if not ring.lock.acquire(blocking=False):
        return None
    if ring.closing:  # the client was closed meanwhile
        release(ring)
        return None
    if ring.token is None and not register(client, ring):
        ring.lock.release()
        return None
    return ring


def register(client, ring):
    """Registers `ring` (again) with the client's server; False (and no
    shared memory for this client from then on) when that fails."""
    try:
        ring.register(client._shm_path, client._timeout)
        return True
    except (Unreachable, Refused):
        give_up(client)
        return False


def release(ring):
    """Ends the hold take() gave; frees the ring if its client was closed
    meanwhile."""
    if ring.closing:
        ring.close()
    ring.lock.release()


def close(client):
    """Frees the client's ring (Client.close): now, or when the transfer
    holding it ends."""
    with client._shm_setup:
        ring, client._shm_ring = client._shm_ring, None
        give_up(client)
    if ring is None or ring.pid != os.getpid():
        return
    ring.closing = True
    if ring.lock.acquire(blocking=False):
        try:
            ring.close()
        finally:
            ring.lock.release()


# ------------------------------------------------------------- socket ----
def _connected(path, timeout):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        _exchange(sock.connect, path)
    except BaseException:
        sock.close()
        raise
    return sock


def _exchange(operation, *args):
    """operation(*args), an OSError on the socket raised as Unreachable."""
    try:
        return operation(*args)
    except OSError as error:
        raise Unreachable(str(error)) from error


def _answer(sock, size):
    """The `size` bytes after the server's status byte 0 and the file
    descriptors that came with them; after another status byte, Refused
    with the server's text (the rest of the stream)."""
    data, fds = b"", []
    try:
        while len(data) < 1 + size:
            more, got, _, _ = _exchange(socket.recv_fds, sock,
                                        1 + size - len(data), 1)
            fds += got
            if not more:
                raise Unreachable(f"the server's socket closed after "
                                  f"{len(data)} of {1 + size} bytes")
            data += more
            if data[0] != 0:
                raise Refused(_error_text(sock, data[1:]))
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return data[1:], fds


def _error_text(sock, start):
    text = [start]
    while True:
        more = _exchange(sock.recv, 4096)
        if not more:
            break
        text.append(more)
    return b"".join(text).decode("utf-8", "replace").strip() or \
        "the server refused without a reason"
