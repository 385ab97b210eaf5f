-- The tables flaudit's store created on postgresql before Alembic: Base.metadata.create_all of
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
	created_at TIMESTAMP WITH TIME ZONE NOT NULL, 
	started_at TIMESTAMP WITH TIME ZONE, 
	finished_at TIMESTAMP WITH TIME ZONE, 
	updated_at TIMESTAMP WITH TIME ZONE NOT NULL, 
	last_round_at TIMESTAMP WITH TIME ZONE, 
	dim INTEGER, 
	rounds_stored INTEGER NOT NULL, 
	has_final BOOLEAN NOT NULL, 
	initial_model BYTEA, 
	max_cosines BYTEA, 
	last_cosines BYTEA, 
	final_cosines BYTEA, 
	final_model_cosines BYTEA, 
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
	id SERIAL NOT NULL, 
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
	received_at TIMESTAMP WITH TIME ZONE NOT NULL, 
	PRIMARY KEY (id), 
	CONSTRAINT uq_flaudit_rounds_audit_round UNIQUE (audit_id, round), 
	FOREIGN KEY(audit_id) REFERENCES flaudit_audits (id) ON DELETE CASCADE
);

CREATE INDEX ix_flaudit_rounds_audit_id ON flaudit_rounds (audit_id);
