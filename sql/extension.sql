-- the extension as a whole: its objects, their privileges and comments,
-- pg_dump registration, DROP and CREATE again
\set VERBOSITY terse

-- What the extension owns: every member object, with its kind and
-- whether it has a comment.  Functions also say who may execute them.
CREATE FUNCTION pg_temp.ext_objects()
RETURNS TABLE (classid regclass, objid oid, kind text, name text, commented boolean)
LANGUAGE sql AS $$
    SELECT d.classid::regclass, d.objid,
           CASE d.classid
               WHEN 'pg_proc'::regclass THEN 'function'
               WHEN 'pg_class'::regclass THEN 'relation'
               WHEN 'pg_type'::regclass THEN 'type'
               WHEN 'pg_namespace'::regclass THEN 'schema'
               ELSE d.classid::regclass::text END,
           pg_describe_object(d.classid, d.objid, d.objsubid),
           obj_description(d.objid, d.classid::regclass::name) IS NOT NULL
      FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid
     WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
       AND e.extname = 'idem'
$$;
CREATE FUNCTION pg_temp.ext_functions()
RETURNS TABLE (fn regprocedure, security_definer boolean, config text[], public_execute boolean)
LANGUAGE sql AS $$
    SELECT p.oid::regprocedure, p.prosecdef, p.proconfig,
           EXISTS (SELECT 1 FROM aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
                    WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE')
      FROM pg_temp.ext_objects() o JOIN pg_proc p ON p.oid = o.objid
     WHERE o.classid = 'pg_proc'::regclass
$$;

--
-- what CREATE EXTENSION made
--
SELECT extversion, extrelocatable, extnamespace::regnamespace
  FROM pg_extension WHERE extname = 'idem';
-- the objects of consumer dedup are members of the extension
SELECT x.name, o.name IS NOT NULL AS member
  FROM (VALUES ('schema idem'),
               ('table idem.claims'),
               ('table idem.namespaces'),
               ('type idem_claim_result'),
               ('function idem_claim(text,text)'),
               ('function idem_try_claim(text,text)'),
               ('function idem_claim_batch(text[],text)'),
               ('function idem_claim_info(text,text)'),
               ('function idem_release(text,text)'),
               ('function idem_set_retention(text,interval)'),
               ('function idem_purge(text,integer)')) AS x(name)
  LEFT JOIN pg_temp.ext_objects() o ON o.name = x.name
 ORDER BY x.name COLLATE "C";
-- the data of idem.claims and idem.namespaces is dumped by pg_dump, all of
-- it (no condition)
SELECT u.relid::regclass AS config_table, e.extcondition[u.i] AS condition
  FROM pg_extension e, unnest(e.extconfig) WITH ORDINALITY AS u(relid, i)
 WHERE e.extname = 'idem' AND u.relid IN ('idem.claims'::regclass, 'idem.namespaces'::regclass)
 ORDER BY u.relid::regclass::text COLLATE "C";
-- and so is every other table of the schema idem but idem.token_key: a
-- restored database makes its own key when the extension is created
SELECT c.oid::regclass AS not_dumped FROM pg_class c
 WHERE c.relnamespace = 'idem'::regnamespace AND c.relkind IN ('r', 'p')
   AND c.oid <> ALL ((SELECT extconfig FROM pg_extension WHERE extname = 'idem')::oid[])
 ORDER BY 1;

-- every object of the extension has a comment: none is listed here
SELECT kind, name AS without_comment FROM pg_temp.ext_objects()
 WHERE NOT commented ORDER BY kind, name COLLATE "C";

-- who may execute what: the administration functions are not for PUBLIC,
-- the claim functions are
SELECT fn, security_definer, public_execute FROM pg_temp.ext_functions()
 WHERE fn::oid IN ('idem_claim(text,text)'::regprocedure, 'idem_try_claim(text,text)'::regprocedure,
                   'idem_claim_batch(text[],text)'::regprocedure, 'idem_claim_info(text,text)'::regprocedure,
                   'idem_release(text,text)'::regprocedure,
                   'idem_set_retention(text,interval)'::regprocedure, 'idem_purge(text,integer)'::regprocedure)
 ORDER BY fn::text COLLATE "C";
-- no SECURITY DEFINER function is open to PUBLIC, and each pins its
-- search_path: none is listed here
SELECT fn, public_execute, config FROM pg_temp.ext_functions()
 WHERE security_definer
   AND (public_execute OR NOT coalesce('search_path=pg_catalog, pg_temp' = ANY (config), false))
 ORDER BY fn::text COLLATE "C";
-- PUBLIC has nothing on the schema idem nor on its tables
SELECT count(*) AS public_grants_on_schema
  FROM pg_namespace n, aclexplode(coalesce(n.nspacl, acldefault('n', n.nspowner))) a
 WHERE n.nspname = 'idem' AND a.grantee = 0;
SELECT count(*) AS public_grants_on_tables
  FROM pg_class c, aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) a
 WHERE c.relnamespace = 'idem'::regnamespace AND a.grantee = 0;
-- keys compare byte for byte
SELECT attname, collname FROM pg_attribute a JOIN pg_collation co ON co.oid = a.attcollation
 WHERE attrelid = 'idem.claims'::regclass AND attnum > 0 ORDER BY attnum;

--
-- the primary key rebuilt under a session that has used it: REINDEX
-- CONCURRENTLY gives the index a new OID, VACUUM FULL the table a new file
--
SELECT idem_claim('ext_r1', 'ext'), idem_try_claim('ext_r2', 'ext');
SELECT indexrelid AS old_index FROM pg_index WHERE indrelid = 'idem.claims'::regclass AND indisprimary \gset
REINDEX TABLE CONCURRENTLY idem.claims;
SELECT indexrelid <> :old_index AS new_index FROM pg_index WHERE indrelid = 'idem.claims'::regclass AND indisprimary;
SELECT idem_claim('ext_r1', 'ext') AS r1, idem_try_claim('ext_r2', 'ext') AS r2,
       idem_claim_batch(ARRAY['ext_r1', 'ext_r3'], 'ext') AS r1_r3,
       idem_claim_info('ext_r3', 'ext') IS NOT NULL AS r3_held;
SELECT idem_release('ext_r3', 'ext') AS released, idem_claim('ext_r3', 'ext') AS r3_again;
VACUUM FULL idem.claims;
SELECT idem_claim('ext_r1', 'ext') AS r1, idem_claim('ext_r4', 'ext') AS r4,
       idem_release('ext_r3', 'ext') AS released;
SELECT msg_id FROM idem.claims WHERE ns = 'ext' ORDER BY msg_id;
SELECT idem_release('ext_r1', 'ext'), idem_release('ext_r2', 'ext'), idem_release('ext_r4', 'ext');

--
-- DROP EXTENSION removes everything, claims included
--
-- claims made first: the backend now knows the tables
SELECT idem_claim('ext_1', 'ext'), idem_try_claim('ext_2', 'ext'), idem_claim_info('ext_1', 'ext') IS NOT NULL AS held;
SELECT idem_set_retention('ext', '1 day');
CREATE TEMP TABLE members AS SELECT classid, objid, name FROM pg_temp.ext_objects();
SELECT count(*) > 10 AS has_members FROM members;
-- a DROP rolled back changes nothing
BEGIN;
DROP EXTENSION idem;
ROLLBACK;
SELECT idem_claim('ext_1', 'ext'), idem_try_claim('ext_2', 'ext'), idem_claim('ext_3', 'ext');
DROP EXTENSION idem;
SELECT count(*) AS schemas FROM pg_namespace WHERE nspname = 'idem';
SELECT count(*) AS relations FROM pg_class WHERE relname IN ('claims', 'namespaces', 'claims_pkey', 'namespaces_pkey')
   AND relnamespace NOT IN (SELECT oid FROM pg_namespace WHERE nspname LIKE 'pg\_%');
SELECT to_regclass('idem.claims') AS claims, to_regclass('idem.namespaces') AS namespaces;
SELECT count(*) AS functions FROM pg_proc WHERE proname LIKE 'idem\_%'
   OR proname IN ('retention_of', '_check_ns');
SELECT count(*) AS objects FROM pg_temp.ext_objects();
-- none of the objects the extension had is left: none is listed here
SELECT name AS left_behind FROM members
 WHERE pg_describe_object(classid, objid, 0) IS NOT NULL ORDER BY name COLLATE "C";
SELECT count(*) AS types FROM pg_type WHERE typname IN ('idem_claim_result', '_idem_claim_result');
SELECT to_regtype('idem_claim_result') AS claim_result;
SELECT count(*) AS extensions FROM pg_extension WHERE extname = 'idem';
SELECT idem_claim('ext_1', 'ext');

--
-- CREATE EXTENSION again: claims work again in this same session, in the
-- new tables, which start empty
--
CREATE EXTENSION idem;
SELECT idem_claim('ext_1', 'ext') AS ext_1, idem_claim('ext_1', 'ext') AS ext_1_again;
SELECT idem_try_claim('ext_2', 'ext') AS ext_2, idem_try_claim('ext_2', 'ext') AS ext_2_again;
SELECT idem_claim_batch(ARRAY['ext_3', 'ext_4', 'ext_3'], 'ext');
SELECT idem_release('ext_4', 'ext'), idem_claim_info('ext_4', 'ext') IS NULL AS released,
       idem_claim_info('ext_1', 'ext') IS NOT NULL AS held;
SELECT ns, msg_id FROM idem.claims WHERE ns = 'ext' ORDER BY msg_id;
SELECT count(*) AS settings FROM idem.namespaces;
SELECT idem_set_retention('ext', '2 days');
SELECT ns, retention FROM idem.namespaces;
SELECT idem_purge();

--
-- DROP and CREATE in one transaction, with claims on both sides
--
BEGIN;
SELECT idem_claim('ext_5', 'ext');
DROP EXTENSION idem;
CREATE EXTENSION idem;
SELECT idem_claim('ext_5', 'ext') AS ext_5, idem_claim('ext_1', 'ext') AS ext_1;
SELECT idem_try_claim('ext_5', 'ext');
COMMIT;
SELECT ns, msg_id FROM idem.claims ORDER BY ns, msg_id;
-- the same, rolled back: the tables of before are back, with their claims
BEGIN;
DROP EXTENSION idem;
CREATE EXTENSION idem;
SELECT idem_claim('ext_5', 'ext') AS ext_5_in_new_tables;
ROLLBACK;
SELECT idem_claim('ext_5', 'ext') AS ext_5, idem_claim('ext_6', 'ext') AS ext_6;
SELECT ns, msg_id FROM idem.claims ORDER BY ns, msg_id;

-- the extension stays installed for the tests that follow
SELECT extname FROM pg_extension WHERE extname = 'idem';
