"""Every answer of the payment provider has exactly one class, and the client
gets what API.md's lease table says for it: a 2xx with a charge id is a 201;
a 402 a saved card-declined; 401, 403, 404, 405, 407, 413, 414, 415 and 451
(this service's secret, URL or a gateway: a fault of configuration) a 502
with a fixed detail, not saved, released, logged at error; the key met
other parameters (idempotency-key-reused) a 502, not saved; a 429 a 503
provider-rate-limited with the provider's Retry-After, released; any other
4xx but 408 and 409 a saved payment-rejected with the provider's reason,
never sent to the provider again; a 409 (the provider still processes the
key) a 409 with Retry-After and the lease released; anything else, 408
included (the provider did not take the request up), a 502, released; a
problem's detail never carries libcurl's text or the provider's address. The rows the fake provider cannot
give come from a stub provider; the permanent refusal of the real fake
provider (recipient "reject") is followed through replays and the recovery
job."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import (JOB_BOUND, Api, Provider, StubProvider, Tap, free_port,  # noqa: E402
                     key_row, provider_calls, quote, request, sql, sql_value, wait_until)
from harness import new_key as any_key  # noqa: E402

t = Tap()
# Every key this test takes: the recovery job's end is read off them alone,
# never off keys other tests left in the shared database.
MINE = []


def new_key(prefix):
    MINE.append(any_key(prefix))
    return MINE[-1]


def payment(recipient, amount=10000):
    return {"amount": amount, "currency": "RUB", "recipient": recipient}


def problem_type(r):
    try:
        return r.json()["type"].rsplit("/", 1)[-1]
    except (ValueError, KeyError):
        return None


# Row by row through a provider that answers what each recipient asks for.
JSON = {"Content-Type": "application/json"}
stub = StubProvider({
    "ok-200": (200, JSON, {"charge_id": "ch_stub_200", "amount": 10000}),
    "ok-202": (202, JSON, {"charge_id": "ch_stub_202"}),
    "no-charge-id": (200, JSON, {"status": "ok"}),
    "empty-charge-id": (201, JSON, {"charge_id": ""}),
    "numeric-charge-id": (201, JSON, {"charge_id": 42}),
    "not-json": (201, {}, b"charged!"),
    "declined": (402, JSON, {"detail": "insufficient funds"}),
    "not-found": (404, JSON, {"title": "Not Found", "detail": "unknown recipient \u00e9"}),
    "bad-request": (400, {}, b""),
    "unprocessable": (422, JSON, {"detail": "amount over the card's limit"}),
    "nul-detail": (402, JSON, {"detail": "\u0000 after a NUL"}),
    "busy-7": (409, {"Retry-After": "7"}, {"detail": "in progress"}),
    "busy": (409, {}, b""),
    "late-408": (408, {}, b""),
    "limited-429": (429, {"Retry-After": "3"}, b""),
    "secret-401": (401, JSON, {"detail": "bad secret sk_live_oops"}),
    "forbidden-403": (403, {}, b""),
    "method-405": (405, {}, b""),
    "proxy-407": (407, {}, b""),
    "waf-413": (413, {}, b""),
    "uri-414": (414, {}, b""),
    "media-415": (415, {}, b""),
    "legal-451": (451, {}, b""),
    "key-reused": (422, {"Content-Type": "application/problem+json"},
                   {"type": "http://127.0.0.1:1/problems/idempotency-key-reused",
                    "detail": "this Idempotency-Key was used with other parameters"}),
    "error-500": (500, {}, b""),
    "error-503": (503, {}, b""),
    "redirect": (301, {"Location": "http://127.0.0.1:1/"}, b""),
})
api = Api(IDEM_PROVIDER_URL=stub.url).start()

rows = [
    # recipient, status, problem type (None: a payment), saved
    ("ok-200", 201, None, True),
    ("ok-202", 201, None, True),
    ("no-charge-id", 502, "provider-unavailable", False),
    ("empty-charge-id", 502, "provider-unavailable", False),
    ("numeric-charge-id", 502, "provider-unavailable", False),
    ("not-json", 502, "provider-unavailable", False),
    ("declined", 402, "card-declined", True),
    ("not-found", 502, "provider-unavailable", False),
    ("secret-401", 502, "provider-unavailable", False),
    ("forbidden-403", 502, "provider-unavailable", False),
    ("method-405", 502, "provider-unavailable", False),
    ("proxy-407", 502, "provider-unavailable", False),
    ("waf-413", 502, "provider-unavailable", False),
    ("uri-414", 502, "provider-unavailable", False),
    ("media-415", 502, "provider-unavailable", False),
    ("legal-451", 502, "provider-unavailable", False),
    ("key-reused", 502, "provider-unavailable", False),
    ("bad-request", 422, "payment-rejected", True),
    ("unprocessable", 422, "payment-rejected", True),
    ("busy-7", 409, "request-in-progress", False),
    ("busy", 409, "request-in-progress", False),
    ("late-408", 502, "provider-unavailable", False),
    ("limited-429", 503, "provider-rate-limited", False),
    ("error-500", 502, "provider-unavailable", False),
    ("error-503", 502, "provider-unavailable", False),
    ("redirect", 502, "provider-unavailable", False),
]
for recipient, status, kind, saved in rows:
    key = new_key("cls")
    r = api.post("/v1/payments", payment(recipient), key=key)
    row = key_row(key)
    t.ok(r.status == status and problem_type(r) == kind,
         f"provider answers {recipient}: the client gets {status} {kind or 'payment'}", r)
    if saved:
        again = api.post("/v1/payments", payment(recipient), key=key)
        t.ok(row["status"] == "done" and row["status_code"] == str(status) and
             again.status == status and again.replayed and again.body == r.body and
             len(stub.calls_of(f"shop-1:{key}")) == 1,
             f"{recipient}: saved and replayed byte for byte, the provider called once",
             (row, again))
    else:
        t.ok(row["status"] == "in_progress" and row["response"] is None and
             not row["leased"], f"{recipient}: nothing saved, the lease released", row)

r = api.post("/v1/payments", payment("ok-200"), key=new_key("cls"))
t.eq(r.json().get("charge_id"), "ch_stub_200", "a success is saved with the provider's charge id")
r = api.post("/v1/payments", payment("unprocessable"), key=new_key("cls"))
t.eq(r.json().get("detail"), "amount over the card's limit",
     "a refusal carries the provider's reason as its detail")
r = api.post("/v1/payments", payment("secret-401"), key=new_key("cls"))
t.ok(r.status == 502 and "configuration" in r.json().get("detail", "") and
     "sk_live" not in r.body.decode(),
     "a configuration fault: a fixed detail, not the provider's words", r)
t.ok(any("bad secret sk_live_oops" in line and "status 401" in line
         for line in api.read_log().splitlines()),
     "and the provider's words are logged, with its status")
r = api.post("/v1/payments", payment("limited-429"), key=new_key("cls"))
t.eq(r.headers.get("retry-after"), "3", "a provider 429: a 503 with the provider's Retry-After")
r = api.post("/v1/payments", payment("bad-request"), key=new_key("cls"))
t.eq(r.json().get("detail"), "the provider refused the payment (status 400)",
     "or its status when it gives none")
r = api.post("/v1/payments", payment("nul-detail"), key=new_key("cls"))
t.eq(r.json().get("detail"), "the provider refused the payment (status 402)",
     "or when a NUL ends its reason at once (found by the fuzz target)")
r = api.post("/v1/payments", payment("busy-7"), key=new_key("cls"))
t.eq(r.headers.get("retry-after"), "7", "a provider 409: the provider's Retry-After")
r = api.post("/v1/payments", payment("busy"), key=new_key("cls"))
t.eq(r.headers.get("retry-after"), "1", "or 1 s when it sends none")

# A 409 is a hint to wait, not an outcome: the retry goes to the provider
# again and gets the charge once the provider has it.
key = new_key("cls")
stub.answers["busy-then-ok"] = lambda n: (409, {"Retry-After": "1"}, b"") if n == 1 else \
    (201, JSON, {"charge_id": "ch_after_409"})
first = api.post("/v1/payments", payment("busy-then-ok"), key=key)
second = api.post("/v1/payments", payment("busy-then-ok"), key=key)
t.ok(first.status == 409 and second.status == 201 and not second.replayed and
     second.json()["charge_id"] == "ch_after_409",
     "provider 409, then the retry gets the charge: 409, 201", (first, second))
t.ok("2xx without a valid id" in api.read_log(),
     "a 2xx without a charge id is logged as such")
api.stop()
stub.stop()

# An unreachable provider: the client is told so in a fixed phrase; libcurl's
# words, which name the provider's host and port, go to the log only.
closed = free_port()
api = Api(IDEM_PROVIDER_URL=f"http://127.0.0.1:{closed}").start()
r = api.post("/v1/payments", payment("anyone"), key=new_key("cls"))
t.ok(r.status == 502 and r.json().get("detail", "").startswith(
    "the payment provider could not be reached") and str(closed) not in r.body.decode(),
    "an unreachable provider: a 502 whose detail names no host or port", r)
t.ok(str(closed) in api.read_log(), "libcurl's words, with the port, are in the log")
api.stop()

# The fake provider refuses recipient "reject" for good: a saved 422 that
# neither a retry nor the recovery job sends to the provider again.
provider = Provider(IDEM_PROVIDER_LATENCY_MS=200).start()
api = Api(IDEM_PROVIDER_URL=provider.url, IDEM_RECOVERY_AFTER_SECONDS=1,
          IDEM_RECOVERY_INTERVAL_SECONDS=1, IDEM_RECOVERY_BACKOFF_SECONDS=1).start()
key = new_key("reject")
rejected = api.post("/v1/payments", payment("reject"), key=key)
t.ok(rejected.status == 422 and problem_type(rejected) == "payment-rejected" and
     rejected.headers["content-type"] == "application/problem+json",
     "recipient reject: 422 payment-rejected", rejected)
t.ok("invalid recipient" in rejected.json()["detail"], "with the provider's reason",
     rejected.json())
page = request(api.port, "GET", "/" + rejected.json()["type"].split("/", 3)[3])
t.ok(page.status == 200 and page.headers["content-type"].startswith("text/html") and
     b"The payment provider refused the payment" in page.body,
     "its type URL serves the payment-rejected page", page)
again = api.post("/v1/payments", payment("reject"), key=key)
t.ok(again.status == 422 and again.replayed and again.body == rejected.body,
     "a retry gets it byte for byte, with Idempotent-Replayed: true", again)
t.eq(key_row(key)["status_code"], "422", "the key holds the saved 422")
t.eq(provider_calls(f"shop-1:{key}"), 1, "the provider was called exactly once")
t.eq(provider.charges(f"shop-1:{key}"), [], "and charged nothing")

# An abandoned payment next to it, and the payments the stub left released:
# once the job has finished them all, it has had its chances at the
# rejected one too.
abandoned = new_key("orphan")
sql("insert into idempotency_keys (client_id, idem_key, operation, fingerprint, status,"
    f" lease_id, locked_until, request) values ('shop-1', {quote(abandoned)},"
    " 'payments.create', repeat('a', 64), 'in_progress', 1, now() - interval '1 hour',"
    " '{\"amount\":100,\"currency\":\"RUB\",\"recipient\":\"acc-abandoned\"}')")
left = "select count(*) from idempotency_keys where status = 'in_progress' and" \
    f" idem_key in ({', '.join(quote(k) for k in MINE)})"
wait_until(lambda: sql_value(left) == "0", "the recovery job to finish them", timeout=JOB_BOUND,
           show=lambda: sql_value(left))
t.eq(key_row(abandoned)["status_code"], "201",
     "the recovery job ran: it finished the abandoned payment")
t.eq(provider_calls(f"shop-1:{key}"), 1, "and never called the provider for the rejected one")

api.stop()
provider.stop()
t.done()
