"""A reconciliation that finishes on a busy account (issue 28, item 4).
The Stripe mock holds 2,000 charges of another client made after the
key's own charge (the key's first answer was a kept 500, and its charge
was made all the same: the oldest in the window, on the list's last page).
The service reaches the mock through a proxy of this test, which records
every listing (and, where a part says so, slows it or breaks it).

- "busy": a retry reconciles through every page of 100, within
  RECONCILE_PAGES_MAX (100) pages, and finds the charge: 201 with it, one
  charge, nothing sent again;
- "short-lease": with a lease too short for one attempt to read every page
  (IDEM_LEASE_SECONDS=3, a provider timeout of 1.5 s, each page 0.4 s
  slower at the proxy), each attempt goes on from the cursor where the one
  before stopped (kept in the key's row, reconcile_cursor): page 1 is read
  once, the window (created[gte], created[lte]) is the same in every
  attempt, and the reconciliation ends with the key's charge. The
  previous release started every attempt at page 1 (and moved created[lte]
  with every attempt): it never finished;
- "no-cursor": a page that says has_more but whose last item has no id
  cannot be gone on from: the reconciliation fails (502, logged), the key
  stays at its generation and nothing is sent; the previous release read
  it as "none" and charged a second generation.

The settle window is set to 0 (IDEM_PROVIDER_SETTLE_SECONDS): the kept 500
may be reconciled at once. IDEM_TEST_SCENARIO=name runs one part (the
charges are made in every case)."""

import http.client
import http.server
import json
import os
import random
import sys
import threading
import time
import urllib.parse

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (REQUEST_BOUND, STRIPE_SECRET, Api, StripeMock, Tap,  # noqa: E402
                     concurrently, derived_key, key_row, new_key, quote, sql_value, wait_until)

t = Tap()
only = os.environ.get("IDEM_TEST_SCENARIO")
OTHERS = 2000
PAGES_MAX = 100            # RECONCILE_PAGES_MAX in src/lease/lease.c
AUTH = {"Authorization": f"Bearer {STRIPE_SECRET}"}


def scenario(name):
    return only is None or only == name


class ListingProxy:
    """Forwards every request to the Stripe mock as it is; records each
    GET /v1/charges (its query), delays it by `delay` seconds, and with
    `strip_last_id` removes the id of a page's last item."""

    def __init__(self, target_port):
        self.target = target_port
        self.delay = 0
        self.strip_last_id = False
        self.lists = []
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def forward(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                path = urllib.parse.urlsplit(self.path)
                listing = self.command == "GET" and path.path == "/v1/charges"
                if listing:
                    proxy.lists.append(urllib.parse.parse_qs(path.query))
                    time.sleep(proxy.delay)
                conn = http.client.HTTPConnection("127.0.0.1", proxy.target, timeout=REQUEST_BOUND)
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("host", "connection", "content-length")}
                conn.request(self.command, self.path, body=body, headers=headers)
                r = conn.getresponse()
                data = r.read()
                conn.close()
                if listing and proxy.strip_last_id and r.status == 200:
                    page = json.loads(data)
                    if page.get("data"):
                        page["data"][-1].pop("id", None)
                    data = json.dumps(page).encode()
                self.send_response(r.status)
                for k, v in r.getheaders():
                    if k.lower() not in ("content-length", "transfer-encoding",
                                         "connection", "date", "server"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = forward
            do_POST = forward

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def chain(*tokens):
    return "|".join(tokens + (f"r{random.randrange(10**9)}",))


def payment(method):
    return {"amount": 10000, "currency": "RUB", "recipient": "acc-1",
            "purpose": "order 17", "payment_method": method}


def mock_charge(conn, client, derived, generation=1):
    """A charge made at the mock directly, with the metadata the service
    sends (as Stripe makes a charge whose answer was lost)."""
    form = urllib.parse.urlencode({
        "amount": 10000, "currency": "rub", "source": "tok_visa",
        "metadata[idempotency_key]": derived,
        "metadata[key_generation]": str(generation),
        "metadata[client_id]": client, "metadata[recipient]": "acc-1"})
    conn.request("POST", "/v1/charges", body=form, headers=dict(
        AUTH, **{"Content-Type": "application/x-www-form-urlencoded"}))
    r = conn.getresponse()
    body = json.loads(r.read())
    assert r.status == 200, (r.status, body)
    return body["id"]


def generation(key):
    return sql_value("select provider_generation from idempotency_keys where "
                     f"client_id = 'shop-1' and idem_key = {quote(key)}")


def mine(lists, key):
    """The listings of this key's reconciliation: its window starts 300 s
    before the key was taken (a recovery job may list other tests' keys
    through the proxy meanwhile)."""
    gte = str(int(float(sql_value("select floor(extract(epoch from created_at)) from "
                                  "idempotency_keys where client_id = 'shop-1' and "
                                  f"idem_key = '{key}'"))) - 300)
    return [q for q in lists if q.get("created[gte]", [None])[0] == gte]


def first_pages(lists):
    return [q for q in lists if "starting_after" not in q]


mock = StripeMock().start()
proxy = ListingProxy(mock.port)
STRIPE = {"IDEM_PROVIDER_KIND": "stripe", "IDEM_PROVIDER_SECRET": STRIPE_SECRET,
          "IDEM_PROVIDER_URL": proxy.url, "IDEM_PROVIDER_SETTLE_SECONDS": 0}
api = Api(**STRIPE).start()
short = Api(name="api-short-lease", IDEM_LEASE_SECONDS=3,
            IDEM_PROVIDER_TIMEOUT_MS=1500, **STRIPE).start()

# Each key's first answer: a kept 500 (the chain's first token).
keys = {name: new_key("busy") for name in ("busy", "short-lease", "no-cursor")}
bodies = {name: payment(chain("tok_500", "tok_visa")) for name in keys}
for name, key in keys.items():
    first = api.post("/v1/payments", bodies[name], key=key)
    assert first.status == 503, first  # a kept 500: outcome-pending (a window of 0 s)

# The charges Stripe made under the first two all the same, then, from the
# next second on (the mock lists the newest first), 2,000 of another client.
conn = http.client.HTTPConnection("127.0.0.1", mock.port, timeout=REQUEST_BOUND)
made = {name: mock_charge(conn, "shop-1", derived_key(keys[name], key_max=255))
        for name in ("busy", "short-lease")}
second = int(time.time())
wait_until(lambda: int(time.time()) > second, "the next second")


def others(n):
    c = http.client.HTTPConnection("127.0.0.1", mock.port, timeout=REQUEST_BOUND)
    for _ in range(n):
        mock_charge(c, "shop-2", f"shop-2:other-{random.randrange(10**12)}")
    c.close()


concurrently(8, others, OTHERS // 8)
listed = mock._all("charges")
pages = (len(listed) + 99) // 100
ids = [c["id"] for c in listed]
t.ok(len(listed) >= OTHERS + 2 and all(ids.index(m) >= OTHERS for m in made.values()),
     f"the mock lists {len(listed)} charges ({pages} pages), the keys' own after "
     f"the {OTHERS} others", len(listed))

if scenario("busy"):
    key = keys["busy"]
    before = len(proxy.lists)
    r = api.post("/v1/payments", bodies["busy"], key=key)
    read = mine(proxy.lists[before:], key)
    t.ok(r.status == 201 and r.json()["charge_id"] == made["busy"] and
         [c["id"] for c in mock.charges_of(derived_key(key, key_max=255))] ==
         [made["busy"]] and not mock.charges_of(derived_key(key, 2, key_max=255)) and
         generation(key) == "1",
         "a busy account: the retry reconciles, 201 with the key's charge, one charge",
         (r, len(read)))
    t.ok(pages - 1 <= len(read) <= PAGES_MAX and len(first_pages(read)) == 1,
         f"it read {len(read)} pages, within the {PAGES_MAX} of an attempt", len(read))
    t.ok(all("created[gte]" in q and "created[lte]" in q for q in read),
         "each page asked within a window (created[gte], created[lte])", read[:1])

if scenario("short-lease"):
    key = keys["short-lease"]
    proxy.delay = 0.4
    before = len(proxy.lists)
    answers = []
    # A bound on a hang, far above need: each attempt reads at least one
    # page of the `pages`.
    while len(answers) < 3 * pages + 10:
        r = short.post("/v1/payments", bodies["short-lease"], key=key)
        answers.append(r)
        if r.status not in (502, 409):
            break
        # Page 1 read again: the previous release; no need to go on.
        if len(first_pages(mine(proxy.lists[before:], key))) > 1:
            break
    proxy.delay = 0
    read = mine(proxy.lists[before:], key)
    last = answers[-1]
    t.ok(all(a.status in (502, 409) for a in answers[:-1]),
         "each attempt that stopped paging: 502 (or 409 while another attempt held the "
         "key)", [a.status for a in answers])
    t.ok(last.status == 201 and last.json()["charge_id"] == made["short-lease"] and
         [c["id"] for c in mock.charges_of(derived_key(key, key_max=255))] ==
         [made["short-lease"]] and not mock.charges_of(derived_key(key, 2, key_max=255))
         and generation(key) == "1",
         f"a short lease: {len(answers)} attempts, the last 201 with the key's charge, "
         "one charge", [a.status for a in answers])
    t.ok(len(answers) > 1 and len(first_pages(read)) == 1,
         "one attempt could not read every page; page 1 was read once: every attempt "
         "went on from the cursor the one before kept", (len(answers), len(first_pages(read))))
    t.ok(len(read) <= pages + len(answers),
         f"{len(read)} pages read in all for {pages} pages: none read twice but where "
         "an attempt stopped", len(read))
    windows = {(q.get("created[gte]", [None])[0], q.get("created[lte]", [None])[0])
               for q in read}
    t.ok(len(windows) == 1 and None not in next(iter(windows)),
         "every attempt read the same window (created[gte], created[lte])", windows)
    t.ok(key_row(key)["status"] == "done", "the key is done")

if scenario("no-cursor"):
    key = keys["no-cursor"]
    proxy.strip_last_id = True
    r = api.post("/v1/payments", bodies["no-cursor"], key=key)
    proxy.strip_last_id = False
    log = api.read_log()
    t.ok(r.status == 502 and generation(key) == "1" and key_row(key)["status"] == "in_progress"
         and not mock.charges_of(derived_key(key, 2, key_max=255)) and
         not mock.charges_of(derived_key(key, key_max=255)),
         "has_more without a cursor: 502, the key stays at generation 1, nothing sent",
         (r, generation(key)))
    t.ok(f"could not reconcile shop-1:{key} (generation 1)" in log and
         "no id on the page's last item" in log, "and it is logged")

api.stop()
short.stop()
proxy.stop()
mock.stop()
t.done()
