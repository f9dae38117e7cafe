"""examples/pay.py, the client that retries right, run as a program against
the real API and fake provider: a normal payment; a client timeout shorter
than the provider, retried with the same key to one charge; a 409 in
flight, retried after its Retry-After; final answers (422 for another
body under the key, 422 for a recipient the provider refuses for good,
402, 401) taken without a retry; and an API that never answers, given up
on with the key printed."""

import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (ROOT, Api, Background, Provider, Tap, charges_to,  # noqa: E402
                     free_port, new_key, provider_calls, wait_until)

t = Tap()
PAY = os.path.join(ROOT, "examples", "pay.py")
# The provider thinks 1.5 s; the API waits 3 s for it and holds a key 4 s.
provider = Provider(IDEM_PROVIDER_LATENCY_MS=1500, IDEM_PROVIDER_TIMEOUT_MS=3000).start()
api = Api(IDEM_PROVIDER_URL=provider.url, IDEM_LEASE_SECONDS=4,
          IDEM_PROVIDER_TIMEOUT_MS=3000).start()
URL = f"http://127.0.0.1:{api.port}"


class Run:
    def __init__(self, proc, seconds):
        self.status = proc.returncode
        self.out = proc.stdout
        self.err = proc.stderr
        self.seconds = seconds
        self.attempts = re.findall(r"\] attempt \d+: (.*)", self.err)

    def __repr__(self):
        return f"<exit {self.status}, stdout {self.out!r}\nstderr:\n{self.err}>"


def pay(*args, url=URL):
    started = time.monotonic()
    proc = subprocess.run([sys.executable, PAY, "--url", url, *args],
                          capture_output=True, text=True, timeout=90)
    return Run(proc, time.monotonic() - started)


def replay_of(key, recipient, **extra):
    """The API's saved response for the key, through the harness (so it is
    checked against docs/openapi.json)."""
    return api.post("/v1/payments", dict({"amount": 10000, "currency": "RUB",
                                          "recipient": recipient}, **extra), key=key)


# A normal run: one attempt, 201, one charge under the derived key.
key, rcpt = new_key("ex"), new_key("acc")
r = pay("--key", key, "--recipient", rcpt, "--purpose", "order 17")
t.eq(r.status, 0, "a normal payment: exit status 0")
t.ok(len(r.attempts) == 1 and r.attempts[0].startswith("201 Created"),
     "one attempt, 201", r)
body = r.out.strip()
t.ok(body.startswith('{"payment_id":') and '"status":"succeeded"' in body,
     "the body on stdout is the payment", r)
again = replay_of(key, rcpt, purpose="order 17")
t.ok(again.status == 201 and again.replayed and again.body.decode() == body,
     "it is the API's saved response byte for byte", again)
charges = provider.charges(f"shop-1:{key}")
t.ok(len(charges) == 1 and charges[0]["charge_id"] in body,
     "the provider holds its one charge under shop-1:<key>", charges)
t.eq(charges_to(rcpt), 1, "one charge to the recipient")

# A fresh key per run: two runs are two payments.
r1 = pay("--recipient", rcpt, "--purpose", "order 18")
r2 = pay("--recipient", rcpt, "--purpose", "order 18")
keys = {m for run in (r1, r2) for m in re.findall(r"Idempotency-Key (\S+)", run.err)}
t.ok(r1.status == 0 and r2.status == 0 and len(keys) == 2,
     "without --key each run makes its own uuid4 key", (r1, r2))
t.eq(charges_to(rcpt), 3, "and its own charge")

# The client gives up on an attempt after 0.5 s while the provider thinks
# 1.5 s: it retries with the same key (409 while the first attempt holds
# the key) until it gets the payment, charged once.
key, rcpt = new_key("ex"), new_key("acc")
r = pay("--key", key, "--recipient", rcpt, "--timeout", "0.5", "--base-delay", "0.3",
        "--max-delay", "1", "--max-attempts", "20", "--deadline", "40")
t.note(r.err)
t.eq(r.status, 0, "client timeout shorter than the provider: exit status 0 in the end")
t.ok(r.attempts and r.attempts[0] == "timed out", "the first attempt timed out", r)
t.ok(len(r.attempts) >= 2 and r.attempts[-1].startswith("201 Created"),
     "a later attempt with the same key got 201", r)
t.ok(all(m == key for m in re.findall(r"Idempotency-Key (\S+)", r.err)),
     "one key throughout", r)
t.eq(charges_to(rcpt), 1, "the provider charged once")
charges = provider.charges(f"shop-1:{key}")
t.ok(len(charges) == 1 and charges[0]["charge_id"] in r.out,
     "the final body holds that one charge", (charges, r.out))
again = replay_of(key, rcpt)
t.ok(again.status == 201 and again.body.decode() == r.out.strip(),
     "and it is the key's saved response", again)

# A 409 in flight: another request with the key is at the provider. The
# client waits the 409's Retry-After (the first one's provider call gives
# up within 3 s) and gets the first one's payment.
key, rcpt = new_key("ex"), new_key("acc")
first = Background(replay_of, key, rcpt)
wait_until(lambda: provider.charges(f"shop-1:{key}"), "the provider to record the charge")
r = pay("--key", key, "--recipient", rcpt, "--base-delay", "0.1", "--max-delay", "0.2")
done = first.wait()
t.note(r.err)
t.eq(done.status, 201, "the request in flight got 201")
t.eq(r.status, 0, "409 in flight: exit status 0")
m = re.match(r"409 Conflict request-in-progress, Retry-After: (\d+)$",
             r.attempts[0] if r.attempts else "")
t.ok(m is not None, "the first attempt got 409 request-in-progress with Retry-After", r)
wait = re.search(r"retrying in ([\d.]+) s", r.err)
t.ok(m is not None and wait is not None and float(wait.group(1)) >= int(m.group(1)),
     "it waited at least Retry-After, not its 0.2 s backoff", r)
t.ok(m is not None and r.seconds >= int(m.group(1)), "the run took that long", r.seconds)
t.ok(len(r.attempts) == 2 and r.attempts[1] == "201 Created (Idempotent-Replayed: true)",
     "the retry got the replay", r)
t.eq(r.out.strip(), done.body.decode(), "the first request's payment, byte for byte")
t.eq(charges_to(rcpt), 1, "one charge")

# Final answers: one attempt each, exit status 1, the problem on stdout.
key, rcpt = new_key("ex"), new_key("acc")
t.eq(pay("--key", key, "--recipient", rcpt).status, 0, "a payment to reuse the key of")
r = pay("--key", key, "--recipient", rcpt, "--amount", "50000")
t.ok(r.status == 1 and r.attempts == ["422 Unprocessable Entity idempotency-key-reused"],
     "the key with another amount: 422 once, not retried", r)
t.ok('"status":422' in r.out and "a final refusal: not retried" in r.err,
     "the problem on stdout", r)
t.eq(charges_to(rcpt), 1, "no second charge")

key = new_key("ex")
r = pay("--key", key, "--recipient", "reject")
t.ok(r.status == 1 and r.attempts == ["422 Unprocessable Entity payment-rejected"],
     "recipient \"reject\" (the provider's 400): 422 once, not retried", r)
t.eq(provider_calls(f"shop-1:{key}"), 1, "the provider was asked once")
t.eq(provider.charges(f"shop-1:{key}"), [], "and charged nothing")

key = new_key("ex")
r = pay("--key", key, "--recipient", "decline")
t.ok(r.status == 1 and r.attempts == ["402 Payment Required card-declined"],
     "recipient \"decline\": 402 once, not retried", r)
t.eq(provider_calls(f"shop-1:{key}"), 1, "the provider was asked once")

r = pay("--token", "no-such-token", "--recipient", new_key("acc"))
t.ok(r.status == 1 and r.attempts == ["401 Unauthorized unauthorized"],
     "an unknown token: 401 once, not retried", r)

# Nothing listens: every attempt fails, the client gives up with the key.
r = pay("--max-attempts", "3", "--base-delay", "0.05", "--max-delay", "0.1",
        url=f"http://127.0.0.1:{free_port()}")
t.ok(r.status == 3 and len(r.attempts) == 3 and
     all(a.startswith("no answer (ConnectionRefusedError") for a in r.attempts),
     "no API: 3 attempts, then exit status 3", r)
t.ok("gave up after 3 attempts" in r.err and "run again with --key" in r.err and
     r.out == "", "it says the outcome is unknown and names the key", r)

# The deadline comes before the attempts run out.
r = pay("--max-attempts", "50", "--base-delay", "0.4", "--max-delay", "0.4",
        "--deadline", "1.5", url=f"http://127.0.0.1:{free_port()}")
t.ok(r.status == 3 and "would pass the 1.5 s deadline" in r.err and r.seconds < 5,
     "a deadline of 1.5 s: it gives up in time", r)

t.done()
