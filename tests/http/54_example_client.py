"""examples/pay.py, the client that retries right, run as a program against
the real API and fake provider: a normal payment; a client timeout shorter
than the provider, retried with the same key to one charge; a 409 in
flight, retried after its Retry-After; final answers (422 for another
body under the key, 422 for a recipient the provider refuses for good,
402, 401) taken without a retry; and no API listening, given up on with
the key printed. Then against a scripted server in this test, the answers
the API gives only under faults: a 503 with an HTTP-date Retry-After (the
IMF-fixdate and the asctime form) waited out, 500/502/504 retried, a 429
with Retry-After, a replayed 5xx taken as final, a Retry-After in
a non-ASCII digit ignored, and a listener that never answers, given up on
within the deadline. Every retry carries the same key."""

import email.utils
import os
import re
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (COMMAND_BOUND, ROOT, Api, Background, Provider, StubProvider,  # noqa: E402
                     Tap, charges_to, free_port, new_key, provider_calls, wait_until)

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


def pay(*args, url=URL, env=None):
    started = time.monotonic()
    argv = [sys.executable, PAY] + (["--url", url] if url is not None else [])
    proc = subprocess.run(argv + list(args), capture_output=True, text=True,
                          timeout=COMMAND_BOUND, env=dict(os.environ, **(env or {})))
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

# No --url: $IDEM_URL, else $IDEM_PORT, names the API.
for name, env in [("IDEM_PORT", {"IDEM_PORT": str(api.port), "IDEM_URL": ""}),
                  ("IDEM_URL", {"IDEM_URL": URL, "IDEM_PORT": str(free_port())})]:
    rcpt = new_key("acc")
    r = pay("--recipient", rcpt, url=None, env=env)
    t.ok(r.status == 0 and charges_to(rcpt) == 1,
         f"without --url, ${name} names the API", r)

# The defaults outlast an attempt the client cut: the key stays taken until
# its lease ends (IDEM_LEASE_SECONDS, 30 s), then the retry that takes it
# over waits for the provider (IDEM_PROVIDER_TIMEOUT_MS, 10 s). Even at the
# shortest jitter (half of each backoff) the attempts wait longer.
sys.path.insert(0, os.path.dirname(PAY))
import pay as pay_module  # noqa: E402

defaults = pay_module.parse_args([])
shortest = sum(min(defaults.max_delay, defaults.base_delay * 2 ** (n - 1)) / 2
               for n in range(1, defaults.max_attempts))
t.ok(shortest >= 30 + 10 and defaults.deadline >= 30 + 10 + defaults.timeout,
     "the default attempts and deadline outlast a lease and a takeover",
     (defaults, shortest))


# --- Against a scripted server: answers the API gives only under faults.

JSON = {"Content-Type": "application/json"}
PAYMENT = (201, JSON, {"payment_id": 1, "charge_id": "ch_stub", "status": "succeeded",
                       "amount": 10000, "currency": "RUB"})
PROBLEM = {"Content-Type": "application/problem+json"}


def scripted(*answers):
    """A server that answers the n-th POST with answers[n-1] (a function of
    nothing, called at that moment, or a tuple); the last answer repeats.
    seen lists (wall-clock time, Idempotency-Key) of each request."""
    seen = []

    def answer(n):
        seen.append((time.time(), stub.calls[-1][1]))
        a = answers[min(n, len(answers)) - 1]
        return a() if callable(a) else a

    stub = StubProvider(default=answer)
    # StubProvider numbers the calls per key: one key per run here.
    return stub, seen


def http_date(when, form):
    if form == "IMF-fixdate":
        return email.utils.formatdate(when, usegmt=True)
    return time.strftime("%a %b %e %H:%M:%S %Y", time.gmtime(when))  # asctime


# A 503 with an HTTP date 2 s ahead, then the payment: the client waits
# until that date, not its 0.1 s backoff, and sends the same key. The
# client runs 5 hours east of UTC: an asctime date (no zone) read as local
# time would lie in the past.
for form in ("IMF-fixdate", "asctime"):
    until = []

    def unavailable(form=form, until=until):
        until.append(int(time.time()) + 3)
        return (503, dict(PROBLEM, **{"Retry-After": http_date(until[0], form)}),
                {"type": "about:blank", "status": 503})

    stub, seen = scripted(unavailable, PAYMENT)
    r = pay("--base-delay", "0.1", "--max-delay", "0.2", "--deadline", "20",
            url=stub.url, env={"TZ": "EAST-5"})
    stub.stop()
    t.ok(r.status == 0 and len(seen) == 2, f"503 with an {form} Retry-After, then 201",
         (r, seen))
    t.ok(len(seen) == 2 and seen[1][0] >= until[0],
         f"{form}: the retry waited until the date", (seen, until, r))
    t.ok(len(seen) == 2 and seen[0][1] == seen[1][1] and seen[0][1],
         f"{form}: the retry sent the same Idempotency-Key", seen)

# 500, 502 and 504 without Retry-After: retried after the backoff.
stub, seen = scripted((500, PROBLEM, b"{}"), (502, PROBLEM, b"{}"),
                      (504, PROBLEM, b"{}"), PAYMENT)
r = pay("--base-delay", "0.05", "--max-delay", "0.1", url=stub.url)
stub.stop()
t.ok(r.status == 0 and [a.split()[0] for a in r.attempts] == ["500", "502", "504", "201"],
     "500, 502, 504 retried, then 201", r)
t.ok(len(seen) == 4 and len({k for _, k in seen}) == 1,
     "all four with the same Idempotency-Key", seen)

# 429 with Retry-After: 2.
stub, seen = scripted((429, {"Retry-After": "2"}, b""), PAYMENT)
r = pay("--base-delay", "0.05", "--max-delay", "0.1", url=stub.url)
stub.stop()
t.ok(r.status == 0 and len(seen) == 2 and seen[1][0] - seen[0][0] >= 2,
     "429 with Retry-After: 2: retried after 2 s", (r, seen))
t.ok(len(seen) == 2 and seen[0][1] == seen[1][1], "with the same key", seen)

# Retry-After in digits other than ASCII's is not a number of seconds:
# ignored, the backoff is used. ("\u00b2", a superscript two, is one byte
# in the Latin-1 of HTTP headers; str.isdigit() takes it, float() raised.)
stub, seen = scripted((503, {"Retry-After": "\u00b2"}, b""), PAYMENT)
r = pay("--base-delay", "0.05", "--max-delay", "0.1", "--deadline", "10",
        url=stub.url)
stub.stop()
t.ok(r.status == 0 and len(seen) == 2 and r.seconds < 8,
     "Retry-After '\u00b2': ignored, retried after the backoff", r)

# A replayed 5xx is the key's saved answer: final, not retried.
stub, seen = scripted((500, dict(PROBLEM, **{"Idempotent-Replayed": "true"}),
                       {"type": "about:blank", "status": 500}), PAYMENT)
r = pay("--base-delay", "0.05", "--max-delay", "0.1", url=stub.url)
stub.stop()
t.ok(r.status == 1 and len(seen) == 1 and '"status": 500' in r.out and
     "not retried" in r.err, "a replayed 500: final, exit status 1, not retried", (r, seen))

# A listener that accepts connections and never answers: each attempt times
# out, is retried, and the client gives up within its deadline.
silent = socket.socket()
silent.bind(("127.0.0.1", 0))
silent.listen(16)
r = pay("--timeout", "0.5", "--base-delay", "0.1", "--max-delay", "0.2",
        "--deadline", "3", url="http://127.0.0.1:%d" % silent.getsockname()[1])
silent.close()
t.ok(r.status == 3 and len(r.attempts) >= 2 and
     all(a == "timed out" for a in r.attempts),
     "an API that never answers: attempts time out and are retried", r)
t.ok(r.seconds < 3 + 2 and "run again with --key" in r.err,
     "then it gives up within the 3 s deadline, naming the key", r)

t.done()
