"""The cold table's Arrow schema, conversions between caller arrays and Arrow/row dicts, and SQL filter text."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa

TABLE_NAME = "memories"
VECTOR_COLUMN = "vector"


def memory_schema(dim: int) -> pa.Schema:
    """The Arrow schema of the memories table for `dim`-wide vectors (created_at as UTC microseconds, metadata as JSON
    text)."""
    return pa.schema([
        pa.field("id", pa.int64(), nullable=False),
        pa.field("namespace", pa.string(), nullable=False),
        pa.field("session", pa.string(), nullable=True),
        pa.field("role", pa.string(), nullable=True),
        pa.field("text", pa.string(), nullable=False),
        pa.field(VECTOR_COLUMN, pa.list_(pa.float32(), dim), nullable=False),
        pa.field("created_at", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("metadata", pa.string(), nullable=True),
    ])


def schema_dim(schema: pa.Schema) -> int | None:
    """The vector width of an existing table, or None when its vector column is not a fixed-size list."""
    if VECTOR_COLUMN not in schema.names:
        return None
    vtype = schema.field(VECTOR_COLUMN).type
    return vtype.list_size if pa.types.is_fixed_size_list(vtype) else None


def vectors_to_arrow(vectors: np.ndarray) -> pa.FixedSizeListArray:
    """(n, dim) float32 -> a fixed-size-list column of n rows."""
    return pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1), type=pa.float32()), vectors.shape[1])


def vectors_from_arrow(column: pa.ChunkedArray | pa.Array, dim: int) -> np.ndarray:
    """A fixed-size-list vector column -> (n, dim) float32, C-contiguous."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if len(column) == 0:
        return np.empty((0, dim), np.float32)
    flat = column.flatten().to_numpy(zero_copy_only=False)
    return np.ascontiguousarray(flat, dtype=np.float32).reshape(-1, dim)


def timestamps_us(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A timestamp column -> (n,) int64 microseconds since the epoch."""
    return np.asarray(column.cast(pa.int64()).to_numpy(zero_copy_only=False), dtype=np.int64)


def build_batch(schema: pa.Schema, *, ids, vectors, namespaces, texts, sessions, roles, created_at_us, metadata_json) -> pa.Table:
    """One Arrow table of rows in `schema`'s column order, from the caller's arrays and lists (n of each)."""
    return pa.Table.from_arrays([
        pa.array(ids, type=pa.int64()),
        pa.array(namespaces, type=pa.string()),
        pa.array(sessions, type=pa.string()),
        pa.array(roles, type=pa.string()),
        pa.array(texts, type=pa.string()),
        vectors_to_arrow(vectors),
        pa.array(created_at_us, type=pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        pa.array(metadata_json, type=pa.string()),
    ], schema=schema)


def rows_from_arrow(table: pa.Table, dim: int) -> dict[int, dict]:
    """{id: row dict} of a table read from LanceDB, as ColdStore.get returns rows (metadata parsed, vector
    copied)."""
    ids = table.column("id").to_pylist()
    vectors = vectors_from_arrow(table.column(VECTOR_COLUMN), dim)
    created = timestamps_us(table.column("created_at"))
    cols = {name: table.column(name).to_pylist() for name in ("namespace", "session", "role", "text", "metadata")}
    out = {}
    for i, row_id in enumerate(ids):
        meta = cols["metadata"][i]
        out[row_id] = {
            "id": row_id,
            "namespace": cols["namespace"][i],
            "session": cols["session"][i],
            "role": cols["role"][i],
            "text": cols["text"][i],
            "created_at_us": int(created[i]),
            "metadata": json.loads(meta) if meta else {},
            "vector": vectors[i].copy(),
        }
    return out


def sql_string(value: str) -> str:
    """A SQL string literal for LanceDB filters (single quotes doubled)."""
    return "'" + value.replace("'", "''") + "'"


def sql_id_list(ids: np.ndarray) -> str:
    """A SQL list of ids, "(1,2,3)", for IN filters."""
    return "(" + ",".join(str(int(i)) for i in ids.tolist()) + ")"


def filter_escape(where: str) -> str | None:
    """Why a caller's where filter could reach past the conditions it is put beside (filter_sql puts it inside
    parentheses next to the namespace condition, and a search of a prefix next to its namespaces): parentheses that do
    not balance outside its quoted strings and names, an open quote, a SQL comment or a statement break. None when it
    has none of them. LanceDB checks the SQL itself when it runs it."""
    depth, quote, i = 0, None, 0
    while i < len(where):
        c = where[i]
        if quote is not None:
            if c == quote:
                if where[i + 1:i + 2] == quote:  # a doubled quote stands for itself
                    i += 1
                else:
                    quote = None
        elif c in "'\"`":
            quote = c
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth < 0:
                return "closes a parenthesis it did not open: balance its parentheses"
        elif where.startswith(("--", "/*"), i):
            return "holds a SQL comment (-- or /*): write the filter without one"
        elif c == ";":
            return "holds a ';': give one filter expression, not statements"
        i += 1
    if quote is not None:
        return f"leaves a {quote} quote open: close it (write a quote inside a string twice: 'O''Brien')"
    if depth:
        return "leaves a parenthesis open: balance its parentheses"
    return None


def filter_sql(namespace: str | None, where: str | None, excluded: np.ndarray | None = None) -> str | None:
    """One LanceDB filter for a namespace, a caller's where filter and ids to leave out (None: no filter)."""
    parts = []
    if namespace is not None:
        parts.append(f"namespace = {sql_string(namespace)}")
    if where is not None:
        parts.append(f"({where})")
    if excluded is not None and excluded.size:
        parts.append(f"id NOT IN {sql_id_list(np.unique(excluded))}")
    return " AND ".join(parts) or None
