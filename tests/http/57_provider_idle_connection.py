"""A provider's idle kept-alive connection is not an answer. Kore (the fake
provider), like most servers, times out a kept-alive connection that has
been idle for a while (Kore: http_header_timeout, 10 s by default): it
writes a 408 on it and closes it. A payment sent on that connection read
the stale 408 as the provider's answer and got a 502 from a healthy
provider. The provider client never reuses a connection idle for longer
than PROVIDER_CONN_MAXAGE_S (4 s), and a 408 read on a reused connection
(the request was never read) is sent once more on a fresh one, with the
same derived provider key.

The fake provider's idle timeout is lowered here to keep the test short:
5 s, above the client's bound (the bound alone avoids the stale 408), and
1 s, well below it (only the resend on a fresh connection does: the wait
of 2 s leaves 2 s before the bound, for a slow sanitizer build)."""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (Api, Provider, Tap, charges_to, new_key,  # noqa: E402
                     provider_calls)

t = Tap()


def payment(recipient):
    return {"amount": 10000, "currency": "RUB", "recipient": recipient}


RESENT = "provider answered 408 on a reused connection"


def idle_then_pay(idle_timeout, name, resends):
    provider = Provider(name=f"provider-idle-{idle_timeout}",
                        conf_extra=[f"http_header_timeout {idle_timeout}"],
                        IDEM_PROVIDER_LATENCY_MS=0).start()
    # One worker: both payments go through the same connection cache.
    api = Api(name=f"api-idle-{idle_timeout}", conf_extra=["workers 1"],
              IDEM_PROVIDER_URL=provider.url).start()

    first = api.post("/v1/payments", payment(f"{name}-first"), key=new_key("idle"))
    t.eq(first.status, 201, f"{name}: the first payment is made")
    # Past the provider's idle timeout: it wrote its 408 on the
    # connection the first payment left open, and closed it.
    time.sleep(idle_timeout + 1.0)

    key = new_key("idle")
    r = api.post("/v1/payments", payment(f"{name}-second"), key=key)
    t.ok(r.status == 201 and not r.replayed,
         f"{name}: a payment after the idle timeout is made (not a 502)", r)
    t.eq(charges_to(f"{name}-second"), 1, f"{name}: exactly one charge")
    t.eq(provider_calls(f"shop-1:{key}"), 1,
         f"{name}: the provider read the request once")

    # The connection the second payment opened serves the next one.
    again = api.post("/v1/payments", payment(f"{name}-third"), key=new_key("idle"))
    t.eq(again.status, 201, f"{name}: the next payment on the new connection")
    t.eq(api.read_log().count(RESENT), resends,
         f"{name}: requests sent again after a stale 408")

    api.stop()
    provider.stop()


# The provider's idle timeout above the client's bound: the idle connection
# is not reused at all.
idle_then_pay(5, "above-bound", 0)
# Below it: the stale 408 is read, and the request sent again on a fresh
# connection.
idle_then_pay(1, "below-bound", 1)

t.done()
