"""Many provider calls time out at once, on the same workers as calls that
succeed. The provider answers ordinary charges right at the API's timeout,
so that answers and timeouts of different calls land in one batch of
socket events: a call's timeout, run by libcurl while it handles another
call's socket, closes a socket whose own event is still waiting in that
batch. Every request is answered (504 or 201), every payment that timed
out succeeds on a retry with exactly one charge at the provider, and no
worker dies.

Kore's memory pool hides a use-after-free of that socket's state: under
make test-sanitize the freed state is caught, and the worker dies."""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (ANSWER_BOUND, REQUEST_BOUND, Api, Background, Provider, Tap,  # noqa: E402
                     new_key)

t = Tap()
TIMEOUT_MS = 1000
# Ordinary charges are answered about when the API gives up on them:
# some in time, some just late.
LATENCY_MS = TIMEOUT_MS - 15
ROUNDS, SLOW, BORDERLINE = 5, 24, 24
# How long the retries of every payment may go on before the test calls it
# a hang: a bound, not a measure; under the sanitizers on a loaded machine
# the provider's own answers can take past the timeout for a while.
SETTLE_BOUND = 180

# "slow" thinks the latency plus the provider's own timeout setting plus 1 s.
provider = Provider(IDEM_PROVIDER_LATENCY_MS=LATENCY_MS,
                    IDEM_PROVIDER_TIMEOUT_MS=TIMEOUT_MS).start()
# Its own log: other tests' servers append their shutdown to api.log.
api = Api(name="api-timeouts", IDEM_PROVIDER_URL=provider.url,
          IDEM_PROVIDER_TIMEOUT_MS=TIMEOUT_MS, IDEM_LEASE_SECONDS=2).start()
pids = [api.proc.pid] + api.workers()


def payment(recipient, amount):
    return {"amount": amount, "currency": "RUB", "recipient": recipient}


def pay(key, body):
    return api.post("/v1/payments", body, key=key, timeout=ANSWER_BOUND)


def settle(key, body, deadline):
    """Retries a payment until it succeeds; a 409 (the lease, or the
    provider still at work on the derived key) or a 504 (the provider
    still thinking) is followed by another retry."""
    while True:
        r = pay(key, body)
        if r.status == 201 or r.status not in (409, 504) or \
                time.monotonic() > deadline:
            return r
        time.sleep(0.2)


first, keys = [], {}
for rnd in range(ROUNDS):
    batch = []
    for i in range(max(SLOW, BORDERLINE)):
        if i < SLOW:
            batch.append(("slow", new_key(f"slow{rnd}"), 700 + i))
        if i < BORDERLINE:
            batch.append(("border", new_key(f"border{rnd}"), 800 + i))
    jobs = [(kind, key, amount, Background(pay, key, payment(
        "slow" if kind == "slow" else f"acc-border-{rnd}-{amount}", amount)))
        for kind, key, amount in batch]
    for kind, key, amount, job in jobs:
        try:
            r = job.wait(REQUEST_BOUND)
        except Exception as e:  # a cut connection: a worker died under it
            r = e
        first.append((kind, key, r))
        keys[key] = payment("slow" if kind == "slow" else
                            f"acc-border-{rnd}-{amount}", amount)

answered = [r for _, _, r in first if hasattr(r, "status")]
t.eq(len(answered), len(first), f"all {len(first)} concurrent payments were answered")
slow = [r.status for kind, _, r in first if kind == "slow" and hasattr(r, "status")]
t.eq(set(slow), {504}, f"the {len(slow)} calls to the slow recipient: 504")
border = [r.status for kind, _, r in first if kind == "border" and hasattr(r, "status")]
t.ok(set(border) <= {201, 504}, "the calls answered at the timeout: 201 or 504",
     sorted(border))
t.note(f"answered at the timeout: {border.count(201)} in time, "
       f"{border.count(504)} too late")

deadline = time.monotonic() + SETTLE_BOUND
retries = {key: settle(key, body, deadline) for key, body in keys.items()}
late = {k: r for k, r in retries.items() if r.status != 201}
t.eq(late, {}, f"every one of the {len(keys)} payments succeeds on a retry")
charges = {key: len(provider.charges(f"shop-1:{key}")) for key in keys}
t.eq({k: n for k, n in charges.items() if n != 1}, {},
     "exactly one charge per payment at the provider")

t.eq([api.proc.pid] + api.workers(), pids, "the same API workers, none restarted")
log = api.read_log()
t.ok(" gone" not in log and "exited" not in log, "no worker exited or is gone",
     "\n".join(l for l in log.splitlines() if "gone" in l or "exited" in l))

api.stop()
provider.stop()
t.done()
