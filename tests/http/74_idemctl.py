"""scripts/idemctl against a real stack: a client added gets a token that
the API accepts, listed; revoked, its token is a 401 at every worker once
IDEM_AUTH_CACHE_SECONDS have passed (the bound the docs state); refusals
exit non-zero with their reason. `idemctl key` tells a key's story: its
row, its business rows, the provider's charges under its derived keys
(the fake provider and the Stripe mock; Stripe listed in the key's window
and within a page bound it says it hit), its access-log lines; a refund's
own refund is not late. `idemctl
late` reads the late operations table (late_operations, or another named
by IDEM_LATE_TABLE), and says when there is none; `late handle` refuses
an id it does not hold."""

import hashlib
import http.server
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (COMMAND_BOUND, DB_URL, HEALTH_BOUND, REQUEST_BOUND, ROOT,  # noqa: E402
                     STRIPE_SECRET, Api, Background, Kore, Provider, StripeMock, Tap, free_port,
                     new_key, post, request, sql, sql_value, wait_until)

t = Tap()
CACHE_SECONDS = 2


def idemctl(*args, **env):
    e = dict(os.environ, IDEM_DATABASE_URL=DB_URL)
    for v in ("IDEM_PROVIDER_KIND", "IDEM_PROVIDER_SECRET", "IDEM_ACCESS_LOG"):
        e.pop(v, None)
    e.update(env)
    # A bound on a hang, not a verdict.
    r = subprocess.run([os.path.join(ROOT, "scripts", "idemctl")] + list(args), env=e,
                       capture_output=True, text=True, timeout=COMMAND_BOUND)
    r.out = r.stdout + r.stderr
    return r


def order(api, token, key=None):
    return post(api.port, "/v1/orders", {"customer_id": "c-idemctl", "amount": 500,
                                         "currency": "RUB"},
                key=key or new_key("ctl"), token=token)


provider = Provider(name="provider-idemctl").start()
api = Api(name="api-idemctl", IDEM_PROVIDER_URL=provider.url,
          IDEM_AUTH_CACHE_SECONDS=CACHE_SECONDS).start()
name = f"ctl-{os.getpid()}"

# --- clients -------------------------------------------------------------------
added = idemctl("client", "add", name)
token = added.stdout.strip().splitlines()[-1] if added.stdout.strip() else ""
t.ok(added.returncode == 0 and len(token) >= 40, "client add prints a new token", added.out)
t.ok(added.stdout == token + "\n" and f"client {name} added" in added.stderr,
     "the token alone on stdout (TOKEN=$(idemctl client add NAME)), the sentence on stderr",
     added.out)
t.eq(sql_value(f"select token_sha256 from clients where client_id = '{name}'"),
     hashlib.sha256(token.encode()).hexdigest(), "and stores only its SHA-256")
t.eq(int(sql_value(f"select count(*) from clients where token_sha256 = '{token}'")), 0,
     "never the token")
r = order(api, token)
t.eq(r.status, 201, "the API accepts the new client's token")

again = idemctl("client", "add", name)
t.ok(again.returncode != 0 and "exists" in again.stderr, "adding it again is refused",
     again.out)
bad = idemctl("client", "add", "no spaces")
t.ok(bad.returncode != 0 and "name" in bad.stderr, "a malformed name is refused", bad.out)
listed = idemctl("client", "list")
t.ok(listed.returncode == 0 and all(any(l.split()[:1] == [c] for l in listed.stdout.splitlines())
                                    for c in (name, "shop-1", "shop-2")),
     "client list names it beside the others", listed.out)
count = int(sql_value("select count(*) from clients"))
t.ok(listed.stdout.strip().splitlines()[-1:] == [f"({count} clients)"],
     "client list counts them", listed.out)
sql("create schema if not exists idemctl_one; create table idemctl_one.clients as"
    " select * from public.clients limit 1")
try:
    one = idemctl("client", "list", IDEM_DATABASE_URL=DB_URL + " options='-c search_path=idemctl_one'")
    t.ok(one.stdout.strip().splitlines()[-1:] == ["(1 client)"],
         "one client is one client, not '1 clients'", one.out)
finally:
    sql("drop schema idemctl_one cascade")

# The workers cache the token: twenty requests, each on a connection of
# its own, spread over them.
for _ in range(20):
    order(api, token)
revoked = idemctl("client", "revoke", name)
after = time.monotonic()
t.ok(revoked.returncode == 0 and "IDEM_AUTH_CACHE_SECONDS" in revoked.stdout,
     "client revoke states its bound", revoked.out)
# The bound is a promise: once it has passed since the revocation, every
# request is refused, whichever worker takes it (a deliberate wait: the
# bound itself, not a guess at the machine's speed).
time.sleep(max(0.0, after + CACHE_SECONDS + 0.1 - time.monotonic()))
answers = [order(api, token).status for _ in range(20)]
t.eq(set(answers), {401}, f"past IDEM_AUTH_CACHE_SECONDS ({CACHE_SECONDS} s) every "
     "request with the revoked token is a 401")
gone = idemctl("client", "revoke", name)
t.ok(gone.returncode != 0 and f"no client {name}" in gone.stderr,
     "revoking an unknown client is refused, with its reason", gone.out)

# --- the bound holds for a lookup that raced the revocation ---------------------
class SlowAnswers:
    """A TCP proxy to the test's PostgreSQL whose answers, while `delay` is
    set, reach the API that many seconds late: a lookup that the server
    answered before a revocation arrives after it."""

    def __init__(self):
        self.delay = 0.0
        self.sock = socket.create_server(("127.0.0.1", free_port()))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            client, _ = self.sock.accept()
            server = socket.create_connection(
                ("127.0.0.1", int(os.environ["IDEM_TEST_PGPORT"])))
            threading.Thread(target=self._pump, args=(client, server, False),
                             daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True),
                             daemon=True).start()

    def _pump(self, src, dst, answers):
        try:
            while data := src.recv(65536):
                if answers and self.delay:
                    time.sleep(self.delay)
                dst.sendall(data)
        except OSError:
            pass


DELAY = CACHE_SECONDS + 2
proxy = SlowAnswers()
raced = f"ctl-raced-{os.getpid()}"
token = idemctl("client", "add", raced).stdout.strip().splitlines()[-1]
papi = Api(name="api-idemctl-raced", conf_extra=["workers 1"],
           IDEM_AUTH_CACHE_SECONDS=CACHE_SECONDS, IDEM_DB_TIMEOUT_MS=60000)
papi.env["IDEM_DATABASE_URL"] = re.sub(r"port=\S+", f"port={proxy.port}", re.sub(
    r"host=\S+", "host=127.0.0.1", DB_URL)) + " application_name=idemctl-raced"
Kore.start(papi, lambda: request(papi.port, "GET", "/healthz",
                                 timeout=HEALTH_BOUND).status == 200)
t.eq(order(papi, "dev-shop-1").status, 201, "an API whose database answers through a proxy")
LOOKUP = ("select count(*) from pg_stat_activity where application_name = 'idemctl-raced'"
          " and query like 'SELECT client_id FROM clients WHERE token_sha256 = $1%'")


def both_lookups_prepared():
    """Both token-lookup connections have prepared their statement, so that
    a lookup is one execution: two unknown tokens at once, their answers
    slowed so that the second takes the other connection."""
    proxy.delay = 0.5
    for r in [Background(order, papi, f"warm-{new_key()}") for _ in range(2)]:
        r.wait(timeout=REQUEST_BOUND)
    proxy.delay = 0.0
    return sql_value(LOOKUP) == "2"


# A bound on a hang: each round sends two lookups, which take the two
# connections or one of them; a few rounds do.
wait_until(both_lookups_prepared, "both lookup connections to be prepared",
           timeout=2 * REQUEST_BOUND)
mark = sql_value("select clock_timestamp()")
proxy.delay = DELAY
first = Background(order, papi, token)
# The server has run the lookup (its backend idle again after it), and
# its answer is held in the proxy: the client is revoked now.
wait_until(lambda: sql_value(LOOKUP + f" and state = 'idle' and query_start > '{mark}'")
           != "0", "the lookup to be answered")
revoked = idemctl("client", "revoke", raced)
after = time.monotonic()
# The lookup's answer stays held for its delay; the rest flows.
proxy.delay = 0.0
t.eq(first.wait(timeout=REQUEST_BOUND).status, 201, "the request whose lookup preceded the revocation "
     "is served")
time.sleep(max(0.0, after + CACHE_SECONDS + 0.1 - time.monotonic()))
t.eq(order(papi, token).status, 401, "the bound counts from the lookup's start: past it "
     "since the revocation, the token is a 401 though its lookup's answer came later")
papi.stop()

# --- a key's story: an order, a payment ---------------------------------------------
okey = new_key("ctl-order")
r = order(api, "dev-shop-1", okey)
t.eq(r.status, 201, "an order")
story = idemctl("key", "shop-1", okey, "--access-log", api.logpath,
                IDEM_PROVIDER_URL=provider.url)
t.ok(story.returncode == 0 and "status: done" in story.stdout and
     "operation: orders.create" in story.stdout and
     f"response (the saved answer): {r.body.decode()}" in story.stdout,
     "key: its row, the saved answer as sent", story.out)
order_id = r.json()["order_id"]
t.ok(any(l.strip().startswith("orders: ") and json.loads(l.split(": ", 1)[1])["order_id"]
         == order_id for l in story.stdout.splitlines()),
     "its business rows: the order it made", story.out)
t.ok(any(f"key={okey} " in l and "status=201" in l for l in story.stdout.splitlines()),
     "its access-log line", story.out)

# The journal, not a file: journalctl -u 'idem@*' -o cat | idemctl key C K
# --access-log - (the log's bytes on standard input, as journalctl writes
# them).
with open(api.logpath, "rb") as f:
    journal = f.read()
piped = subprocess.run([os.path.join(ROOT, "scripts", "idemctl"), "key", "shop-1", okey,
                        "--access-log", "-"],
                       env=dict(os.environ, IDEM_DATABASE_URL=DB_URL,
                                IDEM_PROVIDER_URL=provider.url),
                       input=journal, capture_output=True, timeout=COMMAND_BOUND)
out = piped.stdout.decode(errors="replace")
t.ok(piped.returncode == 0 and "access log (standard input)" in out and
     any(f"key={okey} " in l and "status=201" in l for l in out.splitlines()),
     "--access-log - reads the lines from standard input",
     out + piped.stderr.decode(errors="replace"))

# A reader that stops early (idemctl key ... | head -n 1): the worst
# timing, its end closed before idemctl writes, ends idemctl by SIGPIPE
# as any command of a pipeline, without a traceback.
rfd, wfd = os.pipe()
os.close(rfd)
try:
    cut = subprocess.run([os.path.join(ROOT, "scripts", "idemctl"), "key", "shop-1", okey],
                         env=dict(os.environ, IDEM_DATABASE_URL=DB_URL,
                                  IDEM_PROVIDER_URL=provider.url),
                         stdout=wfd, stderr=subprocess.PIPE, text=True, timeout=COMMAND_BOUND)
finally:
    os.close(wfd)
t.ok(cut.returncode == -signal.SIGPIPE and "Traceback" not in cut.stderr and
     "BrokenPipeError" not in cut.stderr,
     "idemctl key | head: a reader gone ends it quietly (SIGPIPE, no traceback)",
     f"exit {cut.returncode}: {cut.stderr}")


class Listener:
    """A port that accepts and counts connections, never answering: the
    provider's address, to see whether it is asked at all."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            c, _ = self.sock.accept()
            self.accepted += 1
            c.close()


# A transactional operation never calls the provider: its story does not
# ask it (an order's key has no charge there, and a provider down or slow
# must not hold an order's story).
silent = Listener()
for kind in ({}, dict(IDEM_PROVIDER_KIND="stripe", IDEM_PROVIDER_SECRET="sk_test_x")):
    story = idemctl("key", "shop-1", okey, IDEM_PROVIDER_URL=f"http://127.0.0.1:{silent.port}",
                    **kind)
    t.ok(story.returncode == 0 and silent.accepted == 0 and
         "provider: not asked: orders.create is a transactional operation" in story.stdout,
         f"key of an order ({kind.get('IDEM_PROVIDER_KIND', 'fake')}): the provider is "
         "not asked, and it says why", story.out)

pkey = new_key("ctl-pay")
p = post(api.port, "/v1/payments", {"amount": 1200, "currency": "RUB", "recipient": "acc-ctl"},
         key=pkey)
t.eq(p.status, 201, "a payment")
story = idemctl("key", "shop-1", pkey, IDEM_PROVIDER_URL=provider.url)
charge = p.json()["charge_id"]
held = [json.loads(l.split(": ", 1)[1]) for l in story.stdout.splitlines()
        if l.strip().startswith("charges: {")]
t.ok(story.returncode == 0 and [c.get("charge_id") for c in held] == [charge] and
     held[0].get("idempotency_key") == f"shop-1:{pkey}",
     "key: the provider's one charge under its derived key", story.out)
t.ok(any(l.strip().startswith("payments: ") for l in story.stdout.splitlines()) and
     "provider_generation: 1" in story.stdout, "and its payment row and generation",
     story.out)
t.ok("access log: not searched" in story.stdout, "no log named: it says so")

# A refund's saved 201 holds our refund_id (a number) and the provider's
# in provider_refund_id: its story marks nothing late and records nothing.
rkey = new_key("ctl-refund")
rf = post(api.port, "/v1/refunds", {"payment_id": p.json()["payment_id"], "amount": 500},
          key=rkey)
t.eq(rf.status, 201, "a refund of it")
story = idemctl("key", "shop-1", rkey, IDEM_PROVIDER_URL=provider.url)
# The provider's section (the business rows have a "refunds:" line too).
at_provider = story.stdout.partition("\n  charges: ")[2]
refunds = [json.loads(l.split(": ", 1)[1]) for l in at_provider.splitlines()
           if l.strip().startswith("refunds: {")]
t.ok(story.returncode == 0 and [r.get("refund_id") for r in refunds] ==
     [rf.json()["provider_refund_id"]] and "LATE" not in story.stdout and
     "is late" not in story.stdout,
     "key of a refund: its own refund at the provider, not marked late",
     story.out)
t.eq(sql_value(f"select count(*) from late_operations where idem_key = '{rkey}'"), "0",
     "and nothing recorded in late_operations")

none = idemctl("key", "shop-1", "ctl-no-such-key")
t.ok(none.returncode != 0 and "no key" in none.stderr, "an unknown key is refused, with why",
     none.out)
down = idemctl("key", "shop-1", pkey, IDEM_PROVIDER_URL="http://127.0.0.1:9")
t.ok(down.returncode == 0 and "did not answer" in down.stdout,
     "a provider that does not answer is said, the rest still told", down.out)

# --- the Stripe mock: its charges listed and matched on their metadata -----------
mock = StripeMock().start()
stripe = dict(IDEM_PROVIDER_KIND="stripe", IDEM_PROVIDER_URL=mock.url,
              IDEM_PROVIDER_SECRET=STRIPE_SECRET)
sapi = Api(name="api-idemctl-stripe", **stripe).start()
skey = new_key("ctl-stripe")
s = sapi.post("/v1/payments", {"amount": 900, "currency": "RUB", "recipient": "acc-1",
                               "payment_method": "tok_visa"}, key=skey)
t.eq(s.status, 201, "a payment through the Stripe mock")
other = sapi.post("/v1/payments", {"amount": 900, "currency": "RUB", "recipient": "acc-1",
                                   "payment_method": "tok_visa"}, key=skey + "x")
story = idemctl("key", "shop-1", skey, **stripe)
held = [json.loads(l.split(": ", 1)[1]) for l in story.stdout.splitlines()
        if l.strip().startswith("charges: {")]
t.ok(story.returncode == 0 and [c["id"] for c in held] == [s.json()["charge_id"]],
     "key with stripe: the one charge whose metadata names its derived key, not the "
     "other key's", story.out)
sapi.stop()
mock.kill9()

# A Stripe that always has more: the listing is bounded in time (the
# key's window, created[lte] included) and in pages, and says when it
# stopped with more to list.
class EndlessStripe(http.server.BaseHTTPRequestHandler):
    paths = []

    def do_GET(self):
        EndlessStripe.paths.append(self.path)
        n = len(EndlessStripe.paths)
        body = json.dumps({"object": "list", "has_more": True, "data": [
            {"id": f"ch_endless_{n}", "status": "succeeded", "amount": 1,
             "metadata": {"idempotency_key": "someone-else"}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


endless = http.server.ThreadingHTTPServer(("127.0.0.1", 0), EndlessStripe)
threading.Thread(target=endless.serve_forever, daemon=True).start()
story = idemctl("key", "shop-1", pkey, IDEM_PROVIDER_KIND="stripe", IDEM_PROVIDER_SECRET="sk_test_x",
                IDEM_PROVIDER_URL=f"http://127.0.0.1:{endless.server_address[1]}")
endless.shutdown()
row = sql(f"select extract(epoch from created_at)::bigint, extract(epoch from finished_at)::bigint"
          f" from idempotency_keys where idem_key = '{pkey}'")[0]
created, finished = int(row[0]), int(row[1])
lte = {int(m) for p in EndlessStripe.paths for m in re.findall(r"created\[lte\]=(\d+)", p)}
t.ok(EndlessStripe.paths and all("created[gte]=" in p and "created[lte]=" in p
                                 for p in EndlessStripe.paths) and
     lte == {max(created + 86400, finished) + 3600},
     "key with stripe lists the key's window: created[lte] at its retention and a margin",
     f"{EndlessStripe.paths[:2]} created {created}")
t.ok(story.returncode == 0 and len(EndlessStripe.paths) == 2 * 100 and
     "stopped listing Stripe's charges after 100 pages" in story.stderr and
     "charges: INCOMPLETE" in story.stdout,
     "a listing that hits its page bound with more to list says so", story.out)

# --- late operations -------------------------------------------------------------
real = idemctl("late")
t.ok(real.returncode == 0 and re.search(r"^\(\d+ late operations?, \d+ not handled\)$|"
                                        r"^\(0 late operations\)$", real.stdout, re.M),
     "late reads the migrated table, late_operations (tests/http/69_late_charge.py "
     "fills it)", real.out)
unknown = idemctl("late", "handle", "ch_no_such_late", "refunded")
t.ok(unknown.returncode == 1 and "no late operation ch_no_such_late" in unknown.stderr,
     "late handle of an unknown id is refused, with why", unknown.out)
absent = idemctl("late", IDEM_LATE_TABLE="idemctl_no_such_table")
t.ok(absent.returncode == 0 and "does not exist yet" in absent.stderr and
     absent.stdout == "", "late without its table: says so, lists nothing", absent.out)
sql("create table idemctl_late_test (client_id text, idem_key text, charge_id text)")
try:
    sql("insert into idemctl_late_test values ('shop-1', 'k-late', 'ch_late')")
    late = idemctl("late", IDEM_LATE_TABLE="idemctl_late_test")
    t.ok(late.returncode == 0 and '"charge_id": "ch_late"' in late.stdout and
         "(1 late operation)" in late.stdout, "late lists the table's rows", late.out)
finally:
    sql("drop table idemctl_late_test")

api.stop()
provider.stop()
t.done()
