/*
 * idem-relay: the configuration, from a file of "key = value" lines and
 * from the command line.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "relay.h"

void
config_set(Config *cfg, const char *key, const char *value, const char *origin)
{
	ConfigItem *it;

	if (cfg->nitems == cfg->cap)
	{
		cfg->cap = cfg->cap ? cfg->cap * 2 : 16;
		cfg->items = xrealloc(cfg->items, sizeof(ConfigItem) * (size_t) cfg->cap);
	}
	it = &cfg->items[cfg->nitems++];
	it->key = xstrdup(key);
	it->value = xstrdup(value);
	it->origin = xstrdup(origin);
}

void
config_free(Config *cfg)
{
	int			i;

	for (i = 0; i < cfg->nitems; i++)
	{
		free(cfg->items[i].key);
		free(cfg->items[i].value);
		free(cfg->items[i].origin);
	}
	free(cfg->items);
	cfg->items = NULL;
	cfg->nitems = cfg->cap = 0;
}

static const ConfigItem *
config_find(const Config *cfg, const char *key)
{
	int			i;

	for (i = cfg->nitems - 1; i >= 0; i--)
		if (strcmp(cfg->items[i].key, key) == 0)
			return &cfg->items[i];
	return NULL;
}

const char *
config_get(const Config *cfg, const char *key)
{
	const ConfigItem *it = config_find(cfg, key);

	return it ? it->value : NULL;
}

const char *
config_origin(const Config *cfg, const char *key)
{
	const ConfigItem *it = config_find(cfg, key);

	return it ? it->origin : "default";
}

static char *
trim(char *s)
{
	char	   *end;

	while (isspace((unsigned char) *s))
		s++;
	end = s + strlen(s);
	while (end > s && isspace((unsigned char) end[-1]))
		*--end = '\0';
	return s;
}

/*
 * The "=" that ends the key of "key=value", or NULL.  A topic's name in
 * double quotes may hold "=" (and a doubled quote): the key of
 * topic."a=b".sink=stdout ends after the closing quote.
 */
char *
config_key_end(const char *s)
{
	const char *p = s;

	if (strncmp(p, "topic.\"", 7) == 0)
	{
		for (p += 7; *p != '\0'; p++)
		{
			if (*p != '"')
				continue;
			if (p[1] != '"')
				break;
			p++;
		}
		/* no closing quote: the key is malformed, which its check says */
		if (*p == '\0')
			p = s;
	}
	return strchr(p, '=');
}

/*
 * The file: one "key = value" a line; blank lines and lines starting with #
 * are skipped.  A value in double quotes loses them (to keep spaces at its
 * ends).  Later lines win over earlier ones.
 */
int
config_read_file(Config *cfg, const char *path, char *err, size_t errlen)
{
	FILE	   *f;
	char	   *line = NULL;
	size_t		cap = 0;
	ssize_t		n;
	int			lineno = 0;
	int			ok = 1;

	f = fopen(path, "r");
	if (f == NULL)
	{
		snprintf(err, errlen, "could not open configuration file \"%s\": %s",
				 path, strerror(errno));
		return 0;
	}
	while ((n = getline(&line, &cap, f)) >= 0)
	{
		char	   *s;
		char	   *eq;
		char	   *key;
		char	   *value;
		char		origin[1100];
		size_t		vlen;

		lineno++;
		/* a NUL byte would end the line there, and the rest would be lost */
		if (memchr(line, '\0', (size_t) n) != NULL)
		{
			snprintf(err, errlen, "%s:%d: a NUL byte in the line", path, lineno);
			ok = 0;
			break;
		}
		s = line;
		/* a byte order mark, which some editors write, is not in the key */
		if (lineno == 1 && strncmp(s, "\xEF\xBB\xBF", 3) == 0)
			s += 3;
		s = trim(s);
		if (*s == '\0' || *s == '#')
			continue;
		eq = config_key_end(s);
		if (eq == NULL)
		{
			snprintf(err, errlen, "%s:%d: expected \"key = value\"", path, lineno);
			ok = 0;
			break;
		}
		*eq = '\0';
		key = trim(s);
		value = trim(eq + 1);
		if (*key == '\0')
		{
			snprintf(err, errlen, "%s:%d: missing key before \"=\"", path, lineno);
			ok = 0;
			break;
		}
		vlen = strlen(value);
		if (vlen >= 2 && value[0] == '"' && value[vlen - 1] == '"')
		{
			value[vlen - 1] = '\0';
			value++;
		}
		snprintf(origin, sizeof(origin), "%s:%d", path, lineno);
		config_set(cfg, key, value, origin);
	}
	if (ok && ferror(f))
	{
		snprintf(err, errlen, "could not read configuration file \"%s\": %s",
				 path, strerror(errno));
		ok = 0;
	}
	free(line);
	fclose(f);
	return ok;
}

/*
 * "topic.orders.sink" gives topic "orders" and rest "sink";
 * "topic."orders.v1".webhook.url" gives "orders.v1" and "webhook.url" (a
 * quote inside quotes is doubled).  1 when it splits, 0 when the key is not
 * one of a topic, or malformed, and -1 when the name does not fit in
 * topicsize bytes.
 */
int
config_split_topic(const char *key, char *topic, size_t topicsize, const char **rest)
{
	const char *p;
	size_t		n = 0;

	if (strncmp(key, "topic.", 6) != 0)
		return 0;
	p = key + 6;
	if (*p == '"')
	{
		p++;
		for (;;)
		{
			if (*p == '\0')
				return 0;
			if (*p == '"')
			{
				if (p[1] != '"')
					break;
				p++;
			}
			if (n + 1 >= topicsize)
				return -1;
			topic[n++] = *p++;
		}
		p++;
	}
	else
	{
		while (*p != '\0' && *p != '.')
		{
			if (n + 1 >= topicsize)
				return -1;
			topic[n++] = *p++;
		}
	}
	topic[n] = '\0';
	if (n == 0 || *p != '.' || p[1] == '\0')
		return 0;
	*rest = p + 1;
	return 1;
}
