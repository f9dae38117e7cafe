/*
 * The fake payment provider: POST /v1/charges makes at most one charge per
 * Idempotency-Key, like a real provider, and POST /v1/refunds at most one
 * refund per key, never past what is left of the charge. Both think
 * IDEM_PROVIDER_LATENCY_MS before they answer. They record first, then
 * think, so that a client that gave up waiting may well have been charged
 * (or refunded). Another request with the same key gets 409 at once while
 * the first still thinks (a real provider is still processing it), 422 for
 * other parameters, and the charge or refund once the first has finished.
 * Charges and refunds are two tables (struct kind) over one flow.
 *
 * Magic recipients, as in a card network's test mode. Charges: "decline"
 * is refused (402), "reject" is refused for good (400, an invalid
 * recipient), "fail" breaks (500), "slow" thinks longer than the API's
 * provider timeout. Refunds go by the recipient of the charge they refund,
 * whose charges succeed: "refund-reject" is refused for good (400),
 * "refund-fail" breaks (500), "refund-slow" thinks as long as "slow".
 * Refusals and failures keep no charge or refund. Every request is logged
 * with its kind and the status it got (provider.requests), so that tests
 * can count calls.
 */

#include <sys/types.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <kore/kore.h>
#include <kore/http.h>
#include <kore/pgsql.h>

#include "db.h"
#include "idem.h"
#include "json.h"
#include "metrics.h"
#include "problem.h"
#include "reload.h"
#include "settings.h"
#include "wakeup.h"

#define CHARGE_SQL							\
	"SELECT * FROM "						\
	"provider.charge($1, $2::bigint, $3, $4, $5::int, $6::int, $7::boolean)"
#define CHARGES_OF_SQL		"SELECT provider.charges_of($1, $2::boolean)"

#define REFUND_SQL							\
	"SELECT * FROM provider.refund($1, $2, $3::bigint, $4::int, $5::int, "	\
	"$6::boolean)"
#define REFUNDS_OF_SQL		"SELECT provider.refunds_of($1, $2::boolean)"
#define REFUND_RECIPIENT_SQL						\
	"SELECT recipient FROM provider.charges WHERE charge_id = $1"

#define PROVIDER_KEY_MAX	512
#define SLOW_EXTRA_MS		1000

/* The steps of a POST, in post_states. */
#define POST_ADMIT		0
#define POST_LOOKUP		1
#define POST_RECORD		2
#define POST_THINK		3
#define POST_RESPOND		4

/* The fields of charges and refunds, in the order their SQL takes them. */
#define FIELDS_MAX		3
#define CHARGE_AMOUNT		0
#define CHARGE_CURRENCY		1
#define CHARGE_RECIPIENT	2
#define REFUND_CHARGE		0
#define REFUND_AMOUNT		1

/* The magic recipients that are refused: the status and the problem. */
struct refusal {
	const char	*recipient;
	int		status;
	int		problem;
	const char	*detail;
};

struct provider_request;

/*
 * What a charge or a refund is to the shared flow. Its SQL function takes
 * the key, the fields, the refusal and the think time, and answers
 * status, created, retry_after and detail (a 400 of its own) by name.
 * The recipient, whose magic decides the answer, is recipient_field or,
 * with lookup_sql, the recipient of the row that field names.
 */
struct kind {
	const char		*name;		/* in a 422's detail */
	const char		*path;		/* in a 405's detail */
	const char		*shape;		/* the body, in a 400's detail */
	const struct idem_field	*fields;	/* at most FIELDS_MAX */
	int			nfields;
	int			recipient_field;
	const char		*lookup_sql;
	const char		*record_sql;
	const char		*list_sql;
	const struct refusal	*refusals;
	size_t			nrefusals;
	const char		*slow;		/* thinks past the API's timeout */
	void			(*created)(struct kore_buf *,
				    struct provider_request *);
};

struct provider_request {
	const struct kind	*kind;
	struct db_call		db;
	int			db_active;
	struct kore_timer	*think;
	int			thought;
	char			key[PROVIDER_KEY_MAX + 1];
	struct json_value	*body;
	const char		*args[FIELDS_MAX];
	char			recipient[IDEM_ID_MAX + 1];
	const struct refusal	*refusal;
	int			status;
	int			created;
};

int	provider_init(int);
int	fake_provider_charges(struct http_request *);
int	fake_provider_refunds(struct http_request *);
int	v_provider_key(struct http_request *, const void *);

static int	provider_run(struct http_request *, const struct kind *);
static int	post_admit(struct http_request *);
static int	post_lookup(struct http_request *);
static int	post_record(struct http_request *);
static int	post_think(struct http_request *);
static int	post_respond(struct http_request *);

/* This worker's answers so far: their request ids. */
static u_int64_t	request_ids;
static void	post_respond_created(struct http_request *,
		    struct provider_request *);
static int	list(struct http_request *);
static int	db_failed(struct http_request *);
static void	provider_request_free(struct http_request *);
static void	think_done(void *, u_int64_t);
static int	key_valid(const char *);
static const char	*field_value(struct json_value *,
			    const struct idem_field *);
static void	recipient_set(struct provider_request *, const char *);
static u_int64_t	think_ms(struct provider_request *);
static void	append_field(struct kore_buf *, struct provider_request *,
		    const char *);
static void	charge_created(struct kore_buf *, struct provider_request *);
static void	refund_created(struct kore_buf *, struct provider_request *);

static struct http_state	post_states[] = {
	KORE_HTTP_STATE(post_admit),
	KORE_HTTP_STATE(post_lookup),
	KORE_HTTP_STATE(post_record),
	KORE_HTTP_STATE(post_think),
	KORE_HTTP_STATE(post_respond),
};

static const struct idem_field	charge_fields[] = {
	[CHARGE_AMOUNT] = { "amount", FIELD_AMOUNT, 1, 0 },
	[CHARGE_CURRENCY] = { "currency", FIELD_CURRENCY, 1, 0 },
	[CHARGE_RECIPIENT] = { "recipient", FIELD_ID, 1, 0 },
};

static const struct refusal	charge_refusals[] = {
	{ "decline", HTTP_STATUS_PAYMENT_REQUIRED, PROBLEM_CARD_DECLINED,
	    "the issuer declined the card (test recipient \"decline\")" },
	{ "reject", HTTP_STATUS_BAD_REQUEST, PROBLEM_INVALID_REQUEST,
	    "invalid recipient (test recipient \"reject\")" },
	{ "fail", HTTP_STATUS_INTERNAL_ERROR, PROBLEM_INTERNAL,
	    "the provider failed (test recipient \"fail\")" },
};

static const struct kind	charges = {
	.name = "charge",
	.path = "/v1/charges",
	.shape = "{\"amount\": minor units, \"currency\": \"XXX\", "
	    "\"recipient\": \"...\"}",
	.fields = charge_fields,
	.nfields = sizeof(charge_fields) / sizeof(charge_fields[0]),
	.recipient_field = CHARGE_RECIPIENT,
	.lookup_sql = NULL,
	.record_sql = CHARGE_SQL,
	.list_sql = CHARGES_OF_SQL,
	.refusals = charge_refusals,
	.nrefusals = sizeof(charge_refusals) / sizeof(charge_refusals[0]),
	.slow = "slow",
	.created = charge_created,
};

static const struct idem_field	refund_fields[] = {
	[REFUND_CHARGE] = { "charge_id", FIELD_ID, 1, 0 },
	[REFUND_AMOUNT] = { "amount", FIELD_AMOUNT, 1, 0 },
};

static const struct refusal	refund_refusals[] = {
	{ "refund-reject", HTTP_STATUS_BAD_REQUEST, PROBLEM_INVALID_REQUEST,
	    "the refund is refused (test recipient \"refund-reject\")" },
	{ "refund-fail", HTTP_STATUS_INTERNAL_ERROR, PROBLEM_INTERNAL,
	    "the provider failed (test recipient \"refund-fail\")" },
};

static const struct kind	refunds = {
	.name = "refund",
	.path = "/v1/refunds",
	.shape = "{\"charge_id\": \"ch_...\", \"amount\": minor units}",
	.fields = refund_fields,
	.nfields = sizeof(refund_fields) / sizeof(refund_fields[0]),
	.recipient_field = REFUND_CHARGE,
	.lookup_sql = REFUND_RECIPIENT_SQL,
	.record_sql = REFUND_SQL,
	.list_sql = REFUNDS_OF_SQL,
	.refusals = refund_refusals,
	.nrefusals = sizeof(refund_refusals) / sizeof(refund_refusals[0]),
	.slow = "refund-slow",
	.created = refund_created,
};

int
provider_init(int state)
{
	if (state == KORE_MODULE_UNLOAD) {
		if (reload_unload() != KORE_RESULT_OK)
			return (KORE_RESULT_ERROR);
		wakeup_stop();
		db_unload();
		settings_unload();
		return (KORE_RESULT_OK);
	}

	settings_load();
	metrics_attach();
	db_register();
	if (worker != NULL) {
		db_pool_open(DB_POOL_REQUESTS, pgsql_conn_max != 0 ?
		    pgsql_conn_max : DB_REQUESTS_UNLIMITED);
	}
	wakeup_start();

	return (KORE_RESULT_OK);
}

int
fake_provider_charges(struct http_request *req)
{
	return (provider_run(req, &charges));
}

int
fake_provider_refunds(struct http_request *req)
{
	return (provider_run(req, &refunds));
}

int
v_provider_key(struct http_request *req, const void *data)
{
	return (key_valid(data));
}

static int
provider_run(struct http_request *req, const struct kind *kind)
{
	struct provider_request	*p;

	if (reload_defer(req))
		return (KORE_RESULT_RETRY);

	if (!http_state_exists(req)) {
		p = http_state_create(req, sizeof(*p), provider_request_free);
		reload_hold();
		p->kind = kind;
		db_call_init(&p->db, req);
		p->db_active = 1;
	}

	switch (req->method) {
	case HTTP_METHOD_POST:
		return (http_state_run(post_states,
		    sizeof(post_states) / sizeof(post_states[0]), req));
	case HTTP_METHOD_GET:
		return (list(req));
	default:
		http_response_header(req, "allow", "GET, POST");
		problem_respond(req, PROBLEM_METHOD_NOT_ALLOWED,
		    "%s accepts GET and POST", kind->path);
		return (KORE_RESULT_OK);
	}
}

static int
post_admit(struct http_request *req)
{
	struct provider_request	*p = http_state_get(req);
	const struct kind	*k = p->kind;
	const char		*key;
	int			i;
	char			err[JSON_ERROR_LEN];

	if (!http_request_header(req, "idempotency-key", &key) ||
	    !key_valid(key)) {
		problem_respond(req, PROBLEM_KEY_MISSING, "send an "
		    "Idempotency-Key of 1 to %d visible ASCII characters",
		    PROVIDER_KEY_MAX);
		return (HTTP_STATE_COMPLETE);
	}
	(void)kore_strlcpy(p->key, key, sizeof(p->key));

	p->body = idem_parse_body(req, err, sizeof(err));

	for (i = 0; i < k->nfields; i++) {
		p->args[i] = field_value(p->body, &k->fields[i]);
		if (p->args[i] == NULL) {
			problem_respond(req, PROBLEM_INVALID_REQUEST,
			    "send %s", k->shape);
			return (HTTP_STATE_COMPLETE);
		}
	}

	if (k->lookup_sql != NULL) {
		req->fsm_state = POST_LOOKUP;
	} else {
		recipient_set(p, p->args[k->recipient_field]);
		req->fsm_state = POST_RECORD;
	}

	return (HTTP_STATE_CONTINUE);
}

/*
 * A refund's magic is its charge's recipient. A charge is never changed,
 * so it is still the charge's when the refund is recorded.
 */
static int
post_lookup(struct http_request *req)
{
	struct provider_request	*p = http_state_get(req);
	const char		*params[1];

	params[0] = p->args[p->kind->recipient_field];

	switch (db_call_step(&p->db, p->kind->lookup_sql, 1, params)) {
	case DB_CALL_PENDING:
		return (HTTP_STATE_RETRY);
	case DB_CALL_FAILED:
		return (db_failed(req));
	default:
		break;
	}

	/* An unknown charge has none: recording it answers 400. */
	recipient_set(p, db_call_rows(&p->db) == 1 ?
	    db_call_field(&p->db, "recipient") : "");

	db_call_cleanup(&p->db);
	db_call_init(&p->db, req);

	req->fsm_state = POST_RECORD;
	return (HTTP_STATE_CONTINUE);
}

/*
 * One call decides and logs the answer: a refusal, a new charge or
 * refund, or what the key's one answers now (409 while its first request
 * thinks).
 */
static int
post_record(struct http_request *req)
{
	struct provider_request	*p = http_state_get(req);
	const char		*params[FIELDS_MAX + 4];
	char			refusal[8], think[24];
	int			i, n;

	(void)snprintf(think, sizeof(think), "%llu",
	    (unsigned long long)think_ms(p));
	if (p->refusal != NULL)
		(void)snprintf(refusal, sizeof(refusal), "%d",
		    p->refusal->status);

	n = 0;
	params[n++] = p->key;
	for (i = 0; i < p->kind->nfields; i++)
		params[n++] = p->args[i];
	params[n++] = p->refusal != NULL ? refusal : NULL;
	params[n++] = think;
	params[n++] = settings.fake_keeps_5xx ? "t" : "f";

	switch (db_call_step(&p->db, p->kind->record_sql, n, params)) {
	case DB_CALL_PENDING:
		return (HTTP_STATE_RETRY);
	case DB_CALL_FAILED:
		return (db_failed(req));
	default:
		break;
	}

	if (db_call_rows(&p->db) != 1) {
		problem_respond(req, PROBLEM_DATABASE_UNAVAILABLE,
		    "the provider's database answered no row");
		return (HTTP_STATE_COMPLETE);
	}

	p->status = (int)strtol(db_call_field(&p->db, "status"), NULL, 10);
	p->created = !strcmp(db_call_field(&p->db, "created"), "t");

	/* What is new and a refusal are answered after thinking. */
	if (p->refusal != NULL || p->created)
		req->fsm_state = POST_THINK;
	else
		req->fsm_state = POST_RESPOND;

	return (HTTP_STATE_CONTINUE);
}

static int
post_think(struct http_request *req)
{
	struct provider_request	*p = http_state_get(req);
	u_int64_t		ms;

	ms = think_ms(p);
	if (p->thought || ms == 0) {
		req->fsm_state = POST_RESPOND;
		return (HTTP_STATE_CONTINUE);
	}

	if (p->think == NULL) {
		p->think = kore_timer_add(think_done, ms, req,
		    KORE_TIMER_ONESHOT);
		http_request_sleep(req);
	}

	return (HTTP_STATE_RETRY);
}

static int
post_respond(struct http_request *req)
{
	struct provider_request	*p = http_state_get(req);
	const char		*retry_after;
	char			id[48];

	/*
	 * Every answer of its own carries a request id, as Stripe's do: the
	 * API takes a kept 500 as the provider's only with it (a gateway's
	 * 5xx has none).
	 */
	(void)snprintf(id, sizeof(id), "req_fake_%d_%llu", (int)getpid(),
	    (unsigned long long)++request_ids);
	http_response_header(req, "request-id", id);

	if (p->refusal != NULL) {
		problem_respond(req, p->refusal->problem, "%s",
		    p->refusal->detail);
		return (HTTP_STATE_COMPLETE);
	}

	switch (p->status) {
	case HTTP_STATUS_CREATED:
		post_respond_created(req, p);
		break;
	case HTTP_STATUS_CONFLICT:
		retry_after = db_call_field(&p->db, "retry_after");
		http_response_header(req, "retry-after", retry_after);
		problem_respond(req, PROBLEM_IN_PROGRESS, "a request with this "
		    "Idempotency-Key is still being processed; retry in %s s",
		    retry_after);
		break;
	case HTTP_STATUS_INTERNAL_ERROR:
		/* fail-twice..., or a 500 kept under the key. */
		problem_respond(req, PROBLEM_INTERNAL, "the provider failed "
		    "(test recipient \"%s\", or the 500 kept under this key)",
		    p->recipient);
		break;
	case HTTP_STATUS_BAD_REQUEST:
		/* A refund's own: an unknown charge, or past its amount. */
		problem_respond(req, PROBLEM_INVALID_REQUEST, "%s",
		    db_call_field(&p->db, "detail"));
		break;
	default:
		problem_respond(req, PROBLEM_KEY_REUSED, "this Idempotency-Key "
		    "was used for a %s with other parameters", p->kind->name);
		break;
	}

	return (HTTP_STATE_COMPLETE);
}

static void
post_respond_created(struct http_request *req, struct provider_request *p)
{
	struct kore_buf		buf;

	if (!p->created)
		http_response_header(req, "idempotent-replayed", "true");

	kore_buf_init(&buf, 128);
	p->kind->created(&buf, p);

	http_response_header(req, "content-type", JSON_CONTENT_TYPE);
	http_response(req, HTTP_STATUS_CREATED, buf.data, buf.offset);
	kore_buf_cleanup(&buf);
}

/*
 * GET ?idempotency_key=K: every charge or refund made under K; with
 * &prefix=1 under its generations too, as the lease strategy derives them
 * (provider.of_generations() in dev/002_provider.sql).
 */
static int
list(struct http_request *req)
{
	struct provider_request	*p = http_state_get(req);
	const char		*params[2];
	char			*key, *prefix;

	if (TAILQ_EMPTY(&req->arguments))
		http_populate_get(req);
	if (!http_argument_get_string(req, "idempotency_key", &key)) {
		problem_respond(req, PROBLEM_INVALID_REQUEST,
		    "idempotency_key query parameter is required");
		return (KORE_RESULT_OK);
	}

	params[0] = key;
	params[1] = http_argument_get_string(req, "prefix", &prefix) &&
	    !strcmp(prefix, "1") ? "t" : "f";
	switch (db_call_step(&p->db, p->kind->list_sql, 2, params)) {
	case DB_CALL_PENDING:
		return (KORE_RESULT_RETRY);
	case DB_CALL_FAILED:
		(void)db_failed(req);
		return (KORE_RESULT_OK);
	default:
		break;
	}

	if (db_call_rows(&p->db) != 1) {
		problem_respond(req, PROBLEM_DATABASE_UNAVAILABLE,
		    "the provider's database answered no row");
		return (KORE_RESULT_OK);
	}

	http_response_header(req, "content-type", JSON_CONTENT_TYPE);
	http_response(req, HTTP_STATUS_OK, db_call_value(&p->db, 0),
	    db_call_length(&p->db, 0));

	return (KORE_RESULT_OK);
}

static int
db_failed(struct http_request *req)
{
	problem_respond(req, PROBLEM_DATABASE_UNAVAILABLE,
	    "the provider's database failed");
	return (HTTP_STATE_COMPLETE);
}

static void
provider_request_free(struct http_request *req)
{
	struct provider_request	*p = http_state_get(req);

	if (p->think != NULL)
		kore_timer_remove(p->think);
	if (p->db_active)
		db_call_cleanup(&p->db);
	json_free(p->body);

	reload_release();
}

static void
think_done(void *arg, u_int64_t now)
{
	struct http_request	*req = arg;
	struct provider_request	*p = http_state_get(req);

	/* Kore frees a one-shot timer after this callback. */
	p->think = NULL;
	p->thought = 1;
	http_request_wakeup(req);
}

static int
key_valid(const char *key)
{
	size_t		i, len;

	len = strlen(key);
	if (len < 1 || len > PROVIDER_KEY_MAX)
		return (KORE_RESULT_ERROR);

	for (i = 0; i < len; i++) {
		if (key[i] < 0x21 || key[i] > 0x7e)
			return (KORE_RESULT_ERROR);
	}

	return (KORE_RESULT_OK);
}

/*
 * A member of the body as its SQL function takes it (a number as sent),
 * or NULL when it is absent or not what the field must be: the API's
 * rules, which is all the API sends.
 */
static const char *
field_value(struct json_value *body, const struct idem_field *f)
{
	struct json_value	*v;

	v = json_member(body, f->name);
	if (v == NULL || !idem_field_check(f, v))
		return (NULL);

	return (v->str);
}

/* The recipient and its magic: a refusal, or none. */
static void
recipient_set(struct provider_request *p, const char *recipient)
{
	size_t		i;

	(void)kore_strlcpy(p->recipient, recipient, sizeof(p->recipient));

	p->refusal = NULL;
	for (i = 0; i < p->kind->nrefusals; i++) {
		if (!strcmp(p->kind->refusals[i].recipient, p->recipient)) {
			p->refusal = &p->kind->refusals[i];
			break;
		}
	}
}

/*
 * How long a request that made a charge or refund or is refused thinks:
 * the kind's slow recipient thinks past the API's provider timeout.
 */
static u_int64_t
think_ms(struct provider_request *p)
{
	u_int64_t	ms;

	ms = settings.provider_latency_ms;
	if (!strcmp(p->recipient, p->kind->slow))
		ms += settings.provider_timeout_ms + SLOW_EXTRA_MS;

	return (ms);
}

/* A text column of the SQL function's row, as a JSON string. */
static void
append_field(struct kore_buf *buf, struct provider_request *p,
    const char *name)
{
	json_append_string(buf, db_call_field(&p->db, name),
	    db_call_field_length(&p->db, name));
}

static void
charge_created(struct kore_buf *buf, struct provider_request *p)
{
	const char	*currency = p->args[CHARGE_CURRENCY];

	kore_buf_append(buf, "{\"charge_id\":", 13);
	append_field(buf, p, "charge_id");
	kore_buf_appendf(buf, ",\"amount\":%s,\"currency\":",
	    db_call_field(&p->db, "amount"));
	json_append_string(buf, currency, strlen(currency));
	kore_buf_append(buf, "}", 1);
}

static void
refund_created(struct kore_buf *buf, struct provider_request *p)
{
	kore_buf_append(buf, "{\"refund_id\":", 13);
	append_field(buf, p, "refund_id");
	kore_buf_append(buf, ",\"charge_id\":", 13);
	append_field(buf, p, "charge_id");
	kore_buf_appendf(buf, ",\"amount\":%s}",
	    db_call_field(&p->db, "amount"));
}
