"""The chaos soak, short, with the Stripe adapter (tests/lib/soak.py,
provider "stripe"): the same keys, faults and books as 47_chaos_soak.py,
but the payments and refunds go through IDEM_PROVIDER_KIND=stripe to
stripe-stateful-mock. Its test tokens misbehave in place of the fake
provider's recipients: a tenth of the payments use tok_500 (a 500 kept
under every generation of the key: never finished, nothing charged), a
twentieth tok_500|tok_visa (a kept 500, reconciled, then charged under the
second generation), tok_chargeDeclined and amount_too_large. A provider
outage is a proxy that holds and cuts its connections (the mock keeps its
state only in memory, as Stripe keeps its). The books count the mock's
charges and refunds by metadata[idempotency_key], every generation of a
key counted for it. SOAK_SEED replays a run; make soak SOAK_PROVIDER=stripe
runs the full one."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import Tap  # noqa: E402
import soak  # noqa: E402

t = Tap()
cfg = soak.Config(keys=250, seconds=20, groups=16, settle_seconds=150,
                  gap=(1.0, 2.5), kill_gap=(1.5, 3.5), from_env=False, provider="stripe")
soak.tap(t, cfg)
t.done()
