"""A late charge is found, not lost (issue 28, item 6). The fake provider
keeps its 500s under their keys (IDEM_FAKE_PROVIDER_KEEPS_5XX=1) and the
settle window is 0 (IDEM_PROVIDER_SETTLE_SECONDS): a payment to
"fail-twice-<r>" gives up generations 1 and 2 and is charged under 3. Then
a charge made under generation 1 appears at the provider, as a request
that went on behind the 500 would make it (a row in the provider's store
under <client>:<key>, listed from then on).

- scan: the key is done; nothing a client does lists it again. The late
  scan does, IDEM_LATE_SCAN_AFTER_SECONDS after the key was finished (an
  instance started with it set low): one row in late_operations naming
  the late charge, the generation and the settled charge;
  idem_late_operations_total is 1; an error log line; the payment's saved
  201, its one payment row and a retry's replay unchanged; scripts/idemctl
  late lists it, and late handle marks it handled.
- reconcile: charges of generations 1 and 2 appear while the key is still
  to reconcile; the retry's listing settles the first and reports the
  second as late, in the same page.
- idemctl: scripts/idemctl key of such a key marks the late charge and
  records it (once);
- settle: an attempt whose call succeeds after the key was finished with
  another charge: its settle is fenced, its charge recorded as late.
IDEM_TEST_SCENARIO=name runs one part."""

import os
import random
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (COMMAND_BOUND, DB_URL, ROOT, Api, Background, Provider, Tap,  # noqa: E402
                     key_row, metric, new_key, provider_calls, quote, sql, sql_value, wait_until)

t = Tap()
only = os.environ.get("IDEM_TEST_SCENARIO")
# A bound on a hang, far above the need.
BOUND = 30
KEEP = {"IDEM_FAKE_PROVIDER_KEEPS_5XX": 1}
# The lead's settle window (issue 28, item 2): none, so that a retry lists
# at once; harmless where it is not known.
API_ENV = dict(KEEP, IDEM_PROVIDER_SETTLE_SECONDS=0, IDEM_LATE_SCAN_AFTER_SECONDS=3600)
provider = Provider(port=19071, IDEM_PROVIDER_LATENCY_MS=0, **KEEP).start()
api = Api(port=19072, IDEM_PROVIDER_URL=provider.url, **API_ENV).start()


def scenario(name):
    return only is None or only == name


def payment(recipient):
    return {"amount": 10000, "currency": "RUB", "recipient": recipient}


def pay_until_done(key, recipient, at=None):
    """Retries as a client does until the key is finished; the answers
    before it are the service's to choose (502, or 503 while a settle
    window runs)."""
    seen = []
    for _ in range(10):
        r = (at or api).post("/v1/payments", payment(recipient), key=key)
        seen.append(r)
        if r.status == 201:
            break
    return seen


def late_charge(key, generation, recipient):
    """A charge of the key's generation appears at the provider."""
    pkey = f"shop-1:{key}" + (f":{generation}" if generation > 1 else "")
    return sql_value("insert into provider.charges (idempotency_key, amount, currency,"
                     f" recipient) values ({quote(pkey)}, 10000, 'RUB', {quote(recipient)})"
                     " returning charge_id")


def late_rows(key):
    return sql("select provider_id, generation, settled_id, found_by, amount, key_status"
               f" from late_operations where idem_key = {quote(key)} order by late_id")


def idemctl(*args):
    env = dict(os.environ, IDEM_DATABASE_URL=DB_URL, IDEM_PROVIDER_URL=provider.url)
    for v in ("IDEM_PROVIDER_KIND", "IDEM_PROVIDER_SECRET", "IDEM_ACCESS_LOG",
              "IDEM_LATE_TABLE"):
        env.pop(v, None)
    # A bound on a hang, not a verdict.
    return subprocess.run([os.path.join(ROOT, "scripts", "idemctl")] + list(args), env=env,
                          capture_output=True, text=True, timeout=COMMAND_BOUND)


def generation_of(key):
    return int(sql_value("select provider_generation from idempotency_keys where"
                         f" client_id = 'shop-1' and idem_key = {quote(key)}"))


if scenario("scan"):
    key, recipient = new_key("late-scan"), f"fail-twice-{random.randrange(10**9)}"
    seen = pay_until_done(key, recipient)
    t.ok(seen[-1].status == 201 and generation_of(key) == 3,
         "fail-twice: settled under the third generation", seen)
    settled = seen[-1].json()["charge_id"]
    saved = key_row(key)["response"]
    late = late_charge(key, 1, recipient)
    # Nothing lists a done key on the client's path: a retry replays.
    again = api.post("/v1/payments", payment(recipient), key=key)
    t.ok(again.status == 201 and again.replayed and again.body == seen[-1].body,
         "a retry replays the saved 201", again)
    t.eq(late_rows(key), [], "not found yet: no listing since")
    api.stop()

    # An instance whose late scan is due at once lists the key again.
    scan = Api(port=19073, IDEM_PROVIDER_URL=provider.url,
               **dict(API_ENV, IDEM_LATE_SCAN_AFTER_SECONDS=1,
                      IDEM_RECOVERY_INTERVAL_SECONDS=1)).start()
    wait_until(lambda: late_rows(key), "the late scan to record the late charge",
               timeout=BOUND)
    t.eq(late_rows(key), [[late, "1", settled, "scan", "10000", "done"]],
         "one row: the late charge, its generation, the settled charge")
    wait_until(lambda: metric(scan.port, "idem_late_operations_total") >= 1,
               "the late charge to be counted", timeout=BOUND)
    t.eq(metric(scan.port, "idem_late_operations_total"), 1,
         "idem_late_operations_total is 1")
    lines = [l for l in scan.read_log().splitlines()
             if f"late operation: the provider made {late} (a payment) for shop-1:{key}" in l]
    t.ok(len(lines) == 1, "an error log line names the late charge and the key", lines)
    t.ok(key_row(key)["response"] == saved and
         sql(f"select charge_id from payments where idem_key = {quote(key)}") ==
         [[settled]], "the payment's saved 201 and its one payment row are unchanged")
    retry = scan.post("/v1/payments", payment(recipient), key=key)
    t.ok(retry.status == 201 and retry.replayed and retry.body == seen[-1].body,
         "a retry still replays the settled charge", retry)
    t.eq(sql_value(f"select count(*) from late_scans where idem_key = {quote(key)}"), "0",
         "the key is listed once: off the scan's queue")
    listed = idemctl("late")
    t.ok(listed.returncode == 0 and f'"provider_id": "{late}"' in listed.stdout and
         "1 not handled" in listed.stdout, "idemctl late lists it", listed.stdout)
    handled = idemctl("late", "handle", late, "refunded", "at", "the", "provider")
    t.ok(handled.returncode == 0 and sql_value(
        f"select handled_note from late_operations where provider_id = {quote(late)}") ==
        "refunded at the provider", "idemctl late handle marks it handled, with the note",
        handled.stdout + handled.stderr)
    twice = idemctl("late", "handle", late, "again")
    t.ok(twice.returncode != 0 and "not handled yet" in twice.stderr,
         "a second handle is refused", twice.stderr)
    scan.stop()
    api = Api(port=19072, IDEM_PROVIDER_URL=provider.url, **API_ENV).start()

if scenario("reconcile"):
    key, recipient = new_key("late-rec"), f"fail-twice-{random.randrange(10**9)}"
    first = [api.post("/v1/payments", payment(recipient), key=key)]
    wait_until(lambda: generation_of(key) == 2 or first.append(
        api.post("/v1/payments", payment(recipient), key=key)) or False,
        "the key to give up generation 1", timeout=BOUND, interval=0.2)
    wait_until(lambda: sql_value("select count(*) from provider.requests where"
                                 f" idempotency_key = {quote('shop-1:' + key + ':2')}") == "1",
               "generation 2 to be sent", timeout=BOUND)
    t.ok(all(r.status != 201 for r in first) and key_row(key)["status"] == "in_progress",
         "generations 1 and 2 got kept 500s: nothing saved", first)
    before = metric(api.port, "idem_late_operations_total")
    one = late_charge(key, 1, recipient)
    two = late_charge(key, 2, recipient)
    seen = pay_until_done(key, recipient)
    t.ok(seen[-1].status == 201 and seen[-1].json()["charge_id"] == one and
         generation_of(key) == 2, "the retry's listing settles the first charge listed",
         seen)
    wait_until(lambda: late_rows(key), "the second to be recorded", timeout=BOUND)
    rows = late_rows(key)
    # Recorded beside the settle: the key was in progress (nothing saved)
    # or done (the first charge saved) then.
    t.ok([r[:2] + r[3:5] for r in rows] == [[two, "2", "reconcile", "10000"]] and
         rows[0][2] in ("", one) and rows[0][5] in ("in_progress", "done"),
         "the other success of the same page is a late charge", rows)
    wait_until(lambda: metric(api.port, "idem_late_operations_total") >= before + 1,
               "it to be counted", timeout=BOUND)
    t.eq(metric(api.port, "idem_late_operations_total"), before + 1, "counted once")
    t.eq(sql(f"select charge_id from payments where idem_key = {quote(key)}"), [[one]],
         "one payment row, the settled charge")

if scenario("idemctl"):
    key, recipient = new_key("late-ctl"), f"fail-twice-{random.randrange(10**9)}"
    seen = pay_until_done(key, recipient)
    assert seen[-1].status == 201, seen
    late = late_charge(key, 2, recipient)
    story = idemctl("key", "shop-1", key)
    t.ok(story.returncode == 0 and any(l.strip().startswith("LATE charges:") and late in l
                                       for l in story.stdout.splitlines()) and
         f"{late} is late: recorded in late_operations" in story.stdout,
         "idemctl key marks the late charge and records it", story.stdout + story.stderr)
    t.eq([r[:4] for r in late_rows(key)], [[late, "2", seen[-1].json()["charge_id"],
                                           "idemctl"]], "one row, found by idemctl")
    story = idemctl("key", "shop-1", key)
    t.ok(f"{late} is late: already in late_operations" in story.stdout and
         len(late_rows(key)) == 1, "told again, recorded once", story.stdout)

if scenario("settle"):
    # An attempt whose call succeeds after another attempt finished the key
    # with another charge (made here by hand in the key's row: what a
    # take-over that settled its own generation leaves): its settle is
    # fenced, and its charge, not the key's, is late.
    slow = Provider(port=19074, IDEM_PROVIDER_LATENCY_MS=1500).start()
    sapi = Api(port=19075, IDEM_PROVIDER_URL=slow.url, **API_ENV).start()
    key, recipient = new_key("late-settle"), new_key("acc")
    before = metric(sapi.port, "idem_late_operations_total")
    call = Background(sapi.post, "/v1/payments", payment(recipient), key=key)
    wait_until(lambda: provider_calls(f"shop-1:{key}") == 1, "the provider to have the call",
               timeout=BOUND)
    pid = sql_value("insert into payments (client_id, idem_key, charge_id, amount, currency,"
                    f" recipient) values ('shop-1', {quote(key)}, 'ch_other_{key[-12:]}',"
                    f" 10000, 'RUB', {quote(recipient)}) returning payment_id")
    other = ('{"payment_id":' + pid + ',"charge_id":"ch_other_' + key[-12:] +
             '","status":"succeeded","amount":10000,"currency":"RUB"}')
    sql("update idempotency_keys set status = 'done', status_code = 201, lease_id ="
        f" lease_id + 1, locked_until = null, finished_at = now(), response = {quote(other)}"
        f" where client_id = 'shop-1' and idem_key = {quote(key)}")
    answer = call.wait(BOUND)
    made = slow.charges(f"shop-1:{key}")
    t.ok(answer.status == 201 and answer.replayed and answer.body.decode() == other,
         "settle: the fenced attempt answers the key's saved outcome", answer)
    wait_until(lambda: late_rows(key), "its own charge to be recorded", timeout=BOUND)
    t.eq(late_rows(key), [[made[0]["charge_id"], "1", "ch_other_" + key[-12:], "settle",
                           "10000", "done"]],
         "settle: its charge, not the key's, is a late charge")
    wait_until(lambda: metric(sapi.port, "idem_late_operations_total") >= before + 1,
               "it to be counted", timeout=BOUND)
    t.eq(metric(sapi.port, "idem_late_operations_total"), before + 1, "settle: counted")
    sapi.stop()
    slow.stop()

api.stop()
provider.stop()
t.done()
