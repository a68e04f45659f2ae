-- idem_metrics() writes UTF-8, as the Prometheus format requires, also in a
-- SQL_ASCII database, where a namespace can hold any bytes: a byte that does
-- not begin a valid UTF-8 character is written as U+FFFD (without it, a
-- UTF-8 client could not read the scrape at all).  In a database of its own.
\set VERBOSITY terse
SET client_min_messages = warning;
SELECT current_database() AS regress_db \gset
DROP DATABASE IF EXISTS idem_stats_sql_ascii;
CREATE DATABASE idem_stats_sql_ascii ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C'
    TEMPLATE template0;
\c idem_stats_sql_ascii
SET client_min_messages = warning;
CREATE EXTENSION idem;

-- 0xff, a valid "é" (0xc3 0xa9), a lone 0xc3 before "x", a "é" cut short
SELECT idem_claim('m', convert_from('\x61ff62c3a963c378c3'::bytea, 'SQL_ASCII')) AS claimed;
-- (bytes, not text, so that the output does not depend on the client's
-- encoding)
SELECT count(*) AS lines FROM regexp_split_to_table(idem_metrics(), E'\n') l
 WHERE l LIKE 'idem_claims_total{namespace=%';
SELECT convert_to(l, 'SQL_ASCII') AS bytes FROM regexp_split_to_table(idem_metrics(), E'\n') l
 WHERE l LIKE 'idem_claims_total{namespace=%,outcome="claimed"}%';

\c :regress_db
DROP DATABASE idem_stats_sql_ascii;
