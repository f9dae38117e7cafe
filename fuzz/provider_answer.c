/*
 * Fuzz target: the provider's answer (provider_answer_classify() in
 * src/lease/provider_answer.c, by the answer tables of
 * src/lease/provider.c), everything of it the provider chooses: the
 * status, the Retry-After, the body, and what libcurl made of the call
 * (its result, its error message), for each provider this build has.
 *
 * The input is a header of FIXED_LEN bytes, then the error message (its
 * length in the header's last byte), then the body:
 *
 *	0	libcurl's result: below 128 CURLE_OK, else
 *		(byte - 128) % CURL_LAST (156 is CURLE_OPERATION_TIMEDOUT)
 *	1-4	the HTTP status, a signed 32-bit little-endian number
 *	5-12	the Retry-After libcurl read, signed 64-bit little-endian
 *	13	bit 0: a refund rather than a payment (the fake provider's
 *		refund_id rather than charge_id; Stripe's id either way);
 *		bits 1-7, v: v modulo 3 the provider, 0 the fake one, 1 the
 *		fake one keeping its 5xx (IDEM_FAKE_PROVIDER_KEEPS_5XX=1), 2
 *		Stripe; v / 3 odd: the answer carried a request id header
 *		(what proves a kept 5xx the provider's own)
 *	14	the length of the error message (libcurl's errbuf), cut to
 *		what is left of the input and to CURL_ERROR_SIZE - 1
 *
 * What is checked, against expected_class(), written from the rules the
 * providers document rather than read from their tables:
 *
 *   - the class is the expected one (success, refused, busy, transient,
 *     indeterminate, configuration, key conflict), and so is the problem
 *     where a rule names one (429: rate limited; a card_error: declined);
 *     saved iff a success or a refusal, logged at error iff a fault of
 *     configuration or a key conflict; a problem iff not a success;
 *   - a success carries the body's id (the operation's member), whole;
 *     nothing else carries one;
 *   - the detail is terminated, UTF-8, empty iff a success; a refusal's
 *     starts with the body's reason when it gives one (with Stripe's
 *     decline code after it when there is room);
 *   - libcurl's error message never reaches the detail: the detail is the
 *     same when the call is classified again without it, and a message
 *     of 8 bytes or more is never in it unless the detail holds the same
 *     words without it; it goes to the log, whole;
 *   - the Retry-After given to the client is 1 to 3600, the provider's
 *     capped at 3600 whenever it sent one above 0, whatever the class.
 */

#include <sys/types.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "idem.h"
#include "problem.h"
#include "provider.h"
#include "provider_answer.h"
#include "settings.h"

#define FIXED_LEN	15

#define KIND_FAKE		0
#define KIND_FAKE_KEEPING	1
#define KIND_STRIPE		2
#define KIND_COUNT		3

/* A problem the rules leave to the table: any, but not none. */
#define ANY_PROBLEM		-2

/* The longest detail a refusal's reason keeps whole (see below). */
#define REASON_KEPT		252

struct settings		settings = {
	.provider_timeout_ms = 10000,
};

/*
 * provider_select() checks every route's operation against the provider:
 * none here, so that provider.c links without the operations.
 */
const struct idem_route	idem_routes[] = {
	{ 0, NULL, NULL, NULL },
};
const size_t		idem_nroutes = 0;

struct expected {
	int		class;
	int		problem;
};

static const struct provider	*kinds[KIND_COUNT];

static void	kinds_select(void);
static void	kind_select(int, const char *, u_int32_t);
static struct expected	expected_class(int, struct provider_call *,
			    const char *);
static struct json_value	*member_string(struct json_value *,
				    const char *, const char *);
static int	id_ok(struct json_value *);
static int	utf8_valid(const char *, size_t);
static void	check_refusal(int, struct provider_call *);
static u_int64_t	little_endian(const u_int8_t *, size_t);

int	LLVMFuzzerTestOneInput(const u_int8_t *, size_t);

int
LLVMFuzzerTestOneInput(const u_int8_t *data, size_t len)
{
	const struct provider_answer	*a;
	const struct provider		*p;
	struct provider_call		call, bare;
	struct json_value		*body, *v;
	struct expected			want;
	const char			*id, *noun;
	char				err[JSON_ERROR_LEN];
	size_t				elen, n;
	curl_off_t			sent;
	u_int32_t			after;
	int				kind, class, problem;

	if (len < FIXED_LEN)
		return (0);

	kinds_select();

	memset(&call, 0, sizeof(call));
	call.result = data[0] < 128 ? CURLE_OK :
	    (CURLcode)((data[0] - 128) % CURL_LAST);
	call.status = (int32_t)little_endian(data + 1, 4);
	call.retry_after_sent = (curl_off_t)little_endian(data + 5, 8);
	kind = (data[13] >> 1) % KIND_COUNT;
	if (((data[13] >> 1) / KIND_COUNT) & 1)
		(void)snprintf(call.proof, sizeof(call.proof), "req_fuzz");
	p = kinds[kind];
	if (kind == KIND_STRIPE)
		id = "id";
	else
		id = data[13] & 1 ? "refund_id" : "charge_id";
	noun = data[13] & 1 ? "refund" : "payment";

	elen = data[14];
	if (elen > len - FIXED_LEN)
		elen = len - FIXED_LEN;
	if (elen > sizeof(call.errbuf) - 1)
		elen = sizeof(call.errbuf) - 1;
	memcpy(call.errbuf, data + FIXED_LEN, elen);
	call.errbuf[elen] = '\0';

	/*
	 * The body in a buffer of its own size (provider_client.c starts
	 * with 256 bytes), so that a read past it is seen.
	 */
	n = len - FIXED_LEN - elen;
	kore_buf_init(&call.response, n > 0 ? n : 1);
	kore_buf_append(&call.response, data + FIXED_LEN + elen, n);

	want = expected_class(kind, &call, id);
	sent = call.retry_after_sent;

	/* The same call without libcurl's words, classified first. */
	bare = call;
	bare.errbuf[0] = '\0';
	(void)provider_answer_classify(p, &bare, id, noun);

	a = provider_answer_classify(p, &call, id, noun);
	if (a == NULL)
		FUZZ_FAIL("%s: no answer", p->kind);
	class = a->class;
	problem = a->problem;

	if (class != want.class) {
		FUZZ_FAIL("%s: status %ld, result %d: class %d, not %d",
		    p->kind, call.status, call.result, class, want.class);
	}
	if ((problem == PROVIDER_NO_PROBLEM) != (class == PROVIDER_SUCCESS))
		FUZZ_FAIL("%s: class %d with problem %d", p->kind, class,
		    problem);
	if (want.problem != ANY_PROBLEM && problem != want.problem) {
		FUZZ_FAIL("%s: status %ld: problem %d, not %d", p->kind,
		    call.status, problem, want.problem);
	}
	if (provider_answer_saved(a) !=
	    (class == PROVIDER_SUCCESS || class == PROVIDER_REFUSED))
		FUZZ_FAIL("class %d saved or not the wrong way", class);
	if (provider_answer_logged_error(a) !=
	    (class == PROVIDER_CONFIG || class == PROVIDER_KEY_CONFLICT))
		FUZZ_FAIL("class %d logged at the wrong level", class);
	if (a->what == NULL || *a->what == '\0')
		FUZZ_FAIL("a row without its description");

	/* The id: the body's, whole, on a success only. */
	if (memchr(call.id, '\0', sizeof(call.id)) == NULL)
		FUZZ_FAIL("an id without its NUL");
	if (class == PROVIDER_SUCCESS) {
		body = json_parse(call.response.data, call.response.offset,
		    err, sizeof(err));
		v = json_member(body, id);
		if (v == NULL || v->type != JSON_STRING ||
		    strlen(call.id) != v->len || memcmp(call.id, v->str, v->len))
			FUZZ_FAIL("the id saved is not the body's %s", id);
		json_free(body);
	} else if (call.id[0] != '\0') {
		FUZZ_FAIL("an id without a success: %s", call.id);
	}

	/* The detail: terminated, UTF-8, empty on a success only. */
	if (memchr(call.detail, '\0', sizeof(call.detail)) == NULL)
		FUZZ_FAIL("a detail without its NUL");
	if ((class == PROVIDER_SUCCESS) != (call.detail[0] == '\0'))
		FUZZ_FAIL("class %d with detail [%s]", class, call.detail);
	if (!utf8_valid(call.detail, strlen(call.detail)))
		FUZZ_FAIL("a detail that is not UTF-8: [%s]", call.detail);
	if (class == PROVIDER_REFUSED)
		check_refusal(kind, &call);

	/* libcurl's words: in the log, never in the detail. */
	if (memchr(bare.detail, '\0', sizeof(bare.detail)) == NULL)
		FUZZ_FAIL("a detail without its NUL (no error message)");
	if (strlen(call.errbuf) >= 8 &&
	    strstr(call.detail, call.errbuf) != NULL &&
	    strstr(bare.detail, call.errbuf) == NULL) {
		FUZZ_FAIL("libcurl's error [%s] in the detail [%s]",
		    call.errbuf, call.detail);
	}
	if (strcmp(call.detail, bare.detail) || strcmp(call.id, bare.id) ||
	    call.retry_after != bare.retry_after) {
		FUZZ_FAIL("the answer depends on libcurl's error [%s]: "
		    "detail [%s], without it [%s]", call.errbuf, call.detail,
		    bare.detail);
	}
	if (memchr(call.log, '\0', sizeof(call.log)) == NULL)
		FUZZ_FAIL("a log line without its NUL");
	if (call.result != CURLE_OK && call.errbuf[0] != '\0' &&
	    strcmp(call.log, call.errbuf)) {
		FUZZ_FAIL("libcurl's error [%s] not in the log [%s]",
		    call.errbuf, call.log);
	}
	if (call.result != CURLE_OK && bare.log[0] == '\0')
		FUZZ_FAIL("a failed call without words for the log");

	/* Retry-After: the provider's, whatever the class, 1 to 3600. */
	after = 1;
	if (sent > 0)
		after = sent < 3600 ? (u_int32_t)sent : 3600;
	if (call.retry_after < 1 || call.retry_after > 3600 ||
	    call.retry_after != after) {
		FUZZ_FAIL("Retry-After %u for %lld sent, not %u",
		    call.retry_after, (long long)sent, after);
	}

	kore_buf_cleanup(&call.response);

	return (0);
}

/*
 * The three providers as the service chooses them (provider_select()),
 * once; each with the id members its operations read, as documented.
 */
static void
kinds_select(void)
{
	static int	done;

	if (done)
		return;
	done = 1;

	kind_select(KIND_FAKE, "fake", 0);
	kind_select(KIND_FAKE_KEEPING, "fake", 1);
	kind_select(KIND_STRIPE, "stripe", 0);
}

static void
kind_select(int kind, const char *name, u_int32_t keeps_5xx)
{
	static char		fake[] = "fake", stripe[] = "stripe";
	const struct provider_op *charge, *refund;

	settings.provider_kind = !strcmp(name, "fake") ? fake : stripe;
	settings.fake_keeps_5xx = keeps_5xx;
	provider_select();
	kinds[kind] = provider;

	if (provider == NULL || strcmp(provider->kind, name) ||
	    provider->keeps_5xx != (kind != KIND_FAKE))
		FUZZ_FAIL("provider %s (keeps 5xx %u) not selected", name,
		    keeps_5xx);

	charge = provider_op("payments.create");
	refund = provider_op("refunds.create");
	if (charge == NULL || refund == NULL ||
	    strcmp(charge->id, kind == KIND_STRIPE ? "id" : "charge_id") ||
	    strcmp(refund->id, kind == KIND_STRIPE ? "id" : "refund_id"))
		FUZZ_FAIL("provider %s: not the id members expected", name);
}

/*
 * The providers' rules (provider.c's comment, docs/operations.md's tables), in
 * their order: no answer; a 2xx with a valid id; the key conflict the
 * provider's error type names; this service's faults of configuration;
 * Stripe's card_error; then by status.
 */
static struct expected
expected_class(int kind, struct provider_call *call, const char *id)
{
	static const char	reused[] = "/problems/idempotency-key-reused";
	struct expected		e;
	struct json_value	*body, *type;
	char			err[JSON_ERROR_LEN];
	size_t			n;
	long			st;
	int			keeps, stripe;

	e.class = PROVIDER_TRANSIENT;
	e.problem = ANY_PROBLEM;

	if (call->result != CURLE_OK) {
		if (call->result == CURLE_OPERATION_TIMEDOUT)
			e.problem = PROBLEM_PROVIDER_TIMEOUT;
		return (e);
	}

	stripe = kind == KIND_STRIPE;
	keeps = kind != KIND_FAKE;
	st = call->status;
	body = json_parse(call->response.data, call->response.offset,
	    err, sizeof(err));

	if (st >= 200 && st <= 299) {
		if (id_ok(json_member(body, id))) {
			e.class = PROVIDER_SUCCESS;
			e.problem = PROVIDER_NO_PROBLEM;
		} else if (stripe) {
			/* Stripe keeps it under the key: only a list tells. */
			e.class = PROVIDER_INDETERMINATE;
		}
		json_free(body);
		return (e);
	}

	/*
	 * Kept only when the provider proves it its own: its error type
	 * (Stripe's api_error; the fake's internal-error problem) and its
	 * request id. Any other 5xx (a gateway's) is transient.
	 */
	if (st >= 500 && st <= 599) {
		type = stripe ? member_string(body, "error", "type") :
		    member_string(body, "type", NULL);
		if (keeps && call->proof[0] != '\0' && type != NULL &&
		    (stripe ? (type->len == 9 && !memcmp(type->str,
		    "api_error", 9)) : (type->len >= 24 && !memcmp(type->str +
		    type->len - 24, "/problems/internal-error", 24)))) {
			e.class = PROVIDER_INDETERMINATE;
			e.problem = PROBLEM_OUTCOME_PENDING;
		}
		json_free(body);
		return (e);
	}

	if (st < 400 || st > 499) {
		json_free(body);
		return (e);
	}

	if (stripe)
		type = member_string(body, "error", "type");
	else
		type = member_string(body, "type", NULL);

	/* Stripe answers its idempotency_error with a 400 only. */
	if (type != NULL && stripe && st == 400 && type->len == 17 &&
	    !memcmp(type->str, "idempotency_error", 17)) {
		e.class = PROVIDER_KEY_CONFLICT;
	} else if (type != NULL && !stripe &&
	    type->len >= (n = sizeof(reused) - 1) &&
	    !memcmp(type->str + type->len - n, reused, n)) {
		e.class = PROVIDER_KEY_CONFLICT;
	} else if (st == 401 || st == 403 || st == 404 || st == 405 ||
	    st == 407 || st == 413 || st == 414 || st == 415 || st == 451) {
		e.class = PROVIDER_CONFIG;
	} else if (type != NULL && stripe && type->len == 10 &&
	    !memcmp(type->str, "card_error", 10)) {
		e.class = PROVIDER_REFUSED;
		e.problem = PROBLEM_CARD_DECLINED;
	} else if (st == 409) {
		e.class = PROVIDER_BUSY;
	} else if (st == 408) {
		e.class = PROVIDER_TRANSIENT;
	} else if (st == 429) {
		e.class = PROVIDER_TRANSIENT;
		e.problem = PROBLEM_PROVIDER_RATE_LIMITED;
	} else {
		e.class = PROVIDER_REFUSED;
	}

	json_free(body);
	return (e);
}

/* The string at body.a or body.a.b, or NULL. */
static struct json_value *
member_string(struct json_value *body, const char *a, const char *b)
{
	struct json_value	*v;

	if (body == NULL || body->type != JSON_OBJECT)
		return (NULL);
	v = json_member(body, a);
	if (b != NULL) {
		if (v == NULL || v->type != JSON_OBJECT)
			return (NULL);
		v = json_member(v, b);
	}

	return (v != NULL && v->type == JSON_STRING ? v : NULL);
}

/*
 * A refusal's detail is the provider's reason (the fake one's "detail",
 * Stripe's error.message) as far as a NUL in it, cut at a character if it
 * must be (at most 3 bytes before the end of the buffer, the reason being
 * UTF-8), then Stripe's decline code when it is a valid id.
 */
static void
check_refusal(int kind, struct provider_call *call)
{
	struct json_value	*body, *reason, *code;
	char			err[JSON_ERROR_LEN], want[PROVIDER_DETAIL_MAX];
	size_t			n, m;

	body = json_parse(call->response.data, call->response.offset,
	    err, sizeof(err));
	if (kind == KIND_STRIPE) {
		reason = member_string(body, "error", "message");
		code = member_string(body, "error", "decline_code");
	} else {
		reason = member_string(body, "detail", NULL);
		code = NULL;
	}

	n = reason != NULL ? strnlen(reason->str, reason->len) : 0;
	if (n > 0) {
		m = n < REASON_KEPT ? n : REASON_KEPT;
		if (strlen(call->detail) < m ||
		    memcmp(call->detail, reason->str, m)) {
			FUZZ_FAIL("a refusal's detail [%s] is not the "
			    "provider's reason", call->detail);
		}
		/* A short reason and a short valid code: both, whole. */
		if (n < 100 && code != NULL && code->len > 0 &&
		    code->len < 64 && id_ok(code)) {
			(void)snprintf(want, sizeof(want),
			    "%.*s (decline code: %.*s)", (int)n, reason->str,
			    (int)code->len, code->str);
			if (strcmp(call->detail, want)) {
				FUZZ_FAIL("a refusal's detail [%s], not [%s]",
				    call->detail, want);
			}
		} else if (n < PROVIDER_DETAIL_MAX && code == NULL &&
		    (strlen(call->detail) != n ||
		    memcmp(call->detail, reason->str, n))) {
			FUZZ_FAIL("a refusal's detail [%s] is not the "
			    "provider's reason alone", call->detail);
		}
	}

	json_free(body);
}

/* A string of 1 to 128 bytes of UTF-8 without control characters. */
static int
id_ok(struct json_value *v)
{
	size_t		i;
	u_int8_t	ch;

	if (v == NULL || v->type != JSON_STRING || v->len < 1 || v->len > 128)
		return (0);

	for (i = 0; i < v->len; i++) {
		ch = (u_int8_t)v->str[i];
		if (ch < 0x20 || ch == 0x7f)
			return (0);
	}

	return (utf8_valid(v->str, v->len));
}

/* Well-formed UTF-8 (RFC 3629): no overlong form, surrogate, or past U+10FFFF. */
static int
utf8_valid(const char *s, size_t len)
{
	const u_int8_t	*p, *end;
	u_int32_t	cp;
	size_t		n, i;

	end = (const u_int8_t *)s + len;
	for (p = (const u_int8_t *)s; p < end; p += n) {
		if (*p < 0x80) {
			n = 1;
			continue;
		} else if ((*p & 0xe0) == 0xc0) {
			n = 2;
			cp = *p & 0x1f;
		} else if ((*p & 0xf0) == 0xe0) {
			n = 3;
			cp = *p & 0x0f;
		} else if ((*p & 0xf8) == 0xf0) {
			n = 4;
			cp = *p & 0x07;
		} else {
			return (0);
		}
		if ((size_t)(end - p) < n)
			return (0);
		for (i = 1; i < n; i++) {
			if ((p[i] & 0xc0) != 0x80)
				return (0);
			cp = (cp << 6) | (p[i] & 0x3f);
		}
		if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) ||
		    (n == 4 && cp < 0x10000) || cp > 0x10ffff ||
		    (cp >= 0xd800 && cp <= 0xdfff))
			return (0);
	}

	return (1);
}

static u_int64_t
little_endian(const u_int8_t *p, size_t n)
{
	u_int64_t	v;

	v = 0;
	while (n-- > 0)
		v = (v << 8) | p[n];

	return (v);
}
