/*
 * The sanitizer build (make test-sanitize) only: Kore's own pools serve
 * allocations up to 8 KiB from memory AddressSanitizer cannot see into,
 * so the module's own allocations, which the module alone frees, go to the
 * system allocator, where ASan watches every byte. Included before every
 * source file by the sanitize flavor's cflags (-include).
 */

#ifndef __H_SANITIZE_H
#define __H_SANITIZE_H

#if defined(IDEM_SANITIZE)

#include <sys/types.h>

/* Object-like, so that a pointer to kore_free is renamed too. */
#define kore_malloc	idem_sanitize_malloc
#define kore_calloc	idem_sanitize_calloc
#define kore_realloc	idem_sanitize_realloc
#define kore_strdup	idem_sanitize_strdup
#define kore_free	idem_sanitize_free

void	*idem_sanitize_malloc(size_t);
void	*idem_sanitize_calloc(size_t, size_t);
void	*idem_sanitize_realloc(void *, size_t);
char	*idem_sanitize_strdup(const char *);
void	idem_sanitize_free(void *);

#endif

#endif
