"""Writing Parquet partitions: rows conforming to a table's schema, with the writer's lineage in the file."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from warehouse.schemas import PARQUET_TABLES

# Keys of a partition file's metadata: the run that wrote it and that run's inputs fingerprint, which is what
# a downstream stage fingerprints instead of hashing the data (`Warehouse.lineage`).
LINEAGE_RUN_ID = "nkb.run_id"
LINEAGE_FINGERPRINT = "nkb.inputs_fingerprint"
# Set in every file whose pages carry a CRC-32 (Parquet's page checksum): reads verify each page they decode, so a
# flipped byte in the data fails the read, and the registry keeps a digest of the footer, which checksums do not
# cover (`Warehouse.table_files`). Files written before lack it; they are checked by their whole digest.
PAGE_CHECKSUMS = "nkb.page_checksums"

# How every table file is read: each page's checksum verified as it is decoded (a full scan of a 2 GB table took 16 %
# longer on a 2-core AMD EPYC, of a 6 GB one no measurable time more; docs/results.md).
CHECKED_PARQUET = ds.ParquetFileFormat(
    default_fragment_scan_options=ds.ParquetFragmentScanOptions(page_checksum_verification=True))


class PartitionWriter:
    """Writes batches conforming to a table schema; the `run_id` column is filled in."""

    def __init__(self, path: Path, schema: pa.Schema, run_id: str, inputs_fingerprint: str):
        self.path, self.schema, self.run_id = path, schema, run_id
        self.rows = 0
        meta = {LINEAGE_RUN_ID: run_id, LINEAGE_FINGERPRINT: inputs_fingerprint, PAGE_CHECKSUMS: "crc32"}
        self._writer = pq.ParquetWriter(path, schema.with_metadata(meta), compression="zstd", write_page_checksum=True)

    def write(self, data: pa.Table | pa.RecordBatch | dict[str, list]) -> None:
        if isinstance(data, dict):
            table = pa.table(data)
        elif isinstance(data, pa.RecordBatch):
            table = pa.Table.from_batches([data])
        else:
            table = data
        if "run_id" not in table.schema.names:
            table = table.append_column("run_id", pa.array([self.run_id] * table.num_rows, pa.string()))
        table = table.select(self.schema.names).cast(self.schema)
        self._writer.write_table(table)
        self.rows += table.num_rows

    def append_file(self, path: str | Path) -> None:
        """Copy in the rows of a Parquet file of this table (a part another process wrote), a row group at a time."""
        source = pq.ParquetFile(path, page_checksum_verification=True)
        for group in range(source.num_row_groups):
            self.write(source.read_row_group(group))

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


@dataclass(frozen=True)
class ShardTarget:
    """One shard's file and the lineage it carries; picklable and JSON-able (only strings), so that another
    process (a Dask worker) can write it."""
    path: str
    table: str
    run_id: str
    inputs_fingerprint: str

    def write(self, data: pa.Table | dict[str, list] | Iterable[pa.Table | dict[str, list]]) -> int:
        """Write the shard atomically (a crash leaves no half-written shard) from one table or a stream of them (held
        one at a time); returns its rows."""
        final = Path(self.path)
        tmp = final.with_suffix(".parquet.tmp")
        writer = PartitionWriter(tmp, PARQUET_TABLES[self.table], self.run_id, self.inputs_fingerprint)
        try:
            for batch in [data] if isinstance(data, (pa.Table, dict)) else data:
                writer.write(batch)
        finally:
            writer.close()
        os.replace(tmp, final)
        return writer.rows
