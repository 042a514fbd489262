"""Table contracts (docs/architecture.md, "Warehouse contracts"): one pyarrow schema per Parquet table, DDL for
the native tables.

Parquet tables live under `tables/<name>/<partition>.parquet` and are seen through DuckDB views.
Every Parquet row carries the `run_id` of the run that wrote it.
"""

from __future__ import annotations

import pyarrow as pa

RUN_ID = pa.field("run_id", pa.string(), nullable=False)

PARQUET_TABLES: dict[str, pa.Schema] = {
    "documents": pa.schema([
        pa.field("doc_id", pa.string(), nullable=False),
        pa.field("title", pa.string()),
        pa.field("text", pa.string()),
        pa.field("corpus", pa.string(), nullable=False),
        RUN_ID,
    ]),
    "questions": pa.schema([
        pa.field("question_id", pa.string(), nullable=False),
        pa.field("dataset", pa.string(), nullable=False),
        pa.field("split", pa.string(), nullable=False),
        pa.field("question", pa.string()),
        pa.field("answers", pa.list_(pa.string())),
        RUN_ID,
    ]),
    "gen_examples": pa.schema([                             # summarisation / translation (the paper's Table 4)
        pa.field("example_id", pa.string(), nullable=False),
        pa.field("task", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),        # summarization | translation
        pa.field("split", pa.string(), nullable=False),
        pa.field("source", pa.string()),
        pa.field("target", pa.string()),
        pa.field("source_lang", pa.string()),
        pa.field("target_lang", pa.string()),
        RUN_ID,
    ]),
    "retrievals": pa.schema([
        pa.field("question_id", pa.string(), nullable=False),
        pa.field("dataset", pa.string(), nullable=False),
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("doc_id", pa.string(), nullable=False),
        pa.field("score", pa.float32()),
        pa.field("index_id", pa.string()),
        RUN_ID,
    ]),
    "segments": pa.schema([
        pa.field("segment_id", pa.string(), nullable=False),
        pa.field("doc_id", pa.string(), nullable=False),
        pa.field("text", pa.string()),
        RUN_ID,
    ]),
    "salient_spans": pa.schema([
        pa.field("segment_id", pa.string(), nullable=False),
        pa.field("start_char", pa.int32(), nullable=False),
        pa.field("end_char", pa.int32(), nullable=False),
        pa.field("label", pa.string()),
        pa.field("text", pa.string()),
        RUN_ID,
    ]),
    "augmented_segments": pa.schema([                       # other wordings of a corpus's retrieved segments
        pa.field("segment_id", pa.string(), nullable=False),  # <source segment>~<method><k>
        pa.field("source_segment_id", pa.string(), nullable=False),
        pa.field("doc_id", pa.string(), nullable=False),
        pa.field("method", pa.string(), nullable=False),      # permute | full_name | paraphrase
        pa.field("text", pa.string()),
        pa.field("model", pa.string()),                       # paraphrase: the LM that wrote it
        RUN_ID,
    ]),
    "knowledge_questions": pa.schema([                      # questions written by rule from a corpus's spans
        pa.field("question_id", pa.string(), nullable=False),  # <segment>~q<k>
        pa.field("segment_id", pa.string(), nullable=False),   # the segment the span and the question come from
        pa.field("question", pa.string()),
        pa.field("answer", pa.string()),                       # the span, word for word
        pa.field("label", pa.string()),                        # the span's entity label, which chose the question word
        RUN_ID,
    ]),
    "predictions": pa.schema([
        RUN_ID,
        pa.field("model", pa.string()),                     # the model asked, as the report and `nkb runs` name it
        pa.field("question_id", pa.string(), nullable=False),
        pa.field("dataset", pa.string()),
        pa.field("split", pa.string()),
        pa.field("prediction", pa.string()),
        pa.field("exact_match", pa.bool_()),
    ]),
    "nkb_values": pa.schema([
        RUN_ID,
        pa.field("model", pa.string()),
        pa.field("kind", pa.string()),                      # nkb slots, or ffn neurons
        pa.field("layer", pa.string()),
        pa.field("slot", pa.int32(), nullable=False),
        pa.field("top_tokens", pa.list_(pa.string())),
        pa.field("top_probs", pa.list_(pa.float32())),
        pa.field("category", pa.string()),
    ]),
    "nkb_keys": pa.schema([
        RUN_ID,
        pa.field("model", pa.string()),
        pa.field("kind", pa.string()),
        pa.field("layer", pa.string()),
        pa.field("slot", pa.int32(), nullable=False),
        pa.field("top_questions", pa.list_(pa.string())),    # question_ids, strongest first
        pa.field("weights", pa.list_(pa.float32())),
        pa.field("relation", pa.string()),                   # the relation all top questions share, else NULL
    ]),
    "report_generation": pa.schema([                        # general-generation scores per model and task
        RUN_ID,
        pa.field("model", pa.string(), nullable=False),
        pa.field("task", pa.string(), nullable=False),
        pa.field("split", pa.string()),
        pa.field("metric", pa.string()),                      # rougeL (F, %) or bleu (SacreBLEU)
        pa.field("score", pa.float64()),
    ]),
    "report": pa.schema([                                    # one row per model and dataset: stages/report.py's
        RUN_ID,                                              # REPORT_GLOSSARY says what each column means
        pa.field("model", pa.string(), nullable=False),
        pa.field("asked", pa.string()),
        pa.field("answers", pa.string()),                    # the name its answers are filed under (predictions)
        pa.field("dataset", pa.string(), nullable=False),   # a dataset, or "average"
        pa.field("split", pa.string()),
        pa.field("em", pa.float64()),
        pa.field("em_low", pa.float64()),
        pa.field("em_high", pa.float64()),
        pa.field("retrieval_share", pa.float64()),          # (EM - base) / (RAG - base), asked the same way
        pa.field("retrieval_share_low", pa.float64()),
        pa.field("retrieval_share_high", pa.float64()),
        pa.field("probe_em", pa.float64()),
        pa.field("probe_seen_em", pa.float64()),
        pa.field("heldout_loss", pa.float64()),
        pa.field("heldout_loss_change", pa.float64()),
        pa.field("heldout_loss_unmounted", pa.float64()),
        pa.field("facts_retained", pa.float64()),
        pa.field("params_total", pa.int64()),
        pa.field("params_trained", pa.int64()),
        pa.field("train_seconds", pa.float64()),
        pa.field("model_run", pa.string()),
    ]),
    "report_answers": pa.schema([                            # each report row's answers, for the next refresh
        RUN_ID,
        pa.field("model", pa.string(), nullable=False),
        pa.field("dataset", pa.string(), nullable=False),
        pa.field("question_id", pa.string(), nullable=False),
        pa.field("exact_match", pa.bool_()),
    ]),
    "report_refresh": pa.schema([                            # rows whose model was rebuilt, against the report before
        RUN_ID,
        pa.field("model", pa.string(), nullable=False),
        pa.field("dataset", pa.string(), nullable=False),    # a dataset, "average" or "probe"
        pa.field("em_before", pa.float64()),
        pa.field("em_after", pa.float64()),
        pa.field("newly_right", pa.int64()),                 # questions wrong before, right now
        pa.field("newly_wrong", pa.int64()),
        pa.field("model_run_before", pa.string()),
        pa.field("model_run_after", pa.string()),
        pa.field("report_before", pa.string()),
    ]),
    "edits": pa.schema([
        RUN_ID,
        pa.field("model", pa.string()),
        pa.field("question_id", pa.string()),
        pa.field("layer", pa.string()),
        pa.field("slot", pa.int32()),
        pa.field("strength", pa.float64()),                  # relative strength (None: the paper's absolute λ)
        pa.field("lambda", pa.float64()),                    # the λ applied: v += λ (e_target − e_original)
        pa.field("original", pa.string()),
        pa.field("target", pa.string()),
        pa.field("new", pa.string()),                        # the first token after the edit
        pa.field("success", pa.bool_()),
        pa.field("change_rate", pa.float64()),
    ]),
}

# Small, frequently updated tables are native DuckDB tables rather than Parquet.
NATIVE_TABLES: dict[str, str] = {
    "runs": """
        CREATE TABLE IF NOT EXISTS runs (
            run_id VARCHAR PRIMARY KEY,
            stage VARCHAR NOT NULL,
            config JSON,
            code_version VARCHAR,
            inputs_fingerprint VARCHAR,
            status VARCHAR NOT NULL,          -- success | failed
            started_at TIMESTAMP,
            finished_at TIMESTAMP,
            host VARCHAR,
            device VARCHAR,
            checkpoint VARCHAR,
            outputs JSON,                     -- {table: rows written, ...}
            error VARCHAR
        )""",
    "metrics": """
        CREATE TABLE IF NOT EXISTS metrics (
            run_id VARCHAR NOT NULL,
            dataset VARCHAR,
            split VARCHAR,
            metric VARCHAR NOT NULL,
            value DOUBLE,
            step BIGINT,                      -- for curves (loss per step); NULL for single values
            model VARCHAR                     -- the model the run built or asked (NULL in runs before 2026-12-07)
        )""",
    # What each Parquet file is: only registered files are read, and `nkb check` compares every file with its
    # digest (a damaged or foreign file is reported, never read).
    "partitions": """
        CREATE TABLE IF NOT EXISTS partitions (
            table_name VARCHAR NOT NULL,
            partition VARCHAR NOT NULL,       -- the file tables/<table_name>/<partition>.parquet
            run_id VARCHAR NOT NULL,          -- the run that committed it
            inputs_fingerprint VARCHAR,       -- that run's (what downstream stages fingerprint)
            rows BIGINT,
            bytes BIGINT,
            sha256 VARCHAR,
            footer_sha256 VARCHAR,            -- the footer's digest, for files whose pages carry checksums
            mtime BIGINT,                     -- its modification time (s) as committed: what the plain CLI checks
            damaged VARCHAR                   -- why `nkb check` found its bytes changed (NULL: it did not)
        )""",
}

# What a warehouse made by an earlier version lacks, added when it is next written (each statement idempotent).
NATIVE_MIGRATIONS = ["ALTER TABLE partitions ADD COLUMN IF NOT EXISTS footer_sha256 VARCHAR",
                     "ALTER TABLE partitions ADD COLUMN IF NOT EXISTS mtime BIGINT",
                     "ALTER TABLE partitions ADD COLUMN IF NOT EXISTS damaged VARCHAR",
                     "ALTER TABLE metrics ADD COLUMN IF NOT EXISTS model VARCHAR"]

# Views derived from the Parquet tables, created after them.
DERIVED_VIEWS: dict[str, str] = {
    # Salient span masking with one fixed draw per segment (training redraws per epoch in Python,
    # see corpus/ssm.py); for looking at what the model is asked to fill in.
    "ssm_examples": """
        WITH pick AS (
            SELECT segment_id, start_char, end_char, label, text AS span
            FROM salient_spans
            QUALIFY row_number() OVER (PARTITION BY segment_id ORDER BY hash(segment_id, start_char)) = 1)
        SELECT p.segment_id, p.label,
               substr(s.text, 1, p.start_char) || '<extra_id_0>' || substr(s.text, p.end_char + 1) AS input,
               '<extra_id_0> ' || p.span || ' <extra_id_1>' AS target,
               p.start_char, p.end_char
        FROM pick AS p JOIN segments AS s USING (segment_id)""",
}

_DUCKDB_TYPES = {
    pa.string(): "VARCHAR",
    pa.int32(): "INTEGER",
    pa.int64(): "BIGINT",
    pa.float32(): "FLOAT",
    pa.float64(): "DOUBLE",
    pa.bool_(): "BOOLEAN",
}


def duckdb_type(arrow_type: pa.DataType) -> str:
    """The DuckDB type name for an Arrow type used in the schemas above."""
    if pa.types.is_list(arrow_type):
        return duckdb_type(arrow_type.value_type) + "[]"
    return _DUCKDB_TYPES[arrow_type]
