#!/usr/bin/env python3
"""Writes docs/openapi.json, the OpenAPI 3.1 document of the API.

Nothing of an operation is written here: its route comes from the route
table (src/operations/routes.c, the demo routes aside), its fields, its
answer, its summary and its description from its table in
src/operations/, the problems it answers from the SQL it registers (every
idem_problem() its functions reach) and from its strategy's own, and every
problem of src/core/problem.c is a schema of its own. An operation that
lacks a part of its document stops the build. The HTTP tests check every
response they receive against the document (tests/lib/openapi.py).

Run by scripts/build before kodev compiles assets/ (assets/openapi.json
is a link to docs/openapi.json): edit the sources, not the JSON.
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
                        "close (see docs/limits.md)."}
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


# --- the operations, from their C tables and their SQL -----------------------
#
# routes.c names each route's operation; the operation's table, in a file of
# src/operations/, gives its fields, the members of its answer, its summary
# and description, its strategy and what the strategy needs (the lease
# call, the read). The SQL it registers (idem_operation() in sql/) gives the
# problems it answers: every idem_problem('<type>', ...) in its functions
# and in the functions they call.

C_TOKEN = re.compile(r'\s*(?:("(?:[^"\\]|\\.)*")|([A-Za-z_][\w.]*)|'
                     r'(-?\d+)|(\.\w+\s*=)|([{},&()]))')


def c_tokens(text):
    """An initializer's tokens: strings (adjacent ones joined), names,
    numbers, designators (".name="), punctuation."""
    out, pos = [], 0
    while True:
        m = C_TOKEN.match(text, pos)
        if not m or m.end() == pos:
            break
        pos = m.end()
        st, name, num, desig, punct = m.groups()
        if st is not None:
            st = json.loads(st)
            if out and out[-1][0] == "str":
                out[-1] = ("str", out[-1][1] + st)
            else:
                out.append(("str", st))
        elif name is not None:
            out.append(("name", name))
        elif num is not None:
            out.append(("num", int(num)))
        elif desig is not None:
            out.append(("desig", desig[1:].split("=")[0].strip()))
        else:
            out.append(("p", punct))
    if text[pos:].strip():
        sys.exit(f"openapi.py: cannot read the C initializer at "
                 f"{text[pos:pos + 60]!r}")
    return out


def c_value(toks, i):
    """The value at toks[i]: a scalar, or a {...} as a list of (designator
    or None, value); and the index after it."""
    kind, v = toks[i]
    if kind == "p" and v == "{":
        items, i = [], i + 1
        while toks[i] != ("p", "}"):
            desig = None
            if toks[i][0] == "desig":
                desig, i = toks[i][1], i + 1
            val, i = c_value(toks, i)
            items.append((desig, val))
            if toks[i] == ("p", ","):
                i += 1
        return items, i + 1
    if kind == "p" and v == "&":
        return c_value(toks, i + 1)
    if kind == "name" and i + 1 < len(toks) and toks[i + 1] == ("p", "("):
        # A macro: IDEM_FIELDS(t) sets .fields to t.
        args, i = [], i + 2
        while toks[i] != ("p", ")"):
            a, i = c_value(toks, i)
            args.append(a)
            if toks[i] == ("p", ","):
                i += 1
        return ("macro", v, args), i + 1
    return v, i + 1


def c_definitions():
    """Every table defined in src/operations/ (and the demos' file): its
    name -> its initializer, read as c_value does."""
    defs = {}
    for d in ("src/operations",):
        for f in sorted(os.listdir(os.path.join(ROOT, d))):
            if not f.endswith(".c"):
                continue
            text = re.sub(r"/\*.*?\*/", "", read(os.path.join(d, f)),
                          flags=re.S)
            text = re.sub(r"^#.*$", "", text, flags=re.M)
            for m in re.finditer(r"^(?:static\s+)?const\s+struct\s+\w+\s+"
                                 r"(\w+)(?:\[\w*\])?\s*=\s*(\{.*?\n\});",
                                 text, re.M | re.S):
                toks = c_tokens(m.group(2))
                defs[m.group(1)] = c_value(toks, 0)[0]
    return defs


def c_struct(items):
    """A designated initializer as a dict."""
    out = {}
    for desig, val in items:
        if isinstance(val, tuple) and val[0] == "macro" and \
                val[1] == "IDEM_FIELDS":
            out["fields"] = val[2][0]
        elif desig:
            out[desig] = val
    return out


FIELD_MEMBERS = ("name", "kind", "required", "fingerprint", "doc", "values",
                 "items")


def c_rows(defs, table):
    """A field table's rows as dicts, up to its { NULL } if it has one."""
    rows = []
    for _, row in defs[table]:
        r = dict(zip(FIELD_MEMBERS, [None] * len(FIELD_MEMBERS)))
        pos = 0
        for desig, val in row:
            if desig:
                r[desig] = val
            else:
                r[FIELD_MEMBERS[pos]] = val
                pos += 1
        if r["name"] in (None, "NULL"):
            break
        rows.append(r)
    return rows


def c_routes():
    """routes.c's table, demo routes aside: (method, path, label, op)."""
    text = read("src/operations/routes.c")
    text = re.sub(r"#if defined\(DEV_ROUTES\).*?#endif", "", text, flags=re.S)
    return re.findall(r'\{\s*HTTP_METHOD_(\w+),\s*"([^"]*)",\s*'
                      r'"([A-Z]+ [^"]+)",\s*&(\w+)\s*\}', text)


def route_labels():
    """The labels of routes.c ("POST /v1/orders"), demo routes aside."""
    return [label for _, _, label, _ in c_routes()]


def problem_enums():
    """PROBLEM_X -> its type, from problem.c."""
    text = read("src/core/problem.c")
    return dict(re.findall(r'\[(PROBLEM_\w+)\]\s*=\s*\{\s*\d+,\s*"([a-z-]+)"',
                           text))


def sql_functions():
    """Every function the migrations define: name -> its body (the last
    definition); and the operations they register: name -> (strategy,
    [functions])."""
    funcs, ops = {}, {}
    for f in sorted(os.listdir(os.path.join(ROOT, "sql"))):
        if not f.endswith(".sql"):
            continue
        text = read(os.path.join("sql", f))
        for m in re.finditer(r"create\s+or\s+replace\s+function\s+(\w+)\s*\("
                             r".*?\bas\s+(\$\w*\$)(.*?)\2", text,
                             re.S | re.I):
            funcs[m.group(1)] = m.group(3)
        for m in re.finditer(r"idem_operation\(\s*'([^']+)',\s*'(\w+)',\s*"
                             r"'(\w+)'(?:,\s*'(\w+)')?\s*\)", text):
            ops[m.group(1)] = (m.group(2), [x for x in m.group(3, 4) if x])
    return funcs, ops


SQL_FUNCS, SQL_OPS = sql_functions()


def sql_problems(func, seen=None):
    """The problem types func answers, itself or through the functions it
    calls."""
    seen = set() if seen is None else seen
    if func in seen or func not in SQL_FUNCS:
        return []
    seen.add(func)
    body = SQL_FUNCS[func]
    found = re.findall(r"idem_problem\(\s*'([a-z-]+)'", body)
    for called in re.findall(r"\b(\w+)\s*\(", body):
        if called != func:
            found += sql_problems(called, seen)
    return [s for i, s in enumerate(found) if s not in found[:i]]


KINDS = {"FIELD_AMOUNT": "amount", "FIELD_POINTS": "points",
         "FIELD_CURRENCY": "currency", "FIELD_ID": "id", "FIELD_TEXT": "text",
         "FIELD_REF": "ref", "FIELD_POINTS_POSITIVE": "positive",
         "FIELD_TOKEN": "token", "FIELD_COUNT": "count",
         "FIELD_STRING": "string", "FIELD_TIME": "time", "FIELD_LIST": "list"}


def field_schema(f):
    """A body field's schema, as idem_field_check() checks its kind."""
    kind, desc = KINDS[f["kind"]], f["doc"]
    s = {"amount": f_amount, "points": f_points, "id": f_id, "text": f_text,
         "ref": f_positive, "positive": f_positive, "token": f_token,
         "currency": lambda d: dict(f_currency(), description=d + " " +
                                    f_currency()["description"])}[kind](desc)
    s["x-idem-kind"] = kind
    return s


EXAMPLE = {"amount": 10000, "points": 500, "currency": "RUB", "text": "gift",
           "ref": 17, "positive": 300, "token": "tok_visa"}


def request_schema(fields):
    example, n = {}, 0
    for f in fields:
        if KINDS[f["kind"]] == "id":
            n += 1
            example[f["name"]] = f"c-{n}"
        else:
            example[f["name"]] = EXAMPLE[KINDS[f["kind"]]]
    return body({f["name"]: field_schema(f) for f in fields},
                [f["name"] for f in fields if f["required"]],
                [f["name"] for f in fields if f["fingerprint"]], example)


def answer_schema(defs, table, schemas):
    """An answer's schema from its table; its lists' rows get schemas of
    their own, named after their tables."""
    props = {}
    for f in c_rows(defs, table):
        kind, desc = KINDS[f["kind"]], f["doc"]
        if kind == "list":
            name = camel(f["items"])
            schemas[name] = answer_schema(defs, f["items"], schemas)
            s = {"type": "array", "items": ref(name), "description": desc}
        elif kind in ("ref", "amount", "positive"):
            s = count(desc, 1)
        elif kind == "count":
            s = count(desc)
        elif kind == "points":
            s = {"type": "integer", "minimum": -MAX, "maximum": MAX,
                 "description": desc}
        elif kind == "currency":
            s = dict(f_currency(), description=desc)
        elif kind == "id":
            s = {"type": "string", "minLength": 1, "maxLength": 128,
                 "description": desc}
        elif kind == "time":
            s = {"type": "string", "description": desc + " PostgreSQL's "
                 "timestamptz in JSON."}
        else:
            s = {"type": "string", "description": desc}
        values = f["values"].split("|") if f["values"] else None
        if values:
            s = ({"const": values[0]} if len(values) == 1
                 else {"enum": values}) | {"description": desc}
        if not f["required"]:
            s["type"] = [s.get("type", "string"), "null"]
        props[f["name"]] = s
    return obj(props)


def camel(symbol):
    return "".join(w.capitalize() for w in
                   re.sub(r"_operation$", "", symbol).split("_"))


# Every write may answer these (idem.c, the key, the body, the database);
# the lease strategy adds its own (lease.c), the provider's among them.
AUTHED = [(["unauthorized"],),
          (["internal-error"],),
          (["database-unavailable", "database-misconfigured"], (), True)]
WRITE = [(["idempotency-key-missing", "idempotency-key-malformed",
           "invalid-json", "invalid-request"],),
         (["unsupported-media-type"],),
         (["idempotency-key-reused"],)]
LEASE = [(["request-in-progress"], (), True),
         (["idempotency-key-expired"],),
         (["provider-unavailable"],),
         (["provider-rate-limited"], (), True),
         (["provider-timeout"],)]


def retry_after(slug):
    """A 409 or a 503 tells when to come back (Retry-After)."""
    return PROBLEMS[slug][0] in (409, 503)


def operations():
    defs = c_definitions()
    enums = problem_enums()
    out = {}
    for method, path, label, symbol in c_routes():
        if symbol not in defs:
            sys.exit(f"openapi.py: {label}: no table {symbol} in "
                     "src/operations/")
        op = c_struct(defs[symbol])
        for member in ("summary", "doc", "answer"):
            if not op.get(member):
                sys.exit(f"openapi.py: {symbol} has no .{member} (its "
                         "document needs it)")
        name = camel(symbol)
        SCHEMAS[name] = answer_schema(defs, op["answer"], SCHEMAS)
        if method == "GET":
            rd = c_struct(defs[op["read"]])
            # A pattern's argument is named by the label's {name}.
            in_path = re.search(r"\{(\w+)\}", label)
            pname = in_path.group(1) if in_path else rd["arg"]
            ref_arg = rd["parse"] == "idem_path_ref"
            schema = (f_positive if ref_arg else f_id)("")
            schema["description"] = schema["description"].strip()
            p = {"name": pname, "in": "path" if in_path else "query",
                 "required": True, "schema": schema,
                 "description": rd["rule"][0].upper() + rd["rule"][1:] + "."}
            extra = [(["invalid-request"],)]
            if rd["not_found"] != "PROBLEM_NOT_FOUND":
                extra.append(([enums[rd["not_found"]]],))
            out[label] = read_op(op["summary"], op["doc"], [p], "The answer.",
                                 name, extra)
            continue
        fields = c_rows(defs, op["fields"])
        SCHEMAS[name + "Request"] = request_schema(fields)
        strategy, funcs = SQL_OPS.get(op["name"], (None, []))
        if not funcs:
            sys.exit(f"openapi.py: {label}: no migration of sql/ registers "
                     f"{op['name']} (idem_operation())")
        extra = []
        if strategy == "lease":
            call = c_struct(defs[op["call"]])
            saved = [enums[call[k]] for k in ("declined", "rejected")]
            saved = [s for i, s in enumerate(saved) if s not in saved[:i]]
            extra += LEASE
            admit = sql_problems(funcs[1]) if len(funcs) > 1 else []
            extra += [([s], (), retry_after(s)) for s in admit]
        else:
            saved = sql_problems(funcs[0])
        extra += [([s], [s]) for s in saved]
        out[label] = write_op(op["summary"], op["doc"], name + "Request",
                              "The answer (saved: a retry replays it).",
                              name, extra)
    return out

NO_AUTH = [{}]

OPERATIONS = operations()
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
            "scripts/openapi.py from the route table, the operations' "
            "tables (src/operations/), the SQL they register (sql/) and "
            "the problem table; edit those, not the JSON.",
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
