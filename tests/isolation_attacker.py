"""What a hostile local user can throw at rdzvd, for tests/isolation_test.py, which runs it as
another uid (runuser -u nobody). Standard library only: a bare HTTP/2 client (enough of HTTP/2
to open gRPC calls and send parts of messages, not to decode answers) and libmunge through
ctypes for credentials of the uid that runs it.

    isolation_attacker.py ATTACK HOST:PORT [--count N] [--munge-socket PATH] [--seconds S]
                          [--source ADDR]

Each attack opens its connections, holds them for --seconds (connection-churn: opens them at
--rate a second for --seconds, holding every one), prints one line of JSON (what it did),
closes everything and exits 0. Traffic goes only to HOST:PORT, which the test makes a
loopback address.
"""
import argparse
import ctypes
import json
import selectors
import socket
import struct
import sys
import threading
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0, 1, 3, 4, 6, 7, 8
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
SETTINGS_INITIAL_WINDOW_SIZE = 4


def frame(kind, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def hpack_int(value, prefix_bits):
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([value])
    out = [limit]
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def hpack_literal(name, value):
    """A literal header field without indexing, new name, no Huffman coding."""
    name, value = name.encode(), value.encode()
    return b"\x00" + hpack_int(len(name), 7) + name + hpack_int(len(value), 7) + value


def pb_varint(value):
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def pb_bytes(field, data):
    return pb_varint(field << 3 | 2) + pb_varint(len(data)) + data


def pb_int(field, value):
    return pb_varint(field << 3) + pb_varint(value)


def join_request(job, agent, host, index, min_agents, max_agents, padding=0):
    """A JoinRequest (rdzv.proto) of one process at node INDEX, with PADDING bytes in a field
    rdzvd does not know (number 1000)."""
    msg = (pb_bytes(1, job.encode()) + pb_bytes(2, agent.encode()) + pb_bytes(3, host.encode())
           + pb_int(4, index) + pb_int(5, index)
           + pb_int(6, 1) + pb_int(7, min_agents) + pb_int(8, max_agents)
           + pb_int(15, 1) + pb_int(18, 0))
    if padding:
        msg += pb_bytes(1000, b"p" * padding)
    return msg


def grpc_frame(message, declared=None):
    return b"\x00" + struct.pack(">I", len(message) if declared is None else declared) + message


class Munge:
    """Credentials of the uid that runs this, from the munged at SOCKET."""

    def __init__(self, path):
        self.lib = ctypes.CDLL("libmunge.so.2")
        self.lib.munge_ctx_create.restype = ctypes.c_void_p
        self.ctx = ctypes.c_void_p(self.lib.munge_ctx_create())
        self.lib.munge_ctx_set(self.ctx, ctypes.c_int(8), ctypes.c_char_p(path.encode()))

    def encode(self, payload):
        cred = ctypes.c_char_p()
        data = payload.encode()
        err = self.lib.munge_encode(ctypes.byref(cred), self.ctx, ctypes.c_char_p(data),
                                    ctypes.c_int(len(data)))
        if err != 0:
            raise RuntimeError("munge_encode failed: %d" % err)
        return cred.value.decode()


class H2:
    """One HTTP/2 connection. A reader thread answers SETTINGS and PING, as any client does, and
    notes which streams the server ended; it never grants the server more window than WINDOW."""

    def __init__(self, address, window=65535, reader=True):
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10,
                                             source_address=(SOURCE, 0) if SOURCE else None)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.lock = threading.Lock()
        self.next_stream = 1
        self.opened = 0
        self.ended = set()
        self.goaway = False
        self.closed = False
        self.authority = address
        self.buf = b""
        self.send(PREFACE + frame(SETTINGS, 0, 0, struct.pack(">HI", SETTINGS_INITIAL_WINDOW_SIZE,
                                                                 window)))
        if reader:
            threading.Thread(target=self._read, daemon=True).start()

    def send(self, data):
        with self.lock:
            try:
                self.sock.sendall(data)
            except OSError:
                self.closed = True

    def _read(self):
        self.sock.settimeout(None)
        while True:
            try:
                chunk = self.sock.recv(65536)
            except OSError:
                chunk = b""
            if not self.feed(chunk):
                return

    def feed(self, chunk):
        """Takes what the server sent (b"": it closed); False once the connection is closed."""
        if not chunk:
            self.closed = True
            return False
        buf = self.buf + chunk
        while len(buf) >= 9:
            length = int.from_bytes(buf[:3], "big")
            if len(buf) < 9 + length:
                break
            kind, flags = buf[3], buf[4]
            stream = int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF
            payload = buf[9:9 + length]
            buf = buf[9 + length:]
            if kind == SETTINGS and not flags & ACK:
                self.send(frame(SETTINGS, ACK, 0))
            elif kind == PING and not flags & ACK:
                self.send(frame(PING, ACK, 0, payload))
            elif kind == GOAWAY:
                self.goaway = True
            elif kind == RST_STREAM or (kind in (HEADERS, DATA) and flags & END_STREAM):
                self.ended.add(stream)
        self.buf = buf
        return True


    def open(self, method, metadata=(), body=None, end=True):
        """Opens a call of METHOD (e.g. rdzv.v1.Rendezvous/Join) with METADATA; sends BODY (bytes,
        a gRPC frame or part of one) when given, ending the stream when END. Its stream id."""
        stream = self.next_stream
        self.next_stream += 2
        self.opened += 1
        block = b"".join(hpack_literal(k, v) for k, v in (
            (":method", "POST"), (":scheme", "http"), (":path", "/" + method),
            (":authority", self.authority), ("content-type", "application/grpc"),
            ("te", "trailers"), *metadata))
        self.send(frame(HEADERS, END_HEADERS, stream, block))
        if body is not None:
            for i in range(0, len(body), 16384):
                last = i + 16384 >= len(body)
                self.send(frame(DATA, END_STREAM if last and end else 0, stream,
                                body[i:i + 16384]))
        return stream

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


class Pump(threading.Thread):
    """Answers the server for many H2 connections made with reader=False, on one thread."""

    def __init__(self):
        super().__init__(daemon=True)
        self.selector = selectors.DefaultSelector()
        self.lock = threading.Lock()

    def add(self, conn):
        conn.sock.setblocking(False)
        with self.lock:
            self.selector.register(conn.sock, selectors.EVENT_READ, conn)

    def run(self):
        while True:
            with self.lock:
                ready = self.selector.select(timeout=0) if self.selector.get_map() else []
            if not ready:
                time.sleep(0.01)
                continue
            for key, _ in ready:
                conn = key.data
                try:
                    chunk = conn.sock.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                if not conn.feed(chunk):
                    # Closed by the server: its socket goes, so that the attacker's open files
                    # stay within its limit for as long as it keeps making new ones.
                    with self.lock:
                        self.selector.unregister(conn.sock)
                    conn.close()

SOURCE = ""


def server_closed(sock):
    """Whether the server has closed SOCK (reading what it sent until then)."""
    sock.setblocking(False)
    try:
        while True:
            if not sock.recv(65536):
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def connections(address, count, streams_each, window=65535):
    out = []
    for _ in range((count + streams_each - 1) // streams_each):
        try:
            out.append(H2(address, window))
        except OSError:
            break
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("attack")
    parser.add_argument("address")
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--munge-socket", default="")
    parser.add_argument("--seconds", type=float, default=3)
    parser.add_argument("--job", default="attack")
    parser.add_argument("--rate", type=float, default=60,
                        help="connection-churn: new connections a second")
    parser.add_argument("--slow-readers", type=int, default=64,
                        help="partial-http: connections that send a whole request and never "
                             "read the answer")
    parser.add_argument("--source", default="",
                        help="the local address to connect from (another loopback address "
                             "stands for another host)")
    args = parser.parse_args()
    global SOURCE
    SOURCE = args.source
    path = "rdzv.v1.Rendezvous/Join"
    opened = 0
    failed = 0  # connections that could not be made
    conns = []
    raw = []
    started = time.monotonic()
    if args.attack == "authenticated-headers-only":
        # A valid credential on each call's headers, and never its message.
        munge = Munge(args.munge_socket)
        conns = connections(args.address, args.count, 16)
        for conn in conns:
            for _ in range(16):
                if opened >= args.count:
                    break
                conn.open(path, (("x-rdzv-munge", munge.encode("rdzv.v1 Join " + args.job)),),
                          body=None, end=False)
                opened += 1
    elif args.attack in ("half-sent", "headers-only"):
        # No credential: headers, and for half-sent the first 200 KiB of a 256 KiB message.
        conns = connections(args.address, args.count, 16)
        for conn in conns:
            for _ in range(16):
                if opened >= args.count:
                    break
                body = None
                if args.attack == "half-sent":
                    body = grpc_frame(b"x" * (200 * 1024), declared=256 * 1024 - 5)
                conn.open(path, body=body, end=False)
                opened += 1
    elif args.attack == "idle-connections":
        # TCP connections that never speak (ADDRESS may be rdzvd's or its metrics port).
        host, port = args.address.rsplit(":", 1)
        for _ in range(args.count):
            try:
                raw.append(socket.create_connection(
                    (host, int(port)), timeout=10,
                    source_address=(SOURCE, 0) if SOURCE else None))
                opened += 1
            except OSError:
                break
    elif args.attack in ("padded-joins", "non-reading", "status-flood"):
        # Authenticated joins of this uid's own job, which never fills (it waits for more agents
        # than come): padded with unknown fields, or with long ids for a large status, or on
        # connections that grant no window for the events rdzvd sends.
        munge = Munge(args.munge_socket)
        window = 0 if args.attack == "non-reading" else 65535
        conns = connections(args.address, args.count, 8, window)
        for conn in conns:
            for _ in range(8):
                if opened >= args.count:
                    break
                if args.attack == "status-flood":
                    agent = ("a%06d" % opened) + "x" * 240
                    host = "h" * 250 + ("%05d" % opened)
                    padding = 0
                else:
                    agent, host = "agent-%d" % opened, "host-%d" % opened
                    padding = 200 * 1024 if args.attack == "padded-joins" else 0
                message = join_request(args.job, agent, host, opened, 100_000, 100_000, padding)
                cred = munge.encode("rdzv.v1 Join " + args.job)
                conn.open(path, (("x-rdzv-munge", cred),), grpc_frame(message))
                opened += 1
            time.sleep(0.005)  # a steady stream of joins, as agents that start together send
    elif args.attack == "connection-churn":
        # Without credentials, RATE new connections a second for SECONDS, each with a call that
        # has no credential (refused on its headers), all held open: as a user of the victim's
        # own host would, to fill the host's connection bound and keep it full.
        deadline = started + args.seconds
        pump = Pump()
        pump.start()
        while time.monotonic() < deadline:
            due = started + opened / args.rate
            if time.monotonic() < due:
                time.sleep(min(due - time.monotonic(), 0.05))
                continue
            try:
                conn = H2(args.address, reader=False)
            except OSError:
                failed += 1
                opened += 1
                continue
            conn.open(path, body=None, end=False)
            pump.add(conn)
            conns.append(conn)
            opened += 1
    elif args.attack == "credential-flood":
        # COUNT valid credentials (made first), sent on calls of connections that have proven
        # this uid, each call cancelled as soon as it is sent: rdzvd decodes every one. Prints
        # "ready" once the connections are proven and waits for a line on stdin, then floods.
        munge = Munge(args.munge_socket)
        creds = [munge.encode("rdzv.v1 Join " + args.job) for _ in range(args.count)]
        conns = connections(args.address, 16 * 32, 16)[:32]
        for conn in conns:
            conn.open(path, (("x-rdzv-munge", munge.encode("rdzv.v1 Join " + args.job)),),
                      body=None, end=False)
        time.sleep(2)  # decoded: every connection has proven this uid
        print("ready", flush=True)
        sys.stdin.readline()
        started = time.monotonic()
        for i, cred in enumerate(creds):
            conn = conns[i % len(conns)]
            stream = conn.open(path, (("x-rdzv-munge", cred),), body=None, end=False)
            conn.send(frame(RST_STREAM, 0, stream, struct.pack(">I", 8)))  # CANCEL
            opened += 1
        time.sleep(args.seconds)
    elif args.attack == "partial-http":
        # COUNT connections that send the start of a request and nothing more, and SLOW_READERS
        # that send a whole request and never read the answer (a small receive buffer).
        host, port = args.address.rsplit(":", 1)
        for i in range(args.count + args.slow_readers):
            try:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                if i >= args.count:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                if SOURCE:
                    sock.bind((SOURCE, 0))
                sock.settimeout(10)
                sock.connect((host, int(port)))
                sock.sendall(b"GET /metrics HTTP/1.1\r\n" if i < args.count
                             else b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                raw.append(sock)
                opened += 1
            except OSError:
                break
    else:
        raise SystemExit("unknown attack " + args.attack)
    open_for = time.monotonic() - started
    time.sleep(0 if args.attack == "connection-churn" else args.seconds)
    ended = sum(len(c.ended) for c in conns)
    closed_conns = sum(1 for c in conns if c.closed)
    raw_closed = sum(1 for s in raw if server_closed(s))
    goaway = sum(1 for c in conns if c.goaway or c.closed)
    # Streams the server ended, one by one or with their connection.
    refused = sum(c.opened if c.goaway or c.closed else len(c.ended) for c in conns)
    for conn in conns:
        conn.close()
    for s in raw:
        s.close()
    print(json.dumps({"attack": args.attack, "opened": opened, "connections": len(conns) + len(raw),
                      "ended_by_server": ended, "connections_closed_by_server": goaway,
                      "ended_or_closed": refused, "raw_closed_by_server": raw_closed,
                      "closed_by_server": closed_conns, "failed": failed,
                      "open_s": round(open_for, 2)}), flush=True)


if __name__ == "__main__":
    main()
