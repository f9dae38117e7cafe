/*
 * The classes of provider answers. Each provider has one table read top
 * to bottom (provider.c): the first row that matches a finished call
 * decides what the operation does and what the client gets.
 * docs/operations.md prints the tables.
 *
 *   success        saved as the payment, 201
 *   refused        saved and replayed (402, 422), never sent again
 *   busy           the provider still processes the same key: nothing
 *                  saved, the lease released, 409 with its Retry-After
 *   transient      nothing saved, the lease released, 502, 503 (429) or
 *                  504; a retry (or the recovery job) sends the same key
 *   indeterminate  a 5xx the provider keeps under the key and proves its
 *                  own (kept_proven()): nothing saved, the lease released,
 *                  the key marked and its settle window started; after
 *                  the window the next attempt asks the provider whether
 *                  the operation exists before it sends anything (lease.c,
 *                  reconcile). Any other 5xx is transient.
 *   configuration  401, 403, 404, ...: this service's fault, not the
 *                  payer's; nothing saved, released, logged at error
 *   key conflict   the provider says the key met other parameters: never
 *                  a success nor a refusal; released, logged at error
 *
 * A 408 is also what Kore, and other servers, write on a kept-alive
 * connection they time out, which a request sent on it may read: the
 * provider client avoids those connections and resends such a request
 * once on a fresh one (provider_client.c), so a 408 that gets here is the
 * provider's.
 */

#include <sys/types.h>

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "idem.h"
#include "json.h"
#include "problem.h"
#include "provider.h"
#include "provider_answer.h"
#include "settings.h"

/*
 * A provider's Retry-After past an hour says the provider is down, not
 * when this payment can go on; the client is told an hour at most.
 */
#define RETRY_AFTER_MAX		3600

const struct provider_answer	provider_answer_reconciled = {
	PROVIDER_SUCCESS, PROVIDER_NO_PROBLEM,
	"reconciled: the provider lists it under a generation of the key"
};

const struct provider_answer	provider_answer_pending = {
	PROVIDER_BUSY, PROBLEM_IN_PROGRESS,
	"reconciled: the provider lists it as pending"
};

const struct provider_answer	provider_answer_unresolved = {
	PROVIDER_INDETERMINATE, PROBLEM_PROVIDER_UNAVAILABLE,
	"not reconciled: the provider could not be asked"
};

const struct provider_answer	provider_answer_unsent = {
	PROVIDER_TRANSIENT, PROBLEM_PROVIDER_UNAVAILABLE,
	"not sent: the lease would end during the call"
};

static int	rule_matches(const struct provider *,
		    const struct answer_rule *, struct provider_call *,
		    struct json_value *, const char *);
static int	type_matches(const char *, struct json_value *);
static int	kept_proven(const struct provider *, struct provider_call *,
		    struct json_value *);
static int	id_valid(struct json_value *);
static void	describe(const struct provider *,
		    const struct provider_answer *, struct provider_call *,
		    struct json_value *, const char *, const char *);
static void	string_copy(char *, size_t, struct json_value *);
static void	detail_copy(char *, size_t, const char *, size_t);

/*
 * The class of a finished call by its provider's table, with what the
 * operation needs of it in the call: the id of what the provider made (id
 * names its member), the reason for the client, the words for the log,
 * the Retry-After. noun names what the call asked for (payment, refund).
 */
const struct provider_answer *
provider_answer_classify(const struct provider *p, struct provider_call *call,
    const char *id, const char *noun)
{
	const struct provider_answer	*answer;
	struct json_value		*body;
	char				err[JSON_ERROR_LEN];
	size_t				i;

	body = NULL;
	if (call->result == CURLE_OK) {
		body = json_parse(call->response.data, call->response.offset,
		    err, sizeof(err));
	}

	for (i = 0; i < p->nrules; i++) {
		if (!rule_matches(p, &p->rules[i], call, body, id))
			continue;
		answer = &p->rules[i].answer;
		describe(p, answer, call, body, id, noun);
		json_free(body);
		return (answer);
	}

	/* The last row matches any status: only a broken table gets here. */
	fatal("%s: no class for status %ld", __func__, call->status);
}

/*
 * A success and a refusal are the operation's outcome: saved. The others
 * release the lease.
 */
int
provider_answer_saved(const struct provider_answer *answer)
{
	return (answer->class == PROVIDER_SUCCESS ||
	    answer->class == PROVIDER_REFUSED);
}

/* What an operator must look at: logged at error, not notice. */
int
provider_answer_logged_error(const struct provider_answer *answer)
{
	return (answer->class == PROVIDER_CONFIG ||
	    answer->class == PROVIDER_KEY_CONFLICT);
}

static int
rule_matches(const struct provider *p, const struct answer_rule *rule,
    struct provider_call *call, struct json_value *body, const char *id)
{
	switch (rule->match) {
	case MATCH_TIMED_OUT:
		return (call->result == CURLE_OPERATION_TIMEDOUT);
	case MATCH_NO_ANSWER:
		return (call->result != CURLE_OK);
	case MATCH_ID:
		if (!id_valid(json_member(body, id)))
			return (0);
		break;
	case MATCH_TYPE:
		if (!type_matches(rule->type,
		    provider_path(body, p->error_type)))
			return (0);
		break;
	case MATCH_KEPT:
		if (!p->keeps_5xx || !kept_proven(p, call, body))
			return (0);
		break;
	case MATCH_STATUS:
		break;
	default:
		fatal("%s: unknown match %d", __func__, rule->match);
	}

	return (call->result == CURLE_OK &&
	    call->status >= rule->min && call->status <= rule->max);
}

/*
 * Whether a 5xx is the provider's own answer, which it keeps under the
 * key: its error type in its own body, and its request id header. A
 * gateway, a proxy or a load balancer in between answers an HTML or empty
 * 5xx without them while the provider may still work on the request:
 * that is transient, and the same key is sent again.
 */
static int
kept_proven(const struct provider *p, struct provider_call *call,
    struct json_value *body)
{
	if (p->kept_type == NULL || p->kept_header == NULL)
		return (0);

	if (!type_matches(p->kept_type, provider_path(body, p->error_type)))
		return (0);

	/* Its request id header, read with the answer (provider_client.c). */
	return (call->proof[0] != '\0');
}

/* An error type: equal, or for a row's "/..." the end of a type's URL. */
static int
type_matches(const char *want, struct json_value *v)
{
	size_t		len;

	if (v == NULL || v->type != JSON_STRING)
		return (0);

	len = strlen(want);
	if (want[0] == '/')
		return (v->len >= len && !memcmp(v->str + v->len - len, want,
		    len));

	return (v->len == len && !memcmp(v->str, want, len));
}

/*
 * A charge id is saved and sent back to the client: a string of 1 to 128
 * bytes without control characters.
 */
static int
id_valid(struct json_value *v)
{
	return (v != NULL && v->type == JSON_STRING &&
	    v->len <= PROVIDER_ID_MAX && idem_id_valid(v->str, v->len));
}

/*
 * The call's id, its detail for the client and its words for the log. A
 * detail never carries the provider's address, its internal text or a
 * library's: those go to the log only. A refusal's detail is the
 * provider's reason, which the payer needs.
 */
static void
describe(const struct provider *p, const struct provider_answer *answer,
    struct provider_call *call, struct json_value *body, const char *id,
    const char *noun)
{
	struct json_value	*v;
	curl_off_t		after;
	char			code[64];

	call->id[0] = '\0';
	call->detail[0] = '\0';
	call->log[0] = '\0';
	call->retry_after = 1;

	after = call->retry_after_sent;
	if (after > 0)
		call->retry_after = after < RETRY_AFTER_MAX ?
		    (u_int32_t)after : RETRY_AFTER_MAX;

	/* The provider's words, or libcurl's, for the log. */
	if (call->result != CURLE_OK) {
		(void)snprintf(call->log, sizeof(call->log), "%s",
		    call->errbuf[0] ? call->errbuf :
		    curl_easy_strerror(call->result));
	} else {
		string_copy(call->log, sizeof(call->log),
		    provider_path(body, p->reason));
	}

	switch (answer->class) {
	case PROVIDER_SUCCESS:
		v = json_member(body, id);
		(void)kore_strlcpy(call->id, v->str, sizeof(call->id));
		return;
	case PROVIDER_REFUSED:
		/* The provider's reason is what the client needs to fix. */
		(void)kore_strlcpy(call->detail, call->log,
		    sizeof(call->detail));
		/* None, or one a NUL ends at once ("\u0000..."): say ours. */
		if (call->detail[0] == '\0') {
			(void)snprintf(call->detail, sizeof(call->detail),
			    "the provider refused the %s (status %ld)", noun,
			    call->status);
		}
		code[0] = '\0';
		string_copy(code, sizeof(code),
		    provider_path(body, p->decline_code));
		if (code[0] != '\0' && idem_id_valid(code, strlen(code))) {
			(void)snprintf(call->detail + strlen(call->detail),
			    sizeof(call->detail) - strlen(call->detail),
			    " (decline code: %s)", code);
		}
		return;
	case PROVIDER_BUSY:
		(void)snprintf(call->detail, sizeof(call->detail),
		    "the provider is still processing this %s", noun);
		return;
	case PROVIDER_INDETERMINATE:
		(void)snprintf(call->detail, sizeof(call->detail),
		    "the payment provider answered %ld and keeps that answer "
		    "under this %s's key, so whether it was made is not known "
		    "yet; after its settle window the next attempt asks the "
		    "provider first", call->status, noun);
		return;
	case PROVIDER_CONFIG:
		(void)snprintf(call->detail, sizeof(call->detail),
		    "the payment provider refused this service's request: a "
		    "fault of the service's configuration, not of this %s, "
		    "logged for its operators", noun);
		return;
	case PROVIDER_KEY_CONFLICT:
		(void)snprintf(call->detail, sizeof(call->detail),
		    "the payment provider says this %s's provider key was "
		    "used with other parameters (idempotency_error); nothing "
		    "is saved, logged for the service's operators", noun);
		return;
	default:
		break;
	}

	if (answer->problem == PROBLEM_PROVIDER_RATE_LIMITED) {
		(void)snprintf(call->detail, sizeof(call->detail),
		    "the payment provider is limiting this service's "
		    "requests; retry in %u s", call->retry_after);
	} else if (call->result == CURLE_OPERATION_TIMEDOUT) {
		(void)snprintf(call->detail, sizeof(call->detail),
		    "the payment provider did not answer within %u ms",
		    settings.provider_timeout_ms);
	} else if (call->result != CURLE_OK) {
		(void)snprintf(call->detail, sizeof(call->detail),
		    "the payment provider could not be reached");
	} else if (call->status >= 200 && call->status <= 299) {
		/* The row's "valid id" is the member this operation reads. */
		(void)snprintf(call->detail, sizeof(call->detail),
		    "the payment provider answered %ld without a valid %s",
		    call->status, id);
	} else {
		(void)snprintf(call->detail, sizeof(call->detail),
		    "the payment provider answered %ld", call->status);
	}
}

/* A string member, cut at a UTF-8 boundary; nothing for another type. */
static void
string_copy(char *dst, size_t size, struct json_value *v)
{
	dst[0] = '\0';
	if (v != NULL && v->type == JSON_STRING)
		detail_copy(dst, size, v->str, v->len);
}

/*
 * Copies a UTF-8 string, cut if it must be at a character boundary, so
 * that the saved problem stays valid JSON text. A NUL ends it.
 */
static void
detail_copy(char *dst, size_t size, const char *src, size_t len)
{
	size_t		n;

	n = strnlen(src, len);
	if (n >= size) {
		n = size - 1;
		while (n > 0 && ((u_int8_t)src[n] & 0xc0) == 0x80)
			n--;
	}

	memcpy(dst, src, n);
	dst[n] = '\0';
}
