"""The race of make demo (scripts/demo starts the servers and runs this):
N requests at once with one Idempotency-Key against the naive route, then
against the lease route; one retry of each afterwards; then what the
provider holds for each, read from its own table (provider.charges, by
the payment's recipient): the naive route sends the provider a fresh key
per attempt, so the ledger query by the derived key finds none of its
charges.

Usage: demo-race.py API_PORT PROVIDER_PORT DATABASE_URL N LATENCY_MS
Exit status 0 when the naive route charged more than once and the lease
route exactly once (one 201, the other answers 409); 1 otherwise."""

import http.client
import json
import signal
import subprocess
import sys
import threading
import urllib.parse
import uuid

API_PORT, PROVIDER_PORT, DB_URL = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
N, LATENCY_MS = int(sys.argv[4]), int(sys.argv[5])
TOKEN, CLIENT = "dev-shop-1", "shop-1"
# Ctrl-C ends this at once, by the signal, so that scripts/demo's trap
# sees it and stops the servers.
signal.signal(signal.SIGINT, signal.SIG_DFL)
AMOUNT, CURRENCY = 10000, "RUB"

SIDES = [
    ("naive", "/demo/naive/payments",
     "look the key up, charge, then save the key"),
    ("lease", "/v1/payments",
     "take the key with a lease, then charge with the key derived from it"),
]


def money(minor):
    return f"{minor // 100}.{minor % 100:02d} {CURRENCY}"


def times(n):
    return "once" if n == 1 else f"{n} times"


def post(path, key, body):
    """One POST; (status, headers) or (None, the error)."""
    conn = http.client.HTTPConnection("127.0.0.1", API_PORT, timeout=15)
    try:
        conn.request("POST", path, json.dumps(body).encode(), {
            "Authorization": f"Bearer {TOKEN}", "Idempotency-Key": key,
            "Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
    except (OSError, http.client.HTTPException) as e:
        return None, {}, str(e).encode()
    finally:
        conn.close()


def race(path, key, body):
    """N requests released together by a barrier."""
    barrier = threading.Barrier(N)
    answers = [None] * N

    def go(i):
        barrier.wait()
        answers[i] = post(path, key, body)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(N)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    return [a if a is not None else (None, {}, b"no answer in 30 s") for a in answers]


def shown(answer):
    status, headers, data = answer
    if status is None:
        return f"no answer ({data.decode()})"
    text = str(status)
    if "retry-after" in headers:
        text += f" (Retry-After: {headers['retry-after']})"
    if headers.get("idempotent-replayed") == "true":
        text += " (Idempotent-Replayed: true)"
    return text


def psql(query):
    out = subprocess.run(["psql", DB_URL, "-X", "-A", "-t", "-q", "-F", "\x1f",
                          "-v", "ON_ERROR_STOP=1", "-c", query],
                         check=True, capture_output=True, text=True).stdout
    return [line.split("\x1f") for line in out.splitlines() if line]


def quote(s):
    return "'" + s.replace("'", "''") + "'"


def ledger_by_derived_key(key):
    """The tour's query (README): GET /v1/charges?idempotency_key=shop-1:<key>."""
    conn = http.client.HTTPConnection("127.0.0.1", PROVIDER_PORT, timeout=10)
    try:
        conn.request("GET", "/v1/charges?idempotency_key=" +
                     urllib.parse.quote(f"{CLIENT}:{key}", safe=""))
        return len(json.loads(conn.getresponse().read())["charges"])
    finally:
        conn.close()


def side(name, path, how):
    tag = uuid.uuid4().hex[:8]
    key, recipient = f"demo-{name}-{tag}", f"demo-{name}-{tag}"
    body = {"amount": AMOUNT, "currency": CURRENCY, "recipient": recipient,
            "purpose": "make demo"}
    print(f"{name}  POST {path}: {how}")
    print(f"  {N} requests at once, Idempotency-Key {key}, {money(AMOUNT)}")
    answers = race(path, key, body)
    answers.sort(key=lambda a: (a[0] is None, a[0] or 0))
    print(f"  answers:  {', '.join(shown(a) for a in answers)}")
    retry = post(path, key, body)
    print(f"  a retry:  {shown(retry)}")

    payments = int(psql("select count(*) from payments where client_id = "
                        f"{quote(CLIENT)} and idem_key = {quote(key)}")[0][0])
    charges = psql("select charge_id, amount, idempotency_key from provider.charges"
                   f" where recipient = {quote(recipient)} order by created_at")
    derived = ledger_by_derived_key(key)
    print(f"  the API's books: {payments} payment{'s' if payments != 1 else ''};"
          f" the provider's ledger: {len(charges)} charge{'s' if len(charges) != 1 else ''}")
    for charge_id, amount, pkey in charges:
        print(f"    {charge_id}  {money(int(amount))}  provider key {pkey}")
    print(f"  GET /v1/charges?idempotency_key={CLIENT}:{key} at the provider finds"
          f" {derived}" + (" (the naive route sent fresh provider keys)"
                           if derived != len(charges) else ""))
    total = sum(int(c[1]) for c in charges)
    print(f"  => the provider charged {times(len(charges))}: {money(total)}"
          f" for one payment of {money(AMOUNT)}")
    print()
    statuses = [a[0] for a in answers]
    summary = (f"{name}: {N} requests with one key, answers "
               f"{', '.join(str(s) for s in statuses)}; the provider charged "
               f"{times(len(charges))} ({len(charges)} x {money(AMOUNT)})")
    return statuses, len(charges), summary


print(f"{N} requests at once with one Idempotency-Key, on each side; the fake"
      f" provider thinks {LATENCY_MS} ms per charge")
print()
results = {name: side(name, path, how) for name, path, how in SIDES}
for _, _, summary in results.values():
    print(summary)

naive_charges = results["naive"][1]
lease_statuses, lease_charges = results["lease"][0], results["lease"][1]
shows = (naive_charges > 1 and lease_charges == 1 and
         sorted(s or 0 for s in lease_statuses) == [201] + [409] * (N - 1))
if shows:
    print("the naive route charged the customer more than once; the lease route"
          " charged once")
    sys.exit(0)
if naive_charges <= 1:
    print("the naive route's race did not show this time: a longer provider"
          " latency (IDEM_PROVIDER_LATENCY_MS) widens its window")
else:
    print("the lease route did not answer as it should: one 201, the rest 409,"
          " one charge")
sys.exit(1)
