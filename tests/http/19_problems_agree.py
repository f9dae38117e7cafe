"""Problem documents are built in two places: by the C (src/core/problem.c)
for what the service answers itself, and by the SQL (idem_problem() over
the table idem_problem_types) for the outcomes a SQL function saves, such
as an insufficient balance. They provably agree: every problem type the
SQL knows has the status and title of the C row with the same slug, which
GET /dev/problems (dev build) lists, and a saved problem's type URL has
the service's IDEM_PUBLIC_URL as its base, like the C's."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
from harness import Api, Tap, new_key, request, sql  # noqa: E402

t = Tap()
public_url = "http://idem.test:8888"
api = Api(IDEM_PUBLIC_URL=public_url).start()

r = request(api.port, "GET", "/dev/problems")
t.eq(r.status, 200, "GET /dev/problems answers the C table")
t.eq(r.headers.get("content-type"), "application/json", "as JSON")
table = r.json()
c_rows = {row["slug"]: row for row in table}
t.eq(len(c_rows), len(table), "one row per slug")
t.ok(all(set(row) == {"slug", "status", "title"} for row in table),
     "each row is {slug, status, title}", table)
t.ok(all(row["slug"] and row["title"] and 400 <= row["status"] <= 599 for row in table),
     "with a slug, a title and a 4xx or 5xx status", table)

sql_rows = sql("select slug, status, title from idem_problem_types order by slug")
t.ok(len(sql_rows) >= 2, "the SQL has problem types of its own", sql_rows)
for slug, status, title in sql_rows:
    t.eq(c_rows.get(slug), {"slug": slug, "status": int(status), "title": title},
         f"SQL problem type {slug} equals the C row with that slug")

# A saved problem (SQL) next to the C's row: the same type and title.
customer = new_key("c-problems")
r = api.post("/v1/bonuses", {"customer_id": customer, "points": -5, "reason": "redeem"},
             key=new_key())
t.eq(r.status, 422, "redeeming more than the balance: 422")
t.eq(r.headers.get("content-type"), "application/problem+json", "a problem document")
body = r.json()
c_row = c_rows.get("insufficient-balance", {})
t.eq(body.get("type"), f"{public_url}/problems/insufficient-balance",
     "its type is the C's URL: IDEM_PUBLIC_URL/problems/<slug>")
t.eq(body.get("title"), c_row.get("title"), "its title is the C table's")
t.eq(body.get("status"), c_row.get("status"), "and so is its status")

# And one the C writes, for the same base URL.
r = api.post("/v1/bonuses", {"customer_id": customer}, key=new_key(), bad=True)
t.eq(r.json().get("type"), f"{public_url}/problems/invalid-request",
     "a problem the C writes has the same base URL")

api.stop()
t.done()
