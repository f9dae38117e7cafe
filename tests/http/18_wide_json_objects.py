"""An object with thousands of members, as many as a 64 KiB body holds, is
parsed in O(n log n): the duplicate-member check sorts the names instead of
comparing each with every earlier one (7,000 members took ~25 million
comparisons, tens of milliseconds of a worker's event loop). No clock is
read: the dev build reports how many names the parser compared
(x-json-name-comparisons on POST /dev/canonical-json). Duplicates are
still refused, however far apart."""

import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import Api, Tap, new_key, post, quote, sql_value  # noqa: E402

t = Tap()
api = Api().start()
ORDER = '"customer_id":"c-wide","amount":1000,"currency":"RUB"'


def wide(limit=64 * 1024, duplicate=False):
    """An order padded with distinct members "m0", "m1", ... to at most
    limit bytes; with duplicate, the last one is named "m0" again."""
    members, size, i = [], len(ORDER) + 2, 0
    while size + len(f',"m{i}":0') <= limit:
        members.append(f'"m{i}":0')
        size += len(members[-1]) + 1
        i += 1
    if duplicate:
        members[-1] = '"m0":0'
    return "{" + ",".join([ORDER] + members) + "}", len(members) + 3


def comparisons(body):
    r = post(api.port, "/dev/canonical-json", body)
    return r.status, int(r.headers["x-json-name-comparisons"])


body, n = wide()
key = new_key()
r = api.post("/v1/orders", body, key=key)
t.ok(r.status == 201 and r.json()["amount"] == 1000,
     f"a 64 KiB order of {n} distinct members: 201 (the extra members are ignored)", r)

dup, _ = wide(duplicate=True)
key = new_key()
r = api.post("/v1/orders", dup, key=key)
t.ok(r.status == 400 and r.json()["type"].endswith("/problems/invalid-json") and
     "duplicate member" in r.json()["detail"],
     "the same with its last member named like its first: 400 invalid-json", r)
t.eq(sql_value(f"select count(*) from idempotency_keys where idem_key = {quote(key)}"),
     "0", "and the key is not taken")
for raw, what in [('{' + ORDER + ',"a":1,"b":{"a":1,"b":2},"a":2}',
                   "around a nested object of the same names"),
                  ('{' + ORDER + ',"x":{"a":1,"a":1}}', "inside a nested object"),
                  ('{' + ORDER + ',"a":1,"\\u0061":2}', "spelled with an escape")]:
    r = api.post("/v1/orders", raw, key=new_key())
    t.ok(r.status == 400 and r.json()["type"].endswith("/problems/invalid-json"),
         f"a duplicate {what}: 400 invalid-json", r)
r = api.post("/v1/orders", '{' + ORDER + ',"a":1,"a\\u0000":1,"\\u0061b":1}',
             key=new_key())
t.eq(r.status, 201, "names that differ after a NUL or by an escape are distinct: 201")

# The work grows as n log n, not n^2.
for limit in (8 * 1024, 16 * 1024, 32 * 1024, 64 * 1024):
    body, n = wide(limit)
    status, work = comparisons(body)
    bound = int(2 * n * math.log2(n))
    t.ok(status == 200 and work <= bound,
         f"{n} members: {work} name comparisons, within 2 n log2 n = {bound}"
         f" (a quadratic check makes {n * (n - 1) // 2})", (status, work))

api.stop()
t.done()
