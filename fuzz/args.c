/*
 * Fuzz target: the arguments of a read (src/core/idem_input.c): the last
 * segment of a path as an identifier (GET /v1/customers/{id}/...) or as a
 * payment id (GET /v1/payments/{id}), a query argument (customer_id=).
 *
 * The first byte picks the reader, the rest is the path or the query
 * string as Kore hands it over, a C string. Each reader takes exactly what
 * a second, plain reading of its rule takes, decoded the same way, and
 * never writes past the IDEM_ID_MAX + 1 bytes idem.c gives it.
 */

#include <sys/types.h>

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "idem.h"

#define OUT_LEN		(IDEM_ID_MAX + 1)

static int	expected_arg(const char *, size_t, int, char *);
static int	expected_ref(const char *, char *);
static int	expected_query(const char *, char *);
static int	hex(char);
static int	utf8_ok(const u_int8_t *, size_t);

int	LLVMFuzzerTestOneInput(const u_int8_t *, size_t);

int
LLVMFuzzerTestOneInput(const u_int8_t *data, size_t len)
{
	char		*value, *out, want[OUT_LEN];
	const char	*seg;
	int		ok, exp;

	if (len < 1)
		return (0);

	value = malloc(len);
	memcpy(value, data + 1, len - 1);
	value[len - 1] = '\0';
	out = malloc(OUT_LEN);

	switch (data[0] % 3) {
	case 0:
		ok = idem_path_arg_parse(value, out, OUT_LEN);
		seg = strrchr(value, '/');
		exp = seg != NULL &&
		    expected_arg(seg + 1, strlen(seg + 1), 0, want);
		break;
	case 1:
		ok = idem_path_ref_parse(value, out, OUT_LEN);
		exp = expected_ref(value, want);
		break;
	default:
		ok = idem_query_arg_parse(value, "customer_id", out, OUT_LEN);
		exp = expected_query(value, want);
		break;
	}

	if (ok != exp)
		FUZZ_FAIL("reader %d says %d for [%s]", data[0] % 3, ok, value);
	if (ok && strcmp(out, want))
		FUZZ_FAIL("[%s] read as [%s], not [%s]", value, out, want);

	free(out);
	free(value);

	return (0);
}

/*
 * An identifier percent-encoded in len bytes of s (+ a space when plus):
 * every %XX decoded, 1 to 128 bytes of UTF-8, none a control character or
 * NUL.
 */
static int
expected_arg(const char *s, size_t len, int plus, char *want)
{
	size_t		i, n;
	u_int8_t	ch;

	n = 0;
	for (i = 0; i < len; i++) {
		if (s[i] == '%') {
			if (i + 2 >= len || hex(s[i + 1]) < 0 ||
			    hex(s[i + 2]) < 0)
				return (0);
			ch = (u_int8_t)(hex(s[i + 1]) * 16 + hex(s[i + 2]));
			i += 2;
		} else if (s[i] == '+' && plus) {
			ch = ' ';
		} else {
			ch = (u_int8_t)s[i];
		}
		if (n == IDEM_ID_MAX || ch < 0x20 || ch == 0x7f)
			return (0);
		want[n++] = (char)ch;
	}
	want[n] = '\0';

	return (n > 0 && utf8_ok((const u_int8_t *)want, n));
}

/*
 * Well-formed UTF-8, decoded the long way: each sequence to its code
 * point, which must need that many bytes (no overlong form), lie at most
 * at U+10FFFF and not be a surrogate.
 */
static int
utf8_ok(const u_int8_t *s, size_t n)
{
	size_t		i, k, extra;
	u_int32_t	cp, min;

	for (i = 0; i < n; i += extra + 1) {
		if (s[i] < 0x80) {
			extra = 0;
			continue;
		}
		if ((s[i] & 0xe0) == 0xc0) {
			extra = 1;
			cp = s[i] & 0x1f;
			min = 0x80;
		} else if ((s[i] & 0xf0) == 0xe0) {
			extra = 2;
			cp = s[i] & 0x0f;
			min = 0x800;
		} else if ((s[i] & 0xf8) == 0xf0) {
			extra = 3;
			cp = s[i] & 0x07;
			min = 0x10000;
		} else {
			return (0);
		}
		if (n - i <= extra)
			return (0);
		for (k = 1; k <= extra; k++) {
			if ((s[i + k] & 0xc0) != 0x80)
				return (0);
			cp = (cp << 6) | (s[i + k] & 0x3f);
		}
		if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
			return (0);
	}

	return (1);
}

/* Digits from 1 to 2^53-1, no sign, no leading zero, copied as they are. */
static int
expected_ref(const char *path, char *want)
{
	const char	*seg, *p;
	size_t		len;

	if ((seg = strrchr(path, '/')) == NULL)
		return (0);
	seg++;

	for (p = seg; *p != '\0'; p++) {
		if (*p < '0' || *p > '9')
			return (0);
	}

	len = strlen(seg);
	if (len == 0 || seg[0] == '0' || len > 16 ||
	    (len == 16 && strcmp(seg, "9007199254740991") > 0))
		return (0);

	memcpy(want, seg, len + 1);

	return (1);
}

/* The first customer_id=... between &s. */
static int
expected_query(const char *query, char *want)
{
	const char	*p, *end;
	size_t		n;

	n = strlen("customer_id=");
	for (p = query; ; p = end + 1) {
		if ((end = strchr(p, '&')) == NULL)
			end = p + strlen(p);
		if ((size_t)(end - p) >= n && !memcmp(p, "customer_id=", n))
			return (expected_arg(p + n, (size_t)(end - p) - n, 1,
			    want));
		if (*end == '\0')
			return (0);
	}
}

static int
hex(char c)
{
	if (c >= '0' && c <= '9')
		return (c - '0');
	if (c >= 'a' && c <= 'f')
		return (c - 'a' + 10);
	if (c >= 'A' && c <= 'F')
		return (c - 'A' + 10);
	return (-1);
}
