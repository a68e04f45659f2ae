-- Everything that makes up the installed extension idem, one line per
-- property, in a stable order: what the upgrade test compares between a
-- database upgraded from an older version and a fresh install.
WITH ext AS (
    SELECT oid, extversion, extconfig, extcondition FROM pg_extension WHERE extname = 'idem'
), member AS (
    SELECT d.classid, d.objid
      FROM pg_depend d, ext
     WHERE d.refclassid = 'pg_extension'::regclass AND d.refobjid = ext.oid AND d.deptype = 'e'
), rel AS (
    SELECT c.* FROM pg_class c JOIN member m ON m.classid = 'pg_class'::regclass AND m.objid = c.oid
), line AS (
    -- the members themselves
    SELECT 'member ' || pg_describe_object(m.classid, m.objid, 0) AS l FROM member m
    UNION ALL
    -- the extension's version and configuration tables
    SELECT 'extension ' || extversion || ' config ' ||
           coalesce((SELECT string_agg(c::regclass::text || ' ' || coalesce(w, ''), ', ' ORDER BY c::regclass::text)
                       FROM unnest(extconfig, extcondition) AS u(c, w)), '')
      FROM ext
    UNION ALL
    -- functions: their whole definition, their privileges and owner's rights
    SELECT 'function ' || p.oid::regprocedure || E'\n' || pg_get_functiondef(p.oid) ||
           E'\nacl ' || coalesce(p.proacl::text, 'default') ||
           ' cost ' || p.procost || ' rows ' || p.prorows
      FROM pg_proc p JOIN member m ON m.classid = 'pg_proc'::regclass AND m.objid = p.oid
    UNION ALL
    -- tables: persistence, options, privileges, row security, replica
    -- identity and comment
    SELECT 'relation ' || r.oid::regclass || ' kind ' || r.relkind::text || ' persistence ' || r.relpersistence::text ||
           ' options ' || coalesce(r.reloptions::text, '') || ' acl ' || coalesce(r.relacl::text, 'default') ||
           ' rls ' || r.relrowsecurity || '/' || r.relforcerowsecurity || ' replident ' || r.relreplident::text ||
           ' comment ' || coalesce(obj_description(r.oid, 'pg_class'), '')
      FROM rel r
    UNION ALL
    -- views: their query
    SELECT 'view ' || r.oid::regclass || ' ' || pg_get_viewdef(r.oid)
      FROM rel r WHERE r.relkind IN ('v', 'm')
    UNION ALL
    -- sequences: their parameters
    SELECT 'sequence ' || r.oid::regclass || ' ' || s.seqtypid::regtype || ' start ' || s.seqstart ||
           ' increment ' || s.seqincrement || ' min ' || s.seqmin || ' max ' || s.seqmax ||
           ' cache ' || s.seqcache || ' cycle ' || s.seqcycle
      FROM rel r JOIN pg_sequence s ON s.seqrelid = r.oid
    UNION ALL
    -- comments on the columns of idem's relations, and on their indexes,
    -- constraints and triggers
    SELECT 'column comment ' || r.oid::regclass || '.' || a.attname || ' ' || d.description
      FROM rel r JOIN pg_attribute a ON a.attrelid = r.oid AND a.attnum > 0 AND NOT a.attisdropped
      JOIN pg_description d ON d.classoid = 'pg_class'::regclass AND d.objoid = r.oid AND d.objsubid = a.attnum
    UNION ALL
    SELECT 'index comment ' || i.indexrelid::regclass || ' ' || d.description
      FROM rel r JOIN pg_index i ON i.indrelid = r.oid
      JOIN pg_description d ON d.classoid = 'pg_class'::regclass AND d.objoid = i.indexrelid AND d.objsubid = 0
    UNION ALL
    SELECT 'constraint comment ' || r.oid::regclass || ' ' || c.conname || ' ' || d.description
      FROM rel r JOIN pg_constraint c ON c.conrelid = r.oid
      JOIN pg_description d ON d.classoid = 'pg_constraint'::regclass AND d.objoid = c.oid
    UNION ALL
    SELECT 'trigger comment ' || r.oid::regclass || ' ' || t.tgname || ' ' || d.description
      FROM rel r JOIN pg_trigger t ON t.tgrelid = r.oid
      JOIN pg_description d ON d.classoid = 'pg_trigger'::regclass AND d.objoid = t.oid
    UNION ALL
    -- the privileges pg_dump takes as the extension's own (what it does not
    -- dump as grants)
    SELECT 'initial privileges ' || pg_describe_object(ip.classoid, ip.objoid, ip.objsubid) || ' ' ||
           ip.privtype::text || ' ' || ip.initprivs::text
      FROM member m JOIN pg_init_privs ip ON ip.classoid = m.classid AND ip.objoid = m.objid
    UNION ALL
    -- columns
    SELECT 'column ' || r.oid::regclass || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod) ||
           ' collate ' || coalesce((SELECT collname FROM pg_collation WHERE oid = a.attcollation AND a.attcollation <> 0), '') ||
           CASE WHEN a.attnotnull THEN ' not null' ELSE '' END ||
           coalesce(' default ' || pg_get_expr(ad.adbin, ad.adrelid), '') || ' #' || a.attnum
      FROM rel r JOIN pg_attribute a ON a.attrelid = r.oid AND a.attnum > 0 AND NOT a.attisdropped
      LEFT JOIN pg_attrdef ad ON ad.adrelid = r.oid AND ad.adnum = a.attnum
    UNION ALL
    -- indexes, constraints and triggers of idem's tables
    SELECT 'index ' || pg_get_indexdef(i.indexrelid) || ' options ' ||
           coalesce((SELECT reloptions::text FROM pg_class WHERE oid = i.indexrelid), '')
      FROM rel r JOIN pg_index i ON i.indrelid = r.oid
    UNION ALL
    SELECT 'constraint ' || r.oid::regclass || ' ' || c.conname || ' ' || pg_get_constraintdef(c.oid)
      FROM rel r JOIN pg_constraint c ON c.conrelid = r.oid
    UNION ALL
    SELECT 'trigger ' || pg_get_triggerdef(t.oid) || ' enabled ' || t.tgenabled::text
      FROM rel r JOIN pg_trigger t ON t.tgrelid = r.oid AND NOT t.tgisinternal
    UNION ALL
    -- types: enum labels in their order, a composite type's attributes
    SELECT 'type ' || t.oid::regtype || ' ' ||
           coalesce((SELECT string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder) FROM pg_enum e WHERE e.enumtypid = t.oid), '') ||
           coalesce((SELECT string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod) ||
                                       coalesce(' collate ' || (SELECT collname FROM pg_collation
                                                                 WHERE oid = a.attcollation AND a.attcollation <> 0), ''),
                                       ', ' ORDER BY a.attnum)
                       FROM pg_attribute a
                      WHERE a.attrelid = t.typrelid AND t.typrelid <> 0 AND a.attnum > 0 AND NOT a.attisdropped), '') ||
           ' acl ' || coalesce(t.typacl::text, 'default')
      FROM pg_type t JOIN member m ON m.classid = 'pg_type'::regclass AND m.objid = t.oid
    UNION ALL
    -- schemas: privileges and comment
    SELECT 'schema ' || n.nspname || ' acl ' || coalesce(n.nspacl::text, 'default') ||
           ' comment ' || coalesce(obj_description(n.oid, 'pg_namespace'), '')
      FROM pg_namespace n JOIN member m ON m.classid = 'pg_namespace'::regclass AND m.objid = n.oid
    UNION ALL
    -- event triggers
    SELECT 'event trigger ' || e.evtname || ' ' || e.evtevent || ' ' || e.evtfoid::regproc || ' ' ||
           coalesce(e.evttags::text, '') || ' enabled ' || e.evtenabled::text
      FROM pg_event_trigger e JOIN member m ON m.classid = 'pg_event_trigger'::regclass AND m.objid = e.oid
    UNION ALL
    -- comments on functions and types
    SELECT 'comment ' || pg_describe_object(m.classid, m.objid, 0) || ' ' || d.description
      FROM member m JOIN pg_description d ON d.classoid = m.classid AND d.objoid = m.objid AND d.objsubid = 0
     WHERE m.classid <> 'pg_class'::regclass
)
SELECT d FROM (SELECT replace(l, E'\n', ' // ') AS d FROM line) s ORDER BY d COLLATE "C";
