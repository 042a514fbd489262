"""Every way of putting knowledge into a model this project knows, one module each: a module here that defines
`METHODS` (a tuple of `nkb_model.method.Method`) is registered by being here. Nothing else lists methods."""

from __future__ import annotations

import importlib
import pkgutil

from nkb_model.method import Method


def _discovered() -> dict[str, Method]:
    found: dict[str, Method] = {}
    for module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
        for method in importlib.import_module(f"{__name__}.{module}").METHODS:
            if method.name in found:
                raise ValueError(f"{__name__}.{module}: method {method.name!r} is registered twice")
            found[method.name] = method
    return dict(sorted(found.items(), key=lambda item: item[1].order))


METHODS = _discovered()  # by name, in the report's order


def of_kind(kind: str) -> list[Method]:
    return [m for m in METHODS.values() if m.kind == kind]


def variants() -> dict[str, Method]:
    """inject's variants, each with the method that names it (lora-8 trains as lora)."""
    return {m.trained_by: METHODS[m.trained_by] for m in of_kind("inject")}
