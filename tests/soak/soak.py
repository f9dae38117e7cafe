"""make soak: the chaos soak at full size (tests/lib/soak.py), 10,000 keys
by default. SOAK_KEYS, SOAK_SECONDS (the fault phase; keys are spread
over it), SOAK_SEED, SOAK_GROUPS (clients sending at once, three
duplicates each), SOAK_SETTLE_SECONDS. Prints the figures, then checks the
books as TAP."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import Tap  # noqa: E402
import soak  # noqa: E402

t = Tap()
s = soak.run(soak.Config(), log=t.note)
t.note("faults, in order:")
for line in sorted(s.fault_log):
    t.note(line)
for line in s.figures():
    t.note(line)
for name, ok, diag in s.checks:
    t.ok(ok, name, diag)
t.done()
