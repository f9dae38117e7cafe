/*
 * Fuzz target: the provider's answer (provider_answer_classify() in
 * src/lease/provider_answer.c), everything of it the provider chooses:
 * the status, the Retry-After, the body, and what libcurl made of the
 * call (its result, its error message).
 *
 * The input is a header of FIXED_LEN bytes, then the error message (its
 * length in the header's last byte), then the body:
 *
 *	0	libcurl's result: below 128 CURLE_OK, else
 *		(byte - 128) % CURL_LAST (156 is CURLE_OPERATION_TIMEDOUT)
 *	1-4	the HTTP status, a signed 32-bit little-endian number
 *	5-12	the Retry-After libcurl read, signed 64-bit little-endian
 *	13	bit 0: a refund (refund_id) rather than a charge (charge_id)
 *	14	the length of the error message
 *
 * Every answer falls in one of the four classes, the one the README's
 * table gives; a success carries the body's id, whole and valid, and
 * nothing else does; the detail is terminated, and valid UTF-8 when it
 * comes from the body; the Retry-After given to the client is 1 to 3600.
 */

#include <sys/types.h>

#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "idem.h"
#include "provider_answer.h"
#include "settings.h"

#define FIXED_LEN	15

struct settings		settings = {
	.provider_timeout_ms = 10000,
};

static int	expected_class(struct provider_call *, const char *);
static int	id_ok(struct json_value *);
static int	utf8_valid(const char *);
static u_int64_t	little_endian(const u_int8_t *, size_t);

int	LLVMFuzzerTestOneInput(const u_int8_t *, size_t);

int
LLVMFuzzerTestOneInput(const u_int8_t *data, size_t len)
{
	const struct provider_answer	*a;
	struct provider_call		call;
	struct json_value		*body, *v;
	const char			*id, *noun;
	char				err[JSON_ERROR_LEN];
	size_t				elen, n;
	curl_off_t			sent;
	u_int32_t			after;
	int				class;

	if (len < FIXED_LEN)
		return (0);

	memset(&call, 0, sizeof(call));
	call.result = data[0] < 128 ? CURLE_OK :
	    (CURLcode)((data[0] - 128) % CURL_LAST);
	call.status = (int32_t)little_endian(data + 1, 4);
	call.retry_after_sent = (curl_off_t)little_endian(data + 5, 8);
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

	class = expected_class(&call, id);
	sent = call.retry_after_sent;

	a = provider_answer_classify(&call, id, noun);

	if (a == NULL || a->class != class) {
		FUZZ_FAIL("status %ld, result %d: class %d, not %d",
		    call.status, call.result, a ? a->class : -1, class);
	}
	if ((a->problem == PROVIDER_NO_PROBLEM) != (class == PROVIDER_SUCCESS))
		FUZZ_FAIL("class %d with problem %d", class, a->problem);
	if (provider_answer_saved(a) !=
	    (class == PROVIDER_SUCCESS || class == PROVIDER_REFUSED))
		FUZZ_FAIL("class %d saved or not the wrong way", class);
	if (a->what == NULL || *a->what == '\0')
		FUZZ_FAIL("a row without its description");

	/* The id: the body's, whole, on a success only. */
	if (memchr(call.id, '\0', sizeof(call.id)) == NULL)
		FUZZ_FAIL("an id without its NUL");
	if (class == PROVIDER_SUCCESS) {
		body = json_parse(call.response.data, call.response.offset,
		    err, sizeof(err));
		v = json_member(body, id);
		if (v == NULL || strlen(call.id) != v->len ||
		    memcmp(call.id, v->str, v->len))
			FUZZ_FAIL("the id saved is not the body's");
		json_free(body);
	} else if (call.id[0] != '\0') {
		FUZZ_FAIL("an id without a success: %s", call.id);
	}

	/* The detail: terminated; from the body, a UTF-8 text. */
	if (memchr(call.detail, '\0', sizeof(call.detail)) == NULL)
		FUZZ_FAIL("a detail without its NUL");
	if ((class == PROVIDER_SUCCESS) != (call.detail[0] == '\0'))
		FUZZ_FAIL("class %d with detail [%s]", class, call.detail);
	if (call.result == CURLE_OK && !utf8_valid(call.detail))
		FUZZ_FAIL("a detail that is not UTF-8: [%s]", call.detail);

	/* Retry-After: the provider's on a busy answer, 1 to 3600. */
	after = 1;
	if (class == PROVIDER_BUSY && sent > 0)
		after = sent < 3600 ? (u_int32_t)sent : 3600;
	if (call.retry_after != after) {
		FUZZ_FAIL("Retry-After %u for %lld sent, not %u",
		    call.retry_after, (long long)sent, after);
	}

	kore_buf_cleanup(&call.response);

	return (0);
}

/*
 * The README's table, top to bottom: no answer, then a 2xx with a valid
 * id, by status then.
 */
static int
expected_class(struct provider_call *call, const char *id)
{
	struct json_value	*body;
	char			err[JSON_ERROR_LEN];
	int			valid;

	if (call->result != CURLE_OK)
		return (PROVIDER_TRANSIENT);

	if (call->status >= 200 && call->status <= 299) {
		body = json_parse(call->response.data, call->response.offset,
		    err, sizeof(err));
		valid = id_ok(json_member(body, id));
		json_free(body);
		return (valid ? PROVIDER_SUCCESS : PROVIDER_TRANSIENT);
	}

	switch (call->status) {
	case 402:
		return (PROVIDER_REFUSED);
	case 409:
		return (PROVIDER_BUSY);
	case 408:
	case 429:
		return (PROVIDER_TRANSIENT);
	default:
		if (call->status >= 400 && call->status <= 499)
			return (PROVIDER_REFUSED);
		return (PROVIDER_TRANSIENT);
	}
}

/* A string of 1 to 128 bytes without control characters. */
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

	return (1);
}

/* Well-formed UTF-8 (RFC 3629): no overlong form, surrogate, or past U+10FFFF. */
static int
utf8_valid(const char *s)
{
	const u_int8_t	*p;
	u_int32_t	cp;
	size_t		n, i;

	for (p = (const u_int8_t *)s; *p != '\0'; p += n) {
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
