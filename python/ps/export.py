"""Reading what ps-export wrote: a NumPy .npz of the model (docs/embeddings.md, "Export").

    exp = ps.load_export("model.npz")
    exp.dense["fc.weight"]            # float32, the tensor's shape
    exp.tables["user"].ids            # uint64 [n], sorted
    exp.tables["user"].rows           # float32 [n, dim]
    exp.meta                          # meta.json as a dict

    lk = ps.export_lookup("model.npz", "user")      # or (exp, "user")
    lk.index(ids)                     # row indices; ids not exported -> lk.missing
    lk.weight                         # float32 [n + 1, dim]: the rows, then a zero row
    bag = lk.embedding_bag(mode="sum")   # torch.nn.EmbeddingBag over lk.weight (frozen)
    bag(torch.from_numpy(lk.index(ids)), offsets)

Only numpy is needed; torch is imported by embedding_bag() alone. An id the
export does not hold (never trained, dropped by admission, eviction or TTL)
maps to the extra last row, which is zeros: pass missing="mean" for the mean
of the exported rows instead, or any float32 [dim] array. The shards would
have given such an id its initial value (init of the table); a serving stack
that wants that must not rely on the export for unseen ids.
"""
import json
import zipfile

import numpy as np

__all__ = ["Export", "ExportTable", "ExportLookup", "load_export", "export_lookup"]


class ExportTable:
    """One embedding table of an export: ids (uint64, sorted), rows (float32 [n, dim]),
    and with a --since export the ids dropped since (dropped, uint64; else None)."""

    def __init__(self, name, ids, rows, dropped, meta):
        self.name, self.ids, self.rows, self.dropped, self.meta = name, ids, rows, dropped, meta

    @property
    def dim(self):
        return self.rows.shape[1]

    def __len__(self):
        return len(self.ids)

    def __repr__(self):
        return f"<ps.ExportTable {self.name!r} {len(self)} rows of dim {self.dim}>"


class Export:
    """A whole export: dense {name: array}, tables {name: ExportTable}, meta (dict)."""

    def __init__(self, dense, tables, meta, path):
        self.dense, self.tables, self.meta, self.path = dense, tables, meta, path

    def __repr__(self):
        return (f"<ps.Export {self.path!r}: {len(self.dense)} dense tensors, "
                f"tables {sorted(self.tables)}>")


def load_export(path):
    """Reads a ps-export .npz: an Export. Raises ValueError naming the file and the member
    when it is not one (no meta.json, a table without its ids or rows, mismatched sizes)."""
    path = str(path)
    with zipfile.ZipFile(path) as z:
        names = set(z.namelist())
        if "meta.json" not in names:
            raise ValueError(f"{path}: no meta.json: not written by ps-export")
        meta = json.loads(z.read("meta.json").decode("utf-8"))

        def arr(name):
            if name not in names:
                raise ValueError(f"{path}: {name} is missing")
            with z.open(name) as f:
                return np.lib.format.read_array(f, allow_pickle=False)

        dense = {n: arr(f"dense/{n}.npy") for n in meta.get("dense", {})}
        tables = {}
        for n, tm in meta.get("tables", {}).items():
            ids = arr(f"tables/{n}/ids.npy")
            rows = arr(f"tables/{n}/rows.npy")
            dropped = (arr(f"tables/{n}/dropped.npy")
                       if f"tables/{n}/dropped.npy" in names else None)
            if ids.dtype != np.uint64 or rows.dtype != np.float32 or rows.ndim != 2 \
                    or rows.shape[0] != ids.shape[0] or rows.shape[1] != tm["dim"]:
                raise ValueError(f"{path}: table {n!r}: ids {ids.dtype}{ids.shape} and rows "
                                 f"{rows.dtype}{rows.shape} do not fit dim {tm['dim']}")
            tables[n] = ExportTable(n, ids, rows, dropped, tm)
    return Export(dense, tables, meta, path)


def _as_ids(ids):
    a = np.asarray(ids)
    if a.dtype == np.uint64:
        return a
    if a.dtype.kind not in "iu":
        raise TypeError(f"ids must be integers, not {a.dtype}")
    # int64 ids (torch's) are the same 64 bits as the uint64 the shards keep
    return a.astype(np.int64, copy=False).view(np.uint64)


class ExportLookup:
    """An nn.EmbeddingBag-ready view of one exported table.

    weight: float32 [n + 1, dim], the exported rows then the row for ids not exported
    (missing, index n). index(ids) maps uint64 or int64 ids of any shape to int64 row
    indices (same shape). lookup(ids) gives the rows themselves."""

    def __init__(self, table, missing="zeros"):
        self.table = table
        self.ids = table.ids
        self.missing = len(table.ids)
        if isinstance(missing, str):
            if missing == "zeros":
                extra = np.zeros(table.dim, np.float32)
            elif missing == "mean":
                extra = (table.rows.mean(axis=0) if len(table.ids)
                         else np.zeros(table.dim)).astype(np.float32)
            else:
                raise ValueError(f"missing={missing!r}: expected 'zeros', 'mean' or an array")
        else:
            extra = np.asarray(missing, np.float32).reshape(table.dim)
        self.weight = np.concatenate([table.rows, extra[None, :]], axis=0)

    def index(self, ids):
        q = _as_ids(ids)
        at = np.searchsorted(self.ids, q.ravel())
        at = np.minimum(at, max(len(self.ids) - 1, 0))
        found = (self.ids[at] == q.ravel()) if len(self.ids) else np.zeros(q.size, bool)
        return np.where(found, at, self.missing).astype(np.int64).reshape(q.shape)

    def lookup(self, ids):
        return self.weight[self.index(ids)]

    def embedding_bag(self, mode="sum", **kw):
        """torch.nn.EmbeddingBag.from_pretrained(weight, freeze=True, mode=mode): feed it
        index(ids) (as a torch tensor) and the usual offsets or per_sample_weights."""
        import torch
        return torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(self.weight.copy()),
                                                     freeze=True, mode=mode, **kw)


def export_lookup(export, table, missing="zeros"):
    """ExportLookup of table from an Export or a path to a ps-export .npz."""
    exp = export if isinstance(export, Export) else load_export(export)
    if table not in exp.tables:
        raise KeyError(f"{exp.path}: no table {table!r} (tables: {sorted(exp.tables)})")
    return ExportLookup(exp.tables[table], missing)
