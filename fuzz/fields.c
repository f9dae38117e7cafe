/*
 * Fuzz target: the body's fields (idem_field_check() in
 * src/core/idem_input.c) over the values the JSON parser makes.
 *
 * The input is a request body. Every value in it is checked as each kind
 * of field, and each answer must be the rule the API documents, read a
 * second, plain way: an amount is an integer literal from 1 to 2^53-1, a
 * currency three ASCII capitals, an id 1 to 128 bytes without control
 * characters, a text at most 1024 bytes without NUL.
 */

#include <sys/types.h>

#include <string.h>

#include "fuzz.h"
#include "idem.h"

#define LIMIT		"9007199254740991"

static void	check_all(struct json_value *);
static int	expected(int, struct json_value *);
static int	magnitude_ok(const char *);
static int	bytes_ok(struct json_value *, size_t, size_t, int);
static int	visible_ok(struct json_value *);

int	LLVMFuzzerTestOneInput(const u_int8_t *, size_t);

int
LLVMFuzzerTestOneInput(const u_int8_t *data, size_t len)
{
	struct json_value	*v;
	char			err[JSON_ERROR_LEN];

	if ((v = json_parse(data, len, err, sizeof(err))) == NULL)
		return (0);

	check_all(v);
	json_free(v);

	return (0);
}

static void
check_all(struct json_value *v)
{
	struct json_value	*c;
	struct idem_field	f;
	int			kind;

	memset(&f, 0, sizeof(f));
	f.name = "field";
	for (kind = FIELD_AMOUNT; kind <= FIELD_TOKEN; kind++) {
		f.kind = kind;
		if (idem_field_check(&f, v) != expected(kind, v)) {
			FUZZ_FAIL("kind %d: idem_field_check says %d for a "
			    "value of type %d (%.*s)", kind, !expected(kind, v),
			    v->type, v->str ? (int)v->len : 0,
			    v->str ? v->str : "");
		}
	}

	TAILQ_FOREACH(c, &v->children, list)
		check_all(c);
}

static int
expected(int kind, struct json_value *v)
{
	const char	*digits;

	switch (kind) {
	case FIELD_AMOUNT:
	case FIELD_REF:
	case FIELD_POINTS_POSITIVE:
		return (v->type == JSON_NUMBER && v->integer &&
		    v->str[0] != '-' && magnitude_ok(v->str));
	case FIELD_POINTS:
		if (v->type != JSON_NUMBER || !v->integer)
			return (0);
		digits = v->str[0] == '-' ? v->str + 1 : v->str;
		return (magnitude_ok(digits));
	case FIELD_CURRENCY:
		return (v->type == JSON_STRING && v->len == 3 &&
		    v->str[0] >= 'A' && v->str[0] <= 'Z' &&
		    v->str[1] >= 'A' && v->str[1] <= 'Z' &&
		    v->str[2] >= 'A' && v->str[2] <= 'Z');
	case FIELD_ID:
		return (v->type == JSON_STRING && bytes_ok(v, 1, 128, 1));
	case FIELD_TEXT:
		return (v->type == JSON_STRING && bytes_ok(v, 0, 1024, 0));
	case FIELD_TOKEN:
		return (v->type == JSON_STRING && visible_ok(v));
	default:
		FUZZ_FAIL("kind %d", kind);
	}
}

/* 1 to 255 bytes, each from 0x21 to 0x7e. */
static int
visible_ok(struct json_value *v)
{
	size_t		i;

	if (v->len < 1 || v->len > 255)
		return (0);
	for (i = 0; i < v->len; i++) {
		if ((u_int8_t)v->str[i] < 0x21 || (u_int8_t)v->str[i] > 0x7e)
			return (0);
	}

	return (1);
}

/* Digits without a leading zero (JSON's), from 1 to 2^53-1. */
static int
magnitude_ok(const char *digits)
{
	size_t		len;

	if (!strcmp(digits, "0"))
		return (0);

	len = strlen(digits);
	if (len != strlen(LIMIT))
		return (len < strlen(LIMIT));

	return (strcmp(digits, LIMIT) <= 0);
}

static int
bytes_ok(struct json_value *v, size_t min, size_t max, int strict)
{
	size_t		i;
	u_int8_t	ch;

	if (v->len < min || v->len > max)
		return (0);

	for (i = 0; i < v->len; i++) {
		ch = (u_int8_t)v->str[i];
		if (ch == '\0')
			return (0);
		if (strict && (ch < 0x20 || ch == 0x7f))
			return (0);
	}

	return (1);
}
