"""The planted faults: the engine, the sampler and the stop-string check hold none of them,
each fault class overrides only the engine steps it names, the faulty sampler breaks exactly
what it names, and the registry is what the server and the CLI take."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest
import torch

from specadapt.errors import UsageError
from specadapt.native_reference import engine as engine_module
from specadapt.native_reference import sampling as sampling_module
from specadapt.native_reference import stops as stops_module
from specadapt.native_reference.engine import Row, SpecEngine
from specadapt.native_reference.faults import (
    BATCH_FAULTS,
    FAULTS,
    FEATURE_FAULTS,
    SAMPLER_FAULTS,
    Fault,
    FaultyEngine,
    build_engine,
    faulty_rejection_verify,
)
from specadapt.native_reference.proposers import DraftModelProposer, NgramProposer
from specadapt.native_reference.sampling import probs, process_logits, rejection_verify
from specadapt.native_reference.stops import StopStrings

ENGINE_SOURCE = Path(engine_module.__file__).read_text()
# "fault" as a word or a word's start (fault, FAULTS, _fault, fault_kind), not default
PLANTED = re.compile(r"(?<![a-z])fault", re.IGNORECASE)


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
    assert [w for w in words if PLANTED.search(w)] == []
    assert PLANTED.search("self._fault") and PLANTED.search("FAULTS") and not PLANTED.search("default_factory")
    for name in FAULTS:  # no fault name either, in code or in a comment
        assert name not in ENGINE_SOURCE
    assert "the bug" not in ENGINE_SOURCE


@pytest.mark.parametrize("module, code", [(sampling_module, ("rejection_verify", "residual", "draft_q")),
                                          (stops_module, ("StopStrings", "first_stop", "cut"))],
                         ids=["sampling", "stops"])
def test_the_sampler_and_the_stop_check_have_no_fault_branch(module, code):
    """Not in the code, nor in a docstring or a comment: no word starting with "fault", no
    fault's name, no planted bug."""
    source = Path(module.__file__).read_text()
    words = _words(ast.parse(source))
    assert set(code) <= set(words)  # the walk sees the code
    assert [w for w in words if PLANTED.search(w)] == []
    assert PLANTED.findall(source) == []  # "default" may be there, "fault" nowhere
    for name in FAULTS:
        assert name not in source
    assert "the bug" not in source and "SAMPLER" not in source


def _params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def test_the_healthy_steps_take_no_fault_flag():
    """The algorithm's parameters only: no switch (keep the chunk, filter or process only the
    first rows, a sampler bug's name) that a fault would turn."""
    assert _params(rejection_verify) == ["p", "q", "draft", "generator"]
    assert _params(probs) == ["logits", "params"]
    assert _params(process_logits) == ["logits", "params", "prompt", "output", "drafts", "stop_ids"]
    assert _params(Row.process) == ["self", "logits", "drafts"]
    assert _params(StopStrings.update) == ["self", "new", "stop_terminated"]
    assert _params(faulty_rejection_verify) == _params(rejection_verify) + ["fault"]  # the check can fail


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


# -- the faulty rejection sampler: each bug against the healthy rule -------------------------------

def test_unknown_sampler_fault_refused():
    p = torch.full((2, 3), 1 / 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="unknown sampler fault 'accept-always'"):
        faulty_rejection_verify(p, None, [0], None, "accept-always")  # an engine fault, not a sampler one
    with pytest.raises(ValueError, match="unknown sampler fault"):
        faulty_rejection_verify(p, None, [], None, "bogus")  # refused even with nothing to verify


def test_unknown_sampler_fault_lists_the_known_ones():
    p = torch.full((1, 3), 1 / 3, dtype=torch.float64)
    with pytest.raises(ValueError) as err:
        faulty_rejection_verify(p, None, [], None, "bogus")
    assert str(err.value) == "unknown sampler fault 'bogus': use one of residual-p, bonus-previous, accept-later"


def test_fault_residual_p_draws_the_replacement_from_p():
    """p = (1/2, 1/2), draft token 0 one-hot: after a rejection only token 1 is right."""
    gen = torch.Generator().manual_seed(0)
    p = torch.tensor([[0.5, 0.5], [0.5, 0.5]], dtype=torch.float64)
    good = {rejection_verify(p, None, [0], gen) for _ in range(200)}
    bad = {faulty_rejection_verify(p, None, [0], gen, "residual-p") for _ in range(200)}
    assert good == {(1, 0), (1, 1), (0, 1)}
    assert bad == {(1, 0), (1, 1), (0, 1), (0, 0)}


def test_fault_bonus_previous_takes_the_last_draft_row():
    p = torch.eye(3, dtype=torch.float64)  # row i: token i surely
    assert rejection_verify(p, None, [0, 1], None) == (2, 2)
    assert faulty_rejection_verify(p, None, [0, 1], None, "bonus-previous") == (2, 1)
    assert faulty_rejection_verify(p, None, [], None, "bonus-previous") == (0, 0)  # no previous row
    assert faulty_rejection_verify(p, None, [2], None, "bonus-previous") == (0, 0)  # rejection: unaffected


def test_bonus_previous_fault_takes_the_row_before_the_bonus_row():
    p = torch.eye(4, dtype=torch.float64)
    assert rejection_verify(p, None, [0, 1, 2], None) == (3, 3)
    assert faulty_rejection_verify(p, None, [0, 1, 2], None, "bonus-previous") == (3, 2)


def test_fault_accept_later_checks_position_zero_only():
    p = torch.eye(3, dtype=torch.float64)
    assert rejection_verify(p, None, [0, 2], None) == (1, 1)
    assert faulty_rejection_verify(p, None, [0, 2], None, "accept-later") == (2, 2)
    assert faulty_rejection_verify(p, None, [1, 2], None, "accept-later") == (0, 0)  # position 0 still checked


def test_residual_p_draws_every_token_from_the_requests_generator():
    """Same seed, same tokens, whatever the global RNG did meanwhile: acceptance draws,
    replacements (from p) and bonus tokens."""
    p = torch.tensor([[0.4, 0.3, 0.2, 0.1], [0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25]], dtype=torch.float64)
    q = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1]], dtype=torch.float64)

    def run(global_seed):
        torch.manual_seed(global_seed)
        gen = torch.Generator().manual_seed(5)
        out = [faulty_rejection_verify(p, q, [3, 0], gen, "residual-p") for _ in range(60)]
        out += [faulty_rejection_verify(p, None, [], gen, "residual-p") for _ in range(20)]  # bonus only
        return out

    first = run(0)
    assert len({m for m, _ in first[:60]}) == 3  # rejections at 0 and 1 and full acceptance all occur
    assert run(1) == first


@pytest.mark.parametrize("fault", SAMPLER_FAULTS)
def test_a_sampler_fault_draws_what_the_healthy_sampler_draws_where_its_bug_does_not_show(fault):
    """Drafts that every rule accepts the same way (p one-hot on them) but no full
    acceptance for bonus-previous, no rejection for residual-p, one position for
    accept-later: the same tokens, and the generator left in the same state."""
    p = torch.tensor([[0.0, 1.0, 0.0], [0.2, 0.3, 0.5]], dtype=torch.float64)
    q = torch.tensor([[0.3, 0.4, 0.3]], dtype=torch.float64)
    cases = {"residual-p": [1], "bonus-previous": [0], "accept-later": [0]}[fault]
    a, b = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    healthy = [rejection_verify(p, q, cases, a) for _ in range(30)]
    faulty = [faulty_rejection_verify(p, q, cases, b, fault) for _ in range(30)]
    assert healthy == faulty and torch.equal(a.get_state(), b.get_state())
