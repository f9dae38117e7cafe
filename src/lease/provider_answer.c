/*
 * The classes of provider answers, in one table read top to bottom: the
 * first row that matches a finished call decides what the payment does and
 * what the client gets. The README prints the same table.
 *
 *   success      saved as the payment, 201
 *   refused      saved and replayed (402, 422), never sent again
 *   busy         the provider still processes the same key: nothing saved,
 *                the lease released, 409 with the provider's Retry-After
 *   transient    nothing saved, the lease released, 502 or 504; a retry
 *                (or the recovery job) sends the same derived key again
 *
 * A 2xx without a valid charge id is transient, not a success (there is no
 * charge to save) and not a refusal (the provider may have charged): the
 * next attempt with the same derived key gets the charge if there is one.
 * A 408 and a 429 are not refusals either: the provider did not take the
 * request up (it came too late, or too many came), so it may be sent again.
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
#include "provider_answer.h"
#include "settings.h"

/* What a row matches. */
#define MATCH_TIMED_OUT		1	/* no answer within the timeout */
#define MATCH_NO_ANSWER		2	/* no HTTP answer at all */
#define MATCH_ID		3	/* a status in range with the operation's id */
#define MATCH_STATUS		4	/* a status in range */

/*
 * A provider's Retry-After past an hour says the provider is down, not
 * when this payment can go on; the client is told an hour at most.
 */
#define RETRY_AFTER_MAX		3600

struct answer_rule {
	int			match;
	long			min;
	long			max;
	struct provider_answer	answer;
};

static const struct answer_rule	rules[] = {
	{ MATCH_TIMED_OUT, 0, 0, { PROVIDER_TRANSIENT,
	    PROBLEM_PROVIDER_TIMEOUT, "no answer within the timeout" } },
	{ MATCH_NO_ANSWER, 0, 0, { PROVIDER_TRANSIENT,
	    PROBLEM_PROVIDER_UNAVAILABLE, "no HTTP answer (unreachable, "
	    "connection cut, body over 64 KiB)" } },
	{ MATCH_ID, 200, 299, { PROVIDER_SUCCESS,
	    PROVIDER_NO_PROBLEM, "2xx with a valid id (charge_id, refund_id)" } },
	{ MATCH_STATUS, 200, 299, { PROVIDER_TRANSIENT,
	    PROBLEM_PROVIDER_UNAVAILABLE, "2xx without a valid id" } },
	{ MATCH_STATUS, 402, 402, { PROVIDER_REFUSED,
	    PROBLEM_CARD_DECLINED, "402" } },
	{ MATCH_STATUS, 409, 409, { PROVIDER_BUSY,
	    PROBLEM_IN_PROGRESS, "409, still processing the same key" } },
	{ MATCH_STATUS, 408, 408, { PROVIDER_TRANSIENT,
	    PROBLEM_PROVIDER_UNAVAILABLE, "408, the request not received "
	    "in time" } },
	{ MATCH_STATUS, 429, 429, { PROVIDER_TRANSIENT,
	    PROBLEM_PROVIDER_UNAVAILABLE, "429, too many requests" } },
	{ MATCH_STATUS, 400, 499, { PROVIDER_REFUSED,
	    PROBLEM_PAYMENT_REJECTED, "any other 4xx" } },
	/*
	 * From LONG_MIN: libcurl reads three digits, but a status below 0
	 * in a row from 0 fell through every row to the fatal() below.
	 */
	{ MATCH_STATUS, LONG_MIN, LONG_MAX, { PROVIDER_TRANSIENT,
	    PROBLEM_PROVIDER_UNAVAILABLE, "anything else (5xx, 1xx, 3xx)" } },
};

static int	rule_matches(const struct answer_rule *, struct provider_call *,
		    struct json_value *, const char *);
static int	id_valid(struct json_value *);
static void	describe(const struct provider_answer *,
		    struct provider_call *, struct json_value *, const char *,
		    const char *);
static void	detail_copy(char *, size_t, const char *, size_t);

/*
 * The class of a finished call, with what the operation needs of it in
 * the call: the id of what the provider made (id names its member), the
 * provider's reason, its Retry-After. noun names what the call asked for
 * (payment, refund) in the messages.
 */
const struct provider_answer *
provider_answer_classify(struct provider_call *call, const char *id,
    const char *noun)
{
	struct json_value	*body;
	char			err[JSON_ERROR_LEN];
	size_t			i;

	body = NULL;
	if (call->result == CURLE_OK) {
		body = json_parse(call->response.data, call->response.offset,
		    err, sizeof(err));
	}

	for (i = 0; i < sizeof(rules) / sizeof(rules[0]); i++) {
		if (rule_matches(&rules[i], call, body, id)) {
			describe(&rules[i].answer, call, body, id, noun);
			json_free(body);
			return (&rules[i].answer);
		}
	}

	/* The last row matches any status: only a broken table gets here. */
	fatal("%s: no class for status %ld", __func__, call->status);
}

/*
 * A success and a refusal are the payment's outcome: saved. The others
 * release the lease.
 */
int
provider_answer_saved(const struct provider_answer *answer)
{
	return (answer->class == PROVIDER_SUCCESS ||
	    answer->class == PROVIDER_REFUSED);
}

static int
rule_matches(const struct answer_rule *rule, struct provider_call *call,
    struct json_value *body, const char *id)
{
	switch (rule->match) {
	case MATCH_TIMED_OUT:
		return (call->result == CURLE_OPERATION_TIMEDOUT);
	case MATCH_NO_ANSWER:
		return (call->result != CURLE_OK);
	case MATCH_ID:
		if (!id_valid(json_member(body, id)))
			return (0);
		/* FALLTHROUGH */
	case MATCH_STATUS:
		return (call->result == CURLE_OK &&
		    call->status >= rule->min && call->status <= rule->max);
	default:
		fatal("%s: unknown match %d", __func__, rule->match);
	}
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

static void
describe(const struct provider_answer *answer, struct provider_call *call,
    struct json_value *body, const char *id, const char *noun)
{
	struct json_value	*v;
	curl_off_t		after;

	call->id[0] = '\0';
	call->detail[0] = '\0';
	call->retry_after = 1;

	switch (answer->class) {
	case PROVIDER_SUCCESS:
		v = json_member(body, id);
		(void)kore_strlcpy(call->id, v->str, sizeof(call->id));
		return;
	case PROVIDER_REFUSED:
		/* The provider's reason is what the client needs to fix. */
		v = json_member(body, "detail");
		if (v != NULL && v->type == JSON_STRING) {
			detail_copy(call->detail, sizeof(call->detail), v->str,
			    v->len);
		}
		/* None, or one a NUL ends at once ("\u0000..."): say ours. */
		if (call->detail[0] == '\0') {
			(void)snprintf(call->detail, sizeof(call->detail),
			    "the provider refused the %s (status %ld)", noun,
			    call->status);
		}
		return;
	case PROVIDER_BUSY:
		after = call->retry_after_sent;
		if (after > 0)
			call->retry_after = after < RETRY_AFTER_MAX ?
			    (u_int32_t)after : RETRY_AFTER_MAX;
		(void)snprintf(call->detail, sizeof(call->detail),
		    "the provider is still processing this %s", noun);
		return;
	default:
		break;
	}

	if (call->result == CURLE_OPERATION_TIMEDOUT) {
		(void)snprintf(call->detail, sizeof(call->detail),
		    "no answer within %u ms", settings.provider_timeout_ms);
	} else if (call->result != CURLE_OK) {
		(void)snprintf(call->detail, sizeof(call->detail), "%s",
		    call->errbuf[0] ? call->errbuf :
		    curl_easy_strerror(call->result));
	} else if (call->status >= 200 && call->status <= 299) {
		/* The row's "valid id" is the member this operation reads. */
		(void)snprintf(call->detail, sizeof(call->detail),
		    "the provider answered %ld (2xx without a valid %s)",
		    call->status, id);
	} else {
		(void)snprintf(call->detail, sizeof(call->detail),
		    "the provider answered %ld", call->status);
	}
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
