"""State_dict streams at the speed of the wire.

GetStateDict's data messages are parsed by hand: each message's payload is
a slice of the bytes gRPC hands over, copied once into the tensor that owns
it (no protobuf object per chunk, no per-element work). LoadStateDict's data
messages are framed by hand from memoryviews of the tensors' own bytes, so
each byte is copied once into the message gRPC sends. Transfers that take
longer than a second show progress (see Progress).
"""

import sys
import time

import grpc

from . import _tensors
from ._errors import from_rpc_error
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
    """(header bytes or None, data memoryview or None) of one serialized
    StateDictChunk, skipping unknown fields as protobuf does."""
    view = memoryview(raw)
    header = data = None
    pos, end = 0, len(view)
    while pos < end:
        key, pos = _varint(view, pos)
        field, wire = key >> 3, key & 7
        if wire == 2:
            length, pos = _varint(view, pos)
            value = view[pos:pos + length]
            pos += length
            if field == 1:
                header = value
            elif field == 2:
                data = value
        elif wire == 0:
            _, pos = _varint(view, pos)
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:
            raise ValueError(f"unexpected wire type {wire} in a "
                             f"StateDictChunk")
    return header, data


# -------------------------------------------------------------- pull ------
def fetch(client, request, label, progress=None):
    """Streams GetStateDict: (header, [raw byte buffer per entry]). The
    buffers come from _tensors.empty_bytes and are handed to the tensors."""
    call = client._get_state_dict
    try:
        stream = call(request, timeout=client._transfer_timeout,
                      metadata=client._metadata)
        header_bytes, _ = _chunk_fields(next(stream))
        if header_bytes is None:
            raise ValueError("the stream did not start with a header")
        header = pb.StateDictHeader.FromString(bytes(header_bytes))
        if request.metadata_only:
            for _ in stream:  # nothing follows the header
                pass
            return header, []
        return header, _receive(stream, header, label,
                                Progress(progress if progress is not None
                                         else client.progress,
                                         header.total_bytes, label))
    except grpc.RpcError as error:
        raise from_rpc_error(error) from None


def _receive(stream, header, label, progress):
    lengths = [e.byte_length for e in header.entries]
    buffers = [_tensors.empty_bytes(n) for n in lengths]
    views = [_tensors.writable_view(b) for b in buffers]
    index, offset, done = 0, 0, 0
    try:
        for raw in stream:
            _, data = _chunk_fields(raw)
            if data is None:
                continue
            pos, size = 0, len(data)
            while pos < size:
                while index < len(lengths) and offset == lengths[index]:
                    index, offset = index + 1, 0
                if index == len(lengths):
                    raise ValueError(f"{label}: the server sent more bytes "
                                     "than its header announced")
                take = min(size - pos, lengths[index] - offset)
                views[index][offset:offset + take] = data[pos:pos + take]
                offset += take
                pos += take
            done += size
            progress.update(done)
    finally:
        progress.close()
    if done != header.total_bytes:
        raise ValueError(f"{label}: the stream ended after {done} of "
                         f"{header.total_bytes} bytes")
    return buffers


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
            take = min(len(view), chunk - size)
            pieces.append(view[:take])
            view = view[take:]
            size += take
            if size == chunk:
                yield _framed(pieces, size)
                done += size
                progress.update(done)
                pieces, size = [], 0
    if size:
        yield _framed(pieces, size)
        progress.update(done + size)


def send(client, start, sources, label, progress=None):
    """Streams LoadStateDict: `start` (a LoadStart), then the bytes of
    `sources` (see _data_messages). Returns the LoadStateDictResponse."""
    bar = Progress(progress if progress is not None else client.progress,
                   start.header.total_bytes, label)

    def requests():
        yield pb.LoadStateDictRequest(start=start).SerializeToString()
        yield from _data_messages(sources, client._chunk_bytes, bar)

    try:
        return client._load_state_dict(requests(),
                                       timeout=client._transfer_timeout,
                                       metadata=client._metadata)
    except grpc.RpcError as error:
        raise from_rpc_error(error) from None
    finally:
        bar.close()
