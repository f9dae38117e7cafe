/*
 * The fake payment provider: POST /v1/charges makes at most one charge per
 * Idempotency-Key, like a real provider, and thinks IDEM_PROVIDER_LATENCY_MS
 * before it answers. It records the charge first, then thinks, so that a
 * client that gave up waiting may well have been charged; a later call with
 * the same key answers at once with that charge.
 *
 * Magic recipients, as in a card network's test mode: "decline" is refused
 * (402), "fail" breaks (500), "slow" thinks longer than the API's
 * provider timeout.
 */

#include <sys/types.h>

#include <string.h>

#include <kore/kore.h>
#include <kore/http.h>

#include "db.h"
#include "idem.h"
#include "json.h"
#include "metrics.h"
#include "problem.h"
#include "reload.h"
#include "routes.h"
#include "settings.h"

#define CHARGE_SQL							\
	"SELECT created, charge_id, amount, currency, recipient FROM "	\
	"provider.charge($1, $2::bigint, $3, $4)"

#define CHARGES_OF_SQL		"SELECT provider.charges_of($1)"

#define PROVIDER_KEY_MAX	512
#define SLOW_EXTRA_MS		1000

#define RECIPIENT_DECLINE	"decline"
#define RECIPIENT_FAIL		"fail"
#define RECIPIENT_SLOW		"slow"

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
};

int	provider_init(int);
int	fake_provider_charges(struct http_request *);
int	v_provider_key(struct http_request *, const void *);

static int	charge_admit(struct http_request *);
static int	charge_record(struct http_request *);
static int	charge_think(struct http_request *);
static int	charge_respond(struct http_request *);
static int	charges_list(struct http_request *);
static void	charge_free(struct http_request *);
static void	think_done(void *, u_int64_t);
static int	key_valid(const char *);
static int	magic(struct charge_request *, const char *);

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
		    ROUTE_STATES(charge_states), req));
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

	/* Refused and broken charges are not recorded. */
	if (magic(c, RECIPIENT_DECLINE) || magic(c, RECIPIENT_FAIL))
		req->fsm_state += 2;
	else
		req->fsm_state++;

	return (HTTP_STATE_CONTINUE);
}

static int
charge_record(struct http_request *req)
{
	struct charge_request	*c = http_state_get(req);
	const char		*params[4];

	params[0] = c->key;
	params[1] = c->amount;
	params[2] = c->currency;
	params[3] = c->recipient;

	switch (db_call_step(&c->db, CHARGE_SQL, 4, params)) {
	case DB_CALL_PENDING:
		return (HTTP_STATE_RETRY);
	case DB_CALL_FAILED:
		problem_respond(req, PROBLEM_DATABASE_UNAVAILABLE,
		    "the provider's database failed");
		return (HTTP_STATE_COMPLETE);
	default:
		break;
	}

	if (strcmp(db_call_value(&c->db, 2), c->amount) ||
	    strcmp(db_call_value(&c->db, 3), c->currency) ||
	    strcmp(db_call_value(&c->db, 4), c->recipient)) {
		problem_respond(req, PROBLEM_KEY_REUSED, "this Idempotency-Key "
		    "was used for a charge with other parameters");
		return (HTTP_STATE_COMPLETE);
	}

	/* A charge already made is answered at once. */
	if (!strcmp(db_call_value(&c->db, 0), "t"))
		req->fsm_state++;
	else
		req->fsm_state += 2;

	return (HTTP_STATE_CONTINUE);
}

static int
charge_think(struct http_request *req)
{
	struct charge_request	*c = http_state_get(req);
	u_int64_t		ms;

	if (c->thought) {
		req->fsm_state++;
		return (HTTP_STATE_CONTINUE);
	}

	ms = settings.provider_latency_ms;
	if (magic(c, RECIPIENT_SLOW))
		ms += settings.provider_timeout_ms + SLOW_EXTRA_MS;

	if (ms == 0) {
		req->fsm_state++;
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
	struct kore_buf		buf;

	if (magic(c, RECIPIENT_DECLINE)) {
		problem_respond(req, PROBLEM_CARD_DECLINED,
		    "the issuer declined the card (test recipient \"decline\")");
		return (HTTP_STATE_COMPLETE);
	}

	if (magic(c, RECIPIENT_FAIL)) {
		problem_respond(req, PROBLEM_INTERNAL,
		    "the provider failed (test recipient \"fail\")");
		return (HTTP_STATE_COMPLETE);
	}

	if (!strcmp(db_call_value(&c->db, 0), "f"))
		http_response_header(req, "idempotent-replayed", "true");

	kore_buf_init(&buf, 128);
	kore_buf_append(&buf, "{\"charge_id\":", 13);
	json_append_string(&buf, db_call_value(&c->db, 1),
	    db_call_length(&c->db, 1));
	kore_buf_appendf(&buf, ",\"amount\":%s,\"currency\":",
	    db_call_value(&c->db, 2));
	json_append_string(&buf, c->currency, strlen(c->currency));
	kore_buf_append(&buf, "}", 1);

	http_response_header(req, "content-type", JSON_CONTENT_TYPE);
	http_response(req, HTTP_STATUS_CREATED, buf.data, buf.offset);
	kore_buf_cleanup(&buf);

	return (HTTP_STATE_COMPLETE);
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
