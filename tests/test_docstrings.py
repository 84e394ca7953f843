"""The public API documents itself: every public class and function has an Examples section
(run as a doctest by ``python -m pytest``, see ``pyproject.toml``), and every parameter of
every public function, class and method is described in its numpydoc Parameters section."""

import importlib
import inspect

import pytest

PUBLIC_MODULES = [
    "sklearn_fedmf",
    "sklearn_fedmf.completion",
    "sklearn_fedmf.binary",
    "sklearn_fedmf.cluster",
    "sklearn_fedmf.datasets",
    "sklearn_fedmf.model_selection",
    "sklearn_fedmf.metrics",
    "sklearn_fedmf.privacy",
    "sklearn_fedmf.secure",
    "sklearn_fedmf.exceptions",
]


def _public():
    seen = {}
    for name in PUBLIC_MODULES:
        module = importlib.import_module(name)
        for attr in module.__all__:
            obj = getattr(module, attr)
            if inspect.isclass(obj) or inspect.isfunction(obj):
                seen.setdefault(f"{obj.__module__}.{obj.__qualname__}", obj)
    return sorted(seen.items())


PUBLIC = _public()
ESTIMATORS = [(n, c) for n, c in PUBLIC if inspect.isclass(c) and hasattr(c, "get_params")]


def _section(doc, title):
    """The lines of a numpydoc section (its underline excluded), dedented."""
    lines = inspect.cleandoc(doc or "").splitlines()
    for i in range(len(lines) - 1):
        if lines[i].strip() == title and set(lines[i + 1].strip()) == {"-"}:
            body = lines[i + 2:]
            # the section ends at the next "Title\n-----" pair
            for j in range(len(body) - 1):
                if body[j].strip() and set(body[j + 1].strip()) == {"-"} and \
                        not body[j].startswith(" "):
                    return body[:j]
            return body
    return None


def described_parameters(doc):
    """``{name: description}`` of a numpydoc Parameters section."""
    body = _section(doc, "Parameters") or []
    found, current = {}, None
    for line in body:
        if line and not line.startswith(" "):
            names = line.split(" : ")[0]
            current = [n.strip().lstrip("*") for n in names.split(",")]
            for n in current:
                found[n] = ""
        elif current and line.strip():
            for n in current:
                found[n] += " " + line.strip()
    return {n: d.strip() for n, d in found.items()}


def _signature_parameters(func):
    params = inspect.signature(func).parameters.values()
    return [p.name for p in params if p.name not in ("self", "cls")]


EXAMPLED = [(n, o) for n, o in PUBLIC if not (inspect.isclass(o) and issubclass(o, Warning)
                                              or inspect.isclass(o) and issubclass(o, Exception))]


# Warning and error classes are raised, not called: their docstrings say when, no example.
@pytest.mark.parametrize("name, obj", EXAMPLED, ids=[n for n, _ in EXAMPLED])
def test_public_object_has_a_runnable_example(name, obj):
    examples = _section(obj.__doc__, "Examples")
    assert examples is not None, f"{name} has no Examples section"
    assert any(line.lstrip().startswith(">>> ") for line in examples), f"{name}: no >>> line"


@pytest.mark.parametrize("name, obj", PUBLIC, ids=[n for n, _ in PUBLIC])
def test_every_parameter_is_described(name, obj):
    if inspect.isclass(obj) and issubclass(obj, BaseException):
        return  # exceptions take a message only
    func = obj.__init__ if inspect.isclass(obj) else obj
    described = described_parameters(obj.__doc__)
    missing = [p for p in _signature_parameters(func) if not described.get(p)]
    assert not missing, f"{name}: parameters without a description: {missing}"


def _methods():
    """Public methods the package defines (its estimators' own and their bases')."""
    for _, cls in ESTIMATORS:
        for attr, func in inspect.getmembers(cls, inspect.isfunction):
            if not attr.startswith("_") and func.__module__.startswith("sklearn_fedmf") \
                    and _signature_parameters(func):
                yield f"{func.__module__}.{func.__qualname__}", func


METHODS = sorted(dict(_methods()).items())


@pytest.mark.parametrize("name, func", METHODS, ids=[n for n, _ in METHODS])
def test_every_method_parameter_is_described(name, func):
    described = described_parameters(func.__doc__)
    missing = [p for p in _signature_parameters(func) if not described.get(p)]
    assert not missing, f"{name}: parameters without a description: {missing}"


def test_the_parser_reads_numpydoc():
    doc = """Summary.

    Parameters
    ----------
    a, b : int
        Two numbers.
    c : str
    **kwargs : dict
        Passed on.

    Returns
    -------
    x : int
        Not a parameter.
    """
    assert described_parameters(doc) == {"a": "Two numbers.", "b": "Two numbers.", "c": "",
                                         "kwargs": "Passed on."}


@pytest.mark.parametrize("name, cls", ESTIMATORS, ids=[n for n, _ in ESTIMATORS])
def test_shared_headers_state_each_class_default(name, cls):
    """A shared header (``SHARED_HEADERS``, written whole by ``parameter_entries``) states
    the default of every class whose docstring shows it."""
    from sklearn_fedmf._docstrings import SHARED_HEADERS

    signature = inspect.signature(cls.__init__).parameters
    for param, header in SHARED_HEADERS.items():
        if f"{param} : {header}" in cls.__doc__:
            stated = header.rsplit("default=", 1)[1]
            assert stated == repr(signature[param].default), (name, param)
