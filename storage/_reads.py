"""Row reads of a cold store (get, counts, recent): from the mirror and the log, or from LanceDB without a mirror."""
from __future__ import annotations

import json
from typing import TYPE_CHECKING

import numpy as np

from ._schema import filter_sql, rows_from_arrow, sql_id_list, timestamps_us

if TYPE_CHECKING:
    from ._follower import Follower
    from ._tables import LanceTables


def as_recent(rows: list[dict], dim: int) -> dict:
    """Rows as get() returns them, in the form recent() and vectors_of() return."""
    return {
        "ids": np.array([r["id"] for r in rows], dtype=np.int64),
        "vectors": np.stack([r["vector"] for r in rows]).astype(np.float32) if rows else np.empty((0, dim), np.float32),
        "namespace": [r["namespace"] for r in rows],
        "created_at_us": np.array([r["created_at_us"] for r in rows], dtype=np.int64),
    }


def in_order(rows: dict[int, dict], ids: np.ndarray) -> list[dict | None]:
    """get()'s answer: a copy of each row of `ids` in that order (None where absent)."""
    out = []
    for row_id in ids.tolist():
        row = rows.get(row_id)
        out.append(None if row is None else {**row, "metadata": dict(row["metadata"]), "vector": row["vector"].copy()})
    return out


class RowReads:
    """The reads that are not searches, under the store's lock with the view in step. Holds no state of its own:
    the follower's view answers, or the table where the mirror is past its budget."""

    def __init__(self, follower: "Follower", tables: "LanceTables", dim: int) -> None:
        self._follower = follower
        self._tables = tables
        self._dim = dim

    def rows_locked(self, ids: np.ndarray) -> dict[int, dict]:
        """id -> row for the live rows among `ids` (each once): logged operations the table lacks answer from the
        log (the follower followed it to its end), the rest from the table."""
        rows: dict[int, dict] = {}
        in_table = []
        for row_id in ids.tolist():
            logged = self._follower.newest_logged(row_id)
            if logged is None:
                in_table.append(row_id)
            elif logged[0] is not None:  # logged rows are newer than the table's; a logged delete leaves None
                r, j = logged
                meta = r.metadata_json[j]
                rows[row_id] = {"id": row_id, "namespace": r.namespaces[j], "session": r.sessions[j],
                                "role": r.roles[j], "text": r.texts[j], "created_at_us": int(r.created_at_us[j]),
                                "metadata": json.loads(meta) if meta else {}, "vector": r.vectors[j]}
        if in_table:
            wanted = np.asarray(in_table, np.int64)
            data = self._tables.guard(f"get {wanted.size} rows", lambda: self._tables.table.search()
                                      .where(f"id IN {sql_id_list(wanted)}").limit(None).to_arrow())
            rows.update(rows_from_arrow(data, self._dim))
        return rows

    def count_locked(self, namespace: str | None) -> int:
        """Live rows (of one namespace when given): from the mirror when it is loaded, else counted by LanceDB."""
        m = self._follower.mirror
        if m is not None:
            return m.count(namespace)
        sql = filter_sql(namespace, None)
        return int(self._tables.guard("count rows", lambda: self._tables.table.count_rows(sql)))

    def namespace_counts_locked(self) -> dict[str, int]:
        """Live rows per namespace: from the mirror when it is loaded, else counted over the table."""
        m = self._follower.mirror
        if m is not None:
            return m.namespace_counts()
        data = self._tables.guard("count namespaces", lambda: self._tables.table.search().select(["namespace"])
                                  .limit(None).to_arrow())
        counts = data.column("namespace").value_counts().to_pylist()
        return {c["values"]: int(c["counts"]) for c in counts}

    def recent_ids_locked(self, limit: int, namespace: str | None) -> np.ndarray:
        """Without a mirror: the ids of the newest rows (by created_at, then larger id), from the table."""
        sql = filter_sql(namespace, None)

        def scan():
            builder = self._tables.table.search().select(["id", "created_at"]).limit(None)
            return (builder.where(sql) if sql else builder).to_arrow()
        meta = self._tables.guard("list recent rows", scan)
        ids = np.asarray(meta.column("id").to_numpy(), dtype=np.int64)
        created = timestamps_us(meta.column("created_at"))
        return ids[np.lexsort((-ids, -created))[:limit]]
