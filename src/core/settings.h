/*
 * Settings of the service, read from the environment once at start.
 */

#ifndef __H_SETTINGS_H
#define __H_SETTINGS_H

#include <sys/types.h>

struct settings {
	char		*database_url;
	char		*host;
	char		*port;
	char		*provider_port;
	char		*provider_url;
	char		*public_url;
	char		*provider_kind;
	char		*provider_secret;
	u_int32_t	provider_timeout_ms;
	u_int32_t	provider_latency_ms;
	u_int32_t	lease_seconds;
	u_int32_t	retention_seconds;
	u_int32_t	cleanup_interval_seconds;
	u_int32_t	cleanup_batch;
	u_int32_t	recovery_after_seconds;
	u_int32_t	recovery_interval_seconds;
	u_int32_t	auth_cache_seconds;
	u_int32_t	db_timeout_ms;
	u_int32_t	recovery_backoff_seconds;
	u_int32_t	recovery_backoff_max_seconds;
	u_int32_t	replay_cache_seconds;
	u_int32_t	replay_cache_entries;
	u_int32_t	fake_keeps_5xx;
	u_int32_t	provider_settle_seconds;
	u_int32_t	provider_key_retention_seconds;
	u_int32_t	late_scan_after_seconds;
	int		loaded;
};

/* A number whose default is another part's (the provider's table). */
#define SETTING_UNSET	0xffffffffU

extern struct settings	settings;

void	settings_load(void);
void	settings_unload(void);

#endif
