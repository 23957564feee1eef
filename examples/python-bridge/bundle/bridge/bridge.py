"""The grader's side of the bridge: call a candidate's Python module that
runs in another process, as another uid, and get back plain data only.

    calc = bridge.load("calc")
    assert calc.fib(10) == 55

Each call is sent to a worker (worker.py) started through the sandbox
helper's exec service as the code uid; the worker imports the candidate's
module and answers. Requests and replies are JSON objects in frames (a
4-byte big-endian length, then that many bytes of UTF-8 JSON) over a
socket that is the worker's standard input, never its stdout; the worker's
stdout and stderr go to a pipe whose tail is copied to the grader's stderr
for people, and never read as an answer. A reply is decoded with
json.loads and nothing else (no pickle, no eval, no object hooks), so what
comes back is only None, bool, int, float, str, list and dict. See
BRIDGE.md for the protocol.

A call fails (WorkerFailure) when its worker dies, hangs past the per-call
time limit, or answers with anything but a well-formed reply to that very
request; the worker is then abandoned and the next call starts a new one.
A candidate exception arrives as RemoteError(type name, message).
"""

import collections
import json
import math
import os
import socket
import struct
import subprocess
import threading
import time

PROTOCOL = 1
MAX_FRAME = 1 << 20  # bytes of one frame's JSON, either way
CALL_TIMEOUT = 5.0  # seconds for one call's reply
START_TIMEOUT = 10.0  # seconds for a worker to import the module and say hello
MAX_STARTS = 8  # workers started per module; then every call fails at once

# How a worker is started: through the helper's exec service, as the code
# uid. The worker script is copied by the grader to where that uid can read.
LAUNCHER = ["/.sandboxd/shim", "exec"]
WORKER = os.environ.get("BRIDGE_WORKER", "/work/bridge/worker.py")
LOG_CHUNKS = 4  # of 4 KiB: the tail of a worker's output kept for the grader's stderr
# The worker's environment: nothing of the grader's (no report path).
WORKER_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/.code-tmp", "PYTHONDONTWRITEBYTECODE": "1"}


class WorkerFailure(AssertionError):
    """The call got no valid answer: the worker died, hung or wrote garbage."""


class RemoteError(Exception):
    """The candidate's code raised: its exception's type name and message."""

    def __init__(self, type_name, message):
        super().__init__(f"{type_name}: {message}")
        self.type = type_name
        self.message = message


def _no_constants(name):
    raise ValueError(f"{name} is not JSON")


def decode(data):
    """Decodes one frame: strict UTF-8 JSON, a JSON object, no NaN/Infinity."""
    text = data.decode("utf-8")  # strict: invalid UTF-8 raises
    obj = json.loads(text, parse_constant=_no_constants)
    if not isinstance(obj, dict):
        raise ValueError("a frame is a JSON object")
    return obj


def encode(obj):
    data = json.dumps(obj, allow_nan=False, separators=(",", ":")).encode("utf-8")
    if len(data) > MAX_FRAME:
        raise ValueError(f"frame of {len(data)} bytes (at most {MAX_FRAME})")
    return struct.pack(">I", len(data)) + data


def _plain(value, depth=0):
    """Checks that a value is plain data the protocol can carry."""
    if depth > 64:
        raise TypeError("nested deeper than 64")
    if value is None or type(value) in (bool, int, str):
        return
    if type(value) is float:
        if not math.isfinite(value):
            raise TypeError("not a finite float")
        return
    if type(value) is list:
        for v in value:
            _plain(v, depth + 1)
        return
    if type(value) is dict:
        for k, v in value.items():
            if type(k) is not str:
                raise TypeError("a dict key is not a str")
            _plain(v, depth + 1)
        return
    raise TypeError(f"{type(value).__name__} is not plain data")


class _Worker:
    def __init__(self, directory, module):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.proc = subprocess.Popen(
                LAUNCHER + ["/usr/bin/python3", "-I", WORKER, directory, module],
                stdin=theirs, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=WORKER_ENV,
                cwd=directory, close_fds=True,
            )
        except OSError as e:
            ours.close()
            raise WorkerFailure(f"the worker could not be started: {e}") from None
        finally:
            theirs.close()
        self.sock = ours
        # What the worker prints is drained and only its tail kept, for
        # people: it is never read as an answer, and cannot fill a disk.
        self.output = collections.deque(maxlen=LOG_CHUNKS)
        self.drain = threading.Thread(target=self._drain, daemon=True)
        self.drain.start()
        self.next_id = 1
        try:
            hello = self._read(START_TIMEOUT)
            if hello != {"protocol": PROTOCOL, "ready": True}:
                raise WorkerFailure(f"the worker did not start: {str(hello)[:200]}")
        except WorkerFailure:
            self.close()
            raise

    def _read_exact(self, n, deadline):
        buf = bytearray()
        while len(buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WorkerFailure("no answer within the time limit")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(n - len(buf))
            except socket.timeout:
                raise WorkerFailure("no answer within the time limit") from None
            except OSError as e:
                raise WorkerFailure(f"the channel failed: {e}") from None
            if not chunk:
                raise WorkerFailure("the worker ended without answering")
            buf += chunk
        return bytes(buf)

    def _read(self, timeout):
        deadline = time.monotonic() + timeout
        (n,) = struct.unpack(">I", self._read_exact(4, deadline))
        if n > MAX_FRAME:
            raise WorkerFailure(f"a frame of {n} bytes (at most {MAX_FRAME})")
        try:
            return decode(self._read_exact(n, deadline))
        except (ValueError, RecursionError) as e:
            raise WorkerFailure(f"garbage on the channel: {e}") from None

    def call(self, name, args, kwargs):
        rid = self.next_id
        self.next_id += 1
        try:
            self.sock.settimeout(CALL_TIMEOUT)
            self.sock.sendall(encode({"id": rid, "op": "call", "name": name, "args": args, "kwargs": kwargs}))
        except OSError as e:
            raise WorkerFailure(f"the worker is gone: {e}") from None
        reply = self._read(CALL_TIMEOUT)
        if reply.get("id") != rid or type(reply.get("id")) is not int:
            raise WorkerFailure(f"a reply to another request: {str(reply)[:200]}")
        if reply.get("ok") is True and set(reply) == {"id", "ok", "value"}:
            return reply["value"]
        err = reply.get("error")
        if reply.get("ok") is False and set(reply) == {"id", "ok", "error"} and type(err) is dict \
                and type(err.get("type")) is str and type(err.get("message")) is str:
            if err.get("kind") == "worker":
                raise WorkerFailure(f"the worker could not answer: {err['type']}: {err['message'][:500]}")
            raise RemoteError(err["type"][:200], err["message"][:2000])
        raise WorkerFailure(f"a malformed reply: {str(reply)[:200]}")

    def _drain(self):
        for chunk in iter(lambda: self.proc.stdout.read1(4096), b""):
            self.output.append(chunk)

    def close(self):
        self.sock.close()
        if self.proc.poll() is None:
            self.proc.kill()  # the exec client; the worker sees its channel close and exits
        self.proc.wait()
        self.drain.join(1.0)  # a worker that outlives its watchdog keeps the pipe open
        tail = b"".join(list(self.output))
        if tail:
            # fd 2 itself: pytest captures sys.stderr.
            os.write(2, b"--- a bridge worker's output (tail)\n" + tail[-LOG_CHUNKS * 4096:] + b"\n")


class Module:
    """A candidate module in a worker; attributes are remote functions."""

    def __init__(self, name, directory):
        self._name = name
        self._dir = directory
        self._worker = None
        self._starts = 0

    def _call(self, fname, args, kwargs):
        args, kwargs = list(args), dict(kwargs)
        _plain(args)
        _plain(kwargs)
        if self._worker is None:
            if self._starts >= MAX_STARTS:
                raise WorkerFailure(f"{self._starts} workers for {self._name} failed; no more are started")
            self._starts += 1
            try:
                self._worker = _Worker(self._dir, self._name)
            except WorkerFailure:
                self._worker = None
                raise
        try:
            return self._worker.call(fname, args, kwargs)
        except WorkerFailure:
            self._worker.close()
            self._worker = None
            raise

    def __getattr__(self, fname):
        if fname.startswith("_"):
            raise AttributeError(fname)
        return lambda *args, **kwargs: self._call(fname, args, kwargs)

    def close(self):
        if self._worker is not None:
            self._worker.close()
            self._worker = None


_loaded = []


def load(module, directory=None):
    """The candidate's module `module`, from the grader's copy of the
    candidate's export (BRIDGE_CANDIDATE)."""
    m = Module(module, directory or os.environ.get("BRIDGE_CANDIDATE", "/work/candidate"))
    _loaded.append(m)
    return m


def close_all():
    for m in _loaded:
        m.close()
