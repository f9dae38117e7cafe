/*
 * The sanitizer build's allocator (see sanitize.h), the options of
 * UndefinedBehaviorSanitizer, which reads UBSAN_OPTIONS only after Kore
 * has overwritten the environment with the process titles. The syscalls
 * the sanitizers need are allowed in app.c.
 */

#if defined(IDEM_SANITIZE)

#include <sys/types.h>

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <string.h>

#include <kore/kore.h>

const char	*__ubsan_default_options(void);
void		kore_worker_teardown(void);


const char *
__ubsan_default_options(void)
{
	return ("print_stacktrace=1:symbolize=0:report_error_type=1");
}

/*
 * Under the sanitizers' runtime a worker's exit() can hang in a library's
 * destructor (p11-kit, on glibc's locale lock); a stopping worker has
 * nothing left to flush but stdout.
 */
void
kore_worker_teardown(void)
{
	fflush(stdout);
	_exit(0);
}

void *
idem_sanitize_malloc(size_t len)
{
	void	*p;

	if ((p = malloc(len)) == NULL)
		fatal("%s: out of memory", __func__);
	return (p);
}

void *
idem_sanitize_calloc(size_t n, size_t len)
{
	void	*p;

	if ((p = calloc(n, len)) == NULL)
		fatal("%s: out of memory", __func__);
	return (p);
}

void *
idem_sanitize_realloc(void *ptr, size_t len)
{
	void	*p;

	if ((p = realloc(ptr, len)) == NULL)
		fatal("%s: out of memory", __func__);
	return (p);
}

char *
idem_sanitize_strdup(const char *s)
{
	char	*p;

	if ((p = strdup(s)) == NULL)
		fatal("%s: out of memory", __func__);
	return (p);
}

void
idem_sanitize_free(void *p)
{
	free(p);
}

#endif
