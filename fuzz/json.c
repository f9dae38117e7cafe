/*
 * Fuzz target: the strict JSON parser and the canonical printer
 * (src/core/json.c), which read every request body and every answer of
 * the provider.
 *
 * Any input is refused with a message, or parses. What parses has a
 * canonical form (the fingerprint's) that parses back to the same value
 * and prints to itself, byte for byte: a client that sends the canonical
 * form of its body gets the fingerprint of the body. json_int64() and
 * json_member() agree with the tree. Parsing copies no more than the
 * input's size in buffers that grow.
 */

#include <sys/types.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "json.h"

static int	same_value(struct json_value *, struct json_value *);
static int	same_number(struct json_value *, struct json_value *);
static void	check_tree(struct json_value *);
static int	int64_literal(const char *);

int	LLVMFuzzerTestOneInput(const u_int8_t *, size_t);

int
LLVMFuzzerTestOneInput(const u_int8_t *data, size_t len)
{
	struct json_value	*v, *w;
	struct kore_buf		first, second;
	char			err[JSON_ERROR_LEN];

	memset(err, 'x', sizeof(err));
	kore_shim_moved = 0;
	v = json_parse(data, len, err, sizeof(err));

	/*
	 * Kore moves a growing buffer each time: a parser that grows one
	 * piece by piece copies quadratically (as parse_string() did, 50 ms
	 * and more of a worker for a 64 KiB body of escapes).
	 */
	if (kore_shim_moved > len)
		FUZZ_FAIL("parsing %zu bytes copied %zu", len, kore_shim_moved);

	if (v == NULL) {
		/* A refusal says why, in a terminated message. */
		if (memchr(err, '\0', sizeof(err)) == NULL || err[0] == '\0')
			FUZZ_FAIL("refused without a message");
		return (0);
	}

	check_tree(v);

	/*
	 * Room for the canonical form up front (at most about 5 times the
	 * input: "9e15" prints as "9000000000000000.0"): a buffer Kore grows
	 * append by append is moved each time, which made this target spend
	 * most of its time copying.
	 */
	kore_buf_init(&first, 8 * len + 64);
	json_canonical(&first, v);

	if ((w = json_parse(first.data, first.offset, err,
	    sizeof(err))) == NULL) {
		FUZZ_FAIL("the canonical form does not parse (%s): %.*s", err,
		    (int)first.offset, first.data);
	}

	if (!same_value(v, w)) {
		FUZZ_FAIL("the canonical form is another value: %.*s",
		    (int)first.offset, first.data);
	}

	kore_buf_init(&second, first.offset + 64);
	json_canonical(&second, w);

	if (first.offset != second.offset ||
	    memcmp(first.data, second.data, first.offset)) {
		FUZZ_FAIL("the canonical form is not canonical: %.*s -> %.*s",
		    (int)first.offset, first.data,
		    (int)second.offset, second.data);
	}

	kore_buf_cleanup(&first);
	kore_buf_cleanup(&second);
	json_free(v);
	json_free(w);

	return (0);
}

/*
 * The same JSON value: objects compared member by member whatever their
 * order, numbers by their value (the canonical form rewrites 1.50 as 1.5
 * and -0 as 0, and keeps an integer an integer).
 */
static int
same_value(struct json_value *a, struct json_value *b)
{
	struct json_value	*c, *d;

	if (a->type != b->type || a->count != b->count)
		return (0);

	switch (a->type) {
	case JSON_NULL:
	case JSON_FALSE:
	case JSON_TRUE:
		return (1);
	case JSON_NUMBER:
		return (same_number(a, b));
	case JSON_STRING:
		return (a->len == b->len && !memcmp(a->str, b->str, a->len));
	case JSON_ARRAY:
		d = TAILQ_FIRST(&b->children);
		TAILQ_FOREACH(c, &a->children, list) {
			if (d == NULL || !same_value(c, d))
				return (0);
			d = TAILQ_NEXT(d, list);
		}
		return (d == NULL);
	case JSON_OBJECT:
		/* Names are unique (the parser refuses duplicates). */
		TAILQ_FOREACH(c, &a->children, list) {
			TAILQ_FOREACH(d, &b->children, list) {
				if (c->name_len == d->name_len &&
				    !memcmp(c->name, d->name, c->name_len))
					break;
			}
			if (d == NULL || !same_value(c, d))
				return (0);
		}
		return (1);
	default:
		FUZZ_FAIL("unknown type %d", a->type);
	}
}

static int
same_number(struct json_value *a, struct json_value *b)
{
	const char	*x, *y;
	double		dx, dy;

	if (a->integer != b->integer)
		return (0);

	if (a->integer) {
		/* Integers are unbounded: compare digits, -0 being 0. */
		x = strcmp(a->str, "-0") ? a->str : "0";
		y = strcmp(b->str, "-0") ? b->str : "0";
		return (!strcmp(x, y));
	}

	dx = strtod(a->str, NULL);
	dy = strtod(b->str, NULL);

	/* The same double, the sign of a zero included. */
	return (dx == dy && signbit(dx) == signbit(dy));
}

/*
 * Every node: a number's literal is what the parser took, json_int64()
 * reads exactly the integers that fit, json_member() finds each member
 * whose name it can be asked for (a C string, so no NUL in it).
 */
static void
check_tree(struct json_value *v)
{
	struct json_value	*c;
	int64_t			n;
	char			text[32];
	size_t			count;

	if (v->type == JSON_NUMBER) {
		if (v->str == NULL || strlen(v->str) != v->len)
			FUZZ_FAIL("a number without its literal");
		if (json_int64(v, &n) != (v->integer && int64_literal(v->str)))
			FUZZ_FAIL("json_int64 disagrees on %s", v->str);
		if (v->integer && int64_literal(v->str)) {
			(void)snprintf(text, sizeof(text), "%lld",
			    (long long)n);
			if (strcmp(text, strcmp(v->str, "-0") ? v->str : "0"))
				FUZZ_FAIL("json_int64 read %s as %s", v->str,
				    text);
		}
	}

	count = 0;
	TAILQ_FOREACH(c, &v->children, list) {
		count++;
		if (v->type == JSON_OBJECT && c->name == NULL)
			FUZZ_FAIL("a member without a name");
		if (v->type == JSON_OBJECT && strlen(c->name) == c->name_len &&
		    json_member(v, c->name) != c)
			FUZZ_FAIL("json_member misses member %s", c->name);
		check_tree(c);
	}

	if (count != v->count)
		FUZZ_FAIL("count %zu for %zu children", v->count, count);
}

/*
 * Whether a JSON integer literal (no leading zero, maybe a minus) fits in
 * an int64_t, by its digits alone.
 */
static int
int64_literal(const char *s)
{
	const char	*max;
	size_t		len;

	max = "9223372036854775807";
	if (*s == '-') {
		max = "9223372036854775808";
		s++;
	}

	len = strlen(s);
	if (len != strlen(max))
		return (len < strlen(max));

	return (strcmp(s, max) <= 0);
}
