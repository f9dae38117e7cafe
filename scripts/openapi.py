#!/usr/bin/env python3
"""Writes docs/openapi.json, the OpenAPI 3.1 document of the API.

The routes and the problem types are read from the code, so that neither
can be added without the document knowing: every line of the route table
(src/operations/routes.c, the demo routes aside) must have an operation
below, and every problem of src/core/problem.c is a schema of its own.
What each operation takes and answers is written here, next to the
contract it follows (docs/API.md); the HTTP tests check every response
they receive against it (tests/lib/openapi.py).

Run by scripts/build before kodev compiles assets/ (assets/openapi.json
is a link to docs/openapi.json): edit this script, not the JSON.
"""

import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX = 9007199254740991


def read(path):
    with open(os.path.join(ROOT, path)) as f:
        return f.read()


def route_labels():
    """The labels of routes.c ("POST /v1/orders"), demo routes aside."""
    text = read("src/operations/routes.c")
    text = re.sub(r"#if defined\(DEV_ROUTES\).*?#endif", "", text, flags=re.S)
    return re.findall(r'HTTP_METHOD_\w+,\s*"[^"]*",\s*"([A-Z]+ [^"]+)"', text)


def problem_types():
    """The problem table of problem.c: slug -> (status, title)."""
    text = read("src/core/problem.c")
    found = re.findall(r'\[PROBLEM_\w+\]\s*=\s*\{\s*(\d+),\s*"([a-z-]+)",'
                       r'\s*((?:"[^"]*"\s*)+)\}', text)
    return {slug: (int(status), "".join(re.findall(r'"([^"]*)"', title)))
            for status, slug, title in found}


PROBLEMS = problem_types()

# Members a problem carries beyond the four of RFC 9457, by type.
PROBLEM_EXTRAS = {
    "insufficient-balance": {
        "balance": ("integer", "The customer's balance when it was refused."),
    },
    "balance-limit-exceeded": {
        "balance": ("integer", "The customer's balance when it was refused."),
    },
    "refund-exceeds-payment": {
        "payment_id": ("integer", "The payment."),
        "payment_amount": ("integer", "Its amount."),
        "refunded": ("integer", "What its succeeded refunds took."),
    },
    "refund-in-progress": {
        "payment_id": ("integer", "The payment."),
        "payment_amount": ("integer", "Its amount."),
        "refunded": ("integer", "What its succeeded refunds took."),
        "pending": ("integer", "What its unfinished refunds hold."),
    },
}


def ref(name):
    return {"$ref": f"#/components/schemas/{name}"}


def count(desc, minimum=0):
    return {"type": "integer", "minimum": minimum, "maximum": MAX,
            "description": desc}


def obj(props, required=None, desc=None):
    s = {"type": "object", "properties": props,
         "required": list(props) if required is None else required,
         "additionalProperties": False}
    if desc:
        s["description"] = desc
    return s


# --- body fields: the kinds of src/core/idem.c (idem_field_check) ----------

def f_amount(desc):
    return {"type": "integer", "minimum": 1, "maximum": MAX,
            "description": desc + " An integer count of minor units "
            "(kopecks, cents), 1 to 2^53-1; a float, a string or a "
            "negative is a 400."}


def f_points(desc):
    return {"type": "integer", "minimum": -MAX, "maximum": MAX,
            "not": {"const": 0}, "description": desc +
            " A non-zero integer, -(2^53-1) to 2^53-1."}


def f_positive(desc):
    return {"type": "integer", "minimum": 1, "maximum": MAX,
            "description": desc + " An integer, 1 to 2^53-1."}


def f_currency():
    return {"type": "string", "pattern": "^[A-Z]{3}$",
            "description": "Three upper-case ASCII letters (ISO 4217)."}


def f_id(desc):
    return {"type": "string", "minLength": 1, "maxLength": 128,
            "pattern": "^[^\\u0000-\\u001f\\u007f]+$",
            "description": desc + " 1 to 128 bytes of UTF-8 without "
            "control characters."}


def f_text(desc):
    return {"type": "string", "maxLength": 1024,
            "pattern": "^[^\\u0000]*$",
            "description": desc + " At most 1024 bytes of UTF-8, no NUL."}


def f_token(desc):
    return {"type": "string", "minLength": 1, "maxLength": 255,
            "pattern": "^[!-~]+$",
            "description": desc + " 1 to 255 visible ASCII characters."}


def body(props, required, fingerprint, example):
    s = obj(props, required)
    # Fields outside the list (a client timestamp) are accepted, ignored.
    s["additionalProperties"] = True
    s["description"] = ("Fingerprint fields: " + ", ".join(fingerprint) +
                        ". Members not listed here are accepted and do "
                        "not count in the fingerprint.")
    s["example"] = example
    return s


SCHEMAS = {
    "OrderRequest": body({
        "customer_id": f_id("The customer."),
        "amount": f_amount("The order's amount."),
        "currency": f_currency(),
        "comment": f_text("Free text."),
    }, ["customer_id", "amount", "currency"],
        ["customer_id", "amount", "currency", "comment"],
        {"customer_id": "c-42", "amount": 150000, "currency": "RUB"}),
    "Order": obj({
        "order_id": count("The order.", 1),
        "customer_id": f_id("The customer."),
        "amount": count("Minor units.", 1),
        "currency": f_currency(),
        "bonus_points": count("Points accrued: floor(amount / 100)."),
    }),
    "OrderListItem": obj({
        "order_id": count("The order.", 1),
        "customer_id": f_id("The customer."),
        "amount": count("Minor units.", 1),
        "currency": f_currency(),
        "comment": {"type": ["string", "null"]},
        "bonus_points": count("Points accrued."),
        "created_at": {"type": "string", "description": "When it was "
                       "created (PostgreSQL's timestamptz in JSON)."},
    }),
    "OrderList": obj({
        "orders": {"type": "array", "items": ref("OrderListItem"),
                   "description": "The client's latest 100 orders of the "
                   "customer, oldest first."},
    }),
    "BonusRequest": body({
        "customer_id": f_id("The customer."),
        "points": f_points("Points to accrue (> 0) or redeem (< 0)."),
        "reason": f_text("Why."),
    }, ["customer_id", "points", "reason"],
        ["customer_id", "points", "reason"],
        {"customer_id": "c-42", "points": -500, "reason": "redeem"}),
    "BonusEntry": obj({
        "entry_id": count("The ledger row.", 1),
        "customer_id": f_id("The customer."),
        "points": {"type": "integer", "minimum": -MAX, "maximum": MAX},
        "balance": count("The new balance."),
    }),
    "Balance": obj({
        "customer_id": f_id("The customer."),
        "balance": count("0 for an unknown customer."),
    }),
    "TransferRequest": body({
        "from_customer_id": f_id("Who gives."),
        "to_customer_id": f_id("Who receives; differs from "
                               "from_customer_id."),
        "points": f_positive("Points moved."),
        "reason": f_text("Why."),
    }, ["from_customer_id", "to_customer_id", "points", "reason"],
        ["from_customer_id", "to_customer_id", "points", "reason"],
        {"from_customer_id": "c-1", "to_customer_id": "c-2", "points": 300,
         "reason": "gift"}),
    "Transfer": obj({
        "transfer_id": count("The transfer.", 1),
        "from_customer_id": f_id("Who gave."),
        "to_customer_id": f_id("Who received."),
        "points": count("Points moved.", 1),
        "from_balance": count("The giver's new balance."),
        "to_balance": count("The receiver's new balance."),
    }),
    "PaymentRequest": body({
        "amount": f_amount("The charge."),
        "currency": f_currency(),
        "recipient": f_id("Who is paid (the fake provider's magic "
                          "recipients: decline, fail, slow, reject)."),
        "purpose": f_text("Free text."),
        "payment_method": f_token("The provider's reference to the means "
                                  "of payment: Stripe's source, e.g. "
                                  "tok_visa. Required when the service "
                                  "runs with IDEM_PROVIDER_KIND=stripe "
                                  "(a 400 before the key is taken)."),
        "sent_at": {"description": "Any value; not part of the "
                    "fingerprint."},
    }, ["amount", "currency", "recipient"],
        ["amount", "currency", "recipient", "purpose", "payment_method"],
        {"amount": 10000, "currency": "RUB", "recipient": "acc-1",
         "purpose": "order 17", "payment_method": "tok_visa"}),
    "Payment": obj({
        "payment_id": count("The payment.", 1),
        "charge_id": {"type": "string", "description": "The provider's "
                      "charge."},
        "status": {"const": "succeeded"},
        "amount": count("Minor units.", 1),
        "currency": f_currency(),
    }),
    "PaymentRefund": obj({
        "refund_id": count("The refund.", 1),
        "amount": count("Minor units.", 1),
        "status": {"enum": ["pending", "succeeded", "rejected"]},
    }),
    "PaymentWithRefunds": obj({
        "payment_id": count("The payment.", 1),
        "charge_id": {"type": "string"},
        "status": {"const": "succeeded"},
        "amount": count("Minor units.", 1),
        "currency": f_currency(),
        "refunded": count("The sum of its succeeded refunds."),
        "refunds": {"type": "array", "items": ref("PaymentRefund"),
                    "description": "Every refund, whatever its status."},
    }),
    "RefundRequest": body({
        "payment_id": f_positive("A succeeded payment of the client."),
        "amount": f_amount("What to refund."),
        "reason": f_text("Why."),
    }, ["payment_id", "amount"], ["payment_id", "amount", "reason"],
        {"payment_id": 17, "amount": 4000, "reason": "damaged"}),
    "Refund": obj({
        "refund_id": count("The refund.", 1),
        "payment_id": count("The payment.", 1),
        "provider_refund_id": {"type": "string"},
        "amount": count("Minor units.", 1),
        "status": {"const": "succeeded"},
    }),
    "Health": obj({
        "status": {"const": "ok"},
        "database": {"const": "up"},
    }),
    "ProblemType": {
        "type": "string", "enum": sorted(PROBLEMS),
        "description": "Every problem type; a problem's type is "
        "<IDEM_PUBLIC_URL>/problems/<one of these>, a page the service "
        "serves.\n\n" + "\n".join(
            f"- `{s}` ({PROBLEMS[s][0]}): {PROBLEMS[s][1]}"
            for s in sorted(PROBLEMS)),
    },
    "Problem": {
        "type": "object",
        "description": "RFC 9457 problem details "
        "(application/problem+json). Each type has a schema of its own, "
        "Problem-<type>, with the members it adds.",
        "properties": {
            "type": {"type": "string", "format": "uri",
                     "pattern": "/problems/(" + "|".join(sorted(PROBLEMS)) +
                     ")$"},
            "title": {"type": "string"},
            "status": {"type": "integer"},
            "detail": {"type": "string"},
        },
        "required": ["type", "title", "status", "detail"],
    },
}

for slug, (status, title) in PROBLEMS.items():
    props = {
        "type": {"type": "string", "format": "uri",
                 "pattern": f"/problems/{slug}$"},
        "title": {"const": title},
        "status": {"const": status},
        "detail": {"type": "string", "description": "What happened to "
                   "this request."},
    }
    for name, (kind, desc) in PROBLEM_EXTRAS.get(slug, {}).items():
        props[name] = {"type": kind, "description": desc}
    s = obj(props, desc=f"{title}. The page: /problems/{slug}.")
    SCHEMAS[f"Problem-{slug}"] = s


# --- headers and responses --------------------------------------------------

HEADERS = {
    "Idempotent-Replayed": {
        "description": "`true` on a replay: the status and body are the "
        "first response's, byte for byte. Absent otherwise.",
        "schema": {"const": "true"},
    },
    "Retry-After": {
        "description": "Seconds to wait before retrying with the same "
        "Idempotency-Key.",
        "schema": {"type": "string", "pattern": "^[0-9]+$"},
    },
}


def header(name, required=False):
    h = {"$ref": f"#/components/headers/{name}"}
    if required:
        # A $ref cannot carry required: spelled out instead.
        h = dict(HEADERS[name], required=True)
    return h


def json_response(desc, schema, replayable=False):
    r = {"description": desc,
         "content": {"application/json": {"schema": ref(schema)}}}
    if replayable:
        r["headers"] = {"Idempotent-Replayed": header("Idempotent-Replayed")}
    return r


def problem_response(slugs, saved=(), retry=()):
    """The problem response of one status: one of the types listed."""
    for s in slugs:
        if s not in PROBLEMS:
            sys.exit(f"openapi.py: no problem type {s} in problem.c")
    statuses = {PROBLEMS[s][0] for s in slugs}
    if len(statuses) != 1:
        sys.exit(f"openapi.py: {slugs} have several statuses")
    schemas = [ref(f"Problem-{s}") for s in slugs]
    desc = ", ".join(f"`{s}`" + (" (saved and replayed)" if s in saved
                                 else "") for s in slugs)
    r = {"description": desc,
         "content": {"application/problem+json": {
             "schema": schemas[0] if len(schemas) == 1
             else {"oneOf": schemas}}}}
    headers = {}
    if saved:
        headers["Idempotent-Replayed"] = header("Idempotent-Replayed")
    if retry:
        headers["Retry-After"] = header("Retry-After", required=True)
    if headers:
        r["headers"] = headers
    return statuses.pop(), r


def problems(*groups):
    """Responses from groups of (slugs, saved, retry)."""
    out = {}
    for g in groups:
        slugs, saved, retry = (list(g) + [(), ()])[:3]
        status, r = problem_response(slugs, saved, retry)
        out[str(status)] = r
    return out


AUTHED = [(["unauthorized"],),
          (["internal-error"],),
          (["database-unavailable", "database-misconfigured"], (), True)]
WRITE = [(["idempotency-key-missing", "idempotency-key-malformed",
           "invalid-json", "invalid-request"],),
         (["unsupported-media-type"],),
         (["idempotency-key-reused"],)]

KEY_PARAM = {"$ref": "#/components/parameters/IdempotencyKey"}


def write_op(summary, desc, req, ok, resp, extra):
    """A POST /v1/* operation; extra problem groups override WRITE's."""
    responses = {"201": json_response(ok, resp, replayable=True)}
    merged = {}
    for g in AUTHED + WRITE + extra:
        slugs, rest = g[0], g[1:]
        status = PROBLEMS[slugs[0]][0]
        if status in merged:
            old = merged[status]
            slugs = old[0] + [s for s in slugs if s not in old[0]]
            saved = tuple(old[1]) + tuple(rest[0] if rest else ())
            retry = old[2] or (rest[1] if len(rest) > 1 else ())
            merged[status] = (slugs, saved, retry)
        else:
            merged[status] = (list(slugs), tuple(rest[0] if rest else ()),
                              rest[1] if len(rest) > 1 else ())
    responses.update(problems(*merged.values()))
    # Past 64 KiB Kore answers before the service sees the request (its
    # http_body_max is the service's limit): a bare 413, no body.
    responses["413"] = {"description": "The body is larger than 64 KiB: "
                        "Kore's own answer, with no body and Connection: "
                        "close (see the README)."}
    return {"summary": summary, "description": desc,
            "parameters": [KEY_PARAM],
            "requestBody": {"required": True, "content": {
                "application/json": {"schema": ref(req)}}},
            "responses": dict(sorted(responses.items()))}


def read_op(summary, desc, params, ok, resp, extra=()):
    responses = {"200": json_response(ok, resp)}
    responses.update(problems(*(AUTHED + list(extra))))
    return {"summary": summary, "description": desc, "parameters": params,
            "responses": dict(sorted(responses.items()))}


LEASE = [(["card-declined"], ["card-declined"]),
         (["request-in-progress"], (), True),
         (["idempotency-key-expired"],),
         (["provider-unavailable"],),
         (["provider-rate-limited"], (), True),
         (["provider-timeout"],)]

OPERATIONS = {
    "POST /v1/orders": write_op(
        "Create an order and accrue its bonus points",
        "Transactional: the key, the order and the accrual of "
        "floor(amount / 100) points commit together. A concurrent "
        "duplicate waits for the first and is answered its response as a "
        "replay; no 409 on this route.",
        "OrderRequest", "The order.", "Order",
        [(["balance-limit-exceeded", "idempotency-key-reused"],
          ["balance-limit-exceeded"])]),
    "GET /v1/orders": read_op(
        "List a customer's orders",
        "The calling client's latest 100 orders of the customer.",
        [{"name": "customer_id", "in": "query", "required": True,
          "schema": f_id("The customer.")}],
        "The orders.", "OrderList",
        [(["invalid-request"],)]),
    "POST /v1/bonuses": write_op(
        "Accrue or redeem bonus points",
        "Transactional: a ledger row and the new balance. A balance that "
        "would go below zero or past 2^53-1 is a saved 422.",
        "BonusRequest", "The ledger entry.", "BonusEntry",
        [(["insufficient-balance", "balance-limit-exceeded",
           "idempotency-key-reused"],
          ["insufficient-balance", "balance-limit-exceeded"])]),
    "GET /v1/bonuses/{customer_id}": read_op(
        "A customer's bonus balance",
        "The calling client's ledger only; 0 for an unknown customer.",
        [{"name": "customer_id", "in": "path", "required": True,
          "description": "Percent-encoded (%XX; + is a plus).",
          "schema": f_id("The customer.")}],
        "The balance.", "Balance",
        [(["invalid-request"],)]),
    "POST /v1/bonuses/transfers": write_op(
        "Move points from one customer to another",
        "Transactional: two ledger rows and both balances in one "
        "transaction; transfers in opposite directions never deadlock.",
        "TransferRequest", "The transfer.", "Transfer",
        [(["insufficient-balance", "balance-limit-exceeded",
           "idempotency-key-reused"],
          ["insufficient-balance", "balance-limit-exceeded"])]),
    "POST /v1/payments": write_op(
        "Charge through the payment provider",
        "Lease strategy: the key is taken with a lease before the provider "
        "is called with Idempotency-Key `<client_id>:<key>`. A duplicate "
        "while the lease holds is a 409 with Retry-After; a provider "
        "failure (502, 504) is not saved and the lease is released, so "
        "that a retry with the same key goes on; a decline (402) or a "
        "refusal (422 payment-rejected) is saved and replayed.",
        "PaymentRequest", "The payment.", "Payment",
        LEASE + [(["payment-rejected", "idempotency-key-reused"],
                  ["payment-rejected"])]),
    "GET /v1/payments/{payment_id}": read_op(
        "A payment and its refunds",
        "Only the calling client's payments.",
        [{"name": "payment_id", "in": "path", "required": True,
          "schema": f_positive("The payment.")}],
        "The payment.", "PaymentWithRefunds",
        [(["invalid-request"],), (["payment-not-found"],)]),
    "POST /v1/refunds": write_op(
        "Refund (part of) a payment",
        "Lease strategy, as payments. The amount is held when the key is "
        "taken: a refund past what is left is a 422 "
        "refund-exceeds-payment, one that fits only if refunds in flight "
        "fail a 409 refund-in-progress with Retry-After; neither takes "
        "the key, nor does an unknown payment (404).",
        "RefundRequest", "The refund.", "Refund",
        [(["payment-not-found"],),
         (["request-in-progress", "refund-in-progress"], (), True),
         (["idempotency-key-expired"],),
         (["provider-unavailable"],),
         (["provider-rate-limited"], (), True),
         (["provider-timeout"],),
         (["refund-exceeds-payment", "refund-rejected",
           "idempotency-key-reused"], ["refund-rejected"])]),
}

NO_AUTH = [{}]

OPERATIONS.update({
    "GET /healthz": {
        "summary": "Whether the database answers",
        "description": "No token needed: expose it on loopback or guard it "
        "at the proxy.",
        "security": NO_AUTH,
        "responses": dict({"200": json_response("The database answers.",
                                                "Health")},
                          **problems((["database-unavailable",
                                       "database-misconfigured"], (),
                                      True))),
    },
    "GET /metrics": {
        "summary": "Prometheus metrics",
        "description": "Requests by route and outcome (created, replayed, "
        "in_flight_409, mismatch_422, invalid_400, unauthorized_401, "
        "provider_error, db_error, ok), latency, lease takeovers, keys "
        "deleted by cleanup, database errors. No token needed.",
        "security": NO_AUTH,
        "responses": {"200": {"description": "Prometheus text format.",
                              "content": {"text/plain": {"schema": {
                                  "type": "string"}}}}},
    },
    "GET /openapi.json": {
        "summary": "This document",
        "security": NO_AUTH,
        "responses": {
            "200": {"description": "The OpenAPI 3.1 document.",
                    "content": {"application/json": {"schema": {
                        "type": "object", "required": ["openapi"]}}}},
            "304": {"description": "Unchanged (If-None-Match)."},
        },
    },
    "GET /docs": {
        "summary": "This document as a page",
        "description": "Rendered in the browser from /openapi.json; no "
        "request leaves the machine.",
        "security": NO_AUTH,
        "responses": {
            "200": {"description": "An HTML page.",
                    "content": {"text/html": {"schema": {"type": "string"}}}},
            "304": {"description": "Unchanged (If-None-Match)."},
        },
    },
})


def document():
    labels = route_labels()
    missing = [l for l in labels if l not in OPERATIONS]
    if missing:
        sys.exit("openapi.py: routes of routes.c without an operation here: "
                 + ", ".join(missing))
    paths = {}
    for label, op in OPERATIONS.items():
        method, path = label.split(" ", 1)
        if path.startswith("/v1/") and label not in labels:
            sys.exit(f"openapi.py: {label} is not in routes.c")
        op = dict(op, operationId=re.sub(r"[^A-Za-z0-9]+", "_",
                                         label.lower()).strip("_"))
        paths.setdefault(path, {})[method.lower()] = op
    return {
        "openapi": "3.1.0",
        "jsonSchemaDialect": "https://json-schema.org/draft/2020-12/schema",
        "info": {
            "title": "Idempotent payments API",
            "version": "1.0.0",
            "description": "Safe retries of money-moving requests. Every "
            "POST /v1/* needs an Idempotency-Key; a retry with the same key "
            "and body gets the first outcome (Idempotent-Replayed: true), "
            "another body with it a 422. The contract in prose: "
            "docs/API.md. This document is generated by "
            "scripts/openapi.py from the route table and the problem "
            "table; edit the script, not the JSON.",
        },
        "servers": [{"url": "http://127.0.0.1:8888",
                     "description": "make run"}],
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {
                "type": "http", "scheme": "bearer",
                "description": "A client's token (dev: dev-shop-1, "
                "dev-shop-2). Missing or unknown: 401."}},
            "parameters": {"IdempotencyKey": {
                "name": "Idempotency-Key", "in": "header", "required": True,
                "description": "1 to 255 characters of visible ASCII "
                "(0x21 to 0x7E), bare (`abc`) or as an RFC 8941 string "
                "(`\"abc\"`, with \\\" and \\\\ escapes), which means its "
                "content: both forms are the same key. Scoped to the "
                "client. Missing or malformed: 400.",
                "schema": {"type": "string", "minLength": 1,
                           "pattern": "^([!#-~][!-~]{0,254}|\"([!#-\\[\\]-~]"
                           "|\\\\[\"\\\\]){1,255}\")$"},
                "examples": {"bare": {"value": "order-17-attempt"},
                             "quoted": {"value": "\"order-17-attempt\""}}}},
            "headers": HEADERS,
            "schemas": SCHEMAS,
        },
    }


def main():
    out = os.path.join(ROOT, "docs", "openapi.json")
    text = json.dumps(document(), indent=1, ensure_ascii=False) + "\n"
    try:
        with open(out) as f:
            if f.read() == text:
                return
    except FileNotFoundError:
        pass
    with open(out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
