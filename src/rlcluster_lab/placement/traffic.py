"""What a compiled XLA program moves between devices, read from the program itself.

Each collective of the compiled HLO (opcode, result shapes, operands, replica groups or
source-target pairs) becomes the device-to-device flows it implies, attributed to the
program parameters its operands come from. Per collective, the bytes one member receives:
``all-to-all``: the chunk each other member addresses to it (tuple form: operand ``i`` to
member ``i``; array form: group-size chunks); ``all-gather``: each other member's operand;
``collective-permute``: the operand, per pair; ``reduce-scatter``: each other member's 1/n;
``all-reduce``: each other member's operand (a direct exchange; XLA's algorithm may
differ); ``collective-broadcast``: the root's operand. Group and pair ids are partitions,
mapped to devices by the program's device assignment. An instruction that cannot be read
is listed in ``unreadable``, and its bytes are reported as not derivable.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

# An HLO element type: pred, or a letter code and its bit width (s8, u32, bf16, c64,
# f8e4m3fn, f4e2m1fn...); types under a byte are stored one per byte.
_ELEMENT = re.compile(r"pred|(?:s|u|f|bf|c)(\d+)(?:e\d+m\d+\w*)?")
_COLLECTIVES = frozenset(
    "all-to-all all-gather all-gather-start collective-permute collective-permute-start all-reduce "
    "all-reduce-start reduce-scatter collective-broadcast ragged-all-to-all".split()
)
_UNREADABLE = frozenset("send recv send-done recv-done ragged-all-to-all".split())


@dataclasses.dataclass(frozen=True)
class Flow:
    """Bytes one collective carried from one device to another, for ``param``: the index of the
    program input the data comes from (a leaf of the resharded tree), or None when untraced."""

    op: str
    src_device: int
    dst_device: int
    nbytes: int
    param: int | None


@dataclasses.dataclass(frozen=True)
class ProgramTraffic:
    """Every cross-device flow of one compiled program, and what could not be read."""

    flows: tuple[Flow, ...]
    unreadable: tuple[str, ...]

    @property
    def exact(self) -> bool:
        return not self.unreadable


def program_traffic(compiled: Any, devices: Sequence[Any]) -> ProgramTraffic:
    """The cross-device flows of a ``jax.stages.Compiled`` whose partition ``i`` runs on
    ``devices[i]`` (its mesh's flat device order), and what could not be read."""
    ids = [int(d.id) for d in devices]
    flows: list[Flow] = []
    unreadable: list[str] = []
    for module in compiled.runtime_executable().hlo_modules():
        params = _entry_parameters(module)
        for comp in module.computations():
            for ins in comp.instructions():
                name = _opcode_name(ins)
                if name in _UNREADABLE:
                    unreadable.append(ins.to_string()[:200])
                    continue
                root = ins.async_wrapped_root if name == "async-start" else ins
                op = _opcode_name(root)
                if op not in _COLLECTIVES:
                    continue
                text = root.to_string()
                try:
                    found = _flows(op, text, ins.operands(), len(ids), params)
                except _Unreadable as exc:
                    unreadable.append(f"{op}: {exc}: {text[:200]}")
                    continue
                flows.extend(Flow(op, ids[s], ids[t], n, p) for s, t, n, p in found if s != t and n)
    return ProgramTraffic(tuple(flows), tuple(unreadable))


class _Unreadable(ValueError):
    pass


def _opcode_name(ins: Any) -> str:
    # HloOpcode.kAllToAll -> all-to-all
    raw = str(ins.opcode).split(".")[-1]
    raw = raw[1:] if raw.startswith("k") else raw
    return re.sub(r"(?<!^)([A-Z])", r"-\1", raw).lower()


def _entry_parameters(module: Any) -> dict[str, int]:
    """Instruction name -> parameter number, for the entry computation's parameters."""
    match = re.search(r"^ENTRY %?([\w.\-]+)", module.to_string(), re.M)
    entry = match.group(1) if match else None
    out = {}
    for comp in (c for c in module.computations() if c.name == entry):
        for ins in comp.instructions():
            if _opcode_name(ins) == "parameter" and (m := re.search(r"parameter\((\d+)\)", ins.to_string())):
                out[ins.name] = int(m.group(1))
    return out


def _roots(ins: Any, params: dict[str, int], seen: dict[str, frozenset[int]]) -> frozenset[int]:
    """The entry parameters an instruction's value is computed from."""
    out: set[int] = set()
    stack = [ins]
    while stack:
        cur = stack.pop()
        if cur.name in seen:
            out |= seen[cur.name]
        elif cur.name in params:
            out.add(params[cur.name])
        else:
            stack.extend(cur.operands())
    seen[ins.name] = frozenset(out)
    return seen[ins.name]


def _flows(
    op: str, text: str, operands: Sequence[Any], n: int, params: dict[str, int]
) -> list[tuple[int, int, int, int | None]]:
    """(src partition, dst partition, bytes, parameter) for one collective."""
    seen: dict[str, frozenset[int]] = {}
    sizes = [_array_bytes(_result_shape(o.to_string())) for o in operands]
    roots = [_roots(o, params, seen) for o in operands]
    out: list[tuple[int, int, int, int | None]] = []

    def add(src: int, dst: int, nbytes: int, k: int) -> None:
        for param, share in _attribute(nbytes, roots[k]):
            out.append((src, dst, share, param))

    if op in ("collective-permute", "collective-permute-start"):
        pairs = _pairs(text)
        for k in range(len(operands)):
            for s, t in pairs:
                add(s, t, sizes[k], k)
        return out
    groups = _groups(text, n)
    if op == "all-to-all":
        for group in groups:
            m = len(group)
            if len(operands) == m:
                chunks = [(k, sizes[k]) for k in range(m)]  # tuple form: operand k to member k
                for src in group:
                    for k, nbytes in chunks:
                        add(src, group[k], nbytes, k)
            elif len(operands) == 1:
                if sizes[0] % m:
                    raise _Unreadable(f"operand of {sizes[0]} bytes does not split in {m} chunks")
                for src in group:
                    for dst in group:
                        add(src, dst, sizes[0] // m, 0)
            else:
                raise _Unreadable(f"{len(operands)} operands for groups of {m}")
        return out
    for group in groups:
        m = len(group)
        for k in range(len(operands)):
            if op in ("all-gather", "all-gather-start", "all-reduce", "all-reduce-start"):
                per = sizes[k]
            elif op == "reduce-scatter":
                if sizes[k] % m:
                    raise _Unreadable(f"operand of {sizes[k]} bytes does not scatter over {m}")
                per = sizes[k] // m
            elif op == "collective-broadcast":
                for dst in group[1:]:
                    add(group[0], dst, sizes[k], k)
                continue
            else:
                raise _Unreadable("collective kind not modelled")
            for src in group:
                for dst in group:
                    add(src, dst, per, k)
    return out


def _attribute(nbytes: int, roots: frozenset[int]) -> list[tuple[int | None, int]]:
    """Split bytes over the parameters they come from (equal shares; rare: XLA combined leaves)."""
    if not roots:
        return [(None, nbytes)]
    order = sorted(roots)
    share, rest = divmod(nbytes, len(order))
    return [(p, share + (rest if i == len(order) - 1 else 0)) for i, p in enumerate(order)]


_SHAPE = re.compile(r"([a-z][a-z0-9]*)\[([0-9,]*)\]")


def _result_shape(text: str) -> list[tuple[str, tuple[int, ...]]]:
    """The array parts of an instruction's result shape: ``%x = f32[2,3]{1,0} op(...)``."""
    head = text.split("=", 1)[1].lstrip() if "=" in text else text
    if head.startswith("("):
        head = head[1 : _closing(head, 0) or 0]  # unbalanced: nothing
    else:
        head = head.split(" ", 1)[0]
    return [(dt, tuple(int(d) for d in dims.split(",") if d)) for dt, dims in _SHAPE.findall(head)]


def _array_bytes(parts: list[tuple[str, tuple[int, ...]]]) -> int:
    total = 0
    for dtype, dims in parts:
        if dtype in ("token", "opaque"):
            continue
        element = _ELEMENT.fullmatch(dtype)
        if element is None:
            raise _Unreadable(f"unknown element type {dtype}")
        item = max(1, int(element.group(1) or 8) // 8)
        total += int(np.prod(dims, dtype=np.int64)) * item
    return total


def _pairs(text: str) -> list[tuple[int, int]]:
    m = re.search(r"source_target_pairs=\{(.*?)\}\}", text)
    if not m:
        if "source_target_pairs={}" in text:
            return []
        raise _Unreadable("no source_target_pairs")
    return [(int(a), int(b)) for a, b in re.findall(r"\{(\d+),(\d+)", m.group(1) + "}")]


def _groups(text: str, n: int) -> list[list[int]]:
    """Replica groups as lists of partition ids, in any of the printed formats."""
    if "replica_groups=" not in text:
        return [list(range(n))]
    rest = text.split("replica_groups=", 1)[1]
    if rest.startswith("{}"):
        return [list(range(n))]
    if rest.startswith("{"):
        body = rest[1 : rest.index("}}") + 1] if "}}" in rest else ""
        groups = [[int(x) for x in g.split(",") if x.strip()] for g in re.findall(r"\{([\d,\s]*)\}", body)]
        if not groups:
            raise _Unreadable("empty explicit replica groups")
        return groups
    if rest.startswith("["):
        m = re.match(r"(\[[\d,]+\](?:<=\[[\d,]+\])?(?:T\([\d,]+\))?)", rest)
        if not m:
            raise _Unreadable("unknown iota replica group format")
        arr = _iota(m.group(1))
        return [list(map(int, row)) for row in arr.reshape(arr.shape[0], -1)]
    if rest.startswith("mesh["):
        return _mesh_groups(rest)
    raise _Unreadable("unknown replica group format")


def _mesh_groups(rest: str) -> list[list[int]]:
    """``mesh['a'=4,'b'=2], device_ids=(...) {'a':(2)2}``: groups along (sub-)axes of a mesh, where
    ``'a':(pre)size`` is the middle part of axis ``a`` split as (pre, size, rest)."""
    close = rest.index("]")
    axes = re.findall(r"'([^']+)'=(\d+)", rest[5:close])
    if not axes:
        raise _Unreadable("mesh replica groups without axes")
    tail = rest[close + 1 :]
    ids_spec = None
    if tail.startswith(", device_ids=("):
        i = len(", device_ids=")
        j = _closing(tail, i)
        if j is not None:
            ids_spec, tail = tail[i + 1 : j], tail[j + 1 :]
    m = re.match(r"\s*\{([^}]*)\}", tail)
    if not m:
        raise _Unreadable("mesh replica groups without group axes")
    picked = re.findall(r"'([^']+)'(?::\((\d+)\)(\d+))?", m.group(1))
    sizes = {a: int(s) for a, s in axes}
    size = int(np.prod(list(sizes.values())))
    ids = _device_ids(ids_spec, size) if ids_spec else np.arange(size)
    # Expand each axis into (pre, size, post) parts so a sub-axis is a dimension of its own.
    split = {a: (1, sizes[a], 1) for a in sizes}
    for a, pre, sub in picked:
        if a not in sizes:
            raise _Unreadable(f"group axis {a!r} not in mesh axes {list(sizes)}")
        if pre:
            pre_i, sub_i = int(pre), int(sub)
            if sizes[a] % (pre_i * sub_i):
                raise _Unreadable(f"sub-axis {a}:({pre}){sub} does not divide {sizes[a]}")
            split[a] = (pre_i, sub_i, sizes[a] // (pre_i * sub_i))
    dims = [n for a, _ in axes for n in split[a]]
    arr = ids.reshape(dims)
    grouped = [3 * [a for a, _ in axes].index(a) + 1 for a, _, _ in picked]
    others = [i for i in range(len(dims)) if i not in grouped]
    arr = arr.transpose(others + grouped)
    width = int(np.prod([dims[i] for i in grouped])) if grouped else 1
    return [list(map(int, row)) for row in arr.reshape(-1, width)]


def _closing(text: str, start: int) -> int | None:
    """The index of the parenthesis closing the one at ``text[start]`` (None: unbalanced)."""
    depth = 0
    for i in range(start, len(text)):
        depth += text[i] == "("
        depth -= text[i] == ")"
        if depth == 0:
            return i
    return None


def _device_ids(spec: str, size: int) -> np.ndarray:
    spec = spec.strip()
    if spec.startswith("["):
        ids = _iota(spec).reshape(-1)
    else:
        ids = np.array([int(x) for x in spec.split(",") if x.strip()])
    if ids.size != size:
        raise _Unreadable(f"device_ids has {ids.size} entries for a mesh of {size}")
    return ids


def _iota(spec: str) -> np.ndarray:
    """``[2,4]<=[8]``, ``[4,2]<=[2,4]T(1,0)`` or ``[2,4]T(1,0)``: an iota tile assignment."""
    m = re.fullmatch(r"\[([\d,]+)\](?:<=\[([\d,]+)\])?(?:T\(([\d,]+)\))?", spec.strip())
    if not m:
        raise _Unreadable(f"unknown iota format {spec!r}")
    dims = [int(x) for x in m.group(1).split(",")]
    # "[2,4]T(1,0)" (no reshape): iota of these dims, transposed, as it is.
    reshape = dims if m.group(2) is None else [int(x) for x in m.group(2).split(",")]
    arr = np.arange(int(np.prod(reshape))).reshape(reshape)
    if m.group(3):
        arr = arr.transpose([int(x) for x in m.group(3).split(",")])
    return arr if m.group(2) is None else arr.reshape(dims)
