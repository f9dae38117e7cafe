/*
 * The payment providers the lease operations can call, one table each,
 * and the one chosen by IDEM_PROVIDER_KIND. A table says everything that
 * differs between providers; the lease flow, its states and its SQL are
 * the same for all (lease.c). docs/operations.md prints the answer tables side by
 * side.
 *
 *   fake     this project's fake provider (src/dev/fake_provider.c): JSON
 *            bodies, no secret, problem+json errors; with
 *            IDEM_FAKE_PROVIDER_KEEPS_5XX=1 it keeps its 500s as Stripe
 *            does
 *   stripe   Stripe's API v1, Charges and Refunds: form-encoded bodies,
 *            a bearer secret, {"error": {"type", "code", ...}} errors;
 *            keeps its 500s under the key
 *
 * Answer tables are read top to bottom; the first row that matches a
 * finished call decides. The rows every provider shares come first: no
 * answer, a success with the id, the error types, then the statuses.
 *
 * A 2xx without a valid id is not a success (there is nothing to save)
 * and not a refusal (the provider may have made it). A 408 and a 429 are
 * not refusals either: the provider did not take the request up. 401,
 * 403, 404, 405, 407, 413, 414, 415 and 451 say that this service's
 * secret, URL or a gateway on the way is wrong: faults of configuration,
 * not the payer's answer, never saved, retried once fixed.
 */

#include <sys/types.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kore/kore.h>

#include "idem.h"
#include "problem.h"
#include "lease.h"
#include "provider.h"
#include "settings.h"

#define CONFIG_ROWS(c)							\
	{ MATCH_STATUS, 401, 401, NULL, c },				\
	{ MATCH_STATUS, 403, 405, NULL, c },				\
	{ MATCH_STATUS, 407, 407, NULL, c },				\
	{ MATCH_STATUS, 413, 415, NULL, c },				\
	{ MATCH_STATUS, 451, 451, NULL, c }

#define ANSWER_CONFIG							\
	{ PROVIDER_CONFIG, PROBLEM_PROVIDER_UNAVAILABLE, "401, 403, 404, "	\
	    "405, 407, 413, 414, 415, 451: this service's secret, URL or a "	\
	    "gateway is wrong" }

static const struct answer_rule	fake_rules[] = {
	{ MATCH_TIMED_OUT, 0, 0, NULL, { PROVIDER_TRANSIENT,
	    PROBLEM_PROVIDER_TIMEOUT, "no answer within the timeout" } },
	{ MATCH_NO_ANSWER, 0, 0, NULL, { PROVIDER_TRANSIENT,
	    PROBLEM_PROVIDER_UNAVAILABLE, "no HTTP answer (unreachable, "
	    "connection cut, body over 64 KiB)" } },
	{ MATCH_ID, 200, 299, NULL, { PROVIDER_SUCCESS,
	    PROVIDER_NO_PROBLEM, "2xx with a valid id (charge_id, "
	    "refund_id)" } },
	{ MATCH_STATUS, 200, 299, NULL, { PROVIDER_TRANSIENT,
	    PROBLEM_PROVIDER_UNAVAILABLE, "2xx without a valid id" } },
	{ MATCH_TYPE, 400, 499, "/problems/idempotency-key-reused", {
	    PROVIDER_KEY_CONFLICT, PROBLEM_PROVIDER_UNAVAILABLE,
	    "the derived key met other parameters (idempotency-key-reused)" } },
	CONFIG_ROWS(ANSWER_CONFIG),
	{ MATCH_STATUS, 402, 402, NULL, { PROVIDER_REFUSED,
	    PROBLEM_CARD_DECLINED, "402" } },
	{ MATCH_STATUS, 409, 409, NULL, { PROVIDER_BUSY,
	    PROBLEM_IN_PROGRESS, "409, still processing the same key" } },
	{ MATCH_STATUS, 408, 408, NULL, { PROVIDER_TRANSIENT,
	    PROBLEM_PROVIDER_UNAVAILABLE, "408, the request not received "
	    "in time" } },
	{ MATCH_STATUS, 429, 429, NULL, { PROVIDER_TRANSIENT,
	    PROBLEM_PROVIDER_RATE_LIMITED, "429, too many requests" } },
	{ MATCH_STATUS, 400, 499, NULL, { PROVIDER_REFUSED,
	    PROBLEM_PAYMENT_REJECTED, "any other 4xx" } },
	/* Kept under the key with IDEM_FAKE_PROVIDER_KEEPS_5XX=1 only. */
	{ MATCH_KEPT, 500, 599, NULL, { PROVIDER_INDETERMINATE,
	    PROBLEM_OUTCOME_PENDING, "5xx kept under the key "
	    "(IDEM_FAKE_PROVIDER_KEEPS_5XX=1), proven: its internal-error "
	    "problem with a Request-Id" } },
	{ MATCH_STATUS, 500, 599, NULL, { PROVIDER_TRANSIENT,
	    PROBLEM_PROVIDER_UNAVAILABLE, "any other 5xx: not kept under the "
	    "key, or not proven (a gateway's)" } },
	/* From LONG_MIN: a status below 0 must not fall through the table. */
	{ MATCH_STATUS, LONG_MIN, LONG_MAX, NULL, { PROVIDER_TRANSIENT,
	    PROBLEM_PROVIDER_UNAVAILABLE, "anything else (1xx, 3xx)" } },
};

static const struct answer_rule	stripe_rules[] = {
	{ MATCH_TIMED_OUT, 0, 0, NULL, { PROVIDER_TRANSIENT,
	    PROBLEM_PROVIDER_TIMEOUT, "no answer within the timeout" } },
	{ MATCH_NO_ANSWER, 0, 0, NULL, { PROVIDER_TRANSIENT,
	    PROBLEM_PROVIDER_UNAVAILABLE, "no HTTP answer (unreachable, "
	    "connection cut, body over 64 KiB)" } },
	{ MATCH_ID, 200, 299, NULL, { PROVIDER_SUCCESS,
	    PROVIDER_NO_PROBLEM, "2xx with a valid id (ch_..., re_...)" } },
	/* Kept under the key like any answer: only a listing can tell. */
	{ MATCH_STATUS, 200, 299, NULL, { PROVIDER_INDETERMINATE,
	    PROBLEM_OUTCOME_PENDING, "2xx without a valid id" } },
	{ MATCH_TYPE, 400, 400, "idempotency_error", { PROVIDER_KEY_CONFLICT,
	    PROBLEM_PROVIDER_UNAVAILABLE, "idempotency_error: the derived key "
	    "met other parameters" } },
	CONFIG_ROWS(ANSWER_CONFIG),
	{ MATCH_TYPE, 400, 499, "card_error", { PROVIDER_REFUSED,
	    PROBLEM_CARD_DECLINED, "card_error (402): declined, with its "
	    "decline code" } },
	{ MATCH_STATUS, 409, 409, NULL, { PROVIDER_BUSY,
	    PROBLEM_IN_PROGRESS, "409, the same key still executing" } },
	{ MATCH_STATUS, 408, 408, NULL, { PROVIDER_TRANSIENT,
	    PROBLEM_PROVIDER_UNAVAILABLE, "408, the request not received "
	    "in time" } },
	{ MATCH_STATUS, 429, 429, NULL, { PROVIDER_TRANSIENT,
	    PROBLEM_PROVIDER_RATE_LIMITED, "429 rate_limit_error (not kept "
	    "under the key)" } },
	{ MATCH_STATUS, 400, 499, NULL, { PROVIDER_REFUSED,
	    PROBLEM_PAYMENT_REJECTED, "invalid_request_error and any other "
	    "4xx (amount_too_large, ...)" } },
	{ MATCH_KEPT, 500, 599, NULL, { PROVIDER_INDETERMINATE,
	    PROBLEM_OUTCOME_PENDING, "5xx proven Stripe's own: a JSON "
	    "api_error with a Request-Id, kept under the key and replayed" } },
	{ MATCH_STATUS, 500, 599, NULL, { PROVIDER_TRANSIENT,
	    PROBLEM_PROVIDER_UNAVAILABLE, "any other 5xx (HTML or empty, no "
	    "Request-Id: a gateway's): not proven kept, the same key again" } },
	{ MATCH_STATUS, LONG_MIN, LONG_MAX, NULL, { PROVIDER_TRANSIENT,
	    PROBLEM_PROVIDER_UNAVAILABLE, "anything else (1xx, 3xx)" } },
};

static const struct provider_op	fake_ops[] = {
	{
		.operation = "payments.create",
		.path = "/v1/charges",
		.params = {
			{ "amount", FROM_MEMBER, "amount", 0 },
			{ "currency", FROM_MEMBER, "currency", 0 },
			{ "recipient", FROM_MEMBER, "recipient", 0 },
		},
		.id = "charge_id",
		.list = LIST_BY_KEY,
		.list_items = "charges",
	},
	{
		.operation = "refunds.create",
		.path = "/v1/refunds",
		.params = {
			{ "charge_id", FROM_MEMBER, "charge_id", 0 },
			{ "amount", FROM_MEMBER, "amount", 0 },
		},
		.id = "refund_id",
		.list = LIST_BY_KEY,
		.list_items = "refunds",
	},
};

static const struct provider_op	stripe_ops[] = {
	{
		.operation = "payments.create",
		.path = "/v1/charges",
		.params = {
			{ "amount", FROM_MEMBER, "amount", 0 },
			{ "currency", FROM_MEMBER, "currency", PARAM_LOWER },
			{ "source", FROM_MEMBER, "payment_method",
			    PARAM_REQUIRED },
			{ "description", FROM_MEMBER, "purpose", 0 },
			{ "metadata[idempotency_key]", FROM_KEY, NULL, 0 },
			{ "metadata[key_generation]", FROM_GENERATION, NULL,
			    0 },
			{ "metadata[client_id]", FROM_CLIENT, NULL, 0 },
			{ "metadata[recipient]", FROM_MEMBER, "recipient", 0 },
		},
		.id = "id",
		.list = LIST_SINCE,
		.list_items = "data",
	},
	{
		.operation = "refunds.create",
		.path = "/v1/refunds",
		.params = {
			{ "charge", FROM_MEMBER, "charge_id", 0 },
			{ "amount", FROM_MEMBER, "amount", 0 },
			{ "metadata[idempotency_key]", FROM_KEY, NULL, 0 },
			{ "metadata[key_generation]", FROM_GENERATION, NULL,
			    0 },
		},
		.id = "id",
		.list = LIST_BY_MEMBER,
		.list_items = "data",
		.list_arg = "charge",
		.list_member = "charge_id",
	},
};

static const struct provider	providers[] = {
	{
		.kind = "fake",
		.body = BODY_JSON,
		.bearer = 0,
		.keeps_5xx = 0,
		.kept_type = "/problems/internal-error",
		.kept_header = "Request-Id",
		/* Its kept 500 makes nothing: no late object to wait for. */
		.settle_seconds = 2,
		.key_retention_seconds = 0,
		.rules = fake_rules,
		.nrules = sizeof(fake_rules) / sizeof(fake_rules[0]),
		.reason = { "detail" },
		.error_type = { "type" },
		.decline_code = { NULL },
		.key_max = 0,
		.item_key = { "idempotency_key" },
		.item_generation = { NULL },
		.item_status = NULL,
		.has_more = NULL,
		.ops = fake_ops,
		.nops = sizeof(fake_ops) / sizeof(fake_ops[0]),
	},
	{
		.kind = "stripe",
		.body = BODY_FORM,
		.bearer = 1,
		.keeps_5xx = 1,
		.kept_type = "api_error",
		.kept_header = "Request-Id",
		/*
		 * Stripe gives no figure for when a 500's outcome has
		 * appeared (docs.stripe.com/error-low-level, "Server
		 * errors": reconcile before another attempt); five minutes
		 * is well past its own clients' 80 s request timeout.
		 * Keys: Stripe may prune a key once it is 24 hours old, and
		 * then takes it as new (docs.stripe.com/api/
		 * idempotent_requests).
		 */
		.settle_seconds = 300,
		.key_retention_seconds = 86400,
		.rules = stripe_rules,
		.nrules = sizeof(stripe_rules) / sizeof(stripe_rules[0]),
		.reason = { "error", "message" },
		.error_type = { "error", "type" },
		.decline_code = { "error", "decline_code" },
		.key_max = 255,
		.item_key = { "metadata", "idempotency_key" },
		.item_generation = { "metadata", "key_generation" },
		.item_status = "status",
		.has_more = "has_more",
		.ops = stripe_ops,
		.nops = sizeof(stripe_ops) / sizeof(stripe_ops[0]),
	},
};

const struct provider		*provider = NULL;
u_int32_t			provider_settle_seconds = 0;
u_int32_t			provider_key_retention_seconds = 0;

/* The fake provider that keeps its 5xx: a copy of its table that says so. */
static struct provider		fake_keeping;

static void	append_value(struct kore_buf *, int, const char *,
		    struct json_value *, const char *, size_t, int);

/*
 * Chooses the provider of IDEM_PROVIDER_KIND (checked by settings.c), and
 * checks that it has a call for every lease operation this build serves.
 */
void
provider_select(void)
{
	const struct lease_call	*call;
	const char		*name;
	size_t			i;

	provider = NULL;
	for (i = 0; i < sizeof(providers) / sizeof(providers[0]); i++) {
		if (!strcmp(providers[i].kind, settings.provider_kind))
			provider = &providers[i];
	}
	if (provider == NULL)
		fatal("IDEM_PROVIDER_KIND=%s: no such provider",
		    settings.provider_kind);

	if (!strcmp(provider->kind, "fake") && settings.fake_keeps_5xx) {
		fake_keeping = *provider;
		fake_keeping.keeps_5xx = 1;
		provider = &fake_keeping;
	}

	provider_settle_seconds = settings.provider_settle_seconds !=
	    SETTING_UNSET ? settings.provider_settle_seconds :
	    provider->settle_seconds;
	provider_key_retention_seconds =
	    settings.provider_key_retention_seconds != SETTING_UNSET ?
	    settings.provider_key_retention_seconds :
	    provider->key_retention_seconds;

	for (i = 0; i < idem_nroutes; i++) {
		if ((call = idem_routes[i].op->call) == NULL)
			continue;
		name = call->provider_op != NULL ? call->provider_op :
		    idem_routes[i].op->name;
		if (provider_op(name) == NULL) {
			fatal("provider %s has no call for the lease operation "
			    "%s", provider->kind, name);
		}
	}
}

/*
 * The age past which a generation's derived key is never sent again but
 * listed: the provider's key retention less a margin longer than any
 * request of it can last (a tenth of the retention, at least twice the
 * provider timeout). 0: the provider forgets no key. A retention within
 * the margin lists every attempt after a generation's first.
 */
u_int32_t
provider_key_stale_seconds(void)
{
	u_int32_t	margin;

	if (provider_key_retention_seconds == 0)
		return (0);

	margin = provider_key_retention_seconds / 10;
	if (margin < settings.provider_timeout_ms / 500)
		margin = settings.provider_timeout_ms / 500;
	if (margin >= provider_key_retention_seconds)
		return (1);

	return (provider_key_retention_seconds - margin);
}

const struct provider_op *
provider_op(const char *operation)
{
	size_t		i;

	for (i = 0; i < provider->nops; i++) {
		if (!strcmp(provider->ops[i].operation, operation))
			return (&provider->ops[i]);
	}

	return (NULL);
}

/*
 * Whether a body has what the provider needs of the operation (Stripe's
 * source): checked with the fields, before the key is taken.
 */
int
provider_check(const char *operation, struct json_value *body, char *err,
    size_t len)
{
	const struct provider_op	*op;
	const struct provider_param	*p;
	size_t				i;

	if (provider == NULL || (op = provider_op(operation)) == NULL)
		return (1);

	for (i = 0; i < PROVIDER_PARAMS_MAX && op->params[i].name; i++) {
		p = &op->params[i];
		if (!(p->flags & PARAM_REQUIRED) || p->from != FROM_MEMBER)
			continue;
		if (json_member(body, p->member) == NULL) {
			(void)snprintf(err, len, "%s is required with the %s "
			    "provider", p->member, provider->kind);
			return (0);
		}
	}

	return (1);
}

/*
 * The body of an operation's call: its parameters from the saved request
 * (absent optional members are left out), the derived key, the client.
 */
void
provider_body(struct kore_buf *buf, const struct provider_op *op,
    struct json_value *request, const char *key, const char *client,
    u_int32_t generation)
{
	const struct provider_param	*p;
	struct json_value		*v;
	const char			*s;
	char				gen[16];
	size_t				i;
	int				n;

	(void)snprintf(gen, sizeof(gen), "%u", generation);

	if (provider->body == BODY_JSON)
		kore_buf_append(buf, "{", 1);

	n = 0;
	for (i = 0; i < PROVIDER_PARAMS_MAX && op->params[i].name; i++) {
		p = &op->params[i];
		v = NULL;
		s = NULL;
		switch (p->from) {
		case FROM_MEMBER:
			if ((v = json_member(request, p->member)) == NULL)
				continue;
			break;
		case FROM_KEY:
			s = key;
			break;
		case FROM_CLIENT:
			s = client;
			break;
		case FROM_GENERATION:
			s = gen;
			break;
		default:
			fatal("%s: unknown source %d", __func__, p->from);
		}

		if (n++ > 0)
			kore_buf_append(buf, provider->body == BODY_JSON ?
			    "," : "&", 1);
		append_value(buf, provider->body, p->name, v, s,
		    s != NULL ? strlen(s) : 0, p->flags);
	}

	if (provider->body == BODY_JSON)
		kore_buf_append(buf, "}", 1);
}

/* A member down a path of names (at most PROVIDER_PATH_MAX). */
struct json_value *
provider_path(struct json_value *v, const char *const *path)
{
	size_t		i;

	for (i = 0; i < PROVIDER_PATH_MAX && path[i] != NULL; i++) {
		if (v == NULL || v->type != JSON_OBJECT)
			return (NULL);
		v = json_member(v, path[i]);
	}

	return (i == 0 ? NULL : v);
}

/* RFC 3986: every byte but the unreserved ones as %XX. */
void
provider_url_escape(struct kore_buf *buf, const char *s, size_t len)
{
	static const char	hex[] = "0123456789ABCDEF";
	u_int8_t		c;
	size_t			i;

	for (i = 0; i < len; i++) {
		c = (u_int8_t)s[i];
		if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		    (c >= '0' && c <= '9') || c == '-' || c == '.' ||
		    c == '_' || c == '~') {
			kore_buf_append(buf, &s[i], 1);
		} else {
			kore_buf_appendf(buf, "%%%c%c", hex[c >> 4],
			    hex[c & 0x0f]);
		}
	}
}

/*
 * One parameter: a member of the request (v: JSON as it is, or in a form
 * its string or number literal) or a string (s).
 */
static void
append_value(struct kore_buf *buf, int body, const char *name,
    struct json_value *v, const char *s, size_t len, int flags)
{
	struct kore_buf		tmp;
	int64_t			n;
	size_t			i;

	if (body == BODY_JSON) {
		json_append_string(buf, name, strlen(name));
		kore_buf_append(buf, ":", 1);
		if (v != NULL)
			json_canonical(buf, v);
		else
			json_append_string(buf, s, len);
		return;
	}

	kore_buf_init(&tmp, len + 32);
	if (v != NULL && v->type == JSON_STRING) {
		kore_buf_append(&tmp, v->str, v->len);
	} else if (v != NULL && json_int64(v, &n)) {
		kore_buf_appendf(&tmp, "%lld", (long long)n);
	} else if (v != NULL) {
		/* The fields are checked: only a broken table gets here. */
		fatal("%s: member %s is not a string or an integer", __func__,
		    name);
	} else {
		kore_buf_append(&tmp, s, len);
	}

	if (flags & PARAM_LOWER) {
		for (i = 0; i < tmp.offset; i++) {
			if (tmp.data[i] >= 'A' && tmp.data[i] <= 'Z')
				tmp.data[i] += 'a' - 'A';
		}
	}

	provider_url_escape(buf, name, strlen(name));
	kore_buf_append(buf, "=", 1);
	provider_url_escape(buf, (const char *)tmp.data, tmp.offset);
	kore_buf_cleanup(&tmp);
}
