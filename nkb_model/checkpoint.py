"""Model directories written by the model stages, and loading them back.

    <dir>/nkb-model.json   {"name", "kind": base | an inject method (nkb, lora, ...) | finetuned | edited,
                            "base_folder", ...}
    <dir>/README.md        the model card
    <dir>/ (HF files)      a base model: an ordinary Hugging Face directory
    <dir>/weights/         the model's own weights, when this model changed them (nkb-a, fine-tuned)
    <dir>/nkb/             NKB slots and their config (save_nkb), when the model has an NKB
    <dir>/kformer/         Kformer's embedding copy and projections (save_kformer), when it has Kformer
    <dir>/METHOD-FOLDER/   what another method (`nkb_model.methods`) changed over the base: LoRA adapters, FFN maps

A model that keeps most of its base's weights (NKB injection with the base frozen, LoRA, a few blocks' FFN maps)
stores only what changed;
`base_folder` is the folder of those weights relative to the model's own folder (`../base-0123abcd`), so a
warehouse moved or copied whole still finds them. Folders written before held an absolute `base_dir`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from pathlib import Path
from typing import Iterator

from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

from nkb_model.families import family
from nkb_model.kformer import load_kformer, save_kformer, unmount_kformer
from nkb_model.methods import METHODS
from nkb_model.nkb import load_nkb, mounted_layers, save_nkb, unmount_nkb

# Every model stage loads several small local directories; transformers' per-load "Loading weights" bar
# would bury the stages' own progress bars (which say what the work is) under one line per load.
hf_logging.disable_progress_bar()

INFO = "nkb-model.json"


def read_info(directory: str | Path) -> dict:
    """The model's info; a plain Hugging Face directory (e.g. a downloaded t5-base or Llama) counts as a base."""
    directory = Path(directory)
    if (directory / INFO).exists():
        return json.loads((directory / INFO).read_text())
    if (directory / "config.json").exists():
        return {"name": directory.name, "kind": "base"}
    raise FileNotFoundError(f"{directory}: not a model directory (no {INFO} and no config.json)")


def hf_dir(directory: str | Path) -> Path:
    """Where the model's own weights of a model directory are."""
    directory = Path(directory)
    info = read_info(directory)
    if info["kind"] == "base":
        return directory
    if (directory / "weights").exists():
        return directory / "weights"
    return base_folder(directory, info)


def base_folder(directory: str | Path, info: dict) -> Path:
    """The folder of the model's own weights a derived model was built on."""
    if "base_folder" in info:
        return (Path(directory) / info["base_folder"]).resolve()
    return Path(info["base_dir"])


def relative_base(base_weights: str | Path, target: str | Path) -> str:
    """`base_folder` for a model that will be published at `target`."""
    return os.path.relpath(Path(base_weights).resolve(), Path(target).resolve())


def load_model(directory: str | Path, with_nkb: bool = True):
    """(model, tokenizer, info) of a model directory; the NKB is mounted unless `with_nkb` is False."""
    directory = Path(directory)
    info = read_info(directory)
    weights = hf_dir(directory)
    model = model_class(weights).from_pretrained(weights)
    tokenizer = load_tokenizer(weights)
    # Each method's saved changes, once a folder (nkb and nkb-a share `nkb/`), in their load order
    loads = {m.folder: m for m in sorted(METHODS.values(), key=lambda m: m.load_order) if m.folder}
    for folder, method in loads.items():
        if (directory / folder).exists() and (with_nkb or not method.slots):
            model = method.load(model, directory / folder)
    return model, tokenizer, info


def load_tokenizer(directory: str | Path, local_files_only: bool = True):
    """A model's tokenizer, with a pad token: GPT-2's has none, and batches pad (with EOS, which the loss skips)."""
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=local_files_only)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


@contextlib.contextmanager
def gguf_read_once() -> Iterator[None]:
    """While inside, a GGUF file is parsed once however often it is opened, and llama.cpp's tensor-name map is
    built once per family and depth. transformers opens the file anew for the config, the tokenizer and the
    weights, parsing every header field each time (SmolLM2's 49,152-token vocabulary and merges: ~7 s a parse on
    2 cores), and builds the name map once per module (~400 times, ~8 s). Both are read-only; `gguf`'s own names
    are put back on the way out."""
    import gguf
    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    opened: dict[tuple[str, str], object] = {}

    def read(path, mode="r"):
        key = (os.path.realpath(path), mode)
        if key not in opened:
            opened[key] = reader(path, mode)
        return opened[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = read, functools.lru_cache(maxsize=None)(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map


def load_gguf(path: str | Path):
    """(model, tokenizer, metadata) of a GGUF file (llama.cpp's format, e.g. a quantised Llama or Qwen):
    transformers dequantises its weights into an fp32 model of the file's family, which then saves as a plain
    Hugging Face folder. `metadata`: the file's own name, organisation, license and quantisation."""
    import io
    import struct

    import gguf
    path = Path(path)
    try:  # transformers draws a bar per tensor that no setting turns off: kept out of the stage's log
        with contextlib.redirect_stderr(io.StringIO()), gguf_read_once():
            loaded = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
            tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
            fields = gguf.GGUFReader(path).fields
    except struct.error:  # the reader ran past the end of the file
        raise ValueError(f"{path}: ends before its GGUF header and tensors do ({path.stat().st_size:,} bytes): "
                         "a download or copy that stopped early? Fetch the file again") from None
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise ValueError(f"{path}: cannot be read as a GGUF model of a family transformers converts "
                         f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
    # The dequantised weights in a model made afresh from the config less its quantisation: a plain model that
    # saves as a plain folder (the loaded one keeps GGUF's quantiser, which refuses to save).
    config = loaded.config
    del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=loaded.dtype)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    read = {key: fields[f"general.{key}"].contents() for key in ("name", "organization", "license", "file_type")
            if f"general.{key}" in fields}
    if "file_type" in read:
        read["quantization"] = gguf.LlamaFileType(read.pop("file_type")).name.removeprefix("MOSTLY_")
    return model, tokenizer, read


def model_class(directory: str | Path, local_files_only: bool = True):
    """The Auto class for a Hugging Face directory or hub name: encoder-decoder (T5) or causal LM (GPT-2, Llama)."""
    from huggingface_hub.errors import StrictDataclassError
    try:
        config = AutoConfig.from_pretrained(directory, local_files_only=local_files_only)
    except StrictDataclassError as exc:  # a field of the wrong type: which one is in its message's lines
        where = Path(directory) / "config.json" if Path(directory).is_dir() else directory
        raise ValueError(f"{where}: {' '.join(str(exc).split())}") from None
    return family(config).auto_class()


def save_model(model, tokenizer, directory: str | Path, info: dict, weights_changed: bool) -> Path:
    """Write a derived model: its NKB (if mounted), its own weights if they differ from the base's, and info."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if mounted_layers(model):
        save_nkb(model, directory / "nkb")
    if hasattr(model, "kformer"):
        save_kformer(model, directory / "kformer")
    if weights_changed:  # the Hugging Face files hold the model's own weights only
        had_nkb, had_kformer = bool(mounted_layers(model)), hasattr(model, "kformer")
        if had_nkb:
            unmount_nkb(model)
        if had_kformer:
            unmount_kformer(model)
        model.save_pretrained(directory / "weights")
        tokenizer.save_pretrained(directory / "weights")
        if had_nkb:  # put the additions back for the caller
            load_nkb(model, directory / "nkb")
        if had_kformer:
            load_kformer(model, directory / "kformer")
    (directory / INFO).write_text(json.dumps(info, indent=1))
    return directory
