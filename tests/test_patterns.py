"""Patterns as values (focus_lab.patterns): one spelling per pattern, rules in any order, the same
meaning with every router file, and what a file adds reached by name ('default')."""

import json
import warnings
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings, strategies as st

from conftest import tiny_llama
from focus_lab.method.config import FocusConfig
from focus_lab.patterns import RULES, Pattern, PatternError, parse_pattern_file, parse_patterns
from focus_lab.patterns import legacy_label_pattern
from focus_lab.patterns.legacy import legacy_changes
from focus_lab.patterns.rules.capacity import Capacity
from focus_lab.patterns.rules.key_shift import KeyShift
from focus_lab.patterns.rules.layer_top_k import LayerTopK
from focus_lab.patterns.rules.match import Match
from focus_lab.patterns.rules.random_layers import RandomLayers
from focus_lab.patterns.rules.sinks import Sinks

# a router file that adds every rule a file can carry: a top-2 budget, random-group layers, a
# capacity for top-2, token-match pairs
FILE = FocusConfig(num_groups=4, window=4, sink_tokens=1, random_layers=[1], top_k_budgets={2: {0: 1, 1: 3}},
                   group_capacity=0.5, capacity_layers=[0], capacity_overflow="evict", capacity_top_k=[2],
                   match_shifts=[1], match_latest=3)

layers = st.lists(st.integers(0, 40), min_size=1, max_size=6).map(lambda x: tuple(sorted(set(x))))
rules = st.fixed_dictionaries({}, optional={
    "layer_top_k": st.builds(lambda a, b: LayerTopK.from_mapping({**{i: 1 for i in a}, **{i: 3 for i in b}}),
                             layers, layers),
    "random_layers": st.builds(RandomLayers, layers),
    "key_shift": st.just(KeyShift()),
    "match": st.builds(Match, layers.map(lambda x: tuple(i % 8 for i in x)).map(lambda x: tuple(sorted(set(x)))),
                       st.integers(0, 64)),
    "capacity": st.builds(Capacity, st.sampled_from([0.3, 0.5, 0.75, 1.0]), st.none() | layers,
                          st.sampled_from(["second", "evict"])),
    "sinks": st.builds(Sinks, st.integers(0, 128)),
})


@settings(max_examples=200, deadline=None)
@given(rules=rules, k=st.integers(1, 4), order=st.randoms(use_true_random=False))
def test_parse_and_print_round_trip_in_any_order(rules, k, order):
    p = Pattern("hard", "router", k, tuple(r for r in rules.values() if r is not None))
    text = str(p)
    assert Pattern.parse(text) == p
    head, *parts = text.split("+") if "(" not in text else [text.split("+")[0]] + [str(r) for r in p.rules]
    order.shuffle(parts)
    assert Pattern.parse("+".join([head] + parts)) == p  # rules in any order
    assert str(Pattern.parse("+".join([head] + parts))) == text  # one canonical spelling


def test_canonical_spelling_by_hand():
    p = Pattern.parse("hard_top2+match(latest=16)+capacity(0.5,layers=[16,13,15],evict)+key_shift")
    assert str(p) == "hard_top2+capacity(0.5,layers=[13,15-16],evict)+key_shift+match(latest=16)"
    assert p.changes()["capacity_layers"] == [13, 15, 16] and p.changes()["match_shifts"] == [0, 1]
    assert str(Pattern.parse("random_top1+layer_top_k(3=[1-4],1=[0])")) == "random_top1+layer_top_k(1=[0],3=[1-4])"
    assert str(Pattern.parse(" window + sinks(64) ")) == "window+sinks(64)"


def test_every_rule_reads_back_from_the_config_it_makes():
    """Each registered rule, applied to a plain config, is what ``Pattern.from_config`` finds
    there; its ``neutral`` fields are FocusConfig fields."""
    from focus_lab.method.config import FLAT_ORDER
    fields = set(FLAT_ORDER)
    examples = {"layer_top_k": LayerTopK.from_mapping({0: 1, 3: 3}), "random_layers": RandomLayers((1, 2)),
                "key_shift": KeyShift(), "match": Match((1,), 4), "capacity": Capacity(0.5, (0,), "evict")}
    assert set(examples) == {n for n, c in RULES.items() if c.neutral}  # a lever held in fields needs one here
    for name, rule in examples.items():
        assert set(RULES[name].neutral) <= fields
        p = Pattern("hard", "router", 2, (rule,))
        assert Pattern.from_config(FocusConfig(num_groups=4).replace(**p.changes())) == p, name


def test_a_bare_name_means_the_same_with_every_router_file():
    for name in ("dense", "window"):  # no group, no rule: only the mode changes
        assert Pattern.parse(name, FILE).changes() == {"mode": name, "assignment": "router"}
    for name in ("hard_top2", "random_top2", "shuffled_top1", "soft"):
        plain = FocusConfig(num_groups=4, window=4, sink_tokens=1).replace(**Pattern.parse(name).changes())
        rich = FILE.replace(**Pattern.parse(name, FILE).changes())
        for i in range(4):
            assert plain.top_k_at(i) == rich.top_k_at(i) and plain.assignment_at(i) == rich.assignment_at(i)
            assert plain.capacity_at(i) == rich.capacity_at(i) == 0.0
        assert (plain.key_shift, plain.match_shifts) == (rich.key_shift, rich.match_shifts) == (0, None)


def test_default_is_the_files_rules():
    assert str(Pattern.parse("default", FILE)) == \
        "hard_top2+capacity(0.5,layers=[0],evict)+layer_top_k(1=[0],3=[1])+match(shifts=[1],latest=3)+random_layers([1])"
    # top-1: no budget and no capacity for it in this file
    assert str(Pattern.parse("default_top1", FILE)) == "hard_top1+match(shifts=[1],latest=3)+random_layers([1])"
    # the controls: the same k per layer on random / shuffled groups; the capacity acts on no such group
    assert str(Pattern.parse("random_default", FILE)) == "random_top2+layer_top_k(1=[0],3=[1])+match(shifts=[1],latest=3)"
    assert str(Pattern.parse("shuffled_default", FILE)) == \
        "shuffled_top2+layer_top_k(1=[0],3=[1])+match(shifts=[1],latest=3)+random_layers([1])"
    # default+RULE: the file's rules with one replaced
    assert Pattern.parse("default+capacity(0.75)", FILE).rule("capacity") == Capacity(0.75)
    with pytest.raises(PatternError, match="no router file"):
        Pattern.parse("default")


def _effective(cfg: FocusConfig, num_layers: int = 4) -> tuple:
    """What a config does in each layer (independent of how its fields spell it): mode, k,
    assignment, the capacity where it acts (the router's groups), key shift, match pairs."""
    per_layer = []
    for i in range(num_layers):
        a = cfg.assignment_at(i)
        cap = (cfg.capacity_at(i), cfg.capacity_overflow) if a == "router" and cfg.capacity_at(i) else None
        per_layer.append((cfg.top_k_at(i), a, cap))
    return cfg.mode, tuple(per_layer), cfg.key_shift, cfg.match_shifts if cfg.mode == "hard" else None, \
        cfg.match_latest if cfg.match_shifts else 0, cfg.window, cfg.sink_tokens


@pytest.mark.parametrize("label", ["hard_top1", "hard_top2", "random_top2", "shuffled_top2", "hard_top2_nocap",
                                   "hard_top2_uniform", "hard_top2_evict70@0+1", "random_top2_uniform_match",
                                   "hard_top2_keyshift", "hard_top2_nomatch"])
def test_the_committed_labels_map_to_the_patterns_they_ran(label):
    """A label of the committed tables meant the router file's rules changed by its suffixes
    (``legacy_changes`` on top of the file's config); the deprecated spelling parses to a
    pattern that does the same in every layer, and names it."""
    ran = FILE.replace(**legacy_changes(label, 4))
    p = legacy_label_pattern(label, FILE)
    assert _effective(FILE.replace(**p.changes())) == _effective(ran)
    if label.count("_") > 1:  # a suffix spelling still parses, deprecated, naming its canonical form
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert Pattern.parse(label, FILE) == p
        assert any(str(p) in str(w.message) and issubclass(w.category, FutureWarning) for w in caught)


def test_default_runs_what_the_file_ran_before(monkeypatch):
    """On a tiny model: 'default' gives the perplexity of the file's own config in hard top-2
    (the reference: the forward under the file's fields, no pattern), 'hard_top2' that of a
    file without any rule; the output rows name the rules."""
    from focus_lab.eval.evaluate import evaluate
    from focus_lab.hf.retrofit import attach
    g = torch.Generator().manual_seed(2)
    windows = [SimpleNamespace(input_ids=torch.randint(0, 97, (40,), generator=g))]
    rich = FILE.replace(match_shifts=None, match_latest=0)  # match pairs need input ids: keep it simple
    plain = FocusConfig(num_groups=4, window=4, sink_tokens=1)

    def nll(cfg, patterns):
        model = tiny_llama()
        attach(model, cfg)
        return evaluate(model, windows, patterns, progress=False).set_index("label")

    ref_rich = nll(rich, [("ref", {"mode": "hard", "top_k": 2})])
    ref_plain = nll(plain, [("ref", {"mode": "hard", "top_k": 2})])
    from focus_lab.eval.evaluate import parse_patterns as eval_patterns
    got = nll(rich, eval_patterns("default,hard_top2", rich))
    assert got.nll["default"] == pytest.approx(ref_rich.nll["ref"], abs=1e-6)
    assert got.nll["hard_top2"] == pytest.approx(ref_plain.nll["ref"], abs=1e-6)
    assert got.nll["default"] != pytest.approx(got.nll["hard_top2"], abs=1e-4)
    assert got.canonical_pattern["default"] == "hard_top2+capacity(0.5,layers=[0],evict)+layer_top_k(1=[0],3=[1])+random_layers([1])"
    assert (got.window_tokens == 4).all() and (got.sink_tokens == 1).all()


@pytest.mark.parametrize("text, words", [
    ("hard_top2+magic", ["unknown rule 'magic'", "capacity(", "layer_top_k(", "key_shift"]),
    ("hard_top2+capacity(0.5", ["cannot read the rule 'capacity(0.5'"]),
    ("hardtop2", ["unknown pattern 'hardtop2'; choose from dense", "hard_topK", "e.g. hard_top2+capacity("]),
    ("hard_top2+capacity(lots)", ["rule 'capacity'", "'lots'"]),
    ("hard_top2+key_shift+key_shift", ["'key_shift' is given twice"]),
    ("hard_top2+layer_top_k(x=[1])", ["rule 'layer_top_k'", "K=[LAYERS]"]),
    ("hard_top2+random_layers([a-b])", ["rule 'random_layers'", "[13,15-16]"]),
    ("", ["an empty pattern"]),
])
def test_a_pattern_that_does_not_parse_is_one_line_naming_the_token(text, words):
    with pytest.raises(PatternError) as e:
        Pattern.parse(text)
    msg = str(e.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, (w, msg)


@pytest.mark.parametrize("text, num_layers, words", [
    ("hard_top2+capacity(1.5)", None, ["rule 'capacity'", "outside (1/num_groups, 1] = (0.25, 1]"]),
    ("hard_top2+capacity(0.2)", None, ["(0.25, 1]"]),
    ("hard_top2+random_layers([40])", 30, ["rule 'random_layers'", "layer 40", "routed layers are 0-29"]),
    ("hard_top2+layer_top_k(5=[1])", None, ["k = 5 above num_groups = 4"]),
    ("hard_top9", None, ["top-9 is outside 1..num_groups = 4"]),
])
def test_a_rule_that_cannot_apply_names_the_rule_and_the_bound(text, num_layers, words):
    with pytest.raises(PatternError) as e:
        Pattern.parse(text).check(4, num_layers)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


@pytest.mark.parametrize("text, words", [
    ("soft+capacity(0.5)", ["rule 'capacity'", "does not apply in soft mode"]),
    ("soft+layer_top_k(1=[0])", ["does not apply in soft mode"]),
    ("window+key_shift", ["does not apply in window mode"]),
    ("random_top2+capacity(0.5)", ["does not apply to random groups"]),
    ("dense+sinks(4)", ["does not apply in dense mode"]),
])
def test_a_rule_outside_its_mode_is_refused(text, words):
    with pytest.raises(PatternError) as e:
        Pattern.parse(text)
    for w in words:
        assert w in str(e.value)


def test_comma_lists_keep_commas_inside_rules():
    got = parse_patterns("dense, hard_top2+capacity(0.5,layers=[1,3],evict),default", FILE)
    assert [label for label, _ in got] == ["dense", "hard_top2+capacity(0.5,layers=[1,3],evict)", "default"]
    assert got[1][1].rule("capacity") == Capacity(0.5, (1, 3), "evict")
    with pytest.raises(PatternError, match="empty"):
        parse_patterns(" , ", FILE)


def test_pattern_file_json_and_yaml(tmp_path):
    j = tmp_path / "p.json"
    j.write_text(json.dumps({"cap": "hard_top2+capacity(0.5,layers=[0],evict)", "mine": "default"}))
    got = parse_pattern_file(j, FILE)
    assert [(a, str(b)) for a, b in got][0] == ("cap", "hard_top2+capacity(0.5,layers=[0],evict)")
    assert got[1][1] == Pattern.parse("default", FILE)
    y = tmp_path / "p.yaml"
    y.write_text("- dense\n- hard_top2+key_shift\n")
    assert [a for a, _ in parse_pattern_file(y)] == ["dense", "hard_top2+key_shift"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(["dense", "hard_top2+bogus"]))
    with pytest.raises(PatternError, match=r"bad.json, entry 'hard_top2\+bogus': .*unknown rule 'bogus'"):
        parse_pattern_file(bad)
    with pytest.raises(PatternError, match="no such file"):
        parse_pattern_file(tmp_path / "missing.json")


def test_the_manifest_default_pattern_is_the_shipped_files():
    from focus_lab.hf import shipped
    from focus_lab.hf.retrofit import read_router_file
    entry = shipped.manifest()["smollm2-135m-instruct"]
    cfg = read_router_file(shipped.shipped_router_file())[0]
    assert entry["default_pattern"] == str(Pattern.parse("default", cfg))
    assert shipped.named_file(entry["sha256"]) == entry["name"] == "smollm2-135m/needle-mix-capacity"
    # every listed file's default pattern parses and prints as written; lineage by names that exist
    reg = shipped.registry()
    for name, f in reg["files"].items():
        assert str(Pattern.parse(f["default_pattern"])) == f["default_pattern"], name
        assert f["parent"] is None or f["parent"] in reg["files"], name
    assert shipped.lineage(entry["name"])[-1] == "smollm2-135m/sinks64-512"


def test_routers_cli_list_and_show():
    from typer.testing import CliRunner
    from focus_lab.cli import app
    r = CliRunner().invoke(app, ["routers", "list"])
    assert r.exit_code == 0 and "smollm2-135m/needle-mix-capacity" in r.output and "shipped for" in r.output
    r = CliRunner().invoke(app, ["routers", "show", "shipped"])
    assert r.exit_code == 0
    assert "name: smollm2-135m/needle-mix-capacity" in r.output and "30 routed layers (0-29)" in r.output
    assert "random_default     random_top2+layer_top_k(" in r.output
    r = CliRunner().invoke(app, ["routers", "show", "no-such-file"])
    assert r.exit_code == 2 and "smollm2-135m/soup-budget" in r.output and len(r.output.strip().splitlines()) == 1
    # a rule naming a layer the router file does not route: one line, before any model loads
    r = CliRunner().invoke(app, ["eval", "--patterns", "dense,hard_top2+random_layers([31])"])
    assert r.exit_code == 2 and r.output.strip().splitlines()[-1] == (
        "error: rule 'random_layers' names layer 31, but the routed layers are 0-29; "
        "e.g. hard_top2+random_layers([1-9])")
