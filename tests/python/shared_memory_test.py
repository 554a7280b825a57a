"""The same-host shared-memory ring of state_dict transfers, against the
real server and real PyTorch: GetSharedMemoryInfo names a socket in the
data directory; each Client registers one ring there once, and
state_dict(), pull(), push() and load_state_dict() pass their bytes through
its slots (counted by the client, so a silent fallback to data messages
fails the test) with the same bits and the same load semantics as over
gRPC, also when the chunks wrap around the ring many times; a ring the
server forgot is registered again; the opt-outs never touch the socket; a
server without shared memory, a socket that cannot be reached or that says
no, or a ring held by another thread's transfer means gRPC; and the server
refuses forged tokens, unsealed memfds, bad ring geometries, ring_bytes
without a ring, data mixed into a ring load and two calls on one ring.

Run by ctest: /usr/bin/python3 shared_memory_test.py SERVER_BINARY PACKAGE_DIR
"""

import collections
import contextlib
import ctypes
import fcntl
import gc
import os
import socket
import stat
import sys
import tempfile
import threading
import time
import unittest

SERVER = sys.argv[1]
sys.path.insert(0, sys.argv[2])
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
del sys.argv[1:3]

import grpc  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

import modelstate  # noqa: E402
from modelstate import _shm  # noqa: E402
from modelstate.v1 import model_state_service_pb2 as pb  # noqa: E402
from modelstate.v1 import model_state_service_pb2_grpc as pb_grpc  # noqa: E402,E501
import server_process  # noqa: E402

PAGE = 4096


def setUpModule():
    global server, plain, ms, ms_slots, ms_grpc
    server = server_process.Server(SERVER)
    plain = server_process.Server(SERVER, "--shared_memory=false")
    ms = modelstate.connect(server.address, progress=False)
    # Its state_dicts through the ring's slots, not written in directly.
    ms_slots = modelstate.connect(server.address, progress=False,
                                  shared_memory_direct=False)
    ms_grpc = modelstate.connect(server.address, progress=False,
                                 shared_memory=False)


def tearDownModule():
    ms.close()
    ms_grpc.close()
    ms_slots.close()
    server.stop()
    plain.stop()


def this_boot_id():
    with open("/proc/sys/kernel/random/boot_id") as f:
        return f.read().strip()


def info(address):
    with grpc.insecure_channel(address) as channel:
        return pb_grpc.ModelStateServiceStub(channel).GetSharedMemoryInfo(
            pb.GetSharedMemoryInfoRequest(), timeout=10)


def model(seed):
    """Linear layers of about 6 MiB and a BatchNorm whose running stats
    and batch count no initializer would produce."""
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(),
                      nn.Linear(1024, 512), nn.BatchNorm1d(512))
    with torch.no_grad():
        m[3].running_mean.normal_()
        m[3].running_var.uniform_(0.5, 2.0)
        m[3].num_batches_tracked.fill_(seed + 7)
    return m


def big_model(seed):
    """About 90 MiB in entries of odd sizes (chunks end inside entries and
    entries inside chunks), every bit pattern random (NaN payloads too)."""
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(4099, 4093), nn.Linear(4093, 1531),
                      nn.Linear(1531, 7), nn.BatchNorm1d(7))
    with torch.no_grad():
        for t in m.state_dict().values():
            if t.dtype == torch.float32:
                t.view(torch.int32).random_()
        m[3].num_batches_tracked.fill_(seed)
    return m


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.detach().reshape(-1).view(torch.uint8),
        b.detach().reshape(-1).view(torch.uint8))


def state_bytes(state):
    return b"".join(t.detach().reshape(-1).view(torch.uint8).numpy()
                    .tobytes() for t in state.values())


@contextlib.contextmanager
def ring_uses():
    """Counts, while the block runs, the client's GetSharedMemoryInfo calls
    ("info"), its connections to a shared-memory socket ("connects"), the
    rings it registered, its calls that named a ring and the ring chunks
    it received and sent."""
    counts = collections.Counter()
    discover, connected = _shm._discover, _shm._connected
    before = (_shm.registrations, _shm.chunks_in, _shm.chunks_out,
              _shm.calls, _shm.direct_in, _shm.direct_stretches)

    def counted_discover(client):
        counts["info"] += 1
        return discover(client)

    def counted_connected(path, timeout):
        counts["connects"] += 1
        return connected(path, timeout)

    _shm._discover, _shm._connected = counted_discover, counted_connected
    try:
        yield counts
    finally:
        _shm._discover, _shm._connected = discover, connected
        counts["registrations"] = _shm.registrations - before[0]
        counts["chunks_in"] = _shm.chunks_in - before[1]
        counts["chunks_out"] = _shm.chunks_out - before[2]
        counts["calls"] = _shm.calls - before[3]
        counts["direct_in"] = _shm.direct_in - before[4]
        # Messages that brought bytes in, through the slots or written
        # straight into the tensors.
        counts["fetched"] = counts["chunks_in"] + \
            _shm.direct_stretches - before[5]


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("length", ctypes.c_size_t)]


def child_may_write_parent():
    """Whether the kernel lets a child of this process write its memory,
    as the server (a child of the tests) writes a client's."""
    libc = ctypes.CDLL(None, use_errno=True)
    target = ctypes.c_char(b"\0")
    parent = os.getpid()
    child = os.fork()
    if child == 0:
        one = ctypes.c_char(b"\1")
        local = _Iovec(ctypes.addressof(one), 1)
        remote = _Iovec(ctypes.addressof(target), 1)
        wrote = libc.process_vm_writev(parent, ctypes.byref(local), 1,
                                       ctypes.byref(remote), 1, 0)
        os._exit(0 if wrote == 1 else 1)
    _, status = os.waitpid(child, 0)
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def socket_exchange(path, message, fds=()):
    """Everything the server's socket answers to `message` (with `fds`),
    up to its end of the stream."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(path)
        socket.send_fds(sock, [message], list(fds))
        answer = []
        while True:
            more, got, _, _ = socket.recv_fds(sock, 4096, 4)
            for fd in got:
                os.close(fd)
            if not more:
                return b"".join(answer)
            answer.append(more)


def ring_memfd(size, seals):
    fd = os.memfd_create("shared-memory-test",
                         os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if seals:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


def registration(slots, slot_bytes):
    return b"R" + slots.to_bytes(4, "little") + \
        slot_bytes.to_bytes(4, "little")


class Checks(unittest.TestCase):

    def assertSameState(self, got, want):
        self.assertEqual(list(got), list(want))
        for key in want:
            self.assertTrue(same_bits(got[key], want[key]), key)

    def assertUntouched(self, counts):
        """No GetSharedMemoryInfo, no socket, no ring."""
        self.assertEqual([counts[k] for k in (
            "info", "connects", "registrations", "calls", "fetched",
            "chunks_out")], [0] * 6)

    def assertFetched(self, counts, at_least):
        """GetStateDict's bytes came through the ring, in at least
        `at_least` messages, where the client receives through it (x86-64:
        _shm.STORES_IN_ORDER); as data messages elsewhere."""
        if _shm.STORES_IN_ORDER:
            self.assertGreaterEqual(counts["fetched"], at_least)
        else:
            self.assertEqual(counts["fetched"], 0)

    def assertNoRing(self, counts):
        self.assertEqual([counts[k] for k in (
            "calls", "fetched", "chunks_out")], [0] * 3)

    def transfers(self, client, name):
        """A push, a state_dict, a load and a pull through `client`."""
        local = model(8)
        remote = client.push(local, name)
        self.assertSameState(remote.state_dict(), local.state_dict())
        remote.load_state_dict(model(9).state_dict())
        self.assertSameState(client.pull(name).state_dict(),
                             model(9).state_dict())


class InfoTest(Checks):

    def test_a_server_with_a_data_dir_names_its_socket_and_boot(self):
        answer = info(server.address)
        data_dir = os.path.join(server.dir, "data")
        self.assertTrue(answer.socket_path.startswith(data_dir + os.sep),
                        answer.socket_path)
        self.assertTrue(stat.S_ISSOCK(os.stat(answer.socket_path).st_mode))
        self.assertEqual(answer.boot_id, this_boot_id())

    def test_shared_memory_false_offers_no_socket(self):
        self.assertEqual(info(plain.address).socket_path, "")

    def test_a_client_asks_once_and_registers_once(self):
        name = "info/once"
        ms.push(model(1), name)
        with ring_uses() as counts:
            client = modelstate.connect(server.address, progress=False)
            try:
                for _ in range(3):
                    client.module(name).state_dict()
                client.module(name).load_state_dict(model(1).state_dict())
            finally:
                client.close()
        self.assertEqual(counts["info"], 1)
        self.assertEqual(counts["connects"], 1)
        self.assertEqual(counts["registrations"], 1)
        self.assertFetched(counts, 3)
        self.assertGreaterEqual(counts["chunks_out"], 1)

    def test_the_ring_is_one_mapping_for_the_clients_life(self):
        client = modelstate.connect(server.address, progress=False)
        ms.push(model(1), "info/ring")
        client.module("info/ring").state_dict()
        ring = client._shm_ring
        self.assertEqual((ring.slots, ring.slot_bytes),
                         (_shm.SLOTS, _shm.SLOT_BYTES))
        self.assertEqual(len(ring.token), 16)
        fd = ring._fd
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        self.assertEqual(seals & (fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK |
                                  fcntl.F_SEAL_WRITE),
                         fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK)
        self.assertEqual(os.fstat(fd).st_size,
                         PAGE + _shm.SLOTS * _shm.SLOT_BYTES)
        client.module("info/ring").load_state_dict(model(2).state_dict())
        self.assertIs(client._shm_ring, ring)
        client.close()
        self.assertIsNone(client._shm_ring)
        self.assertEqual(ring._fd, -1)  # closed and unmapped

    def test_a_client_dropped_without_close_frees_its_ring(self):
        def rings():
            links = []
            for fd in os.listdir("/proc/self/fd"):
                with contextlib.suppress(OSError):
                    links.append(os.readlink(f"/proc/self/fd/{fd}"))
            return sum("modelstate-ring" in link for link in links)

        ms.push(model(1), "info/dropped")
        gc.collect()
        before = rings()
        for _ in range(3):
            client = modelstate.connect(server.address, progress=False)
            client.pull("info/dropped")
            self.assertIsNotNone(client._shm_ring)
            del client  # no close()
        gc.collect()
        self.assertEqual(rings(), before)


class TransferTest(Checks):

    @classmethod
    def setUpClass(cls):
        cls.local = model(2)
        with ring_uses() as counts:
            cls.remote = ms.push(cls.local, "shm/mlp")
        cls.push_counts = counts

    def test_push_goes_through_the_ring(self):
        self.assertGreaterEqual(self.push_counts["chunks_out"], 1)
        self.assertSameState(ms_grpc.module("shm/mlp").state_dict(),
                             self.local.state_dict())

    def test_state_dict_is_the_same_bits_either_way(self):
        with ring_uses() as counts:
            fast = ms.module("shm/mlp").state_dict()
        self.assertFetched(counts, 1)
        with ring_uses() as counts:
            slow = ms_grpc.module("shm/mlp").state_dict()
        self.assertUntouched(counts)
        self.assertSameState(fast, self.local.state_dict())
        self.assertSameState(slow, self.local.state_dict())
        self.assertEqual(fast._metadata, slow._metadata)

    def test_state_dict_takes_data_messages_where_stores_may_reorder(self):
        """Where the CPU may make the client's store of `consumed` visible
        before the reads of the slot it frees (aarch64), GetStateDict takes
        data messages; a load still takes the ring."""
        saved = _shm.STORES_IN_ORDER
        _shm.STORES_IN_ORDER = False
        try:
            with ring_uses() as counts:
                got = ms.module("shm/mlp").state_dict()
                ms.module("shm/mlp").load_state_dict(got)
        finally:
            _shm.STORES_IN_ORDER = saved
        self.assertEqual(counts["fetched"], 0)
        self.assertEqual(counts["calls"], 1)  # the load's
        self.assertGreaterEqual(counts["chunks_out"], 1)
        self.assertSameState(got, self.local.state_dict())
        self.assertSameState(ms_grpc.module("shm/mlp").state_dict(),
                             self.local.state_dict())

    def test_parameters_buffers_a_submodule_view_and_a_dtype(self):
        remote = ms.module("shm/mlp")
        with ring_uses() as counts:
            params = dict(remote.named_parameters())
            buffers = dict(remote.named_buffers())
            bn = remote.get_submodule("3").state_dict()
            half = remote.state_dict(dtype=torch.float16)
        self.assertFetched(counts, 4)
        for name, p in self.local.named_parameters():
            self.assertTrue(same_bits(params[name], p), name)
            self.assertTrue(params[name].requires_grad)
        for name, b in self.local.named_buffers():
            self.assertTrue(same_bits(buffers[name], b), name)
        self.assertSameState(bn, self.local[3].state_dict())
        self.assertSameState(half, ms_grpc.module("shm/mlp").state_dict(
            dtype=torch.float16))

    def test_pull_is_the_same_module(self):
        with ring_uses() as counts:
            pulled = ms.pull("shm/mlp")
        self.assertFetched(counts, 1)
        self.assertIs(type(pulled), nn.Sequential)
        self.assertSameState(pulled.state_dict(), self.local.state_dict())
        self.assertSameState(ms_grpc.pull("shm/mlp").state_dict(),
                             self.local.state_dict())

    def test_load_state_dict_lands_bit_for_bit(self):
        remote = ms.push(model(3), "shm/load")
        new = model(4)
        with torch.no_grad():  # values no float rounding could produce
            new[0].weight.view(torch.int32).random_()
        with ring_uses() as counts:
            result = remote.load_state_dict(new.state_dict())
        self.assertGreaterEqual(counts["chunks_out"], 1)
        self.assertEqual(str(result), "<All keys matched successfully>")
        self.assertSameState(ms_grpc.module("shm/load").state_dict(),
                             new.state_dict())

    def test_load_errors_keep_pytorchs_texts_and_atomicity(self):
        remote = ms.push(model(5), "shm/errors")
        before = ms_grpc.module("shm/errors").state_dict()
        missing = collections.OrderedDict(model(6).state_dict())
        del missing["3.running_var"]
        unexpected = collections.OrderedDict(model(6).state_dict())
        unexpected["extra"] = torch.zeros(3)
        for label, sd in (("missing", missing), ("unexpected", unexpected)):
            with self.subTest(label):
                with self.assertRaises(RuntimeError) as theirs:
                    model(5).load_state_dict(sd)
                with ring_uses() as counts:
                    with self.assertRaises(RuntimeError) as ours:
                        remote.load_state_dict(sd)
                # The server may refuse the keys before it reads a chunk.
                self.assertEqual(counts["calls"], 1)
                self.assertEqual(str(ours.exception), str(theirs.exception))
                self.assertSameState(
                    ms_grpc.module("shm/errors").state_dict(), before)
        with ring_uses() as counts:
            result = remote.load_state_dict(unexpected, strict=False)
        self.assertGreaterEqual(counts["chunks_out"], 1)
        self.assertEqual(result, model(5).load_state_dict(unexpected,
                                                          strict=False))
        self.assertSameState(ms_grpc.module("shm/errors").state_dict(),
                             model(6).state_dict())

    def test_a_load_that_raises_on_the_way_raises_that_and_changes_nothing(
            self):
        """A progress callback that raises (at the first chunk or at the
        total) fails the load with its own exception, through the ring and
        over gRPC, and the server keeps what it had; a meta tensor's value
        fails as PyTorch's copy_() does."""
        class Stop(Exception):
            pass

        ms.push(model(5), "shm/raising")
        before = ms_grpc.module("shm/raising").state_dict()
        new = model(6).state_dict()
        for client in (ms, ms_grpc):
            for at_end in (False, True):
                with self.subTest(grpc=client is ms_grpc, at_end=at_end):
                    stop = Stop()

                    def progress(done, total):
                        if done == total or not at_end:
                            raise stop

                    with ring_uses() as counts:
                        with self.assertRaises(Stop) as raised:
                            client.module("shm/raising").load_state_dict(
                                new, progress=progress)
                    self.assertIs(raised.exception, stop)
                    self.assertEqual(counts["calls"], client is ms)
                    self.assertSameState(
                        ms_grpc.module("shm/raising").state_dict(), before)
            with self.subTest(grpc=client is ms_grpc, value="meta"):
                meta = collections.OrderedDict(new)
                meta["0.weight"] = meta["0.weight"].to("meta")
                with self.assertRaises(RuntimeError) as theirs:
                    model(5).load_state_dict(meta)
                with self.assertRaises(RuntimeError) as ours:
                    client.module("shm/raising").load_state_dict(meta)
                self.assertEqual(str(ours.exception), str(theirs.exception))
                self.assertSameState(
                    ms_grpc.module("shm/raising").state_dict(), before)

    def test_an_empty_load_needs_no_ring(self):
        remote = ms.build({"type": "ReLU"}, "shm/empty")
        with ring_uses() as counts:
            result = remote.load_state_dict({})
            self.assertEqual(list(remote.state_dict()), [])
        self.assertEqual(str(result), "<All keys matched successfully>")
        self.assertEqual(counts["chunks_out"], 0)

    def test_progress_reaches_the_total(self):
        calls = []
        with ring_uses() as counts:
            ms.module("shm/mlp").state_dict(
                progress=lambda done, total: calls.append((done, total)))
        self.assertFetched(counts, 1)
        total = calls[-1][1]
        self.assertEqual(calls[-1], (total, total))
        self.assertGreater(total, 6 << 20)
        calls.clear()
        ms.module("shm/mlp").load_state_dict(
            self.local.state_dict(),
            progress=lambda done, total: calls.append((done, total)))
        self.assertEqual(calls[-1], (total, total))


class WrapAroundTest(Checks):
    """Many chunks per transfer: each slot is filled and emptied again and
    again, in both directions."""

    @classmethod
    def setUpClass(cls):
        cls.local = big_model(20)
        cls.total = sum(t.numel() * t.element_size()
                        for t in cls.local.state_dict().values())
        with ring_uses() as counts:
            ms.push(cls.local, "wrap/big")
        cls.push_counts = counts

    def test_push_wraps_around(self):
        self.assertGreaterEqual(self.total, 2 * _shm.SLOTS * _shm.SLOT_BYTES)
        self.assertEqual(self.push_counts["chunks_out"],
                         -(-self.total // _shm.SLOT_BYTES))
        self.assertSameState(ms_grpc.module("wrap/big").state_dict(),
                             self.local.state_dict())

    @unittest.skipUnless(_shm.STORES_IN_ORDER,
                         "GetStateDict takes data messages off x86-64")
    def test_state_dict_wraps_around(self):
        with ring_uses() as counts:
            got = ms_slots.module("wrap/big").state_dict()
        self.assertGreater(counts["chunks_in"], 2 * _shm.SLOTS)
        self.assertEqual(counts["direct_in"], 0)
        self.assertSameState(got, self.local.state_dict())

    def test_state_dict_written_straight_into_the_tensors(self):
        """The server writes every byte where the direct table says: no
        slot is used, and the tensors own the memory it wrote. Where the
        kernel does not let it, the slots bring them; off x86-64, data
        messages."""
        with ring_uses() as counts:
            got = ms.module("wrap/big").state_dict()
            half = ms.module("wrap/big").state_dict(dtype=torch.float16)
        half_total = sum(
            t.numel() * (2 if t.is_floating_point() else t.element_size())
            for t in self.local.state_dict().values())
        if not _shm.STORES_IN_ORDER:
            self.assertEqual(counts["fetched"], 0)
        elif child_may_write_parent():
            self.assertEqual(counts["chunks_in"], 0)
            self.assertEqual(counts["direct_in"], self.total + half_total)
        else:
            self.assertEqual(counts["direct_in"], 0)
            self.assertGreater(counts["chunks_in"], 2 * _shm.SLOTS)
        self.assertSameState(got, self.local.state_dict())
        self.assertSameState(half, ms_grpc.module("wrap/big").state_dict(
            dtype=torch.float16))

    def test_pull_into_refreshes_a_module_in_place(self):
        """pull(into=) overwrites the module's own tensors: the same
        Parameter objects over the same memory, now holding the hosted
        bits; on this host the server writes them there itself (direct),
        through the slots or as messages where it may not."""
        want = self.local.state_dict()
        for client, how in ((ms, "direct"), (ms_slots, "slots"),
                            (ms_grpc, "messages")):
            with self.subTest(how):
                mine = big_model(21)
                before = [(id(t), t.data_ptr())
                          for t in mine.state_dict(keep_vars=True).values()]
                with ring_uses() as counts:
                    self.assertIs(client.pull("wrap/big", into=mine), mine)
                self.assertSameState(mine.state_dict(), want)
                self.assertEqual(
                    [(id(t), t.data_ptr())
                     for t in mine.state_dict(keep_vars=True).values()],
                    before)
                self.assertTrue(mine[0].weight.requires_grad)
                direct = how == "direct" and _shm.STORES_IN_ORDER and \
                    child_may_write_parent()
                self.assertEqual(counts["direct_in"],
                                 self.total if direct else 0)
                if how == "messages":
                    self.assertUntouched(counts)
        # dtype= converts on the server; a submodule refreshes its part.
        half = big_model(21).half()
        ms.pull("wrap/big", dtype=torch.float16, into=half)
        self.assertSameState(half.state_dict(), ms_grpc.module(
            "wrap/big").state_dict(dtype=torch.float16))
        mine = big_model(21)
        ms.module("wrap/big").get_submodule("1").pull(into=mine[1])
        self.assertSameState(mine[1].state_dict(), self.local[1].state_dict())
        self.assertFalse(same_bits(mine[0].weight, self.local[0].weight))

    def test_pull_into_refuses_a_module_that_does_not_fit(self):
        """Checked before any byte moves: PyTorch's texts for keys, the key
        named for a dtype, shape or layout; the module keeps its values."""
        mine = big_model(21)
        untouched = {k: v.clone() for k, v in mine.state_dict().items()}
        wider = nn.Sequential(*mine, nn.Linear(2, 2))
        with self.assertRaisesRegex(
                RuntimeError, r'Error\(s\) in loading state_dict for '
                r'Sequential:\n\tMissing key\(s\) in state_dict: '
                r'"4.weight", "4.bias"'):
            ms.pull("wrap/big", into=wider)
        with self.assertRaisesRegex(
                ValueError, r"into\['0.weight'\] is torch.float32 "
                r"\[4093, 4099\], the hosted entry torch.float16"):
            ms.pull("wrap/big", dtype=torch.float16, into=mine)
        mine[2].weight = nn.Parameter(mine[2].weight.detach().t()
                                      .contiguous().t())
        with self.assertRaisesRegex(ValueError, r"into\['2.weight'\] must "
                                    r"be a contiguous cpu tensor"):
            ms.pull("wrap/big", into=mine)
        with self.assertRaisesRegex(TypeError, "device="):
            ms.pull("wrap/big", into=mine, device="cpu")
        with self.assertRaisesRegex(TypeError, "torch.nn.Module"):
            ms.pull("wrap/big", into=mine.state_dict())
        # A module hosted on meta has no bytes to write: the server's
        # FAILED_PRECONDITION, not pull()'s meta fallback.
        self.assertSameState(mine.state_dict(), untouched)
        ms.push(big_model(22), "wrap/meta", device="meta")
        fits = big_model(21)
        with self.assertRaises(modelstate.FailedPreconditionError):
            ms.pull("wrap/meta", into=fits)
        self.assertSameState(fits.state_dict(), big_model(21).state_dict())

    def test_pull_into_keeps_ties(self):
        """A tied weight is one tensor under two keys: both entries are
        written into it (the same bytes), and it stays one tensor."""
        class Tied(nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = nn.Embedding(3000, 768)
                self.head = nn.Linear(768, 3000, bias=False)
                self.head.weight = self.emb.weight

        torch.manual_seed(5)
        hosted = Tied()
        ms.push(hosted, "wrap/tied")
        torch.manual_seed(6)
        mine = Tied()
        memory = mine.emb.weight.data_ptr()
        with ring_uses() as counts:
            ms.pull("wrap/tied", into=mine)
        self.assertIs(mine.head.weight, mine.emb.weight)
        self.assertEqual(mine.emb.weight.data_ptr(), memory)
        self.assertTrue(same_bits(mine.emb.weight, hosted.emb.weight))
        if _shm.STORES_IN_ORDER and child_may_write_parent():
            self.assertEqual(counts["direct_in"], 2 * 3000 * 768 * 4)

    def test_pull_into_offers_no_more_memory_than_a_tensor_has(self):
        """A header whose byte_length disagrees with its shape (a broken
        server) must not make the client offer memory past the tensor."""
        from modelstate import _pull
        from modelstate.v1 import tensor_pb2
        linear = nn.Linear(3, 2)

        class Remote:  # answers with a crafted header
            path = ""

            def _fetch(self, selection, *, target_dtype, progress, into):
                header = pb.StateDictHeader()
                for key, t in linear.state_dict().items():
                    header.entries.add(
                        key=key, dtype=tensor_pb2.DTYPE_FLOAT32,
                        shape=list(t.shape), byte_length=4 * t.numel())
                header.entries[0].byte_length += 4096
                into(header)

        with self.assertRaisesRegex(ValueError, r"the server gave 'weight' "
                                    r"4120 bytes, its shape and dtype need "
                                    r"24"):
            _pull._pull_into(Remote(), linear, None, None)

    @unittest.skipUnless(_shm.STORES_IN_ORDER,
                         "GetStateDict takes data messages off x86-64")
    def test_pull_and_load_wrap_around(self):
        new = big_model(21)
        with ring_uses() as counts:
            ms.module("wrap/big").load_state_dict(new.state_dict())
            pulled = ms_slots.pull("wrap/big")
        self.assertGreater(counts["chunks_out"], 2 * _shm.SLOTS)
        self.assertGreater(counts["chunks_in"], 2 * _shm.SLOTS)
        self.assertSameState(pulled.state_dict(), new.state_dict())
        self.assertSameState(ms_grpc.module("wrap/big").state_dict(),
                             new.state_dict())
        ms.module("wrap/big").load_state_dict(self.local.state_dict())

    def test_a_forgotten_token_in_a_load_that_fills_the_ring(self):
        """The server refuses the token while the client waits for a free
        slot: the wait ends with the call, the ring is registered again and
        the load done again."""
        client = modelstate.connect(server.address, progress=False)
        try:
            client.module("wrap/big").state_dict()
            client._shm_ring.token = b"\x5c" * 16
            new = big_model(22)
            started = time.monotonic()
            with ring_uses() as counts:
                client.module("wrap/big").load_state_dict(new.state_dict())
            self.assertLess(time.monotonic() - started, _shm.WAIT_S)
            self.assertEqual(counts["registrations"], 1)
            self.assertEqual(counts["calls"], 2)
            self.assertSameState(ms_grpc.module("wrap/big").state_dict(),
                                 new.state_dict())
        finally:
            client.close()
            ms.module("wrap/big").load_state_dict(self.local.state_dict())

    def test_concurrent_transfers_of_one_client(self):
        """One thread has the ring, the others go over gRPC meanwhile: all
        get the same bits."""
        results, errors = [None] * 4, []

        def work(i):
            try:
                results[i] = ms.module("wrap/big").state_dict()
            except Exception as error:  # noqa: BLE001
                errors.append(error)
        threads = [threading.Thread(target=work, args=(i,))
                   for i in range(4)]
        with ring_uses() as counts:
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        self.assertEqual(errors, [])
        self.assertFetched(counts, 1)
        for got in results:
            self.assertSameState(got, self.local.state_dict())


class RegisterAgainTest(Checks):

    @unittest.skipUnless(_shm.STORES_IN_ORDER,
                         "GetStateDict takes data messages off x86-64")
    def test_a_forgotten_token_is_registered_again(self):
        """The server forgets a ring idle for 10 minutes: the call that
        finds out registers the ring again and is done again, once."""
        client = modelstate.connect(server.address, progress=False)
        try:
            local = model(30)
            client.push(local, "again/token")
            ring = client._shm_ring
            ring.token = b"\x5a" * 16  # what the server no longer knows
            with ring_uses() as counts:
                got = client.module("again/token").state_dict()
            self.assertEqual(counts["registrations"], 1)
            self.assertFetched(counts, 1)
            self.assertEqual(counts["calls"], 2)  # refused, then done again
            self.assertNotEqual(ring.token, b"\x5a" * 16)
            self.assertSameState(got, local.state_dict())
            ring.token = b"\x5b" * 16
            with ring_uses() as counts:
                client.module("again/token").load_state_dict(
                    model(31).state_dict())
            self.assertEqual(counts["registrations"], 1)
            self.assertEqual(counts["calls"], 2)
            self.assertGreaterEqual(counts["chunks_out"], 1)
            self.assertSameState(
                ms_grpc.module("again/token").state_dict(),
                model(31).state_dict())
        finally:
            client.close()

    def test_a_restarted_server(self):
        own = server_process.Server(SERVER)
        client = modelstate.connect(own.address, progress=False)
        try:
            client.push(model(32), "again/restart")
            self.assertIsNotNone(client._shm_ring.token)
            own.kill()
            own.start()
            deadline = time.monotonic() + 30
            while True:
                try:
                    if client.health() == "SERVING":
                        break
                except modelstate.ModelStateError:
                    pass
                self.assertLess(time.monotonic(), deadline)
                time.sleep(0.1)
            with ring_uses() as counts:
                remote = client.push(model(33), "again/after")
                got = remote.state_dict()
            self.assertEqual(counts["registrations"], 1)
            self.assertGreaterEqual(counts["chunks_out"], 1)
            self.assertFetched(counts, 1)
            self.assertSameState(got, model(33).state_dict())
        finally:
            client.close()
            own.stop()


class OptOutTest(Checks):

    def test_shared_memory_false(self):
        with ring_uses() as counts:
            client = modelstate.connect(server.address, progress=False,
                                        shared_memory=False)
            try:
                self.transfers(client, "optout/keyword")
            finally:
                client.close()
        self.assertUntouched(counts)

    def test_the_environment_variable(self):
        os.environ["MODELSTATE_SHARED_MEMORY"] = "0"
        try:
            client = modelstate.Client(server.address, progress=False)
        finally:
            del os.environ["MODELSTATE_SHARED_MEMORY"]
        with ring_uses() as counts:
            try:
                self.transfers(client, "optout/environment")
            finally:
                client.close()
        self.assertUntouched(counts)


class FallbackTest(Checks):

    def test_a_server_without_shared_memory(self):
        with ring_uses() as counts:
            client = modelstate.connect(plain.address, progress=False)
            try:
                self.transfers(client, "fallback/plain")
            finally:
                client.close()
        self.assertEqual(counts["info"], 1)
        self.assertEqual(counts["connects"], 0)
        self.assertNoRing(counts)

    def test_a_socket_that_cannot_be_reached(self):
        """The registration cannot connect: the transfer goes over gRPC,
        and so does every later one of this client."""
        local = model(10)
        ms.push(local, "fallback/unreachable")
        client = modelstate.connect(server.address, progress=False)
        client._shm_path = os.path.join(server.dir, "no-such.sock")
        try:
            with ring_uses() as counts:
                got = client.module("fallback/unreachable").state_dict()
                self.assertSameState(got, local.state_dict())
                self.assertEqual(client._shm_path, "")
                client.module("fallback/unreachable").load_state_dict(
                    model(11).state_dict())
            self.assertEqual(counts["connects"], 1)
            self.assertEqual(counts["registrations"], 0)
            self.assertNoRing(counts)
            self.assertSameState(
                ms_grpc.module("fallback/unreachable").state_dict(),
                model(11).state_dict())
        finally:
            client.close()

    def test_a_socket_that_refuses(self):
        """A socket that answers a non-zero byte and a text (a server at its
        ring limit, an older protocol): gRPC, and no further tries."""
        ms.push(model(12), "fallback/refused")
        seen = []
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "refusing.sock")
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(path)
            listener.listen(4)

            def answer():
                conn, _ = listener.accept()
                with conn:
                    message, fds, _, _ = socket.recv_fds(conn, 64, 4)
                    seen.append((message, len(fds)))
                    for fd in fds:
                        os.close(fd)
                    conn.sendall(b"\x01too many rings")
            thread = threading.Thread(target=answer)
            thread.start()
            client = modelstate.connect(server.address, progress=False)
            client._shm_path = path
            try:
                with ring_uses() as counts:
                    client.module("fallback/refused").load_state_dict(
                        model(13).state_dict())
                    got = client.module("fallback/refused").state_dict()
            finally:
                client.close()
                thread.join(10)
                listener.close()
        self.assertEqual(seen, [(registration(_shm.SLOTS, _shm.SLOT_BYTES),
                                 1)])
        self.assertEqual(counts["connects"], 1)
        self.assertEqual(counts["registrations"], 0)
        self.assertNoRing(counts)
        self.assertSameState(got, model(13).state_dict())

    def test_a_ring_the_server_still_holds(self):
        """A call of the server still holds the ring (a cancelled transfer
        the server has not finished yet): FAILED_PRECONDITION, and the call
        goes over gRPC instead."""
        torch.manual_seed(16)
        local = nn.Linear(3072, 3072)  # 36 MiB: more than the ring holds
        ms.push(local, "fallback/busy")
        client = modelstate.connect(server.address, progress=False)
        try:
            client.module("fallback/busy").state_dict()
            ring = client._shm_ring
            with grpc.insecure_channel(server.address) as channel:
                stub = pb_grpc.ModelStateServiceStub(channel)
                ring.consumed = 0
                held = stub.GetStateDict(pb.GetStateDictRequest(
                    module="fallback/busy", shared_memory_ring=ring.token),
                    timeout=60)
                self.assertTrue(next(held).HasField("header"))
                self.assertEqual(next(held).ring_bytes, _shm.SLOT_BYTES)
                try:
                    with ring_uses() as counts:
                        got = client.module("fallback/busy").state_dict()
                finally:
                    held.cancel()
            self.assertEqual(counts["calls"], 1)
            self.assertEqual(counts["fetched"], 0)
            self.assertSameState(got, local.state_dict())
        finally:
            client.close()

    def test_a_ring_held_by_another_transfer(self):
        local = model(14)
        ms.push(local, "fallback/held")
        client = modelstate.connect(server.address, progress=False)
        try:
            client.module("fallback/held").state_dict()
            ring = client._shm_ring
            self.assertTrue(ring.lock.acquire(blocking=False))
            try:
                with ring_uses() as counts:
                    got = client.module("fallback/held").state_dict()
                    client.module("fallback/held").load_state_dict(
                        model(15).state_dict())
            finally:
                ring.lock.release()
            self.assertEqual(counts["connects"], 0)
            self.assertNoRing(counts)
            self.assertSameState(got, local.state_dict())
            with ring_uses() as counts:
                got = client.module("fallback/held").state_dict()
            self.assertFetched(counts, 1)
            self.assertSameState(got, model(15).state_dict())
        finally:
            client.close()


class RingTest(unittest.TestCase):
    """The client's ring by itself."""

    def test_waiting_for_a_free_slot(self):
        ring = _shm.Ring(2, PAGE)
        try:
            ring.consumed = 0
            self.assertTrue(ring.wait_free(1, lambda: False))
            self.assertFalse(ring.wait_free(2, lambda: True))
            ring.consumed = 1
            self.assertTrue(ring.wait_free(2, lambda: False))
            wait, _shm.WAIT_S = _shm.WAIT_S, 0.2
            try:
                started = time.monotonic()
                with self.assertRaises(_shm.Stalled):
                    ring.wait_free(3, lambda: False)
                self.assertLess(time.monotonic() - started, 5)
            finally:
                _shm.WAIT_S = wait
        finally:
            ring.close()
            ring.close()  # idempotent

    def test_consumed_is_the_first_eight_bytes_little_endian(self):
        ring = _shm.Ring(2, PAGE)
        try:
            ring.consumed = 0x0102030405060708
            self.assertEqual(bytes(ring._view[:8]),
                             bytes.fromhex("0807060504030201"))
            self.assertEqual(ring.slot(0).nbytes, PAGE)
            ring.slot(3)[:1] = b"\x77"  # slot 3 is slot 1
            self.assertEqual(bytes(ring._view[PAGE + PAGE:PAGE + PAGE + 1]),
                             b"\x77")
        finally:
            ring.close()


class RawRing:
    """A ring registered by hand (tiny slots, so that a small module
    fills it)."""

    def __init__(self, path, slots=2, slot_bytes=PAGE):
        self.ring = _shm.Ring(slots, slot_bytes)
        self.token = self.ring.register(path, 10)

    def close(self):
        self.ring.close()


class ServerChecksTest(unittest.TestCase):
    """What the server refuses, asked by hand."""

    @classmethod
    def setUpClass(cls):
        cls.path = info(server.address).socket_path
        ms.push(nn.Linear(4, 2), "checks/lin")
        torch.manual_seed(40)
        cls.wide = nn.Linear(64, 64)  # 16.6 KB: more than a 2 x 4 KiB ring
        ms.push(cls.wide, "checks/wide")
        cls.header, _ = ms.module("checks/lin")._fetch(
            pb.GetStateDictRequest.SELECTION_STATE_DICT, metadata_only=True)
        cls.wide_header, _ = ms.module("checks/wide")._fetch(
            pb.GetStateDictRequest.SELECTION_STATE_DICT, metadata_only=True)
        cls.channel = grpc.insecure_channel(server.address)
        cls.stub = pb_grpc.ModelStateServiceStub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()

    def setUp(self):
        self.raw = RawRing(self.path)

    def tearDown(self):
        self.raw.close()

    def load(self, token, *messages, module="checks/lin", header=None):
        start = pb.LoadStart(module=module, header=header or self.header,
                             shared_memory_ring=token)
        requests = [pb.LoadStateDictRequest(start=start)] + list(messages)
        return self.stub.LoadStateDict(iter(requests), timeout=30)

    def assertInvalid(self, error, field="shared_memory_ring"):
        self.assertEqual(error.code(), grpc.StatusCode.INVALID_ARGUMENT,
                         error.details())
        if field:
            self.assertIn(field, error.details())

    def refusal(self, message, fds):
        answer = socket_exchange(self.path, message, fds)
        self.assertNotEqual(answer[:1], b"\0", answer)
        text = answer[1:].decode()
        self.assertTrue(text.strip())
        return text

    # --------------------------------------------------------- tokens ----
    def test_a_forged_token_in_get_state_dict(self):
        with self.assertRaises(grpc.RpcError) as error:
            list(self.stub.GetStateDict(pb.GetStateDictRequest(
                module="checks/lin", shared_memory_ring=b"x" * 16),
                timeout=30))
        self.assertInvalid(error.exception)

    def test_a_forged_token_in_load_start(self):
        with self.assertRaises(grpc.RpcError) as error:
            self.load(b"x" * 16, pb.LoadStateDictRequest(ring_bytes=40))
        self.assertInvalid(error.exception)
        with self.assertRaises(grpc.RpcError) as error:
            self.load(b"short", pb.LoadStateDictRequest(ring_bytes=40))
        self.assertInvalid(error.exception)

    # -------------------------------------------------- registration ----
    def test_registering_answers_a_token(self):
        fd = ring_memfd(PAGE + 2 * PAGE,
                        fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK)
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(10)
                sock.connect(self.path)
                socket.send_fds(sock, [registration(2, PAGE)], [fd])
                answer = b""
                while len(answer) < 17:
                    more = sock.recv(17 - len(answer))
                    self.assertTrue(more, answer)
                    answer += more
                # The server keeps the ring while the connection is open:
                # nothing more comes, and it does not hang up.
                sock.settimeout(0.2)
                with self.assertRaises(TimeoutError):
                    sock.recv(1)
        finally:
            os.close(fd)
        self.assertEqual(answer[:1], b"\0")

    def test_an_unsealed_memfd_is_refused(self):
        for seals in (0, fcntl.F_SEAL_GROW):
            with self.subTest(seals=seals):
                fd = ring_memfd(PAGE + 2 * PAGE, seals)
                try:
                    text = self.refusal(registration(2, PAGE), [fd])
                finally:
                    os.close(fd)
                self.assertIn("seal", text.lower())
        # The client's own registration says the same as Refused.
        ring = _shm.Ring.__new__(_shm.Ring)
        ring.slots, ring.slot_bytes, ring.token = 2, PAGE, None
        ring._registration = None
        ring._fd = ring_memfd(PAGE + 2 * PAGE, fcntl.F_SEAL_SHRINK)
        try:
            with self.assertRaises(_shm.Refused) as refused:
                ring.register(self.path, 10)
        finally:
            os.close(ring._fd)
        self.assertIn("seal", str(refused.exception).lower())

    def test_bad_geometries_are_refused(self):
        seals = fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK
        for slots, slot_bytes, size in (
                (1, PAGE, PAGE + PAGE),                 # too few slots
                (65, PAGE, PAGE + 65 * PAGE),           # too many
                (0, PAGE, PAGE),
                (2, 0, PAGE),
                (2, PAGE + 1, PAGE + 2 * (PAGE + 1)),   # not whole pages
                (2, (64 << 20) + PAGE, PAGE + 2 * ((64 << 20) + PAGE)),
                (8, 64 << 20, PAGE + 8 * (64 << 20)),   # 512 MiB in all
                (2, PAGE, PAGE + 3 * PAGE),             # the wrong size
                (2, PAGE, 2 * PAGE)):
            with self.subTest(slots=slots, slot_bytes=slot_bytes, size=size):
                fd = ring_memfd(size, seals)
                try:
                    self.refusal(registration(slots, slot_bytes), [fd])
                finally:
                    os.close(fd)

    def test_a_registration_without_its_memfd_is_refused(self):
        self.refusal(registration(2, PAGE), [])

    def test_a_short_registration_is_refused(self):
        fd = ring_memfd(PAGE + 2 * PAGE,
                        fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK)
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(10)
                sock.connect(self.path)
                socket.send_fds(sock, [b"R\x02\0"], [fd])
                sock.shutdown(socket.SHUT_WR)
                answer = sock.recv(4096)
        finally:
            os.close(fd)
        self.assertNotEqual(answer[:1], b"\0")

    # ----------------------------------------------------- the stream ----
    def test_ring_bytes_without_a_ring(self):
        with self.assertRaises(grpc.RpcError) as error:
            self.load(b"", pb.LoadStateDictRequest(ring_bytes=40))
        self.assertInvalid(error.exception, field="ring_bytes")

    def test_a_data_message_in_a_ring_load(self):
        values = bytes(range(40))
        for messages in ([pb.LoadStateDictRequest(data=values)],
                         [pb.LoadStateDictRequest(ring_bytes=20),
                          pb.LoadStateDictRequest(data=values[20:])]):
            with self.subTest(len(messages)):
                self.raw.ring.consumed = 0
                self.raw.ring.slot(0)[:20] = values[:20]
                with self.assertRaises(grpc.RpcError) as error:
                    self.load(self.raw.token, *messages)
                self.assertInvalid(error.exception, field=None)
        # Nothing of it was loaded.
        self.assertNotEqual(
            state_bytes(ms_grpc.module("checks/lin").state_dict()),
            bytes(range(40)))

    def test_ring_bytes_beyond_the_slot_or_zero(self):
        for n in (0, PAGE + 1):
            with self.subTest(n=n):
                self.raw.ring.consumed = 0
                with self.assertRaises(grpc.RpcError) as error:
                    self.load(self.raw.token,
                              pb.LoadStateDictRequest(ring_bytes=n))
                self.assertEqual(error.exception.code(),
                                 grpc.StatusCode.INVALID_ARGUMENT,
                                 error.exception.details())

    def test_more_ring_bytes_than_the_header(self):
        self.raw.ring.consumed = 0
        with self.assertRaises(grpc.RpcError) as error:
            self.load(self.raw.token, pb.LoadStateDictRequest(ring_bytes=40),
                      pb.LoadStateDictRequest(ring_bytes=1))
        self.assertEqual(error.exception.code(),
                         grpc.StatusCode.INVALID_ARGUMENT)

    def test_a_raw_download_through_a_tiny_ring(self):
        """A 2 x 4 KiB ring, consumed by hand: the chunks come slot after
        slot, each at most a slot, and add up to the state's bytes."""
        ring = self.raw.ring
        ring.consumed = 0
        stream = self.stub.GetStateDict(pb.GetStateDictRequest(
            module="checks/wide", shared_memory_ring=self.raw.token),
            timeout=30)
        self.assertTrue(next(stream).HasField("header"))
        got, i = [], 0
        for chunk in stream:
            self.assertEqual(chunk.WhichOneof("payload"), "ring_bytes")
            self.assertLessEqual(chunk.ring_bytes, PAGE)
            got.append(bytes(ring.slot(i)[:chunk.ring_bytes]))
            i += 1
            ring.consumed = i
        self.assertGreater(i, 4)
        self.assertEqual(b"".join(got), state_bytes(self.wide.state_dict()))

    def test_a_raw_upload_through_a_tiny_ring(self):
        ring = self.raw.ring
        values = os.urandom(self.wide_header.total_bytes)
        chunks = [values[i:i + PAGE] for i in range(0, len(values), PAGE)]

        def messages():
            for i, chunk in enumerate(chunks):
                deadline = time.monotonic() + 10
                while ring.consumed < i + 1 - ring.slots:
                    self.assertLess(time.monotonic(), deadline)
                    time.sleep(0.0001)
                ring.slot(i)[:len(chunk)] = chunk
                yield pb.LoadStateDictRequest(ring_bytes=len(chunk))

        ring.consumed = 0
        start = pb.LoadStart(module="checks/wide", header=self.wide_header,
                             shared_memory_ring=self.raw.token)
        self.stub.LoadStateDict(
            _chain(pb.LoadStateDictRequest(start=start), messages()),
            timeout=30)
        self.assertEqual(ring.consumed, len(chunks))
        self.assertEqual(
            state_bytes(ms_grpc.module("checks/wide").state_dict()), values)
        ms_grpc.module("checks/wide").load_state_dict(self.wide.state_dict())

    def test_two_calls_on_one_ring(self):
        """The first call fills the ring and waits (10 s) for it to be
        read; a second call naming the ring meanwhile waits 2 s for it, then
        is FAILED_PRECONDITION; once the first is cancelled the ring serves
        again."""
        ring = self.raw.ring
        ring.consumed = 0
        request = pb.GetStateDictRequest(module="checks/wide",
                                         shared_memory_ring=self.raw.token)
        first = self.stub.GetStateDict(request, timeout=60)
        self.assertTrue(next(first).HasField("header"))
        with self.assertRaises(grpc.RpcError) as error:
            list(self.stub.GetStateDict(request, timeout=30))
        self.assertEqual(error.exception.code(),
                         grpc.StatusCode.FAILED_PRECONDITION,
                         error.exception.details())
        self.assertIn("shared_memory_ring", error.exception.details())
        with self.assertRaises(grpc.RpcError) as error:
            self.load(self.raw.token, pb.LoadStateDictRequest(ring_bytes=8),
                      module="checks/wide", header=self.wide_header)
        self.assertEqual(error.exception.code(),
                         grpc.StatusCode.FAILED_PRECONDITION,
                         error.exception.details())
        first.cancel()
        deadline = time.monotonic() + 10
        while True:
            ring.consumed = 0
            try:
                stream = self.stub.GetStateDict(request, timeout=30)
                next(stream)
                i = 0
                for chunk in stream:
                    i += 1
                    ring.consumed = i
                break
            except grpc.RpcError as error:
                self.assertEqual(error.code(),
                                 grpc.StatusCode.FAILED_PRECONDITION)
                self.assertLess(time.monotonic(), deadline)
                time.sleep(0.05)

    def test_a_consumer_that_stops_reading(self):
        """The server waits 10 seconds for a free slot, then ends the call
        DEADLINE_EXCEEDED."""
        self.raw.ring.consumed = 0
        stream = self.stub.GetStateDict(pb.GetStateDictRequest(
            module="checks/wide", shared_memory_ring=self.raw.token),
            timeout=60)
        started = time.monotonic()
        with self.assertRaises(grpc.RpcError) as error:
            for _ in stream:
                pass  # never marks a slot consumed
        self.assertEqual(error.exception.code(),
                         grpc.StatusCode.DEADLINE_EXCEEDED,
                         error.exception.details())
        self.assertLess(time.monotonic() - started, 30)


def _chain(first, rest):
    yield first
    yield from rest


if __name__ == "__main__":
    unittest.main(verbosity=2)
