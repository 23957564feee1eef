"""The worker side of the bridge, run as the code uid: imports the
candidate's module and answers calls on the channel (fd 0, a socket), one
at a time. See BRIDGE.md. Nothing here is trusted by the grader: the
candidate's code shares this process and may do anything it likes with it;
the grader checks every frame it gets back.

    python3 -I worker.py DIRECTORY MODULE
"""

# Everything the worker needs is imported before the candidate's directory
# is on sys.path, so its files cannot stand in for these modules.
import importlib
import json
import math
import os
import resource
import select
import socket
import struct
import sys
import threading
import traceback

PROTOCOL = 1
MAX_FRAME = 1 << 20
CPU_SECONDS = 60  # a hard limit: nothing in this process can raise it again


def main():
    directory, module = sys.argv[1], sys.argv[2]
    # The channel moves off fd 0; stdin becomes /dev/null and stdout goes
    # to stderr (the log), so what the candidate prints never reaches it.
    chan = socket.socket(fileno=os.dup(0))
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_SECONDS, CPU_SECONDS))
    threading.Thread(target=watch, args=(chan.fileno(),), daemon=True).start()

    sys.path.insert(0, directory)
    try:
        mod = importlib.import_module(module)
    except BaseException as e:  # SystemExit included: it is the candidate's
        send(chan, {"protocol": PROTOCOL, "ready": False, "error": describe(e)})
        return 1
    send(chan, {"protocol": PROTOCOL, "ready": True})
    while True:
        req = receive(chan)
        if req is None:
            return 0
        send(chan, answer(mod, req))


def watch(fd):
    """Exits as soon as the grader closes its end (a call that hangs)."""
    p = select.poll()
    p.register(fd, select.POLLRDHUP)
    while True:
        for _, ev in p.poll():
            if ev & (select.POLLRDHUP | select.POLLHUP | select.POLLERR):
                os._exit(3)


def answer(mod, req):
    rid = req.get("id")
    if req.get("op") != "call" or type(rid) is not int or type(req.get("name")) is not str \
            or type(req.get("args")) is not list or type(req.get("kwargs")) is not dict:
        return {"id": rid, "ok": False, "error": {"kind": "worker", "type": "ProtocolError", "message": "malformed request"}}
    try:
        fn = getattr(mod, req["name"])
        value = fn(*req["args"], **req["kwargs"])
    except BaseException as e:
        return {"id": rid, "ok": False, "error": describe(e)}
    try:
        plain(value)
    except TypeError as e:
        return {"id": rid, "ok": False, "error": {"kind": "worker", "type": "NotPlainData", "message": str(e)}}
    return {"id": rid, "ok": True, "value": value}


def plain(value, depth=0):
    """Only None, bool, int, float (finite), str, list and dict with str
    keys cross, by exact type: a subclass (an int whose __eq__ says yes to
    everything) is not plain data."""
    if depth > 64:
        raise TypeError("nested deeper than 64")
    t = type(value)
    if value is None or t in (bool, int, str):
        return
    if t is float:
        if not math.isfinite(value):
            raise TypeError("not a finite float")
        return
    if t is list:
        for v in value:
            plain(v, depth + 1)
        return
    if t is dict:
        for k, v in value.items():
            if type(k) is not str:
                raise TypeError("a dict key is not a str")
            plain(v, depth + 1)
        return
    raise TypeError(f"a {t.__name__} is not plain data")


def describe(e):
    try:
        message = str(e)
    except BaseException:
        message = "(str() of the exception failed)"
    return {"type": type(e).__name__, "message": message[:4000], "traceback": traceback.format_exc()[-4000:]}


def send(chan, obj):
    try:
        data = json.dumps(obj, allow_nan=False, separators=(",", ":")).encode("utf-8")
    except (TypeError, ValueError) as e:
        data = json.dumps({"id": obj.get("id"), "ok": False, "error": {"kind": "worker", "type": "NotPlainData", "message": str(e)}}).encode()
    if len(data) > MAX_FRAME:
        data = json.dumps({"id": obj.get("id"), "ok": False, "error": {"kind": "worker", "type": "TooLarge", "message": f"{len(data)} bytes"}}).encode()
    chan.sendall(struct.pack(">I", len(data)) + data)


def receive(chan):
    head = exact(chan, 4)
    if head is None:
        return None
    (n,) = struct.unpack(">I", head)
    if n > MAX_FRAME:
        return None
    body = exact(chan, n)
    return None if body is None else json.loads(body)


def exact(chan, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = chan.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


if __name__ == "__main__":
    sys.exit(main())
