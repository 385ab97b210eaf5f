-- The tables flaudit's store created on sqlite before Alembic: Base.metadata.create_all of
-- auditor/service/store.py at commit df1b3ed (the first store; unchanged until 3814cbf added the
-- start-up ALTER TABLE ... ADD COLUMN), written by create_mock_engine.
CREATE TABLE flaudit_audits (
	id VARCHAR(32) NOT NULL, 
	name VARCHAR(200) NOT NULL, 
	status VARCHAR(16) NOT NULL, 
	reason TEXT, 
	spec JSON NOT NULL, 
	canary_seed VARCHAR(48), 
	run_token_hash VARCHAR(64), 
	created_at DATETIME NOT NULL, 
	started_at DATETIME, 
	finished_at DATETIME, 
	updated_at DATETIME NOT NULL, 
	last_round_at DATETIME, 
	dim INTEGER, 
	rounds_stored INTEGER NOT NULL, 
	has_final BOOLEAN NOT NULL, 
	initial_model BLOB, 
	max_cosines BLOB, 
	last_cosines BLOB, 
	final_cosines BLOB, 
	final_model_cosines BLOB, 
	analytic JSON, 
	estimates JSON, 
	diagnostics JSON, 
	histograms JSON, 
	alerts JSON, 
	metrics JSON, 
	headline_epsilon FLOAT, 
	PRIMARY KEY (id)
);

CREATE INDEX ix_flaudit_audits_status ON flaudit_audits (status);

CREATE TABLE flaudit_rounds (
	id INTEGER NOT NULL, 
	audit_id VARCHAR(32) NOT NULL, 
	round INTEGER NOT NULL, 
	clip_norm FLOAT NOT NULL, 
	cohort_size INTEGER NOT NULL, 
	num_canaries_inserted INTEGER NOT NULL, 
	num_failures INTEGER NOT NULL, 
	clipped_fraction FLOAT, 
	noise_stddev FLOAT, 
	train_loss FLOAT, 
	accuracy FLOAT, 
	delta_norm FLOAT, 
	estimates JSON, 
	received_at DATETIME NOT NULL, 
	PRIMARY KEY (id), 
	CONSTRAINT uq_flaudit_rounds_audit_round UNIQUE (audit_id, round), 
	FOREIGN KEY(audit_id) REFERENCES flaudit_audits (id) ON DELETE CASCADE
);

CREATE INDEX ix_flaudit_rounds_audit_id ON flaudit_rounds (audit_id);
