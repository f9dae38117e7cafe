/*
 * The transactional strategy, for operations inside this database.
 */

#ifndef __H_TRANSACTIONAL_H
#define __H_TRANSACTIONAL_H

#include <kore/kore.h>
#include <kore/http.h>

int	transactional_run(struct http_request *);

#endif
