"""State_dict streams at the speed of the wire.

GetStateDict's data messages are parsed by hand: each message's payload is
a slice of the bytes gRPC hands over, copied once into the tensor that owns
it (no protobuf object per chunk, no per-element work). LoadStateDict's data
messages are framed by hand from memoryviews of the tensors' own bytes, so
each byte is copied once into the message gRPC sends. On the server's host
both go through the client's shared-memory ring instead when the server
offers it (_shm): the stream then carries the header and one small
`ring_bytes` message per chunk, and each byte is copied once between the
tensors and the ring. Transfers that take longer than a second show
progress (see Progress).
"""

import sys
import threading
import time

import grpc

from . import _shm, _tensors
from ._errors import ModelStateError, from_rpc_error
from .v1 import model_state_service_pb2 as pb

try:  # optional: a progress bar for long transfers
    import tqdm as _tqdm
except ImportError:  # pragma: no cover - exercised where tqdm is absent
    _tqdm = None

_SERVICE = "/modelstate.v1.ModelStateService/"


def _identity(raw):
    return raw


def get_state_dict_call(channel):
    """GetStateDict with raw (unparsed) responses."""
    return channel.unary_stream(
        _SERVICE + "GetStateDict",
        request_serializer=pb.GetStateDictRequest.SerializeToString,
        response_deserializer=_identity)


def load_state_dict_call(channel):
    """LoadStateDict taking already serialized requests."""
    return channel.stream_unary(
        _SERVICE + "LoadStateDict", request_serializer=_identity,
        response_deserializer=pb.LoadStateDictResponse.FromString)


# ---------------------------------------------------------- progress ------
class Progress:
    """Reports (done, total) bytes of one transfer.

    `how` is a callable (called after every message), True (a tqdm bar on
    stderr, or a line of text without tqdm), "auto" (a bar when stderr is a
    terminal and tqdm is installed) or False/None (nothing). Bars appear
    only once the transfer has run for a second."""

    DELAY_S = 1.0

    def __init__(self, how, total, label):
        self._callback = how if callable(how) else None
        if how == "auto":
            how = _tqdm is not None and sys.stderr.isatty()
        self._show = how is True
        self._total = total
        self._label = label
        self._start = time.monotonic()
        self._bar = None
        self._done = 0

    def update(self, done):
        if self._callback is not None:
            self._callback(done, self._total)
        if not self._show:
            return
        if self._bar is None:
            if time.monotonic() - self._start < self.DELAY_S:
                return
            self._bar = self._open()
        if _tqdm is not None:
            self._bar.update(done - self._done)
        self._done = done

    def _open(self):
        if _tqdm is None:
            sys.stderr.write(f"{self._label}: {self._total} bytes...\n")
            return True
        return _tqdm.tqdm(total=self._total, initial=self._done, unit="B",
                          unit_scale=True, unit_divisor=1024,
                          desc=self._label, leave=False)

    def close(self):
        if self._bar is not None and _tqdm is not None:
            self._bar.close()
        elif self._bar is not None:
            sys.stderr.write(f"{self._label}: done\n")


# ------------------------------------------------------ wire helpers ------
def _varint(buf, pos):
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _encode_varint(value):
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _chunk_fields(raw):
    """(header, data, ring_bytes, direct_bytes) of one serialized
    StateDictChunk: header and data as memoryviews, the others as ints, each
    None when absent (the last of the oneof wins, unknown fields are
    skipped, as protobuf does)."""
    view = memoryview(raw)
    fields = [None, None, None, None]
    pos, end = 0, len(view)
    while pos < end:
        key, pos = _varint(view, pos)
        field, wire = key >> 3, key & 7
        if wire == 2:
            length, pos = _varint(view, pos)
            if field in (1, 2):
                fields = [None, None, None, None]
                fields[field - 1] = view[pos:pos + length]
            pos += length
        elif wire == 0:
            value, pos = _varint(view, pos)
            if field in (3, 4):
                fields = [None, None, None, None]
                fields[field - 1] = value
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:
            raise ValueError(f"unexpected wire type {wire} in a "
                             f"StateDictChunk")
    return tuple(fields)


def _with_ring(client, wanted, through, plain):
    """through(ring) with the client's ring held when `wanted` and one is
    free, plain() otherwise."""
    ring = _shm.take(client) if wanted else None
    if ring is None:
        return plain()
    try:
        return _through_ring(client, ring, through, plain)
    finally:
        _shm.release(ring)


def _through_ring(client, ring, call, plain):
    """call(ring) with the ring's `consumed` set to 0; once more after
    registering the ring again when the server no longer knows its token
    (the connection that registered it ended, or the server restarted);
    plain() when the server's side of the ring is still held by an earlier
    call, or the ring cannot be registered again. Raises grpc.RpcError as
    the calls do."""
    for attempt in (1, 2):
        ring.consumed = 0
        ring.begin_direct_call()
        _shm.calls += 1
        try:
            return call(ring)
        except grpc.RpcError as error:
            if _shm.names_ring(error, grpc.StatusCode.FAILED_PRECONDITION):
                break
            if attempt == 2 or not _shm.names_ring(
                    error, grpc.StatusCode.INVALID_ARGUMENT):
                raise
            if not _shm.register(client, ring):
                break
    return plain()


# -------------------------------------------------------------- pull ------
def fetch(client, request, label, progress=None, into=None):
    """Streams GetStateDict: (header, [raw byte buffer per entry]). The
    buffers come from _tensors.empty_bytes and are handed to the tensors,
    or from into(header), which returns the caller's own contiguous cpu
    tensors, one per entry and of its byte_length, to overwrite in place
    (or raises). Through the
    client's shared-memory ring where the server offers one, no other
    transfer of this client holds it and the CPU is x86-64; data messages
    otherwise."""
    def plain():
        return _fetch(client, request, label, progress, None, into)

    def through(ring):
        fast = pb.GetStateDictRequest()
        fast.CopyFrom(request)
        fast.shared_memory_ring = ring.token
        fast.shared_memory_direct = client._shared_memory_direct
        return _fetch(client, fast, label, progress, ring, into)

    try:
        # Received through the ring only where the CPU keeps the client's
        # stores after its reads (_shm.STORES_IN_ORDER).
        return _with_ring(client, _shm.STORES_IN_ORDER and
                          not request.metadata_only, through, plain)
    except grpc.RpcError as error:
        raise from_rpc_error(error) from None


def _fetch(client, request, label, progress, ring, into):
    """One GetStateDict call; `ring` is the _shm.Ring the request names
    (None when it names none), `into` as for fetch(). Raises grpc.RpcError
    as the call does."""
    stream = client._get_state_dict(request, timeout=client._transfer_timeout,
                                    metadata=client._metadata)
    sink = None
    try:
        header_bytes = _chunk_fields(next(stream))[0]
        if header_bytes is None:
            raise ValueError("the stream did not start with a header")
        header = pb.StateDictHeader.FromString(bytes(header_bytes))
        if request.metadata_only:
            for _ in stream:  # nothing follows the header
                pass
            return header, []
        sink = _Sink(header, label, into(header) if into else None)
        if request.shared_memory_direct:
            sink.direct = ring.offer_direct(sink.targets())
        bar = Progress(progress if progress is not None else client.progress,
                       header.total_bytes, label)
        try:
            _receive(stream, sink, ring, bar)
        finally:
            bar.close()
        if sink.done != header.total_bytes:
            raise ValueError(f"{label}: the stream ended after {sink.done} "
                             f"of {header.total_bytes} bytes")
        return header, sink.buffers
    except BaseException as error:
        if not isinstance(error, grpc.RpcError):
            stream.cancel()  # a stream left open would hold the server's bytes
        if sink is not None and sink.direct and \
                not ring.stop_direct(ring.direct_call):
            _shm.abandoned.append(sink.buffers)
        raise


def _receive(stream, sink, ring, progress):
    """Fills `sink` from the messages after the header: data messages, or
    ring_bytes messages announcing the ring's slots in turn (each copied
    out, then counted in `consumed` so that the server may refill it).
    Reads the stream to its end, so that its status is the call's."""
    chunks = 0
    for raw in stream:
        _, data, ring_bytes, direct_bytes = _chunk_fields(raw)
        if direct_bytes is not None:
            if not sink.direct:
                raise ValueError(f"{sink.label}: the server sent "
                                 "direct_bytes without a direct table")
            sink.placed(direct_bytes)
            _shm.direct_in += direct_bytes
            _shm.direct_stretches += 1
        elif ring_bytes is not None:
            if ring is None:
                raise ValueError(f"{sink.label}: the server sent ring_bytes "
                                 "without a shared-memory ring asked for")
            if not 1 <= ring_bytes <= ring.slot_bytes:
                raise ValueError(f"{sink.label}: the server announced "
                                 f"{ring_bytes} bytes in a ring slot of "
                                 f"{ring.slot_bytes}")
            sink.write(ring.slot(chunks)[:ring_bytes])
            chunks += 1
            ring.consumed = chunks
            _shm.chunks_in += 1
        elif data is not None:
            sink.write(data)
        else:
            continue
        progress.update(sink.done)


class _Sink:
    """The per-entry byte buffers of one GetStateDict, filled in order:
    new ones, or `buffers` (contiguous tensors of the entries' lengths)
    when given. A buffer's memoryview is made only when bytes are copied
    into it: the server writing them itself (direct) needs none."""

    def __init__(self, header, label, buffers=None):
        self.buffers = buffers if buffers is not None else [
            _tensors.empty_bytes(e.byte_length) for e in header.entries]
        self._lengths = [e.byte_length for e in header.entries]
        self._views = {}
        self.label = label
        self.done = 0
        self.direct = False  # whether the server may write the buffers
        self._index = self._offset = 0

    def targets(self):
        """(address, length) of every buffer, for a direct table."""
        return [(_tensors.address(b), n)
                for b, n in zip(self.buffers, self._lengths)]

    def write(self, data):
        """Appends the bytes of the memoryview `data`; entries may span
        messages and messages entries."""
        self._advance(len(data), data)

    def placed(self, n):
        """The next `n` bytes are in the buffers already (the server wrote
        them where targets() said)."""
        self._advance(n, None)

    def _advance(self, n, data):
        pos = 0
        while pos < n:
            while self._index < len(self._lengths) and \
                    self._offset == self._lengths[self._index]:
                self._index, self._offset = self._index + 1, 0
            if self._index == len(self._lengths):
                raise ValueError(f"{self.label}: the server sent more bytes "
                                 "than its header announced")
            take = min(self._lengths[self._index] - self._offset, n - pos)
            if data is not None:
                space = self._views.get(self._index)
                if space is None:
                    space = self._views[self._index] = \
                        _tensors.writable_view(self.buffers[self._index])
                space[self._offset:self._offset + take] = data[pos:pos + take]
            self._offset += take
            self.done += take
            pos += take


# -------------------------------------------------------------- push ------
def _framed(pieces, size):
    """One serialized LoadStateDictRequest{data} holding `pieces`."""
    return b"".join([b"\x12", _encode_varint(size)] + pieces)


def _data_messages(sources, chunk, progress):
    """Serialized data messages of at most `chunk` bytes cut from the
    sources (callables returning a memoryview, called one at a time so that
    a GPU tensor is copied to the host only when it is sent)."""
    pieces, size, done = [], 0, 0
    for source in sources:
        view = source()
        while view:
            if size == chunk:
                # A full message goes once more bytes follow, and is
                # counted before it goes: the last one leaves only after
                # every source was read and every progress call made, so
                # that a failure in them ends the stream short, which the
                # server refuses (after the last message the load is done).
                done += size
                progress.update(done)
                yield _framed(pieces, size)
                pieces, size = [], 0
            take = min(len(view), chunk - size)
            pieces.append(view[:take])
            view = view[take:]
            size += take
    if size:
        progress.update(done + size)
        yield _framed(pieces, size)


class _Guarded:
    """The messages of `messages`, a generator that may raise (a source
    that cannot be read, a progress callback): the failure ends them
    early, so the server refuses the load cut short, and is kept in
    `error` for the caller to raise as it was. Raised into gRPC, it would
    only cancel the call as "Exception iterating requests!"."""

    def __init__(self, messages):
        self._messages = messages
        self.error = None

    def __iter__(self):
        try:
            yield from self._messages
        except Exception as error:  # noqa: BLE001 - handed to the caller
            self.error = error


class _RingFeed:
    """The ring_bytes messages of one LoadStateDict: the sources' bytes
    cut into slot-sized chunks, each written into its slot of `ring` once
    the server has read what the slot held before. gRPC draws the messages
    on a thread of its own; stop() makes sure that thread writes nothing
    more to the ring once the call is over. A failure (a stalled server, a
    source that raises) ends the messages early and is kept in `error`."""

    def __init__(self, ring, sources, progress):
        self._ring = ring
        self._sources = sources
        self._progress = progress
        self._busy = threading.Lock()  # held while the ring is written
        self._stopped = False
        self.error = None

    def messages(self):
        ring, i, fill, done = self._ring, 0, 0, 0
        try:
            for source in self._sources:
                view = source()
                while view:
                    if fill == ring.slot_bytes:
                        # Announced once more bytes follow, and counted
                        # first, as in _data_messages: a failure ends the
                        # stream short.
                        self._progress.update(done + fill)
                        _shm.chunks_out += 1
                        yield b"\x18" + _encode_varint(fill)
                        i, done, fill = i + 1, done + fill, 0
                    take = self._copy(i, fill, view)
                    if take is None:
                        return
                    fill += take
                    view = view[take:]
            if fill:
                self._progress.update(done + fill)
                _shm.chunks_out += 1
                yield b"\x18" + _encode_varint(fill)
        except Exception as error:  # noqa: BLE001 - handed to the caller
            self.error = error

    def _copy(self, i, fill, view):
        """Copies the start of `view` into chunk i's slot from `fill` on:
        how many bytes, or None once stopped."""
        with self._busy:
            if self._stopped or (fill == 0 and not self._ring.wait_free(
                    i, lambda: self._stopped)):
                return None
            slot = self._ring.slot(i)
            take = min(len(view), len(slot) - fill)
            slot[fill:fill + take] = view[:take]
            return take

    def stop(self):
        self._stopped = True
        with self._busy:  # a copy under way ends first
            pass


def send(client, start, sources, label, progress=None):
    """Streams LoadStateDict: `start` (a LoadStart), then the bytes of
    `sources` (see _data_messages): through the client's shared-memory
    ring where the server offers one and no other transfer of this client
    holds it, as data messages otherwise. Returns the
    LoadStateDictResponse."""
    bar = Progress(progress if progress is not None else client.progress,
                   start.header.total_bytes, label)

    def plain():
        start.ClearField("shared_memory_ring")
        messages = _Guarded(_data_messages(sources, client._chunk_bytes,
                                           bar))
        try:
            return client._load_state_dict(
                _requests(start, iter(messages)),
                timeout=client._transfer_timeout, metadata=client._metadata)
        except grpc.RpcError:
            if messages.error is None:
                raise
        raise messages.error

    def through(ring):
        start.shared_memory_ring = ring.token
        feed = _RingFeed(ring, sources, bar)
        try:
            return client._load_state_dict(
                _requests(start, feed.messages()),
                timeout=client._transfer_timeout, metadata=client._metadata)
        except grpc.RpcError:
            if feed.error is None:
                raise
        finally:
            feed.stop()
        if isinstance(feed.error, _shm.Stalled):
            raise ModelStateError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                  f"{label}: {feed.error}")
        raise feed.error

    try:
        return _with_ring(client, start.header.total_bytes > 0, through,
                          plain)
    except grpc.RpcError as error:
        raise from_rpc_error(error) from None
    finally:
        bar.close()


def _requests(start, messages):
    yield pb.LoadStateDictRequest(start=start).SerializeToString()
    yield from messages
