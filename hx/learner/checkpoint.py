"""Policy checkpoints: a directory of files, a content address, and a copy in the log's object store.

A checkpoint is ``config.json`` (the kind and its settings), ``model.safetensors`` (every
``nnx.Param`` of the model, flattened with ``/``-joined paths) and the kind's side files
(a tokenizer). Its *version* is the sha256 of those files' names and digests, so the same
weights always have the same version wherever they were saved, and a policy's responses
name exactly the parameters that produced them. In the object store each file is the blob
``policy/<version>/<file>``; ``fetch`` rebuilds a policy from them and checks the version.

On disk the weights may instead be in Orbax form: ``config.json``, the side files and a
directory ``params/`` holding an ``orbax.checkpoint`` pytree checkpoint of the pure dict of
``nnx.state(model, nnx.Param)`` (``save(..., format="orbax")`` writes one; one written from an
``nnx.State``, leaves under ``value``, loads too; see ``orbax_params``). The version stays
that of the canonical files above, so a policy has the same version in either form. A
directory holding both forms, or neither, does not load.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np
from flax import nnx
from nats.js.errors import NotFoundError, ObjectNotFoundError
from safetensors.numpy import load as load_tensors
from safetensors.numpy import save as save_tensors

from hx.learner import orbax_params
from hx.learner.errors import PolicyError
from hx.learner.policy import Policy, policy_kind
from schemas.identities import PolicyVersion
from streams.log import EventLog
from streams.topology import BLOB_STORE

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
PARAMS = "params"
_CHUNK = 1024 * 1024


def _flat(tree: Mapping[Any, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"  # layer indices are ints: join as text
        if isinstance(value, Mapping):
            out.update(_flat(value, f"{path}/"))
        else:
            out[path] = value
    return out


def _replace(tree: Mapping[Any, Any], tensors: Mapping[str, np.ndarray], where: str,
             prefix: str = "") -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out[key] = _replace(value, tensors, where, f"{path}/")
            continue
        if path not in tensors:
            raise PolicyError(f"{where}: the weights lack tensor {path!r}")
        got = tensors[path]
        if got.shape != tuple(value.shape) or got.dtype != np.dtype(value.dtype):
            raise PolicyError(f"{where}: tensor {path!r} is {got.dtype}{list(got.shape)}, the model wants "
                              f"{np.dtype(value.dtype)}{list(value.shape)}")
        out[key] = got
    return out


def files_of(policy: Policy) -> dict[str, bytes]:
    """The checkpoint's files: config, weights, side files."""
    params = nnx.to_pure_dict(nnx.state(policy.model, nnx.Param))
    tensors = {k: np.asarray(v) for k, v in _flat(params).items()}
    config = json.dumps(policy.config, sort_keys=True, indent=1).encode()
    return {CONFIG: config, WEIGHTS: save_tensors(tensors), **policy.files()}


def version_of(files: Mapping[str, bytes]) -> PolicyVersion:
    """The content address of a checkpoint: sha256 over its files' names and sha256s, in name order."""
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(f"{name}\x1f{hashlib.sha256(files[name]).hexdigest()}\n".encode())
    return PolicyVersion(h.hexdigest())


def version(policy: Policy) -> PolicyVersion:
    """The version of a policy's current parameters."""
    return version_of(files_of(policy))


def _built(files: Mapping[str, bytes], where: str) -> Policy:
    # a fresh policy of the config's kind and settings, with the side files; its weights are set next
    if CONFIG not in files:
        raise PolicyError(f"{where}: no {CONFIG}")
    try:
        config = json.loads(files[CONFIG])
    except ValueError as exc:
        raise PolicyError(f"{where}: {CONFIG} is not JSON: {exc}") from None
    if not isinstance(config, dict) or not isinstance(config.get("kind"), str):
        raise PolicyError(f"{where}: {CONFIG} names no policy kind")
    side = {k: v for k, v in files.items() if k not in (CONFIG, WEIGHTS)}
    try:
        kind = policy_kind(config["kind"])
        return kind.build({**kind.legacy, **config}, side, seed=0)
    except PolicyError as exc:
        raise PolicyError(f"{where}: {exc}") from None


def _with_params(policy: Policy, tensors: Mapping[str, np.ndarray], where: str) -> Policy:
    # every Param of the model from ``tensors`` (by ``/``-joined path), checked against the model
    state = nnx.state(policy.model, nnx.Param)
    nnx.replace_by_pure_dict(state, _replace(nnx.to_pure_dict(state), tensors, where))
    nnx.update(policy.model, state)
    return policy


def from_files(files: Mapping[str, bytes], where: str) -> Policy:
    """A policy rebuilt from a checkpoint's files; ``PolicyError`` naming ``where`` and what is wrong."""
    for name in (CONFIG, WEIGHTS):
        if name not in files:
            raise PolicyError(f"{where}: no {name}")
    policy = _built(files, where)
    try:
        tensors = load_tensors(files[WEIGHTS])
    except Exception as exc:  # noqa: BLE001 - safetensors raises several kinds for a damaged file
        raise PolicyError(f"{where}: {WEIGHTS} does not load: {exc}") from None
    return _with_params(policy, tensors, where)


def save(policy: Policy, directory: str | Path, *,
         format: Literal["safetensors", "orbax"] = "safetensors") -> PolicyVersion:
    """Write a policy to a checkpoint directory, its weights as safetensors or Orbax; its version (the same for both).

    The other form's weights, if the directory held them, are removed: the directory holds one checkpoint.
    """
    if format not in ("safetensors", "orbax"):
        raise ValueError(f"checkpoint format {format!r}: expected 'safetensors' or 'orbax'")
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    files = files_of(policy)
    if format == "orbax":
        orbax_params.write(nnx.to_pure_dict(nnx.state(policy.model, nnx.Param)), path / PARAMS)
        (path / WEIGHTS).unlink(missing_ok=True)
    elif (path / PARAMS).is_dir():
        shutil.rmtree(path / PARAMS)
    for name, data in files.items():
        if not (name == WEIGHTS and format == "orbax"):
            (path / name).write_bytes(data)
    return version_of(files)


def load(directory: str | Path) -> Policy:
    """A policy from a checkpoint directory, safetensors or Orbax form; ``PolicyError`` when it does not load."""
    path = Path(directory)
    where = f"checkpoint {str(path)!r}"
    if not path.is_dir():
        raise PolicyError(f"{where} is not a directory")
    files = {p.name: p.read_bytes() for p in path.iterdir() if p.is_file()}
    if not (path / PARAMS).exists():
        if WEIGHTS not in files:
            raise PolicyError(f"{where}: no {WEIGHTS} and no {PARAMS}/ (Orbax)")
        return from_files(files, where)
    if WEIGHTS in files:
        raise PolicyError(f"{where}: holds both {WEIGHTS} and {PARAMS}/ (Orbax); keep one")
    if not (path / PARAMS).is_dir():
        raise PolicyError(f"{where}: {PARAMS} is not a directory (Orbax params are one)")
    policy = _built(files, where)
    like = nnx.to_pure_dict(nnx.state(policy.model, nnx.Param))
    return _with_params(policy, _flat(orbax_params.read(path / PARAMS, like, where)), where)


def create(kind: str, config: Mapping[str, Any] | None = None, *, seed: int = 0) -> Policy:
    """A freshly initialised policy of a kind."""
    return policy_kind(kind).build(dict(config or {}), {}, seed=seed)


async def store(log: EventLog, policy: Policy) -> tuple[PolicyVersion, int]:
    """Put a policy's checkpoint in the object store; its version and size in bytes (a no-op when already there).

    The files go first and the index (``policy/<version>``, their names) last: a checkpoint
    cut off mid-way has no index and reads as absent, never as a partial policy.
    """
    return await store_files(log, files_of(policy))


async def store_files(log: EventLog, files: Mapping[str, bytes]) -> tuple[PolicyVersion, int]:
    """``store`` for a checkpoint's files already made (``files_of``)."""
    ver = version_of(files)
    blobs = await log.js.object_store(BLOB_STORE)
    try:
        await blobs.get_info(f"policy/{ver}")
        return ver, sum(len(d) for d in files.values())
    except (ObjectNotFoundError, NotFoundError):
        pass
    for name, data in sorted(files.items()):
        await blobs.put(f"policy/{ver}/{name}", data)
    await blobs.put(f"policy/{ver}", json.dumps(sorted(files)).encode())
    return ver, sum(len(d) for d in files.values())


async def stored(log: EventLog, ver: str) -> bool:
    """Whether the object store holds a complete checkpoint of this version."""
    blobs = await log.js.object_store(BLOB_STORE)
    try:
        await blobs.get_info(f"policy/{ver}")
    except (ObjectNotFoundError, NotFoundError):
        return False
    return True


async def fetch(log: EventLog, ver: str) -> Policy:
    """The policy of a stored version; ``PolicyError`` when it is not stored or its files do not match it."""
    blobs = await log.js.object_store(BLOB_STORE)
    where = f"policy checkpoint {ver[:12]!r}"
    try:
        names = json.loads((await blobs.get(f"policy/{ver}")).data or b"[]")
    except (ObjectNotFoundError, NotFoundError):
        raise PolicyError(f"no {where} in the object store") from None
    except ValueError:
        raise PolicyError(f"{where}: its index in the object store is damaged") from None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise PolicyError(f"{where}: its index in the object store is damaged")
    files: dict[str, bytes] = {}
    for name in names:
        try:
            files[name] = (await blobs.get(f"policy/{ver}/{name}")).data or b""
        except (ObjectNotFoundError, NotFoundError):
            raise PolicyError(f"{where}: file {name} is missing from the object store") from None
    if version_of(files) != ver:
        raise PolicyError(f"{where}: its files do not hash to its version (damaged)")
    return from_files(files, where)
