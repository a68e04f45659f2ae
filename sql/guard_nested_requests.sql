-- state-transition guard: idem_transition on a table whose UPDATE has a DO
-- ALSO rule.  The rule's action runs before the UPDATE it stands beside, and
-- may update the same row (here through a function): that UPDATE is not the
-- request's, which is decided on the row idem_transition's own UPDATE
-- locks.  The answers are those of the same table without the rule, and the
-- rule's writes stay (each a version more: an expected version would tell
-- them, as with any write before the UPDATE).  A move the guard refuses is
-- judged on the locked row before the UPDATE, which then does not run: nor
-- does the rule's action.  The objects of this file start with "gnr".
\set VERBOSITY terse

SELECT idem_allow('gnr', 'new', 'paid'), idem_allow('gnr', 'paid', 'shipped'),
       idem_allow('gnr', 'new', 'cancelled');
CREATE FUNCTION gnr_make(t text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('CREATE TABLE %I (id integer PRIMARY KEY, status text NOT NULL,
                    version integer NOT NULL DEFAULT 0, note text)', t);
    PERFORM idem_guard(t::regclass, 'gnr', 'status', 'version');
    EXECUTE format($q$INSERT INTO %I VALUES (1, 'paid', 0), (2, 'paid', 0), (3, 'paid', 0),
                   (4, 'new', 0)$q$, t);
END $$;
SELECT gnr_make('gnr_plain'), gnr_make('gnr_ruled');
CREATE FUNCTION gnr_touch(k integer) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE gnr_ruled SET note = 'touched' WHERE id = k;
END $$;
CREATE RULE gnr_touch AS ON UPDATE TO gnr_ruled
    WHERE NEW.note IS DISTINCT FROM 'touched' DO ALSO SELECT gnr_touch(NEW.id);

CREATE FUNCTION gnr_requests(t regclass) RETURNS TABLE (request text, outcome text)
LANGUAGE plpgsql AS $$
BEGIN
    request := '1: paid -> new'; outcome := idem_transition(t, '1', 'new'); RETURN NEXT;
    request := '2: paid -> paid'; outcome := idem_transition(t, '2', 'paid'); RETURN NEXT;
    request := '3: paid -> shipped'; outcome := idem_transition(t, '3', 'shipped'); RETURN NEXT;
    request := '4: new -> shipped'; outcome := idem_transition(t, '4', 'shipped'); RETURN NEXT;
    request := '4: new -> cancelled'; outcome := idem_transition(t, '4', 'cancelled'); RETURN NEXT;
    request := '5: none'; outcome := idem_transition(t, '5', 'paid'); RETURN NEXT;
END $$;
SELECT * FROM gnr_requests('gnr_plain');
SELECT * FROM gnr_requests('gnr_ruled');
SELECT * FROM gnr_plain ORDER BY id;
-- every row the rule's action touched (one more version each time): those
-- of the moves made
SELECT * FROM gnr_ruled ORDER BY id;

-- the rule's action updates a partition of the partitioned table the
-- request is on, in the same statement: not the request's UPDATE either
CREATE TABLE gnr_parted (id integer PRIMARY KEY, status text NOT NULL,
                         version integer NOT NULL DEFAULT 0, note text)
    PARTITION BY RANGE (id);
CREATE TABLE gnr_parted_low PARTITION OF gnr_parted FOR VALUES FROM (0) TO (100);
SELECT idem_guard('gnr_parted', 'gnr', 'status', 'version');
INSERT INTO gnr_parted VALUES (1, 'paid', 0), (2, 'new', 0);
CREATE RULE gnr_note AS ON UPDATE TO gnr_parted DO ALSO
    UPDATE gnr_parted_low SET note = 'ruled' WHERE id = NEW.id;
SELECT idem_transition('gnr_parted', '1', 'new');
SELECT idem_transition('gnr_parted', '2', 'paid');
SELECT idem_transition('gnr_parted', '2', 'paid');
SELECT * FROM gnr_parted ORDER BY id;

DROP TABLE gnr_plain, gnr_ruled, gnr_parted;
DROP FUNCTION gnr_make(text), gnr_touch(integer), gnr_requests(regclass);
DELETE FROM idem.transitions WHERE machine = 'gnr';
