/*
 * Every setting, its environment variable and its default live here, and
 * are checked before the workers start: a bad value stops the service with
 * a message that names the variable.
 */

#include <sys/types.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kore/kore.h>

#include "settings.h"

/* URLs the service builds others on stay well inside its buffers. */
#define SETTINGS_URL_MAX	256
#define SETTINGS_TEXT_MAX	4096

#define EMBEDDED_DATABASE_URL						\
	"host=127.0.0.1 port=54329 dbname=idem user=idem "		\
	"sslmode=disable gssencmode=disable connect_timeout=3"

struct number_setting {
	const char	*name;
	u_int32_t	*value;
	u_int32_t	def;
	u_int32_t	min;
	u_int32_t	max;
};

struct text_setting {
	const char	*name;
	char		**value;
	const char	*def;
	size_t		max;
};

struct settings		settings;

static void	load_number(const struct number_setting *);
static void	load_text(const struct text_setting *);
static void	check_port(const char *, const char *);
static void	check_url(const char *, const char *);

static const struct number_setting	numbers[] = {
	{ "IDEM_PROVIDER_TIMEOUT_MS", &settings.provider_timeout_ms,
	    10000, 1, 600000 },
	{ "IDEM_PROVIDER_LATENCY_MS", &settings.provider_latency_ms,
	    300, 0, 600000 },
	{ "IDEM_LEASE_SECONDS", &settings.lease_seconds, 30, 1, 86400 },
	{ "IDEM_RETENTION_SECONDS", &settings.retention_seconds,
	    86400, 1, 31 * 86400 },
	{ "IDEM_CLEANUP_INTERVAL_SECONDS", &settings.cleanup_interval_seconds,
	    60, 1, 86400 },
	{ "IDEM_CLEANUP_BATCH", &settings.cleanup_batch, 500, 1, 100000 },
	{ "IDEM_RECOVERY_AFTER_SECONDS", &settings.recovery_after_seconds,
	    300, 1, 7 * 86400 },
	{ "IDEM_RECOVERY_INTERVAL_SECONDS", &settings.recovery_interval_seconds,
	    10, 1, 86400 },
	{ "IDEM_AUTH_CACHE_SECONDS", &settings.auth_cache_seconds,
	    60, 0, 3600 },
	{ "IDEM_DB_TIMEOUT_MS", &settings.db_timeout_ms, 5000, 100, 600000 },
	{ "IDEM_RECOVERY_BACKOFF_SECONDS", &settings.recovery_backoff_seconds,
	    30, 1, 86400 },
	{ "IDEM_RECOVERY_BACKOFF_MAX_SECONDS",
	    &settings.recovery_backoff_max_seconds, 900, 1, 7 * 86400 },
	{ "IDEM_REPLAY_CACHE_SECONDS", &settings.replay_cache_seconds,
	    300, 0, 86400 },
	{ "IDEM_REPLAY_CACHE_ENTRIES", &settings.replay_cache_entries,
	    4096, 1, 65536 },
	{ "IDEM_FAKE_PROVIDER_KEEPS_5XX", &settings.fake_keeps_5xx, 0, 0, 1 },
	/* Unset: the provider's own (src/lease/provider.c). */
	{ "IDEM_PROVIDER_SETTLE_SECONDS", &settings.provider_settle_seconds,
	    SETTING_UNSET, 0, 86400 },
	{ "IDEM_PROVIDER_KEY_RETENTION_SECONDS",
	    &settings.provider_key_retention_seconds, SETTING_UNSET, 0,
	    366 * 86400 },
	{ "IDEM_LATE_SCAN_AFTER_SECONDS", &settings.late_scan_after_seconds,
	    3600, 1, 7 * 86400 },
};

static const struct text_setting	texts[] = {
	{ "IDEM_DATABASE_URL", &settings.database_url, EMBEDDED_DATABASE_URL,
	    SETTINGS_TEXT_MAX },
	{ "IDEM_HOST", &settings.host, "127.0.0.1", 255 },
	{ "IDEM_PORT", &settings.port, "8888", 5 },
	{ "IDEM_PROVIDER_PORT", &settings.provider_port, "8889", 5 },
	{ "IDEM_PROVIDER_URL", &settings.provider_url, NULL, SETTINGS_URL_MAX },
	{ "IDEM_PUBLIC_URL", &settings.public_url, NULL, SETTINGS_URL_MAX },
	{ "IDEM_PROVIDER_KIND", &settings.provider_kind, "fake", 16 },
	{ "IDEM_PROVIDER_SECRET", &settings.provider_secret, NULL, 512 },
};

/*
 * Reads every setting; once per image of the module (the parent at start,
 * a worker whose module was reloaded).
 */
void
settings_load(void)
{
	size_t		i;
	char		url[64];

	if (settings.loaded)
		return;

	for (i = 0; i < sizeof(numbers) / sizeof(numbers[0]); i++)
		load_number(&numbers[i]);

	for (i = 0; i < sizeof(texts) / sizeof(texts[0]); i++)
		load_text(&texts[i]);

	check_port("IDEM_PORT", settings.port);
	check_port("IDEM_PROVIDER_PORT", settings.provider_port);

	/* The fake provider of make run, wherever IDEM_PROVIDER_PORT moved it. */
	if (settings.provider_url == NULL) {
		(void)snprintf(url, sizeof(url), "http://127.0.0.1:%s",
		    settings.provider_port);
		settings.provider_url = kore_strdup(url);
	}

	if (settings.public_url == NULL) {
		(void)snprintf(url, sizeof(url), "http://127.0.0.1:%s",
		    settings.port);
		settings.public_url = kore_strdup(url);
	}

	check_url("IDEM_PROVIDER_URL", settings.provider_url);

	/* The providers of src/lease/provider.c. */
	if (strcmp(settings.provider_kind, "fake") &&
	    strcmp(settings.provider_kind, "stripe")) {
		fatal("IDEM_PROVIDER_KIND=%s: expected fake or stripe",
		    settings.provider_kind);
	}
	if (!strcmp(settings.provider_kind, "stripe") &&
	    settings.provider_secret == NULL) {
		fatal("IDEM_PROVIDER_KIND=stripe needs IDEM_PROVIDER_SECRET "
		    "(the account's secret key, sk_...)");
	}
	if (settings.provider_secret != NULL &&
	    strpbrk(settings.provider_secret, "\r\n") != NULL)
		fatal("IDEM_PROVIDER_SECRET: one line expected");
	check_url("IDEM_PUBLIC_URL", settings.public_url);

	/*
	 * A lease that ends while its holder still waits for the provider
	 * lets a retry take the key and call the provider a second time.
	 */
	if ((u_int64_t)settings.lease_seconds * 1000 <=
	    settings.provider_timeout_ms) {
		fatal("IDEM_LEASE_SECONDS (%u s) must outlast "
		    "IDEM_PROVIDER_TIMEOUT_MS (%u ms): raise the lease or "
		    "lower the provider timeout", settings.lease_seconds,
		    settings.provider_timeout_ms);
	}

	settings.loaded = 1;
}

/*
 * Frees the texts before a reload drops the module's statics.
 */
void
settings_unload(void)
{
	size_t		i;

	for (i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
		kore_free(*texts[i].value);
		*texts[i].value = NULL;
	}

	memset(&settings, 0, sizeof(settings));
}

static void
load_number(const struct number_setting *s)
{
	const char		*env;
	char			*end;
	unsigned long long	n;

	if ((env = getenv(s->name)) == NULL || *env == '\0') {
		*s->value = s->def;
		return;
	}

	errno = 0;
	n = strtoull(env, &end, 10);
	if (errno != 0 || *end != '\0' || env[0] == '-' ||
	    n < s->min || n > s->max) {
		fatal("%s=%s: expected a whole number from %u to %u",
		    s->name, env, s->min, s->max);
	}

	*s->value = (u_int32_t)n;
}

static void
load_text(const struct text_setting *s)
{
	const char	*env;

	if ((env = getenv(s->name)) != NULL && *env != '\0') {
		if (strlen(env) > s->max) {
			fatal("%s: %zu bytes, at most %zu are accepted",
			    s->name, strlen(env), s->max);
		}
		*s->value = kore_strdup(env);
	}
	else if (s->def != NULL)
		*s->value = kore_strdup(s->def);
	else
		*s->value = NULL;
}

static void
check_port(const char *name, const char *value)
{
	char		*end;
	long		port;

	errno = 0;
	port = strtol(value, &end, 10);
	if (errno != 0 || *end != '\0' || port < 1 || port > 65535)
		fatal("%s=%s: expected a TCP port from 1 to 65535", name, value);
}

/*
 * A base URL the service builds other URLs on: http(s), no trailing slash.
 */
static void
check_url(const char *name, const char *value)
{
	size_t		len;

	len = strlen(value);
	if ((strncmp(value, "http://", 7) && strncmp(value, "https://", 8)) ||
	    value[len - 1] == '/') {
		fatal("%s=%s: expected an http:// or https:// URL without a "
		    "trailing slash", name, value);
	}
}
