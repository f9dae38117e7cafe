/*
 * What idem.c reads from a client's bytes, as functions of those bytes
 * alone: the Idempotency-Key, a body field, an identifier, the path and
 * query arguments of a read. None takes a request, so that the fuzz
 * targets (fuzz/) build them without Kore's runtime.
 */

#include <sys/types.h>

#include <ctype.h>
#include <inttypes.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idem.h"

static int	key_parse(const char *, char *);
static int	text_valid(const char *, size_t, size_t, size_t, int);
static int	token_valid(const char *, size_t);
static int	kind_valid(const struct idem_field *, struct json_value *);
static int	pattern_match(const char *, const char *, size_t);
static int	values_match(const char *, const char *, size_t);

/*
 * Each body kind's own limits (a field narrows them) and the words of its
 * rule, which the field's 400 and its document both say.
 */
static const struct {
	int		integer;
	int64_t		min;
	int64_t		max;
	int		nonzero;
	size_t		minlen;
	size_t		maxlen;
	const char	*noun;
	const char	*tail;
} kinds[] = {
	[FIELD_AMOUNT] = { 1, 1, IDEM_AMOUNT_MAX, 0, 0, 0,
	    "an integer count of minor units", NULL },
	[FIELD_POINTS] = { 1, -IDEM_AMOUNT_MAX, IDEM_AMOUNT_MAX, 1, 0, 0,
	    "an integer", NULL },
	[FIELD_CURRENCY] = { 0, 0, 0, 0, 3, 3,
	    "three upper-case ASCII letters", NULL },
	[FIELD_ID] = { 0, 0, 0, 0, 1, IDEM_ID_MAX,
	    "a string", "bytes of UTF-8 without control characters" },
	[FIELD_TEXT] = { 0, 0, 0, 0, 0, IDEM_TEXT_MAX,
	    "a string", "bytes of UTF-8 without NUL" },
	[FIELD_REF] = { 1, 1, IDEM_AMOUNT_MAX, 0, 0, 0,
	    "an integer id", NULL },
	[FIELD_POINTS_POSITIVE] = { 1, 1, IDEM_AMOUNT_MAX, 0, 0, 0,
	    "an integer", NULL },
	[FIELD_TOKEN] = { 0, 0, 0, 0, 1, 255,
	    "a string", "visible ASCII characters" },
};

#define KIND_KNOWN(k)	((k) > 0 && (size_t)(k) < IDEM_COUNT(kinds) && \
			    kinds[(k)].noun != NULL)
static int	percent_decode(const char *, size_t, int, char *, size_t,
		    size_t *);

/*
 * An identifier (a customer, a recipient): 1 to 128 bytes of UTF-8
 * without control characters. A body's strings are UTF-8 already; one
 * percent-decoded from a path or a query may be any bytes, which
 * PostgreSQL would refuse as text (a 500).
 */
int
idem_id_valid(const char *s, size_t len)
{
	return (text_valid(s, len, 1, IDEM_ID_MAX, 1) &&
	    json_utf8_valid(s, len));
}

/*
 * An Idempotency-Key is 1 to 255 visible ASCII characters, sent bare or as
 * an RFC 8941 string ("abc" means abc, with \" and \\ escapes). out holds
 * IDEM_KEY_MAX + 1 bytes: the key when it is valid, else the empty string
 * (never the part read before the fault: the access log shows out).
 */
int
idem_key_parse(const char *value, char *out)
{
	if (key_parse(value, out))
		return (KORE_RESULT_OK);

	out[0] = '\0';

	return (KORE_RESULT_ERROR);
}

static int
key_parse(const char *value, char *out)
{
	size_t		len;
	const char	*p, *end;

	/*
	 * Whitespace around a field value is not part of it (RFC 9110,
	 * 5.5): spaces and tabs are stripped from both ends. Kore strips the
	 * leading spaces itself; a trailing one was a 400 before.
	 */
	while (*value == ' ' || *value == '\t')
		value++;
	end = value + strlen(value);
	while (end > value && (end[-1] == ' ' || end[-1] == '\t'))
		end--;

	len = 0;

	if (*value != '"') {
		for (p = value; p < end; p++) {
			if (*p < 0x21 || *p > 0x7e || len == IDEM_KEY_MAX)
				return (KORE_RESULT_ERROR);
			out[len++] = *p;
		}
	} else {
		for (p = value + 1; p < end && *p != '"'; p++) {
			if (*p == '\\') {
				p++;
				if (p == end || (*p != '"' && *p != '\\'))
					return (KORE_RESULT_ERROR);
			}
			if (*p < 0x21 || *p > 0x7e || len == IDEM_KEY_MAX)
				return (KORE_RESULT_ERROR);
			out[len++] = *p;
		}
		if (p == end || p + 1 != end)
			return (KORE_RESULT_ERROR);
	}

	out[len] = '\0';

	return (len > 0 ? KORE_RESULT_OK : KORE_RESULT_ERROR);
}

/*
 * What a body field may hold: its kind's limits, narrowed by the field's
 * own. KORE_RESULT_ERROR, with the reason in *why, for a field whose own
 * limits do not narrow its kind's (scripts/openapi-tables.c stops the
 * build on it; the validator never sees such a table).
 */
int
idem_field_limits(const struct idem_field *f, struct idem_limits *l,
    const char **why)
{
	regex_t		re;

	*why = NULL;
	memset(l, 0, sizeof(*l));

	if (!KIND_KNOWN(f->kind)) {
		*why = "not a body field's kind";
		return (KORE_RESULT_ERROR);
	}

	l->integer = kinds[f->kind].integer;
	l->min = kinds[f->kind].min;
	l->max = kinds[f->kind].max;
	l->nonzero = kinds[f->kind].nonzero;
	l->minlen = kinds[f->kind].minlen;
	l->maxlen = kinds[f->kind].maxlen;
	l->pattern = f->pattern;
	l->values = f->values;

	if (f->ranged) {
		if (!l->integer)
			*why = "IDEM_RANGE on a field that is not an integer";
		else if (f->min > f->max)
			*why = "IDEM_RANGE with its minimum above its maximum";
		else if (f->min < l->min || f->max > l->max)
			*why = "IDEM_RANGE wider than its kind's range";
		l->min = f->min;
		l->max = f->max;
		if (l->min > 0 || l->max < 0)
			l->nonzero = 0;
	}

	if (f->minlen != 0 || f->maxlen != 0) {
		if (l->integer)
			*why = "IDEM_LENGTH on an integer";
		if (f->minlen != 0) {
			if (f->minlen < l->minlen)
				*why = "IDEM_LENGTH below its kind's";
			l->minlen = f->minlen;
		}
		if (f->maxlen != 0) {
			if (f->maxlen > l->maxlen)
				*why = "IDEM_LENGTH above its kind's";
			l->maxlen = f->maxlen;
		}
		if (l->minlen > l->maxlen)
			*why = "IDEM_LENGTH with its minimum above its maximum";
	}

	if (f->pattern != NULL) {
		if (l->integer)
			*why = ".pattern on an integer";
		else if (regcomp(&re, f->pattern, REG_EXTENDED | REG_NOSUB))
			*why = ".pattern is not a POSIX extended regular "
			    "expression";
		else
			regfree(&re);
	}

	if (f->values != NULL && l->integer)
		*why = ".values on an integer";

	return (*why == NULL ? KORE_RESULT_OK : KORE_RESULT_ERROR);
}

/*
 * The rule of a body field in words, from its limits: the field's 400
 * says "<name> must be <rule>", and its document's description the same.
 */
void
idem_field_rule(const struct idem_field *f, char *out, size_t len)
{
	struct idem_limits	l;
	const char		*why, *p;
	size_t			n;

	if (!idem_field_limits(f, &l, &why) && !KIND_KNOWN(f->kind)) {
		(void)snprintf(out, len, "a value of no known kind");
		return;
	}

	if (l.integer) {
		n = snprintf(out, len, "%s from %" PRId64 " to %" PRId64,
		    l.nonzero ? "a non-zero integer" : kinds[f->kind].noun,
		    l.min, l.max);
	} else if (kinds[f->kind].tail == NULL) {
		n = snprintf(out, len, "%s", kinds[f->kind].noun);
	} else if (l.minlen == 0) {
		n = snprintf(out, len, "%s of at most %zu %s",
		    kinds[f->kind].noun, l.maxlen, kinds[f->kind].tail);
	} else if (l.minlen == l.maxlen) {
		n = snprintf(out, len, "%s of exactly %zu %s",
		    kinds[f->kind].noun, l.maxlen, kinds[f->kind].tail);
	} else {
		n = snprintf(out, len, "%s of %zu to %zu %s",
		    kinds[f->kind].noun, l.minlen, l.maxlen,
		    kinds[f->kind].tail);
	}

	if (l.pattern != NULL && n < len)
		n += snprintf(out + n, len - n, ", matching %s", l.pattern);

	if (l.values != NULL && n < len) {
		n += snprintf(out + n, len - n, ", one of ");
		for (p = l.values; *p != '\0' && n + 3 < len; p++) {
			if (*p == '|') {
				out[n++] = ',';
				out[n++] = ' ';
			} else {
				out[n++] = *p;
			}
		}
		out[n < len ? n : len - 1] = '\0';
	}
}

/*
 * Whether a member of a body (not NULL) holds what its field must hold:
 * its kind, then the field's own limits.
 */
int
idem_field_check(const struct idem_field *f, struct json_value *v)
{
	struct idem_limits	l;
	const char		*why;
	int64_t			n;

	if (!kind_valid(f, v))
		return (KORE_RESULT_ERROR);

	if (!idem_field_limits(f, &l, &why))
		fatal("%s: field %s: %s", __func__, f->name, why);

	if (l.integer) {
		if (!json_int64(v, &n))
			return (KORE_RESULT_ERROR);
		return (n >= l.min && n <= l.max && (!l.nonzero || n != 0));
	}

	if (v->len < l.minlen || v->len > l.maxlen)
		return (KORE_RESULT_ERROR);
	if (l.pattern != NULL && !pattern_match(l.pattern, v->str, v->len))
		return (KORE_RESULT_ERROR);
	if (l.values != NULL && !values_match(l.values, v->str, v->len))
		return (KORE_RESULT_ERROR);

	return (KORE_RESULT_OK);
}

/* What the field's kind alone allows. */
static int
kind_valid(const struct idem_field *f, struct json_value *v)
{
	int64_t		n;

	switch (f->kind) {
	case FIELD_AMOUNT:
	case FIELD_REF:
	case FIELD_POINTS_POSITIVE:
		return (json_int64(v, &n) && n > 0 && n <= IDEM_AMOUNT_MAX);
	case FIELD_POINTS:
		return (json_int64(v, &n) && n != 0 &&
		    n >= -IDEM_AMOUNT_MAX && n <= IDEM_AMOUNT_MAX);
	case FIELD_CURRENCY:
		return (v->type == JSON_STRING && v->len == 3 &&
		    isupper((unsigned char)v->str[0]) &&
		    isupper((unsigned char)v->str[1]) &&
		    isupper((unsigned char)v->str[2]));
	case FIELD_ID:
		return (v->type == JSON_STRING && idem_id_valid(v->str, v->len));
	case FIELD_TEXT:
		return (v->type == JSON_STRING &&
		    text_valid(v->str, v->len, 0, IDEM_TEXT_MAX, 0));
	case FIELD_TOKEN:
		return (v->type == JSON_STRING && token_valid(v->str, v->len));
	default:
		fatal("%s: unknown field kind %d", __func__, f->kind);
	}
}

/*
 * Whether a string (no NUL: every kind refuses it) matches a field's
 * pattern. Compiled at each check: a few microseconds, for the fields
 * that have one.
 */
static int
pattern_match(const char *pattern, const char *s, size_t len)
{
	regex_t		re;
	char		*copy;
	int		rc;

	if (regcomp(&re, pattern, REG_EXTENDED | REG_NOSUB))
		fatal("%s: %s is not a regular expression", __func__, pattern);

	copy = kore_malloc(len + 1);
	memcpy(copy, s, len);
	copy[len] = '\0';
	rc = regexec(&re, copy, 0, NULL, 0);
	kore_free(copy);
	regfree(&re);

	return (rc == 0);
}

/* Whether a string is one of "a|b|c". */
static int
values_match(const char *values, const char *s, size_t len)
{
	const char	*p, *end;

	for (p = values; *p != '\0'; p = *end != '\0' ? end + 1 : end) {
		if ((end = strchr(p, '|')) == NULL)
			end = p + strlen(p);
		if ((size_t)(end - p) == len && !memcmp(p, s, len))
			return (KORE_RESULT_OK);
	}

	return (KORE_RESULT_ERROR);
}

/*
 * The last segment of a path, percent-decoded by RFC 3986: %XX is the
 * byte XX and every other character is itself (a path has no "+ means
 * space" rule, so a customer "a+b" is /a+b or /a%2Bb). An identifier.
 */
int
idem_path_arg_parse(const char *path, char *out, size_t len)
{
	const char	*seg;
	size_t		n;

	if ((seg = strrchr(path, '/')) == NULL)
		return (KORE_RESULT_ERROR);
	seg++;

	if (!percent_decode(seg, strlen(seg), 0, out, len, &n))
		return (KORE_RESULT_ERROR);

	return (idem_id_valid(out, n));
}

/*
 * The last segment of a path as an integer id (a payment's): decimal
 * digits without a sign or a leading zero, from 1 to 2^53-1, copied as
 * they are.
 */
int
idem_path_ref_parse(const char *path, char *out, size_t len)
{
	const char	*seg;
	u_int64_t	n;
	int		err;

	if ((seg = strrchr(path, '/')) == NULL)
		return (KORE_RESULT_ERROR);
	seg++;

	if (*seg < '1' || *seg > '9' || strlen(seg) > 16 ||
	    strspn(seg, "0123456789") != strlen(seg))
		return (KORE_RESULT_ERROR);

	n = kore_strtonum64(seg, 0, &err);
	if (err != KORE_RESULT_OK || n > (u_int64_t)IDEM_AMOUNT_MAX)
		return (KORE_RESULT_ERROR);

	return (kore_strlcpy(out, seg, len) < len);
}

/*
 * A query argument as a form encodes it (+ is a space, %XX the byte XX);
 * an identifier. The first of its name counts.
 */
int
idem_query_arg_parse(const char *query, const char *name, char *out,
    size_t len)
{
	const char	*p, *end, *eq;
	size_t		nlen, n;

	nlen = strlen(name);
	for (p = query; *p != '\0'; p = *end ? end + 1 : end) {
		if ((end = strchr(p, '&')) == NULL)
			end = p + strlen(p);
		eq = memchr(p, '=', (size_t)(end - p));
		if (eq == NULL || (size_t)(eq - p) != nlen ||
		    memcmp(p, name, nlen))
			continue;
		if (!percent_decode(eq + 1, (size_t)(end - eq - 1), 1, out, len,
		    &n))
			return (KORE_RESULT_ERROR);
		return (idem_id_valid(out, n));
	}

	return (KORE_RESULT_ERROR);
}

/*
 * PostgreSQL text cannot hold NUL; identifiers take no control characters.
 */
static int
text_valid(const char *s, size_t len, size_t min, size_t max, int strict)
{
	size_t		i;
	u_int8_t	ch;

	if (len < min || len > max)
		return (KORE_RESULT_ERROR);

	for (i = 0; i < len; i++) {
		ch = (u_int8_t)s[i];
		if (ch == 0 || (strict && (ch < 0x20 || ch == 0x7f)))
			return (KORE_RESULT_ERROR);
	}

	return (KORE_RESULT_OK);
}

/*
 * Decodes len bytes of s into out (NUL-terminated, its length in *n); a
 * % without two hex digits, or a result that does not fit, is an error.
 */
static int
percent_decode(const char *s, size_t len, int plus, char *out,
    size_t size, size_t *n)
{
	size_t		i, o;
	char		hex[3];

	hex[2] = '\0';
	for (i = o = 0; i < len; i++) {
		if (o + 1 >= size)
			return (KORE_RESULT_ERROR);
		if (s[i] == '+' && plus) {
			out[o++] = ' ';
			continue;
		}
		if (s[i] != '%') {
			out[o++] = s[i];
			continue;
		}
		if (i + 2 >= len)
			return (KORE_RESULT_ERROR);
		if (!isxdigit((unsigned char)s[i + 1]) ||
		    !isxdigit((unsigned char)s[i + 2]))
			return (KORE_RESULT_ERROR);
		hex[0] = s[i + 1];
		hex[1] = s[i + 2];
		out[o++] = (char)strtoul(hex, NULL, 16);
		i += 2;
	}

	out[o] = '\0';
	*n = o;

	return (KORE_RESULT_OK);
}

/* 1 to 255 visible ASCII characters (0x21 to 0x7e), as a key's. */
static int
token_valid(const char *s, size_t len)
{
	size_t		i;

	if (len < 1 || len > 255)
		return (0);

	for (i = 0; i < len; i++) {
		if (s[i] < 0x21 || s[i] > 0x7e)
			return (0);
	}

	return (1);
}
