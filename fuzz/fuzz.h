/*
 * What the fuzz targets share: a failed check is a crash, so that
 * libFuzzer saves the input that broke the rule and stops.
 */

#ifndef __H_FUZZ_H
#define __H_FUZZ_H

#include <sys/types.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

/* Bytes the shim's kore_realloc() copied (kore_shim.c). */
extern size_t		kore_shim_moved;

#define FUZZ_FAIL(...)		fuzz_fail(__FILE__, __LINE__, __VA_ARGS__)

static inline void	fuzz_fail(const char *, int, const char *, ...)
			    __attribute__((noreturn, format (printf, 3, 4)));

static inline void
fuzz_fail(const char *file, int line, const char *fmt, ...)
{
	va_list		args;

	(void)fprintf(stderr, "FUZZ CHECK FAILED at %s:%d: ", file, line);
	va_start(args, fmt);
	(void)vfprintf(stderr, fmt, args);
	va_end(args);
	(void)fprintf(stderr, "\n");

	abort();
}

#endif
