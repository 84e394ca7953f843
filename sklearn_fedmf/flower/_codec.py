"""A codec between the protocols' Python values and Flower records, without pickle.

A protocol's client state, upload, broadcast or metric sums is a tree of dicts, lists,
tuples, NamedTuples and dataclasses of this package, numpy arrays and scalars, scipy sparse
matrices, numbers, strings, bytes and ``None``. :func:`encode` turns such a tree into an
``ArrayRecord`` holding every array (each saved by numpy with ``allow_pickle=False``:
bit-exact, dtype and memory order kept) and a ``ConfigRecord`` holding the tree's shape as
JSON; :func:`decode` inverts it. Nothing is executed while decoding: an object is rebuilt
only from a class of this package.
"""

from __future__ import annotations

import dataclasses
import importlib
import json

import numpy as np
import scipy.sparse as sp
from flwr.app import Array, ArrayRecord, ConfigRecord

__all__ = ["encode", "decode", "put", "take"]

_SPARSE_PARTS = {"csr": ("data", "indices", "indptr"), "csc": ("data", "indices", "indptr"),
                 "coo": ("data", "row", "col")}


def _class_path(obj):
    cls = type(obj)
    if not cls.__module__.startswith("sklearn_fedmf."):
        raise TypeError(f"Cannot send a {cls.__qualname__} of {cls.__module__}.")
    return f"{cls.__module__}:{cls.__qualname__}"


def _class_of(path):
    """A class of this package named by :func:`_class_path` (nothing else is rebuilt)."""
    module, name = path.split(":")
    if not module.startswith("sklearn_fedmf."):
        raise ValueError(f"Refusing to rebuild an object of {module}.")
    cls = importlib.import_module(module)
    for part in name.split("."):
        cls = getattr(cls, part)
    return cls


def encode(value):
    """``(ArrayRecord, ConfigRecord)`` holding ``value`` (see the module docstring)."""
    arrays = {}

    def put(array):
        key = str(len(arrays))
        arrays[key] = Array(np.asarray(array))
        return key

    def tree(v):
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, bytes):  # (secure aggregation's keys, seeds and ciphertexts)
            return {"bytes": put(np.frombuffer(v, dtype=np.uint8))}
        if isinstance(v, (int, float)) and not isinstance(v, np.generic):
            return {"int": v} if isinstance(v, int) else {"float": repr(v)}
        if isinstance(v, (np.ndarray, np.generic)):
            if v.dtype.hasobject:
                raise TypeError("Cannot send an array of Python objects.")
            return {"array": put(v), "scalar": isinstance(v, np.generic)}
        if sp.issparse(v):
            fmt = v.format
            if fmt not in _SPARSE_PARTS:
                v, fmt = v.tocsr(), "csr"
            return {"sparse": fmt, "shape": list(v.shape),
                    "parts": [put(getattr(v, name)) for name in _SPARSE_PARTS[fmt]]}
        if isinstance(v, tuple) and hasattr(v, "_fields"):
            return {"namedtuple": _class_path(v), "items": [tree(x) for x in v]}
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return {"dataclass": _class_path(v),
                    "fields": {f.name: tree(getattr(v, f.name)) for f in dataclasses.fields(v)}}
        if isinstance(v, (list, tuple)):
            return {type(v).__name__: [tree(x) for x in v]}
        if isinstance(v, dict):
            return {"dict": [[tree(k), tree(x)] for k, x in v.items()]}
        raise TypeError(f"Cannot send a value of type {type(v).__name__}.")

    structure = json.dumps(tree(value), allow_nan=False)
    return ArrayRecord(arrays), ConfigRecord({"tree": structure})


def decode(arrays, config):
    """The value that :func:`encode` turned into ``(arrays, config)``."""
    loaded = {}

    def get(key):
        if key not in loaded:
            loaded[key] = arrays[key].numpy()
        return loaded[key]

    def value(t):
        if t is None or isinstance(t, (bool, str)):
            return t
        if "int" in t:
            return int(t["int"])
        if "float" in t:
            return float(t["float"])
        if "bytes" in t:
            return get(t["bytes"]).tobytes()
        if "array" in t:
            a = get(t["array"])
            return a[()] if t["scalar"] else a
        if "sparse" in t:
            fmt, parts = t["sparse"], [get(k) for k in t["parts"]]
            shape = tuple(t["shape"])
            if fmt == "coo":
                return sp.coo_matrix((parts[0], (parts[1], parts[2])), shape=shape)
            cls = sp.csr_matrix if fmt == "csr" else sp.csc_matrix
            return cls(tuple(parts), shape=shape)
        if "namedtuple" in t:
            return _class_of(t["namedtuple"])(*(value(x) for x in t["items"]))
        if "dataclass" in t:
            return _class_of(t["dataclass"])(**{k: value(x) for k, x in t["fields"].items()})
        if "list" in t:
            return [value(x) for x in t["list"]]
        if "tuple" in t:
            return tuple(value(x) for x in t["tuple"])
        if "dict" in t:
            return {value(k): value(x) for k, x in t["dict"]}
        raise ValueError(f"Unknown entry in an encoded value: {sorted(t)}.")

    return value(json.loads(config["tree"]))


def put(records, name, value):
    """Store ``value`` in the RecordDict ``records`` under ``name`` (None: remove it)."""
    if value is None:
        records.pop(f"{name}.arrays", None)
        records.pop(f"{name}.tree", None)
    else:
        records[f"{name}.arrays"], records[f"{name}.tree"] = encode(value)


def take(records, name):
    """The value :func:`put` stored under ``name`` in ``records``, or None."""
    if f"{name}.tree" not in records:
        return None
    return decode(records[f"{name}.arrays"], records[f"{name}.tree"])
