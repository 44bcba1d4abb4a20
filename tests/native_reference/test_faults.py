"""The planted faults: the engine module holds none of them, each fault class overrides
only the engine steps it names, and the registry is what the server and the CLI take."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

from specadapt.errors import UsageError
from specadapt.native_reference import engine as engine_module
from specadapt.native_reference.engine import SpecEngine
from specadapt.native_reference.faults import (
    BATCH_FAULTS,
    FAULTS,
    FEATURE_FAULTS,
    Fault,
    FaultyEngine,
    build_engine,
)
from specadapt.native_reference.proposers import DraftModelProposer, NgramProposer
from specadapt.native_reference.sampling import SAMPLER_FAULTS

ENGINE_SOURCE = Path(engine_module.__file__).read_text()


def _words(tree: ast.AST) -> list[str]:
    """Every identifier (names, attributes, arguments, definitions, imports, keywords) and
    every string but the module docstring."""
    doc = tree.body[0].value if tree.body and isinstance(tree.body[0], ast.Expr) else None
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            out.append(node.id)
        elif isinstance(node, ast.Attribute):
            out.append(node.attr)
        elif isinstance(node, ast.arg):
            out.append(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.append(node.name)
        elif isinstance(node, ast.alias):
            out += [node.name, node.asname or ""]
        elif isinstance(node, ast.keyword) and node.arg:
            out.append(node.arg)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node is not doc:
            out.append(node.value)
    return out


def test_the_engine_module_has_no_fault_branch():
    words = _words(ast.parse(ENGINE_SOURCE))
    assert "SpecEngine" in words and "rejection_verify" in words  # the walk sees the code
    # "fault" as a word or a word's start (fault, FAULTS, _fault, fault_kind), not default
    planted = re.compile(r"(?<![a-z])fault", re.IGNORECASE)
    assert [w for w in words if planted.search(w)] == []
    assert planted.search("self._fault") and planted.search("FAULTS") and not planted.search("default_factory")
    for name in FAULTS:  # no fault name either, in code or in a comment
        assert name not in ENGINE_SOURCE
    assert "the bug" not in ENGINE_SOURCE


def test_the_engine_docstring_tells_the_ladder_and_points_to_the_faults():
    doc = engine_module.__doc__
    for rung in ("draft", "verify", "accept", "emit", "specadapt.native_reference.faults"):
        assert rung in doc


def _overridden(cls: type) -> set[str]:
    """The engine methods ``cls`` defines differently from FaultyEngine (its own, or a
    shared base's such as the sampler faults')."""
    return {name for name, value in vars(SpecEngine).items()
            if callable(value) and getattr(cls, name) is not getattr(FaultyEngine, name)}


@pytest.mark.parametrize("name", list(FAULTS))
def test_each_fault_overrides_only_the_steps_it_names(name):
    cls = FAULTS[name]
    assert issubclass(cls, FaultyEngine) and cls.name == name
    assert cls.breaks and all(callable(getattr(SpecEngine, step, None)) for step in cls.breaks)
    assert _overridden(cls) == set(cls.breaks)
    new = {n for n, v in vars(cls).items() if callable(v) and not hasattr(SpecEngine, n)}
    assert new == set(), f"{name} adds methods of its own: {new}"


def test_a_fault_that_overrides_an_unnamed_step_is_caught():
    class Sneaky(FaultyEngine):
        name, breaks = "sneaky", ("_chunk",)

        def _chunk(self, row, prop, m, nxt):  # pragma: no cover - never run
            return []

        def _cut_at_length(self, row, emitted):  # pragma: no cover - never run
            return emitted

    assert _overridden(Sneaky) == {"_chunk", "_cut_at_length"} != set(Sneaky.breaks)


def test_the_registry_holds_every_family_in_the_order_the_help_gives():
    names = list(FAULTS)
    assert names[:4] == ["accept-always", "drop-bonus", "perturb-logits", "draft-temperature"]
    assert names[4:] == list(SAMPLER_FAULTS) + list(FEATURE_FAULTS) + list(BATCH_FAULTS)
    assert len({cls for cls in FAULTS.values()}) == len(FAULTS)  # one class per fault
    with pytest.raises(UsageError, match="unknown fault 'x': use one of accept-always, drop-bonus"):
        Fault.parse("x")


def test_the_serve_help_names_every_fault():
    pytest.importorskip("click")
    from specadapt.commands.reference import serve

    (option,) = [p for p in serve.params if p.name == "fault"]
    for name in FAULTS:
        assert name in option.help


def test_build_engine_plants_the_fault_it_is_given(tiny_target, tiny_draft):
    healthy = build_engine(tiny_target, NgramProposer(1, 3), 3, seed=2)
    assert type(healthy) is SpecEngine and not hasattr(healthy, "fault")
    assert type(build_engine(tiny_target, NgramProposer(1, 3), 3, None)) is SpecEngine
    faulty = build_engine(tiny_target, NgramProposer(1, 3), 3, "perturb-logits=0.5", seed=2, max_model_len=64)
    assert type(faulty) is FAULTS["perturb-logits"] and faulty.fault == Fault("perturb-logits", eps=0.5)
    assert (faulty.k, faulty.max_model_len) == (3, 64)
    prop = DraftModelProposer(tiny_draft)
    drafted = build_engine(tiny_target, prop, 2, Fault.parse("draft-temperature=2"))
    assert drafted.fault.factor == 2.0 and prop.sample_temperature_factor == 2.0
    with pytest.raises(UsageError, match="unknown fault"):
        build_engine(tiny_target, fault="flip-coins")


def test_each_fault_class_says_what_it_breaks():
    for cls in FAULTS.values():
        assert inspect.getdoc(cls) and inspect.getdoc(cls) != inspect.getdoc(FaultyEngine)


def test_perturb_logits_noise_is_each_rows_own_stream(tiny_target, tiny_draft):
    """A row's noise is drawn from its own stream (seeded with its seed + 1), so a row
    emits the same tokens alone as in a batch that rows leave and join mid-way."""
    prompts = [[3, 17, 5, 9, 3, 17, 22], [1, 2, 3, 1, 2, 3, 1, 2], [7, 7, 8, 9, 10, 7, 7, 8]]
    sizes, seeds = [6, 14, 10], [1, 2, 3]

    def engine():
        return build_engine(tiny_target, DraftModelProposer(tiny_draft), 3, "perturb-logits=3")

    alone = [engine().generate(p, n, seed=s).tokens for p, n, s in zip(prompts, sizes, seeds)]
    healthy = [build_engine(tiny_target, DraftModelProposer(tiny_draft), 3).generate(p, n, seed=s).tokens
               for p, n, s in zip(prompts, sizes, seeds)]
    assert alone != healthy  # the noise changes what is emitted
    batch = engine()
    rows = [batch.add(prompts[0], sizes[0], seed=seeds[0], tag=0)[0],
            batch.add(prompts[1], sizes[1], seed=seeds[1], tag=1)[0]]
    while any(r.tag == 0 for r in batch.rows):  # row 0 leaves first
        batch.step()
    rows.append(batch.add(prompts[2], sizes[2], seed=seeds[2], tag=2)[0])  # joins after it left
    while batch.rows:
        batch.step()
    assert [r.output for r in rows] == alone
