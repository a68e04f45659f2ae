/*
 * idem-relay: the registry of sinks and their settings.
 *
 * A new sink is a file sink_<name>.c defining a SinkType, and one line in
 * sink_types below.
 */
#include <stdio.h>
#include <stdlib.h>
#include <ctype.h>
#include <string.h>

#include "relay.h"

static const SinkType *const sink_types[] = {
	&sink_stdout_type,
	&sink_webhook_type,
	&sink_rabbitmq_type,
	&sink_kafka_type,
	&sink_nats_type,
	NULL
};

const SinkType *
sink_type_find(const char *name)
{
	int			i;

	for (i = 0; sink_types[i] != NULL; i++)
		if (strcmp(sink_types[i]->name, name) == 0)
			return sink_types[i];
	return NULL;
}

const char *
sink_type_names(void)
{
	static char names[256];
	int			i;

	if (names[0] == '\0')
		for (i = 0; sink_types[i] != NULL; i++)
		{
			if (i > 0)
				strncat(names, ", ", sizeof(names) - strlen(names) - 1);
			strncat(names, sink_types[i]->name, sizeof(names) - strlen(names) - 1);
		}
	return names;
}

/* whether setting (after "<sink>.") is one the sink accepts */
static int
setting_accepted(const SinkType *t, const char *setting)
{
	int			i;

	for (i = 0; t->settings != NULL && t->settings[i] != NULL; i++)
	{
		const char *s = t->settings[i];
		size_t		len = strlen(s);

		if (len > 0 && s[len - 1] == '.')
		{
			if (strncmp(setting, s, len) == 0 && setting[len] != '\0')
				return 1;
		}
		else if (strcmp(setting, s) == 0)
			return 1;
	}
	return 0;
}

int
sink_setting_known(const char *key)
{
	const char *dot = strchr(key, '.');
	char		name[64];
	const SinkType *t;

	if (dot == NULL || (size_t) (dot - key) >= sizeof(name))
		return 0;
	memcpy(name, key, (size_t) (dot - key));
	name[dot - key] = '\0';
	t = sink_type_find(name);
	return t != NULL && setting_accepted(t, dot + 1);
}

/* If key is "<sink>.<setting>" of this sink, the setting; else NULL. */
static const char *
own_setting(const SinkSettings *ss, const char *key)
{
	size_t		n = strlen(ss->sink);

	if (strncmp(key, ss->sink, n) == 0 && key[n] == '.')
		return key + n + 1;
	return NULL;
}

/* If item is a setting of this instance's topic, the part after the topic. */
static const char *
topic_rest(const SinkSettings *ss, const ConfigItem *it)
{
	char		topic[1100];
	const char *rest;

	if (ss->topic == NULL ||
		config_split_topic(it->key, topic, sizeof(topic), &rest) != 1 ||
		strcmp(topic, ss->topic) != 0)
		return NULL;
	return rest;
}

const char *
sink_setting(const SinkSettings *ss, const char *name)
{
	int			i;
	const char *s;
	const char *rest;

	for (i = ss->cfg->nitems - 1; i >= 0; i--)
		if ((rest = topic_rest(ss, &ss->cfg->items[i])) != NULL &&
			(s = own_setting(ss, rest)) != NULL && strcmp(s, name) == 0)
			return ss->cfg->items[i].value;
	for (i = ss->cfg->nitems - 1; i >= 0; i--)
		if ((s = own_setting(ss, ss->cfg->items[i].key)) != NULL && strcmp(s, name) == 0)
			return ss->cfg->items[i].value;
	return NULL;
}

/*
 * Whether msg names key as a word of its own ("nats.user and ..."), outside
 * the values it quotes ("nats.url \"nats://h/ nats.user\" ..." names only
 * nats.url).  A value that holds a double quote itself can still mislead it.
 */
static int
names_key(const char *msg, const char *key)
{
	size_t		n = strlen(key);
	const char *p;
	int			quoted = 0;

	for (p = msg; *p != '\0'; p++)
	{
		char		after;

		if (*p == '"')
			quoted = !quoted;
		if (quoted || strncmp(p, key, n) != 0)
			continue;
		after = p[n];
		if ((p == msg || p[-1] == ' ' || p[-1] == '(') &&
			!(isalnum((unsigned char) after) || after == '_' || after == '.'))
			return 1;
	}
	return 0;
}

/* The setting of this instance in force for "<sink>.<name>" (generic). */
static const ConfigItem *
setting_in_force(const SinkSettings *ss, const char *generic)
{
	int			i;
	const char *rest;

	for (i = ss->cfg->nitems - 1; i >= 0; i--)
		if ((rest = topic_rest(ss, &ss->cfg->items[i])) != NULL && strcmp(rest, generic) == 0)
			return &ss->cfg->items[i];
	for (i = ss->cfg->nitems - 1; i >= 0; i--)
		if (strcmp(ss->cfg->items[i].key, generic) == 0)
			return &ss->cfg->items[i];
	return NULL;
}

/*
 * Where each setting of this instance that msg (an error of its init) names
 * was set: " (nats.user: relay.conf:3)", or "" when it names none that was
 * set.
 */
void
sink_setting_origins(const SinkSettings *ss, const char *msg, char *buf, size_t len)
{
	StrBuf		sb;
	int			i;

	sb_init(&sb);
	for (i = 0; i < ss->cfg->nitems; i++)
	{
		const ConfigItem *it = &ss->cfg->items[i];
		const char *rest = topic_rest(ss, it);
		const char *generic = rest ? rest : it->key;

		/* each named setting once, where the one in force was set */
		if (own_setting(ss, generic) == NULL || !names_key(msg, generic) ||
			setting_in_force(ss, generic) != it)
			continue;
		sb_printf(&sb, "%s%s: %s", sb.len == 0 ? " (" : "; ", it->key, it->origin);
	}
	if (sb.len > 0)
		sb_putc(&sb, ')');
	snprintf(buf, len, "%s", sb.len > 0 ? sb.data : "");
	sb_free(&sb);
}

/*
 * Calls fn for each setting named prefix + suffix in force: once per
 * suffix, with the value that wins (the topic's over the one of every
 * topic, the last of the file over an earlier one).  The calls come in the
 * order the settings were written, those of every topic first: when two
 * names set one thing (a librdkafka property and its alias), the one
 * written last wins, as it would for one name.
 */
void
sink_setting_each(const SinkSettings *ss, const char *prefix,
				  void (*fn) (void *arg, const char *suffix, const char *value),
				  void *arg)
{
	const char **seen;
	const ConfigItem **items;
	int			nseen = 0;
	int			pass;
	int			i;
	int			j;
	size_t		plen = strlen(prefix);

	seen = xmalloc(sizeof(char *) * (size_t) (ss->cfg->nitems + 1));
	items = xmalloc(sizeof(ConfigItem *) * (size_t) (ss->cfg->nitems + 1));
	/* the winners, from the last that wins to the first */
	for (pass = 0; pass < 2; pass++)
		for (i = ss->cfg->nitems - 1; i >= 0; i--)
		{
			const ConfigItem *it = &ss->cfg->items[i];
			const char *key = pass == 0 ? topic_rest(ss, it) : it->key;
			const char *s;

			if (key == NULL || (s = own_setting(ss, key)) == NULL ||
				strncmp(s, prefix, plen) != 0 || s[plen] == '\0')
				continue;
			s += plen;
			for (j = 0; j < nseen; j++)
				if (strcmp(seen[j], s) == 0)
					break;
			if (j < nseen)
				continue;
			items[nseen] = it;
			seen[nseen++] = s;
		}
	for (j = nseen - 1; j >= 0; j--)
		fn(arg, seen[j], items[j]->value);
	free(items);
	free(seen);
}

/* The length of the placeholder ({topic}, {key} or {type}) p starts with, or 0 */
size_t
sink_placeholder(const char *p)
{
	if (strncmp(p, "{topic}", 7) == 0)
		return 7;
	if (strncmp(p, "{type}", 6) == 0)
		return 6;
	if (strncmp(p, "{key}", 5) == 0)
		return 5;
	return 0;
}

size_t
sink_template_text_len(const char *tmpl)
{
	const char *p = tmpl;
	size_t		n = 0;

	while (*p)
	{
		size_t		len = sink_placeholder(p);

		if (len > 0)
			p += len;
		else
		{
			p++;
			n++;
		}
	}
	return n;
}

void
sink_expand(StrBuf *sb, const char *tmpl, const RelayMessage *m)
{
	const char *p = tmpl;

	sb_reset(sb);
	while (*p)
	{
		size_t		n = sink_placeholder(p);

		if (n == 7)
			sb_puts(sb, m->topic);
		else if (n == 6)
			sb_puts(sb, m->type ? m->type : "");
		else if (n == 5)
			sb_puts(sb, m->key);
		else
		{
			sb_putc(sb, *p++);
			continue;
		}
		p += n;
	}
}

int
sink_global_init(char *err, size_t errlen)
{
	int			i;

	for (i = 0; sink_types[i] != NULL; i++)
		if (sink_types[i]->global_init != NULL &&
			!sink_types[i]->global_init(err, errlen))
			return 0;
	return 1;
}

void
sink_global_cleanup(void)
{
	int			i;

	for (i = 0; sink_types[i] != NULL; i++)
		if (sink_types[i]->global_cleanup != NULL)
			sink_types[i]->global_cleanup();
}
