"""The example plugin package (installed by scripts/setup.sh) and plugin loading rules."""

import json
import os
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points

import pytest

from dspark_lightning import names, registry
from dspark_lightning.testing import check_seq_head

EXAMPLE_HEADS = ["mlp_markov", "bigram_markov"]


def test_example_plugin_is_installed_and_discovered():
    eps = {ep.name: ep.value for ep in entry_points(group=registry.ENTRY_POINT_GROUP)}
    assert eps.get("example_head") == "dspark_example_head"
    assert set(EXAMPLE_HEADS) <= set(names("seq_head"))
    assert "example_head" in registry.loaded_plugins and "example_head" not in registry.plugin_errors


@pytest.mark.parametrize("head", EXAMPLE_HEADS)
def test_example_heads_pass_the_conformance_check(head):
    check_seq_head(head, rank=16)


def test_conformance_check_catches_a_step_that_forgets_its_state():
    from dspark_example_head import BigramMarkovHead

    class Forgetful(BigramMarkovHead):  # the reference's RNN bug (docs/algorithm.md §10): step resets its state
        def step(self, h, prev, state):
            return super().step(h, prev, self.init_state(prev.shape[0], h))

    with pytest.raises(AssertionError, match="step bias != teacher-forced"):
        check_seq_head(Forgetful, rank=8)


def _fake_dist(tmp_path, name: str, module: str, body: str) -> None:
    """An installed-looking distribution with one dspark_lightning.plugins entry point."""
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(body))
    info = tmp_path / f"{name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[dspark_lightning.plugins]\n{name} = {module}\n")


def _load_in_subprocess(tmp_path, plugins_env: str | None) -> dict:
    code = (
        "import json; from dspark_lightning import names, registry as r; heads = names('seq_head'); "
        "print(json.dumps({'heads': heads, 'errors': r.plugin_errors, 'loaded': sorted(r.loaded_plugins)}))"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    env.pop("DSPARK_PLUGINS", None)
    if plugins_env is not None:
        env["DSPARK_PLUGINS"] = plugins_env
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1]) | {"stderr": r.stderr}


def test_broken_plugin_is_reported_and_skipped_and_env_var_selects(tmp_path):
    _fake_dist(
        tmp_path,
        "broken_plugin",
        "broken_mod",
        """
        def helper():
            raise RuntimeError("this plugin is broken on purpose")
        helper()
    """,
    )
    out = _load_in_subprocess(tmp_path, None)
    err = out["errors"]["broken_plugin"]
    assert "RuntimeError: this plugin is broken on purpose" in err and "broken_mod.py:3 in helper" in err
    assert "broken_plugin" in out["stderr"]  # the warning names it
    assert "mlp_markov" in out["heads"] and "example_head" in out["loaded"]  # the others still load

    none = _load_in_subprocess(tmp_path, "none")
    assert "mlp_markov" not in none["heads"] and not none["errors"] and not none["loaded"]
    only = _load_in_subprocess(tmp_path, "example_head")
    assert "bigram_markov" in only["heads"] and not only["errors"] and only["loaded"] == ["example_head"]
