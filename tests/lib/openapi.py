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
