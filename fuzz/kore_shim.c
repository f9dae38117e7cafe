/*
 * The few functions of Kore's runtime the parsers under fuzz call, with
 * Kore 4.1's behaviour (src/mem.c, src/buf.c, src/utils.c), so that a
 * target links the service's own .c files without Kore.
 *
 * Where Kore pools memory, this shim asks the C library for exactly the
 * bytes requested: AddressSanitizer then sees a read one byte past an
 * allocation, which Kore's rounded-up blocks would hide.
 */

#include <sys/types.h>

#include <errno.h>
#include <malloc.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kore/kore.h>

#include "fuzz.h"

void
fatal(const char *fmt, ...)
{
	va_list		args;

	va_start(args, fmt);
	(void)vfprintf(stderr, fmt, args);
	va_end(args);
	(void)fprintf(stderr, "\n");

	/* A fatal() in a worker is a crash: the fuzzer reports it as one. */
	abort();
}

void
kore_log(int prio, const char *fmt, ...)
{
	(void)prio;
	(void)fmt;
}

void *
kore_malloc(size_t len)
{
	void		*p;

	if ((p = malloc(len)) == NULL)
		fatal("kore_malloc(%zu): %d", len, errno);

	return (p);
}

void *
kore_calloc(size_t memb, size_t len)
{
	void		*p;

	/* Kore divides SIZE_MAX by memb: a zero is a SIGFPE there. */
	if (memb == 0)
		fatal("kore_calloc(0, %zu): a division by zero in Kore", len);
	if (SIZE_MAX / memb < len)
		fatal("kore_calloc(): memb * len > SIZE_MAX");

	p = kore_malloc(memb * len);
	memset(p, 0, memb * len);

	return (p);
}

/* Bytes kore_realloc() copied, for a target to tell linear from not. */
size_t		kore_shim_moved;

/*
 * Kore moves a block whenever its size changes; so does this, which makes
 * a pointer kept into the old block a use after free that ASan reports,
 * and the copying it costs countable.
 */
void *
kore_realloc(void *ptr, size_t len)
{
	void		*p;
	size_t		old, n;

	if (ptr == NULL)
		return (kore_malloc(len));

	if ((old = malloc_usable_size(ptr)) == len)
		return (ptr);

	n = old < len ? old : len;
	p = kore_malloc(len);
	memcpy(p, ptr, n);
	free(ptr);
	kore_shim_moved += n;

	return (p);
}

void
kore_free(void *ptr)
{
	free(ptr);
}

char *
kore_strdup(const char *str)
{
	size_t		len;
	char		*p;

	len = strlen(str) + 1;
	p = kore_malloc(len);
	memcpy(p, str, len);

	return (p);
}

size_t
kore_strlcpy(char *dst, const char *src, const size_t len)
{
	size_t		n;

	if (len == 0)
		fatal("kore_strlcpy: len == 0");

	n = strlen(src);
	if (n < len) {
		memcpy(dst, src, n + 1);
	} else {
		memcpy(dst, src, len - 1);
		dst[len - 1] = '\0';
	}

	return (n);
}

/*
 * Kore's: the whole string as a decimal number, unsigned (no minus sign)
 * unless sign; anything else, or out of range, is an error.
 */
u_int64_t
kore_strtonum64(const char *str, int sign, int *err)
{
	u_int64_t	l;
	char		*ep;

	errno = 0;
	if (sign)
		l = (u_int64_t)strtoll(str, &ep, 10);
	else
		l = strtoull(str, &ep, 10);

	if (errno == ERANGE || ep == str || *ep != '\0' ||
	    (!sign && strchr(str, '-') != NULL)) {
		*err = KORE_RESULT_ERROR;
		return (0);
	}

	*err = KORE_RESULT_OK;
	return (l);
}

void
kore_buf_init(struct kore_buf *buf, size_t initial)
{
	buf->data = initial > 0 ? kore_malloc(initial) : NULL;
	buf->length = initial;
	buf->offset = 0;
	buf->flags = 0;
}

struct kore_buf *
kore_buf_alloc(size_t initial)
{
	struct kore_buf		*buf;

	buf = kore_malloc(sizeof(*buf));
	kore_buf_init(buf, initial);
	buf->flags = KORE_BUF_OWNER_API;

	return (buf);
}

void
kore_buf_cleanup(struct kore_buf *buf)
{
	kore_free(buf->data);
	buf->data = NULL;
	buf->offset = 0;
	buf->length = 0;
}

void
kore_buf_free(struct kore_buf *buf)
{
	kore_buf_cleanup(buf);
	if (buf->flags & KORE_BUF_OWNER_API)
		kore_free(buf);
}

void
kore_buf_reset(struct kore_buf *buf)
{
	buf->offset = 0;
}

/* Kore grows a buffer by exactly what is appended. */
void
kore_buf_append(struct kore_buf *buf, const void *data, size_t len)
{
	if (buf->offset + len < len)
		fatal("overflow in kore_buf_append");

	if (buf->offset + len > buf->length) {
		buf->length += len;
		buf->data = kore_realloc(buf->data, buf->length);
	}

	memcpy(buf->data + buf->offset, data, len);
	buf->offset += len;
}

void
kore_buf_appendv(struct kore_buf *buf, const char *fmt, va_list args)
{
	char		*b;
	int		l;

	if ((l = vasprintf(&b, fmt, args)) == -1)
		fatal("kore_buf_appendv(): vasprintf error");

	kore_buf_append(buf, b, (size_t)l);
	free(b);
}

void
kore_buf_appendf(struct kore_buf *buf, const char *fmt, ...)
{
	va_list		args;

	va_start(args, fmt);
	kore_buf_appendv(buf, fmt, args);
	va_end(args);
}

char *
kore_buf_stringify(struct kore_buf *buf, size_t *len)
{
	char		c;

	if (len != NULL)
		*len = buf->offset;

	c = '\0';
	kore_buf_append(buf, &c, sizeof(c));

	return ((char *)buf->data);
}
