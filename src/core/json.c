/*
 * A strict JSON parser and the canonical serialisation of the fingerprint.
 *
 * The canonical form is, byte for byte, what Python prints with
 * json.dumps(obj, sort_keys=True, separators=(",", ":"),
 * ensure_ascii=False): clients and tests can compute a fingerprint
 * without this service. Integers keep their literal digits (Python's
 * integers are unbounded), floats use Python's shortest repr.
 */

#include <sys/types.h>

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

/* Python refuses to convert integers longer than this many digits. */
#define JSON_NUMBER_LEN_MAX	4300

struct parser {
	const u_int8_t	*data;
	size_t		len;
	size_t		off;
	int		depth;
	char		*err;
	size_t		errlen;
};

static int	parse_value(struct parser *, struct json_value *);
static int	parse_object(struct parser *, struct json_value *);
static int	parse_array(struct parser *, struct json_value *);
static int	parse_string(struct parser *, char **, size_t *);
static int	parse_escape(struct parser *, struct kore_buf *);
static int	parse_hex4(struct parser *, u_int32_t *);
static int	parse_number(struct parser *, struct json_value *);
static int	parse_literal(struct parser *, struct json_value *);
static int	parse_fail(struct parser *, const char *, ...)
		    __attribute__((format (printf, 2, 3)));
static void	skip_space(struct parser *);
static size_t	utf8_length(const u_int8_t *, size_t);
static void	utf8_append(struct kore_buf *, u_int32_t);
static int	members_unique(struct json_value *);
static int	member_compare(const void *, const void *);
static int	member_compare_counted(const void *, const void *);
static void	append_number(struct kore_buf *, struct json_value *);
static void	append_float(struct kore_buf *, double);

static struct json_value	*value_new(void);

/* Member names compared by the last json_parse() (see dev.c). */
static u_int64_t		name_comparisons;

struct json_value *
json_parse(const u_int8_t *data, size_t len, char *err, size_t errlen)
{
	struct parser		p;
	struct json_value	*root;

	name_comparisons = 0;

	memset(&p, 0, sizeof(p));
	p.data = data;
	p.len = len;
	p.err = err;
	p.errlen = errlen;

	root = value_new();
	skip_space(&p);

	if (!parse_value(&p, root)) {
		json_free(root);
		return (NULL);
	}

	skip_space(&p);
	if (p.off != p.len) {
		(void)parse_fail(&p, "unexpected data after the JSON value");
		json_free(root);
		return (NULL);
	}

	return (root);
}

void
json_free(struct json_value *v)
{
	struct json_value	*c;

	if (v == NULL)
		return;

	while ((c = TAILQ_FIRST(&v->children)) != NULL) {
		TAILQ_REMOVE(&v->children, c, list);
		json_free(c);
	}

	kore_free(v->name);
	kore_free(v->str);
	kore_free(v);
}

struct json_value *
json_member(struct json_value *obj, const char *name)
{
	struct json_value	*c;
	size_t			len;

	if (obj == NULL || obj->type != JSON_OBJECT)
		return (NULL);

	len = strlen(name);
	TAILQ_FOREACH(c, &obj->children, list) {
		if (c->name_len == len && !memcmp(c->name, name, len))
			return (c);
	}

	return (NULL);
}

/*
 * How many member names the last json_parse() compared to find duplicates:
 * the dev build reports it, so that a test can tell O(n log n) from O(n^2)
 * without a clock.
 */
u_int64_t
json_parse_comparisons(void)
{
	return (name_comparisons);
}

int
json_int64(struct json_value *v, int64_t *out)
{
	long long	n;
	char		*end;

	if (v == NULL || v->type != JSON_NUMBER || !v->integer)
		return (KORE_RESULT_ERROR);

	errno = 0;
	n = strtoll(v->str, &end, 10);
	if (errno != 0 || *end != '\0')
		return (KORE_RESULT_ERROR);

	*out = n;
	return (KORE_RESULT_OK);
}

void
json_canonical(struct kore_buf *buf, struct json_value *v)
{
	struct json_value	*c, **members;
	size_t			i;

	switch (v->type) {
	case JSON_NULL:
		kore_buf_append(buf, "null", 4);
		break;
	case JSON_FALSE:
		kore_buf_append(buf, "false", 5);
		break;
	case JSON_TRUE:
		kore_buf_append(buf, "true", 4);
		break;
	case JSON_NUMBER:
		append_number(buf, v);
		break;
	case JSON_STRING:
		json_append_string(buf, v->str, v->len);
		break;
	case JSON_ARRAY:
		kore_buf_append(buf, "[", 1);
		TAILQ_FOREACH(c, &v->children, list) {
			if (c != TAILQ_FIRST(&v->children))
				kore_buf_append(buf, ",", 1);
			json_canonical(buf, c);
		}
		kore_buf_append(buf, "]", 1);
		break;
	case JSON_OBJECT:
		members = kore_calloc(v->count + 1, sizeof(*members));
		i = 0;
		TAILQ_FOREACH(c, &v->children, list)
			members[i++] = c;
		json_canonical_members(buf, members, i);
		kore_free(members);
		break;
	default:
		fatal("%s: unknown JSON type %d", __func__, v->type);
	}
}

/*
 * Prints an object made of the given members, sorted by name. Comparing
 * UTF-8 bytes orders names by code point, as Python sorts its strings.
 */
void
json_canonical_members(struct kore_buf *buf, struct json_value **members,
    size_t n)
{
	size_t		i;

	qsort(members, n, sizeof(*members), member_compare);

	kore_buf_append(buf, "{", 1);
	for (i = 0; i < n; i++) {
		if (i > 0)
			kore_buf_append(buf, ",", 1);
		json_append_string(buf, members[i]->name, members[i]->name_len);
		kore_buf_append(buf, ":", 1);
		json_canonical(buf, members[i]);
	}
	kore_buf_append(buf, "}", 1);
}

/*
 * Python's ensure_ascii=False escaping: quote, backslash and the C0
 * controls only; everything else is copied as UTF-8.
 */
void
json_append_string(struct kore_buf *buf, const char *s, size_t len)
{
	size_t		i, run;
	u_int8_t	ch;
	char		esc[8];

	kore_buf_append(buf, "\"", 1);

	run = 0;
	for (i = 0; i < len; i++) {
		ch = (u_int8_t)s[i];
		if (ch >= 0x20 && ch != '"' && ch != '\\')
			continue;

		kore_buf_append(buf, s + run, i - run);
		run = i + 1;

		switch (ch) {
		case '"':
			kore_buf_append(buf, "\\\"", 2);
			break;
		case '\\':
			kore_buf_append(buf, "\\\\", 2);
			break;
		case '\b':
			kore_buf_append(buf, "\\b", 2);
			break;
		case '\f':
			kore_buf_append(buf, "\\f", 2);
			break;
		case '\n':
			kore_buf_append(buf, "\\n", 2);
			break;
		case '\r':
			kore_buf_append(buf, "\\r", 2);
			break;
		case '\t':
			kore_buf_append(buf, "\\t", 2);
			break;
		default:
			(void)snprintf(esc, sizeof(esc), "\\u%04x", ch);
			kore_buf_append(buf, esc, 6);
			break;
		}
	}

	kore_buf_append(buf, s + run, len - run);
	kore_buf_append(buf, "\"", 1);
}

static struct json_value *
value_new(void)
{
	struct json_value	*v;

	v = kore_calloc(1, sizeof(*v));
	TAILQ_INIT(&v->children);

	return (v);
}

static int
parse_fail(struct parser *p, const char *fmt, ...)
{
	va_list		args;
	char		msg[JSON_ERROR_LEN];

	va_start(args, fmt);
	(void)vsnprintf(msg, sizeof(msg), fmt, args);
	va_end(args);

	(void)snprintf(p->err, p->errlen, "%s at byte %zu", msg, p->off);

	return (KORE_RESULT_ERROR);
}

static void
skip_space(struct parser *p)
{
	while (p->off < p->len) {
		switch (p->data[p->off]) {
		case ' ':
		case '\t':
		case '\n':
		case '\r':
			p->off++;
			break;
		default:
			return;
		}
	}
}

static int
parse_value(struct parser *p, struct json_value *v)
{
	if (p->off >= p->len)
		return (parse_fail(p, "unexpected end of JSON"));

	switch (p->data[p->off]) {
	case '{':
		return (parse_object(p, v));
	case '[':
		return (parse_array(p, v));
	case '"':
		v->type = JSON_STRING;
		return (parse_string(p, &v->str, &v->len));
	case 't':
	case 'f':
	case 'n':
		return (parse_literal(p, v));
	default:
		if (p->data[p->off] == '-' || isdigit(p->data[p->off]))
			return (parse_number(p, v));
		return (parse_fail(p, "unexpected character"));
	}
}

static int
parse_object(struct parser *p, struct json_value *v)
{
	struct json_value	*c;
	char			*name;
	size_t			name_len;

	if (++p->depth > JSON_DEPTH_MAX)
		return (parse_fail(p, "nested deeper than %d", JSON_DEPTH_MAX));

	v->type = JSON_OBJECT;
	p->off++;
	skip_space(p);

	if (p->off < p->len && p->data[p->off] == '}') {
		p->off++;
		p->depth--;
		return (KORE_RESULT_OK);
	}

	for (;;) {
		if (p->off >= p->len || p->data[p->off] != '"')
			return (parse_fail(p, "expected a member name"));

		if (!parse_string(p, &name, &name_len))
			return (KORE_RESULT_ERROR);

		c = value_new();
		c->name = name;
		c->name_len = name_len;
		TAILQ_INSERT_TAIL(&v->children, c, list);
		v->count++;

		skip_space(p);
		if (p->off >= p->len || p->data[p->off] != ':')
			return (parse_fail(p, "expected ':'"));
		p->off++;
		skip_space(p);

		if (!parse_value(p, c))
			return (KORE_RESULT_ERROR);

		skip_space(p);
		if (p->off >= p->len)
			return (parse_fail(p, "unexpected end of JSON"));

		if (p->data[p->off] == '}') {
			p->off++;
			break;
		}

		if (p->data[p->off] != ',')
			return (parse_fail(p, "expected ',' or '}'"));
		p->off++;
		skip_space(p);
	}

	if (!members_unique(v))
		return (parse_fail(p, "duplicate member name in the object"));

	p->depth--;
	return (KORE_RESULT_OK);
}

/*
 * True when no two members of the object share a name. Sorting the names
 * finds duplicates next to each other: O(n log n), where comparing each
 * new name with every earlier one took O(n^2), about 50 ms of a worker's
 * event loop for the 7,700 members that fit in a 64 KiB body.
 */
static int
members_unique(struct json_value *v)
{
	struct json_value	*c, **members;
	size_t			i;
	int			unique;

	if (v->count < 2)
		return (KORE_RESULT_OK);

	members = kore_calloc(v->count, sizeof(*members));
	i = 0;
	TAILQ_FOREACH(c, &v->children, list)
		members[i++] = c;

	qsort(members, v->count, sizeof(*members), member_compare_counted);

	unique = KORE_RESULT_OK;
	for (i = 1; i < v->count; i++) {
		if (member_compare_counted(&members[i - 1], &members[i]) == 0) {
			unique = KORE_RESULT_ERROR;
			break;
		}
	}

	kore_free(members);

	return (unique);
}

static int
parse_array(struct parser *p, struct json_value *v)
{
	struct json_value	*c;

	if (++p->depth > JSON_DEPTH_MAX)
		return (parse_fail(p, "nested deeper than %d", JSON_DEPTH_MAX));

	v->type = JSON_ARRAY;
	p->off++;
	skip_space(p);

	if (p->off < p->len && p->data[p->off] == ']') {
		p->off++;
		p->depth--;
		return (KORE_RESULT_OK);
	}

	for (;;) {
		c = value_new();
		TAILQ_INSERT_TAIL(&v->children, c, list);
		v->count++;

		if (!parse_value(p, c))
			return (KORE_RESULT_ERROR);

		skip_space(p);
		if (p->off >= p->len)
			return (parse_fail(p, "unexpected end of JSON"));

		if (p->data[p->off] == ']') {
			p->off++;
			break;
		}

		if (p->data[p->off] != ',')
			return (parse_fail(p, "expected ',' or ']'"));
		p->off++;
		skip_space(p);
	}

	p->depth--;
	return (KORE_RESULT_OK);
}

/*
 * The string is decoded into one buffer as long as its raw bytes, which
 * it never outgrows (an escape shrinks, UTF-8 is copied). Kore grows a
 * buffer by exactly what is appended, moving it each time: appending
 * escape by escape into a small buffer was quadratic, 50 to 95 ms of a
 * worker for a 64 KiB string of "\n" or "a\n".
 */
static int
parse_string(struct parser *p, char **out, size_t *outlen)
{
	struct kore_buf		buf;
	size_t			n, start, end;
	u_int8_t		ch;

	end = p->off + 1;
	while (end < p->len && p->data[end] != '"')
		end += p->data[end] == '\\' ? 2 : 1;
	if (end > p->len)
		end = p->len;

	kore_buf_init(&buf, end - p->off);
	p->off++;

	for (;;) {
		if (p->off >= p->len) {
			kore_buf_cleanup(&buf);
			return (parse_fail(p, "unterminated string"));
		}

		ch = p->data[p->off];
		if (ch == '"') {
			p->off++;
			break;
		}

		if (ch == '\\') {
			if (!parse_escape(p, &buf)) {
				kore_buf_cleanup(&buf);
				return (KORE_RESULT_ERROR);
			}
			continue;
		}

		if (ch < 0x20) {
			kore_buf_cleanup(&buf);
			return (parse_fail(p, "control character in string"));
		}

		start = p->off;
		while (p->off < p->len) {
			ch = p->data[p->off];
			if (ch == '"' || ch == '\\' || ch < 0x20)
				break;
			if (ch < 0x80) {
				p->off++;
				continue;
			}
			n = utf8_length(p->data + p->off, p->len - p->off);
			if (n == 0) {
				kore_buf_cleanup(&buf);
				return (parse_fail(p, "invalid UTF-8"));
			}
			p->off += n;
		}
		kore_buf_append(&buf, p->data + start, p->off - start);
	}

	*outlen = buf.offset;
	*out = kore_malloc(buf.offset + 1);
	memcpy(*out, buf.data, buf.offset);
	(*out)[buf.offset] = '\0';
	kore_buf_cleanup(&buf);

	return (KORE_RESULT_OK);
}

static int
parse_escape(struct parser *p, struct kore_buf *buf)
{
	u_int32_t	cp, low;
	char		ch;

	if (p->off + 1 >= p->len)
		return (parse_fail(p, "unterminated escape"));

	p->off++;
	switch (p->data[p->off++]) {
	case '"':
		ch = '"';
		break;
	case '\\':
		ch = '\\';
		break;
	case '/':
		ch = '/';
		break;
	case 'b':
		ch = '\b';
		break;
	case 'f':
		ch = '\f';
		break;
	case 'n':
		ch = '\n';
		break;
	case 'r':
		ch = '\r';
		break;
	case 't':
		ch = '\t';
		break;
	case 'u':
		if (!parse_hex4(p, &cp))
			return (KORE_RESULT_ERROR);
		if (cp >= 0xdc00 && cp <= 0xdfff)
			return (parse_fail(p, "lone low surrogate"));
		if (cp >= 0xd800 && cp <= 0xdbff) {
			if (p->off + 1 >= p->len || p->data[p->off] != '\\' ||
			    p->data[p->off + 1] != 'u')
				return (parse_fail(p, "lone high surrogate"));
			p->off += 2;
			if (!parse_hex4(p, &low))
				return (KORE_RESULT_ERROR);
			if (low < 0xdc00 || low > 0xdfff)
				return (parse_fail(p, "lone high surrogate"));
			cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
		}
		utf8_append(buf, cp);
		return (KORE_RESULT_OK);
	default:
		return (parse_fail(p, "invalid escape"));
	}

	kore_buf_append(buf, &ch, 1);
	return (KORE_RESULT_OK);
}

static int
parse_hex4(struct parser *p, u_int32_t *cp)
{
	int		i;
	u_int8_t	ch;

	if (p->len - p->off < 4)
		return (parse_fail(p, "short \\u escape"));

	*cp = 0;
	for (i = 0; i < 4; i++) {
		ch = p->data[p->off++];
		*cp <<= 4;
		if (ch >= '0' && ch <= '9')
			*cp |= ch - '0';
		else if (ch >= 'a' && ch <= 'f')
			*cp |= ch - 'a' + 10;
		else if (ch >= 'A' && ch <= 'F')
			*cp |= ch - 'A' + 10;
		else
			return (parse_fail(p, "invalid \\u escape"));
	}

	return (KORE_RESULT_OK);
}

static int
parse_number(struct parser *p, struct json_value *v)
{
	size_t		start, len;
	double		d;

	start = p->off;
	v->type = JSON_NUMBER;
	v->integer = 1;

	if (p->data[p->off] == '-')
		p->off++;

	if (p->off >= p->len || !isdigit(p->data[p->off]))
		return (parse_fail(p, "invalid number"));

	if (p->data[p->off] == '0') {
		p->off++;
	} else {
		while (p->off < p->len && isdigit(p->data[p->off]))
			p->off++;
	}

	if (p->off < p->len && p->data[p->off] == '.') {
		v->integer = 0;
		p->off++;
		if (p->off >= p->len || !isdigit(p->data[p->off]))
			return (parse_fail(p, "invalid number"));
		while (p->off < p->len && isdigit(p->data[p->off]))
			p->off++;
	}

	if (p->off < p->len &&
	    (p->data[p->off] == 'e' || p->data[p->off] == 'E')) {
		v->integer = 0;
		p->off++;
		if (p->off < p->len &&
		    (p->data[p->off] == '+' || p->data[p->off] == '-'))
			p->off++;
		if (p->off >= p->len || !isdigit(p->data[p->off]))
			return (parse_fail(p, "invalid number"));
		while (p->off < p->len && isdigit(p->data[p->off]))
			p->off++;
	}

	len = p->off - start;
	if (len > JSON_NUMBER_LEN_MAX)
		return (parse_fail(p, "number too long"));

	v->str = kore_malloc(len + 1);
	memcpy(v->str, p->data + start, len);
	v->str[len] = '\0';
	v->len = len;

	if (!v->integer) {
		d = strtod(v->str, NULL);
		if (!isfinite(d))
			return (parse_fail(p, "number out of range"));
	}

	return (KORE_RESULT_OK);
}

static int
parse_literal(struct parser *p, struct json_value *v)
{
	size_t		i;
	static const struct {
		const char	*text;
		int		type;
	} literals[] = {
		{ "null",	JSON_NULL },
		{ "false",	JSON_FALSE },
		{ "true",	JSON_TRUE },
	};

	for (i = 0; i < sizeof(literals) / sizeof(literals[0]); i++) {
		if (p->len - p->off >= strlen(literals[i].text) &&
		    !memcmp(p->data + p->off, literals[i].text,
		    strlen(literals[i].text))) {
			v->type = literals[i].type;
			p->off += strlen(literals[i].text);
			return (KORE_RESULT_OK);
		}
	}

	return (parse_fail(p, "invalid literal"));
}

/*
 * True when the len bytes at s are well-formed UTF-8 (what PostgreSQL
 * takes as text): a value that did not come through the parser, such as
 * a percent-decoded path segment.
 */
int
json_utf8_valid(const char *s, size_t len)
{
	const u_int8_t	*p = (const u_int8_t *)s;
	size_t		i, n;

	for (i = 0; i < len; i += n) {
		if (p[i] < 0x80) {
			n = 1;
			continue;
		}
		if ((n = utf8_length(p + i, len - i)) == 0)
			return (KORE_RESULT_ERROR);
	}

	return (KORE_RESULT_OK);
}

/*
 * Length of the well-formed UTF-8 sequence at s, or 0. Overlong forms,
 * encoded surrogates and code points past U+10FFFF are not well formed.
 */
static size_t
utf8_length(const u_int8_t *s, size_t len)
{
	size_t		n, i;
	u_int8_t	lo, hi;

	lo = 0x80;
	hi = 0xbf;

	if (s[0] >= 0xc2 && s[0] <= 0xdf) {
		n = 2;
	} else if (s[0] >= 0xe0 && s[0] <= 0xef) {
		n = 3;
		if (s[0] == 0xe0)
			lo = 0xa0;
		else if (s[0] == 0xed)
			hi = 0x9f;
	} else if (s[0] >= 0xf0 && s[0] <= 0xf4) {
		n = 4;
		if (s[0] == 0xf0)
			lo = 0x90;
		else if (s[0] == 0xf4)
			hi = 0x8f;
	} else {
		return (0);
	}

	if (len < n || s[1] < lo || s[1] > hi)
		return (0);

	for (i = 2; i < n; i++) {
		if (s[i] < 0x80 || s[i] > 0xbf)
			return (0);
	}

	return (n);
}

static void
utf8_append(struct kore_buf *buf, u_int32_t cp)
{
	u_int8_t	out[4];
	size_t		n;

	if (cp < 0x80) {
		out[0] = cp;
		n = 1;
	} else if (cp < 0x800) {
		out[0] = 0xc0 | (cp >> 6);
		out[1] = 0x80 | (cp & 0x3f);
		n = 2;
	} else if (cp < 0x10000) {
		out[0] = 0xe0 | (cp >> 12);
		out[1] = 0x80 | ((cp >> 6) & 0x3f);
		out[2] = 0x80 | (cp & 0x3f);
		n = 3;
	} else {
		out[0] = 0xf0 | (cp >> 18);
		out[1] = 0x80 | ((cp >> 12) & 0x3f);
		out[2] = 0x80 | ((cp >> 6) & 0x3f);
		out[3] = 0x80 | (cp & 0x3f);
		n = 4;
	}

	kore_buf_append(buf, out, n);
}

static int
member_compare(const void *a, const void *b)
{
	const struct json_value		*x, *y;
	size_t				len;
	int				r;

	x = *(struct json_value * const *)a;
	y = *(struct json_value * const *)b;

	len = x->name_len < y->name_len ? x->name_len : y->name_len;
	if ((r = memcmp(x->name, y->name, len)) != 0)
		return (r);

	if (x->name_len == y->name_len)
		return (0);

	return (x->name_len < y->name_len ? -1 : 1);
}

static int
member_compare_counted(const void *a, const void *b)
{
	name_comparisons++;

	return (member_compare(a, b));
}

static void
append_number(struct kore_buf *buf, struct json_value *v)
{
	if (!v->integer) {
		append_float(buf, strtod(v->str, NULL));
		return;
	}

	/* Python reads -0 as the integer 0. */
	if (!strcmp(v->str, "-0"))
		kore_buf_append(buf, "0", 1);
	else
		kore_buf_append(buf, v->str, v->len);
}

/*
 * Python's repr() of a float: the shortest digits that read back as the
 * same double, in positional notation when the decimal point falls
 * within -4 < exponent <= 16, else as d.ddde+XX.
 */
static void
append_float(struct kore_buf *buf, double d)
{
	char		tmp[40], digits[20], *p, *e;
	int		prec, exp, decpt, ndigits, i;

	for (prec = 1; prec <= 17; prec++) {
		(void)snprintf(tmp, sizeof(tmp), "%.*e", prec - 1, d);
		if (strtod(tmp, NULL) == d)
			break;
	}

	p = tmp;
	if (*p == '-') {
		kore_buf_append(buf, "-", 1);
		p++;
	}

	ndigits = 0;
	for (; *p != 'e'; p++) {
		if (isdigit((unsigned char)*p))
			digits[ndigits++] = *p;
	}
	exp = (int)strtol(p + 1, &e, 10);

	while (ndigits > 1 && digits[ndigits - 1] == '0')
		ndigits--;

	decpt = exp + 1;

	if (decpt > -4 && decpt <= 16) {
		if (decpt <= 0) {
			kore_buf_append(buf, "0.", 2);
			for (i = decpt; i < 0; i++)
				kore_buf_append(buf, "0", 1);
			kore_buf_append(buf, digits, ndigits);
		} else if (decpt >= ndigits) {
			kore_buf_append(buf, digits, ndigits);
			for (i = ndigits; i < decpt; i++)
				kore_buf_append(buf, "0", 1);
			kore_buf_append(buf, ".0", 2);
		} else {
			kore_buf_append(buf, digits, decpt);
			kore_buf_append(buf, ".", 1);
			kore_buf_append(buf, digits + decpt, ndigits - decpt);
		}
		return;
	}

	kore_buf_append(buf, digits, 1);
	if (ndigits > 1) {
		kore_buf_append(buf, ".", 1);
		kore_buf_append(buf, digits + 1, ndigits - 1);
	}
	kore_buf_appendf(buf, "e%c%02d", exp < 0 ? '-' : '+', abs(exp));
}
