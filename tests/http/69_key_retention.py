"""A derived key is never sent past the provider's memory of it (issue 28,
item 3). Stripe may forget an idempotency key once it is 24 hours old and
then takes it as new. A charge whose answer was lost, a key left unfinished
(say the secret expired over a weekend and every attempt was a 401), then
a retry the next day: on 1.0.0 the service sent the same derived key again,
which the provider no longer knew, and charged a second time. Now a
generation first sent longer ago than IDEM_PROVIDER_KEY_RETENTION_SECONDS
less a margin is listed first: the charge found is the outcome; none found
moves the key to its next generation.

The provider is a Stripe-shaped stub in this test (Stripe's form bodies,
metadata, Request-Id, its list by creation time with has_more and
starting_after) whose idempotency FORGETS every key when the test says
so, as Stripe does after its retention; time passing is the key's row made
older by hand (created_at), so that no verdict waits on a clock.

- lost answer, key aged and forgotten: the retry lists, finds the charge,
  201 naming it: one charge (two on 1.0.0);
- nothing made, aged and forgotten: listed, none, generation 2 sent: one
  charge under <client>:<key>:2;
- a key younger than the retention is sent again as before (no listing);
- the recovery job does the same as a retry."""

import http.server
import json
import os
import sys
import threading
import time
import urllib.parse

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (JOB_BOUND, STRIPE_SECRET, Api, Tap, key_row, new_key, sql,  # noqa: E402
                     sql_value, wait_until)

t = Tap()


class ForgetfulStripe:
    """Charges as Stripe makes them, an idempotency that replays a key's
    answer until forget(); a recipient in lose: its charge is made and its
    answer comes after the service's provider timeout; in drop: closed, nothing made (for
    as long as it is there: libcurl sends a request again by itself on a
    fresh connection when a reused one dies)."""

    def __init__(self):
        self.charges = []
        self.keys = {}
        self.lose = set()
        self.drop = set()
        self.posts = []
        self.lists = 0
        self.gets = []
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def answer(self, status, doc):
                data = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Request-Id", f"req_{time.monotonic_ns()}")
                self.send_header("Content-Length", str(len(data)))
                try:
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass    # the service gave up on it: a lost answer

            def do_POST(self):
                n = int(self.headers.get("Content-Length", 0))
                form = dict(urllib.parse.parse_qsl(self.rfile.read(n).decode()))
                key = self.headers.get("Idempotency-Key")
                stub.posts.append(key)
                if form.get("metadata[recipient]") in stub.drop:
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                if key in stub.keys:
                    self.answer(200, stub.keys[key])
                    return
                meta = {k[9:-1]: v for k, v in form.items() if k.startswith("metadata[")}
                charge = {"id": f"ch_stub{len(stub.charges) + 1}", "object": "charge",
                          "amount": int(form["amount"]), "currency": form["currency"],
                          "status": "succeeded", "created": int(time.time()),
                          "metadata": meta}
                stub.charges.append(charge)
                stub.keys[key] = charge
                if form.get("metadata[recipient]") in stub.lose:
                    # Past the service's provider timeout: its answer is
                    # lost (a bound on nothing: the service gives up).
                    time.sleep(LOSE_SECONDS)
                self.answer(200, charge)

            def do_GET(self):
                stub.lists += 1
                q = dict(urllib.parse.parse_qsl(urllib.parse.urlparse(self.path).query))
                stub.gets.append(q)
                items = sorted(stub.charges, key=lambda c: (c["created"], c["id"]),
                               reverse=True)
                lo = int(q.get("created[gte]", 0))
                hi = int(q.get("created[lte]", 1 << 62))
                items = [c for c in items if lo <= c["created"] <= hi]
                if "starting_after" in q:
                    ids = [c["id"] for c in items]
                    at = ids.index(q["starting_after"]) + 1 if q["starting_after"] in ids else 0
                    items = items[at:]
                limit = int(q.get("limit", 10))
                self.answer(200, {"object": "list", "data": items[:limit],
                                  "has_more": len(items) > limit})

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def forget(self):
        self.keys.clear()

    def of(self, derived):
        return [c["id"] for c in self.charges
                if c["metadata"].get("idempotency_key") == derived]


stub = ForgetfulStripe()
DAY = 86400
LOSE_SECONDS = 3
env = {"IDEM_PROVIDER_KIND": "stripe", "IDEM_PROVIDER_SECRET": STRIPE_SECRET,
       "IDEM_PROVIDER_URL": f"http://127.0.0.1:{stub.port}",
       "IDEM_PROVIDER_KEY_RETENTION_SECONDS": DAY, "IDEM_PROVIDER_TIMEOUT_MS": 2000}
api = Api(name="api-retention", **env).start()


def lists_of(key):
    """This key's listings: its window starts 300 s before it was taken."""
    gte = str(int(float(sql_value("select floor(extract(epoch from created_at)) from "
                                  "idempotency_keys where client_id = 'shop-1' and "
                                  f"idem_key = '{key}'"))) - 300)
    return [q for q in stub.gets if q.get("created[gte]") == gte]


def posts_of(key):
    """This key's requests at the stub (a recovery job may send another
    test's keys through it meanwhile)."""
    return [p for p in stub.posts if p and p.startswith(f"shop-1:{key}")]


def payment(recipient):
    return {"amount": 10000, "currency": "RUB", "recipient": recipient,
            "payment_method": "tok_visa"}


def age(key, seconds):
    """The key's first attempt moves back in time (as a day passing would)."""
    sql(f"update idempotency_keys set created_at = created_at - interval '{seconds} "
        f"seconds', generation_at = generation_at - interval '{seconds} seconds' "
        f"where client_id = 'shop-1' and idem_key = '{key}'")


# 1. The answer lost, a day passes, the provider forgets.
key = new_key("ret-lost")
rcpt = "lost-" + key[-8:]
stub.lose.add(rcpt)
first = api.post("/v1/payments", payment(rcpt), key=key)
stub.lose.discard(rcpt)
age(key, DAY)
stub.forget()
lists = stub.lists
retry = api.post("/v1/payments", payment(rcpt), key=key)
made = stub.of(f"shop-1:{key}") + stub.of(f"shop-1:{key}:2")
t.ok(first.status == 504 and retry.status == 201 and
     made == [retry.json().get("charge_id")] and stub.posts.count(f"shop-1:{key}") == 1
     and lists_of(key),
     "a lost answer, the key past the provider's retention: the retry lists, finds "
     "the charge and answers it; the forgotten key is not sent again: one charge",
     (first, retry, made, stub.posts))

# 2. Nothing made (the request never reached the provider's books), a day
# passes: listed, none, the next generation.
key = new_key("ret-none")
rcpt = "none-" + key[-8:]
stub.drop.add(rcpt)
first = api.post("/v1/payments", payment(rcpt), key=key)
stub.drop.discard(rcpt)
age(key, DAY)
stub.forget()
r = api.post("/v1/payments", payment(rcpt), key=key)
t.ok(first.status == 502 and r.status == 201 and stub.of(f"shop-1:{key}") == [] and
     stub.of(f"shop-1:{key}:2") == [r.json().get("charge_id")] and
     posts_of(key)[-1] == f"shop-1:{key}:2",
     "an unfinished key past the retention with nothing made: listed, none, "
     "generation 2 sent: one charge under <client>:<key>:2", (first, r, stub.posts[-3:]))

# 3. A key within the retention is sent again as before: no listing.
key = new_key("ret-young")
rcpt = "young-" + key[-8:]
stub.lose.add(rcpt)
first = api.post("/v1/payments", payment(rcpt), key=key)
stub.lose.discard(rcpt)
lists = stub.lists
retry = api.post("/v1/payments", payment(rcpt), key=key)
t.ok(first.status == 504 and retry.status == 201 and not lists_of(key) and
     posts_of(key)[-1] == f"shop-1:{key}" and len(stub.of(f"shop-1:{key}")) == 1,
     "within the retention: the same derived key again (the provider replays it), "
     "no listing", (first, retry))

# 4. The recovery job: the same as a retry.
api.stop()
key = new_key("ret-job")
rcpt = "job-" + key[-8:]
stub.lose.add(rcpt)
api = Api(name="api-retention-2", **env).start()
first = api.post("/v1/payments", payment(rcpt), key=key)
stub.lose.discard(rcpt)
age(key, DAY)
stub.forget()
api.stop()
job = Api(name="api-retention-job", IDEM_RECOVERY_AFTER_SECONDS=1,
          IDEM_RECOVERY_INTERVAL_SECONDS=1, **env).start()
wait_until(lambda: key_row(key)["status"] == "done", "the recovery job to finish it",
           timeout=JOB_BOUND)
made = stub.of(f"shop-1:{key}") + stub.of(f"shop-1:{key}:2")
t.ok(first.status == 504 and len(made) == 1 and
     stub.posts.count(f"shop-1:{key}") == 1 and
     made[0] in (key_row(key)["response"] or ""),
     "the recovery job lists a key past the retention too: one charge, saved", made)
job.stop()
stub.server.shutdown()
t.done()
