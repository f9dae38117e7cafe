"""A DNS server for tests that run in a network namespace of their own
(harness.in_netns), whose resolv.conf names 127.0.0.1."""

import socket
import struct
import threading

# How long slowfail takes to refuse a query (a stimulus, not a verdict).
SLOW_SECONDS = 1.5


class Resolver:
    """A DNS server on 127.0.0.1:53 of the namespace: A queries for name
    answered with self.address (a list: one A record each), held
    unanswered (hold), refused with SERVFAIL (fail), or refused so
    after a while (slowfail: a resolver that keeps failing slowly);
    any other query gets an empty answer."""

    def __init__(self, name):
        self.name = name
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 53))
        self.mode = "hold"
        self.address = ["127.0.0.1"]
        self.queries = 0
        self.answered = 0
        self.held = []
        self.lock = threading.Lock()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            data, peer = self.sock.recvfrom(512)
            with self.lock:
                self.queries += 1
                if self.mode == "slowfail":
                    threading.Timer(SLOW_SECONDS, self._slowfail,
                                    (data, peer)).start()
                    continue
                if self.mode == "hold":
                    self.held.append((data, peer))
                    continue
                self._answer(data, peer)

    def _answer(self, query, peer):
        qid, _, qd = struct.unpack(">HHH", query[:6])[:3]
        end = 12
        while query[end] != 0:
            end += query[end] + 1
        question = query[12:end + 5]
        qname = []
        i = 12
        while query[i] != 0:
            qname.append(query[i + 1:i + 1 + query[i]].decode())
            i += query[i] + 1
        qtype = struct.unpack(">H", query[end + 1:end + 3])[0]
        flags, answers = 0x8180, b""
        if self.mode == "fail":
            flags = 0x8182
        elif ".".join(qname).lower() == self.name and qtype == 1:
            answers = b"".join(b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 0, 4)
                               + socket.inet_aton(a) for a in self.address)
        header = struct.pack(">HHHHHH", qid, flags, 1,
                             len(self.address) if answers else 0, 0, 0)
        self.sock.sendto(header + question + answers, peer)
        self.answered += 1

    def _slowfail(self, data, peer):
        with self.lock:
            mode, self.mode = self.mode, "fail"
            self._answer(data, peer)
            self.mode = mode

    def set(self, mode, address=None):
        with self.lock:
            self.mode = mode
            if address:
                self.address = [address] if isinstance(address, str) else address
            if mode != "hold":
                for data, peer in self.held:
                    self._answer(data, peer)
                self.held = []
