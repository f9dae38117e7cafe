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
import shlex
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX = 9007199254740991


def read(path):
    with open(os.path.join(ROOT, path)) as f:
        return f.read()


# The release (src/core/release.h): the document's version and examples.
RELEASE = re.search(r'#define IDEM_RELEASE\s+"([^"]+)"',
                    read("src/core/release.h")).group(1)


def problem_types():
    """The problem table of problem.c: slug -> (status, title)."""
    text = read("src/core/problem.c")
    # Not up to the brace: a line the compiler will refuse is its to
    # report, not this script's.
    found = re.findall(r'\[PROBLEM_\w+\]\s*=\s*\{\s*(\d+),\s*"([a-z-]+)",'
                       r'\s*((?:"[^"]*"\s*)+)', text)
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


# --- the schemas of a read's argument and of an answer's members ------------

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
        "version": {"type": "string", "description": "The release that "
                    "answered (CHANGELOG.md), as in Idem-Version.",
                    "examples": [RELEASE]},
        "schema": {"type": "string", "pattern": "^(current|ahead: .+)$",
                   "description": "`current`: the database has the "
                   "migrations of sql/ this release was built with; "
                   "`ahead: <names>`: it also has a newer release's, which "
                   "this one serves beside. A schema behind is a 503 "
                   "database-misconfigured naming what it lacks."},
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
    "Idem-Version": {
        "description": "The release that served the answer (every answer "
        "carries it, Kore's own bare ones too).",
        "schema": {"type": "string", "examples": [RELEASE]},
    },
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
# call, the read). The compiler reads them: scripts/openapi-tables.c, linked
# with src/operations/ alone, prints them as JSON. The SQL it registers
# (idem_operation() in sql/) gives the problems it answers: every
# idem_problem('<type>', ...) in its functions and in the functions they
# call.

def include_dirs():
    """The -I flags of conf/build.conf, the module's own."""
    return re.findall(r"[=\s](-I\S+)", read("conf/build.conf"))


def c_tables():
    """The route table, demo routes aside, and each route's operation."""
    try:
        pg = subprocess.run(["pg_config", "--includedir"], capture_output=True,
                            text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        pg = "/usr/include/postgresql"
    ops = sorted(os.path.join("src/operations", f) for f in
                 os.listdir(os.path.join(ROOT, "src/operations"))
                 if f.endswith(".c"))
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "openapi-tables")
        cmd = (shlex.split(os.environ.get("CC", "cc")) +
               ["-std=c99", "-D_GNU_SOURCE", "-w", "-I" + pg] +
               sorted(set(include_dirs())) +
               ["-o", exe, "scripts/openapi-tables.c",
                "src/core/idem_input.c"] + ops +
               ["-no-pie", "-Wl,--unresolved-symbols=ignore-all"])
        try:
            r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit("openapi.py: cannot build scripts/openapi-tables.c "
                         "with src/operations/ (its include directories are "
                         "conf/build.conf's):\n" + r.stderr)
            r = subprocess.run([exe], capture_output=True, text=True)
        except OSError as e:
            sys.exit(f"openapi.py: cannot build or run the tables' reader: {e}")
        if r.returncode < 0:
            sys.exit(f"openapi.py: the tables' reader died of signal "
                     f"{-r.returncode}: a table points at something undefined")
        if r.returncode != 0:
            sys.exit("openapi.py: " + r.stderr.strip())
        return json.loads(r.stdout)


ROUTES = c_tables()


def route_labels():
    """The labels of routes.c ("POST /v1/orders"), demo routes aside."""
    return [route["label"] for route in ROUTES]


def problem_enums():
    """A problem's number (problem.h) -> its type (problem.c)."""
    names = dict(re.findall(r'\[(PROBLEM_\w+)\]\s*=\s*\{\s*\d+,\s*"([a-z-]+)"',
                            read("src/core/problem.c")))
    numbers = re.findall(r"^#define\s+(PROBLEM_\w+)\s+(\d+)\s*$",
                         read("src/core/problem.h"), re.M)
    return {int(n): names[name] for name, n in numbers if name in names}


def sql_signature(params):
    """A parameter list's types, as PostgreSQL tells overloads apart: modes,
    names and defaults dropped; OUT parameters are not part of it."""
    types, depth, part = [], 0, ""
    for ch in params + ",":
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            words = re.sub(r"\s+(default\b|=).*$", "", part.strip(),
                           flags=re.I | re.S).split()
            mode = words[0].lower() if words else ""
            if mode in ("in", "out", "inout", "variadic"):
                words = words[1:]
            if words and mode != "out":
                types.append(" ".join(words[1:] if len(words) > 1
                                      else words).lower())
            part = ""
        else:
            part += ch
    return tuple(types)


def sql_functions():
    """Every function the migrations leave defined: name -> the bodies of
    its overloads (a later definition of the same signature replaces the
    earlier one, a drop removes it); and the operations they register:
    name -> (strategy, [functions]). Comments are dropped first, so that a
    commented-out call counts for nothing."""
    defined, ops = {}, {}
    for f in sorted(os.listdir(os.path.join(ROOT, "sql"))):
        if not f.endswith(".sql"):
            continue
        text = read(os.path.join("sql", f))
        text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
        text = re.sub(r"--[^\n]*", "", text)
        statements = re.finditer(
            r"\bcreate\s+(?:or\s+replace\s+)?function\s+(?:public\.)?\"?(\w+)"
            r"\"?\s*\((.*?)\)\s*returns\b.*?\bas\s+(\$\w*\$)(.*?)\3"
            r"|\bdrop\s+function\s+(?:if\s+exists\s+)?(?:public\.)?\"?(\w+)"
            r"\"?\s*\(([^)]*)\)", text, re.S | re.I)
        for m in statements:
            if m.group(1):
                defined[(m.group(1), sql_signature(m.group(2)))] = m.group(4)
            else:
                defined.pop((m.group(5), sql_signature(m.group(6))), None)
        for m in re.finditer(r"idem_operation\(\s*'([^']+)',\s*'(\w+)',\s*"
                             r"'(\w+)'(?:,\s*'(\w+)')?\s*\)", text):
            ops[m.group(1)] = (m.group(2), [x for x in m.group(3, 4) if x])
    funcs = {}
    for (name, _), body in defined.items():
        funcs.setdefault(name, []).append(body)
    return funcs, ops


SQL_FUNCS, SQL_OPS = sql_functions()


def sql_problems(func, seen=None):
    """The problem types func answers, itself or through the functions it
    calls."""
    seen = set() if seen is None else seen
    if func in seen or func not in SQL_FUNCS:
        return []
    seen.add(func)
    found = []
    for body in SQL_FUNCS[func]:
        found += re.findall(r"idem_problem\(\s*'([a-z-]+)'", body)
        for called in re.findall(r"\b(\w+)\s*\(", body):
            if called != func:
                found += sql_problems(called, seen)
    return [s for i, s in enumerate(found) if s not in found[:i]]


# The schema of a body field's kind beyond its limits: what the C checks
# by code (idem_input.c, kind_valid), in the document's words.
KIND_SCHEMA = {
    "amount": {"type": "integer"},
    "points": {"type": "integer"},
    "ref": {"type": "integer"},
    "positive": {"type": "integer"},
    "currency": {"type": "string", "pattern": "^[A-Z]{3}$"},
    "id": {"type": "string", "pattern": "^[^\\u0000-\\u001f\\u007f]+$"},
    "text": {"type": "string", "pattern": "^[^\\u0000]*$"},
    "token": {"type": "string", "pattern": "^[!-~]+$"},
}


def field_schema(f, limits):
    """A body field's schema: its kind's, with the limits the tables'
    reader computed as the validator does (idem_field_limits) and the
    rule its 400 says (idem_field_rule) as its description."""
    kind, desc = f["kind"], f["doc"]
    if kind not in KIND_SCHEMA:
        sys.exit(f"openapi.py: field {f['name']}: a {kind} is not a body "
                 "field's kind")
    s = dict(KIND_SCHEMA[kind])
    if limits["integer"]:
        s["minimum"], s["maximum"] = limits["minimum"], limits["maximum"]
        if limits["nonzero"]:
            s["not"] = {"const": 0}
    else:
        if limits["minLength"]:
            s["minLength"] = limits["minLength"]
        s["maxLength"] = limits["maxLength"]
        if limits["pattern"]:
            s["allOf"] = [{"pattern": limits["pattern"]}]
        if limits["values"]:
            s["enum"] = limits["values"].split("|")
    rule = limits["rule"]
    s["description"] = f"{desc} {rule[0].upper()}{rule[1:]}."
    # JSON Schema counts a string's length in characters; the service
    # counts bytes of UTF-8: maxLength is an upper bound the service may
    # refuse below (100 "é" are 100 characters, 200 bytes).
    if "maxLength" in s:
        s["description"] += (" Its length is counted in bytes of UTF-8 (maxLength counts "
                              "characters): a character outside ASCII counts 2 to 4.")
    s["x-idem-kind"] = kind
    return s


EXAMPLE = {"amount": 10000, "points": 500, "currency": "RUB", "text": "gift",
           "ref": 17, "positive": 300, "token": "tok_visa"}


def request_schema(fields, limits):
    example, n = {}, 0
    for f, l in zip(fields, limits):
        if f["kind"] == "id":
            n += 1
            example[f["name"]] = f"c-{n}"
        elif l["values"]:
            example[f["name"]] = l["values"].split("|")[0]
        else:
            example[f["name"]] = EXAMPLE[f["kind"]]
            if l["integer"] and not (l["minimum"] <= example[f["name"]] <=
                                     l["maximum"]):
                example[f["name"]] = l["maximum"]
    return body({f["name"]: field_schema(f, l)
                 for f, l in zip(fields, limits)},
                [f["name"] for f in fields if f["required"]],
                [f["name"] for f in fields if f["fingerprint"]], example)


def answer_schema(name, members, schemas):
    """An answer's schema from its table; the rows of its lists get schemas
    of their own, named after the answer and the member."""
    props = {}
    for f in members:
        kind, desc = f["kind"], f["doc"]
        if kind == "list":
            item = name + camel(f["name"]) + "Item"
            schemas[item] = answer_schema(item, f["items"]["rows"], schemas)
            s = {"type": "array", "items": ref(item), "description": desc}
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


def camel(words):
    return "".join(w.capitalize() for w in re.split(r"[^A-Za-z0-9]+", words))


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
         (["provider-rate-limited", "outcome-pending"], (), True),
         (["provider-timeout"],)]


def retry_after(slug):
    """A 409 or a 503 tells when to come back (Retry-After)."""
    return PROBLEMS[slug][0] in (409, 503)


def operations():
    enums = problem_enums()
    out = {}
    for route in ROUTES:
        label = route["label"]
        for member in ("summary", "doc"):
            if not route[member]:
                sys.exit(f"openapi.py: {label}: its operation has no "
                         f".{member} (its document needs it)")
        for f in route.get("fields", []) + route["answer"]:
            if not f["doc"]:
                sys.exit(f"openapi.py: {label}: {f['name']} has no doc")
        if route["strategy"] == "read":
            name = camel(re.sub(r"[{}]|/v1/", " ", label))
            SCHEMAS[name] = answer_schema(name, route["answer"], SCHEMAS)
            # A pattern's argument is named by the label's {name}.
            in_path = re.search(r"\{(\w+)\}", label)
            schema = (f_positive if route["parse"] == "ref" else f_id)("")
            schema["description"] = schema["description"].strip()
            p = {"name": in_path.group(1) if in_path else route["arg"],
                 "in": "path" if in_path else "query", "required": True,
                 "schema": schema,
                 "description": route["rule"][0].upper() + route["rule"][1:] +
                 "."}
            # The problem of a read whose function answers NULL, unless
            # it never does (PROBLEM_NONE).
            extra = [(["invalid-request"],)]
            if route["not_found"] >= 0:
                extra.append(([enums[route["not_found"]]],))
            out[label] = read_op(route["summary"], route["doc"], [p],
                                 "The answer.", name, extra)
            continue
        name = camel(route["name"])
        SCHEMAS[name] = answer_schema(name, route["answer"], SCHEMAS)
        SCHEMAS[name + "Request"] = request_schema(route["fields"],
                                                   route["limits"])
        strategy, funcs = SQL_OPS.get(route["name"], (None, []))
        if strategy != route["strategy"]:
            sys.exit(f"openapi.py: {label}: no migration of sql/ registers "
                     f"{route['name']} as a {route['strategy']} operation "
                     "(idem_operation())")
        extra = []
        if strategy == "lease":
            # Saved: a decline, a refusal, and what its run function
            # answers; not saved: what its admit function refuses.
            saved = [enums[route["declined"]], enums[route["rejected"]]]
            saved += sql_problems(funcs[0])
            saved = [s for i, s in enumerate(saved) if s not in saved[:i]]
            extra += LEASE
            admit = sql_problems(funcs[1]) if len(funcs) > 1 else []
            extra += [([s], (), retry_after(s)) for s in admit
                      if s not in saved]
        else:
            saved = sql_problems(funcs[0])
        extra += [([s], [s]) for s in saved]
        out[label] = write_op(route["summary"], route["doc"], name + "Request",
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
                                  "type": "string"}}}},
                      "503": {"description": "A worker still on the "
                              "previous build, during a reload whose "
                              "build lays the counters out otherwise: "
                              "retry (a failed scrape, not a counter "
                              "reset).",
                              "headers": {"Retry-After": {
                                  "description": "Seconds to wait before "
                                  "scraping again.", "required": True,
                                  "schema": {"type": "string",
                                             "pattern": "^[0-9]+$"}}},
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
            "version": RELEASE,
            "description": "Safe retries of money-moving requests. Every "
            "POST /v1/* needs an Idempotency-Key; a retry with the same key "
            "and body gets the first outcome (Idempotent-Replayed: true), "
            "another body with it a 422. The contract in prose: "
            "docs/API.md. This document is generated by "
            "scripts/openapi.py from the route table, the operations' "
            "tables (src/operations/), the SQL they register (sql/) and "
            "the problem table; edit those, not the JSON. Every answer "
            "carries Idem-Version, the release that served it.",
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
