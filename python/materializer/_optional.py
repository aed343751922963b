"""Optional dependencies: importing one that is missing says which extra
of the package brings it."""

import importlib

# Module -> the install command that brings it.
EXTRAS = {"transformers": 'pip install "./python[hf]"'}


def require(module, what):
    """Imports `module` (a name in EXTRAS) for `what` (e.g. "a Hugging Face
    config"); a ModuleNotFoundError naming the install command when it is
    missing (a module that is there but fails to import raises its own
    error)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module:
            raise
        raise ModuleNotFoundError(
            f"{what} needs {module}, which is not installed: {EXTRAS[module]} "
            f"(from a checkout of materializer), or pip install {module}",
            name=module) from None
