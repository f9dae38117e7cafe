#!/usr/bin/env python3
"""A client that retries a payment right: one fresh Idempotency-Key for the
payment (uuid4), sent again unchanged with the same body on every attempt.

Retries, with the same key, on:
  - no answer: a timeout, a refused or reset connection (the payment may
    or may not have been made; only a retry with the same key can tell);
  - 409 (a request with this key is still running), 429 (too many);
  - 500, 502, 503, 504 (no answer was saved for the key, or, after a 503
    for a commit the database's standby did not confirm, the outcome is
    unknown: either way the retry carries the payment on or replays it).
Stops on any other answer, which is final: a 2xx, or a 4xx such as 400
(a malformed request), 401 (the token), 402 (declined), 422 (the key was
used for another body, or the provider refused the payment for good); and
on any replayed answer (Idempotent-Replayed: true), a 5xx included: it is
the key's saved answer, which every retry would get again.

Waits between attempts: the server's Retry-After (seconds, or an HTTP
date) when it sends one, never less; otherwise a capped exponential
backoff with jitter (a random wait between half and all of
min(--max-delay, --base-delay * 2^(attempt-1))). Gives up after
--max-attempts attempts or --deadline seconds in all, whichever is first;
the defaults (20 attempts, 120 s) outlast an attempt cut by the client's
own timeout: the key stays taken until its lease ends (30 s), and the
attempt that then takes it over waits for the provider (up to 10 s).

Each attempt is printed on stderr; the final body on stdout. Exit status:
0 a 2xx; 1 another final answer (a 4xx, or a replayed 5xx); 3 gave up
without a final answer (the outcome is unknown: run again with --key and
the same body to learn it). The API is --url, else $IDEM_URL, else
http://127.0.0.1:$IDEM_PORT (8888 when unset). Python 3 standard library
only.

  python3 examples/pay.py --amount 10000 --recipient acc-1 --purpose "order 17"
"""

import argparse
import datetime
import email.utils
import http
import http.client
import json
import os
import random
import re
import sys
import time
import urllib.parse
import uuid

RETRY_STATUSES = {409, 429, 500, 502, 503, 504}


def default_url():
    """$IDEM_URL, else the API of make run on $IDEM_PORT (8888)."""
    return os.environ.get("IDEM_URL") or \
        f"http://127.0.0.1:{os.environ.get('IDEM_PORT') or 8888}"


def parse_args(argv):
    p = argparse.ArgumentParser(description="Make a payment through the idem API, "
                                "retrying with one Idempotency-Key.")
    p.add_argument("--url", default=default_url(),
                   help="the API (default: $IDEM_URL, else make run's on "
                   "$IDEM_PORT: %(default)s)")
    p.add_argument("--token", default="dev-shop-1",
                   help="the bearer token (default: the dev client shop-1's)")
    p.add_argument("--amount", type=int, default=10000,
                   help="minor units, e.g. kopecks (default: %(default)s)")
    p.add_argument("--currency", default="RUB")
    p.add_argument("--recipient", default="acc-1")
    p.add_argument("--purpose", default=None)
    p.add_argument("--key", default=None,
                   help="the Idempotency-Key (default: a fresh uuid4); give the "
                   "key of an earlier run, with its body, to finish that payment")
    p.add_argument("--timeout", type=float, default=15.0,
                   help="seconds one attempt may take (default: %(default)s)")
    p.add_argument("--max-attempts", type=int, default=20,
                   help="attempts in all (default: %(default)s)")
    p.add_argument("--deadline", type=float, default=120.0,
                   help="seconds for all attempts and waits (default: %(default)s)")
    p.add_argument("--base-delay", type=float, default=0.5,
                   help="the first backoff, in seconds (default: %(default)s)")
    p.add_argument("--max-delay", type=float, default=10.0,
                   help="the longest backoff, in seconds (default: %(default)s)")
    return p.parse_args(argv)


def attempt(url, body, headers, timeout):
    """One POST: (status, reason, headers, body), or raises OSError or
    http.client.HTTPException when there is no answer."""
    u = urllib.parse.urlsplit(url)
    if u.scheme == "https":
        conn = http.client.HTTPSConnection(u.hostname, u.port or 443, timeout=timeout)
    else:
        conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)
    try:
        conn.request("POST", (u.path.rstrip("/") or "") + "/v1/payments", body, headers)
        resp = conn.getresponse()
        data = resp.read()
        # Some servers (Kore among them) send no reason phrase for some codes.
        try:
            reason = resp.reason or http.HTTPStatus(resp.status).phrase
        except ValueError:
            reason = ""
        return (resp.status, reason, {k.lower(): v for k, v in resp.getheaders()},
                data)
    finally:
        conn.close()


def retry_after(value):
    """Seconds from a Retry-After header (delta-seconds or an HTTP date),
    or None."""
    if value is None:
        return None
    value = value.strip()
    # ASCII digits only: str.isdigit() takes any script's digits too.
    if re.fullmatch(r"[0-9]+", value):
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    # An HTTP date is in GMT; its asctime form names no zone, and Python
    # reads a datetime without one as local time.
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return max(0.0, when.timestamp() - time.time())


def backoff(n, base, cap):
    """Capped exponential backoff with jitter, for attempt n (1, 2, ...)."""
    ceiling = min(cap, base * 2 ** (n - 1))
    return random.uniform(ceiling / 2, ceiling)


def problem_type(headers, data):
    if not headers.get("content-type", "").startswith("application/problem+json"):
        return ""
    try:
        return " " + json.loads(data)["type"].rsplit("/", 1)[-1]
    except (ValueError, KeyError, AttributeError, TypeError):
        return ""


def main(argv):
    args = parse_args(argv)
    key = args.key or str(uuid.uuid4())
    payment = {"amount": args.amount, "currency": args.currency,
               "recipient": args.recipient}
    if args.purpose is not None:
        payment["purpose"] = args.purpose
    body = json.dumps(payment).encode()
    headers = {"Authorization": f"Bearer {args.token}", "Idempotency-Key": key,
               "Content-Type": "application/json"}

    def say(text):
        print(f"[+{time.monotonic() - start:5.1f}s] {text}", file=sys.stderr, flush=True)

    start = time.monotonic()
    deadline = start + args.deadline
    say(f"payment of {args.amount} {args.currency} to {args.recipient}, "
        f"Idempotency-Key {key}")
    for n in range(1, args.max_attempts + 1):
        timeout = min(args.timeout, deadline - time.monotonic())
        wait_at_least = None
        try:
            status, reason, hdrs, data = attempt(args.url, body, headers, timeout)
        except (OSError, http.client.HTTPException) as e:
            what = "timed out" if isinstance(e, TimeoutError) else \
                f"no answer ({e.__class__.__name__}: {e})"
            say(f"attempt {n}: {what}")
        else:
            replayed = " (Idempotent-Replayed: true)" \
                if hdrs.get("idempotent-replayed") == "true" else ""
            ra = hdrs.get("retry-after")
            say(f"attempt {n}: {status} {reason}{problem_type(hdrs, data)}{replayed}"
                + (f", Retry-After: {ra}" if ra is not None else ""))
            if status not in RETRY_STATUSES or replayed:
                sys.stdout.write(data.decode("utf-8", "replace") + "\n")
                if 200 <= status < 300:
                    return 0
                say("the key's saved answer: not retried" if replayed
                    else "a final refusal: not retried")
                return 1
            wait_at_least = retry_after(ra)

        if n == args.max_attempts:
            say(f"gave up after {n} attempts")
            break
        delay = backoff(n, args.base_delay, args.max_delay)
        if wait_at_least is not None:
            delay = max(delay, wait_at_least)
        if time.monotonic() + delay >= deadline:
            say(f"gave up: the next attempt ({delay:.1f} s from now) would pass "
                f"the {args.deadline:g} s deadline")
            break
        say(f"retrying in {delay:.1f} s with the same key")
        time.sleep(delay)

    say(f"the outcome is unknown; to learn it, run again with --key {key} "
        "and the same payment")
    return 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
