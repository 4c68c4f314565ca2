"""``spec.tasks[].dataset``: where a task's prompts come from, and how a row becomes a prompt.

Referenced by ``Task.dataset`` in ``treadle.api.v1alpha1`` (so the CRD carries it); read by the
dataset reader (``treadle.data.reader``) and the feeder (``treadle.services.feeder``).

Exactly one source names the rows: ``path`` (a file in a ``Volume`` of ``spec.feeder.volumes``),
``configMap`` (a key of a ConfigMap, mounted at ``config_map_path``), ``url`` (http or https) or
``huggingFace`` (a dataset already in the pod's Hugging Face cache; nothing is downloaded). The
API server enforces "exactly one" with ``minProperties``/``maxProperties`` on ``source``, which
needs no CEL rule; ``Source`` checks the same in Python.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Annotated, Literal, Self

import pydantic
from pydantic import ConfigDict, Field
from pydantic.alias_generators import to_camel

from treadle.api import base

Format = Literal["jsonl", "json", "parquet"]
CONFIG_MAP_MOUNT = PurePosixPath("/etc/treadle-datasets")
"""Where the feeder's pod mounts each dataset ConfigMap: ``<mount>/<configMap.name>/<configMap.key>``."""
EXTENSIONS: dict[str, Format] = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "json",
    ".parquet": "parquet",
}
"""File extensions a ``format`` is inferred from when it is unset."""
MAX_EPOCHS = 9999
"""Epoch numbers go into group ids (``<task>:e<epoch>:<row id>``), which the scheduler bounds."""

Column = Annotated[str, Field(min_length=1, max_length=253)]


class ConfigMapKey(base.Model):
    """A key of a ConfigMap in the job's namespace."""

    name: str = Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    """ConfigMap name."""
    key: str = Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")
    """Key holding the dataset file; its extension gives the format when ``format`` is unset."""


class HuggingFace(base.Model):
    """A Hugging Face dataset resolved from the pod's local cache only (no network)."""

    name: str = Field(
        min_length=1, max_length=253, pattern=r"^[A-Za-z0-9][-A-Za-z0-9_.]*(/[-A-Za-z0-9_.]+)?$"
    )
    """Dataset repository id, e.g. ``openai/gsm8k``."""
    split: str = Field(default="train", min_length=1, max_length=128)
    """Split to read, e.g. ``train``."""
    config: str | None = Field(default=None, min_length=1, max_length=128)
    """Dataset configuration (subset), e.g. ``main``; unset for the default one."""


class Source(base.Model):
    """Where the rows are: exactly one of ``path``, ``configMap``, ``url``, ``huggingFace``."""

    model_config = ConfigDict(json_schema_extra={"minProperties": 1, "maxProperties": 1})

    path: str | None = Field(default=None, min_length=2, max_length=4096, pattern=r"^/")
    """Absolute path of a file under the ``mountPath`` of one of ``spec.feeder.volumes``."""
    config_map: ConfigMapKey | None = None
    """A ConfigMap key, mounted into the feeder's pod by the operator."""
    url: str | None = Field(default=None, max_length=2048, pattern=r"^https?://")
    """An http(s) URL the feeder downloads the file from at start."""
    hugging_face: HuggingFace | None = None
    """A Hugging Face dataset already in the pod's cache (``HF_HOME``); never downloaded."""

    @pydantic.model_validator(mode="after")
    def _exactly_one(self) -> Self:
        if len(self._given()) != 1:
            raise ValueError(
                f"set exactly one of path, configMap, url, huggingFace (got {len(self._given())})"
            )
        return self

    def _given(self) -> list[str]:
        return [name for name in type(self).model_fields if getattr(self, name) is not None]

    @property
    def kind(self) -> str:
        """The camelCase name of the source that is set, as error fields name it (``configMap``)."""
        return to_camel(self._given()[0])


class Dataset(base.Model):
    """The rows a task's prompts come from; the feeder submits one prompt group per row and epoch."""

    source: Source
    """Where the rows are."""
    format: Format | None = None
    """jsonl (one JSON object a line), json (an array of objects) or parquet; unset: from the file's
    extension (``.jsonl``/``.ndjson``, ``.json``, ``.parquet``). Not used for ``huggingFace``."""
    prompt_column: Column | None = None
    """Column holding the prompt text; unset: ``prompt``. Not allowed together with ``chatTemplate``."""
    chat_template: str | None = Field(default=None, min_length=1, max_length=16384)
    """A template over columns that builds the prompt, e.g. ``"Solve: {question}"`` (Python
    ``str.format`` fields; ``{{`` and ``}}`` for literal braces)."""
    answer_column: Column | None = None
    """Column holding the reference answer handed to the reward; unset: rows have no reference."""
    id_column: Column | None = None
    """Column holding a unique row id (letters, digits, ``.``, ``_``, ``-``; at most 80 characters);
    unset: the row's index in the file."""
    shuffle_seed: int = Field(default=0, ge=0, le=2**31 - 1)
    """Seed of the shuffle: each epoch feeds the rows in a permutation drawn from (seed, epoch)."""
    epochs: int = Field(default=1, ge=1, le=MAX_EPOCHS)
    """Passes over the rows; each row is fed once per epoch."""

    @pydantic.model_validator(mode="after")
    def _one_prompt(self) -> Self:
        if self.prompt_column is not None and self.chat_template is not None:
            raise ValueError("set promptColumn or chatTemplate, not both")
        return self

    @property
    def prompt_column_or_default(self) -> str:
        """The prompt column, or ``prompt`` when neither it nor a template is set."""
        return self.prompt_column or "prompt"


def config_map_path(key: ConfigMapKey, *, mount: PurePosixPath = CONFIG_MAP_MOUNT) -> PurePosixPath:
    """Where the feeder's pod sees a ConfigMap source (the operator mounts it there)."""
    return mount / key.name / key.key


MOUNT_PATH = r"^(/[-._A-Za-z0-9]*[-_A-Za-z0-9][-._A-Za-z0-9]*)+$"
"""An absolute directory path: no trailing slash, no empty segment and none of dots only (``..``),
so that "a file lies under a mount" is a plain prefix test."""


class PersistentVolumeClaim(base.Model):
    """A core/v1 PersistentVolumeClaimVolumeSource: a claim in the job's namespace."""

    claim_name: str = Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    """Name of the PersistentVolumeClaim."""
    read_only: bool = True
    """Mount read-only (the feeder only reads)."""


class HostPath(base.Model):
    """A core/v1 HostPathVolumeSource: a directory of the node (development clusters)."""

    path: str = Field(min_length=2, max_length=4096, pattern=MOUNT_PATH)
    """Directory on the node."""


class Volume(base.Model):
    """A volume mounted into the feeder's pod at ``mountPath``: exactly one of
    ``persistentVolumeClaim``, ``hostPath`` (a rule of ``treadle.api.spec_rules``)."""

    name: str = Field(min_length=1, max_length=40, pattern=r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
    """Volume name, unique among the feeder's volumes."""
    mount_path: str = Field(min_length=2, max_length=1024, pattern=MOUNT_PATH)
    """Where the feeder sees the volume; ``path`` sources lie under one of these."""
    persistent_volume_claim: PersistentVolumeClaim | None = None
    """A PersistentVolumeClaim of the job's namespace."""
    host_path: HostPath | None = None
    """A node directory."""


def under(path: str, mount_path: str) -> bool:
    """Whether ``path`` lies below ``mount_path`` (the CEL rule's test, which ``/../`` would escape)."""
    return path.startswith(mount_path + "/") and "/../" not in path
