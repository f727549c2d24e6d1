"""Lightning: a ``LightningDataModule`` whose loaders resume mid-epoch exactly, on any number of devices.

``pip install torch-dataloader-utils[lightning]``. The core never imports this module
(nor ``lightning``).

:class:`StructuredDataModule` builds the train, val, test and predict loaders of
:func:`~torch_dataloader_utils.create_dataloader` from the library's options, on every
rank, once Lightning has started the process group (so ranks come from
``torch.distributed``). What it adds to handing Lightning the loaders directly:

* **The state goes in the checkpoint, whole.** Lightning checkpoints a stateful train
  loader by itself, but from rank 0 only: restored on several devices, every rank got
  rank 0's cursors (``ResumeStateError``). The train loader is handed to Lightning in a
  wrapper (:class:`TrainLoader`) whose own ``state_dict`` holds no cursors, only a note
  that the data module keeps them; the data module's
  :meth:`~StructuredDataModule.state_dict` gathers every rank's state (a collective,
  which Lightning calls on every rank when it saves) and
  :meth:`~StructuredDataModule.load_state_dict` gives the merged state to the new
  loader, so the resumed epoch reads exactly the rows not yet trained on, on the same
  or another number of devices. As the wrapper has ``state_dict`` and
  ``load_state_dict``, Lightning counts the loader as resumable (its ``_Stateful``
  check) and does not warn "your dataloader is not resumable" on a mid-epoch resume.
* **Every epoch has its own order.** Lightning calls ``loader.sampler.set_epoch`` at
  every epoch; the wrapper also selects ``trainer.current_epoch`` when an epoch's pass
  starts, whatever calls Lightning makes.
* **``len()`` is the full epoch** (the loader's ``len``), also after a resume: Lightning
  reads it once and stops an epoch after that many batches, counting the batches it
  trained before the interruption.

Example::

    import lightning as L
    from torch_dataloader_utils.lightning import StructuredDataModule

    data = StructuredDataModule("s3://bucket/train/", val="s3://bucket/val/",
                                batch_size=256, shuffle=True, num_workers=4)
    trainer = L.Trainer(max_epochs=3, callbacks=[L.pytorch.callbacks.ModelCheckpoint(
        dirpath="ckpt/", every_n_train_steps=500, save_last=True)])
    trainer.fit(model, datamodule=data)                              # preempted...
    trainer.fit(model, datamodule=data, ckpt_path="ckpt/last.ckpt")  # ...resumed exactly
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import lightning.pytorch as pl

from torch_dataloader_utils.errors import ResumeStateError
from torch_dataloader_utils.runtime.files import create_dataloader
from torch_dataloader_utils.runtime.loader import ResumableDataLoader
from torch_dataloader_utils.runtime.options import FileLoaderOptions, check_keywords
from torch_dataloader_utils.runtime.state import gather_state

__all__ = ["KEPT_BY", "STATE_VERSION", "StructuredDataModule", "TrainLoader"]

STATE_VERSION = 1
"""Version of the data module's entry in a Lightning checkpoint."""
KEPT_BY = {"kept_by": "StructuredDataModule"}
"""The train loader's own state in a Lightning checkpoint: a note of where the cursors are."""

_STAGES = ("train", "val", "test", "predict")


class TrainLoader:
    """The train loader as Lightning sees it: resumable, its cursors kept by the data module.

    Iterating it iterates the loader (after selecting the trainer's current epoch);
    ``len()`` is the loader's full epoch; ``sampler`` is the loader's, whose
    ``set_epoch`` Lightning calls. The loader itself is :attr:`loader`.
    :meth:`state_dict` and :meth:`load_state_dict` make Lightning count it as resumable;
    the state they carry is only :data:`KEPT_BY` (every rank's cursors, merged, are the
    data module's entry of the checkpoint).
    """

    def __init__(self, loader: ResumableDataLoader[Any], module: StructuredDataModule) -> None:
        self.loader = loader
        self._module = module

    def __iter__(self) -> Iterator[Any]:
        trainer = self._module.trainer
        if trainer is not None:
            # Idempotent: the same epoch keeps a loaded mid-epoch state.
            self.loader.dataset.set_epoch(trainer.current_epoch)
        return iter(self.loader)

    def __len__(self) -> int:
        return len(self.loader)

    def state_dict(self) -> dict[str, Any]:
        """:data:`KEPT_BY`: the cursors are in the data module's entry of the checkpoint."""
        return dict(KEPT_BY)

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Nothing to load here: :meth:`StructuredDataModule.load_state_dict` resumes the loader.

        Raises:
            ResumeStateError: ``state_dict`` is not what :meth:`state_dict` returns (a
                checkpoint of another train loader).
        """
        if dict(state_dict) != KEPT_BY:
            raise ResumeStateError(
                f"the checkpoint's train loader state has keys {sorted(state_dict)}, not {KEPT_BY!r}: it "
                "was written for another train loader than StructuredDataModule's; resume with the "
                "data module that saved it"
            )

    @property
    def sampler(self) -> Any:
        """The loader's sampler (``set_epoch`` reaches the dataset)."""
        return self.loader.sampler

    @property
    def dataset(self) -> Any:
        """The loader's dataset."""
        return self.loader.dataset


class StructuredDataModule(pl.LightningDataModule):
    """Train / val / test / predict loaders of :func:`~torch_dataloader_utils.create_dataloader`.

    Args:
        train: The training data: a path, URL, glob or list of them (``None``: no
            ``train_dataloader``).
        val: The validation data, or ``None``.
        test: The test data, or ``None``.
        predict: The prediction data, or ``None``.
        format: The files' format (``"parquet"``, ``"orc"``, ``"csv"``, ``"jsonl"``).
        eval_options: Options that differ for val / test / predict (default
            ``{"shuffle": False}``), merged over ``options``.
        **options: Every keyword of ``create_dataloader`` (batch size, shuffle,
            workers, storage, ...). ``num_ranks`` / ``rank`` default to the process
            group Lightning starts.

    Raises:
        UnknownOptionError: a keyword is not an option (the closest is named).
    """

    def __init__(
        self,
        train: str | Sequence[str] | None = None,
        *,
        val: str | Sequence[str] | None = None,
        test: str | Sequence[str] | None = None,
        predict: str | Sequence[str] | None = None,
        format: str = "parquet",
        eval_options: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> None:
        super().__init__()
        check_keywords(options, FileLoaderOptions, "StructuredDataModule")
        check_keywords(eval_options or {}, FileLoaderOptions, "StructuredDataModule eval_options")
        self.paths = {"train": train, "val": val, "test": test, "predict": predict}
        self.format = format
        self.options = dict(options)
        self.eval_options = {"shuffle": False, **dict(eval_options or {})}
        self._loaders: dict[str, ResumableDataLoader[Any]] = {}
        self._pending: Mapping[str, Any] | None = None

    # -- loaders ------------------------------------------------------------------------
    def loader(self, stage: str) -> ResumableDataLoader[Any]:
        """The library's loader of ``stage`` (``"train"``, ``"val"``, ``"test"``, ``"predict"``).

        Built once, on first use (after Lightning started the process group).
        """
        if stage not in self._loaders:
            path = self.paths[stage]
            if path is None:
                raise ValueError(f"StructuredDataModule has no {stage} data: pass {stage}=path")
            options = self.options if stage == "train" else {**self.options, **self.eval_options}
            loader, _ = create_dataloader(path, self.format, **options)
            if stage == "train" and self._pending is not None:
                loader.load_state_dict(self._pending)
                self._pending = None
            self._loaders[stage] = loader
        return self._loaders[stage]

    def train_dataloader(self) -> TrainLoader:
        """The train loader, wrapped so that its state is the data module's (see the module)."""
        return TrainLoader(self.loader("train"), self)

    def val_dataloader(self) -> ResumableDataLoader[Any]:
        """The validation loader (``eval_options``: not shuffled by default)."""
        return self.loader("val")

    def test_dataloader(self) -> ResumableDataLoader[Any]:
        """The test loader."""
        return self.loader("test")

    def predict_dataloader(self) -> ResumableDataLoader[Any]:
        """The prediction loader."""
        return self.loader("predict")

    # -- checkpoints ----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The train loader's state, every rank's merged (a collective: Lightning calls it on every rank).

        Lightning calls it when it writes a checkpoint, on every rank; rank 0 writes the
        file. Before the train loader exists, a state loaded but not yet applied is kept.
        """
        if "train" in self._loaders:
            return {"version": STATE_VERSION, "train": gather_state(self._loaders["train"])}
        if self._pending is not None:
            return {"version": STATE_VERSION, "train": dict(self._pending)}
        return {}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Resume the train loader from a checkpoint's state (applied when the loader is built).

        Raises:
            ResumeStateError: the entry was not written by this data module.
        """
        if not state_dict:
            return
        if state_dict.get("version") != STATE_VERSION or "train" not in state_dict:
            raise ResumeStateError(
                f"the checkpoint's StructuredDataModule entry has keys {sorted(state_dict)} and "
                f"version {state_dict.get('version')!r}; expected version {STATE_VERSION} with a "
                "'train' state (a checkpoint written by another data module?)"
            )
        if "train" in self._loaders:
            self._loaders["train"].load_state_dict(state_dict["train"])
        else:
            self._pending = state_dict["train"]
