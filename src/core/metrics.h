/*
 * Counters in memory shared by every worker of the process, so that
 * /metrics reports the sum over all of them.
 */

#ifndef __H_METRICS_H
#define __H_METRICS_H

#include <kore/kore.h>
#include <kore/http.h>

#define OUTCOME_CREATED		0
#define OUTCOME_REPLAYED	1
#define OUTCOME_IN_FLIGHT	2
#define OUTCOME_MISMATCH	3
#define OUTCOME_INVALID		4
#define OUTCOME_UNAUTHORIZED	5
#define OUTCOME_PROVIDER_ERROR	6
#define OUTCOME_DB_ERROR	7
#define OUTCOME_OK		8
#define OUTCOME_MAX		9

#define COUNTER_LEASE_TAKEOVERS		0
#define COUNTER_LEASE_FENCED		1
#define COUNTER_PAYMENTS_RECOVERED	2
#define COUNTER_CLEANUP_DELETED		3
#define COUNTER_DB_ERRORS		4
#define COUNTER_REPLAY_CACHE_HITS	5
#define COUNTER_LATE_OPERATIONS		6
#define COUNTER_MAX			7

void	metrics_init(void);
void	metrics_attach(void);
void	metrics_request(int, int, u_int64_t);
void	metrics_count(int, u_int64_t);
void	metrics_db_error(void);
void	metrics_standby_set(int);
int	metrics_standby(void);
int	metrics_serve(struct http_request *);
const char	*metrics_outcome_name(int);

#endif
