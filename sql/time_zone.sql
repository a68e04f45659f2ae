-- Retentions and ttls are added in UTC: a day is 24 hours whatever the
-- session's time zone does.  Two zones: one that began daylight saving time
-- 12 to 13 hours ago (its last day was 23 hours long), one that begins it
-- in 11 to 12 hours (its next day is 23 hours long).
SELECT extract(doy FROM now() AT TIME ZONE 'UTC' - interval '12 hours')::int - 1 AS day,
       extract(hour FROM now() AT TIME ZONE 'UTC' - interval '12 hours')::int AS hour \gset
SELECT format('XST0XDT,%s/%s,%s/0', :day, :hour, (:day + 100) % 365) AS tz_began \gset
SELECT extract(doy FROM now() AT TIME ZONE 'UTC' + interval '12 hours')::int - 1 AS day,
       extract(hour FROM now() AT TIME ZONE 'UTC' + interval '12 hours')::int AS hour \gset
SELECT format('XST0XDT,%s/%s,%s/0', :day, :hour, (:day + 100) % 365) AS tz_begins \gset

SET timezone = :'tz_began';
SELECT now() - (now() - interval '1 day') AS last_day_of_the_zone;
-- a claim 23.5 hours old is younger than a retention of a day
SELECT idem_set_retention('tz', '1 day');
INSERT INTO idem.claims VALUES ('tz', 'younger', now() - interval '23 hours 30 minutes'),
                               ('tz', 'older', now() - interval '24 hours 30 minutes');
SELECT idem_purge('tz');
SELECT msg_id FROM idem.claims WHERE ns = 'tz';

SET timezone = :'tz_begins';
SELECT (now() + interval '1 day') - now() AS next_day_of_the_zone;
-- a token issued for a day lives 24 hours
SELECT idem_token_issue('tz', '1 day') IS NOT NULL AS issued;
SELECT round(extract(epoch FROM expires_at - now()) / 3600) AS token_hours FROM idem.tokens WHERE scope = 'tz';
-- a request finished with a retention of a day is replayed for 24 hours
SELECT idem_request_set_retention('tz', '1 day');
SELECT status FROM idem_request_begin('tz-1', 'fp', 'tz');
SELECT idem_request_finish('tz-1', 200, NULL, 'tz');
SELECT expires_at - finished_at AS replayed_for FROM idem.requests WHERE ns = 'tz';

RESET timezone;
DELETE FROM idem.claims WHERE ns = 'tz';
DELETE FROM idem.namespaces WHERE ns = 'tz';
DELETE FROM idem.tokens WHERE scope = 'tz';
DELETE FROM idem.requests WHERE ns = 'tz';
DELETE FROM idem.request_retention WHERE ns = 'tz';
