"""The chaos soak, short (tests/lib/soak.py): a few hundred keys of every
operation, each sent as three concurrent duplicates to two API instances,
while every fault is injected at least once in a seeded random order (a
worker killed with SIGKILL, an API instance killed and restarted, a
reload, the fake provider down for seconds, PostgreSQL restarted) and the
provider fails a tenth and is slow for a twentieth of the payments and
refunds. Then every key is retried to its end and the books are checked:
no double, no loss, every acknowledged answer identical and in the
database, balances equal to their ledgers, payments and refunds equal to
the provider's, no key left in progress, no worker left dead. SOAK_SEED
replays a run's plan and order of faults. make soak runs the full one."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import Tap  # noqa: E402
import soak  # noqa: E402

t = Tap()
cfg = soak.Config(keys=300, seconds=25, groups=16, settle_seconds=150,
                  gap=(1.0, 2.5), kill_gap=(1.5, 3.5), from_env=False)
soak.tap(t, cfg)
t.done()
