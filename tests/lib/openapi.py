"""Checks a response of the API against docs/openapi.json: the operation
is found by method and path template, the status must be one it
documents, the media type one of that response's, the headers it marks
required present, and a JSON body valid against the response's schema
(Debian's python3-jsonschema, JSON Schema 2020-12).

The harness calls check() for every response of an API it started, so
that the document cannot drift from what the service answers. Paths the
document does not describe (/dev/*, /demo/*, /problems/*) and methods a
path does not have (the 405s) are not checked.
"""

import json
import os
import re

import jsonschema

DOC_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "docs", "openapi.json")

_doc = None
_routes = None
_validators = {}


def use(path):
    """Checks against another document from now on (a copy of the tree's)."""
    global DOC_PATH, _doc, _routes
    DOC_PATH, _doc, _routes = path, None, None
    _validators.clear()


def _load():
    global _doc, _routes
    if _doc is None:
        with open(DOC_PATH) as f:
            _doc = json.load(f)
        _routes = []
        for path, item in _doc["paths"].items():
            rx = "^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(path)) + "$"
            _routes.append((re.compile(rx), path, item))
    return _doc


def operation(method, path):
    """(template, operation) documented for a request, or (None, None)."""
    _load()
    path = path.split("?", 1)[0]
    # Exact paths before templates, as Kore routes them: a GET of
    # /v1/bonuses/transfers is that path's 405, not a balance.
    for exact in (True, False):
        for rx, template, item in _routes:
            if ("{" not in template) != exact or not rx.match(path):
                continue
            if method.lower() not in item:
                return None, None
            return template, item[method.lower()]
    return None, None


def _deref(o):
    while isinstance(o, dict) and "$ref" in o:
        node = _doc
        for part in o["$ref"].lstrip("#/").split("/"):
            node = node[part]
        o = node
    return o


def _validator(key, schema):
    v = _validators.get(key)
    if v is None:
        # The components ride along at the root, where the schemas'
        # "#/components/..." references point.
        root = {"$schema": "https://json-schema.org/draft/2020-12/schema",
                "components": _doc["components"], "allOf": [schema]}
        v = jsonschema.Draft202012Validator(root)
        _validators[key] = v
    return v


# Kore answers these itself, before the service sees the request, with no
# body and no content type (docs/limits.md lists when: its HTTP parser, its
# timeouts, its limits); the document describes the service's answers.
KORE_BARE = {400, 404, 405, 408, 411, 413, 414, 503, 505}


def check(method, path, status, headers, body):
    """None if the response agrees with the document, else what does not."""
    template, op = operation(method, path)
    if op is None:
        return None
    if status in KORE_BARE and not body and "content-type" not in headers:
        return None
    where = f"{method} {path} -> {status}"
    resp = op["responses"].get(str(status))
    if resp is None:
        return (f"{where}: status {status} is not documented for "
                f"{method} {template} (documented: "
                f"{', '.join(sorted(op['responses']))}); body {body[:200]!r}")
    resp = _deref(resp)

    for name, h in resp.get("headers", {}).items():
        if _deref(h).get("required") and name.lower() not in headers:
            return f"{where}: header {name} is required and missing"

    content = resp.get("content")
    if not content:
        return None
    ctype = headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype not in content:
        return (f"{where}: content-type {ctype!r} is not documented "
                f"({', '.join(content)}); body {body[:200]!r}")
    schema = content[ctype].get("schema")
    if schema is None or not ctype.endswith("json"):
        return None
    try:
        data = json.loads(body)
    except ValueError as e:
        return f"{where}: the body is not JSON ({e}): {body[:200]!r}"
    errors = sorted(_validator((template, method, status, ctype), schema)
                    .iter_errors(data), key=lambda e: list(e.path))
    if errors:
        e = errors[0]
        return (f"{where}: the body does not match the schema at "
                f"/{'/'.join(map(str, e.path))}: {e.message}; "
                f"body {body[:300]!r}")
    return None


# --- requests: what a test sends, against the document -----------------------

def _filler(prop):
    """A character a string of the field's kind may repeat."""
    return {"currency": "A", "id": "c", "text": "t", "token": "t"}.get(
        prop.get("x-idem-kind"), "x")


def boundaries(prop):
    """Each limit of a body field's schema (a property of a request body
    in the document) and one past it, as (what, JSON text, valid): the
    bad-input catalogue's rows for the field. Integers: the minimum and
    the maximum, one below and one above, and 0 where the schema says
    not 0; strings: the shortest and the longest, one shorter and one
    longer (ASCII, so that bytes are characters), each value of an enum
    and one that is not."""
    out = []
    if prop.get("type") == "integer":
        lo, hi = prop["minimum"], prop["maximum"]
        out += [(f"{lo} (the minimum)", str(lo), True),
                (f"{lo - 1} (one below the minimum)", str(lo - 1), False),
                (f"{hi} (the maximum)", str(hi), True),
                (f"{hi + 1} (one above the maximum)", str(hi + 1), False)]
        if prop.get("not") == {"const": 0} and lo <= 0 <= hi:
            out.append(("0 (not allowed)", "0", False))
        return out
    if "enum" in prop:
        out += [(f"{v!r} (one of the values)", json.dumps(v), True)
                for v in prop["enum"]]
        other = prop["enum"][0][:-1] + ("B" if prop["enum"][0][-1:] != "B"
                                        else "C")
        while other in prop["enum"]:
            other += "B"
        out.append((f"{other!r} (not one of the values)", json.dumps(other),
                    False))
        return out
    if prop.get("allOf"):
        # A pattern of the field's own: no string made here would match it.
        return out
    c = _filler(prop)
    lo, hi = prop.get("minLength", 0), prop["maxLength"]
    out.append((f"{lo} characters (the shortest)", json.dumps(c * lo), True))
    if lo > 0:
        out.append((f"{lo - 1} characters (one shorter)",
                    json.dumps(c * (lo - 1)), False))
    out += [(f"{hi} characters (the longest)", json.dumps(c * hi), True),
            (f"{hi + 1} characters (one longer)", json.dumps(c * (hi + 1)),
             False)]
    return out


def _header(headers, name):
    for k, v in (headers or {}).items():
        if k.lower() == name.lower():
            return v
    return None


def _valid(key, schema, value):
    """The first error of value against schema, or None."""
    _load()
    errors = list(_validator(key, schema).iter_errors(value))
    return errors[0].message if errors else None


def check_request(method, path, headers, body):
    """None if a request a test sends agrees with the document (its token,
    its parameters, its media type and its body), else what does not. The
    harness checks every request to an API it started, but those a test
    marks as bad input on purpose (bad=True)."""
    from urllib.parse import parse_qs, unquote

    template, op = operation(method, path)
    if op is None:
        return None
    where = f"request {method} {path}"
    if op.get("security", _doc.get("security")) != [{}]:
        auth = _header(headers, "Authorization")
        if auth is None or not auth.startswith("Bearer ") or not auth[7:]:
            return f"{where}: no bearer token (Authorization: Bearer <token>)"
    query = parse_qs(path.split("?", 1)[1], keep_blank_values=True) \
        if "?" in path else {}
    segments = path.split("?", 1)[0].split("/")
    names = template.split("/")
    for p in op.get("parameters", []):
        p = _deref(p)
        if p["in"] == "header":
            value = _header(headers, p["name"])
        elif p["in"] == "query":
            value = query.get(p["name"], [None])[0]
        else:
            value = unquote(segments[names.index("{" + p["name"] + "}")])
            if p["schema"].get("type") == "integer":
                value = int(value) if value.isdigit() else value
        if value is None:
            if p.get("required"):
                return f"{where}: {p['in']} parameter {p['name']} is missing"
            continue
        why = _valid(("param", template, method, p["name"]), p["schema"],
                     value)
        if why is not None:
            return f"{where}: {p['in']} parameter {p['name']}: {why}"
    rb = op.get("requestBody")
    if rb is None:
        return None
    ctype = (_header(headers, "Content-Type") or "").split(";")[0].strip()
    if ctype.lower() not in rb["content"]:
        return (f"{where}: content-type {ctype!r} is not the document's "
                f"({', '.join(rb['content'])})")
    if not body:
        return f"{where}: no body" if rb.get("required") else None
    try:
        data = json.loads(body)
    except ValueError as e:
        return f"{where}: the body is not JSON ({e})"
    why = _valid(("body", template, method), rb["content"][ctype.lower()][
        "schema"], data)
    if why is not None:
        return f"{where}: the body does not match the document: {why}"
    return None
