/*
 * The fake payment provider: POST /v1/charges makes at most one charge per
 * Idempotency-Key, like a real provider, and thinks IDEM_PROVIDER_LATENCY_MS
 * before it answers. It records the charge first, then thinks, so that a
 * client that gave up waiting may well have been charged. Another request
 * with the same key gets 409 at once while the first still thinks (a real
 * provider is still processing it), and the charge once it has finished.
 *
 * Magic recipients, as in a card network's test mode: "decline" is refused
 * (402), "reject" is refused for good (400, an invalid recipient), "fail"
 * breaks (500), "slow" thinks longer than the API's provider timeout.
 * Refusals and failures keep no charge. Every request is logged with the
 * status it got (provider.requests), so that tests can count calls.
 */

#include <sys/types.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kore/kore.h>
#include <kore/http.h>

#include "db.h"
#include "idem.h"
#include "json.h"
#include "metrics.h"
#include "problem.h"
#include "reload.h"
#include "settings.h"

#define CHARGE_SQL							\
	"SELECT status, created, charge_id, amount, retry_after FROM "	\
	"provider.charge($1, $2::bigint, $3, $4, $5::int, $6::int)"

#define CHARGES_OF_SQL		"SELECT provider.charges_of($1)"

#define PROVIDER_KEY_MAX	512
#define SLOW_EXTRA_MS		1000

#define RECIPIENT_SLOW		"slow"

/* The steps of POST /v1/charges, in charge_states. */
#define CHARGE_ADMIT		0
#define CHARGE_RECORD		1
#define CHARGE_THINK		2
#define CHARGE_RESPOND		3

/* The magic recipients that are refused: the status and the problem. */
struct refusal {
	const char	*recipient;
	int		status;
	int		problem;
	const char	*detail;
};

struct charge_request {
	struct db_call		db;
	int			db_active;
	struct kore_timer	*think;
	int			thought;
	char			key[PROVIDER_KEY_MAX + 1];
	struct json_value	*body;
	const char		*amount;
	const char		*currency;
	const char		*recipient;
	const struct refusal	*refusal;
	int			status;
};

static const struct refusal	refusals[] = {
	{ "decline", HTTP_STATUS_PAYMENT_REQUIRED, PROBLEM_CARD_DECLINED,
	    "the issuer declined the card (test recipient \"decline\")" },
	{ "reject", HTTP_STATUS_BAD_REQUEST, PROBLEM_INVALID_REQUEST,
	    "invalid recipient (test recipient \"reject\")" },
	{ "fail", HTTP_STATUS_INTERNAL_ERROR, PROBLEM_INTERNAL,
	    "the provider failed (test recipient \"fail\")" },
};

int	provider_init(int);
int	fake_provider_charges(struct http_request *);
int	v_provider_key(struct http_request *, const void *);

static int	charge_admit(struct http_request *);
static int	charge_record(struct http_request *);
static int	charge_think(struct http_request *);
static int	charge_respond(struct http_request *);
static void	charge_respond_created(struct http_request *,
		    struct charge_request *);
static int	charges_list(struct http_request *);
static void	charge_free(struct http_request *);
static void	think_done(void *, u_int64_t);
static int	key_valid(const char *);
static int	magic(struct charge_request *, const char *);
static const struct refusal	*refusal_of(const char *);
static u_int64_t	charge_think_ms(struct charge_request *);

static struct http_state	charge_states[] = {
	KORE_HTTP_STATE(charge_admit),
	KORE_HTTP_STATE(charge_record),
	KORE_HTTP_STATE(charge_think),
	KORE_HTTP_STATE(charge_respond),
};

int
provider_init(int state)
{
	if (state == KORE_MODULE_UNLOAD) {
		if (reload_unload() != KORE_RESULT_OK)
			return (KORE_RESULT_ERROR);
		settings_unload();
		return (KORE_RESULT_OK);
	}

	settings_load();
	metrics_attach();
	db_register();

	return (KORE_RESULT_OK);
}

int
fake_provider_charges(struct http_request *req)
{
	struct charge_request	*c;

	if (reload_defer(req))
		return (KORE_RESULT_RETRY);

	if (!http_state_exists(req)) {
		c = http_state_create(req, sizeof(*c), charge_free);
		reload_hold();
		db_call_init(&c->db, req);
		c->db_active = 1;
	}

	switch (req->method) {
	case HTTP_METHOD_POST:
		return (http_state_run(charge_states,
		    sizeof(charge_states) / sizeof(charge_states[0]), req));
	case HTTP_METHOD_GET:
		return (charges_list(req));
	default:
		http_response_header(req, "allow", "GET, POST");
		problem_respond(req, PROBLEM_METHOD_NOT_ALLOWED,
		    "/v1/charges accepts GET and POST");
		return (KORE_RESULT_OK);
	}
}

int
v_provider_key(struct http_request *req, const void *data)
{
	return (key_valid(data));
}

static int
charge_admit(struct http_request *req)
{
	struct charge_request	*c = http_state_get(req);
	struct json_value	*amount, *currency, *recipient;
	const char		*key;
	int64_t			value;
	char			err[JSON_ERROR_LEN];

	if (!http_request_header(req, "idempotency-key", &key) ||
	    !key_valid(key)) {
		problem_respond(req, PROBLEM_KEY_MISSING, "send an "
		    "Idempotency-Key of 1 to %d visible ASCII characters",
		    PROVIDER_KEY_MAX);
		return (HTTP_STATE_COMPLETE);
	}
	(void)kore_strlcpy(c->key, key, sizeof(c->key));

	c->body = idem_parse_body(req, err, sizeof(err));

	amount = json_member(c->body, "amount");
	currency = json_member(c->body, "currency");
	recipient = json_member(c->body, "recipient");

	if (!json_int64(amount, &value) || value <= 0 ||
	    value > IDEM_AMOUNT_MAX || currency == NULL ||
	    currency->type != JSON_STRING || currency->len != 3 ||
	    recipient == NULL || recipient->type != JSON_STRING ||
	    !idem_id_valid(recipient->str, recipient->len)) {
		problem_respond(req, PROBLEM_INVALID_REQUEST, "send "
		    "{\"amount\": minor units, \"currency\": \"XXX\", "
		    "\"recipient\": \"...\"}");
		return (HTTP_STATE_COMPLETE);
	}

	c->amount = amount->str;
	c->currency = currency->str;
	c->recipient = recipient->str;
	c->refusal = refusal_of(c->recipient);

	req->fsm_state = CHARGE_RECORD;
	return (HTTP_STATE_CONTINUE);
}

/*
 * One call decides and logs the answer: a refusal, a new charge, or what
 * the key's charge answers now (409 while its first request thinks).
 */
static int
charge_record(struct http_request *req)
{
	struct charge_request	*c = http_state_get(req);
	const char		*params[6];
	char			refusal[8], think[24];

	(void)snprintf(think, sizeof(think), "%llu",
	    (unsigned long long)charge_think_ms(c));
	if (c->refusal != NULL)
		(void)snprintf(refusal, sizeof(refusal), "%d",
		    c->refusal->status);

	params[0] = c->key;
	params[1] = c->amount;
	params[2] = c->currency;
	params[3] = c->recipient;
	params[4] = c->refusal != NULL ? refusal : NULL;
	params[5] = think;

	switch (db_call_step(&c->db, CHARGE_SQL, 6, params)) {
	case DB_CALL_PENDING:
		return (HTTP_STATE_RETRY);
	case DB_CALL_FAILED:
		problem_respond(req, PROBLEM_DATABASE_UNAVAILABLE,
		    "the provider's database failed");
		return (HTTP_STATE_COMPLETE);
	default:
		break;
	}

	if (db_call_rows(&c->db) != 1) {
		problem_respond(req, PROBLEM_DATABASE_UNAVAILABLE,
		    "the provider's database answered no row");
		return (HTTP_STATE_COMPLETE);
	}

	c->status = (int)strtol(db_call_value(&c->db, 0), NULL, 10);

	/* A new charge and a refusal are answered after thinking. */
	if (c->refusal != NULL || !strcmp(db_call_value(&c->db, 1), "t"))
		req->fsm_state = CHARGE_THINK;
	else
		req->fsm_state = CHARGE_RESPOND;

	return (HTTP_STATE_CONTINUE);
}

static int
charge_think(struct http_request *req)
{
	struct charge_request	*c = http_state_get(req);
	u_int64_t		ms;

	ms = charge_think_ms(c);
	if (c->thought || ms == 0) {
		req->fsm_state = CHARGE_RESPOND;
		return (HTTP_STATE_CONTINUE);
	}

	if (c->think == NULL) {
		c->think = kore_timer_add(think_done, ms, req,
		    KORE_TIMER_ONESHOT);
		http_request_sleep(req);
	}

	return (HTTP_STATE_RETRY);
}

static int
charge_respond(struct http_request *req)
{
	struct charge_request	*c = http_state_get(req);

	if (c->refusal != NULL) {
		problem_respond(req, c->refusal->problem, "%s",
		    c->refusal->detail);
		return (HTTP_STATE_COMPLETE);
	}

	switch (c->status) {
	case HTTP_STATUS_CREATED:
		charge_respond_created(req, c);
		break;
	case HTTP_STATUS_CONFLICT:
		http_response_header(req, "retry-after",
		    db_call_value(&c->db, 4));
		problem_respond(req, PROBLEM_IN_PROGRESS, "a request with this "
		    "Idempotency-Key is still being processed; retry in %s s",
		    db_call_value(&c->db, 4));
		break;
	default:
		problem_respond(req, PROBLEM_KEY_REUSED, "this Idempotency-Key "
		    "was used for a charge with other parameters");
		break;
	}

	return (HTTP_STATE_COMPLETE);
}

static void
charge_respond_created(struct http_request *req, struct charge_request *c)
{
	struct kore_buf		buf;

	if (strcmp(db_call_value(&c->db, 1), "t"))
		http_response_header(req, "idempotent-replayed", "true");

	kore_buf_init(&buf, 128);
	kore_buf_append(&buf, "{\"charge_id\":", 13);
	json_append_string(&buf, db_call_value(&c->db, 2),
	    db_call_length(&c->db, 2));
	kore_buf_appendf(&buf, ",\"amount\":%s,\"currency\":",
	    db_call_value(&c->db, 3));
	json_append_string(&buf, c->currency, strlen(c->currency));
	kore_buf_append(&buf, "}", 1);

	http_response_header(req, "content-type", JSON_CONTENT_TYPE);
	http_response(req, HTTP_STATUS_CREATED, buf.data, buf.offset);
	kore_buf_cleanup(&buf);
}

static int
charges_list(struct http_request *req)
{
	struct charge_request	*c = http_state_get(req);
	const char		*params[1];
	char			*key;

	if (TAILQ_EMPTY(&req->arguments))
		http_populate_get(req);
	if (!http_argument_get_string(req, "idempotency_key", &key)) {
		problem_respond(req, PROBLEM_INVALID_REQUEST,
		    "idempotency_key query parameter is required");
		return (KORE_RESULT_OK);
	}

	params[0] = key;
	switch (db_call_step(&c->db, CHARGES_OF_SQL, 1, params)) {
	case DB_CALL_PENDING:
		return (KORE_RESULT_RETRY);
	case DB_CALL_FAILED:
		problem_respond(req, PROBLEM_DATABASE_UNAVAILABLE,
		    "the provider's database failed");
		return (KORE_RESULT_OK);
	default:
		break;
	}

	if (db_call_rows(&c->db) != 1) {
		problem_respond(req, PROBLEM_DATABASE_UNAVAILABLE,
		    "the provider's database answered no row");
		return (KORE_RESULT_OK);
	}

	http_response_header(req, "content-type", JSON_CONTENT_TYPE);
	http_response(req, HTTP_STATUS_OK, db_call_value(&c->db, 0),
	    db_call_length(&c->db, 0));

	return (KORE_RESULT_OK);
}

static void
charge_free(struct http_request *req)
{
	struct charge_request	*c = http_state_get(req);

	if (c->think != NULL)
		kore_timer_remove(c->think);
	if (c->db_active)
		db_call_cleanup(&c->db);
	json_free(c->body);

	reload_release();
}

static void
think_done(void *arg, u_int64_t now)
{
	struct http_request	*req = arg;
	struct charge_request	*c = http_state_get(req);

	/* Kore frees a one-shot timer after this callback. */
	c->think = NULL;
	c->thought = 1;
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

static int
magic(struct charge_request *c, const char *recipient)
{
	return (!strcmp(c->recipient, recipient));
}

static const struct refusal *
refusal_of(const char *recipient)
{
	size_t		i;

	for (i = 0; i < sizeof(refusals) / sizeof(refusals[0]); i++) {
		if (!strcmp(refusals[i].recipient, recipient))
			return (&refusals[i]);
	}

	return (NULL);
}

/*
 * How long a request that made a charge or is refused thinks: "slow"
 * thinks past the API's provider timeout.
 */
static u_int64_t
charge_think_ms(struct charge_request *c)
{
	u_int64_t	ms;

	ms = settings.provider_latency_ms;
	if (magic(c, RECIPIENT_SLOW))
		ms += settings.provider_timeout_ms + SLOW_EXTRA_MS;

	return (ms);
}
